"""CPU the service's own processes spend per chat message, on a multi-turn conversation trace.

A trace of `--conversations` conversations of `--turns` turns goes through the conversation
API as the web page uses it, with the user's API key (so the conversations are API ones: the
search-index task that a web conversation's answer may queue does not run; nor does the trace
hold the page's `/api/v1/events/stream` open or reload the sidebar). Each conversation is
created first (`POST /api/v1/conversations`) with one of `--system-prompts` shared system
prompts of about 530 tokens (a random tag of this run at their head, so no run finds another's
blocks in the workers' prefix caches); then each turn posts a message (`POST .../messages`),
reads its answer's Server-Sent Events (`GET /api/v1/generations/<id>/stream`) to the `done`
event, waits `--think` seconds and sends the next. Conversation i arrives at i / `--arrival`
seconds and starts once fewer than `--concurrency` are active.

The service is started here: `--edges` edge processes (`chatsite.edge`), one scheduler
(`manage.py run_scheduler`) and a Celery worker (`celery -A chatsite worker --concurrency 2`,
no beat, `DB_POOL_MAX_SIZE=0` as in the Procfile), in front of the given vLLM workers. CPU
time (user + system, from /proc) is read per kind of process: the edges, the scheduler and
Celery each with every process under them (Celery's prefork children live as long as it
does, so their parent's counters never hold them), and every `postgres` and `redis-server`
process on the machine (shared servers: any other load on them counts too). After a warm-up
conversation per edge, `--idle` seconds without traffic are measured; then the trace, until
its last answer and then until Celery has no task left (the titles it queued). CPU per
completed message is reported raw and minus each kind's idle rate over the trace's time.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/chatsite_cpu_bench \\
    REDIS_URL=redis://127.0.0.1:6379/14 SECRET_KEY=x HF_HUB_OFFLINE=1 \\
    .venv/bin/python benchmarks/cpu_per_message.py --workers http://127.0.0.1:8201

It uses its own database (created and migrated if missing; the name must contain "bench") and
its own Redis database (never db 0; flushed at start; also Celery's broker), prints the
tables and writes them to benchmarks/results/cpu_per_message-<UTC date-time>.txt (`--results`
names another folder).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import itertools
import json
import os
import platform
import secrets
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import (  # noqa: E402
    django_start,
    edge_command,
    free_port,
    percentile,
    prepare_stores,
    render,
    service_env,
    write_result,
)
from benchmarks.openai_api import ms, prepare, start, stop, wait_up  # noqa: E402
from benchmarks.overhead import (  # noqa: E402
    CELERY_COMMAND,
    celery_ready,
    children_by_parent,
    cpu_seconds,
    pids_named,
    sse_events,
    with_descendants,
)
from benchmarks.scheduler_affinity import POLICY_LINES, SYSTEM_HEAD, turn_content  # noqa: E402
from chatsite.stream_events import TERMINAL_EVENTS, StreamEvent  # noqa: E402

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/chatsite_cpu_bench"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/14"
KINDS = ("edge", "scheduler", "celery", "postgres", "redis")
SYSTEM_TOKENS = 530
TARGET_MS = 30  # CPU per message the issue asks for
# The done event's status of a finished answer (Generation.Status.COMPLETE).
COMPLETE = "complete"
# kombu's Redis transport: tasks wait in a list named after their queue, and a task taken
# but not yet acknowledged (acks_late) waits in this hash.
CELERY_QUEUE, CELERY_UNACKED = "celery", "unacked"
CELERY_DRAIN_SECONDS = 120


# The service's processes and their CPU


@dataclass
class Processes:
    """The pids of the processes this script started, by kind."""

    edges: list[int]
    scheduler: int
    celery: int


def service_pids(processes: Processes) -> dict[str, list[int]]:
    """Every process of each kind, now. A child that exited and was waited for is in its
    parent's counters (`cpu_seconds` adds them), so a process tree's sum loses nothing."""
    children = children_by_parent()
    return {
        "edge": with_descendants(processes.edges, children),
        "scheduler": with_descendants([processes.scheduler], children),
        "celery": with_descendants([processes.celery], children),
        "postgres": pids_named("postgres"),
        "redis": pids_named("redis-server"),
    }


Reading = tuple[float, dict[str, float]]


def reading(processes: Processes) -> Reading:
    """The monotonic clock and each kind's CPU seconds so far."""
    pids = service_pids(processes)
    return time.monotonic(), {kind: sum(map(cpu_seconds, found)) for kind, found in pids.items()}


