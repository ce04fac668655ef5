"""Celery tasks of the OpenAI-compatible API (listed in `CELERY_IMPORTS`)."""

from __future__ import annotations

from celery import shared_task

from conversations.unkept import unkept_sweep


@shared_task(ignore_result=True, soft_time_limit=50, time_limit=60)
def sweep_unkept_conversations() -> int:
    """Remove conversations of keys that do not keep them, left behind by a lost request."""
    return unkept_sweep()
