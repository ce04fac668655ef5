"""Retention: what a deleted conversation leaves behind (nothing), and history that expires.

Deleting a conversation (`conversations.turns.conversation_remove`) deletes its messages and
with them, by cascade, their generations, summaries and whatever indexes them (search); the
row stays as a content-free tombstone. Its Redis keys go after commit here: the generations'
event streams and jobs, the worker affinity, a pending summary claim. Usage stays only in
billing's ledger (`UsageEvent` keeps the generation id, not a foreign key) and statements.

A plan's `history_retention_days` deletes conversations idle longer than that, hourly
(`conversations.tasks.purge_expired_conversations`), the same way a user's delete does.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from billing.models import Plan
from inference import queue

from .events import user_event_publish
from .models import Conversation
from .summaries import summary_pending_key

# How long the closing `done` of an answer cut short by a deletion stays for its watchers.
ABANDONED_STREAM_SECONDS = 60


def conversation_forget_redis(
    *,
    conversation_id: Any,
    owner_id: Any,
    generation_ids: Iterable[Any],
    in_flight_ids: Collection[Any] = (),
) -> None:
    """Delete a deleted conversation's keys and tell its owner's open pages.

    Every generation's stream and job go, with their text. An answer still in flight was
    cancelled just before (`generations_abandon`, while its job could still carry the cancel
    flag); its stream is left holding only a `done` event for the tabs still watching, and
    expires within a minute. A scheduler finishing it later finds the rows gone and deletes
    whatever it wrote meanwhile.
    """
    keys = [queue.affinity_key(conversation_id), summary_pending_key(conversation_id)]
    for generation_id in generation_ids:
        keys += [queue.stream_key(generation_id), queue.job_key(generation_id)]
        if generation_id not in in_flight_ids:
            # A watcher of one in flight still counts itself out of this key (it expires).
            keys.append(queue.key("watchers", generation_id))
    redis = queue.sync_redis()
    try:
        redis.delete(*keys)
        for generation_id in in_flight_ids:
            gid = str(generation_id)
            done = {"status": "cancelled", "finish_reason": "conversation_deleted"}
            queue.append_event(redis, gid, "done", done)
            redis.expire(queue.stream_key(gid), ABANDONED_STREAM_SECONDS)
    finally:
        redis.close()
    user_event_publish(
        user_id=owner_id, event="deleted", data={"conversation_id": str(conversation_id)}
    )


def conversations_expired(*, plan: Plan, now: datetime) -> Any:
    """Live conversations of `plan`'s users idle longer than its retention period."""
    if plan.history_retention_days is None:
        return Conversation.objects.none()
    owners = Q(owner__subscription__plan=plan)
    if plan.is_default:
        owners |= Q(owner__subscription__isnull=True)
    cutoff = now - timedelta(days=plan.history_retention_days)
    return Conversation.objects.filter(
        owners, deleted_at__isnull=True, last_activity_at__lt=cutoff
    ).order_by("last_activity_at")


def conversations_purge_expired(*, now: datetime | None = None, batch: int | None = None) -> int:
    """Delete every conversation past its owner's plan retention; returns how many.

    At most `batch` per plan per run (default `settings.RETENTION_PURGE_BATCH`); the rest go
    at the next run. Safe to run twice at once: deleting a tombstone does nothing.
    """
    from .turns import conversation_remove  # turns imports inference, which imports us

    now = now or timezone.now()
    batch = batch or settings.RETENTION_PURGE_BATCH
    purged = 0
    for plan in Plan.objects.filter(history_retention_days__isnull=False):
        for conversation in conversations_expired(plan=plan, now=now)[:batch]:
            conversation_remove(conversation=conversation)
            purged += 1
    return purged
