"""The admin's log-in is limited per client IP like the site's, against password guessing."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from accounts.tests.factories import UserFactory
from chatsite.testing import assert_error
from chatsite.tests.ratelimit_window import one_ratelimit_window

pytestmark = pytest.mark.django_db

PASSWORD = "correct horse battery staple"  # the factory's


@pytest.fixture(autouse=True)
def _tight_login_rate(settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    settings.BILLING_ABUSE_RATES = {**settings.BILLING_ABUSE_RATES, "login": "3/h"}
    one_ratelimit_window(monkeypatch)  # no window ends between the test's requests


@pytest.fixture
def staff(db: Any) -> User:
    user: User = UserFactory.create(is_staff=True, is_superuser=True)
    return user


def test_wrong_admin_passwords_are_refused_with_429(staff: User) -> None:
    client = Client()
    for _ in range(3):
        response = client.post("/admin/login/", {"username": staff.username, "password": "x"})
        assert response.status_code == 200  # the form again, with its error

    refused = client.post(
        "/admin/login/",
        {"username": staff.username, "password": PASSWORD, "next": "/admin/"},
        HTTP_ACCEPT="text/html",
    )

    assert refused.status_code == 429
    assert 1 <= int(refused["Retry-After"]) <= 3600
    assert b"Too many attempts" in refused.content
    assert client.get("/admin/").status_code == 302, "not logged in"
    # Reading the page is never limited, and another address still logs in.
    assert client.get("/admin/login/").status_code == 200
    other = Client(REMOTE_ADDR="10.0.0.2")
    logged_in = other.post(
        "/admin/login/", {"username": staff.username, "password": PASSWORD, "next": "/admin/"}
    )
    assert logged_in.status_code == 302
    assert other.get("/admin/").status_code == 200


def test_the_admin_and_the_site_log_in_share_one_budget(staff: User) -> None:
    client = Client()
    for _ in range(3):
        client.post("/accounts/login/", {"username": staff.username, "password": "x"})

    refused = client.post(
        "/admin/login/",
        {"username": staff.username, "password": PASSWORD},
        HTTP_ACCEPT="application/json",
    )

    assert_error(refused, 429, "rate_limited")
