"""`Authorization: Bearer <key>`: for the JSON API (DRF), and for the views DRF does not serve
(the SSE streams, the rate-limit headers)."""

from __future__ import annotations

from typing import Any

from asgiref.sync import sync_to_async
from django.contrib.auth.models import User
from django.http import HttpRequest
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions
from rest_framework.request import Request

from chatsite.auth import BEARER, bearer_token

from .services import api_key_authenticate


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


class APIKeyAuthenticationScheme(OpenApiAuthenticationExtension):
    """Tells the OpenAPI schema that API keys travel as bearer tokens."""

    target_class = "accounts.authentication.APIKeyAuthentication"
    name = "apiKey"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {"type": "http", "scheme": "bearer", "description": "An API key: csk_..."}
