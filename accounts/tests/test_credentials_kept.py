"""API keys kept per process with their users (`accounts.services.CREDENTIALS`): a request with
a key the process has seen reads no table, and still every change to a key or its user is
seen by the next request, in this process and in any other."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from accounts.models import ApiKey
from accounts.services import (
    CREDENTIALS,
    api_key_authenticate,
    api_key_create,
    api_key_revoke,
    api_keys_revoke,
)
from chatsite.redis import sync_redis

pytestmark = pytest.mark.django_db


@pytest.fixture
def raw_key(user: Any) -> str:
    raw = api_key_create(user=user, name="kept")[1]
    assert api_key_authenticate(raw_key=raw) is not None  # now kept, last use written
    return raw


def test_a_key_seen_before_is_authenticated_without_a_statement(raw_key: str, user: Any) -> None:
    with CaptureQueriesContext(connection) as captured:
        key = api_key_authenticate(raw_key=raw_key)
    assert key is not None and key.user.pk == user.pk
    assert captured.captured_queries == []


def test_a_revoked_key_is_refused_at_once(raw_key: str, user: Any) -> None:
    key = api_key_authenticate(raw_key=raw_key)
    assert key is not None
    api_key_revoke(user=user, key_id=key.pk)
    assert api_key_authenticate(raw_key=raw_key) is None


def test_keys_revoked_by_staff_in_bulk_are_refused_at_once(raw_key: str, user: Any) -> None:
    assert api_keys_revoke(keys=ApiKey.objects.filter(user=user)) == 1
    assert api_key_authenticate(raw_key=raw_key) is None


def test_the_key_of_a_deactivated_or_deleted_user_is_refused_at_once(
    raw_key: str, user: Any
) -> None:
    user.is_active = False
    user.save(update_fields=["is_active"])
    assert api_key_authenticate(raw_key=raw_key) is None
    user.is_active = True
    user.save(update_fields=["is_active"])
    assert api_key_authenticate(raw_key=raw_key) is not None
    user.delete()
    assert api_key_authenticate(raw_key=raw_key) is None


def test_a_change_made_by_another_process_is_seen_by_the_next_request(
    raw_key: str, user: Any
) -> None:
    # Another process revoked it: the row changed without this process's signal, and the
    # version in Redis was replaced.
    ApiKey.objects.filter(user=user).update(revoked_at="2026-01-01T00:00:00Z")
    assert api_key_authenticate(raw_key=raw_key) is not None  # kept: nobody said otherwise
    sync_redis().set(CREDENTIALS.version_key, "changed-elsewhere")
    assert api_key_authenticate(raw_key=raw_key) is None


def test_each_request_gets_its_own_key_and_user(raw_key: str) -> None:
    first = api_key_authenticate(raw_key=raw_key)
    assert first is not None
    # A request may cache permissions on its user, or change its objects: never another's.
    first.user.first_name = "changed by one request"
    first.name = "changed by one request"
    second = api_key_authenticate(raw_key=raw_key)
    assert second is not None
    assert second is not first and second.user is not first.user
    assert (second.name, second.user.first_name) == ("kept", "")
