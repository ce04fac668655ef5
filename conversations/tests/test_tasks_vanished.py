"""Conversations' Celery tasks and conversations that go while they work (a `/v1` conversation
is removed the moment its answer is final, a user deletes one, an account goes): each task
returns quietly (no traceback, no retry) and writes nothing, whether the row went before it
ran or between its read and its write.

Titles and summaries ask a stand-in worker (the model is not what is tested here); the window
between read and write is the model call, so the removal happens inside it.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from accounts.tests.factories import UserFactory
from billing.tests.factories import subscribe
from chatsite.redis import sync_redis
from chatsite.testing import run_task_quietly
from conversations import retention, small_model, titles
from conversations.events import user_events_key
from conversations.models import BranchSummary, Conversation, Message
from conversations.removal import conversation_remove
from conversations.selectors import active_branch
from conversations.tasks import generate_title, purge_expired_conversations, summarise_branch
from inference.models import ModelPool, Worker
from inference.tests.fake_worker import FakeWorker
from inference.tests.fixtures import register_pool

from .factories import ConversationFactory, exchange

pytestmark = pytest.mark.django_db

# A `/v1` conversation of a key that keeps none leaves no row; a user's delete, a tombstone.
REMOVALS = pytest.mark.parametrize("keep_tombstone", [False, True], ids=["dropped", "tombstone"])
FILLER = "about the oven, the flour, the water and the salt we weighed this morning"


def _remove(conversation: Conversation, *, keep_tombstone: bool = False) -> None:
    row = Conversation.objects.filter(pk=conversation.pk).first()
    if row is not None:
        conversation_remove(conversation=row, keep_tombstone=keep_tombstone)


def _gone_or_blank(conversation: Conversation) -> bool:
    """No row, or a tombstone that kept nothing (no title, no messages, no summary)."""
    row = Conversation.objects.filter(pk=conversation.pk).first()
    return row is None or (
        row.deleted_at is not None
        and row.title == ""
        and not Message.objects.filter(conversation=row).exists()
    )


def _events(user: User) -> list[str]:
    entries: Any = sync_redis().xrange(user_events_key(user.pk))
    return [fields["event"] for _, fields in entries]


def _removed_during_the_model_call(
    monkeypatch: pytest.MonkeyPatch, remove: Callable[[], None]
) -> list[str]:
    """Make the small model's answer arrive after `remove` ran; returns the answers given."""
    real_complete = small_model.complete
    answers: list[str] = []

    def complete_then_remove(**kwargs: Any) -> str:
        answer = real_complete(**kwargs)
        remove()
        answers.append(answer)
        return answer

    monkeypatch.setattr(small_model, "complete", complete_then_remove)
    return answers


# Titles


@pytest.fixture
def titled_by(fake_workers: Callable[..., FakeWorker]) -> FakeWorker:
    """The stand-in worker of the default pool, which writes titles."""
    fake = fake_workers()
    register_pool(fake)
    return fake


def _first_exchange(owner: User) -> Conversation:
    conversation = ConversationFactory.create(owner=owner, title="")
    exchange(conversation, "How is sourdough made?", answer="It rises slowly overnight.")
    return conversation


@REMOVALS
def test_no_title_is_asked_for_a_conversation_removed_before_the_task(
    user: User, titled_by: FakeWorker, caplog: pytest.LogCaptureFixture, keep_tombstone: bool
) -> None:
    conversation = _first_exchange(user)
    _remove(conversation, keep_tombstone=keep_tombstone)

    assert run_task_quietly(generate_title, str(conversation.pk), caplog=caplog) is None
    assert titled_by.requests == []
    assert _gone_or_blank(conversation)


@REMOVALS
def test_a_conversation_removed_while_its_title_is_written_gets_none(
    user: User,
    titled_by: FakeWorker,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    django_capture_on_commit_callbacks: Any,
    keep_tombstone: bool,
) -> None:
    conversation = _first_exchange(user)
    answers = _removed_during_the_model_call(
        monkeypatch, lambda: _remove(conversation, keep_tombstone=keep_tombstone)
    )

    with django_capture_on_commit_callbacks(execute=True):
        assert run_task_quietly(generate_title, str(conversation.pk), caplog=caplog) is None
    assert answers and answers[0], "the model was asked and answered"
    assert _gone_or_blank(conversation)
    assert "title" not in _events(user)


def test_a_title_is_written_when_nothing_is_removed(
    user: User, titled_by: FakeWorker, caplog: pytest.LogCaptureFixture
) -> None:
    """The control of the two above: the same conversation, left alone, is titled."""
    conversation = _first_exchange(user)

    title = run_task_quietly(generate_title, str(conversation.pk), caplog=caplog)
    assert title and Conversation.objects.get(pk=conversation.pk).title == title


# Summaries


