"""The one error type the domain raises.

Services raise `ServiceError` (or an app's subclass) with a code from that app's
`ErrorCode` enum; the API layer turns it into `{"error": {"code", "message", "detail"}}`
with the status the error names. The domain never imports the API layer.
"""

from __future__ import annotations

import enum
from typing import Any


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

    def __init__(self, message: str = "Not found.", *, code: str = "not_found") -> None:
        super().__init__(code, message)
