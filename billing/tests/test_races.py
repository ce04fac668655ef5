"""Many requests at once against the real Postgres, Redis and HTTP view: limits still hold."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from functools import partial
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from rest_framework.test import APIClient

from accounts.services import api_key_create
from billing import quota
from billing.tests.factories import subscribe
from billing.tests.helpers import send
from chatsite.testing import budget
from conversations.services import conversation_create
from inference.models import Generation, ModelPool

pytestmark = pytest.mark.django_db(transaction=True)

# Postgres allows 100 connections, shared with whatever else runs: each thread holds one.
THREADS = 25


def run_at_once(calls: list[Callable[[], Any]], threads: int = THREADS) -> list[Any]:
    """Run `calls` on `threads` threads that start together, each with its own connection."""
    barrier = threading.Barrier(threads)
    outcomes: list[Any] = [None] * len(calls)

    def worker(offset: int) -> None:
        try:
            barrier.wait()
            for index in range(offset, len(calls), threads):
                try:
                    outcomes[index] = calls[index]()
                except Exception as exc:
                    outcomes[index] = exc
        finally:
            connection.close()

    pool = [threading.Thread(target=worker, args=(offset,)) for offset in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join(timeout=budget(240))  # the failure point only
    assert not any(thread.is_alive() for thread in pool), "a call never returned"
    return outcomes


def client_for(user: User) -> APIClient:
    _, raw_key = api_key_create(user=user, name="race")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw_key}")
    return client


def test_200_concurrent_message_posts_against_a_cap_of_10_admit_exactly_10(
    user: User, pool: ModelPool, settings: Any
) -> None:
    settings.BILLING_ABUSE_RATES = {**settings.BILLING_ABUSE_RATES, "message_post": "1000/m"}
    subscribe(user, message_cap=10)
    conversations = [conversation_create(owner=user, model=pool.name) for _ in range(200)]
    clients = [client_for(user) for _ in range(THREADS)]

    responses = run_at_once(
        [partial(send, clients[i % THREADS], conversations[i]) for i in range(200)]
    )

    statuses = Counter(r.status_code for r in responses)
    assert statuses == {201: 10, 429: 190}, statuses
    codes = {r.json()["error"]["code"] for r in responses if r.status_code == 429}
    assert codes == {"message_cap_reached"}
    assert Generation.objects.filter(user=user).count() == 10
    window = quota.cap_window(
        user_id=user.pk, pool_id=pool.pk, window_ms=3 * 3600_000, now=quota.now_ms()
    )
    assert set(window) == {str(g.id) for g in Generation.objects.filter(user=user)}


def test_concurrent_posts_never_hold_more_slots_than_the_plan_allows(
    user: User, pool: ModelPool, settings: Any
) -> None:
    settings.BILLING_ABUSE_RATES = {**settings.BILLING_ABUSE_RATES, "message_post": "1000/m"}
    subscribe(user, max_concurrent=3)
    conversations = [conversation_create(owner=user, model=pool.name) for _ in range(50)]
    clients = [client_for(user) for _ in range(THREADS)]

    responses = run_at_once(
        [partial(send, clients[i % THREADS], conversations[i]) for i in range(50)]
    )

    assert Counter(r.status_code for r in responses) == {201: 3, 429: 47}
    assert quota.concurrency_in_use(user_id=user.pk, now=quota.now_ms()) == 3


def test_concurrent_retries_with_one_idempotency_key_make_one_answer(
    user: User, pool: ModelPool, settings: Any
) -> None:
    settings.BILLING_ABUSE_RATES = {**settings.BILLING_ABUSE_RATES, "message_post": "1000/m"}
    subscribe(user)
    conversation = conversation_create(owner=user, model=pool.name)
    clients = [client_for(user) for _ in range(20)]

    responses = run_at_once(
        [partial(send, c, conversation, HTTP_IDEMPOTENCY_KEY="retry-me") for c in clients],
        threads=20,
    )

    assert Generation.objects.filter(user=user).count() == 1
    generation = Generation.objects.get(user=user)
    accepted = [r for r in responses if r.status_code == 201]
    assert accepted
    assert {r.json()["generation"]["id"] for r in accepted} == {str(generation.id)}
    # The others arrived while the first was still running: told to retry, nothing made.
    assert {r.json()["error"]["code"] for r in responses if r.status_code != 201} <= {
        "idempotency_key_in_use"
    }