@dataclass
class Span:
    """CPU seconds per kind of process over a stretch of wall time."""

    seconds: float
    cpu: dict[str, float]

    @classmethod
    def between(cls, before: Reading, after: Reading) -> Span:
        return cls(after[0] - before[0], {kind: after[1][kind] - before[1][kind] for kind in KINDS})


# Celery


def celery_tasks() -> collections.Counter[str] | None:
    """How many of each task the worker has run so far (None if it does not answer)."""
    from chatsite.celery import app

    replies = app.control.inspect(timeout=2.0).stats()
    if not replies:
        return None
    counts: collections.Counter[str] = collections.Counter()
    for stats in replies.values():
        counts.update(stats.get("total") or {})
    return counts


async def celery_drained(*, settle: float = 1.0) -> bool:
    """Until no task has waited or run for `settle` seconds (a title is queued as its answer
    finishes, so just after the client saw `done`); False after CELERY_DRAIN_SECONDS."""
    from django.conf import settings
    from redis.asyncio import Redis

    broker = Redis.from_url(settings.CELERY_BROKER_URL)
    quiet_since: float | None = None
    deadline = time.monotonic() + CELERY_DRAIN_SECONDS
    try:
        while time.monotonic() < deadline:
            waiting = await broker.llen(CELERY_QUEUE) + await broker.hlen(CELERY_UNACKED)
            now = time.monotonic()
            if waiting:
                quiet_since = None
            elif quiet_since is None:
                quiet_since = now
            elif now - quiet_since >= settle:
                return True
            await asyncio.sleep(0.25)
    finally:
        await broker.aclose()
    return False


# The trace


@dataclass
class Turn:
    """One message of the trace as the client saw it."""

    number: int
    post: float | None = None
    ttft: float | None = None
    status: str = ""
    tokens: int = 0
    error: str | None = None

    @property
    def completed(self) -> bool:
        return self.error is None and self.status == COMPLETE


@dataclass
class Trace:
    turns: list[Turn] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)  # conversations that could not start


def api_client(base_url: str, raw_key: str) -> httpx.AsyncClient:
    """The conversation API as the user's key sees it, with no cap on connections (each
    active conversation holds a stream open)."""
    return httpx.AsyncClient(
        base_url=base_url,
        headers={"Authorization": f"Bearer {raw_key}"},
        timeout=httpx.Timeout(600, connect=10),
        limits=httpx.Limits(max_connections=None, max_keepalive_connections=None),
    )


async def conversation_create(client: httpx.AsyncClient, system_prompt: str) -> str:
    created = await client.post("/api/v1/conversations", json={"system_prompt": system_prompt})
    created.raise_for_status()
    return str(created.json()["id"])


