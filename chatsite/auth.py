"""The signed-in user of a request, typed for the service layer."""

from __future__ import annotations

from django.contrib.auth.models import User
from django.http import HttpRequest
from rest_framework.exceptions import NotAuthenticated
from rest_framework.request import Request


def request_user(request: HttpRequest | Request) -> User:
    """`request.user` narrowed to a real user; views behind a login check call this."""
    user = request.user
    if not isinstance(user, User) or not user.is_authenticated:
        raise NotAuthenticated()
    return user
