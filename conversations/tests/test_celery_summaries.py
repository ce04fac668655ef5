"""Rolling summaries: written by a real Celery worker, sent in the next prompts, per branch.

The pool's window is made small so a handful of turns overflow it; the summariser is a
stand-in worker (its answer is known), and every prompt checked is the one the scheduler
would send: the job's `messages` in Redis, as `generation_start` queued them.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.contrib.auth.models import User

from billing.tests.factories import subscribe
from chatsite.redis import sync_redis
from conversations.context import assemble_context, load_tokenizer, summary_note
from conversations.models import BranchSummary, Conversation, Message
from conversations.selectors import active_branch
from conversations.services import conversation_create
from conversations.summaries import (
    SUMMARY_INSTRUCTION,
    summary_for_branch,
    summary_pending_key,
)
from conversations.turns import Turn, turn_edit, turn_send
from inference import queue
from inference.models import ModelPool, Worker
from inference.services import generation_finish
from inference.tests.fake_worker import FakeWorker
from inference.tests.fixtures import register_pool
from inference.tokens import pool_tokenizer_folder
from plugins.models import PluginConfig
from plugins.registry import get_registry

from .celery_worker import live_celery_worker, wait_until  # noqa: F401 (a fixture)

FAKE_SUMMARY = "tok0 tok1 tok2 tok3 tok4 tok5 tok6 tok7"
FILLER = "about the oven, the flour, the water and the salt we weighed this morning"
prompts: dict[Any, list[dict[str, Any]]] = {}
NOTE = {"role": "system", "content": summary_note(BranchSummary(content=FAKE_SUMMARY))}


@pytest.fixture
def small_window(settings: Any, default_pool: ModelPool, fake_workers: Any) -> FakeWorker:
    """A pool whose window holds about five turns, and a stand-in summariser pool.

    Plugin tools are switched off: their descriptions would take the whole small window.
    """
    for slug in get_registry().plugins:
        PluginConfig.objects.update_or_create(slug=slug, defaults={"enabled": False})
    settings.SUMMARY_MAX_TOKENS = 32
    settings.SUMMARY_TAIL_PERCENT = 50
    default_pool.context_window = 300
    default_pool.max_output_tokens = 16
    default_pool.save(update_fields=["context_window", "max_output_tokens"])
    register_pool(fake_workers())
    # The summariser: a pool of its own (SUMMARY_MODEL) with a window that takes every turn.
    summariser: FakeWorker = fake_workers()
    pool = ModelPool.objects.create(name="summariser", served_model="fake", context_window=8192)
    Worker.objects.create(
        pool=pool, name="summariser-1", url=summariser.url, state=Worker.State.HEALTHY
    )
    settings.SUMMARY_MODEL = "summariser"
    return summariser


def _job_messages(turn: Turn) -> list[dict[str, Any]]:
    raw = sync_redis().hget(queue.job_key(turn.generation.id), "messages")
    assert raw is not None, "the generation was not queued"
    return list(json.loads(str(raw)))


def _turn(user: User, conversation: Conversation, index: int) -> Turn:
    """An answered turn; `prompts` keeps what its generation was queued with."""
    turn = turn_send(user=user, conversation=conversation, content=f"Question {index} {FILLER}")
    if sync_redis().exists(queue.job_key(turn.generation.id)):  # queued at commit
        prompts[turn.generation.pk] = _job_messages(turn)
    generation_finish(
        generation_id=turn.generation.id, status="complete", text=f"Answer {index} {FILLER}"
    )
    return turn


def _no_summary_pending(conversation: Conversation) -> bool:
    return not sync_redis().exists(summary_pending_key(conversation.pk))


def _summarised(user: User) -> tuple[Conversation, list[Turn]]:
    """A conversation long enough to be summarised, once its summary is stored."""
    subscribe(user, tier="plus")
    conversation = conversation_create(owner=user)
    turns = [_turn(user, conversation, index) for index in range(8)]
    wait_until(lambda: BranchSummary.objects.filter(conversation=conversation).exists())
    wait_until(lambda: _no_summary_pending(conversation))
    return conversation, turns


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("live_celery_worker")
def test_a_long_conversation_is_summarised_and_the_next_prompt_carries_the_summary(
    user: User, small_window: FakeWorker
) -> None:
    conversation, turns = _summarised(user)

    summary = BranchSummary.objects.get(conversation=conversation)
    assert summary.content == FAKE_SUMMARY
    assert summary.through_message.role == Message.Role.ASSISTANT
    (request,) = [
        r for r in small_window.requests if r["messages"][0]["content"] == SUMMARY_INSTRUCTION
    ]
    assert "User: Question 0" in request["messages"][1]["content"]
    assert "Assistant: Answer 0" in request["messages"][1]["content"]

    turn = turn_send(user=user, conversation=conversation, content="And the crust?")
    messages = _job_messages(turn)
    # The first question, the summary, then the turns after it verbatim, then the new one.
    assert messages[0] == {"role": "user", "content": f"Question 0 {FILLER}"}
    assert messages[1] == NOTE
    verbatim = messages[2:-1]
    assert verbatim, "the newest turns are sent as they are"
    through = [t.assistant_message.pk for t in turns].index(summary.through_message_id)
    expected = []
    for index in range(through + 1, len(turns)):
        expected += [
            {"role": "user", "content": f"Question {index} {FILLER}"},
            {"role": "assistant", "content": f"Answer {index} {FILLER}"},
        ]
    assert verbatim == expected
    assert messages[-1] == {"role": "user", "content": "And the crust?"}


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("live_celery_worker")
def test_the_prefix_stays_until_the_newest_turns_overflow_again(
    user: User, small_window: FakeWorker
) -> None:
    conversation, _ = _summarised(user)
    prefixes = []
    for index in range(8, 16):
        turn = _turn(user, conversation, index)
        prefixes.append(prompts[turn.generation.pk][:2])
        wait_until(lambda: _no_summary_pending(conversation))
    first = BranchSummary.objects.filter(conversation=conversation).order_by("created_at")[0]

    # Several turns in a row start with the same first message and summary (cacheable) ...
    assert (
        prefixes[0]
        == prefixes[1]
        == [
            {"role": "user", "content": f"Question 0 {FILLER}"},
            NOTE,
        ]
    )
    # ... and once the turns after it overflow again, a new summary folds in the old one.
    summaries = list(BranchSummary.objects.filter(conversation=conversation).order_by("created_at"))
    assert 2 <= len(summaries) <= 4
    assert summaries[-1].covered_messages > first.covered_messages
    refolds = [
        r["messages"][1]["content"]
        for r in small_window.requests
        if r["messages"][0]["content"] == SUMMARY_INSTRUCTION
    ][1:]
    assert refolds and all(text.startswith(f"Summary so far:\n{FAKE_SUMMARY}") for text in refolds)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("live_celery_worker")
def test_an_edit_that_forks_before_the_summary_does_not_inherit_it(
    user: User, small_window: FakeWorker
) -> None:
    conversation, turns = _summarised(user)
    summary = BranchSummary.objects.get(conversation=conversation)
    through = [t.assistant_message.pk for t in turns].index(summary.through_message_id)
    assert through >= 1

    assert turns[1].user_message is not None
    forked = turn_edit(user=user, message=turns[1].user_message, content="Rye instead?")
    messages = _job_messages(forked)
    assert NOTE not in messages
    assert messages == [
        {"role": "user", "content": f"Question 0 {FILLER}"},
        {"role": "assistant", "content": f"Answer 0 {FILLER}"},
        {"role": "user", "content": "Rye instead?"},
    ]
    conversation.refresh_from_db()
    assert summary_for_branch(branch=active_branch(conversation=conversation)) is None


@pytest.mark.django_db
def test_a_summary_too_large_for_the_budget_is_left_out(user: User, small_window: Any) -> None:
    subscribe(user, tier="plus")
    conversation = conversation_create(owner=user)
    turns = [_turn(user, conversation, index) for index in range(3)]
    BranchSummary.objects.create(
        conversation=conversation,
        through_message=turns[0].assistant_message,
        content="crumb " * 500,
        tokens=500,
        covered_messages=2,
        model="smollm2-135m",
    )
    turn_send(user=user, conversation=conversation, content="Next?")
    conversation.refresh_from_db()
    branch = active_branch(conversation=conversation)[:-1]
    pool = ModelPool.objects.get(name=conversation.model)
    context = assemble_context(
        branch=branch,
        tokenizer=load_tokenizer(pool_tokenizer_folder(pool)),
        budget_tokens=284,
        summary=summary_for_branch(branch=branch),
    )
    assert context.summary_id is None
    assert all("crumb" not in m["content"] for m in context.messages)
