"""`Idempotency-Key` on message POSTs: a retry answers the same turn and is charged once."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from billing import quota
from billing.tests.factories import subscribe
from billing.tests.helpers import API, finish, send
from chatsite.testing import assert_error
from conversations.models import Conversation, Message
from conversations.services import conversation_create
from inference.models import Generation, ModelPool

pytestmark = pytest.mark.django_db


@pytest.mark.usefixtures("quota_clock")
def test_a_retry_with_the_same_key_answers_the_same_turn_and_is_charged_once(
    api_client: APIClient, user: User, conversation: Conversation
) -> None:
    subscribe(user, requests_per_minute=10)

    # The quota's clock stands still: the bucket does not refill between the two answers.
    first = send(api_client, conversation, HTTP_IDEMPOTENCY_KEY="k-1")
    retry = send(api_client, conversation, HTTP_IDEMPOTENCY_KEY="k-1")

    assert first.status_code == retry.status_code == 201
    assert retry.json() == first.json()
    assert Generation.objects.filter(conversation=conversation).count() == 1
    assert Message.objects.filter(conversation=conversation).count() == 3
    # One request taken from the bucket, one reservation held.
    assert first["x-ratelimit-remaining-requests"] == retry["x-ratelimit-remaining-requests"] == "9"
    assert quota.concurrency_in_use(user_id=user.pk, now=quota.now_ms()) == 1


def test_a_retry_after_the_answer_finished_still_points_at_it(
    api_client: APIClient, conversation: Conversation
) -> None:
    first = send(api_client, conversation, HTTP_IDEMPOTENCY_KEY="k-1").json()
    finish(first["generation"]["id"])

    retry = send(api_client, conversation, HTTP_IDEMPOTENCY_KEY="k-1")

    assert retry.status_code == 201
    assert retry.json()["generation"]["id"] == first["generation"]["id"]
    assert retry.json()["user_message"] == first["user_message"]
    assert Generation.objects.filter(conversation=conversation).count() == 1


def test_the_same_key_with_another_body_is_422(
    api_client: APIClient, conversation: Conversation
) -> None:
    assert send(api_client, conversation, "Hello!", HTTP_IDEMPOTENCY_KEY="k-1").status_code == 201

    response = send(api_client, conversation, "Something else", HTTP_IDEMPOTENCY_KEY="k-1")

    assert_error(response, 422, "idempotency_key_reused")
    assert Generation.objects.filter(conversation=conversation).count() == 1


def test_keys_belong_to_their_user(
    api_client: APIClient,
    other_api_client: APIClient,
    other_user: User,
    conversation: Conversation,
    pool: ModelPool,
) -> None:
    other_conversation = conversation_create(owner=other_user, model=pool.name)
    assert send(api_client, conversation, HTTP_IDEMPOTENCY_KEY="shared").status_code == 201

    response = send(other_api_client, other_conversation, HTTP_IDEMPOTENCY_KEY="shared")

    assert response.status_code == 201
    assert Generation.objects.count() == 2


def test_a_refused_request_leaves_its_key_free_for_the_retry(
    api_client: APIClient, user: User, pool: ModelPool
) -> None:
    subscribe(user, max_concurrent=1)
    busy = send(api_client, conversation_create(owner=user, model=pool.name))
    conversation = conversation_create(owner=user, model=pool.name)
    refused = send(api_client, conversation, HTTP_IDEMPOTENCY_KEY="k-2")
    assert_error(refused, 429, "too_many_concurrent")

    finish(busy.json()["generation"]["id"])
    retry = send(api_client, conversation, HTTP_IDEMPOTENCY_KEY="k-2")

    assert retry.status_code == 201
    assert Generation.objects.filter(conversation=conversation).count() == 1


def test_edit_and_regenerate_retries_are_idempotent_too(
    api_client: APIClient, conversation: Conversation
) -> None:
    first = send(api_client, conversation).json()
    finish(first["generation"]["id"])
    base = f"{API}/{conversation.pk}/messages"

    regenerate = f"{base}/{first['assistant_message']['id']}/regenerate"
    one = api_client.post(regenerate, HTTP_IDEMPOTENCY_KEY="regen")
    two = api_client.post(regenerate, HTTP_IDEMPOTENCY_KEY="regen")
    assert one.status_code == two.status_code == 201
    assert one.json() == two.json()
    finish(one.json()["generation"]["id"])

    edit = f"{base}/{first['user_message']['id']}/edit"
    body: dict[str, Any] = {"content": "Hello again!"}
    three = api_client.post(edit, body, format="json", HTTP_IDEMPOTENCY_KEY="edit")
    four = api_client.post(edit, body, format="json", HTTP_IDEMPOTENCY_KEY="edit")
    assert three.status_code == four.status_code == 201
    assert three.json() == four.json()
    # One first answer, one regenerated, one for the edit.
    assert Generation.objects.filter(conversation=conversation).count() == 3


def test_a_key_that_is_too_long_is_refused(
    api_client: APIClient, conversation: Conversation
) -> None:
    response = send(api_client, conversation, HTTP_IDEMPOTENCY_KEY="k" * 256)

    assert_error(response, 400, "invalid_idempotency_key")
    assert Generation.objects.filter(conversation=conversation).count() == 0


def test_a_key_whose_turn_was_deleted_runs_the_request_again(
    api_client: APIClient, user: User, conversation: Conversation
) -> None:
    first = send(api_client, conversation, HTTP_IDEMPOTENCY_KEY="k-3").json()
    Generation.objects.filter(pk=first["generation"]["id"]).delete()

    retry = send(api_client, conversation, HTTP_IDEMPOTENCY_KEY="k-3")

    # The conversation still has its unanswered placeholder: refused as without a key.
    assert_error(retry, 409, "generation_in_progress")
