"""Request-level abuse limits per client IP, refused in our error shape with Retry-After."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from rest_framework.test import APIClient

from billing.tests.factories import subscribe
from billing.tests.helpers import send
from chatsite.testing import assert_error
from chatsite.tests.ratelimit_window import one_ratelimit_window
from conversations.services import conversation_create
from inference.models import ModelPool

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _tight_rates(settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    one_ratelimit_window(monkeypatch)  # no window ends between the test's requests
    settings.BILLING_ABUSE_RATES = {
        "login": "3/h",
        "signup": "2/h",
        "api_key_create": "2/h",
        "message_post": "3/h",
    }


def test_log_in_attempts_are_limited_per_ip(user: User) -> None:
    client = Client()
    for _ in range(3):
        response = client.post("/accounts/login/", {"username": user.username, "password": "x"})
        assert response.status_code == 200  # the form again, with its error

    refused = client.post(
        "/accounts/login/",
        {"username": user.username, "password": "correct horse battery staple"},
        HTTP_ACCEPT="application/json",
    )

    error = assert_error(refused, 429, "rate_limited")
    assert 1 <= int(refused["Retry-After"]) <= 3600
    assert error["detail"]["retry_after"] == int(refused["Retry-After"])
    # Another address is not affected, and reading the page is never limited.
    other = Client(REMOTE_ADDR="10.0.0.2")
    assert (
        other.post("/accounts/login/", {"username": user.username, "password": "x"}).status_code
        == 200
    )
    assert client.get("/accounts/login/").status_code == 200


def test_a_browser_gets_a_page_for_the_refusal(user: User) -> None:
    client = Client()
    for _ in range(3):
        client.post("/accounts/login/", {"username": "nobody", "password": "x"})

    refused = client.post(
        "/accounts/login/", {"username": "nobody", "password": "x"}, HTTP_ACCEPT="text/html"
    )

    assert refused.status_code == 429
    assert refused["Retry-After"]
    assert b"Too many attempts" in refused.content


def test_sign_ups_are_limited_per_ip(db: Any) -> None:
    client = Client()
    for index in range(2):
        response = client.post(
            "/accounts/signup/",
            {"username": f"new{index}", "password1": "a-long pass phrase", "password2": "x"},
        )
        assert response.status_code == 200

    refused = client.post("/accounts/signup/", {"username": "new9"}, HTTP_ACCEPT="application/json")

    assert_error(refused, 429, "rate_limited")
    assert not User.objects.filter(username="new9").exists()


def test_api_key_creation_is_limited_per_ip(api_client: APIClient, user: User) -> None:
    for index in range(2):
        assert api_client.post("/api/v1/api-keys", {"name": f"k{index}"}).status_code == 201

    refused = api_client.post("/api/v1/api-keys", {"name": "k9"})

    assert_error(refused, 429, "rate_limited")
    assert refused["Retry-After"]
    assert user.api_keys.count() == 3  # the test client's own key and the two


def test_api_key_creation_on_the_page_shares_the_limit(user: User) -> None:
    client = Client()
    client.force_login(user)
    for index in range(2):
        assert client.post("/accounts/api-keys/", {"name": f"k{index}"}).status_code == 200

    refused = client.post("/accounts/api-keys/", {"name": "k9"}, HTTP_ACCEPT="text/html")

    assert refused.status_code == 429
    assert client.get("/accounts/api-keys/").status_code == 200


def test_message_posts_are_limited_per_ip(
    api_client: APIClient, user: User, pool: ModelPool
) -> None:
    subscribe(user)
    for _ in range(3):
        conversation = conversation_create(owner=user, model=pool.name)
        assert send(api_client, conversation).status_code == 201

    refused = send(api_client, conversation_create(owner=user, model=pool.name))

    error = assert_error(refused, 429, "rate_limited")
    assert error["detail"]["retry_after"] >= 1
    assert refused["Retry-After"]
    assert refused["x-ratelimit-limit-requests"]
