"""Enforcement on the request path: every message reserves before anything is queued, and
its generation's end gives back what it did not use."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import IntegrityError
from rest_framework.test import APIClient

from billing import quota
from billing.models import UsageEvent
from billing.tests.factories import PlanFactory, subscribe
from billing.tests.helpers import API, finish, send, tokens_left
from chatsite.testing import assert_error
from conversations import turns
from conversations.models import Conversation, Message
from conversations.removal import conversation_remove
from conversations.services import conversation_create
from inference.models import Generation, ModelPool
from inference.services import generation_cancel

# The buckets are read back after a send: on the quota's clock held still, so that they do not
# refill however long the send takes.
pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("quota_clock")]


def new_conversation(user: User, pool: ModelPool) -> Conversation:
    return conversation_create(owner=user, model=pool.name)


def held_tokens(user: User, generation_id: Any) -> int | None:
    held = quota.held(user_id=user.pk, reservation_id=str(generation_id))
    return None if held is None else held.tokens


def test_a_message_reserves_its_prompt_estimate_plus_the_plans_max_output(
    api_client: APIClient, user: User, conversation: Conversation
) -> None:
    subscribe(user, tokens_per_minute=100_000, max_output_tokens=256)

    response = send(api_client, conversation)

    assert response.status_code == 201, response.content
    generation = Generation.objects.get(pk=response.json()["generation"]["id"])
    assert generation.max_tokens == 256
    held = quota.held(user_id=user.pk, reservation_id=str(generation.id))
    assert held is not None
    assert held.prompt_tokens > 0
    assert held.tokens == held.prompt_tokens + 256
    assert tokens_left(user, tokens_per_minute=100_000) == 100_000 - held.tokens
    assert quota.concurrency_in_use(user_id=user.pk, now=quota.now_ms()) == 1


def test_the_plans_tier_sets_the_generation_priority(
    api_client: APIClient, user: User, conversation: Conversation, pool: ModelPool
) -> None:
    subscribe(user, tier="pro")

    response = send(api_client, conversation)

    generation = Generation.objects.get(pk=response.json()["generation"]["id"])
    assert (generation.tier, generation.priority) == ("pro", 0)


def test_a_user_without_subscription_is_on_the_default_free_plan(
    api_client: APIClient, conversation: Conversation
) -> None:
    response = send(api_client, conversation)

    generation = Generation.objects.get(pk=response.json()["generation"]["id"])
    assert (generation.tier, generation.priority) == ("free", 10)
    assert response["x-ratelimit-limit-requests"] == "20"
    assert response["x-ratelimit-limit-tokens"] == "40000"


def test_the_message_cap_refuses_with_429_its_code_and_when_it_resets(
    api_client: APIClient, user: User, pool: ModelPool
) -> None:
    subscribe(user, message_cap=2, message_cap_window_seconds=3 * 3600)
    for _ in range(2):
        assert send(api_client, new_conversation(user, pool)).status_code == 201
    conversation = new_conversation(user, pool)

    response = send(api_client, conversation)

    error = assert_error(response, 429, "message_cap_reached")
    assert error["detail"]["scope"] == "messages"
    assert error["detail"]["limit"] == 2
    assert 3 * 3600 - 60 <= int(response["Retry-After"]) <= 3 * 3600
    assert error["detail"]["retry_after"] == int(response["Retry-After"])
    assert response["x-ratelimit-remaining-requests"]
    # Nothing was written or queued for the refused message.
    assert Message.objects.filter(conversation=conversation).count() == 1
    assert Generation.objects.filter(conversation=conversation).count() == 0


def test_too_many_answers_in_progress_refuses_until_one_finishes(
    api_client: APIClient, user: User, pool: ModelPool
) -> None:
    subscribe(user, max_concurrent=1)
    first = send(api_client, new_conversation(user, pool))
    conversation = new_conversation(user, pool)

    response = send(api_client, conversation)

    assert_error(response, 429, "too_many_concurrent")
    assert response["Retry-After"] == "2"
    finish(first.json()["generation"]["id"])
    assert send(api_client, conversation).status_code == 201


def test_requests_per_minute_refuses_with_its_own_code(
    api_client: APIClient, user: User, pool: ModelPool
) -> None:
    subscribe(user, requests_per_minute=1)
    assert send(api_client, new_conversation(user, pool)).status_code == 201

    response = send(api_client, new_conversation(user, pool))

    error = assert_error(response, 429, "rate_limited_requests")
    assert 59 <= int(response["Retry-After"]) <= 60
    assert error["detail"]["refused"] == [{"scope": "requests", "retry_after": 60}]


def test_tokens_per_minute_refuses_with_its_own_code(
    api_client: APIClient, user: User, pool: ModelPool
) -> None:
    subscribe(user, tokens_per_minute=400, max_output_tokens=256)
    assert send(api_client, new_conversation(user, pool)).status_code == 201

    response = send(api_client, new_conversation(user, pool))

    assert_error(response, 429, "rate_limited_tokens")
    assert 1 <= int(response["Retry-After"]) <= 60


def test_a_message_larger_than_a_minute_of_tokens_is_413(
    api_client: APIClient, user: User, conversation: Conversation
) -> None:
    subscribe(user, tokens_per_minute=100, max_output_tokens=256)

    response = send(api_client, conversation)

    error = assert_error(response, 413, "request_too_large")
    assert error["detail"]["limit"] == 100
    assert "Retry-After" not in response


def test_a_model_the_plan_does_not_list_is_403(
    api_client: APIClient, user: User, conversation: Conversation, pool: ModelPool
) -> None:
    other = ModelPool.objects.create(name="other-model", served_model="other")
    plan = subscribe(user)
    plan.plan_pools.create(pool=other)

    assert_error(send(api_client, conversation), 403, "model_not_in_plan")
    created = api_client.post(API, {"model": pool.name}, format="json")
    assert_error(created, 403, "model_not_in_plan")
    assert api_client.post(API, {"model": "other-model"}, format="json").status_code == 201


def test_a_pool_outside_the_plans_tier_is_403(
    api_client: APIClient, user: User, conversation: Conversation, pool: ModelPool
) -> None:
    pool.tiers = ["pro"]
    pool.save(update_fields=["tiers"])
    subscribe(user, tier="plus")

    assert_error(send(api_client, conversation), 403, "model_not_in_plan")


def test_a_listed_pool_has_its_own_cap(api_client: APIClient, user: User, pool: ModelPool) -> None:
    plan = subscribe(user, message_cap=50)
    plan.plan_pools.create(pool=pool, message_cap=1)
    assert send(api_client, new_conversation(user, pool)).status_code == 201

    assert_error(send(api_client, new_conversation(user, pool)), 429, "message_cap_reached")


def test_finishing_gives_back_the_unused_tokens_and_the_slot(
    api_client: APIClient, user: User, conversation: Conversation
) -> None:
    subscribe(user, tokens_per_minute=100_000, max_output_tokens=256)
    generation_id = send(api_client, conversation).json()["generation"]["id"]
    assert held_tokens(user, generation_id) is not None

    finish(generation_id, prompt_tokens=20, output_tokens=5)

    assert held_tokens(user, generation_id) is None
    assert quota.concurrency_in_use(user_id=user.pk, now=quota.now_ms()) == 0
    assert tokens_left(user, tokens_per_minute=100_000) == 100_000 - 25


def test_an_answer_cancelled_in_the_queue_consumes_nothing(
    api_client: APIClient, user: User, pool: ModelPool, django_capture_on_commit_callbacks: Any
) -> None:
    subscribe(user, message_cap=1, tokens_per_minute=100_000)
    with django_capture_on_commit_callbacks(execute=True):
        response = send(api_client, new_conversation(user, pool))
    generation_id = response.json()["generation"]["id"]

    generation_cancel(generation=Generation.objects.get(pk=generation_id))

    event = UsageEvent.objects.get(generation_id=generation_id)
    assert (event.status, event.prompt_tokens, event.output_tokens, event.cost_micros) == (
        "cancelled",
        0,
        0,
        0,
    )
    assert tokens_left(user, tokens_per_minute=100_000) == 100_000
    # The message it never got does not count against the cap.
    assert send(api_client, new_conversation(user, pool)).status_code == 201


def test_a_rejected_answer_consumes_nothing(
    api_client: APIClient, user: User, pool: ModelPool
) -> None:
    subscribe(user, message_cap=1)
    generation_id = send(api_client, new_conversation(user, pool)).json()["generation"]["id"]

    finish(
        generation_id,
        status=Generation.Status.REJECTED,
        text="",
        prompt_tokens=None,
        output_tokens=None,
    )

    assert UsageEvent.objects.get(generation_id=generation_id).cost_micros == 0
    assert send(api_client, new_conversation(user, pool)).status_code == 201


def test_an_answer_cancelled_mid_way_is_charged_what_it_produced_and_counts(
    api_client: APIClient, user: User, pool: ModelPool
) -> None:
    subscribe(user, message_cap=1)
    generation_id = send(api_client, new_conversation(user, pool)).json()["generation"]["id"]

    # The scheduler had no usage report: it passes its prompt count, the text is counted.
    finish(
        generation_id,
        status=Generation.Status.CANCELLED,
        text="The first few words of",
        prompt_tokens=17,
        output_tokens=None,
    )

    event = UsageEvent.objects.get(generation_id=generation_id)
    assert event.prompt_tokens == 17
    assert event.output_tokens == 5
    assert_error(send(api_client, new_conversation(user, pool)), 429, "message_cap_reached")


@pytest.mark.django_db(transaction=True)
def test_a_turn_whose_commit_fails_gives_its_reservation_back(
    user: User, pool: ModelPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    subscribe(user, tokens_per_minute=100_000, max_concurrent=1)
    conversation = new_conversation(user, pool)
    real_start = turns.generation_start
    started: list[Generation] = []

    def start_then_break_the_commit(**kwargs: Any) -> Generation:
        generation = real_start(**kwargs)
        started.append(generation)
        # Foreign keys are checked at commit: this makes the commit itself fail, after the
        # reservation was made.
        Message.objects.filter(pk=kwargs["message"].pk).update(parent_id=uuid.uuid4())
        return generation

    monkeypatch.setattr(turns, "generation_start", start_then_break_the_commit)

    with pytest.raises(IntegrityError):
        turns.turn_send(user=user, conversation=conversation, content="Hello!")

    assert started
    assert not Generation.objects.filter(pk=started[0].pk).exists()
    assert held_tokens(user, started[0].pk) is None
    assert quota.concurrency_in_use(user_id=user.pk, now=quota.now_ms()) == 0
    assert tokens_left(user, tokens_per_minute=100_000) == 100_000


def test_default_plan_is_restored_if_its_row_is_gone(
    api_client: APIClient, user: User, conversation: Conversation
) -> None:
    from billing.models import Plan

    Plan.objects.all().delete()
    PlanFactory.create(slug="unrelated")

    response = send(api_client, conversation)

    assert response.status_code == 201
    assert Plan.objects.get(is_default=True).slug == "free"


def test_deleting_a_conversation_gives_back_its_unfinished_answers_reservation(
    api_client: APIClient, user: User, pool: ModelPool, django_capture_on_commit_callbacks: Any
) -> None:
    subscribe(user, max_concurrent=1)
    conversation = new_conversation(user, pool)
    generation_id = send(api_client, conversation).json()["generation"]["id"]

    with django_capture_on_commit_callbacks(execute=True):
        conversation_remove(conversation=conversation)

    assert held_tokens(user, generation_id) is None
    assert send(api_client, new_conversation(user, pool)).status_code == 201
