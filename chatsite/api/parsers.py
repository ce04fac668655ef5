"""The JSON parser of the service's API: DRF's, reading through `chatsite.jsonbody`, so
that a body nested too deep, NaN or Infinity, a number beyond a float or bytes that are not
UTF-8 are a 400 `malformed_request` like any other malformed body, not a 500."""

from __future__ import annotations

from typing import Any

from rest_framework import parsers
from rest_framework.exceptions import ParseError

from chatsite import jsonbody


class JSONParser(parsers.JSONParser):
    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        try:
            return jsonbody.loads(stream.read() if stream is not None else b"")
        except jsonbody.BadJSON as exc:
            raise ParseError(f"JSON parse error: {exc}") from exc
