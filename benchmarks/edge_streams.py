"""One edge process under many SSE streams: how many it holds, how late events arrive, and
what each stream costs.

One edge process (`chatsite.edge`, or Daphne with `--server daphne`) serves
`GET /api/v1/generations/<id>/stream` (issue 4's benchmark). The script plays both the
scheduler and the browsers:

- Rows: one user with an API key and one queued generation per stream. The first turn goes
  through `conversation_create` and `message_send`; the rest are bulk-created copies of it, so
  setting up thousands of streams takes seconds. Nothing is enqueued and no scheduler runs.
- Client: raw HTTP/1.1 over `asyncio.open_connection`, one socket per stream, de-chunked and
  split into SSE events as bytes arrive: cheap enough that on a small machine the client is
  not what saturates first (its CPU share is reported so that can be checked).
- Warm-up: a few streams are opened and closed before the baseline is read; they also tell
  how many Redis and Postgres connections one stream holds.
- Idle: N streams connected, no events, for two heartbeat periods (the edge runs with
  `STREAM_HEARTBEAT_SECONDS` = `--heartbeat`, 2 by default): every stream must still be open
  and have had a heartbeat. Reported: the edge's RSS (`/proc/<pid>/status` VmRSS) against its
  RSS with no stream, its CPU (`/proc/<pid>/stat`) and open descriptors, and the connections
  on the benchmark's Redis database (`CLIENT LIST`) and Postgres database
  (`pg_stat_activity`), i.e. what each stream holds.
- Active: the script XADDs `delta` events (the format of `inference.queue.append_event`) to
  every stream at `--rate` events/s each for `--seconds`, spread evenly over each period in
  pipelines of `WRITE_CHUNK` streams; each event's data carries `time.time_ns()` taken just
  before its pipeline is sent, and the client records arrival minus that. Reported: delay
  p50/p99/max, events sent and delivered (after a drain of up to `--drain-timeout` s; they
  must be equal), errors (failed or dropped connections, events out of order), and the CPU of
  the edge, Redis (`INFO cpu`) and this client over the phase. 20 events/s is the most the
  scheduler sends, as it coalesces tokens into ~50 ms deltas.
- Ramp: idle streams in steps (`--ramp`), stopping at the first step that does not hold, at
  `--max`, at the open-file limit, or when the step would not fit in `--budget`.

Redis and Postgres are shared with other work on this machine. A phase or step that, at the
connections per stream seen in the warm-up (then in the largest step so far), would leave
fewer than `REDIS_RESERVE` Redis or `POSTGRES_RESERVE` Postgres connections free is not run;
the table says so and why.

Each generation's job hash carries `first_token_ms`, as a running generation's does, so a
closing stream takes the cheap branch of the disconnect policy (note `detached_ms`) instead of
cancelling through Postgres: closing streams is not what is measured.

Run it:

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/chatsite_edgebench \\
    REDIS_URL=redis://127.0.0.1:6379/10 SECRET_KEY=x \\
    .venv/bin/python benchmarks/edge_streams.py --streams 100,1000 --rate 20 --seconds 10

It uses its own database (created and migrated if missing; the name must contain "bench")
and its own Redis database (never db 0; flushed at start), prints one table and writes it to
benchmarks/results/edge_streams-<UTC date-time>.txt.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import resource
import secrets
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import httpx
import psycopg
from psycopg.conninfo import make_conninfo

if TYPE_CHECKING:
    from redis.asyncio import Redis as AsyncRedis

# Run as a script (`python benchmarks/<name>.py`): the project root must be importable.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import (
    django_start,
    edge_command,
    free_port,
    percentile,
    prepare_stores,
    render,
    write_result,
)
from chatsite.stream_events import StreamEvent, entry_fields

# How the edge frames the two events this benchmark looks for.
DELTA_EVENT = StreamEvent.DELTA.value.encode()
META_EVENT = StreamEvent.META.value.encode()

BASE_DIR = Path(__file__).resolve().parent.parent
RESULTS_DIR = BASE_DIR / "benchmarks" / "results"
DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/chatsite_edgebench"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/10"
SERVERS = ("uvicorn", "daphne")
# Connections opened at once: below the listen backlog of Daphne's Twisted (50), so no SYN is
# dropped and no connect waits a second for its retransmission.
CONNECT_CONCURRENCY = 40
CONNECT_TIMEOUT_SECONDS = 60
# After the streams close, the edge's connections are waited for until they are gone, or
# their counts have not moved for this many half-second polls, or the timeout.
TEARDOWN_SETTLED_POLLS = 16
TEARDOWN_TIMEOUT_SECONDS = 90
# Streams written per pipeline: one timestamp per pipeline, so it is taken at most a few
# hundred microseconds before the last XADD of its pipeline leaves.
WRITE_CHUNK = 50
# Redis and Postgres are shared with other work on this machine: never take their last
# client slots.
REDIS_RESERVE = 1000
POSTGRES_RESERVE = 20
WARM_UP_STREAMS = 10
# Descriptors the edge needs besides one per stream (the client's socket) and one per Redis
# or Postgres connection a stream holds.
EDGE_FDS_SPARE = 100
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


# Setup: Django, stores, rows, the edge process


def bootstrap() -> None:
    """Configure and start Django with this script's own database and Redis by default."""
    django_start(database_url=DEFAULT_DATABASE_URL, redis_url=DEFAULT_REDIS_URL)


def maintenance_conninfo(database: Mapping[str, Any]) -> str:
    """The server of `database`, reached through its `postgres` database."""
    return make_conninfo(
        dbname="postgres",
        user=database.get("USER") or None,
        password=database.get("PASSWORD") or None,
        host=database.get("HOST") or None,
        port=str(database.get("PORT") or "") or None,
    )


