"""OpenAI's error shape, `{"error": {"message", "type", "param", "code"}}`, and the mapping of
the service's `ServiceError`s onto it.

OpenAI's SDKs choose their exception from the status code (400 BadRequestError, 401
AuthenticationError, 403 PermissionDeniedError, 404 NotFoundError, 429 RateLimitError, 5xx
InternalServerError), so the status matters most; `type` says the same in words and `code`
keeps the service's own machine-readable code.
"""

from __future__ import annotations

from typing import Any

from django.http import JsonResponse

from chatsite.errors import ServiceError
from inference.client import FaultCode
from inference.errors import ErrorCode as InferenceError

TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "invalid_request_error",
    429: "rate_limit_error",
}

# Our codes whose status OpenAI's clients expect otherwise, and the request field each is about.
_STATUS = {
    "unknown_model": 404,
    # The request itself is too large; OpenAI answers these 400 (waiting does not help).
    "message_too_long": 400,
    "system_prompt_too_long": 400,
    "request_too_large": 400,
}
_CODES = {"unknown_model": "model_not_found"}
_PARAMS = {
    "unknown_model": "model",
    "model_not_in_plan": "model",
    "message_too_long": "messages",
    "empty_message": "messages",
    "system_prompt_too_long": "messages",
    "context_too_long": "messages",
    "request_too_large": "max_tokens",
}


class OpenAIError(Exception):
    """A refusal in OpenAI's shape."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        retry_after: int | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.retry_after = retry_after

    @property
    def type(self) -> str:
        return error_type(self.status)

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self) -> JsonResponse:
        response = JsonResponse(self.body(), status=self.status)
        if self.retry_after is not None:
            response["Retry-After"] = str(self.retry_after)
        if self.status == 401:
            response["WWW-Authenticate"] = "Bearer"
        return response


def error_type(status: int) -> str:
    return TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")


def from_service_error(exc: ServiceError) -> OpenAIError:
    """The OpenAI-shaped error for one of the service's refusals."""
    detail = exc.detail if isinstance(exc.detail, dict) else {}
    retry_after = detail.get("retry_after")
    return OpenAIError(
        _STATUS.get(exc.code, exc.status),
        exc.message,
        param=_PARAMS.get(exc.code),
        code=_CODES.get(exc.code, exc.code),
        retry_after=retry_after if isinstance(retry_after, int) else None,
    )


# A generation that ended in an error event: rejected in the queue (no capacity in time) is
# "overloaded" as OpenAI's 503; anything else failed on our side.
# A worker that cannot call tools (no tool-call parser, or a `tool_choice` it does not
# support) refuses the request's tools: the client must change its request.
_GENERATION_STATUS: dict[str, int] = {
    InferenceError.QUEUE_TIMEOUT: 503,
    FaultCode.NO_WORKER: 503,
    FaultCode.TOOLS_UNSUPPORTED: 400,
}
_GENERATION_PARAMS: dict[str, str] = {FaultCode.TOOLS_UNSUPPORTED: "tools"}


def from_generation_error(code: str, message: str) -> OpenAIError:
    """The error of a generation that failed or was rejected after it was accepted."""
    return OpenAIError(
        _GENERATION_STATUS.get(code, 500),
        message or "The model failed to answer.",
        param=_GENERATION_PARAMS.get(code),
        code=code or InferenceError.GENERATION_FAILED,
    )
