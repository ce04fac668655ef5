"""Fixtures for the inference plane, loaded for the whole suite by the root conftest: pools,
stand-in workers, in-process scheduler replicas, a live edge and real vLLM workers.

Live processes and the database flush. A transactional test ends with pytest-django
truncating every table (the `_django_db_helper` fixture's teardown); a process or thread
still writing then deadlocks with the TRUNCATE (it holds a row lock the TRUNCATE waits
for while it waits for a table the TRUNCATE has locked). So nothing a test started may be
writing by then, and that is made to follow from how pytest orders teardown rather than
from timing: pytest tears a fixture down before any fixture it requested, so

- a function-scoped fixture that starts a writer (a scheduler subprocess, a Celery worker
  thread) requests `transactional_db` and stops and joins it in its own teardown;
- a session-scoped process that writes (the live edge) is reached through a function-scoped
  fixture that requests `transactional_db` and, in its teardown, waits until the process
  has nothing in flight and no database session of its own is busy;
- a fixture that makes requests to the edge (the browser's pages) requests the edge's
  fixture, so its connections are closed before the edge is waited for;
- in-process scheduler replicas run inside the test (`running_schedulers`), joined before
  the test returns.

`chatsite/tests/test_teardown_order.py` checks the order at the moment of the flush.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connection

from chatsite import edge
from chatsite.testing import budget, wait_until
from chatsite.testing import wait_for as wait_for  # where the scheduler's tests import it from
from chatsite.tests.edge_asgi import IN_FLIGHT_PATH, TASKS_PATH
from inference import queue
from inference.client import WorkerLoad, parse_metrics
from inference.models import ModelPool, Worker
from inference.scheduler import Scheduler
from inference.scheduler.housekeeping import Housekeeping

from .fake_worker import FakeWorker


@pytest.fixture
def fake_workers() -> Iterator[Callable[..., FakeWorker]]:
    started: list[FakeWorker] = []

    def start(**kwargs: Any) -> FakeWorker:
        worker = FakeWorker(**kwargs).start()
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()


def register_pool(*fakes: FakeWorker, name: str | None = None) -> ModelPool:
    """A pool served by `fakes`, counted with the real model's tokenizer."""
    pool, _ = ModelPool.objects.get_or_create(
        name=name or settings.DEFAULT_MODEL, defaults={"served_model": "fake"}
    )
    for index, fake in enumerate(fakes):
        Worker.objects.create(
            pool=pool, name=f"fake-{index}", url=fake.url, state=Worker.State.HEALTHY
        )
    return pool


@asynccontextmanager
async def running_schedulers(count: int = 1, **kwargs: Any) -> AsyncIterator[list[Scheduler]]:
    """`count` scheduler replicas running in this event loop, stopped on exit."""
    replicas = [
        Scheduler(replica_id=f"test-{index}", health_interval=0.2, **kwargs)
        for index in range(count)
    ]
    tasks = [asyncio.create_task(replica.run()) for replica in replicas]
    try:
        yield replicas
    finally:
        for replica in replicas:
            replica.stop()
        await asyncio.gather(*tasks, return_exceptions=True)


@pytest.fixture
def housekeeping_passes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """When (`queue.now_ms`) each of the in-process replicas' looks for abandoned answers
    began, once it has ended: a test that shows an answer outlived its grace waits for a
    look that began past the grace (`housekeeping_past`) rather than sleeping through it."""
    passes: list[int] = []
    real = Housekeeping.cancel_abandoned

    async def noted(self: Housekeeping) -> None:
        began = queue.now_ms()
        await real(self)
        passes.append(began)

    monkeypatch.setattr(Housekeeping, "cancel_abandoned", noted)
    return passes


async def housekeeping_past(passes: list[int], moment_ms: int) -> None:
    """Until housekeeping has looked for abandoned answers at `moment_ms` or later: an answer
    whose grace ran out by then would have been cancelled."""

    async def looked() -> bool:
        return any(began >= moment_ms for began in passes)

    await wait_for(looked, what=f"a look for abandoned answers at {moment_ms} ms or later")


async def watchers(generation_id: Any) -> int:
    """How many clients read the generation's stream, as the edge has noted them."""
    count = await sync_to_async(queue.sync_redis().get)(queue.watchers_key(generation_id))
    return int(count or 0)


async def unwatched_since(generation_id: Any) -> int:
    """Once the edge has noted that nobody reads the generation's stream: since when (ms)."""
    since: list[int] = []

    async def noted() -> bool:
        job = queue.job_key(generation_id)
        value = await sync_to_async(queue.sync_redis().hget)(job, "detached_ms")
        since[:] = [int(value)] if value is not None else []
        return bool(since)

    await wait_for(noted, what="the edge noting that nobody reads the stream")
    return since[0]


