"""The edge's operator endpoints (`chatsite/ops.py`): `/healthz`, `/readyz`, `/metrics`, on
real edge processes, as a probe and Prometheus reach them."""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from accounts.models import ApiKey
from accounts.services import api_key_create
from accounts.tests.factories import UserFactory
from chatsite.redis import sync_redis
from chatsite.testing import budget
from conversations.events import user_events_key
from inference.models import ModelPool, Worker
from inference.tests.fixtures import LiveEdge, start_edge
from inference.tests.test_redis_outage import RedisServer

# Each request's failure point only (a scaled budget): an edge answers these at once.
TIMEOUT = budget(30)
# What an edge exports as it starts, whatever it has served (the edge's own metrics and the
# inference plane's counters it may count: a Stop, a refusal under pressure).
EDGE_METRICS = {
    "chatsite_edge_active_streams",
    "chatsite_edge_events_delivered",
    "chatsite_celery_queue_length",
}


def samples(text: str) -> dict[str, list[Any]]:
    """A scrape's samples by family name."""
    return {family.name: list(family.samples) for family in text_string_to_metric_families(text)}


def test_healthz_and_readyz_answer_ok(live_edge: LiveEdge) -> None:
    pool = ModelPool.objects.create(name="ready-pool", served_model="m")
    Worker.objects.create(pool=pool, name="w1", url="http://10.0.0.1:8000", state="healthy")

    alive = httpx.get(f"{live_edge.url}/healthz", timeout=TIMEOUT)
    ready = httpx.get(f"{live_edge.url}/readyz", timeout=TIMEOUT)

    assert alive.status_code == 200
    assert alive.json() == {"status": "ok"}
    assert ready.status_code == 200
    assert ready.json() == {
        "status": "ready",
        "checks": {"database": "ok", "redis": "ok", "workers": "ok"},
        "failing": [],
    }


def test_readyz_names_an_active_pool_without_a_healthy_worker(live_edge: LiveEdge) -> None:
    pool = ModelPool.objects.create(name="idle-pool", served_model="m")
    Worker.objects.create(pool=pool, name="w1", url="http://10.0.0.1:8000", state="down")
    inactive = ModelPool.objects.create(name="off-pool", served_model="m", is_active=False)
    Worker.objects.create(pool=inactive, name="w2", url="http://10.0.0.2:8000", state="down")

    ready = httpx.get(f"{live_edge.url}/readyz", timeout=TIMEOUT)

    assert ready.status_code == 503
    body = ready.json()
    assert body["status"] == "unavailable"
    assert body["failing"] == ["workers"]
    assert body["checks"]["workers"] == "no healthy worker in idle-pool"
    # A client outside the operators' networks learns which check fails, not why.
    public = httpx.get(
        f"{live_edge.url}/readyz", headers={"X-Forwarded-For": "203.0.113.9"}, timeout=TIMEOUT
    )
    assert public.status_code == 503
    assert public.json() == {
        "status": "unavailable",
        "checks": {"database": "ok", "redis": "ok", "workers": "failing"},
        "failing": ["workers"],
    }


def test_metrics_answer_loopback_with_the_edge_metrics(live_edge: LiveEdge) -> None:
    response = httpx.get(f"{live_edge.url}/metrics", timeout=TIMEOUT)

    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    exported = samples(response.text)
    assert set(exported) >= EDGE_METRICS
    assert [s.labels for s in exported["chatsite_celery_queue_length"]] == [{"queue": "celery"}]
    assert all("pid" in s.labels for s in exported["chatsite_edge_active_streams"])


def test_metrics_are_not_found_from_a_public_address(live_edge: LiveEdge) -> None:
    # The edge trusts its proxy's (127.0.0.1) X-Forwarded-For: the client is 203.0.113.9.
    response = httpx.get(
        f"{live_edge.url}/metrics", headers={"X-Forwarded-For": "203.0.113.9"}, timeout=TIMEOUT
    )
    private = httpx.get(
        f"{live_edge.url}/metrics", headers={"X-Forwarded-For": "10.1.2.3"}, timeout=TIMEOUT
    )

    assert response.status_code == 404
    assert "chatsite_" not in response.text
    assert private.status_code == 200


