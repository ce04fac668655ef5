"""The search index and conversations that go while it works: a `/v1` conversation is removed
the moment its answer is final, a user deletes one. Indexing what went writes nothing, quietly
(no traceback, no retry), whether it went before the task ran or between its read and its write.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest
from django.db import connection

from chatsite import embeddings
from chatsite.testing import logged, run_task_quietly
from conversations.models import Conversation, Message
from conversations.removal import conversation_remove
from conversations.tests.factories import ConversationFactory, exchange
from plugins.builtin import search_index
from plugins.models import MessageEmbedding
from plugins.tasks import search_index_message

# A `/v1` conversation of a key that keeps none leaves no row; a user's delete, a tombstone.
REMOVALS = pytest.mark.parametrize("keep_tombstone", [False, True], ids=["dropped", "tombstone"])


def _chat(owner: Any, question: str = "How do tides work?") -> tuple[Conversation, Message]:
    conversation = ConversationFactory.create(owner=owner, source=Conversation.Source.API)
    _, answer = exchange(conversation, question, answer="The moon's pull, mostly.")
    return conversation, answer


def _remove(conversation: Conversation, *, keep_tombstone: bool) -> None:
    conversation_remove(
        conversation=Conversation.objects.get(pk=conversation.pk), keep_tombstone=keep_tombstone
    )


def _elsewhere(work: Callable[[], None]) -> None:
    """Run `work` on another thread: its own database connection, committed when it returns."""

    def run() -> None:
        try:
            work()
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()


def _removed_while_embedding(
    monkeypatch: pytest.MonkeyPatch, remove: Callable[[], None]
) -> list[int]:
    """Make the index's embedding step (between its read and its write) run `remove` after
    computing the vectors; returns a list that counts the embeddings asked for."""
    real_embed = embeddings.embed
    calls: list[int] = []

    def embed_then_remove(texts: Sequence[str]) -> np.ndarray:
        vectors = real_embed(texts)
        if not calls:
            remove()
        calls.append(len(texts))
        return vectors

    monkeypatch.setattr(embeddings, "embed", embed_then_remove)
    return calls


@pytest.mark.django_db
@REMOVALS
def test_a_message_of_a_conversation_removed_before_the_task_is_not_indexed(
    user: Any, caplog: pytest.LogCaptureFixture, keep_tombstone: bool
) -> None:
    conversation, answer = _chat(user)
    _remove(conversation, keep_tombstone=keep_tombstone)

    assert run_task_quietly(search_index_message, str(answer.pk), caplog=caplog) is False
    assert not MessageEmbedding.objects.exists()


@pytest.mark.django_db(transaction=True)
@REMOVALS
def test_a_conversation_removed_by_another_connection_between_read_and_write_gets_no_index_row(
    user: Any,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    keep_tombstone: bool,
) -> None:
    """As in production: the task in autocommit, the removal committed by another session
    after the task read the message and before it inserted its row (a foreign-key violation
    at the insert's commit, before)."""
    conversation, answer = _chat(user)
    _removed_while_embedding(
        monkeypatch,
        lambda: _elsewhere(lambda: _remove(conversation, keep_tombstone=keep_tombstone)),
    )

    assert run_task_quietly(search_index_message, str(answer.pk), caplog=caplog) is False
    assert not MessageEmbedding.objects.exists()
    assert logged(caplog, "chatsite.vanishing") == [
        "search index of 1 messages: gone before it was written, nothing written"
    ]


@pytest.mark.django_db
@REMOVALS
def test_a_conversation_removed_between_read_and_write_inside_a_transaction_gets_no_index_row(
    user: Any,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    keep_tombstone: bool,
) -> None:
    """Inside an outer transaction (here the test's) the insert's foreign keys are checked at
    the statement: a row pointing at the removed messages is never left for the commit."""
    conversation, answer = _chat(user)
    _removed_while_embedding(
        monkeypatch, lambda: _remove(conversation, keep_tombstone=keep_tombstone)
    )

    assert run_task_quietly(search_index_message, str(answer.pk), caplog=caplog) is False
    assert not MessageEmbedding.objects.exists()
    assert logged(caplog, "chatsite.vanishing") == [
        "search index of 1 messages: gone before it was written, nothing written"
    ]


@pytest.mark.django_db(transaction=True)
def test_query_time_indexing_indexes_the_rest_when_one_conversation_goes_meanwhile(
    user: Any, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    gone, gone_answer = _chat(user, "Why is the sea salty?")
    kept, kept_answer = _chat(user, "What makes waves?")
    _removed_while_embedding(
        monkeypatch, lambda: _elsewhere(lambda: _remove(gone, keep_tombstone=False))
    )

    assert search_index.search_index_pending(user_id=user.pk) == 2
    indexed = set(MessageEmbedding.objects.values_list("message_id", flat=True))
    assert indexed == set(
        Message.objects.filter(conversation=kept)
        .exclude(role=Message.Role.SYSTEM)
        .values_list("pk", flat=True)
    )
    assert kept_answer.pk in indexed and gone_answer.pk not in indexed
    assert not Conversation.objects.filter(pk=gone.pk).exists()