def stream_events(generation_id: Any) -> list[tuple[str, dict[str, Any]]]:
    entries: list[tuple[str, dict[str, str]]] = queue.sync_redis().xrange(  # type: ignore[assignment]
        queue.stream_key(generation_id)
    )
    return [(fields["event"], json.loads(fields["data"])) for _, fields in entries]


async def generation_status(generation_id: Any) -> str:
    from inference.models import Generation

    generation = await Generation.objects.aget(pk=generation_id)
    return generation.status


async_stream_events = sync_to_async(stream_events)


async def finished(generation_id: Any) -> bool:
    """Whether the generation has reached a final status."""
    from inference.models import Generation

    return (await Generation.objects.aget(pk=generation_id)).is_final


async def generation_facts(generation_id: Any, replicas: list[Scheduler]) -> str:
    """Where a generation stands, for a test that waited for it in vain: its row, its job
    in Redis (owner, cancel flag), its place in line, and the in-process replicas that run
    it."""
    from chatsite.redis import sync_redis
    from inference.models import Generation

    row = await Generation.objects.select_related("pool").aget(pk=generation_id)

    def in_redis() -> tuple[dict[Any, Any], int | None]:
        redis = sync_redis()
        job = redis.hgetall(queue.job_key(generation_id))
        for long in ("messages", "tools", "params", "traceparent"):
            job.pop(long, None)
        place = queue.queue_position(
            redis, pool=row.pool.name, tier=row.tier, generation_id=str(generation_id)
        )
        return job, place

    job, place = await sync_to_async(in_redis)()
    running = [replica.replica_id for replica in replicas if str(generation_id) in replica.running]
    return (
        f"generation {generation_id}: {row.status}, admitted {row.admitted_at}, first token "
        f"{row.first_token_at}, finished {row.finished_at}, {row.output_tokens} tokens; job "
        f"{job}; place in line {place or 'none'}; running on {running or 'no replica'}"
    )


async def stream_ended(generation_id: Any) -> bool:
    """Whether the generation's stream carries its `done` event (for one without a row)."""
    events = await sync_to_async(stream_events)(generation_id)
    return "done" in [name for name, _ in events]


def send_turn(user: Any, content: str = "Hello there", conversation: Any = None) -> Any:
    """A user's turn through the real request path (a new conversation unless one is given)."""
    from conversations.services import conversation_create
    from conversations.turns import turn_send

    conversation = conversation or conversation_create(owner=user)
    return turn_send(user=user, conversation=conversation, content=content)


send = sync_to_async(send_turn)


def send_unkept_turn(user: Any, content: str = "Hello there", *, relay: bool = False) -> str:
    """A `/v1` turn of a key that keeps nothing, through the real request path; the id of
    its answer (which has no row: wait for it with `stream_ended`). With `relay`, the
    caller reads it from the worker (`inference.edge_relay.follow`), as the `/v1` view does."""
    from conversations.turns import turn_unkept

    turn = turn_unkept(
        user=user,
        model=settings.DEFAULT_MODEL,
        system_prompt="",
        messages=[("user", content)],
        relay=relay,
    )
    return str(turn.generation.id)


send_unkept = sync_to_async(send_unkept_turn)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class RealWorker:
    """A real vLLM server started for the end-to-end tests."""

    url: str
    process: subprocess.Popen[bytes] | None
    log: Path | None

    def metrics(self) -> WorkerLoad:
        return parse_metrics(httpx.get(f"{self.url}/metrics", timeout=budget(30)).text)


def aborted_in_vllm(workers: list[RealWorker], generation_id: object) -> bool:
    """Whether vLLM aborted the request of `generation_id` (its request id carries it): read
    from the log of the workers this run started, whichever of them served it. Workers a
    development run reuses have no log here: then none of them runs anything any more."""
    if all(worker.log is not None for worker in workers):
        needle = str(generation_id)
        return any(
            "Aborted request" in line and needle in line
            for worker in workers
            if worker.log is not None
            for line in worker.log.read_text(errors="replace").splitlines()
        )
    return all(worker.metrics().running == 0 for worker in workers)


