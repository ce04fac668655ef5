"""Django's own middleware (and django-csp's), without a thread hop per hook under ASGI.

Django's middleware classes (`SecurityMiddleware` and the rest) are `MiddlewareMixin`s:
under ASGI each of their hooks (`process_request`, `process_view`, `process_response`)
runs through `sync_to_async`, a hop to the request's thread and back. With the seven the
project uses, that was about 5 ms of CPU per request: Django's ASGI handler, in-process,
answered a generation's detail in 12.4 ms with them and 7.3 ms without any middleware.

Their hooks are CPU work on the request and the response, and the classes here run them on
the event loop, except where one may wait on a store: the session's response hook saves a
modified session, and the messages' stores messages that were read or added (in the session,
when they do not fit their cookie). Those run in the request's thread as before. A
synchronous request (the test client, WSGI) runs every hook as Django does.

Which hooks block was read from Django's source for its version in requirements.txt: CSRF
here keeps its secret in a cookie (`CSRF_USE_SESSIONS` off), so its hooks never read the
session; the session and the messages are created lazily and read nothing until used.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from asgiref.sync import iscoroutinefunction, sync_to_async
from csp import middleware as csp
from django.conf import settings
from django.contrib.auth import middleware as auth
from django.contrib.messages import middleware as messages
from django.contrib.sessions import middleware as sessions
from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponseBase, JsonResponse
from django.middleware import clickjacking, common, csrf, security
from django.utils.decorators import sync_and_async_middleware
from django.utils.deprecation import MiddlewareMixin

from chatsite import catalog, logs
from chatsite.errors import error_body
from chatsite.redis import REDIS_FAULTS

logger = logging.getLogger(__name__)

# What a 503 of a store outage tells the client to wait before it tries again.
STORE_OUTAGE_RETRY_SECONDS = 2


class Inline:
    """For a `MiddlewareMixin`: under ASGI, its hooks run on the event loop, and only a
    response hook that `response_may_block` says may wait runs in the request's thread."""

    def __init__(self, get_response: Any) -> None:
        super().__init__(get_response)  # type: ignore[call-arg]
        view_hook = getattr(self, "process_view", None)
        if view_hook is not None and getattr(self, "async_mode", False):
            # Django wraps a synchronous `process_view` in `sync_to_async` under ASGI.
            async def process_view(request: HttpRequest, *args: Any) -> Any:
                return view_hook(request, *args)

            setattr(self, "process_view", process_view)  # noqa: B010 (shadows the method)

    async def __acall__(self, request: HttpRequest) -> HttpResponseBase:
        response = None
        if hasattr(self, "process_request"):
            response = self.process_request(request)
        response = response or await self.get_response(request)  # type: ignore[attr-defined]
        if hasattr(self, "process_response"):
            if self.response_may_block(request, response):
                response = await sync_to_async(self.process_response, thread_sensitive=True)(
                    request, response
                )
            else:
                response = self.process_response(request, response)
        return response

    def response_may_block(self, request: HttpRequest, response: HttpResponseBase) -> bool:
        return False


class SecurityMiddleware(Inline, security.SecurityMiddleware):
    pass


class CSPMiddleware(Inline, csp.CSPMiddleware):
    """The Content-Security-Policy header of `settings.CONTENT_SECURITY_POLICY`: its hooks
    only build a nonce and a header, so they run on the loop too."""


class SessionMiddleware(Inline, sessions.SessionMiddleware):
    def response_may_block(self, request: HttpRequest, response: HttpResponseBase) -> bool:
        session = getattr(request, "session", None)
        return session is not None and (session.modified or settings.SESSION_SAVE_EVERY_REQUEST)


class CommonMiddleware(Inline, common.CommonMiddleware):
    pass


class CsrfViewMiddleware(Inline, csrf.CsrfViewMiddleware):
    def __init__(self, get_response: Any) -> None:
        if settings.CSRF_USE_SESSIONS:  # its hooks would read and write the session
            raise ValueError("chatsite.middleware.CsrfViewMiddleware needs CSRF_USE_SESSIONS off")
        super().__init__(get_response)


class AuthenticationMiddleware(Inline, auth.AuthenticationMiddleware):
    pass


class MessageMiddleware(Inline, messages.MessageMiddleware):
    def response_may_block(self, request: HttpRequest, response: HttpResponseBase) -> bool:
        storage = getattr(request, "_messages", None)
        return storage is not None and (storage.used or storage.added_new)


class XFrameOptionsMiddleware(Inline, clickjacking.XFrameOptionsMiddleware):
    pass


