"""API keys (shown once, stored hashed, usable as Bearer, revocable) and the account pages."""

from __future__ import annotations

import hashlib
import re
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from rest_framework.test import APIClient

from accounts.models import ApiKey
from accounts.services import api_key_create
from accounts.tests.factories import UserFactory

pytestmark = pytest.mark.django_db

KEYS = "/api/v1/api-keys"
PASSWORD = "correct horse battery staple"


def bearer(raw_key: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw_key}")
    return client


@pytest.fixture
def created(api_client: APIClient) -> dict[str, Any]:
    response = api_client.post(KEYS, {"name": "laptop"}, format="json")
    assert response.status_code == 201
    body: dict[str, Any] = response.json()
    return body


def test_the_created_key_is_shown_in_the_create_answer_only(
    api_client: APIClient, created: dict[str, Any]
) -> None:
    raw_key = created["key"]
    assert raw_key.startswith("csk_")
    assert created["prefix"] == raw_key[:12]

    listing = api_client.get(KEYS)
    detail = api_client.get(f"{KEYS}/{created['id']}")

    for response in (listing, detail):
        assert response.status_code == 200
        assert raw_key not in response.content.decode()
        assert "key_hash" not in response.content.decode()
    [mine] = [key for key in listing.json() if key["id"] == created["id"]]
    assert "key" not in mine
    assert mine["prefix"] == raw_key[:12]
    assert detail.json()["name"] == "laptop"


def test_the_key_is_stored_hashed(created: dict[str, Any]) -> None:
    raw_key = created["key"]

    row = ApiKey.objects.filter(pk=created["id"]).values().get()

    assert row["key_hash"] == hashlib.sha256(raw_key.encode()).hexdigest()
    assert not any(raw_key in str(value) for value in row.values())


def test_the_key_works_as_bearer_and_records_its_use(created: dict[str, Any], user: Any) -> None:
    assert ApiKey.objects.get(pk=created["id"]).last_used_at is None

    response = bearer(created["key"]).get("/api/v1/conversations")

    assert response.status_code == 200
    assert ApiKey.objects.get(pk=created["id"]).last_used_at is not None


def test_a_revoked_key_is_401(api_client: APIClient, created: dict[str, Any]) -> None:
    assert bearer(created["key"]).get("/api/v1/conversations").status_code == 200

    revoke = api_client.delete(f"{KEYS}/{created['id']}")

    assert revoke.status_code == 204
    assert ApiKey.objects.get(pk=created["id"]).revoked_at is not None
    response = bearer(created["key"]).get("/api/v1/conversations")
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "authentication_failed"


@pytest.mark.parametrize("header", ["Bearer csk_made-up", "Bearer ", "Bearer nonsense"])
def test_a_bad_key_is_401(header: str) -> None:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=header)

    response = client.get(KEYS)

    assert response.status_code == 401
    assert set(response.json()["error"]) == {"code", "message", "detail"}


def test_a_key_creation_without_a_name_is_400(api_client: APIClient) -> None:
    response = api_client.post(KEYS, {}, format="json")

    assert response.status_code == 400
    assert response.json()["error"]["code"] == "missing_field"


def test_the_keys_page_shows_a_new_key_once(client: Client, user: Any) -> None:
    client.force_login(user)

    created = client.post("/accounts/api-keys/", {"name": "desktop"})
    later = client.get("/accounts/api-keys/")

    key = ApiKey.objects.get(user=user, name="desktop")
    [raw_key] = re.findall(r"csk_[A-Za-z0-9_-]{20,}", created.content.decode())
    assert hashlib.sha256(raw_key.encode()).hexdigest() == key.key_hash
    assert later.status_code == 200
    assert key.prefix in later.content.decode()
    assert raw_key not in later.content.decode()


def test_signup_creates_the_user_and_logs_in(client: Client) -> None:
    assert client.get("/accounts/signup/").status_code == 200

    response = client.post(
        "/accounts/signup/",
        {"username": "newcomer", "password1": PASSWORD, "password2": PASSWORD},
    )

    assert response.status_code == 302
    user = get_user_model().objects.get(username="newcomer")
    assert client.session["_auth_user_id"] == str(user.pk)
    assert client.get("/").status_code == 200


def test_signup_refuses_mismatched_passwords(client: Client) -> None:
    response = client.post(
        "/accounts/signup/",
        {"username": "newcomer", "password1": PASSWORD, "password2": PASSWORD + "!"},
    )

    assert response.status_code == 200
    assert not get_user_model().objects.filter(username="newcomer").exists()


def test_login_and_logout(client: Client) -> None:
    user = UserFactory.create()
    assert client.get("/").status_code == 302
    assert client.get("/accounts/login/").status_code == 200

    login = client.post("/accounts/login/", {"username": user.username, "password": PASSWORD})

    assert login.status_code == 302
    assert client.get("/").status_code == 200
    assert client.get("/accounts/logout/").status_code == 405
    assert client.get("/").status_code == 200

    logout = client.post("/accounts/logout/")

    assert logout.status_code == 302
    assert client.get("/").status_code == 302


def test_login_refuses_a_wrong_password(client: Client) -> None:
    user = UserFactory.create()

    response = client.post("/accounts/login/", {"username": user.username, "password": "wrong"})

    assert response.status_code == 200
    assert "_auth_user_id" not in client.session


def test_the_keys_page_cannot_revoke_another_users_key(
    client: Client, user: Any, other_user: Any
) -> None:
    theirs, _ = api_key_create(user=other_user, name="theirs")
    client.force_login(user)

    response = client.post(f"/accounts/api-keys/{theirs.pk}/revoke/")

    assert response.status_code == 404
    theirs.refresh_from_db()
    assert theirs.revoked_at is None