def _start_real_workers(count: int, log_dir: Path) -> list[RealWorker]:
    if (
        not Path(settings.WORKER_PYTHON).exists()
        or not (settings.MODEL_DIR / "config.json").exists()
    ):
        message = "the vLLM worker venv or the prepared model is missing (make worker-venv model)"
        if os.environ.get("CHATSITE_E2E_REQUIRED"):
            pytest.fail(message)
        pytest.skip(message)
    workers = []
    for index in range(count):
        port = _free_port()
        log = log_dir / f"vllm-worker-{index}.log"
        # One core each, or both would bind to the first core (vLLM's "auto").
        cpus = str(index % (os.cpu_count() or 1))
        process = subprocess.Popen(  # noqa: S603 (our own command line)
            [sys.executable, "manage.py", "run_worker", "--port", str(port), "--cpus", cpus],
            cwd=settings.BASE_DIR,
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        workers.append(RealWorker(url=f"http://127.0.0.1:{port}", process=process, log=log))
    for worker in workers:
        assert worker.process is not None and worker.log is not None

        def up(worker: RealWorker = worker) -> bool:
            assert worker.process is not None and worker.log is not None
            if worker.process.poll() is not None:
                pytest.fail(f"vLLM worker exited early:\n{worker.log.read_text()[-3000:]}")
            try:
                return httpx.get(f"{worker.url}/health", timeout=budget(10)).status_code == 200
            except httpx.HTTPError:
                return False

        try:
            wait_until(up, within=300, every=1, what="the vLLM worker answering")
        except AssertionError as exc:
            pytest.fail(f"{exc}:\n{worker.log.read_text()[-3000:]}")
    return workers


@pytest.fixture(scope="session")
def real_workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[RealWorker]]:
    """Two real vLLM CPU workers serving SmolLM2-135M-Instruct, for the whole session.

    CHATSITE_E2E_WORKER_URLS (comma-separated) reuses workers already running, for development
    runs that should not pay vLLM's start-up each time; CI always starts its own.
    """
    if urls := os.environ.get("CHATSITE_E2E_WORKER_URLS"):
        yield [RealWorker(url=url.strip(), process=None, log=None) for url in urls.split(",")]
        return
    workers = _start_real_workers(2, tmp_path_factory.mktemp("vllm"))
    yield workers
    for worker in workers:
        assert worker.process is not None
        os.killpg(worker.process.pid, signal.SIGTERM)
    for worker in workers:
        assert worker.process is not None
        try:
            worker.process.wait(timeout=budget(30))  # then killed: cleanup, not a check
        except subprocess.TimeoutExpired:
            os.killpg(worker.process.pid, signal.SIGKILL)
            worker.process.wait()


def test_database_url(application_name: str) -> str:
    """The test database's URL for a process the suite starts, its sessions named so that
    `busy_sessions` can tell them apart in pg_stat_activity."""
    database = settings.DATABASES["default"]
    return (
        f"postgres://{database['USER']}@{database['HOST']}:{database['PORT']}/{database['NAME']}"
        f"?application_name={application_name}"
    )


def busy_sessions(application_name: str, *, connected: bool = False) -> list[str]:
    """The test database's sessions opened as `application_name` that are doing something
    (running a statement or inside a transaction), or, with `connected`, that exist at all."""
    if connection.vendor != "postgresql":
        return []
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid, state, query FROM pg_stat_activity"
            " WHERE datname = current_database() AND application_name = %s"
            " AND (%s OR state IS DISTINCT FROM 'idle')",
            [application_name, connected],
        )
        return [f"pid {pid} ({state}): {query[:200]}" for pid, state, query in cursor.fetchall()]


def wait_for_sessions_to_end(application_name: str, *, within: float = 60.0) -> None:
    """After a process exited: until Postgres has ended its sessions too (a backend whose
    client was killed finishes the statement it is in, and holds its locks until then)."""
    try:
        wait_until(
            lambda: not busy_sessions(application_name, connected=True),
            within=within,
            what=f"the sessions of {application_name} ended",
        )
    except AssertionError as exc:
        sessions = busy_sessions(application_name, connected=True)
        pytest.fail(f"{application_name} exited but its sessions remain ({exc}): {sessions}")


