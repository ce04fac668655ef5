"""Reads of the inference plane that views share."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import User
from django.db.models import QuerySet

from chatsite.errors import NotFound
from chatsite.redis import sync_redis

from . import queue
from .models import Generation


def generation_for_user(*, user: User, generation_id: Any) -> Generation:
    """The generation if `user` started it; NotFound otherwise, as for one that never existed."""
    return _owned(Generation.objects.select_related("pool", "message"), user, generation_id)


def generation_to_stream(*, user: User, generation_id: Any) -> Generation:
    """`generation_for_user` for its stream, which needs only the columns a cancel reads (its
    status, tier and pool's name): a lighter statement on every stream opened."""
    rows = Generation.objects.select_related("pool").only(
        "id", "status", "tier", "pool__id", "pool__name"
    )
    return _owned(rows, user, generation_id)


def _owned(rows: QuerySet[Generation], user: User, generation_id: Any) -> Generation:
    generation = rows.filter(pk=generation_id, user=user).first()
    if generation is None:
        raise NotFound("Generation not found.")
    return generation


def generation_ids_for_messages(*, message_ids: list[Any]) -> dict[Any, Any]:
    """Assistant message id -> id of its generation, in one query."""
    rows = Generation.objects.filter(message_id__in=message_ids).values_list("message_id", "id")
    return dict(rows)


def worker_live_load(*, worker_id: int) -> dict[str, float]:
    """The worker's last load reading and in-flight count, as the schedulers see them."""
    redis = sync_redis()
    reading = redis.hgetall(queue.metrics_key(worker_id))
    load = {str(name): float(value) for name, value in reading.items()}
    load["in_flight"] = float(redis.zcount(queue.lease_key(worker_id), queue.now_ms(), "+inf"))
    return load
