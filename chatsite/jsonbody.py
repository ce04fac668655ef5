"""A JSON request body as a client wrote it: every way it can be wrong is one `BadJSON`
with a message to show, never another exception (a 500).

Python's `json` accepts what JSON does not (NaN, Infinity), turns a number too large for a
float into infinity, and meets a body nested thousands deep with a `RecursionError`; a body
that is not UTF-8 fails before it is parsed. JSON's escapes also spell strings that no text
column or JSON document in Postgres holds, and that no answer can echo back as UTF-8: a lone
surrogate (`"\\ud800"`, half of a pair) and NUL (`"\\u0000"`); written or quoted in an error,
either was a 500. Each is refused here, so that every API answers it with a 4xx in its own
shape (`/v1` OpenAI's, `/api/v1` the service's).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any


class BadJSON(ValueError):
    """The body is not JSON this service takes; `str()` says why, for the client."""


# What only an escape (or a `str` handed in) can put in a parsed string: a quick look at the
# text decides whether the parsed value must be walked.
_MAYBE_UNSTORABLE = re.compile(r"\\u(?:0000|[dD][89a-fA-F])|[\x00\ud800-\udfff]")
# json.loads joins a valid pair into one code point: any surrogate left in a string is lone.
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def _constant(name: str) -> Any:
    raise BadJSON(f"{name} is not a JSON number.")


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise BadJSON(f"The number {text[:40]} is too large.")
    return value


def loads(raw: bytes | str) -> Any:
    """The value `raw` holds; `BadJSON` if it is not UTF-8, not JSON, nested too deep for
    the parser, holds NaN, Infinity or a number beyond a float's range, or a string (or a
    key) with a lone surrogate or NUL."""
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
    except UnicodeDecodeError as exc:
        raise BadJSON("The request body is not UTF-8 text.") from exc
    try:
        value = json.loads(text, parse_constant=_constant, parse_float=_float)
    except BadJSON:
        raise
    except RecursionError as exc:
        raise BadJSON("The request body is nested too deep.") from exc
    except ValueError as exc:
        raise BadJSON("The request body is not valid JSON.") from exc
    if _MAYBE_UNSTORABLE.search(text):
        _refuse_unstorable(value)
    return value


def _refuse_unstorable(value: Any) -> None:
    """Raise `BadJSON` if a string or key anywhere in `value` holds a lone surrogate or NUL.

    A loop with a stack, not recursion: `value` may be as deep as the parser allowed.
    """
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
        elif isinstance(item, str) and (found := _UNSTORABLE.search(item)):
            if found.group() == "\x00":
                raise BadJSON("The request body holds a NUL character (\\u0000) in a string.")
            raise BadJSON(
                f"The request body holds a lone surrogate (\\u{ord(found.group()):04x}) in a "
                "string: half of a pair, not Unicode text."
            )
