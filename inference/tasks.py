"""Celery tasks of the inference plane."""

from __future__ import annotations

from celery import shared_task

from . import services


@shared_task(ignore_result=True, soft_time_limit=120, time_limit=150)
def sweep_stale_generations() -> int:
    """Fail generations no live scheduler serves: the backstop when every replica is gone."""
    return services.generation_sweep_stale(live_replicas=services.live_scheduler_replicas())
