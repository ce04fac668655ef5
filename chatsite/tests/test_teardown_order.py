"""What a test started is stopped before pytest-django flushes the test database.

The flush truncates every table; a live process or thread still writing then deadlocks with
it (CI once failed so in `test_heartbeats_flow_while_the_generation_waits`: the edge cancels a
generation whose only watcher left before the first token, after the client is gone). The
fixtures order their teardown before the flush (inference/tests/fixtures.py explains how);
these tests look at the moment of the flush itself.

`flush_witness` wraps the flush and runs the test's probes just before it. It must come
first in a test's arguments and the test must not be marked `django_db`: it is then set up
before the database fixture and torn down after it, so its teardown sees what the probes saw.
"""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.contrib.auth.models import User
from django.db import connection

from accounts.services import api_key_create
from chatsite.redis import sync_redis
from chatsite.testing import wait_until
from chatsite.tests.edge_asgi import DISCONNECT_DELAY_ENV
from conversations.tests.browser_conftest import SCHEDULER_DB_APPLICATION
from inference import queue
from inference.models import Generation
from inference.tests.fixtures import (
    LiveEdge,
    busy_sessions,
    register_pool,
    send_turn,
    start_edge,
)


@dataclass
class FlushWitness:
    """Probes to run at the flush, with what each must find then."""

    probes: dict[str, tuple[Callable[[], Any], Any]] = field(default_factory=dict)
    seen: dict[str, Any] | None = None

    def expect(self, name: str, probe: Callable[[], Any], value: Any) -> None:
        self.probes[name] = (probe, value)


@pytest.fixture
def flush_witness(monkeypatch: pytest.MonkeyPatch) -> Iterator[FlushWitness]:
    witness = FlushWitness()
    threads_before = set(threading.enumerate())
    flush = connection.ops.execute_sql_flush

    def witnessed_flush(sql_list: list[str]) -> None:
        witness.seen = {name: probe() for name, (probe, _) in witness.probes.items()}
        witness.seen["threads started by the test"] = sorted(
            thread.name for thread in set(threading.enumerate()) - threads_before
        )
        flush(sql_list)

    monkeypatch.setattr(connection.ops, "execute_sql_flush", witnessed_flush)
    yield witness
    expected = {name: value for name, (_, value) in witness.probes.items()}
    expected["threads started by the test"] = []
    assert witness.seen == expected, "the database was flushed before the test's writers stopped"


@pytest.fixture
def slow_edge(transactional_db: Any, tmp_path: Path) -> Iterator[LiveEdge]:
    """A live edge of its own that notices a client left only a second later, so its writes
    after the hang-up would land after the flush unless the teardown waits for them."""
    # The second is the scenario, not a wait of the test's: the teardown waits for the edge to
    # go idle (`wait_until_idle`), so a slower machine only makes it wait longer.
    edge = start_edge(tmp_path, **{DISCONNECT_DELAY_ENV: "1"})
    try:
        yield edge
        edge.wait_until_idle()
    finally:
        edge.stop()


def test_a_stream_left_before_its_first_token_is_noted_before_the_flush(
    flush_witness: FlushWitness, slow_edge: LiveEdge, user: User
) -> None:
    live_edge = slow_edge
    register_pool()  # no worker: the generation stays queued
    turn = send_turn(user)
    _, raw_key = api_key_create(user=user, name="teardown order")
    url = f"{live_edge.url}/api/v1/generations/{turn.generation.id}/stream"
    with httpx.stream("GET", url, headers={"Authorization": f"Bearer {raw_key}"}) as response:
        for line in response.iter_lines():
            if line.startswith(": heartbeat"):
                break
    # The client has left; the edge notes it now, on its own time, for the scheduler to cancel
    # the generation after the grace (no scheduler runs here: it stays queued).
    flush_witness.expect("the edge has exited", lambda: live_edge.process.poll() is not None, True)
    flush_witness.expect(
        "the hang-up noted",
        lambda: sync_redis().zscore(queue.detached_key(), str(turn.generation.id)) is not None,
        True,
    )
    flush_witness.expect(
        "the generation",
        lambda: Generation.objects.values_list("status", flat=True).get(pk=turn.generation.id),
        Generation.Status.QUEUED,
    )


def test_the_celery_worker_thread_is_joined_before_the_flush(
    flush_witness: FlushWitness, live_celery_worker: Any
) -> None:
    assert any(thread.name != "MainThread" for thread in threading.enumerate())
    flush_witness.expect("the worker's state", lambda: live_celery_worker.blueprint.state, 3)


def test_the_scheduler_process_and_its_sessions_are_gone_before_the_flush(
    flush_witness: FlushWitness, scheduler: Callable[..., subprocess.Popen[bytes]]
) -> None:
    process = scheduler()
    # It connects and disconnects as its loops run (each closes its old connections): wait
    # until one of its sessions is seen, so that the check at the flush means something.
    wait_until(
        lambda: busy_sessions(SCHEDULER_DB_APPLICATION, connected=True),
        every=0.02,
        what="the scheduler connected to the database",
    )
    flush_witness.expect("the scheduler has exited", lambda: process.poll() is not None, True)
    flush_witness.expect(
        "its database sessions",
        lambda: busy_sessions(SCHEDULER_DB_APPLICATION, connected=True),
        [],
    )
