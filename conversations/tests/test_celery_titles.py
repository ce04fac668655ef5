"""Automatic titles, written by a real Celery worker (real Redis broker, test database).

The fast path asks a stand-in worker (its answer is known, so the cleaning and the write can
be checked exactly); the end-to-end test asks real vLLM workers through the whole turn.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth.models import User

from billing.tests.factories import subscribe
from chatsite.redis import sync_redis
from conversations.events import user_events_key
from conversations.models import Conversation
from conversations.services import conversation_create, conversation_rename
from conversations.titles import clean_title, title_generate
from conversations.turns import Turn, turn_send
from inference.models import Generation, ModelPool, Worker
from inference.services import generation_finish
from inference.tests.fixtures import RealWorker, register_pool, running_schedulers, wait_for

from .celery_worker import (  # noqa: F401 (a fixture)
    live_celery_worker,
    wait_for_queued_tasks,
    wait_until,
)

FAKE_TITLE = "tok0 tok1 tok2 tok3 tok4 tok5 tok6 tok7"


@pytest.fixture(autouse=True)
def _no_memory_suggestions(settings: Any) -> None:
    """These tests count the title's requests to the small model; memory suggestions, asked
    after the same answers, are tested in test_memory.py."""
    settings.MEMORY_SUGGESTIONS = False


def _events(user_id: Any) -> list[tuple[str, dict[str, Any]]]:
    entries: Any = sync_redis().xrange(user_events_key(user_id))
    return [(fields["event"], json.loads(fields["data"])) for _, fields in entries]


def _first_exchange(user: User, *, answer: str = "Sourdough rises slowly overnight.") -> Turn:
    subscribe(user, tier="plus")
    conversation = conversation_create(owner=user)
    turn = turn_send(user=user, conversation=conversation, content="How is sourdough made?")
    generation_finish(generation_id=turn.generation.id, status="complete", text=answer)
    return turn


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ('"Baking Sourdough at Home"', "Baking Sourdough at Home"),
        ("Title: **Bread basics.**\nMore text the model added", "Bread basics"),
        ("\n\n  'Opening   hours'  \n", "Opening hours"),
        ("# Subject - Rye flour", "Rye flour"),
        ("word " * 40, ("word " * 12).strip()),
        ("", ""),
    ],
)
def test_clean_title_leaves_one_short_plain_line(raw: str, expected: str) -> None:
    assert clean_title(raw, max_chars=60) == expected


def test_a_long_title_is_cut_at_a_word_boundary() -> None:
    assert clean_title("Sourdough starters and their feeding schedules", max_chars=20) == (
        "Sourdough starters"
    )


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("live_celery_worker")
def test_the_first_exchange_gets_a_title_and_open_pages_hear_of_it(
    user: User, fake_workers: Any
) -> None:
    fake = fake_workers()
    register_pool(fake)
    turn = _first_exchange(user)

    conversation = wait_until(
        lambda: Conversation.objects.filter(pk=turn.conversation.pk).exclude(title="").first()
    )
    assert conversation is not None  # (wait_until returns what held)
    assert conversation.title == FAKE_TITLE
    assert conversation.title_set_by_user is False
    (request,) = fake.requests
    assert request["priority"] == settings.BACKGROUND_LLM_PRIORITY
    assert request["max_tokens"] == settings.TITLE_MAX_TOKENS
    prompt = request["messages"][-1]["content"]
    assert "How is sourdough made?" in prompt and "Sourdough rises slowly" in prompt
    assert _events(user.pk) == [
        ("title", {"conversation_id": str(turn.conversation.pk), "title": FAKE_TITLE})
    ]


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("live_celery_worker")
def test_only_the_first_exchange_asks_for_a_title(user: User, fake_workers: Any) -> None:
    fake = fake_workers()
    register_pool(fake)
    turn = _first_exchange(user)
    wait_until(lambda: Conversation.objects.filter(pk=turn.conversation.pk).exclude(title=""))

    second = turn_send(user=user, conversation=turn.conversation, content="And rye bread?")
    generation_finish(generation_id=second.generation.id, status="complete", text="Denser.")
    wait_for_queued_tasks()  # a second title task, had one been queued, has run
    assert len(fake.requests) == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("live_celery_worker")
def test_a_failed_first_answer_asks_for_no_title(user: User, fake_workers: Any) -> None:
    fake = fake_workers()
    register_pool(fake)
    subscribe(user, tier="plus")
    conversation = conversation_create(owner=user)
    turn = turn_send(user=user, conversation=conversation, content="Hello?")
    generation_finish(generation_id=turn.generation.id, status="failed", text="")
    wait_for_queued_tasks()  # a title task, had one been queued, has run
    assert fake.requests == []
    assert Conversation.objects.get(pk=conversation.pk).title == ""


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("live_celery_worker")
def test_a_title_the_user_sets_while_the_model_writes_one_is_kept(
    user: User, fake_workers: Any
) -> None:
    # The model takes a while; the user renames the conversation meanwhile.
    fake = fake_workers(tokens=8, token_delay=0.3)
    register_pool(fake)
    turn = _first_exchange(user)
    wait_until(lambda: fake.running == 1)
    conversation_rename(conversation=turn.conversation, title="My bread notes")
    wait_until(lambda: len(fake.requests) == 1 and fake.running == 0)
    wait_for_queued_tasks()  # the title task has ended: its conditional write is done

    conversation = Conversation.objects.get(pk=turn.conversation.pk)
    assert conversation.title == "My bread notes"
    assert conversation.title_set_by_user is True
    assert _events(user.pk) == []


@pytest.mark.django_db
def test_a_user_title_is_never_sent_to_the_model(user: User, fake_workers: Any) -> None:
    fake = fake_workers()
    register_pool(fake)
    conversation = conversation_create(owner=user, title="Chosen by me")
    assert title_generate(conversation_id=conversation.pk) is None
    assert fake.requests == []


@pytest.mark.django_db
def test_a_model_that_answers_nothing_leaves_the_first_question_as_title(
    user: User, fake_workers: Any
) -> None:
    fake = fake_workers(tokens=0)
    register_pool(fake)
    turn = _first_exchange(user)
    assert title_generate(conversation_id=turn.conversation.pk) == "How is sourdough made?"


# End to end: real vLLM workers, the real scheduler, the real Celery worker.


def _register_real(workers: list[RealWorker]) -> None:
    pool, _ = ModelPool.objects.update_or_create(
        name=settings.DEFAULT_MODEL, defaults={"served_model": "smollm2-135m"}
    )
    for index, worker in enumerate(workers):
        Worker.objects.create(
            pool=pool, name=f"vllm-{index}", url=worker.url, state=Worker.State.HEALTHY
        )


def _send(user: User) -> Turn:
    subscribe(user, tier="plus", max_output_tokens=24)
    conversation = conversation_create(owner=user, system_prompt="Answer in one sentence.")
    return turn_send(user=user, conversation=conversation, content="How do I bake rye bread?")


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("live_celery_worker")
async def test_a_real_model_titles_a_real_first_exchange(
    user: User, real_workers: list[RealWorker]
) -> None:
    await sync_to_async(_register_real)(real_workers)
    turn = await sync_to_async(_send)(user)

    async def answered() -> bool:
        return (await Generation.objects.aget(pk=turn.generation.id)).is_final

    async def titled() -> bool:
        conversation = await Conversation.objects.aget(pk=turn.conversation.pk)
        return bool(conversation.title)

    async with running_schedulers():
        await wait_for(answered, within=120)  # a real model's answer
    generation = await Generation.objects.aget(pk=turn.generation.id)
    assert generation.status == Generation.Status.COMPLETE, generation.error_message
    await wait_for(titled, within=120, every=0.25)

    conversation = await Conversation.objects.aget(pk=turn.conversation.pk)
    assert 0 < len(conversation.title) <= settings.AUTO_TITLE_MAX_CHARS
    assert "\n" not in conversation.title
    assert conversation.title == clean_title(conversation.title)
    events = await sync_to_async(_events)(user.pk)
    assert events == [
        ("title", {"conversation_id": str(conversation.pk), "title": conversation.title})
    ]
