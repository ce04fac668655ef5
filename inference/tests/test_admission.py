"""Admission: a worker takes a generation while the schedulers' own count of what they sent
leaves room, in leases and in KV-cache tokens; vLLM's queue readings do not hold work back."""

from __future__ import annotations

from typing import Any

import pytest

from chatsite.redis import async_pubsub, async_redis
from chatsite.testing import budget
from inference import queue
from inference.client import WorkerLoad, parse_metrics
from inference.models import Worker
from inference.scheduler.capacity import Capacity, Placement, WorkerView
from inference.scheduler.placement import configured_policy


def view(*, capacity_tokens: int = 0, max_concurrency: int = 256, **load: Any) -> WorkerView:
    return WorkerView(
        id=7,
        name="w",
        pool="p",
        url="http://w",
        served_model="m",
        state=Worker.State.HEALTHY,
        max_concurrency=max_concurrency,
        load=WorkerLoad(block_size=10, num_gpu_blocks=capacity_tokens // 10, **load),
    )


def on(worker: WorkerView) -> Placement:
    """`worker` for a request whose prompt placement could not read."""
    return Placement(worker, None, 0)


@pytest.fixture
async def capacity() -> Any:
    redis = async_redis()
    yield Capacity(redis, configured_policy())
    await redis.aclose()


async def test_leases_hold_at_most_the_kv_cache_tokens(capacity: Capacity, settings: Any) -> None:
    settings.SCHEDULER_KV_OVERCOMMIT = 1.0
    worker = view(capacity_tokens=1000)
    assert await capacity.acquire(on(worker), "a", tokens=600)
    assert await capacity.acquire(on(worker), "b", tokens=400)
    assert not await capacity.acquire(on(worker), "c", tokens=1)
    await capacity.release("a")
    assert await capacity.acquire(on(worker), "c", tokens=600)
    assert not await capacity.acquire(on(worker), "d", tokens=1)


async def test_the_overcommit_scales_the_budget(capacity: Capacity, settings: Any) -> None:
    settings.SCHEDULER_KV_OVERCOMMIT = 2.0
    worker = view(capacity_tokens=1000)
    assert await capacity.acquire(on(worker), "a", tokens=1500)
    assert await capacity.acquire(on(worker), "b", tokens=500)
    assert not await capacity.acquire(on(worker), "c", tokens=1)


async def test_an_idle_worker_takes_one_generation_larger_than_its_cache(
    capacity: Capacity, settings: Any
) -> None:
    settings.SCHEDULER_KV_OVERCOMMIT = 1.0
    worker = view(capacity_tokens=1000)
    assert await capacity.acquire(on(worker), "long", tokens=5000)
    assert not await capacity.acquire(on(worker), "next", tokens=10)


async def test_an_expired_lease_gives_its_tokens_back(capacity: Capacity, settings: Any) -> None:
    settings.SCHEDULER_KV_OVERCOMMIT = 1.0
    worker = view(capacity_tokens=1000)
    assert await capacity.acquire(on(worker), "dead-replicas", tokens=900)
    # Its replica died: nobody renews the lease, which lapses.
    await capacity.redis.zadd(queue.lease_key(worker.id), {"dead-replicas": 1})
    assert await capacity.acquire(on(worker), "b", tokens=900)
    assert await capacity.redis.hkeys(queue.lease_tokens_key(worker.id)) == ["b"]


async def test_max_concurrency_bounds_a_worker_without_a_reported_cache(
    capacity: Capacity,
) -> None:
    worker = view(capacity_tokens=0, max_concurrency=2)
    assert await capacity.acquire(on(worker), "a", tokens=10**9)
    assert await capacity.acquire(on(worker), "b", tokens=10**9)
    assert not await capacity.acquire(on(worker), "c", tokens=1)


async def test_a_busy_queue_inside_vllm_does_not_close_a_worker(capacity: Capacity) -> None:
    # A reading of vLLM's queue is a second old by the time it is used: it is no gate.
    worker = view(capacity_tokens=100_000, waiting=40, running=64, kv_cache_percent=95)
    capacity.workers = {worker.id: worker}
    assert [v.id for v in await capacity.candidates("p")] == [worker.id]


def test_the_kv_cache_size_is_read_from_vllms_cache_config_info() -> None:
    load = parse_metrics(
        "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
        "# TYPE vllm:cache_config_info gauge\n"
        'vllm:cache_config_info{block_size="128",engine="0",num_gpu_blocks="364"} 1.0\n'
        "# TYPE vllm:num_requests_waiting gauge\n"
        'vllm:num_requests_waiting{engine="0",model_name="m"} 3.0\n'
    )
    assert (load.block_size, load.num_gpu_blocks, load.kv_capacity_tokens) == (128, 364, 46592)
    assert load.waiting == 3.0


async def test_a_released_lease_wakes_every_replica(capacity: Capacity) -> None:
    # Another replica's dispatcher may hold work for this worker: it hears of the room at once.
    worker = view(capacity_tokens=1000)
    assert await capacity.acquire(on(worker), "a", tokens=10)
    listener = async_redis()
    pubsub = await async_pubsub(listener)
    await pubsub.subscribe(queue.wake_channel())
    try:
        # The timeouts are failure points: a message returns at once.
        assert await pubsub.get_message(timeout=budget(30)) is not None  # the subscription
        await capacity.release("a")
        message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=budget(30))
    finally:
        await pubsub.aclose()
        await listener.aclose()
    assert message is not None and message["channel"] == queue.wake_channel()
    assert await capacity.redis.zcard(queue.lease_key(worker.id)) == 0


