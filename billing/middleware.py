"""Every API answer tells its caller where they stand: the `x-ratelimit-*` headers.

The headers describe the caller's request and token buckets (OpenAI's names and duration
format). A 429 whose error carries `detail.retry_after` also gets `Retry-After`, whichever
view raised it. Works in both sync and async stacks, so streaming views stay async.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.conf import settings
from django.contrib.auth.models import User
from django.http import HttpRequest, HttpResponseBase

from accounts.authentication import api_key_user
from billing.selectors import rate_limit_headers

logger = logging.getLogger(__name__)


# Where a view that already ran the caller's database and Redis work on a thread left the
# headers it read there (`headers_known`), so that the middleware needs no thread of its own.
_KNOWN = "_billing_ratelimit_headers"


def headers_known(request: HttpRequest, *, user: User) -> None:
    """Read `user`'s rate-limit headers now, for this request's answer: for an async view
    whose sync work (the turn) runs in one thread hop, which this joins. Advice only: a
    failure leaves the middleware to read them itself."""
    headers = _read(user)
    if headers is not None:
        setattr(request, _KNOWN, headers)


def _read(user: User) -> dict[str, str] | None:
    try:
        return rate_limit_headers(user=user)
    except Exception:
        # Headers are advice: an answer is never lost for want of them.
        logger.exception("could not read the rate-limit state of user %s", user.pk)
        return None


def _caller(request: HttpRequest) -> User | None:
    user = getattr(request, "user", None)
    if isinstance(user, User) and user.is_authenticated:
        return user
    # Views that authenticate API keys themselves (the SSE stream) leave request.user unset.
    return api_key_user(request)


def _retry_after(response: HttpResponseBase) -> int | None:
    data: Any = getattr(response, "data", None)
    try:
        seconds = data["error"]["detail"]["retry_after"]
    except (TypeError, KeyError):
        return None
    return int(seconds) if isinstance(seconds, int) else None


def _decorate(request: HttpRequest, response: HttpResponseBase) -> None:
    if not request.path.startswith(tuple(settings.BILLING_RATELIMIT_HEADER_PATHS)):
        return
    if response.status_code == 429 and "Retry-After" not in response:
        retry = _retry_after(response)
        if retry is not None:
            response["Retry-After"] = str(retry)
    headers: dict[str, str] | None = getattr(request, _KNOWN, None)
    if headers is None:
        user = _caller(request)
        headers = _read(user) if user is not None else None
    for name, value in (headers or {}).items():
        response[name] = value


class RateLimitHeadersMiddleware:
    """Adds the caller's `x-ratelimit-*` headers (and Retry-After on quota 429s)."""

    sync_capable = True
    async_capable = True

    def __init__(
        self,
        get_response: Callable[[HttpRequest], HttpResponseBase]
        | Callable[[HttpRequest], Awaitable[HttpResponseBase]],
    ) -> None:
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> Any:
        if self.is_async:
            return self.__acall__(request)
        response = self.get_response(request)
        _decorate(request, response)  # type: ignore[arg-type]
        return response

    async def __acall__(self, request: HttpRequest) -> HttpResponseBase:
        response = await self.get_response(request)  # type: ignore[misc]
        if hasattr(request, _KNOWN):
            _decorate(request, response)  # reads nothing: no thread needed
        elif request.path.startswith(tuple(settings.BILLING_RATELIMIT_HEADER_PATHS)):
            await sync_to_async(_decorate)(request, response)
        return response
