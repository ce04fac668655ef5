"""The `auto` model: the rules as a pure function, and a turn through the real send path
recording which pool answers and why, on the generation, the answer and its API shape."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from billing.tests.factories import subscribe
from conversations.auto_model import Choice, RuleChooser, TaskFacts, has_code
from conversations.models import Message
from conversations.turns import conversation_start, turn_from_messages, turn_send
from inference.models import Generation, ModelPool
from inference.tests.fixtures import register_pool, stream_events

pytestmark = pytest.mark.django_db(transaction=True)  # the stream is written on commit


@pytest.fixture
def auto(settings: Any) -> None:
    settings.AUTO_MODEL = "auto"
    settings.AUTO_MODEL_SMALL = "small-model"
    settings.AUTO_MODEL_LARGE = "large-model"
    settings.AUTO_MODEL_LONG_PROMPT_TOKENS = 200
    settings.AUTO_MODEL_LARGE_TIERS = ["pro"]


@pytest.mark.parametrize(
    ("facts", "choice"),
    [
        (TaskFacts("free", "What is the capital of France?", 20), Choice("small-model", "simple")),
        (
            TaskFacts("free", "Why does this fail?\n```\nprint(1/0)\n```", 30),
            Choice("large-model", "code"),
        ),
        (TaskFacts("free", "def f(x):\n    return x", 30), Choice("large-model", "code")),
        (TaskFacts("free", "Summarise the above.", 250), Choice("large-model", "long_prompt")),
        (TaskFacts("pro", "Hello!", 5), Choice("large-model", "plan")),
    ],
)
def test_the_rules(auto: None, facts: TaskFacts, choice: Choice) -> None:
    assert RuleChooser().choose(facts) == choice


def test_prose_with_punctuation_is_not_code() -> None:
    assert not has_code("Hello; how are you? I like cats, dogs and birds.")
    assert has_code("SELECT * FROM users;")


def pools() -> tuple[ModelPool, ModelPool]:
    small = register_pool(name="small-model")
    large = register_pool(name="large-model")
    return small, large


def test_an_auto_turn_records_the_pool_and_why(
    auto: None, user: User, api_client: APIClient
) -> None:
    small, large = pools()
    subscribe(user, tier="free")
    simple = turn_send(
        user=user,
        conversation=conversation_start(user=user, model="auto"),
        content="Hi, how are you?",
    )
    conversation = conversation_start(user=user, model="auto")
    code = turn_send(
        user=user, conversation=conversation, content="Fix this:\n```\nprint(1/0)\n```"
    )

    first = Generation.objects.select_related("message").get(pk=simple.generation.pk)
    assert (first.pool_id, first.route_reason) == (small.pk, "auto_simple")
    assert first.message.model == "small-model"
    second = Generation.objects.select_related("message").get(pk=code.generation.pk)
    assert (second.pool_id, second.route_reason) == (large.pk, "auto_code")
    assert second.message.metadata["route"] == {
        "model": "large-model",
        "reason": "auto_code",
        "notice": "Auto chose large-model: it involves code.",
    }
    body = api_client.get(
        f"/api/v1/conversations/{conversation.pk}/messages/{second.message_id}"
    ).json()
    assert body["model"] == "large-model"
    assert body["route"]["notice"] == "Auto chose large-model: it involves code."
    # The stream says so from its first event.
    meta = next(data for name, data in stream_events(second.pk) if name == "meta")
    assert meta["model"] == "large-model" and meta["route_reason"] == "auto_code"
    assert meta["notice"] == "Auto chose large-model: it involves code."
    # The conversation stays `auto`: the next turn is judged again.
    conversation.refresh_from_db()
    assert conversation.model == "auto"


def test_a_plan_without_the_large_pool_gets_the_small_one(auto: None, user: User) -> None:
    small, large = pools()
    subscribe(user, tier="free")
    large.tiers = ["pro"]  # not the free tier's
    large.save(update_fields=["tiers"])
    conversation = conversation_start(user=user, model="auto")
    turn = turn_send(user=user, conversation=conversation, content="def f(): pass")
    generation = Generation.objects.get(pk=turn.generation.pk)
    assert (generation.pool_id, generation.route_reason) == (small.pk, "auto_plan_limit")


def test_the_api_lists_auto(auto: None, user: User, api_client: APIClient) -> None:
    pools()
    subscribe(user, tier="free")
    ids = [model["id"] for model in api_client.get("/v1/models").json()["data"]]
    assert "auto" in ids and "small-model" in ids


def test_an_api_request_for_auto_is_answered_by_the_chosen_pool(auto: None, user: User) -> None:
    _small, large = pools()
    subscribe(user, tier="free")
    turn = turn_from_messages(
        user=user,
        model="auto",
        system_prompt="",
        messages=[("user", "Why does this fail?\n```\nprint(1/0)\n```")],
    )
    generation = Generation.objects.get(pk=turn.generation.pk)
    assert (generation.pool_id, generation.route_reason) == (large.pk, "auto_code")
    meta = next(data for name, data in stream_events(generation.pk) if name == "meta")
    assert meta["model"] == "large-model"


def test_the_picker_offers_auto(auto: None, user: User, client: Any) -> None:
    pools()
    subscribe(user, tier="free")
    client.force_login(user)
    page = client.get("/").content.decode()
    assert '<option value="auto"' in page
    assert Message.objects.count() == 0
