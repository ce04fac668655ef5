"""Celery tasks of conversations: titles, rolling summaries, memory suggestions, history
retention and the embeddings of large attachments, and the requests that queue them after
commit.

Every task is idempotent (a repeat finds its work done and returns), so `acks_late` is safe:
a worker that dies mid-task leaves the message to another. Faults of a worker, the database
or Redis are retried with exponential backoff and jitter; time limits bound a hung call. A
conversation deleted before or while a task runs is no fault: the task writes nothing and
returns (`chatsite.vanishing`), and is not retried.
"""

from __future__ import annotations

from typing import Any

from celery import shared_task
from django.conf import settings
from django.db import transaction

from chatsite.redis import sync_redis

from . import memory, retention, summaries, titles
from .context import AssembledContext
from .models import Conversation, Message
from .task_retry import RETRY_POLICY


@shared_task(soft_time_limit=90, time_limit=120, **RETRY_POLICY)
def generate_title(conversation_id: str) -> str | None:
    """Name an untitled conversation after its first exchange (never over a user's title)."""
    title = titles.title_generate(conversation_id=conversation_id)
    _release(titles.title_pending_key(conversation_id))
    return title


@shared_task(soft_time_limit=240, time_limit=300, **RETRY_POLICY)
def summarise_branch(conversation_id: str, leaf_message_id: str, budget_tokens: int) -> str | None:
    """Fold the older turns of the branch ending at `leaf_message_id` into its summary."""
    summary = summaries.branch_summarise(
        conversation_id=conversation_id,
        leaf_message_id=leaf_message_id,
        budget_tokens=budget_tokens,
    )
    summaries.summary_release(conversation_id=conversation_id)
    return str(summary.pk) if summary is not None else None


@shared_task(soft_time_limit=90, time_limit=120, **RETRY_POLICY)
def suggest_memory(answer_id: str) -> int:
    """Suggest facts about the user from the question `answer_id` answered (stored as
    suggestions for the user to confirm, never used before); returns how many are new."""
    return len(memory.memory_suggest(answer_id=answer_id))


@shared_task(soft_time_limit=1500, time_limit=1800, **RETRY_POLICY)
def purge_expired_conversations() -> int:
    """Delete conversations past their owner's plan history retention (hourly, in beat)."""
    return retention.conversations_purge_expired()


def title_request_after_answer(*, conversation: Conversation, status: str) -> None:
    """Ask for a title after commit if an answer just completed in an untitled conversation.

    Called in the transaction that finishes the answer, with the conversation as read by the
    finish's own statement: nothing more is read here. (A title written since that read is
    seen by the task, which titles only a conversation still untitled.)
    """
    if status != Message.Status.COMPLETE:
        return
    if conversation.title or conversation.title_set_by_user or conversation.deleted_at:
        return
    conversation_id = str(conversation.pk)

    def _enqueue() -> None:
        # One title task at a time: the next answer often finishes before the first title
        # is written, and would ask the model again.
        if _claim(titles.title_pending_key(conversation_id), "1", titles.PENDING_SECONDS):
            generate_title.delay(conversation_id)

    # Robust: a Redis or broker outage must not fail the answer that just finished.
    transaction.on_commit(_enqueue, robust=True)


def memory_request_after_answer(*, conversation: Conversation, answer_id: Any, status: str) -> None:
    """Ask for memory suggestions after commit when an answer completed in a web chat
    conversation (not `/v1`: its prompts are the client's, conversations/memory.py). The
    owner's own switch is read by the task, off the answer's path."""
    if not settings.MEMORY_SUGGESTIONS or status != Message.Status.COMPLETE:
        return
    if conversation.source != Conversation.Source.WEB or conversation.deleted_at:
        return
    answer = str(answer_id)
    transaction.on_commit(lambda: suggest_memory.delay(answer), robust=True)


def summary_request_if_needed(
    *, conversation: Conversation, leaf: Message, context: AssembledContext, budget_tokens: int
) -> bool:
    """Queue a summary of the branch ending at `leaf` after commit if `context` dropped turns.

    Returns whether one was asked for (it is skipped after commit while another is pending).
    """
    if context.dropped_messages == 0:
        return False
    conversation_id, leaf_id = str(conversation.pk), str(leaf.pk)

    def _enqueue() -> None:
        if _claim(
            summaries.summary_pending_key(conversation_id), leaf_id, summaries.PENDING_SECONDS
        ):
            summarise_branch.delay(conversation_id, leaf_id, budget_tokens)

    transaction.on_commit(_enqueue, robust=True)  # the turn stands even if Redis does not
    return True


def _claim(key: str, value: str, seconds: int) -> bool:
    """Mark a task pending under `key` unless one is already; True if this call did."""
    return bool(sync_redis().set(key, value, nx=True, ex=seconds))


def _release(key: str) -> None:
    """Let the next request queue the task again."""
    sync_redis().delete(key)