def create_generations(count: int) -> tuple[str, list[str]]:
    """A user, its API key and `count` queued generations; returns the raw key and the ids.

    The first turn is made by the services; the others copy its shape in bulk (a root, a user
    message, the queued placeholder as the current leaf), so thousands take seconds.
    """
    from django.conf import settings
    from django.contrib.auth.models import User
    from django.db import transaction
    from django.utils import timezone

    from accounts.services import api_key_create
    from chatsite.redis import sync_redis
    from conversations.models import Conversation, Message
    from conversations.services import conversation_create, message_send
    from inference import queue
    from inference.models import Generation, ModelPool
    from inference.services import tier_priority

    user = User.objects.create_user(username=f"edgebench-{secrets.token_hex(4)}")
    _, raw_key = api_key_create(user=user, name="edge benchmark")
    pool, _ = ModelPool.objects.get_or_create(
        name=settings.DEFAULT_MODEL, defaults={"served_model": "edge-benchmark"}
    )
    tier = settings.DEFAULT_TIER
    template = conversation_create(owner=user, source=Conversation.Source.API)
    first = message_send(conversation=template, content="benchmark").placeholder

    def generation(message: Message, conversation: Conversation) -> Generation:
        return Generation(
            message=message,
            conversation=conversation,
            user=user,
            pool=pool,
            tier=tier,
            priority=tier_priority(tier),
            max_tokens=pool.max_output_tokens,
        )

    generations = [generation(first, template)]
    now = timezone.now()
    conversations, messages = [], []
    for _ in range(count - 1):
        conversation = Conversation(
            owner=user, model=template.model, source=template.source, last_activity_at=now
        )
        root = Message(conversation=conversation, role=Message.Role.SYSTEM, content="")
        asked = Message(
            conversation=conversation, parent=root, role=Message.Role.USER, content="benchmark"
        )
        placeholder = Message(
            conversation=conversation,
            parent=asked,
            role=Message.Role.ASSISTANT,
            content="",
            status=Message.Status.QUEUED,
            model=template.model,
        )
        # Postgres checks these foreign keys at commit, so the pointers can go in up front.
        root.current_child_id = asked.id
        asked.current_child_id = placeholder.id
        conversation.current_leaf_id = placeholder.id
        conversations.append(conversation)
        messages += [root, asked, placeholder]
        generations.append(generation(placeholder, conversation))
    with transaction.atomic():
        Conversation.objects.bulk_create(conversations, batch_size=1000)
        Message.objects.bulk_create(messages, batch_size=1000)
        Generation.objects.bulk_create(generations, batch_size=1000)

    ids = [str(g.id) for g in generations]
    redis = sync_redis()
    pipe = redis.pipeline(transaction=False)
    for gid in ids:
        pipe.hset(queue.job_key(gid), "first_token_ms", queue.now_ms())
    pipe.execute()
    redis.close()
    return raw_key, ids


@dataclass
class Edge:
    """The edge process under test."""

    port: int
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.process.pid


def server_command(port: int, server: str) -> list[str]:
    if server == "daphne":
        daphne = str(Path(sys.executable).parent / "daphne")
        return [daphne, "-b", "127.0.0.1", "-p", str(port), "chatsite.asgi:application"]
    return edge_command(port)


