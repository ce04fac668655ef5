"""Django's middleware on the event loop (chatsite/middleware.py): through the ASGI handler a
log-in, its session, a flash message and the CSRF check behave as before, and only the hooks
that may wait on a store go to a thread."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth.models import User
from django.core.handlers import base
from django.test import AsyncClient
from django.utils import deprecation

from accounts.services import api_key_create
from chatsite import middleware

pytestmark = pytest.mark.django_db(transaction=True)

PASSWORD = "a long enough password"


@pytest.fixture
def hops(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The middleware hooks run in a thread, by name: ours, and Django's own hops (its
    `MiddlewareMixin` under ASGI, and the handler's for a synchronous `process_view`)."""
    seen: list[str] = []

    def counted(function: Any, **kwargs: Any) -> Any:
        name = getattr(function, "__qualname__", "")
        if "process_" in name:
            seen.append(name)
        return sync_to_async(function, **kwargs)

    monkeypatch.setattr(middleware, "sync_to_async", counted)
    monkeypatch.setattr(deprecation, "sync_to_async", counted)
    monkeypatch.setattr(base, "sync_to_async", counted)
    yield seen


def csrf_token(response: Any) -> str:
    found = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', response.content.decode())
    assert found is not None, response.content[:500]
    return found[1]


async def test_a_log_in_keeps_its_session_and_a_message_shows_once(hops: list[str]) -> None:
    user = await sync_to_async(User.objects.create_user)(username="ada", password=PASSWORD)
    key = (await sync_to_async(api_key_create)(user=user, name="laptop"))[0]
    client = AsyncClient(enforce_csrf_checks=True)

    page = await client.get("/accounts/login/")
    assert page.status_code == 200
    assert "csrftoken" in page.cookies  # set by the CSRF hook on the loop
    form = {"username": "ada", "password": PASSWORD, "csrfmiddlewaretoken": csrf_token(page)}
    logged_in = await client.post("/accounts/login/", form)
    assert logged_in.status_code == 302, logged_in.content[:500]
    assert "sessionid" in logged_in.cookies
    # Saving the new session waits on the database: that hook ran in the thread.
    assert "SessionMiddleware.process_response" in hops

    keys = await client.get("/accounts/api-keys/")
    assert keys.status_code == 200 and b"laptop" in keys.content
    revoked = await client.post(
        f"/accounts/api-keys/{key.pk}/revoke/", {"csrfmiddlewaretoken": csrf_token(keys)}
    )
    assert revoked.status_code == 302
    shown = await client.get("/accounts/api-keys/")
    assert b"Revoked laptop." in shown.content
    again = await client.get("/accounts/api-keys/")
    assert b"Revoked laptop." not in again.content

    # Without the token the CSRF check refuses the session's POST.
    refused = await client.post(f"/accounts/api-keys/{key.pk}/revoke/", {})
    assert refused.status_code == 403


async def test_an_api_request_runs_every_hook_on_the_loop(hops: list[str]) -> None:
    user = await sync_to_async(User.objects.create_user)(username="bob")
    raw_key = (await sync_to_async(api_key_create)(user=user, name="script"))[1]

    response = await AsyncClient().get(
        "/api/v1/conversations", headers={"Authorization": f"Bearer {raw_key}"}
    )

    assert response.status_code == 200, response.content[:500]
    assert response["X-Frame-Options"] == "DENY"  # the hooks ran, none of them in a thread
    assert response["X-Content-Type-Options"] == "nosniff"
    assert hops == []
