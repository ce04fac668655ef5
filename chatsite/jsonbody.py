"""A JSON request body as a client wrote it: every way it can be wrong is one `BadJSON`
with a message to show, never another exception (a 500).

Python's `json` accepts what JSON does not (NaN, Infinity), turns a number too large for a
float into infinity, and meets a body nested thousands deep with a `RecursionError`; a body
that is not UTF-8 fails before it is parsed. Each is refused here, so that every API answers
it with a 4xx in its own shape (`/v1` OpenAI's, `/api/v1` the service's).
"""

from __future__ import annotations

import json
import math
from typing import Any


class BadJSON(ValueError):
    """The body is not JSON this service takes; `str()` says why, for the client."""


def _constant(name: str) -> Any:
    raise BadJSON(f"{name} is not a JSON number.")


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise BadJSON(f"The number {text[:40]} is too large.")
    return value


def loads(raw: bytes | str) -> Any:
    """The value `raw` holds; `BadJSON` if it is not UTF-8, not JSON, nested too deep for
    the parser, or holds NaN, Infinity or a number beyond a float's range."""
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
    except UnicodeDecodeError as exc:
        raise BadJSON("The request body is not UTF-8 text.") from exc
    try:
        return json.loads(text, parse_constant=_constant, parse_float=_float)
    except BadJSON:
        raise
    except RecursionError as exc:
        raise BadJSON("The request body is nested too deep.") from exc
    except ValueError as exc:
        raise BadJSON("The request body is not valid JSON.") from exc
