"""Who a request comes from: the one Bearer parser, and the signed-in user typed for services."""

from __future__ import annotations

from django.contrib.auth.models import User
from django.http import HttpRequest
from rest_framework.exceptions import NotAuthenticated
from rest_framework.request import Request

BEARER = "Bearer"


def bearer_token(request: HttpRequest | Request) -> str | None:
    """The token of the request's `Authorization: Bearer <token>` header, spaces around it
    stripped; "" when the header says Bearer and nothing after it; None without a Bearer
    header (none at all, or another scheme). The scheme is case-insensitive."""
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != BEARER.lower():
        return None
    return token.strip()


def request_user(request: HttpRequest | Request) -> User:
    """`request.user` narrowed to a real user; views behind a login check call this."""
    user = request.user
    if not isinstance(user, User) or not user.is_authenticated:
        raise NotAuthenticated()
    return user
