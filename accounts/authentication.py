"""`Authorization: Bearer <key>` for the JSON API."""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions
from rest_framework.request import Request

from .services import api_key_authenticate


class APIKeyAuthentication(authentication.BaseAuthentication):
    """Authenticates API-key calls; they need no CSRF token, as no browser sends them."""

    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[Any, Any] | None:
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        scheme, _, raw_key = header.partition(" ")
        if scheme.lower() != self.keyword.lower():
            return None
        raw_key = raw_key.strip()
        if not raw_key:
            raise exceptions.AuthenticationFailed("No API key after Bearer.")
        key = api_key_authenticate(raw_key=raw_key)
        if key is None:
            raise exceptions.AuthenticationFailed("Invalid or revoked API key.")
        return key.user, key

    def authenticate_header(self, request: Request) -> str:
        return self.keyword


class APIKeyAuthenticationScheme(OpenApiAuthenticationExtension):
    """Tells the OpenAPI schema that API keys travel as bearer tokens."""

    target_class = "accounts.authentication.APIKeyAuthentication"
    name = "apiKey"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {"type": "http", "scheme": "bearer", "description": "An API key: csk_..."}
