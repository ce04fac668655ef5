"""Reads of accounts that views share."""

from __future__ import annotations

from django.contrib.auth.models import User
from django.db.models import QuerySet

from chatsite.errors import NotFound

from .models import ApiKey


def api_keys_for_user(*, user: User) -> QuerySet[ApiKey]:
    return ApiKey.objects.filter(user=user).order_by("-created_at")


def api_key_for_user(*, user: User, key_id: int) -> ApiKey:
    """The key if `user` owns it; otherwise NotFound, the same as a key that never existed."""
    key = ApiKey.objects.filter(user=user, pk=key_id).first()
    if key is None:
        raise NotFound("API key not found.")
    return key
