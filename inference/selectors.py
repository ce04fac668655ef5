"""Reads of the inference plane that views share."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.contrib.auth.models import User
from django.db.models import Count, QuerySet
from django.db.models.functions import Coalesce
from django.utils import timezone

from chatsite.errors import NotFound
from chatsite.redis import sync_redis

from . import queue
from .models import Generation, ModelPool, Worker


def generation_in_flight(*, generation_id: Any) -> bool:
    """Whether the generation's job is still queued or running (not yet finishing)."""
    finishing = sync_redis().hmget(queue.job_key(generation_id), ["generation_id", "finishing"])
    return finishing[0] is not None and finishing[1] is None


def generation_stream_kept(*, generation_id: Any) -> bool:
    """Whether the generation's stream is still there to read (it expires after the end)."""
    return bool(sync_redis().exists(queue.stream_key(generation_id)))


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


def pools_without_healthy_worker() -> str | None:
    """None if every active pool has a healthy worker; else which have none (readiness)."""
    missing = list(
        ModelPool.objects.filter(is_active=True)
        .exclude(workers__state=Worker.State.HEALTHY)
        .values_list("name", flat=True)
    )
    return f"no healthy worker in {', '.join(missing)}" if missing else None


@dataclass
class TierFigures:
    """One pool and tier on the capacity page: now, and over its last minutes (times in ms)."""

    pool: str
    tier: str
    queued: int = 0
    running: int = 0
    answered: int = 0
    rejected: int = 0
    ttft_p50_ms: float | None = None
    ttft_p95_ms: float | None = None
    queue_p50_ms: float | None = None
    queue_p95_ms: float | None = None
    tokens_per_second: float | None = None


@dataclass
class WorkerFigures:
    """One worker on the capacity page, as the schedulers last measured it."""

    name: str
    pool: str
    state: str
    in_flight: int
    max_concurrency: int
    running: float | None
    waiting: float | None
    kv_cache_percent: float | None
    prefix_hit_ratio: float | None


@dataclass
class Capacity:
    minutes: int
    tiers: list[TierFigures] = field(default_factory=list)
    workers: list[WorkerFigures] = field(default_factory=list)


def capacity_report(*, minutes: int) -> Capacity:
    """The capacity page's figures, read where the metrics read them: the queues, leases and
    workers' readings in Redis now, and the generations' rows of the last `minutes`. TTFT and
    queue time count from the answer's enqueueing; tokens/s is each complete answer's output
    over the time from its first token to its end (the median)."""
    since = timezone.now() - timedelta(minutes=minutes)
    pools = list(ModelPool.objects.filter(is_active=True).values_list("name", flat=True))
    tiers = queue.tiers_best_first()
    figures = {(pool, tier): TierFigures(pool, tier) for pool in pools for tier in tiers}
    rows = Generation.objects.annotate(answering=Coalesce("served_pool__name", "pool__name"))
    for pool, tier, running in (
        rows.filter(status=Generation.Status.RUNNING)
        .values_list("answering", "tier")
        .annotate(count=Count("id"))
    ):
        figures.setdefault((pool, tier), TierFigures(pool, tier)).running = running
    samples: dict[tuple[str, str], dict[str, list[float]]] = {}
    for pool, tier, status, enqueued, admitted, first, finished, output in rows.filter(
        finished_at__gte=since
    ).values_list(
        "answering",
        "tier",
        "status",
        "enqueued_at",
        "admitted_at",
        "first_token_at",
        "finished_at",
        "output_tokens",
    )[:CAPACITY_ROWS]:
        row = figures.setdefault((pool, tier), TierFigures(pool, tier))
        kept = samples.setdefault((pool, tier), {"ttft": [], "queue": [], "speed": []})
        if status == Generation.Status.REJECTED:
            row.rejected += 1
        if status == Generation.Status.COMPLETE:
            row.answered += 1
        if first is not None:
            kept["ttft"].append((first - enqueued).total_seconds() * 1000)
        if admitted is not None:
            kept["queue"].append(max(0.0, (admitted - enqueued).total_seconds() * 1000))
        seconds = (finished - first).total_seconds() if first and finished else 0.0
        if status == Generation.Status.COMPLETE and output and seconds > 0:
            kept["speed"].append(output / seconds)
    for key, kept in samples.items():
        row = figures[key]
        row.ttft_p50_ms = percentile(kept["ttft"], 50)
        row.ttft_p95_ms = percentile(kept["ttft"], 95)
        row.queue_p50_ms = percentile(kept["queue"], 50)
        row.queue_p95_ms = percentile(kept["queue"], 95)
        row.tokens_per_second = percentile(kept["speed"], 50)
    redis = sync_redis()
    rank = {tier: index for index, tier in enumerate(tiers)}
    ordered = sorted(figures.values(), key=lambda f: (f.pool, rank.get(f.tier, len(tiers))))
    workers = list(Worker.objects.filter(pool__is_active=True).select_related("pool"))
    with redis.pipeline(transaction=False) as pipe:
        for row in ordered:
            pipe.zcard(queue.queue_key(row.pool, row.tier))
        now = queue.now_ms()
        for worker in workers:
            pipe.zcount(queue.lease_key(worker.pk), now, "+inf")
            pipe.hgetall(queue.metrics_key(worker.pk))
        measured = pipe.execute()
    for row, queued in zip(ordered, measured[: len(ordered)], strict=True):
        row.queued = int(queued)
    readings = measured[len(ordered) :]
    report = Capacity(minutes=minutes, tiers=ordered)
    for worker, in_flight, reading in zip(workers, readings[0::2], readings[1::2], strict=True):
        load = {str(name): float(value) for name, value in reading.items()}
        report.workers.append(
            WorkerFigures(
                name=worker.name,
                pool=worker.pool.name,
                state=worker.state,
                in_flight=int(in_flight),
                max_concurrency=worker.max_concurrency,
                running=load.get("running"),
                waiting=load.get("waiting"),
                kv_cache_percent=load.get("kv_cache_percent"),
                prefix_hit_ratio=prefix_hit_ratio(load),
            )
        )
    return report


# The most finished rows one capacity page reads (a busy site's last minutes).
CAPACITY_ROWS = 20_000


def prefix_hit_ratio(reading: dict[str, float]) -> float | None:
    """The share of prompt tokens a worker found in its prefix cache since it started, from
    its reading (`metrics:<worker>`); None before it has served any."""
    queries = reading.get("prefix_cache_queries") or 0.0
    return (reading.get("prefix_cache_hits") or 0.0) / queries if queries > 0 else None


def percentile(values: list[float], share: float) -> float | None:
    """The nearest-rank `share` percentile of `values`; None for none."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(share / 100 * len(ordered)) - 1)]
