"""Who calls a view that DRF does not serve (the SSE streams): a Bearer key, else the session."""

from __future__ import annotations

from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth.models import AnonymousUser, User
from django.http import HttpRequest
from django.test import RequestFactory

from accounts.authentication import api_key_user, request_caller
from accounts.services import api_key_create, api_key_revoke
from accounts.tests.factories import UserFactory

pytestmark = pytest.mark.django_db(transaction=True)


def _request(header: str | None, session_user: Any = None) -> HttpRequest:
    headers = {} if header is None else {"HTTP_AUTHORIZATION": header}
    request = RequestFactory().get("/", **headers)  # type: ignore[arg-type]
    request.user = session_user or AnonymousUser()

    async def auser() -> Any:
        return request.user

    request.auser = auser
    return request


def test_a_valid_key_names_its_owner(user: User) -> None:
    _, raw_key = api_key_create(user=user, name="t")

    assert api_key_user(_request(f"Bearer {raw_key}")) == user
    assert api_key_user(_request(f"bearer   {raw_key}  ")) == user


@pytest.mark.parametrize("header", [None, "Bearer ", "Bearer csk_made-up", "Basic abc"])
def test_no_valid_key_names_nobody(header: str | None) -> None:
    assert api_key_user(_request(header)) is None


def test_a_revoked_key_names_nobody(user: User) -> None:
    key, raw_key = api_key_create(user=user, name="t")
    api_key_revoke(user=user, key_id=key.pk)

    assert api_key_user(_request(f"Bearer {raw_key}")) is None


async def test_the_key_wins_over_the_session() -> None:
    owner, other = await _users(2)
    _, raw_key = await _key(owner)

    assert await request_caller(_request(f"Bearer {raw_key}", session_user=other)) == owner
    # A wrong key is nobody, whoever the session is.
    assert await request_caller(_request("Bearer csk_made-up", session_user=other)) is None


async def test_without_a_key_the_session_decides() -> None:
    (user,) = await _users(1)

    assert await request_caller(_request(None, session_user=user)) == user
    assert await request_caller(_request("Bearer ", session_user=user)) == user
    assert await request_caller(_request("Basic abc", session_user=user)) == user
    assert await request_caller(_request(None)) is None


async def _users(count: int) -> list[User]:
    return await sync_to_async(lambda: [UserFactory.create() for _ in range(count)])()


async def _key(user: User) -> tuple[Any, str]:
    return await sync_to_async(api_key_create)(user=user, name="t")
