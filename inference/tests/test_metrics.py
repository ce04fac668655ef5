"""The scheduler's operator endpoints (`inference/scheduler/ops.py`) and the metrics it
counts, through real answers served by an in-process replica."""

from __future__ import annotations

import socket
from typing import Any

import httpx
import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from prometheus_client.parser import text_string_to_metric_families

from accounts.tests.factories import UserFactory
from chatsite.testing import budget
from inference.models import Generation

from .fixtures import finished, register_pool, running_schedulers, send_turn, wait_for
from .test_redis_outage import RedisServer, own_redis  # noqa: F401 (a fixture)

pytestmark = pytest.mark.django_db(transaction=True)

# What a replica exports once it has started, before any answer.
SCHEDULER_METRICS = {
    "chatsite_ttft_seconds",
    "chatsite_queue_seconds",
    "chatsite_stream_tokens_per_second",
    "chatsite_admissions",
    "chatsite_rejections",
    "chatsite_degradations",
    "chatsite_generations",
    "chatsite_moderation_trips",
    "chatsite_prefix_cache_hit_ratio",
    "chatsite_workers",
}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


async def _scrape(port: int) -> tuple[set[str], Samples]:
    """The replica's metric families by name, and their samples by name and labels."""
    async with httpx.AsyncClient(timeout=budget(30)) as client:
        response = await client.get(f"http://127.0.0.1:{port}/metrics")
    assert response.status_code == 200
    families = list(text_string_to_metric_families(response.text))
    return {family.name for family in families}, {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in families
        for sample in family.samples
    }


async def test_a_real_answer_moves_the_slo_histograms(fake_workers: Any) -> None:
    fake = fake_workers(tokens=12, token_delay=0.01, prefix_cache=(400, 100))
    pool = await sync_to_async(register_pool)(fake)
    user = await sync_to_async(UserFactory)()
    port = _free_port()
    labels = (("pool", pool.name), ("tier", settings.DEFAULT_TIER))
    async with (
        running_schedulers(metrics_port=port),
        httpx.AsyncClient(timeout=budget(30)) as client,
    ):
        await wait_for(lambda: _ready(client, port))
        exported, before = await _scrape(port)
        turn = await sync_to_async(send_turn)(user)
        gid = turn.generation.id
        await wait_for(lambda: finished(gid))
        _, after = await _scrape(port)

    def moved(name: str, extra: tuple[tuple[str, str], ...] = ()) -> float:
        key = (name, tuple(sorted(labels + extra)))
        return after[key] - before.get(key, 0.0)

    generation = await Generation.objects.aget(pk=gid)
    assert generation.status == Generation.Status.COMPLETE
    assert exported >= SCHEDULER_METRICS
    for histogram in (
        "chatsite_ttft_seconds",
        "chatsite_queue_seconds",
        "chatsite_stream_tokens_per_second",
    ):
        assert moved(f"{histogram}_count") == 1, histogram
        assert moved(f"{histogram}_sum") > 0, histogram
    # The answer's own TTFT, as Postgres has it, falls in the histogram's bucket range.
    assert generation.first_token_at is not None
    ttft = (generation.first_token_at - generation.enqueued_at).total_seconds()
    assert moved("chatsite_ttft_seconds_bucket", (("le", "+Inf"),)) == 1
    assert 0 < ttft < 60
    assert moved("chatsite_admissions_total", (("reason", "new"),)) == 1
    assert moved("chatsite_generations_total", (("status", "complete"),)) == 1
    worker_labels = (("pool", pool.name), ("worker", "fake-0"))
    assert after[("chatsite_prefix_cache_hit_ratio", worker_labels)] == 0.25
    assert after[("chatsite_workers", (("pool", pool.name), ("state", "healthy")))] == 1


