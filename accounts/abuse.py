"""Request-level abuse limits per client IP: log-in, sign-up, API keys, message POSTs.

django-ratelimit counts on the Redis cache; the rates are `settings.BILLING_ABUSE_RATES`,
read on each request. A refusal is 429 with `Retry-After`: the JSON error shape for API
clients, a short page for browsers. Part of accepting a request (accounts' step), before any
quota or plan is looked at.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar, cast

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.template.loader import render_to_string
from django_ratelimit.core import get_usage

from chatsite.errors import error_response

from .errors import ErrorCode

_View = TypeVar("_View", bound=Callable[..., Any])


def _refusal(request: Any, retry_after: int) -> HttpResponse:
    message = "Too many attempts from your network; please wait before trying again."
    headers = {"Retry-After": str(retry_after)}
    wants_page = "text/html" in request.headers.get("Accept", "") and not request.path.startswith(
        tuple(settings.BILLING_RATELIMIT_HEADER_PATHS)
    )
    if wants_page:
        html = render_to_string(
            "accounts/too_many_requests.html",
            {"message": message, "retry_after": retry_after},
            request=request,
        )
        return HttpResponse(html, status=429, headers=headers)
    return error_response(
        429,
        ErrorCode.RATE_LIMITED,
        message,
        detail={"retry_after": retry_after},
        headers=headers,
    )


def abuse_retry_after(
    request: HttpRequest, group: str, *, methods: tuple[str, ...] = ("POST",)
) -> int | None:
    """Count this request against its client IP's `group` limit; the seconds to wait if it
    is over, else None. For views that answer refusals in their own shape (`/v1`)."""
    if request.method not in methods:
        return None
    usage = get_usage(
        request,
        group=f"abuse:{group}",
        key="ip",
        rate=settings.BILLING_ABUSE_RATES[group],
        method=list(methods),
        increment=True,
    )
    if usage is not None and usage["should_limit"]:
        return max(1, int(usage["time_left"]))
    return None


def abuse_limit(group: str, *, methods: tuple[str, ...] = ("POST",)) -> Callable[[_View], _View]:
    """Limit a view (a function view, or a DRF method through `method_decorator`) per client
    IP to `settings.BILLING_ABUSE_RATES[group]` for `methods`."""

    def decorator(view: _View) -> _View:
        @functools.wraps(view)
        def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
            retry_after = abuse_retry_after(request, group, methods=methods)
            if retry_after is not None:
                return _refusal(request, retry_after)
            return view(request, *args, **kwargs)

        return cast(_View, wrapped)

    return decorator
