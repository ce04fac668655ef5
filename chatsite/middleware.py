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

from typing import Any

from asgiref.sync import iscoroutinefunction, sync_to_async
from csp import middleware as csp
from django.conf import settings
from django.contrib.auth import middleware as auth
from django.contrib.messages import middleware as messages
from django.contrib.sessions import middleware as sessions
from django.http import HttpRequest, HttpResponseBase, JsonResponse
from django.middleware import clickjacking, common, csrf, security
from django.utils.decorators import sync_and_async_middleware

from chatsite.errors import error_body


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
def body_limit_middleware(get_response: Any) -> Any:
    """A request to the APIs whose body is larger than `API_MAX_BODY_BYTES` is refused with
    413 before anything reads it, in the API's own error shape (OpenAI's under `/v1/`, the
    service's under `/api/`), rather than Django's HTML 400 past its own limit. The length is
    the request's `Content-Length`, which Django's limit also goes by."""
    if iscoroutinefunction(get_response):

        async def refuse_or_await(request: HttpRequest) -> Any:
            return _too_large(request) or await get_response(request)

        return refuse_or_await

    def refuse_or_call(request: HttpRequest) -> Any:
        return _too_large(request) or get_response(request)

    return refuse_or_call


def _too_large(request: HttpRequest) -> JsonResponse | None:
    path = request.path_info
    if not (path.startswith("/v1/") or path.startswith("/api/")):
        return None
    try:
        length = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = 0
    limit = settings.API_MAX_BODY_BYTES
    if length <= limit:
        return None
    message = f"The request body is {length} bytes; at most {limit} are accepted."
    if path.startswith("/v1/"):
        body: dict[str, Any] = {
            "error": {
                "message": message,
                "type": "invalid_request_error",
                "param": None,
                "code": "request_too_large",
            }
        }
    else:
        body = error_body("request_too_large", message)
    return JsonResponse(body, status=413)
