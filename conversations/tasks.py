"""Celery tasks of conversations: titles, rolling summaries and history retention.

Every task is idempotent (a repeat finds its work done and returns), so `acks_late` is safe:
a worker that dies mid-task leaves the message to another. Faults of a worker, the database
or Redis are retried with exponential backoff and jitter; time limits bound a hung call.
"""

from __future__ import annotations

from typing import Any

import httpx
from celery import shared_task
from django.db import InterfaceError, OperationalError
from redis.exceptions import RedisError

from inference.client import WorkerFault

from . import retention, summaries, titles

RETRYABLE = (WorkerFault, httpx.HTTPError, OperationalError, InterfaceError, RedisError)
_RETRY: dict[str, Any] = {
    "autoretry_for": RETRYABLE,
    "retry_backoff": 2,
    "retry_backoff_max": 120,
    "retry_jitter": True,
    "max_retries": 5,
    "acks_late": True,
    "ignore_result": True,
}


@shared_task(soft_time_limit=90, time_limit=120, **_RETRY)
def generate_title(conversation_id: str) -> str | None:
    """Name an untitled conversation after its first exchange (never over a user's title)."""
    return titles.title_generate(conversation_id=conversation_id)


@shared_task(soft_time_limit=240, time_limit=300, **_RETRY)
def summarise_branch(conversation_id: str, leaf_message_id: str, budget_tokens: int) -> str | None:
    """Fold the older turns of the branch ending at `leaf_message_id` into its summary."""
    summary = summaries.branch_summarise(
        conversation_id=conversation_id,
        leaf_message_id=leaf_message_id,
        budget_tokens=budget_tokens,
    )
    summaries.summary_release(conversation_id=conversation_id)
    return str(summary.pk) if summary is not None else None


@shared_task(soft_time_limit=1500, time_limit=1800, **_RETRY)
def purge_expired_conversations() -> int:
    """Delete conversations past their owner's plan history retention (hourly, in beat)."""
    return retention.conversations_purge_expired()