async def test_a_rejected_answer_is_counted_by_its_reason(fake_workers: Any, settings: Any) -> None:
    settings.SCHEDULER_MAX_QUEUE_SECONDS = 0
    fake = fake_workers()
    fake.healthy = False  # nobody takes it: it waits past the (zero) queue limit
    pool = await sync_to_async(register_pool)(fake)
    user = await sync_to_async(UserFactory)()
    port = _free_port()
    labels = (("pool", pool.name), ("reason", "queue_timeout"), ("tier", settings.DEFAULT_TIER))
    async with (
        running_schedulers(metrics_port=port),
        httpx.AsyncClient(timeout=budget(30)) as client,
    ):
        await wait_for(lambda: _listening(client, port))
        _, before = await _scrape(port)
        turn = await sync_to_async(send_turn)(user)
        await wait_for(lambda: finished(turn.generation.id))
        _, after = await _scrape(port)

    key = ("chatsite_rejections_total", labels)
    assert after[key] - before.get(key, 0.0) == 1
    status = (("pool", pool.name), ("status", "rejected"), ("tier", settings.DEFAULT_TIER))
    key = ("chatsite_generations_total", status)
    assert after[key] - before.get(key, 0.0) == 1


async def test_scheduler_healthz_and_readyz(fake_workers: Any) -> None:
    await sync_to_async(register_pool)(fake_workers())
    port = _free_port()
    async with (
        running_schedulers(metrics_port=port),
        httpx.AsyncClient(timeout=budget(30)) as client,
    ):
        await wait_for(lambda: _ready(client, port))
        alive = await client.get(f"http://127.0.0.1:{port}/healthz")
        ready = await client.get(f"http://127.0.0.1:{port}/readyz")

    assert alive.status_code == 200
    assert alive.json() == {"status": "ok"}
    assert ready.status_code == 200
    assert ready.json() == {
        "status": "ready",
        "checks": {"redis": "ok", "heartbeat": "ok", "workers": "ok"},
        "failing": [],
    }


async def _ready(client: httpx.AsyncClient, port: int) -> bool:
    """The replica listens, has beaten and seen its workers (it is started in the test's
    loop, so it may not listen yet)."""
    try:
        response = await client.get(f"http://127.0.0.1:{port}/readyz")
    except httpx.ConnectError:
        return False
    return response.status_code == 200


async def test_scheduler_readyz_names_a_pool_without_a_healthy_worker(fake_workers: Any) -> None:
    fake = fake_workers()
    fake.healthy = False
    pool = await sync_to_async(register_pool)(fake)
    port = _free_port()
    async with (
        running_schedulers(metrics_port=port) as (replica,),
        httpx.AsyncClient(timeout=budget(30)) as client,
    ):
        await wait_for(lambda: _worker_down(replica))
        await wait_for(lambda: _listening(client, port))
        ready = await client.get(f"http://127.0.0.1:{port}/readyz")

    assert ready.status_code == 503
    assert ready.json()["failing"] == ["workers"]
    assert ready.json()["checks"]["workers"] == f"no healthy worker in {pool.name}"


async def _listening(client: httpx.AsyncClient, port: int) -> bool:
    try:
        await client.get(f"http://127.0.0.1:{port}/healthz")
    except httpx.ConnectError:
        return False
    return True


async def _worker_down(replica: Any) -> bool:
    return any(view.state == "down" for view in replica.capacity.workers.values())


async def test_scheduler_readyz_is_503_when_its_redis_stops(
    fake_workers: Any,
    own_redis: RedisServer,  # noqa: F811 (the fixture imported above)
) -> None:
    await sync_to_async(register_pool)(fake_workers())
    port = _free_port()
    client = httpx.AsyncClient(timeout=budget(30))  # a failure point
    async with running_schedulers(metrics_port=port), client:
        await wait_for(lambda: _ready(client, port))
        own_redis.kill()
        ready = await client.get(f"http://127.0.0.1:{port}/readyz")
        alive = await client.get(f"http://127.0.0.1:{port}/healthz")
        own_redis.start()  # for the replica to leave as it does

    assert ready.status_code == 503
    body = ready.json()
    assert body["status"] == "unavailable"
    assert body["failing"] == ["redis", "heartbeat"]
    assert body["checks"]["workers"] == "ok"
    # The loop still turns: the replica is alive, only not ready.
    assert alive.status_code == 200


async def test_scheduler_metrics_port_zero_serves_nothing(fake_workers: Any) -> None:
    await sync_to_async(register_pool)(fake_workers())
    async with running_schedulers() as (replica,):
        assert replica.ops is None