async def turn_send(client: httpx.AsyncClient, conversation_id: str, turn: Turn, text: str) -> None:
    """Post `text` and read its answer's stream to the end, timing both into `turn`."""
    sent_at = time.perf_counter()
    try:
        posted = await client.post(
            f"/api/v1/conversations/{conversation_id}/messages", json={"content": text}
        )
        turn.post = time.perf_counter() - sent_at
        if posted.status_code != 201:
            turn.error = f"POST answered {posted.status_code}: {posted.text[:150]}"
            return
        url = posted.json()["generation"]["stream_url"]
        async with client.stream("GET", url) as stream:
            stream.raise_for_status()
            async for name, data in sse_events(stream):
                if name == StreamEvent.DELTA and turn.ttft is None:
                    turn.ttft = time.perf_counter() - sent_at
                elif name == StreamEvent.ERROR:
                    turn.error = f"error event: {data}"[:200]
                elif name in TERMINAL_EVENTS:
                    done = json.loads(data)
                    turn.status = str(done.get("status") or "")
                    turn.tokens = int(done.get("output_tokens") or 0)
                    return
    except (httpx.HTTPError, KeyError, ValueError) as exc:
        turn.error = f"{type(exc).__name__}: {exc}"[:200]
        return
    turn.error = turn.error or "the stream ended without a done event"


async def run_trace(
    args: argparse.Namespace, clients: Sequence[httpx.AsyncClient], prompts: Sequence[str]
) -> Trace:
    trace = Trace()
    active = asyncio.Semaphore(args.concurrency)
    began = time.perf_counter()

    async def conversation(index: int) -> None:
        await asyncio.sleep(max(0.0, began + index / args.arrival - time.perf_counter()))
        async with active:
            client = clients[index % len(clients)]
            try:
                conversation_id = await conversation_create(client, prompts[index % len(prompts)])
            except (httpx.HTTPError, KeyError, ValueError) as exc:
                trace.failures.append(f"conversation {index}: {type(exc).__name__}: {exc}"[:200])
                return
            for number in range(args.turns):
                if number:
                    await asyncio.sleep(args.think)
                turn = Turn(number=number)
                trace.turns.append(turn)
                await turn_send(client, conversation_id, turn, turn_content(index, number))
                if not turn.completed:
                    return  # a next turn would answer a broken history

    await asyncio.gather(*(conversation(index) for index in range(args.conversations)))
    return trace


@dataclass
class Measured:
    """The trace, the CPU of the idle stretch and of the trace, and what Celery ran."""

    trace: Trace
    idle: Span
    busy: Span
    answered: float  # seconds from the trace's start to its last answer
    drained: bool
    tasks: collections.Counter[str] | None
    processes: dict[str, int]
    # The warm-up turn of each edge: a fresh process's first message (untimed in the tables).
    first: list[Turn] = field(default_factory=list)


async def measure(
    args: argparse.Namespace,
    processes: Processes,
    edge_urls: Sequence[str],
    raw_key: str,
    prompts: Sequence[str],
) -> Measured:
    async with contextlib.AsyncExitStack() as stack:
        clients = [api_client(url, raw_key) for url in edge_urls]
        for client in clients:
            stack.push_async_callback(client.aclose)
        # One untimed answer per edge, with a prompt of its own: first connections, lazy
        # imports and a first title task are paid for before anything is measured.
        first = []
        for client in clients:
            warm = Turn(number=0)
            first.append(warm)
            await turn_send(client, await conversation_create(client, "Be brief."), warm, "Hi!")
            if not warm.completed:
                raise SystemExit(f"The warm-up turn failed: {warm.error or warm.status}")
        await celery_drained()
        tasks_before = await asyncio.to_thread(celery_tasks)

        print(f"warm; measuring {args.idle:.0f} s idle", flush=True)
        idle_start = reading(processes)
        await asyncio.sleep(args.idle)
        idle_end = busy_start = reading(processes)
        print("trace: started", flush=True)
        trace = await run_trace(args, clients, prompts)
        print("trace: answered; waiting for Celery", flush=True)
        answered = time.monotonic() - busy_start[0]
        drained = await celery_drained()
        busy_end = reading(processes)
    counts = {kind: len(pids) for kind, pids in service_pids(processes).items()}
    tasks_after = await asyncio.to_thread(celery_tasks)
    return Measured(
        trace=trace,
        idle=Span.between(idle_start, idle_end),
        busy=Span.between(busy_start, busy_end),
        answered=answered,
        drained=drained,
        tasks=None if tasks_before is None or tasks_after is None else tasks_after - tasks_before,
        processes=counts,
        first=first,
    )


