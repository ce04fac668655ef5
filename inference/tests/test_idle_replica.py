"""An idle scheduler replica costs little: it reads its workers' load, does its chores and
looks at the queues at the idle pace until work is announced, and reads only the few lines it
needs of a worker's /metrics. A busy one with nothing waiting for room asks its workers
whether they are up at the busy pace, and reads their /metrics at the idle pace."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from prometheus_client.parser import text_string_to_metric_families

from accounts.tests.factories import UserFactory
from chatsite.redis import sync_redis
from inference import queue
from inference.client import _METRICS, WorkerLoad, parse_metrics
from inference.scheduler import Scheduler
from inference.scheduler.capacity import WorkerView

from .fake_worker import FakeWorker
from .fixtures import register_pool, running_schedulers, send, wait_for

# As vLLM writes it: counters as `_total` and `_created` samples, a family whose name begins
# with another's (`..._waiting_by_reason`), two engines to sum over, the cache's configuration
# in an info metric's labels (one of them with an escaped quote), histograms around them.
VLLM_METRICS = """vllm:num_requests_running{engine="0",model_name="m"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 3.0
vllm:num_requests_waiting{engine="1",model_name="m"} 1.0
# HELP vllm:num_requests_waiting_by_reason Waiting requests by reason.
# TYPE vllm:num_requests_waiting_by_reason gauge
vllm:num_requests_waiting_by_reason{engine="0",model_name="m",reason="capacity"} 9.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 650.0
vllm:prefix_cache_queries_created{engine="0",model_name="m"} 1.7965678328456347e+09
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 120.0
vllm:prefix_cache_hits_created{engine="0",model_name="m"} 1.7965678328456483e+09
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{engine="0",le="0.3",model_name="m"} 4.0
vllm:e2e_request_latency_seconds_count{engine="0",model_name="m"} 4.0
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",engine="0",note="say \\"hi\\"",num_gpu_blocks="364"} 1.0"""


@asynccontextmanager
async def one_answer_held(fake_workers: Any) -> AsyncIterator[tuple[FakeWorker, Scheduler, Any]]:
    """A replica serving one answer (`The first question`) whose worker holds its first
    token back until the end: the worker, the replica and the user who asked."""
    first_token = threading.Event()
    worker = fake_workers(first_token_gate=first_token)
    await asyncio.to_thread(register_pool, worker)
    user = await sync_to_async(UserFactory.create)()
    async with running_schedulers() as [replica]:
        try:
            await send(user, "The first question")
            yield worker, replica, user
        finally:
            first_token.set()


def test_the_load_read_from_vllms_metrics_is_what_prometheus_own_parser_reads() -> None:
    load = parse_metrics(VLLM_METRICS)
    reference = {
        family.name: sum(
            sample.value for sample in family.samples if not sample.name.endswith("_created")
        )
        for family in text_string_to_metric_families(VLLM_METRICS + "\n")
        if family.name in _METRICS
    }
    reference["vllm:kv_cache_usage_perc"] *= 100  # a fraction, read as a percentage
    assert load.raw == reference
    assert (load.running, load.waiting, load.kv_cache_percent) == (2.0, 4.0, 25.0)
    assert (load.prefix_cache_queries, load.prefix_cache_hits) == (650.0, 120.0)
    assert (load.block_size, load.num_gpu_blocks, load.kv_capacity_tokens) == (16, 364, 5824)


def test_a_worker_that_says_nothing_of_its_load_reads_as_idle() -> None:
    load = parse_metrics("# TYPE other gauge\nother 1.0\nvllm:num_requests_running_x 5\n")
    assert (load.running, load.waiting, load.block_size, load.raw) == (0.0, 0.0, 0, {})


@pytest.mark.django_db(transaction=True)
async def test_an_idle_replica_reads_its_workers_at_the_idle_pace_until_work_is_announced(
    fake_workers: Any, settings: Any
) -> None:
    # The busy pace is the fixture's 0.2 s; idle, a reading a minute.
    settings.SCHEDULER_IDLE_HEALTH_INTERVAL_MS = 60_000
    worker = fake_workers()
    await asyncio.to_thread(register_pool, worker)
    async with running_schedulers() as [replica]:

        async def read_at_start() -> bool:
            # The replica's reading at start, and its health loop's first.
            return worker.metrics_reads >= 2 and replica.capacity.workers != {}

        await wait_for(read_at_start, what="the readings at start")
        reads = worker.metrics_reads
        # Five busy intervals and more: no reading, whatever the machine's pace (the next
        # is a minute away).
        await asyncio.sleep(1.0)
        assert worker.metrics_reads == reads

        await asyncio.to_thread(sync_redis().publish, queue.wake_channel(), "work")

        async def read_again() -> bool:
            return worker.metrics_reads > reads

        await wait_for(read_again, what="a reading once work is announced")


@pytest.mark.django_db(transaction=True)
async def test_an_idle_replicas_chores_and_dispatcher_wait_for_announced_work(
    fake_workers: Any,
    settings: Any,
    housekeeping_passes: list[int],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Busy, a replica does its chores and looks at the queues every second; idle, once per
    # idle interval (a minute here), or at once when work is announced.
    settings.SCHEDULER_IDLE_HEALTH_INTERVAL_MS = 60_000
    looks: list[int] = []
    real_dispatch = Scheduler.dispatch_once

    async def dispatch_noted(self: Scheduler) -> bool:
        looks.append(queue.now_ms())
        return await real_dispatch(self)

    monkeypatch.setattr(Scheduler, "dispatch_once", dispatch_noted)
    worker = fake_workers()
    await asyncio.to_thread(register_pool, worker)
    async with running_schedulers() as [replica]:

        async def first_passes() -> bool:
            return bool(housekeeping_passes) and bool(looks)

        await wait_for(first_passes, what="the chores and the dispatcher's first passes")
        passes, looked = len(housekeeping_passes), len(looks)
        # Past the busy pace (one second) and more: nothing, whatever the machine's pace.
        await asyncio.sleep(1.5)
        assert (len(housekeeping_passes), len(looks)) == (passes, looked)
        assert not replica.running

        await asyncio.to_thread(sync_redis().publish, queue.wake_channel(), "work")

        async def both_again() -> bool:
            return len(housekeeping_passes) > passes and len(looks) > looked

        await wait_for(
            both_again, what="the chores and a look at the queues once work is announced"
        )


@pytest.mark.django_db(transaction=True)
async def test_a_replica_whose_queues_are_empty_looks_again_when_work_comes_not_every_second(
    fake_workers: Any, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Serving an answer, with nothing else queued: the dispatcher's next look is the next
    # enqueue's (a minute's poll here), not a poll a second.
    settings.SCHEDULER_IDLE_HEALTH_INTERVAL_MS = 60_000
    looks: list[bool] = []
    real_dispatch = Scheduler.dispatch_once

    async def dispatch_noted(self: Scheduler) -> bool:
        dispatched = await real_dispatch(self)
        looks.append(dispatched)
        return dispatched

    monkeypatch.setattr(Scheduler, "dispatch_once", dispatch_noted)
    async with one_answer_held(fake_workers) as (worker, replica, user):

        async def serving_with_empty_queues() -> bool:
            # Its admission, then a look that found nothing.
            return bool(replica.running) and looks[-1:] == [False] and True in looks

        await wait_for(serving_with_empty_queues, what="the first answer admitted")
        looked = len(looks)
        # Past the busy poll (one second) and more: no look, whatever the machine's pace.
        await asyncio.sleep(1.5)
        assert len(looks) == looked

        await send(user, "The second question")

        async def both_on_the_worker() -> bool:
            return len(worker.requests) == 2

        await wait_for(both_on_the_worker, what="the second answer admitted at once")


@pytest.mark.django_db(transaction=True)
async def test_a_busy_replica_with_nothing_waiting_asks_only_whether_its_workers_are_up(
    fake_workers: Any, settings: Any
) -> None:
    # The busy pace is the fixture's 0.2 s; the idle pace (whole readings) a minute.
    settings.SCHEDULER_IDLE_HEALTH_INTERVAL_MS = 60_000
    async with one_answer_held(fake_workers) as (worker, replica, _):

        async def serving() -> bool:
            return bool(replica.running) and not replica._may_wait

        await wait_for(serving, what="the answer admitted, nothing waiting for room")
        health, metrics = worker.health_reads, worker.metrics_reads

        async def asked_thrice() -> bool:
            return worker.health_reads >= health + 3

        await wait_for(asked_thrice, what="three passes at the busy pace")
        # Up or not at the busy pace; the counts vLLM keeps, not once.
        assert worker.metrics_reads == metrics


async def test_a_health_pass_reads_the_workers_load_when_it_changes_placements() -> None:
    replica = Scheduler(replica_id="load-reads")
    try:
        up = WorkerView(1, "w", "p", "http://w", "m", "healthy", 8)
        up.load = WorkerLoad()
        fresh = asyncio.get_running_loop().time()
        replica._load_read_at, replica._load_due, replica._may_wait = fresh, False, False
        # Busy, nothing waiting, a reading of the last idle interval: only /health.
        assert not replica._reads_load({1: up})
        # Work waits for room: its placement reads vLLM's counts at the busy pace.
        replica._may_wait = True
        assert replica._reads_load({1: up})
        replica._may_wait = False
        # The first pass after an idle spell.
        replica._load_due = True
        assert replica._reads_load({1: up})
        replica._load_due = False
        # A reading as old as the idle interval.
        replica._load_read_at = fresh - replica.idle_health_interval
        assert replica._reads_load({1: up})
        replica._load_read_at = fresh
        # A worker with none yet (new, or back up): its cache's size is read.
        new = WorkerView(2, "v", "p", "http://v", "m", "healthy", 8)
        assert replica._reads_load({1: up, 2: new})
    finally:
        await replica.redis.aclose()
        await replica.client.aclose()