def start_edge(log_dir: Path, *, heartbeat: int, server: str) -> Edge:
    port = free_port()
    log = log_dir / "edge.log"
    env = {
        **os.environ,
        "DEBUG": "0",
        "SECURE_COOKIES": "0",
        "STREAM_HEARTBEAT_SECONDS": str(heartbeat),
        "LOG_LEVEL": "WARNING",
    }
    with log.open("wb") as out:
        process = subprocess.Popen(  # noqa: S603 (our own command line)
            server_command(port, server),
            cwd=BASE_DIR,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    edge = Edge(port=port, process=process, log=log)
    deadline = time.monotonic() + 60
    while True:
        try:
            httpx.get(f"http://127.0.0.1:{port}/accounts/login/", timeout=2)
            return edge
        except httpx.HTTPError:
            if process.poll() is not None or time.monotonic() > deadline:
                stop_edge(edge)
                fail(f"the edge did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.2)


def stop_edge(edge: Edge) -> None:
    if edge.process.poll() is None:
        edge.process.terminate()
        try:
            edge.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            edge.process.kill()
            edge.process.wait()


def raise_fd_limit() -> None:
    """Lift the soft open-file limit to the hard one; the edge inherits it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def fail(message: str) -> NoReturn:
    raise SystemExit(f"edge_streams: {message}")


def _exit_on_sigterm(signum: int, frame: object) -> None:
    # Turn SIGTERM into SystemExit so the `finally` that stops the edge runs.
    raise SystemExit(128 + signum)


# Measuring the processes


@dataclass(frozen=True)
class ProcSample:
    cpu_s: float
    rss_kib: int
    fds: int
    threads: int


def sample_process(pid: int) -> ProcSample:
    stat = Path(f"/proc/{pid}/stat").read_text()
    # Fields after the command name, which may itself hold spaces: utime and stime are the
    # 14th and 15th fields of the line.
    fields = stat[stat.rindex(")") + 2 :].split()
    cpu_s = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    status = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    return ProcSample(
        cpu_s=cpu_s,
        rss_kib=int(status["VmRSS"].split()[0]),
        fds=len(os.listdir(f"/proc/{pid}/fd")),
        threads=int(status["Threads"]),
    )


def own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def redis_clients(redis: AsyncRedis, db: int) -> int:
    """Connections to the benchmark's Redis database, from any process."""
    clients: list[dict[str, Any]] = await redis.client_list()
    return sum(1 for client in clients if str(client.get("db")) == str(db))


async def redis_cpu_s(redis: AsyncRedis) -> float:
    info: dict[str, Any] = await redis.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


@dataclass
class Postgres:
    """The shared Postgres server's connections, from `pg_stat_activity`."""

    connection: psycopg.AsyncConnection[tuple[Any, ...]]
    database: str

    @classmethod
    async def connect(cls) -> Postgres:
        from django.conf import settings

        database = settings.DATABASES["default"]
        connection = await psycopg.AsyncConnection.connect(
            maintenance_conninfo(database), autocommit=True
        )
        return cls(connection=connection, database=str(database["NAME"]))

    async def _one(self, query: str, *params: object) -> int:
        cursor = await self.connection.execute(query, params)
        row = await cursor.fetchone()
        return int(row[0]) if row else 0

    async def bench_connections(self) -> int:
        """Connections to the benchmark's database, from any process."""
        return await self._one(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s", self.database
        )

    async def free_connections(self) -> int:
        return await self._one(
            "SELECT current_setting('max_connections')::int - count(*) FROM pg_stat_activity"
            " WHERE backend_type = 'client backend'"
        )


@dataclass
class Meter:
    """CPU of the edge, Redis and this client over one phase."""

    pid: int
    redis: AsyncRedis
    started: float = 0.0
    edge_cpu: float = 0.0
    redis_cpu: float = 0.0
    client_cpu: float = 0.0

    async def start(self) -> None:
        self.started = time.monotonic()
        self.edge_cpu = sample_process(self.pid).cpu_s
        self.redis_cpu = await redis_cpu_s(self.redis)
        self.client_cpu = own_cpu_s()

    async def stop(self, row: Row) -> None:
        wall = time.monotonic() - self.started
        row.edge_cpu_s = sample_process(self.pid).cpu_s - self.edge_cpu
        row.edge_cpu_pct = 100 * row.edge_cpu_s / wall
        row.redis_cpu_pct = 100 * (await redis_cpu_s(self.redis) - self.redis_cpu) / wall
        row.client_cpu_pct = 100 * (own_cpu_s() - self.client_cpu) / wall


# The client


class ProtocolError(Exception):
    pass


class ChunkDecoder:
    """Undo HTTP/1.1 chunked transfer-encoding incrementally."""

    def __init__(self) -> None:
        self.buffer = b""
        self.remaining = 0

    def feed(self, data: bytes) -> bytes:
        self.buffer += data
        out: list[bytes] = []
        while self.buffer:
            if self.remaining:
                piece = self.buffer[: self.remaining]
                out.append(piece)
                self.buffer = self.buffer[len(piece) :]
                self.remaining -= len(piece)
                continue
            end = self.buffer.find(b"\r\n")
            if end < 0:
                break
            line, self.buffer = self.buffer[:end], self.buffer[end + 2 :]
            if not line:  # the CRLF that closes a chunk's data
                continue
            size = int(line.split(b";", 1)[0], 16)
            if size == 0:
                raise ProtocolError("the server ended the response")
            self.remaining = size
        return b"".join(out)


class Stream:
    """One SSE connection: raw HTTP/1.1, parsed into events as its bytes arrive."""

    def __init__(self, generation_id: str) -> None:
        self.generation_id = generation_id
        self.writer: asyncio.StreamWriter | None = None
        self.task: asyncio.Task[None] | None = None
        self.ready = asyncio.Event()
        self.open = False
        self.closing = False
        self.error = ""
        self.heartbeats = 0
        self.delivered = 0
        self.misordered = 0
        self.next_seq = 0
        self.delays_ns: list[int] = []

    def reset_counts(self) -> None:
        self.delivered = self.misordered = self.next_seq = 0
        self.delays_ns = []

    async def connect(self, port: int, raw_key: str) -> None:
        reader, self.writer = await asyncio.open_connection("127.0.0.1", port)
        self.writer.write(
            (
                f"GET /api/v1/generations/{self.generation_id}/stream HTTP/1.1\r\n"
                f"Host: 127.0.0.1:{port}\r\n"
                f"Authorization: Bearer {raw_key}\r\n"
                "Accept: text/event-stream\r\n\r\n"
            ).encode()
        )
        self.task = asyncio.create_task(self._read(reader))
        await self.ready.wait()

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            status = head.split(b" ", 2)[1]
            if status != b"200":
                raise ProtocolError(f"HTTP {status.decode()}")
            self.open = True
            decoder = ChunkDecoder() if b"transfer-encoding: chunked" in head.lower() else None
            pending = b""
            while data := await reader.read(65536):
                received_ns = time.time_ns()
                pending += decoder.feed(data) if decoder else data
                *blocks, pending = pending.split(b"\n\n")
                for block in blocks:
                    self._event(block, received_ns)
            if not self.closing:
                raise ProtocolError("the server closed the connection")
        except (OSError, asyncio.IncompleteReadError, ProtocolError, ValueError) as exc:
            if not self.closing:
                self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.open = False
            if not self.closing and self.writer is not None:
                self.writer.close()
            self.ready.set()

    def _event(self, block: bytes, received_ns: int) -> None:
        if block.startswith(b":"):
            self.heartbeats += 1
            return
        # An event's fields in whatever order they come (the edge sends `id:` last).
        fields = dict(line.split(b": ", 1) for line in block.split(b"\n") if b": " in line)
        event = fields.get(b"event")
        if event == DELTA_EVENT:
            data = json.loads(fields[b"data"])
            self.delays_ns.append(received_ns - int(data["t"]))
            self.delivered += 1
            if data["seq"] != self.next_seq:
                self.misordered += 1
            self.next_seq = int(data["seq"]) + 1
        elif event == META_EVENT:
            # The stream's first entry, replayed: the view now tails the stream live.
            self.ready.set()

    async def close(self) -> None:
        self.closing = True
        if self.writer is not None:
            self.writer.close()
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)


async def open_streams(
    generation_ids: Sequence[str], *, port: int, raw_key: str
) -> tuple[list[Stream], float]:
    """Connect one stream per id, a few at a time; returns them and the seconds it took."""
    gate = asyncio.Semaphore(CONNECT_CONCURRENCY)
    streams = [Stream(gid) for gid in generation_ids]

    async def connect(stream: Stream) -> None:
        async with gate:
            try:
                async with asyncio.timeout(CONNECT_TIMEOUT_SECONDS):
                    await stream.connect(port, raw_key)
            except (OSError, TimeoutError) as exc:
                stream.error = stream.error or f"connect: {type(exc).__name__}: {exc}"
                await stream.close()

    started = time.monotonic()
    await asyncio.gather(*(connect(stream) for stream in streams))
    return streams, time.monotonic() - started


async def close_streams(streams: Sequence[Stream]) -> None:
    await asyncio.gather(*(stream.close() for stream in streams))


# Phases


@dataclass
class Row:
    """One line of the table."""

    phase: str
    streams: int
    held: int = 0
    setup_s: float | None = None
    sent: int | None = None
    write_s: float | None = None
    delivered: int | None = None
    errors: int = 0
    delays_ms: list[float] = field(default_factory=list)
    events_per_s: float | None = None
    drain_s: float | None = None
    edge_cpu_s: float | None = None
    edge_cpu_pct: float | None = None
    redis_cpu_pct: float | None = None
    client_cpu_pct: float | None = None
    rss_mib: float | None = None
    kib_per_stream: float | None = None
    redis_conns: int | None = None
    postgres_conns: int | None = None
    edge_fds: int | None = None
    edge_threads: int | None = None
    skipped: str = ""
    # Redis and Postgres connections the edge still held after the streams closed, and when
    # that was read (seconds after closing).
    kept_after_close: tuple[int, int, float] | None = None
    error_samples: list[str] = field(default_factory=list)


@dataclass
class Bench:
    """What every phase shares."""

    args: argparse.Namespace
    edge: Edge
    redis: AsyncRedis
    redis_db: int
    postgres: Postgres
    raw_key: str
    generation_ids: list[str]
    fd_limit: int
    load_at_start: str = ""
    started: float = field(default_factory=time.monotonic)
    baseline_rss_kib: int = 0
    baseline_fds: int = 0
    baseline_threads: int = 0
    baseline_redis: int = 0
    baseline_postgres: int = 0
    redis_per_stream: float = 1.0
    postgres_per_stream: float = 1.0
    warm_up_kept: tuple[int, int, float] | None = None


async def reset_streams(redis: AsyncRedis, generation_ids: Sequence[str]) -> None:
    """Each stream holds only its `meta queued` entry, as a freshly queued generation's does."""
    from inference import queue

    meta = entry_fields(StreamEvent.META, {"status": "queued"})
    for start in range(0, len(generation_ids), 1000):
        pipe = redis.pipeline(transaction=False)
        for gid in generation_ids[start : start + 1000]:
            key = queue.stream_key(gid)
            pipe.delete(key)
            pipe.xadd(key, meta)
        await pipe.execute()


async def wait_torn_down(bench: Bench, row: Row | None = None) -> None:
    """Wait until the edge has let go of the closed streams' Redis and Postgres connections,
    or until their counts stop falling; what it keeps is noted on `row` and becomes the new
    baseline, so the next phase counts only its own."""
    started = time.monotonic()
    counts: list[tuple[int, int]] = []
    while True:
        counts.append(
            (
                await redis_clients(bench.redis, bench.redis_db),
                await bench.postgres.bench_connections(),
            )
        )
        redis, postgres = counts[-1]
        if redis <= bench.baseline_redis and postgres <= bench.baseline_postgres:
            break
        settled = len(counts) > TEARDOWN_SETTLED_POLLS and all(
            count == counts[-1] for count in counts[-TEARDOWN_SETTLED_POLLS:]
        )
        if settled or time.monotonic() - started > TEARDOWN_TIMEOUT_SECONDS:
            break
        await asyncio.sleep(0.5)
    if row is not None:
        row.kept_after_close = (
            max(redis - bench.baseline_redis, 0),
            max(postgres - bench.baseline_postgres, 0),
            time.monotonic() - started,
        )
    bench.baseline_redis, bench.baseline_postgres = redis, postgres


async def sample_edge(bench: Bench, row: Row, streams: Sequence[Stream]) -> None:
    """The edge's memory, descriptors and connections above the baseline, with `streams`
    connected."""
    edge = sample_process(bench.edge.pid)
    row.rss_mib = edge.rss_kib / 1024
    still_open = sum(1 for stream in streams if stream.open)
    if still_open:
        row.kib_per_stream = (edge.rss_kib - bench.baseline_rss_kib) / still_open
    row.edge_fds = edge.fds - bench.baseline_fds
    row.edge_threads = edge.threads - bench.baseline_threads
    row.redis_conns = await redis_clients(bench.redis, bench.redis_db) - bench.baseline_redis
    row.postgres_conns = await bench.postgres.bench_connections() - bench.baseline_postgres
    if still_open:
        # A larger step's needs are judged from what this many streams really hold: the
        # warm-up's few streams cannot tell a pool's connections from a stream's own.
        bench.redis_per_stream = max(row.redis_conns, 0) / still_open
        bench.postgres_per_stream = max(row.postgres_conns, 0) / still_open


async def no_room(bench: Bench, count: int) -> str:
    """Why `count` streams must not be opened now, or "" if they may.

    Redis and Postgres are shared: a run that took their last connections would fail other
    people's work, so a step that would come within the reserve is not run.
    """
    from django.conf import settings

    postgres_need = math.ceil(count * bench.postgres_per_stream)
    if settings.DB_POOL_MAX_SIZE:
        # The edge's connections come from its pool, which opens at most this many.
        postgres_need = min(postgres_need, settings.DB_POOL_MAX_SIZE)
    postgres_free = await bench.postgres.free_connections() - POSTGRES_RESERVE
    if postgres_need > postgres_free:
        return (
            f"needs ~{postgres_need:,} Postgres connections ({bench.postgres_per_stream:.2f} "
            f"per stream), the server has {postgres_free:,} free beyond a reserve of "
            f"{POSTGRES_RESERVE}"
        )
    info: dict[str, Any] = await bench.redis.info("clients")
    redis_need = math.ceil(count * bench.redis_per_stream)
    redis_free = int(info["maxclients"]) - int(info["connected_clients"]) - REDIS_RESERVE
    if redis_need > redis_free:
        return (
            f"needs ~{redis_need:,} Redis connections ({bench.redis_per_stream:.2f} per "
            f"stream), Redis has {redis_free:,} free beyond a reserve of {REDIS_RESERVE}"
        )
    per_stream = 1 + bench.redis_per_stream + bench.postgres_per_stream
    fds_free = int((bench.fd_limit - EDGE_FDS_SPARE) / per_stream)
    if count > fds_free:
        return (
            f"would pass the open-file limit {bench.fd_limit}: the edge has room for ~{fds_free:,}"
        )
    return ""


def failures(streams: Sequence[Stream]) -> list[str]:
    return [f"{s.generation_id[:8]}: {s.error}" for s in streams if s.error]


async def measure_idle(bench: Bench, phase: str, count: int) -> tuple[Row, list[Stream]]:
    """Connect `count` streams and hold them idle for two heartbeat periods."""
    ids = bench.generation_ids[:count]
    await reset_streams(bench.redis, ids)
    streams, setup_s = await open_streams(ids, port=bench.edge.port, raw_key=bench.raw_key)
    row = Row(phase=phase, streams=count, setup_s=setup_s)
    meter = Meter(pid=bench.edge.pid, redis=bench.redis)
    await meter.start()
    heartbeats = [stream.heartbeats for stream in streams]
    await asyncio.sleep(hold_seconds(bench.args))
    await meter.stop(row)
    row.held = sum(
        1
        for stream, before in zip(streams, heartbeats, strict=True)
        if stream.open and stream.heartbeats > before
    )
    row.errors = sum(1 for stream in streams if stream.error)
    row.error_samples = failures(streams)[:3]
    await sample_edge(bench, row, streams)
    return row, streams


async def write_deltas(
    redis: AsyncRedis, generation_ids: Sequence[str], *, rate: float, seconds: float
) -> int:
    """XADD a `delta` to every stream `rate` times a second for `seconds`; returns the count.

    Each period is split into one slot per pipeline, so the edge sees a steady flow as it
    would from many generations, not one burst per period.
    """
    from inference import queue

    loop = asyncio.get_running_loop()
    keys = [queue.stream_key(gid) for gid in generation_ids]
    groups = [keys[i : i + WRITE_CHUNK] for i in range(0, len(keys), WRITE_CHUNK)]
    period = 1 / rate
    slot = period / len(groups)
    started = loop.time()
    sent = 0
    for tick in range(round(rate * seconds)):
        for index, group in enumerate(groups):
            wait = started + tick * period + index * slot - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            pipe = redis.pipeline(transaction=False)
            # `t` and `seq` ride along in the payload: the client times and orders each delta.
            delta = entry_fields(StreamEvent.DELTA, {"text": "x", "t": time.time_ns(), "seq": tick})
            for key in group:
                pipe.xadd(key, delta)
            await pipe.execute()
            sent += len(group)
    return sent


async def measure_active(bench: Bench, streams: Sequence[Stream]) -> Row:
    """Stream deltas to every open stream and time their arrival."""
    args = bench.args
    row = Row(phase="active", streams=len(streams))
    for stream in streams:
        stream.reset_counts()
    live = [stream for stream in streams if stream.open]
    meter = Meter(pid=bench.edge.pid, redis=bench.redis)
    await meter.start()
    started = time.monotonic()
    sent = await write_deltas(
        bench.redis,
        [stream.generation_id for stream in live],
        rate=args.rate,
        seconds=args.seconds,
    )
    written = time.monotonic()
    row.write_s = written - started
    per_stream = sent // max(len(live), 1)
    deadline = written + args.drain_timeout
    # Late events are the measurement, so wait for them (a lost one ends the wait at the
    # deadline); a stream that closed has nothing more to deliver.
    while time.monotonic() < deadline:
        if all(not s.open or s.delivered >= per_stream for s in live):
            break
        await asyncio.sleep(0.05)
    finished = time.monotonic()
    await meter.stop(row)

    row.sent = sent
    row.delivered = sum(stream.delivered for stream in live)
    row.held = sum(1 for stream in live if stream.open and stream.delivered == per_stream)
    row.drain_s = finished - written
    row.events_per_s = row.delivered / (finished - started)
    row.delays_ms = [ns / 1e6 for stream in live for ns in stream.delays_ns]
    misordered = sum(stream.misordered for stream in live)
    row.errors = sum(1 for stream in streams if stream.error) + misordered
    row.error_samples = failures(streams)[:3]
    if misordered:
        row.error_samples.append(f"{misordered} events out of order")
    await sample_edge(bench, row, streams)
    return row


async def warm_up(bench: Bench) -> None:
    """Open and close a few streams: imports, pools and threads are in place before the
    baseline is taken, and what one stream holds in Redis and Postgres is known before a
    phase asks for thousands."""
    ids = bench.generation_ids[:WARM_UP_STREAMS]
    await reset_streams(bench.redis, ids)
    if await bench.postgres.free_connections() - POSTGRES_RESERVE < len(ids):
        fail("Postgres has too few free connections for even the warm-up.")
    bench.baseline_redis = await redis_clients(bench.redis, bench.redis_db)
    bench.baseline_postgres = await bench.postgres.bench_connections()
    streams, _ = await open_streams(ids, port=bench.edge.port, raw_key=bench.raw_key)
    broken = failures(streams)
    redis = await redis_clients(bench.redis, bench.redis_db) - bench.baseline_redis
    postgres = await bench.postgres.bench_connections() - bench.baseline_postgres
    await close_streams(streams)
    if broken:
        fail(f"the warm-up streams failed: {broken[:3]}\n{bench.edge.log.read_text()[-3000:]}")
    warm = Row(phase="warm-up", streams=len(ids))
    await wait_torn_down(bench, warm)
    bench.warm_up_kept = warm.kept_after_close
    # What a stream holds is what went away when the streams closed: connections the edge
    # keeps after them (its pools', opened while the streams set up at once) are not theirs.
    kept_redis, kept_postgres, _ = warm.kept_after_close or (0, 0, 0.0)
    bench.redis_per_stream = max(redis - kept_redis, 0) / len(ids)
    bench.postgres_per_stream = max(postgres - kept_postgres, 0) / len(ids)
    await asyncio.sleep(1)
    edge = sample_process(bench.edge.pid)
    bench.baseline_rss_kib, bench.baseline_fds = edge.rss_kib, edge.fds
    bench.baseline_threads = edge.threads


def hold_seconds(args: argparse.Namespace) -> int:
    """Long enough for every idle stream to get at least one heartbeat."""
    return 2 * int(args.heartbeat) + 1


def ramp_step_seconds(args: argparse.Namespace, rows: Sequence[Row], count: int) -> float:
    """About how long an idle step of `count` streams takes: connecting dominates it, at the
    rate the largest step so far connected; the hold and the teardown add seconds."""
    opened = [row for row in rows if row.setup_s and row.held]
    if not opened:
        return 0.0
    largest = max(opened, key=lambda row: row.streams)
    per_stream = (largest.setup_s or 0.0) / largest.held
    return count * per_stream + hold_seconds(args) + 20


async def run_phases(bench: Bench) -> tuple[list[Row], str]:
    args = bench.args
    rows: list[Row] = []
    await warm_up(bench)
    for count in args.streams:
        reason = await no_room(bench, count)
        if reason:
            print(f"{count} streams: not run, {reason}")
            rows += [
                Row(phase="idle", streams=count, skipped=reason),
                Row(phase="active", streams=count, skipped=reason),
            ]
            continue
        print(f"{count} streams: connecting")
        idle, streams = await measure_idle(bench, "idle", count)
        rows.append(idle)
        print(f"  {format_row(idle)}")
        print(f"{count} streams: {args.rate:g} events/s each for {args.seconds:g} s")
        active = await measure_active(bench, streams)
        rows.append(active)
        print(f"  {format_row(active)}")
        await close_streams(streams)
        await wait_torn_down(bench, active)

    stop_reason = "every step held" if args.ramp else "no ramp asked for"
    for count in args.ramp:
        if count > args.max:
            stop_reason = f"the next step, {count:,}, is over --max {args.max:,}"
            break
        reason = await no_room(bench, count)
        if reason:
            stop_reason = f"the next step, {count:,}, was not run: it {reason}"
            break
        estimate = ramp_step_seconds(args, rows, count)
        left = args.budget - (time.monotonic() - bench.started)
        if estimate > left:
            stop_reason = (
                f"the next step, {count:,}, was not run: at the connect rate seen so far it "
                f"would take ~{estimate:.0f} s, and {max(left, 0):.0f} s of --budget are left"
            )
            break
        print(f"ramp: {count} idle streams")
        row, streams = await measure_idle(bench, "ramp idle", count)
        rows.append(row)
        print(f"  {format_row(row)}")
        await close_streams(streams)
        await wait_torn_down(bench, row)
        if row.held < count:
            stop_reason = f"{count - row.held:,} of {count:,} streams did not hold"
            break
    return rows, stop_reason


# Reporting


def number(value: float | None, digits: int = 0) -> str:
    if value is None or math.isnan(value):
        return "-"
    return f"{value:,.{digits}f}"


LEGEND = [
    "held: idle rows, streams open that had a heartbeat during the hold; active rows, streams",
    "  open that got every event sent to them. setup s: time to open them all.",
    "write s: how long the writer took (longer than planned: the offered rate fell short).",
    "delay: from just before the XADD's pipeline was sent to the client's read() of the bytes.",
    "drain s: from the last XADD until every event was in. events/s: delivered over the phase.",
    "CPU%: of one core over the phase (idle rows: over the hold, heartbeats only).",
    "KiB/stream: the edge's RSS above the baseline over the streams open. edge fds, threads,",
    "  Redis conns (this Redis db), PG conns (this database): above the baseline.",
]

HEADERS = [
    "phase",
    "streams",
    "held",
    "setup s",
    "sent",
    "write s",
    "delivered",
    "errors",
    "p50 ms",
    "p99 ms",
    "max ms",
    "drain s",
    "events/s",
    "edge CPU%",
    "Redis CPU%",
    "client CPU%",
    "edge RSS MiB",
    "KiB/stream",
    "edge fds",
    "threads",
    "Redis conns",
    "PG conns",
]


def cells(row: Row) -> list[str]:
    if row.skipped:
        return [row.phase, f"{row.streams:,}", "not run", *["-"] * (len(HEADERS) - 3)]
    delays = row.delays_ms
    return [
        row.phase,
        f"{row.streams:,}",
        f"{row.held:,}",
        number(row.setup_s, 1),
        number(row.sent),
        number(row.write_s, 1),
        number(row.delivered),
        f"{row.errors:,}",
        number(percentile(delays, 50), 1),
        number(percentile(delays, 99), 1),
        number(max(delays) if delays else None, 1),
        number(row.drain_s, 1),
        number(row.events_per_s),
        number(row.edge_cpu_pct),
        number(row.redis_cpu_pct),
        number(row.client_cpu_pct),
        number(row.rss_mib, 1),
        number(row.kib_per_stream, 1),
        number(row.edge_fds),
        number(row.edge_threads),
        number(row.redis_conns),
        number(row.postgres_conns),
    ]


def format_row(row: Row) -> str:
    return "  ".join(f"{h}={c}" for h, c in zip(HEADERS[1:], cells(row)[1:], strict=True))


def load_average() -> str:
    return ", ".join(f"{value:.2f}" for value in os.getloadavg())


def machine() -> str:
    model = "unknown CPU"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    memory_kib = 0
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            memory_kib = int(line.split()[1])
    return (
        f"{model}, {os.cpu_count()} cores, {memory_kib / 1024**2:.1f} GiB RAM, "
        f"Linux {platform.release()}"
    )


def versions(redis_version: str) -> str:
    packages = ", ".join(
        f"{name} {metadata.version(name)}"
        for name in ("Django", "uvicorn", "uvloop", "daphne", "Twisted", "redis")
    )
    return f"Python {platform.python_version()}, {packages}, Redis server {redis_version}"


def last_traceback(log: Path, limit: int = 40) -> list[str]:
    """The last traceback in the edge's log."""
    lines = log.read_text(errors="replace").splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback")]
    return [line[:300] for line in lines[starts[-1] :][:limit]] if starts else []


def code_version() -> str:
    """The commit the edge ran, and whether the working tree differed from it."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],  # noqa: S607 (git from PATH)
            cwd=BASE_DIR,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        changes = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],  # noqa: S607
            cwd=BASE_DIR,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    return f"commit {commit}" + (
        f" with {len(changes)} changed tracked files (work in progress)" if changes else ""
    )


def report(bench: Bench, rows: Sequence[Row], *, stop_reason: str, redis_version: str) -> str:
    from django.conf import settings

    args = bench.args
    database = settings.DATABASES["default"]["NAME"]
    # As run from the checkout: no path of the machine it ran on.
    python = Path(sys.executable)
    if python.is_relative_to(BASE_DIR):
        python = python.relative_to(BASE_DIR)
    argv: list[str] = []
    for arg in sys.argv:
        if argv and argv[-1] == "--results-dir":
            argv.pop()  # the folder is this machine's
        elif not arg.startswith("--results-dir="):
            argv.append(arg)
    command = shlex.join([str(python), *argv])
    held = [row.held for row in rows if row.phase != "active" and row.held == row.streams]
    lines = [
        f"Edge streams: one {args.server} edge process serving GET /api/v1/generations/<id>/stream",
        f"Date: {datetime.now(UTC):%Y-%m-%d %H:%M:%S} UTC",
        f"Machine: {machine()}",
        f"Load average (1, 5, 15 min): {bench.load_at_start} at start, {load_average()} at end",
        f"Software: {versions(redis_version)}",
        f"Code: {code_version()}",
        f"Command: DATABASE_URL=.../{database} REDIS_URL={settings.REDIS_URL} {command}",
        (
            f"Parameters: streams {', '.join(map(str, args.streams))}; {args.rate:g} delta "
            f"events/s per stream for {args.seconds:g} s, written in pipelines of "
            f"{WRITE_CHUNK}; heartbeat {args.heartbeat} s; idle hold "
            f"{hold_seconds(args)} s; ramp {', '.join(map(str, args.ramp)) or '-'} "
            f"(--max {args.max}); open-file limit {bench.fd_limit}"
        ),
        (
            f"Baseline (no stream, after warm-up): the edge's RSS "
            f"{bench.baseline_rss_kib / 1024:.1f} MiB, {bench.baseline_fds} fds, "
            f"{bench.baseline_threads} threads. "
            f"Each of {WARM_UP_STREAMS} warm-up streams held {bench.redis_per_stream:.2f} "
            f"Redis and {bench.postgres_per_stream:.2f} Postgres connections"
            + (
                f"; after they closed the edge still held {bench.warm_up_kept[0]} Redis and "
                f"{bench.warm_up_kept[1]} Postgres connections (the new baseline)."
                if bench.warm_up_kept and any(bench.warm_up_kept[:2])
                else "."
            )
        ),
        "",
        render(HEADERS, [cells(row) for row in rows]),
        "",
        *LEGEND,
        f"Streams were opened {CONNECT_CONCURRENCY} at a time; the writer was to take "
        f"{args.seconds:g} s.",
        "",
        f"Largest idle count that all held: {max(held):,}." if held else "No count held.",
        f"Ramp: {stop_reason}.",
    ]
    for row in rows:
        if row.kept_after_close and any(row.kept_after_close[:2]):
            redis, postgres, after = row.kept_after_close
            lines.append(
                f"After closing {row.streams:,} streams, the edge still held {redis:,} Redis and "
                f"{postgres:,} Postgres connections {after:.0f} s later."
            )
    for row in rows:
        if row.skipped and row.phase == "idle":
            lines.append(f"{row.streams:,} streams not run: it {row.skipped}.")
    for row in rows:
        if row.phase == "active" and row.edge_cpu_s and row.delivered:
            per_event_us = 1e6 * row.edge_cpu_s / row.delivered
            events_per_core = 1e6 / per_event_us
            lines.append(
                f"Active {row.streams:,}: the edge spent {per_event_us:,.0f} us of CPU per "
                f"delivered event; one core at that cost: {events_per_core:,.0f} events/s, "
                f"i.e. {events_per_core / args.rate:,.0f} streams at {args.rate:g} events/s."
            )
    for row in rows:
        for sample in row.error_samples:
            lines.append(f"error ({row.phase} {row.streams}): {sample}")
    tracebacks = bench.edge.log.read_text(errors="replace").count("Traceback")
    if tracebacks:
        lines.append(f"The edge logged {tracebacks:,} tracebacks; the last:")
        lines += [f"  {line}" for line in last_traceback(bench.edge.log)]
    return "\n".join(lines) + "\n"


# Entry point


def parse_counts(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0] if __doc__ else "")
    parser.add_argument(
        "--streams",
        type=parse_counts,
        default=[100, 1000],
        help="stream counts for the idle and active phases (default: 100,1000)",
    )
    parser.add_argument(
        "--rate", type=float, default=20.0, help="delta events/s per stream (default: 20)"
    )
    parser.add_argument(
        "--seconds", type=float, default=10.0, help="length of each active phase (default: 10)"
    )
    parser.add_argument(
        "--heartbeat",
        type=int,
        default=2,
        help="the edge's STREAM_HEARTBEAT_SECONDS; idle phases hold two of them (default: 2)",
    )
    parser.add_argument(
        "--ramp",
        type=parse_counts,
        default=[2000, 4000, 8000],
        help="idle stream counts to try after the phases, in order (default: 2000,4000,8000)",
    )
    parser.add_argument(
        "--max", type=int, default=8000, help="the most streams the ramp opens (default: 8000)"
    )
    parser.add_argument(
        "--drain-timeout",
        type=float,
        default=60.0,
        help="seconds to wait for late events after the last XADD (default: 60)",
    )
    parser.add_argument(
        "--budget",
        type=float,
        default=600.0,
        help="seconds the whole run may take: a ramp step that would not fit is not run "
        "(default: 600)",
    )
    parser.add_argument(
        "--server",
        choices=SERVERS,
        default="uvicorn",
        help="the edge's server: the project's (uvicorn, `chatsite.edge`) or Daphne, which "
        "served the edge before, to compare (default: uvicorn)",
    )
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    if not args.streams or min(args.streams) < 1 or args.rate <= 0 or args.seconds <= 0:
        parser.error("--streams, --rate and --seconds must be positive")
    return args


async def run(
    args: argparse.Namespace,
    *,
    edge: Edge,
    raw_key: str,
    ids: list[str],
    load_at_start: str,
    started: float,
) -> str:
    from chatsite.redis import async_redis

    redis = async_redis()
    postgres = await Postgres.connect()
    try:
        bench = Bench(
            args=args,
            edge=edge,
            redis=redis,
            redis_db=int(redis.connection_pool.connection_kwargs.get("db", 0)),
            postgres=postgres,
            raw_key=raw_key,
            generation_ids=ids,
            fd_limit=resource.getrlimit(resource.RLIMIT_NOFILE)[0],
            load_at_start=load_at_start,
            started=started,
        )
        server: dict[str, Any] = await redis.info("server")
        rows, stop_reason = await run_phases(bench)
        return report(
            bench, rows, stop_reason=stop_reason, redis_version=str(server["redis_version"])
        )
    finally:
        await redis.aclose()
        await postgres.connection.close()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    started = time.monotonic()
    load_at_start = load_average()
    raise_fd_limit()
    bootstrap()
    prepare_stores()
    needed = max([*args.streams, *(n for n in args.ramp if n <= args.max), 10])
    print(f"creating {needed:,} generations")
    created = time.monotonic()
    raw_key, ids = create_generations(needed)
    print(f"  done in {time.monotonic() - created:.1f} s")
    with tempfile.TemporaryDirectory(prefix="edge-streams-") as log_dir:
        edge = start_edge(Path(log_dir), heartbeat=args.heartbeat, server=args.server)
        try:
            text = asyncio.run(
                run(
                    args,
                    edge=edge,
                    raw_key=raw_key,
                    ids=ids,
                    load_at_start=load_at_start,
                    started=started,
                )
            )
        except BaseException:
            print(f"The edge's log:\n{edge.log.read_text()[-3000:]}", file=sys.stderr)
            raise
        finally:
            stop_edge(edge)
    print()
    print(text, end="")
    path = write_result(args.results_dir, "edge_streams", text)
    print(f"\nwritten to {path.relative_to(BASE_DIR) if path.is_relative_to(BASE_DIR) else path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