# The report


def per_message(seconds: float, messages: int) -> str:
    return f"{seconds * 1000 / messages:.1f}" if messages else "-"


def message_table(trace: Trace, turns: int) -> str:
    groups = [(f"turn {n + 1}", [t for t in trace.turns if t.number == n]) for n in range(turns)]
    rows = []
    for label, group in [*groups, ("all", trace.turns)]:
        posts = [t.post for t in group if t.post is not None]
        ttfts = [t.ttft for t in group if t.completed and t.ttft is not None]
        completed = sum(t.completed for t in group)
        rows.append(
            [
                label,
                str(len(group)),
                str(completed),
                str(len(group) - completed),
                *(ms(percentile(posts, q)) for q in (50, 99)),
                *(ms(percentile(ttfts, q)) for q in (50, 99)),
            ]
        )
    headers = ["messages", "sent", "completed", "errors", "POST p50 ms", "POST p99 ms"]
    return render([*headers, "TTFT p50 ms", "TTFT p99 ms"], rows)


def cpu_table(measured: Measured) -> tuple[str, float, float]:
    """CPU per kind of process and per completed message; with the total CPU seconds of the
    trace, raw and minus idle."""
    idle, busy = measured.idle, measured.busy
    completed = sum(t.completed for t in measured.trace.turns)
    rows, raw_total, net_total = [], 0.0, 0.0
    for kind in KINDS:
        rate = idle.cpu[kind] / idle.seconds if idle.seconds > 0 else 0.0
        net = busy.cpu[kind] - rate * busy.seconds
        raw_total, net_total = raw_total + busy.cpu[kind], net_total + net
        rows.append(
            [
                kind,
                str(measured.processes[kind]),
                f"{idle.cpu[kind]:.2f}",
                f"{rate * 1000:.1f}",
                f"{busy.cpu[kind]:.2f}",
                per_message(busy.cpu[kind], completed),
                per_message(net, completed),
            ]
        )
    idle_total = sum(idle.cpu.values())
    rows.append(
        [
            "total",
            str(sum(measured.processes.values())),
            f"{idle_total:.2f}",
            f"{idle_total * 1000 / idle.seconds:.1f}" if idle.seconds > 0 else "-",
            f"{raw_total:.2f}",
            per_message(raw_total, completed),
            per_message(net_total, completed),
        ]
    )
    headers = ["process", "processes", "idle CPU s", "idle CPU ms/s", "trace CPU s"]
    text = render([*headers, "CPU ms/message", "CPU ms/message minus idle"], rows)
    return text, raw_total, net_total


def celery_line(tasks: collections.Counter[str] | None) -> str:
    if tasks is None:
        return "Celery tasks during the trace: unknown (the worker did not answer `inspect`)"
    ran = ", ".join(f"{name} x{count}" for name, count in sorted(tasks.items()))
    return f"Celery tasks during the trace: {ran or 'none'}"


def command_line() -> str:
    """How this run was started, without this machine's paths: no --results folder, the
    interpreter relative to the checkout, the database and Redis db by name only."""
    from django.conf import settings

    kept: list[str] = []
    arguments = iter(sys.argv[1:])
    for argument in arguments:
        if argument == "--results":
            next(arguments, None)
        elif not argument.startswith("--results="):
            kept.append(argument)
    python = Path(sys.executable)
    interpreter = str(python.relative_to(ROOT)) if python.is_relative_to(ROOT) else "python"
    database = settings.DATABASES["default"]["NAME"]
    redis_db = settings.REDIS_URL.rstrip("/").rsplit("/", 1)[-1]
    return f"DATABASE_URL=.../{database} REDIS_URL=.../{redis_db} " + shlex.join(
        [interpreter, "benchmarks/cpu_per_message.py", *kept]
    )