@sync_and_async_middleware
def request_id_middleware(get_response: Any) -> Any:
    """Each request's id: the caller's `X-Request-Id` if sane (a proxy's, a client's), else a
    new one. Log lines while it is handled carry it (`chatsite.logs`), a turn stores it with
    its job for the scheduler, and the response returns it in `X-Request-Id` unless the view
    set its own (`/v1` answers with its completion id, as OpenAI does).

    The ids are set, never reset: Django's own line for a 4xx or 5xx answer and a streamed
    body come after the middleware has returned, and must carry them too. Under ASGI they
    live in the request's own task (when this runs in the request's thread, because one
    below it is sync-only as WhiteNoise is, asgiref carries them back to that task); on a
    thread that serves request after request (WSGI) each request sets both anew. Inside it
    each catalog's version is read once (`catalog.request_scope`)."""
    if iscoroutinefunction(get_response):

        async def identified(request: HttpRequest) -> Any:
            request_id = _identify(request)
            with catalog.request_scope():
                response = await get_response(request)
            response.headers.setdefault("X-Request-Id", request_id)
            return response

        return identified

    def identified_sync(request: HttpRequest) -> Any:
        request_id = _identify(request)
        with catalog.request_scope():
            response = get_response(request)
        response.headers.setdefault("X-Request-Id", request_id)
        return response

    return identified_sync


def _identify(request: HttpRequest) -> str:
    request_id = logs.accepted_request_id(request.headers.get("X-Request-Id"))
    logs.request_id.set(request_id)
    logs.generation_id.set(None)
    return request_id


@sync_and_async_middleware
def body_limit_middleware(get_response: Any) -> Any:
    """A request to the APIs whose body is larger than `API_MAX_BODY_BYTES` is refused with
    413 before anything reads it, in the API's own error shape (OpenAI's under `/v1/`, the
    service's under `/api/`), rather than Django's HTML 400 past its own limit. The length is
    the request's `Content-Length`, which Django's limit also goes by. An attachment's
    upload may be as large as a file may be (ATTACHMENT_MAX_BYTES), and its framing."""
    if iscoroutinefunction(get_response):

        async def refuse_or_await(request: HttpRequest) -> Any:
            return _too_large(request) or await get_response(request)

        return refuse_or_await

    def refuse_or_call(request: HttpRequest) -> Any:
        return _too_large(request) or get_response(request)

    return refuse_or_call


def _too_large(request: HttpRequest) -> JsonResponse | None:
    try:
        length = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = 0
    # An endpoint that takes files (an import, an attachment) names its own, larger limit.
    limit = settings.API_MAX_BODY_BYTES
    for pattern, path_limit in settings.API_BODY_LIMITS_BY_PATH.items():
        if re.fullmatch(pattern, request.path_info):
            limit = max(limit, path_limit)
    if length <= limit:
        return None
    return api_error(
        request,
        413,
        "request_too_large",
        f"The request body is {length} bytes; at most {limit} are accepted.",
        openai_type="invalid_request_error",
    )


def api_error(
    request: HttpRequest,
    status: int,
    code: str,
    message: str,
    *,
    openai_type: str,
    headers: dict[str, str] | None = None,
) -> JsonResponse | None:
    """An error in the shape of the API the request is for (OpenAI's under `/v1/`, the
    service's under `/api/`); None for the pages, which Django answers as it does."""
    path = request.path_info
    if path.startswith("/v1/"):
        body: dict[str, Any] = {
            "error": {"message": message, "type": openai_type, "param": None, "code": code}
        }
    elif path.startswith("/api/"):
        body = error_body(code, message)
    else:
        return None
    return JsonResponse(body, status=status, headers=headers)


class StoreOutageMiddleware(Inline, MiddlewareMixin):
    """A request that found Redis or Postgres away (a failover, a restart) answers 503 with
    `Retry-After`, in its API's error shape, instead of a 500: the client may send it again
    (with its Idempotency-Key) or resume its stream in a moment."""

    def process_exception(self, request: HttpRequest, exception: Exception) -> Any:
        if isinstance(exception, REDIS_FAULTS):
            store = "the queue store (Redis)"
        elif isinstance(exception, (OperationalError, InterfaceError)):
            store = "the database"
        else:
            return None
        logger.warning(
            "%s %s: %s does not answer: %r", request.method, request.path, store, exception
        )
        return api_error(
            request,
            503,
            "service_unavailable",
            f"The service cannot reach {store} just now; please try again in a few seconds.",
            openai_type="server_error",
            headers={"Retry-After": str(STORE_OUTAGE_RETRY_SECONDS)},
        )
