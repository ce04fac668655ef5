"""`Authorization: Bearer <key>`: for the JSON API (DRF), and for the views DRF does not serve
(the SSE streams, the rate-limit headers); and what a key's scope lets it call.

The rule of scopes (`ApiKey.Scope`), held in one place, `ApiKeyScopePermission`:

- a `chat` key may chat: the OpenAI-compatible `/v1`, and the JSON API's conversations,
  messages, branches, a conversation's tools and generations (their detail, cancel and SSE
  stream), and the user's event stream;
- managing the account needs a `full` key or a signed-in session: creating, listing, changing
  and revoking API keys, and billing (usage and statements). Such a view says so with
  `required_scope = ApiKey.Scope.FULL`; a chat key calling it gets 403 `insufficient_scope`
  in the API's own error shape. The account's other management (password, sign-up, log-in,
  the keys page) are pages of the site, which take no API key at all.

`/v1` and the SSE streams serve chat only, so any active key may call them; a DRF view that
names no `required_scope` is chat. A revoked key is refused from its next request on, in
every one of them and every process (`api_key_authenticate` keeps keys per process, dropped
everywhere by any change to a key or a user), and the SSE streams it holds open end within a
heartbeat period (`stream_credential_check`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from asgiref.sync import sync_to_async
from django.contrib.auth.models import User
from django.http import HttpRequest
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions, permissions
from rest_framework.request import Request

from chatsite.auth import BEARER, bearer_token
from chatsite.errors import ServiceError

from .errors import ErrorCode
from .models import ApiKey
from .services import api_key_authenticate, api_key_revocation_check

if TYPE_CHECKING:
    # Only for the annotation: DRF imports this module while rest_framework.views loads.
    from rest_framework.views import APIView


class APIKeyAuthentication(authentication.BaseAuthentication):
    """Authenticates API-key calls; they need no CSRF token, as no browser sends them."""

    keyword = BEARER

    def authenticate(self, request: Request) -> tuple[Any, Any] | None:
        raw_key = bearer_token(request)
        if raw_key is None:
            return None  # another scheme, or none: the session may still authenticate
        if not raw_key:
            raise exceptions.AuthenticationFailed("No API key after Bearer.")
        key = api_key_authenticate(raw_key=raw_key)
        if key is None:
            raise exceptions.AuthenticationFailed("Invalid or revoked API key.")
        return key.user, key

    def authenticate_header(self, request: Request) -> str:
        return self.keyword


class ApiKeyScopePermission(permissions.BasePermission):
    """Refuses an API key whose scope does not cover the view (`required_scope`, chat if the
    view names none): 403 `insufficient_scope`. Sessions are not limited by it."""

    def has_permission(self, request: Request, view: APIView) -> bool:
        key = request.auth
        if not isinstance(key, ApiKey):
            return True  # a session, or nobody (IsAuthenticated answers for that)
        required: str = getattr(view, "required_scope", ApiKey.Scope.CHAT)
        if key.has_scope(required):
            return True
        raise ServiceError(
            ErrorCode.INSUFFICIENT_SCOPE,
            f"This API key is {key.scope} only; this endpoint needs a {required} key "
            "or a signed-in session.",
            status=403,
            detail={"key_scope": key.scope, "required_scope": required},
        )


def api_key_user(request: HttpRequest) -> User | None:
    """The owner of the request's Bearer API key; None without a valid one."""
    raw_key = bearer_token(request)
    if not raw_key:
        return None
    key = api_key_authenticate(raw_key=raw_key)
    return key.user if key is not None else None


async def request_caller(request: HttpRequest) -> User | None:
    """Who calls a view that DRF does not serve: the owner of the Bearer API key when the
    request sends one (a wrong key is nobody, whatever the session says), else the session's
    user; None if nobody."""
    if bearer_token(request):
        return await sync_to_async(api_key_user)(request)
    user = await request.auser()
    return user if isinstance(user, User) and user.is_authenticated else None


def stream_credential_check(
    request: HttpRequest, redis: Any
) -> Callable[[], Awaitable[bool]] | None:
    """For a stream `request_caller` let in with an API key: a check that the key still holds,
    for the stream to make while it lasts (a revoked key's streams end, and the reconnect is
    refused). None for a session's stream."""
    raw_key = bearer_token(request)
    return api_key_revocation_check(redis, raw_key) if raw_key else None


class APIKeyAuthenticationScheme(OpenApiAuthenticationExtension):
    """Tells the OpenAPI schema that API keys travel as bearer tokens."""

    target_class = "accounts.authentication.APIKeyAuthentication"
    name = "apiKey"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {"type": "http", "scheme": "bearer", "description": "An API key: csk_..."}