def first_line(first: Sequence[Turn]) -> str:
    """The warm-up turns: what a fresh edge process's first message cost its user."""
    posts = ", ".join(f"{t.post * 1000:.0f}" for t in first if t.post is not None)
    ttfts = ", ".join(f"{t.ttft * 1000:.0f}" for t in first if t.ttft is not None)
    return (
        f"first message on each fresh edge (the warm-up, not in the tables): POST {posts} ms, "
        f"TTFT {ttfts} ms"
    )


def report(args: argparse.Namespace, measured: Measured, served: str, tokens: list[int]) -> str:
    trace = measured.trace
    completed = [t for t in trace.turns if t.completed]
    cpu, raw, net = cpu_table(measured)
    mean_tokens = sum(t.tokens for t in completed) / len(completed) if completed else 0.0
    drained = (
        f"Celery idle again after {measured.busy.seconds:.1f} s"
        if measured.drained
        else f"Celery still busy after {measured.busy.seconds:.1f} s (what it did later is not "
        "counted)"
    )
    problems = [
        *trace.failures,
        *(f"turn {t.number + 1}: {t.error or t.status}" for t in trace.turns if not t.completed),
    ]
    lines = [
        f"cpu_per_message benchmark, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, "
        f"{os.cpu_count()} CPUs; workers {', '.join(args.workers)} ({served}); {args.edges} "
        "edge process(es), 1 scheduler, 1 Celery worker (prefork, concurrency 2)",
        f"command: {command_line()}",
        f"trace: {args.conversations} conversations x {args.turns} turns, at most "
        f"{args.concurrency} active, {args.arrival:g} new per s, think {args.think:g} s, "
        f"max_tokens {args.max_tokens}; {len(tokens)} shared system prompts of "
        f"{min(tokens)}-{max(tokens)} tokens; answers averaged {mean_tokens:.1f} output tokens",
        f"time: {measured.idle.seconds:.1f} s idle first; the trace's last answer after "
        f"{measured.answered:.1f} s, {drained}",
        f"{len(completed)}/{len(trace.turns)} messages completed "
        f"({args.conversations * args.turns} planned)",
        first_line(measured.first),
        "",
        message_table(trace, args.turns),
        "",
        cpu,
        "",
        f"CPU per completed message, all five kinds: {per_message(raw, len(completed))} ms, "
        f"{per_message(net, len(completed))} ms minus idle (target <= {TARGET_MS} ms)",
        celery_line(measured.tasks),
        "\n".join(["errors:", *problems[:10]]) if problems else "errors: none",
    ]
    return "\n".join(lines)


# Setup


def system_prompts(count: int, tag: str) -> tuple[list[str], list[int]]:
    """`count` system prompts of about SYSTEM_TOKENS tokens, each headed by this run's `tag`
    and its number (so they share no prefix), with their lengths in tokens."""
    from django.conf import settings

    from inference.tokens import count_tokens, load_tokenizer

    tokenizer = load_tokenizer(str(settings.MODEL_DIR))
    texts, lengths = [], []
    for desk in range(count):
        text = f"Run {tag}, desk {desk + 1}. {SYSTEM_HEAD}"
        rules = itertools.cycle([*POLICY_LINES[desk:], *POLICY_LINES[:desk]])
        for number in itertools.count(1):
            if (length := count_tokens(tokenizer, text)) >= SYSTEM_TOKENS:
                break
            text += f" Rule {number}: {next(rules)}"
        texts.append(text)
        lengths.append(length)
    return texts, lengths


