"""The one error type the domain raises, and the one shape every client sees.

Services raise `ServiceError` (or an app's subclass) with a code from that app's
`ErrorCode` enum; the API layer turns it into `{"error": {"code", "message", "detail"}}`
(`error_body`) with the status the error names. Plain Django views that DRF does not handle
(the SSE streams, the abuse refusals) answer the same shape with `error_response`. The domain
never imports the API layer.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

from django.http import JsonResponse


class ErrorCode(enum.StrEnum):
    """Codes of the edge itself, before any app's service is reached."""

    NOT_AUTHENTICATED = "not_authenticated"
    NOT_FOUND = "not_found"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    INVALID_LAST_EVENT_ID = "invalid_last_event_id"
    INVALID_PAGE_ID = "invalid_page_id"


def error_body(code: enum.Enum | str, message: str, detail: Any = None) -> dict[str, Any]:
    """`{"error": {"code", "message", "detail"}}`: every error a client of ours sees."""
    value = code.value if isinstance(code, enum.Enum) else code
    return {"error": {"code": value, "message": message, "detail": detail}}


def error_response(
    status: int,
    code: enum.Enum | str,
    message: str,
    *,
    detail: Any = None,
    headers: Mapping[str, str] | None = None,
) -> JsonResponse:
    """The one error shape as a response, for the views DRF's exception handler never sees."""
    return JsonResponse(error_body(code, message, detail), status=status, headers=headers)


class ServiceError(Exception):
    """A refusal a client should see, with a stable machine-readable code."""

    status: int = 400

    def __init__(
        self,
        code: enum.Enum | str,
        message: str,
        *,
        status: int | None = None,
        detail: Any = None,
    ) -> None:
        super().__init__(message)
        self.code = code.value if isinstance(code, enum.Enum) else code
        self.message = message
        self.detail = detail
        if status is not None:
            self.status = status


class NotFound(ServiceError):
    """The object does not exist or does not belong to the caller: the same answer for both."""

    status = 404

    def __init__(
        self, message: str = "Not found.", *, code: enum.Enum | str = ErrorCode.NOT_FOUND
    ) -> None:
        super().__init__(code, message)
