"""One DRF exception handler, so every error a client sees has the same shape."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied
from django.http import Http404
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import set_rollback

from chatsite.errors import ServiceError, error_body

# DRF's own default codes, renamed where ours read better to a client.
_DRF_CODES = {
    "not_authenticated": "not_authenticated",
    "authentication_failed": "authentication_failed",
    "permission_denied": "permission_denied",
    "not_found": "not_found",
    "method_not_allowed": "method_not_allowed",
    "not_acceptable": "not_acceptable",
    "unsupported_media_type": "unsupported_media_type",
    "throttled": "rate_limited",
    "parse_error": "malformed_request",
    "invalid": "invalid",
}


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, ServiceError):
        set_rollback()
        return Response(error_body(exc.code, exc.message, exc.detail), status=exc.status)

    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, PermissionDenied):
        exc = exceptions.PermissionDenied()

    if not isinstance(exc, exceptions.APIException):
        return None

    headers: dict[str, str] = {}
    if getattr(exc, "auth_header", None):
        headers["WWW-Authenticate"] = exc.auth_header  # type: ignore[attr-defined]
    if getattr(exc, "wait", None):
        headers["Retry-After"] = str(int(exc.wait))  # type: ignore[attr-defined]

    if isinstance(exc, exceptions.ValidationError):
        code = "invalid"
        message = "The request is invalid."
        detail: Any = exc.detail
        # A single-field failure with its own code is more useful than the generic one.
        if isinstance(exc.detail, dict) and len(exc.detail) == 1:
            errors = next(iter(exc.get_codes().values()))  # type: ignore[union-attr]
            if isinstance(errors, list) and errors and isinstance(errors[0], str):
                field = next(iter(exc.detail))
                if errors[0] in {"required", "null"}:
                    code = "missing_field"
                elif field == "non_field_errors":
                    code = errors[0]
                else:
                    code = f"invalid_{field}"
    else:
        raw_code = exc.get_codes()
        code = _DRF_CODES.get(raw_code if isinstance(raw_code, str) else "", "error")
        message = str(exc.detail)
        detail = None

    set_rollback()
    return Response(
        error_body(code, message, detail),
        status=exc.status_code or status.HTTP_400_BAD_REQUEST,
        headers=headers,
    )
