"""Every API answer carries the caller's x-ratelimit-* headers, refusals included."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User
from django.test import Client
from rest_framework.test import APIClient

from billing.selectors import format_reset
from billing.tests.factories import subscribe
from billing.tests.helpers import send
from chatsite.testing import assert_error
from conversations.models import Conversation
from conversations.services import conversation_create
from inference.models import ModelPool

# The quota's clock stands still (`quota_clock`): the buckets refill only when a test moves
# it, so what the headers say does not depend on how long a request took.
pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("quota_clock")]

HEADERS = [
    "x-ratelimit-limit-requests",
    "x-ratelimit-remaining-requests",
    "x-ratelimit-reset-requests",
    "x-ratelimit-limit-tokens",
    "x-ratelimit-remaining-tokens",
    "x-ratelimit-reset-tokens",
]


def milliseconds(duration: str) -> int:
    """`1m0s` -> 60000, `1.5s` -> 1500, `120ms` -> 120."""
    match = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m(?!s))?(?:([\d.]+)s)?(?:(\d+)ms)?", duration)
    assert match, duration
    hours, minutes, seconds, millis = match.groups()
    return int(
        int(hours or 0) * 3_600_000
        + int(minutes or 0) * 60_000
        + float(seconds or 0) * 1000
        + int(millis or 0)
    )


def test_a_read_carries_the_full_buckets(api_client: APIClient, user: User) -> None:
    subscribe(user, requests_per_minute=30, tokens_per_minute=90_000)

    response = api_client.get("/api/v1/conversations")

    assert response.status_code == 200
    assert [response[name] for name in HEADERS] == ["30", "30", "0s", "90000", "90000", "0s"]


def test_a_message_takes_a_request_and_its_tokens_from_the_headers(
    api_client: APIClient, user: User, conversation: Conversation
) -> None:
    subscribe(user, requests_per_minute=30, tokens_per_minute=6_000, max_output_tokens=100)

    response = send(api_client, conversation)

    assert response.status_code == 201
    assert response["x-ratelimit-remaining-requests"] == "29"
    assert milliseconds(response["x-ratelimit-reset-requests"]) == 2_000  # one in 30/min
    remaining_tokens = int(response["x-ratelimit-remaining-tokens"])
    # The prompt estimate (a few tokens) plus the 100 of max output were taken.
    assert 6_000 - 200 < remaining_tokens <= 6_000 - 100
    assert 1_000 <= milliseconds(response["x-ratelimit-reset-tokens"]) < 2_000


def test_a_refusal_carries_the_headers_and_retry_after(
    api_client: APIClient, user: User, pool: ModelPool
) -> None:
    subscribe(user, requests_per_minute=1)
    send(api_client, conversation_create(owner=user, model=pool.name))

    response = send(api_client, conversation_create(owner=user, model=pool.name))

    assert_error(response, 429, "rate_limited_requests")
    assert response["Retry-After"] == "60"
    assert response["x-ratelimit-limit-requests"] == "1"
    assert response["x-ratelimit-remaining-requests"] == "0"
    assert milliseconds(response["x-ratelimit-reset-requests"]) == 60_000
    assert all(name in response for name in HEADERS)


def test_session_callers_get_them_too(session_client: APIClient) -> None:
    response = session_client.get("/api/v1/conversations")

    assert all(name in response for name in HEADERS)


def test_anonymous_answers_and_pages_carry_none(user: User) -> None:
    anonymous = APIClient().get("/api/v1/conversations")
    client = Client()
    client.force_login(user)
    page = client.get("/accounts/api-keys/")

    assert anonymous.status_code == 401
    assert not any(name in anonymous for name in HEADERS)
    assert page.status_code == 200
    assert not any(name in page for name in HEADERS)


def test_resets_are_written_as_openai_durations() -> None:
    assert [format_reset(ms) for ms in (0, 120, 1000, 1500, 59_999, 60_000, 361_000)] == [
        "0s",
        "120ms",
        "1s",
        "1.5s",
        "59.9s",
        "1m0s",
        "6m1s",
    ]
    assert format_reset(2 * 3600_000 + 5 * 60_000) == "2h5m0s"
    assert [milliseconds(text) for text in ("120ms", "1.5s", "6m1s", "2h5m0s")] == [
        120,
        1500,
        361_000,
        7_500_000,
    ]