@pytest.fixture
def summariser(
    settings: Any, default_pool: ModelPool, fake_workers: Callable[..., FakeWorker]
) -> FakeWorker:
    """A stand-in summariser pool with a window that takes every turn (SUMMARY_MODEL)."""
    settings.SUMMARY_MAX_TOKENS = 32
    settings.SUMMARY_TAIL_PERCENT = 50
    fake = fake_workers()
    pool = ModelPool.objects.create(name="summariser", served_model="fake", context_window=8192)
    Worker.objects.create(pool=pool, name="summariser-1", url=fake.url, state=Worker.State.HEALTHY)
    settings.SUMMARY_MODEL = "summariser"
    return fake


# Prompts of this budget drop the older of the turns below: a summary of them is due.
SUMMARY_BUDGET = 300


def _long_conversation(owner: User) -> tuple[Conversation, Message]:
    conversation = ConversationFactory.create(owner=owner)
    parent = None
    for index in range(8):
        _, parent = exchange(
            conversation, f"Question {index} {FILLER}", parent=parent, answer=f"Answer {FILLER}"
        )
    leaf = active_branch(conversation=Conversation.objects.get(pk=conversation.pk))[-1]
    return conversation, leaf


def _summarise(conversation: Conversation, leaf: Message, caplog: Any) -> Any:
    return run_task_quietly(
        summarise_branch, str(conversation.pk), str(leaf.pk), SUMMARY_BUDGET, caplog=caplog
    )


@REMOVALS
def test_no_summary_is_asked_for_a_conversation_removed_before_the_task(
    user: User, summariser: FakeWorker, caplog: pytest.LogCaptureFixture, keep_tombstone: bool
) -> None:
    conversation, leaf = _long_conversation(user)
    _remove(conversation, keep_tombstone=keep_tombstone)

    assert _summarise(conversation, leaf, caplog) is None
    assert summariser.requests == []
    assert not BranchSummary.objects.exists()


@REMOVALS
def test_a_conversation_removed_while_its_summary_is_written_gets_none(
    user: User,
    summariser: FakeWorker,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    keep_tombstone: bool,
) -> None:
    conversation, leaf = _long_conversation(user)
    answers = _removed_during_the_model_call(
        monkeypatch, lambda: _remove(conversation, keep_tombstone=keep_tombstone)
    )

    assert _summarise(conversation, leaf, caplog) is None
    assert answers and answers[0], "the model was asked and answered"
    assert not BranchSummary.objects.exists()
    assert _gone_or_blank(conversation)


def test_a_summary_is_written_when_nothing_is_removed(
    user: User, summariser: FakeWorker, caplog: pytest.LogCaptureFixture
) -> None:
    """The control of the two above: the same branch, left alone, gets its summary."""
    conversation, leaf = _long_conversation(user)

    summary_id = _summarise(conversation, leaf, caplog)
    assert BranchSummary.objects.get(pk=summary_id).conversation_id == conversation.pk


# Retention


def _expired(owner: User, title: str) -> Conversation:
    conversation = ConversationFactory.create(owner=owner, title=title)
    exchange(conversation, "An old question")
    Conversation.objects.filter(pk=conversation.pk).update(
        last_activity_at=timezone.now() - timedelta(days=31)
    )
    return conversation


@pytest.mark.parametrize("how", ["dropped", "account deleted"])
def test_retention_passes_over_a_conversation_that_goes_after_it_was_listed(
    user: User, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """Another removal (a `/v1` one, or the owner's account going) wins the race to one of
    the expired conversations; the purge goes on with the rest."""
    subscribe(user, history_retention_days=30)
    other: User = UserFactory.create()
    subscribe(other, history_retention_days=30)
    first, second = _expired(user, "first"), _expired(other, "second")
    real_remove = retention.conversation_remove
    raced: list[Any] = []

    def removed_meanwhile(*, conversation: Conversation, **kwargs: Any) -> bool:
        if conversation.owner_id == user.pk and not raced:
            raced.append(conversation.pk)
            if how == "dropped":
                _remove(conversation, keep_tombstone=False)
            else:
                User.objects.filter(pk=user.pk).delete()
        return real_remove(conversation=conversation, **kwargs)

    monkeypatch.setattr(retention, "conversation_remove", removed_meanwhile)

    run_task_quietly(purge_expired_conversations, caplog=caplog)
    assert raced == [first.pk]
    assert not Conversation.objects.filter(pk=first.pk).exists()
    assert Conversation.objects.get(pk=second.pk).deleted_at is not None, "the purge went on"
    assert not Message.objects.filter(conversation__in=[first.pk, second.pk]).exists()


def test_the_title_claim_is_released_when_the_conversation_is_gone(
    user: User, titled_by: FakeWorker, caplog: pytest.LogCaptureFixture
) -> None:
    """The next answer may ask for a title again: no claim outlives a task that found none."""
    conversation = _first_exchange(user)
    claim = titles.title_pending_key(conversation.pk)
    sync_redis().set(claim, "1")
    _remove(conversation)

    assert run_task_quietly(generate_title, str(conversation.pk), caplog=caplog) is None
    assert not sync_redis().exists(claim)
