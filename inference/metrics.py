"""The inference plane's Prometheus metrics: the SLOs per tier and pool, and what decided them.

Counted where each thing happens, in one line (`chatsite.metrics` says how a process exposes
them): the scheduler observes queue time at an answer's first admission, TTFT at its first
token and each complete answer's tokens/s; admissions, the queue time limit's rejections and
the overload policy's degradations where they are decided; every final state in
`services.generation_finish`, whichever process writes it (the scheduler, or the edge for a
Stop). `pool` is the pool whose workers answer (the fallback, once an answer went there).

The workers' prefix-cache hit ratio is read at scrape time from what the scheduler last
measured (`FleetCollector`), as the capacity page reads it (`selectors.prefix_hit_ratio`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

from django.utils import timezone
from prometheus_client import Counter, Histogram
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from . import queue
from .client import WorkerLoad
from .models import Generation
from .selectors import prefix_hit_ratio
from .unkept import UnkeptGeneration

# First tokens from 50 ms (a cached prompt on an idle worker) to a minute (a long queue, or
# a long prompt on a CPU worker); queue times from nothing to past the queue limit.
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 3, 5, 7.5, 10, 15, 20, 30, 45, 60)
QUEUE_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0)
# One stream's decoding speed: a CPU worker's few tokens/s to a GPU's hundreds.
SPEED_BUCKETS = (1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 50.0, 75.0, 100.0, 150.0, 200.0, 300.0, 500.0)

TTFT = Histogram(
    "chatsite_ttft_seconds",
    "Time from an answer's enqueueing to its first token (its first attempt's).",
    ["tier", "pool"],
    buckets=LATENCY_BUCKETS,
)
QUEUE_TIME = Histogram(
    "chatsite_queue_seconds",
    "Time an answer waited in its queue before its first admission to a worker.",
    ["tier", "pool"],
    buckets=QUEUE_BUCKETS,
)
STREAM_SPEED = Histogram(
    "chatsite_stream_tokens_per_second",
    "Each complete answer's output tokens over the time from its first token to its end.",
    ["tier", "pool"],
    buckets=SPEED_BUCKETS,
)
ADMISSIONS = Counter(
    "chatsite_admissions",
    "Answers admitted to a worker: new, retried elsewhere after a fault, or adopted from a "
    "replica that died.",
    ["pool", "tier", "reason"],
)
REJECTIONS = Counter(
    "chatsite_rejections",
    "Answers refused: queue_timeout (waited past SCHEDULER_MAX_QUEUE_SECONDS), high_demand "
    "(a new conversation refused under pressure).",
    ["pool", "tier", "reason"],
)
DEGRADATIONS = Counter(
    "chatsite_degradations",
    "Answers served other than asked: by the fallback pool (high_demand), by the auto "
    "model's choice (auto_*), or without the plugins' tools (tools_unsupported).",
    ["pool", "tier", "reason"],
)
GENERATIONS = Counter(
    "chatsite_generations",
    "Answers by final status (complete, cancelled, failed, rejected).",
    ["pool", "tier", "status"],
)

# Admission reasons.
NEW = "new"
RETRY = "retry"
ADOPTED = "adopted"
# A degradation of the scheduler's own: a worker without a tool-call parser answers without
# the plugins' tools.
TOOLS_UNSUPPORTED = "tools_unsupported"


class MeasuredWorker(Protocol):
    """What the collector reads of a replica's view of a worker (`scheduler.capacity`)."""

    name: str
    pool: str
    state: str
    load: WorkerLoad | None


class FleetCollector(Collector):
    """A scheduler replica's view of its workers at scrape time: each one's prefix-cache hit
    ratio and the workers per pool and state (`workers` returns the replica's views)."""

    def __init__(self, workers: Callable[[], Mapping[int, MeasuredWorker]]) -> None:
        self.workers = workers

    def collect(self) -> Iterator[Metric]:
        ratio = GaugeMetricFamily(
            "chatsite_prefix_cache_hit_ratio",
            "The share of prompt tokens a worker found in its prefix cache since it started.",
            labels=["worker", "pool"],
        )
        states = GaugeMetricFamily(
            "chatsite_workers", "Workers by pool and state.", labels=["pool", "state"]
        )
        counted: dict[tuple[str, str], int] = {}
        for view in self.workers().values():
            counted[(view.pool, view.state)] = counted.get((view.pool, view.state), 0) + 1
            if view.load is None:
                continue
            hit = prefix_hit_ratio(
                {
                    "prefix_cache_queries": view.load.prefix_cache_queries,
                    "prefix_cache_hits": view.load.prefix_cache_hits,
                }
            )
            if hit is not None:
                ratio.add_metric([view.name, view.pool], hit)
        for (pool, state), count in sorted(counted.items()):
            states.add_metric([pool, state], count)
        yield ratio
        yield states

    def describe(self) -> Iterator[Metric]:
        yield GaugeMetricFamily("chatsite_prefix_cache_hit_ratio", "", labels=["worker", "pool"])
        yield GaugeMetricFamily("chatsite_workers", "", labels=["pool", "state"])


def admitted(job: queue.Job, *, reason: str) -> None:
    """An answer admitted to a worker; its first admission also ends its time in the queue."""
    ADMISSIONS.labels(job.pool, job.tier, reason).inc()
    if reason == NEW:
        QUEUE_TIME.labels(job.tier, job.pool).observe(_since(job.enqueued_ms))


def degraded(job: queue.Job, reason: str) -> None:
    DEGRADATIONS.labels(job.pool, job.tier, reason).inc()


def first_token(job: queue.Job) -> None:
    """An answer's first token (not one restarted by an adopter, whose wait began earlier)."""
    if not job.attempt:
        TTFT.labels(job.tier, job.pool).observe(_since(job.enqueued_ms))


def answered(job: queue.Job, *, status: str, output_tokens: int | None, since: Any) -> None:
    """A complete answer's decoding speed: `output_tokens` since its first token (`since`)."""
    if status != Generation.Status.COMPLETE or not output_tokens or since is None:
        return
    seconds = (timezone.now() - since).total_seconds()
    if seconds > 0:
        STREAM_SPEED.labels(job.tier, job.pool).observe(output_tokens / seconds)


def finished(*, generation: Generation | UnkeptGeneration, error_code: str) -> None:
    """A final state written; a rejection is counted by its error code too."""
    pool, tier = generation.answering_pool.name, generation.tier
    GENERATIONS.labels(pool, tier, generation.status).inc()
    if generation.status == Generation.Status.REJECTED:
        REJECTIONS.labels(pool, tier, error_code or "rejected").inc()


def _since(enqueued_ms: int) -> float:
    return max(0, queue.now_ms() - enqueued_ms) / 1000