def launch(
    args: argparse.Namespace, logs: Path, started: dict[str, subprocess.Popen[bytes]]
) -> list[int]:
    """Start the edges, the scheduler and the Celery worker into `started` (so that whoever
    stops them finds every one, even if a later one fails); returns the edges' ports."""
    env = service_env()
    ports = [free_port() for _ in range(args.edges)]
    commands = {f"edge-{port}": edge_command(port) for port in ports}
    commands["scheduler"] = [
        sys.executable,
        "manage.py",
        "run_scheduler",
        "--replica-id",
        "cpu-bench",
    ]
    commands["celery"] = [str(Path(sys.executable).parent / "celery"), *CELERY_COMMAND]
    for name, command in commands.items():
        # Celery's prefork children must not inherit a connection pool (see the Procfile).
        extra = {"DB_POOL_MAX_SIZE": "0"} if name == "celery" else {}
        started[name] = start(command, logs / f"{name}.log", {**env, **extra})
    return ports


def worker_urls(text: str) -> list[str]:
    return [url.strip().rstrip("/") for url in text.split(",") if url.strip()]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "--workers",
        type=worker_urls,
        default=worker_urls(os.environ.get("CHATSITE_E2E_WORKER_URLS", "")),
        help="comma-separated URLs of running vLLM workers (default: CHATSITE_E2E_WORKER_URLS)",
    )
    parser.add_argument("--conversations", type=int, default=40)
    parser.add_argument("--turns", type=int, default=4, help="messages per conversation")
    parser.add_argument("--concurrency", type=int, default=16, help="conversations at once")
    parser.add_argument("--think", type=float, default=1.0, help="seconds from answer to turn")
    parser.add_argument("--arrival", type=float, default=2.0, help="new conversations per second")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--system-prompts", type=int, default=4, help="shared system prompts")
    parser.add_argument("--idle", type=float, default=10.0, help="seconds measured without traffic")
    parser.add_argument("--edges", type=int, default=1, help="edge processes to start")
    parser.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)
    if not args.workers:
        parser.error("give the workers: --workers URL[,URL] (or CHATSITE_E2E_WORKER_URLS)")
    counts = (args.conversations, args.turns, args.concurrency, args.system_prompts, args.edges)
    if min(counts) < 1 or args.arrival <= 0 or args.idle <= 0 or args.think < 0:
        parser.error("counts must be at least 1, --arrival and --idle above 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    # SIGTERM as SystemExit, so that the `finally` below stops what was started.
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    django_start(database_url=DEFAULT_DATABASE_URL, redis_url=DEFAULT_REDIS_URL)
    prepare_stores()
    from django.conf import settings
    from django.db import connections

    from chatsite.catalog import catalog_changed
    from inference.models import ModelPool

    served = httpx.get(f"{args.workers[0]}/v1/models", timeout=10).json()["data"][0]["id"]
    raw_key = prepare(args.workers, served)
    # The conversation API takes no max_tokens: the pool's cap sets the answers' length.
    ModelPool.objects.filter(name=settings.DEFAULT_MODEL).update(max_output_tokens=args.max_tokens)
    catalog_changed()  # update() sends no signal
    prompts, tokens = system_prompts(args.system_prompts, secrets.token_hex(4))
    connections.close_all()

    logs = Path(tempfile.mkdtemp(prefix="cpu-bench-"))
    started: dict[str, subprocess.Popen[bytes]] = {}
    try:
        ports = launch(args, logs, started)
        for port in ports:
            name = f"edge-{port}"
            wait_up(f"http://127.0.0.1:{port}/v1/models", started[name], logs / f"{name}.log")
        celery_ready(started["celery"], logs / "celery.log")
        processes = Processes(
            edges=[started[f"edge-{port}"].pid for port in ports],
            scheduler=started["scheduler"].pid,
            celery=started["celery"].pid,
        )
        edge_urls = [f"http://127.0.0.1:{port}" for port in ports]
        measured = asyncio.run(measure(args, processes, edge_urls, raw_key, prompts))
    finally:
        for process in started.values():
            stop(process)
    text = report(args, measured, served, tokens)
    print(text)
    path = write_result(args.results, "cpu_per_message", text)
    print(f"\nwritten to {path}; logs in {logs}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
