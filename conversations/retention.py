"""Retention: history that expires.

A plan's `history_retention_days` deletes conversations idle longer than that, hourly
(`conversations.tasks.purge_expired_conversations`), the same way a user's delete does.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from billing.models import Plan

from .models import Conversation
from .removal import conversation_remove


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
    now = now or timezone.now()
    batch = batch or settings.RETENTION_PURGE_BATCH
    purged = 0
    for plan in Plan.objects.filter(history_retention_days__isnull=False):
        for conversation in conversations_expired(plan=plan, now=now)[:batch]:
            conversation_remove(conversation=conversation)
            purged += 1
    return purged