# Each tier fills its share of a worker: free stops short, paid takes the headroom.

SHARES = {"pro": 1.25, "plus": 1.0, "free": 0.75}


async def test_free_answers_leave_a_share_of_the_kv_budget_to_paid_ones(
    capacity: Capacity, settings: Any
) -> None:
    settings.SCHEDULER_KV_OVERCOMMIT = 1.0
    settings.SCHEDULER_TIER_SHARE = SHARES
    worker = view(capacity_tokens=1000)
    for name in ("f1", "f2", "f3"):
        assert await capacity.acquire(on(worker), name, tokens=250, tier="free")
    assert not await capacity.acquire(on(worker), "f4", tokens=1, tier="free")
    # The last quarter is the paid tiers' ...
    assert await capacity.acquire(on(worker), "plus", tokens=250, tier="plus")
    assert not await capacity.acquire(on(worker), "plus2", tokens=1, tier="plus")
    # ... and pro may go past the budget, for vLLM's priority scheduling to serve first.
    assert await capacity.acquire(on(worker), "pro", tokens=250, tier="pro")
    assert not await capacity.acquire(on(worker), "pro2", tokens=1, tier="pro")


async def test_free_answers_leave_a_share_of_the_leases_to_paid_ones(
    capacity: Capacity, settings: Any
) -> None:
    settings.SCHEDULER_TIER_SHARE = SHARES
    worker = view(capacity_tokens=0, max_concurrency=4)
    assert (worker.lease_limit("free"), worker.lease_limit("pro"), worker.lease_limit()) == (
        3,
        5,
        5,
    )
    for name in ("f1", "f2", "f3"):
        assert await capacity.acquire(on(worker), name, tier="free")
    assert not await capacity.acquire(on(worker), "f4", tier="free")
    capacity.workers = {worker.id: worker}
    # Room for paid answers still shows the worker as a candidate, not for free ones.
    [candidate] = await capacity.candidates("p")
    assert not candidate.has_room("free") and candidate.has_room("plus")
    assert await capacity.acquire(on(worker), "plus", tier="plus")
    assert await capacity.acquire(on(worker), "pro", tier="pro")
    assert not await capacity.acquire(on(worker), "pro2", tier="pro")


async def test_an_idle_worker_takes_a_free_answer_whatever_its_size(
    capacity: Capacity, settings: Any
) -> None:
    settings.SCHEDULER_TIER_SHARE = SHARES
    worker = view(capacity_tokens=1000, max_concurrency=1)
    assert worker.lease_limit("free") == 1
    assert await capacity.acquire(on(worker), "alone", tokens=900, tier="free")