@pytest.fixture
def two_process_edge(transactional_db: Any, tmp_path: Path) -> Iterator[LiveEdge]:
    edge = start_edge(tmp_path, EDGE_WORKERS="2")
    yield edge
    edge.wait_until_idle()
    edge.stop()


def _children(pid: int) -> set[int]:
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid:
                found.add(int(stat.parent.name))
    return found


def test_one_scrape_sums_every_edge_process(two_process_edge: LiveEdge) -> None:
    user = UserFactory.create()
    _, key = api_key_create(user=user, name="metrics", scope=ApiKey.Scope.FULL)
    headers = {"Authorization": f"Bearer {key}"}
    count = 6
    with contextlib.ExitStack() as stack:
        client = stack.enter_context(httpx.Client(base_url=two_process_edge.url, timeout=TIMEOUT))
        streams = []
        for _ in range(count):
            # A connection each, so the kernel may hand them to either process.
            response = stack.enter_context(
                httpx.Client(base_url=two_process_edge.url, timeout=TIMEOUT).stream(
                    "GET", "/api/v1/events/stream", headers=headers
                )
            )
            lines = response.iter_lines()
            # The first heartbeat: the stream is relayed (and counted) by then.
            assert next(line for line in lines if line.startswith(": heartbeat"))
            streams.append(lines)
        sync_redis().xadd(user_events_key(user.pk), {"event": "title", "data": "{}"})
        for lines in streams:
            assert next(line for line in lines if line.startswith("event: ")) == "event: title"

        exported = samples(client.get("/metrics").text)

    active = {s.labels["pid"]: s.value for s in exported["chatsite_edge_active_streams"]}
    delivered = [
        s.value
        for s in exported["chatsite_edge_events_delivered"]
        if s.name == "chatsite_edge_events_delivered_total"
    ]
    # Both processes' files, in one scrape: each process's series under its own pid (the
    # launcher's children; multiprocessing's resource tracker is one too, and serves nothing).
    assert len(active) == 2
    assert {int(pid) for pid in active} <= _children(two_process_edge.process.pid)
    assert sum(active.values()) == count
    assert sum(delivered) == count


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def edge_on_own_redis(
    transactional_db: Any, tmp_path: Path
) -> Iterator[tuple[LiveEdge, RedisServer]]:
    server = RedisServer(tmp_path)
    server.start()
    edge = start_edge(tmp_path, REDIS_URL=server.url, EDGE_WARM_UP="")
    yield edge, server
    edge.stop()
    if server.process is not None and server.process.poll() is None:
        server.kill()


def test_readyz_is_503_naming_redis_when_redis_stops(
    edge_on_own_redis: tuple[LiveEdge, RedisServer],
) -> None:
    edge, server = edge_on_own_redis
    before = httpx.get(f"{edge.url}/readyz", timeout=TIMEOUT)
    server.kill()

    after = httpx.get(f"{edge.url}/readyz", timeout=TIMEOUT)

    assert before.status_code == 200
    assert after.status_code == 503
    body = after.json()
    assert body["failing"] == ["redis"]
    assert body["checks"]["database"] == "ok"
    assert "Connection" in body["checks"]["redis"]
    assert httpx.get(f"{edge.url}/healthz", timeout=TIMEOUT).status_code == 200


@pytest.fixture
def edge_without_postgres(transactional_db: Any, tmp_path: Path) -> Iterator[LiveEdge]:
    edge = start_edge(
        tmp_path,
        DATABASE_URL=f"postgres://postgres@127.0.0.1:{_closed_port()}/nowhere",
        EDGE_WARM_UP="",
    )
    yield edge
    edge.stop()


def test_readyz_is_503_naming_the_database_when_postgres_is_unreachable(
    edge_without_postgres: LiveEdge,
) -> None:
    response = httpx.get(f"{edge_without_postgres.url}/readyz", timeout=TIMEOUT)

    assert response.status_code == 503
    body = json.loads(response.text)
    assert body["status"] == "unavailable"
    # The pools' workers are read from the database too.
    assert body["failing"] == ["database", "workers"]
    assert body["checks"]["redis"] == "ok"
    assert httpx.get(f"{edge_without_postgres.url}/healthz", timeout=TIMEOUT).status_code == 200