@dataclass
class LiveEdge:
    """A real edge process serving the project against the test database."""

    url: str
    process: subprocess.Popen[bytes]
    application_name: str
    log: Path

    def in_flight(self) -> int:
        """How many requests the edge is still handling (chatsite/tests/edge_asgi.py)."""
        return int(self._in_flight_report()["in_flight"])

    def _in_flight_report(self) -> dict[str, Any]:
        response = httpx.get(f"{self.url}{IN_FLIGHT_PATH}", timeout=budget(30))
        report: dict[str, Any] = response.json()
        return report

    def wait_until_idle(self, *, within: float = 60.0) -> None:
        """Until the edge handles no request and none of its database sessions is busy.

        A request whose client left goes on in the edge (a stream left before its first token
        cancels the generation there), so the client being done says nothing about the edge.
        """

        def idle() -> bool:
            if self.process.poll() is not None:
                return True
            return not self.in_flight() and not busy_sessions(self.application_name)

        try:
            wait_until(idle, within=within, what="the live edge idle")
        except AssertionError as exc:
            in_flight = self.in_flight()
            sessions = busy_sessions(self.application_name)
            pytest.fail(
                f"{exc} before the database flush: {in_flight} request(s) in flight "
                f"({self._in_flight_report()['paths']}), busy sessions: {sessions}\n"
                f"edge log ({self.log}):\n{self.log.read_text()[-3000:]}\n"
                f"{self.stacks()}"
            )
        if self.process.poll() is not None:
            wait_for_sessions_to_end(self.application_name)

    def stacks(self) -> str:
        """Where the edge's asyncio tasks wait, and its threads' stacks (py-spy), to show why
        a request does not end."""
        try:
            tasks = httpx.get(f"{self.url}{TASKS_PATH}", timeout=budget(30)).text
        except httpx.HTTPError as exc:
            tasks = f"(no answer: {exc})"
        py_spy = Path(sys.executable).parent / "py-spy"
        try:
            threads = subprocess.run(  # noqa: S603 (our own command line)
                [str(py_spy), "dump", "--pid", str(self.process.pid)],
                capture_output=True,
                text=True,
                timeout=budget(30),  # a report of a failure already found
                check=False,
            )
            dump = threads.stdout + threads.stderr
        except (OSError, subprocess.TimeoutExpired) as exc:
            dump = f"(py-spy failed: {exc})"
        return f"edge tasks:\n{tasks[-12000:]}\nedge threads:\n{dump[-12000:]}"

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=budget(60))
        wait_for_sessions_to_end(self.application_name)


def start_edge(log_dir: Path, **env_overrides: str) -> LiveEdge:
    """Start an edge (`chatsite.edge`) on a free port against the test database; returns
    once it answers. `EDGE_WORKERS` among the overrides: its processes (else one).

    It serves the project through `chatsite.tests.edge_asgi`, which counts the requests in
    flight for `LiveEdge.wait_until_idle`.
    """
    port = _free_port()
    application_name = f"chatsite-test-edge-{port}"
    env = {
        **os.environ,
        "DATABASE_URL": test_database_url(application_name),
        "REDIS_URL": settings.REDIS_URL,
        "STREAM_HEARTBEAT_SECONDS": "1",
        # A page's note that a beacon may be its reload's lapses sooner than the site's 10 s,
        # so that tests of a closed tab wait less for it; a real reload's beacon comes well
        # within it.
        "STREAM_RELOAD_SECONDS": "5",
        "DEBUG": "0",
        **env_overrides,
    }
    log = log_dir / f"edge-{port}.log"
    process = subprocess.Popen(  # noqa: S603 (our own command line)
        edge.command(
            port,
            workers=int(env_overrides.get("EDGE_WORKERS", "1")),
            application="chatsite.tests.edge_asgi:application",
        ),
        cwd=settings.BASE_DIR,
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"

    def answers() -> bool:
        if process.poll() is not None:
            pytest.fail(f"the edge exited as it started:\n{log.read_text()[-3000:]}")
        try:
            httpx.get(f"{url}/accounts/login/", timeout=budget(10))
        except httpx.HTTPError:
            return False
        return True

    try:
        wait_until(answers, within=120, every=0.2, what="the edge answering")
    except AssertionError as exc:
        pytest.fail(f"{exc}:\n{log.read_text()[-3000:]}")
    return LiveEdge(url=url, process=process, application_name=application_name, log=log)


@pytest.fixture(scope="session")
def _live_edge_process(
    django_db_setup: Any, django_db_blocker: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveEdge]:
    """The one edge process of the session; tests reach it through `live_edge`."""
    edge = start_edge(tmp_path_factory.mktemp("edge"))
    yield edge
    with django_db_blocker.unblock():
        edge.stop()


@pytest.fixture
def live_edge(transactional_db: Any, _live_edge_process: LiveEdge) -> Iterator[LiveEdge]:
    """The session's live edge, idle again before this test's database is flushed.

    It requests `transactional_db` (the edge sees only what the test committed), so pytest
    runs this teardown, the wait, before the flush in that fixture's teardown.
    """
    yield _live_edge_process
    _live_edge_process.wait_until_idle()
