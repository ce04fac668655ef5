"""Faults under load, with real processes: what a user sees when a worker, a scheduler replica,
an edge, Redis or Postgres goes away mid-answer.

The script starts a service of its own (`benchmarks/stack.py`): a Postgres cluster and a Redis
server (append-only file) on free ports in a temporary folder, the migrations, two edges
(`python -m chatsite.edge`), two scheduler replicas (`manage.py run_scheduler`) and the
workers: two real vLLM CPU workers by default (`--workers vllm`, `manage.py run_worker`, one
core each), the suite's stand-in (`--workers fake`, `inference/tests/fake_worker.py`, each a
process of its own) or workers already running (`--worker-urls`; the worker phase is then
skipped, since they are not ours to kill). `--celery` adds a Celery worker with its beat (the
stale-generation sweeper, usage reconciliation).

Then, phase by phase (`--phases`), a steady set of clients (`benchmarks/traffic.py`):
`--clients` users of the conversation API (send with an Idempotency-Key, stream the answer's
Server-Sent Events, resume with Last-Event-ID on the other edge after a drop) and
`--v1-clients` users of streamed `/v1/chat/completions` (retried with the same
Idempotency-Key after a drop), each sending again `--think` seconds after an answer. After
`--lead` seconds, once answers are running on the workers, the phase's fault:

- `none`: nothing (the control);
- `worker`: SIGKILL to the worker process group holding the most leases;
- `scheduler`: SIGKILL to the replica owning the most answers;
- `edge`: SIGKILL to the edge most clients are connected to;
- `redis`: SIGKILL to redis-server, `--redis-down` seconds, then started again on its AOF;
- `postgres`: `pg_ctl stop -m fast`, `--postgres-down` seconds (default 3), started again;
  with `--postgres-down 0` a plain `pg_ctl restart -m fast` (`--postgres-restart immediate`:
  no shutdown checkpoint, crash recovery on start, as after a kill).

Sends go on for `--after` seconds, then each answer has until `--deadline` seconds after its
send to reach a final state. A killed process is started again once the phase's answers are
over (a worker at its address, a replica under a new id, an edge on its port).

Per phase and door (conversations, v1-stream), from the client's view checked against the
database: answers sent; completed; restarted (a `restart` event was seen); failed visibly (an
`error` event, a final status other than complete, an error chunk, or a send refused);
stuck (no final state within the deadline, for the client or in Postgres: must be 0); user
messages lost (the service took a message that is not in the database: must be 0);
duplicated (a message stored twice for one send); answers charged twice (usage ledger rows
per generation above 1: must be 0); uncharged (a final answer that used tokens, without a
ledger row); text mismatch (complete, but what was streamed is not what was stored). Below
the table: each answer that did not complete, and the warnings each process logged during
the phase.

    SECRET_KEY=x .venv/bin/python benchmarks/chaos.py --workers vllm
    SECRET_KEY=x .venv/bin/python benchmarks/chaos.py --workers fake --phases worker,scheduler

It prints the table and writes it to benchmarks/results/chaos-<UTC date-time>.txt, with every
answer in .json beside it. Every process it started is stopped at the end, even on error.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import platform
import random
import secrets
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import render  # noqa: E402
from benchmarks.stack import (  # noqa: E402
    Process,
    Stack,
    StackConfig,
    log_lines,
    make_users,
    notable,
    prepare_fleet,
)
from benchmarks.traffic import (  # noqa: E402
    Answer,
    Edges,
    Verdict,
    check_answers,
    conversation_turn,
    create_conversation,
    v1_turn,
)

PHASES = ("none", "worker", "scheduler", "edge", "redis", "postgres")
QUESTIONS = (
    "Tell me a short story about a lighthouse keeper.",
    "Explain how a bicycle stays upright.",
    "Describe a busy market in the morning.",
    "Write a few lines about the sea in winter.",
    "How does bread rise? Explain step by step.",
    "Describe the life of a honeybee.",
)
COLUMNS = (
    "answers",
    "completed",
    "restarted",
    "failed",
    "stuck",
    "lost",
    "duplicated",
    "charged twice",
    "uncharged",
    "text mismatch",
)


@dataclass
class PhaseResult:
    """One phase: its fault, its answers and their verdicts, what the processes logged."""

    phase: str
    fault: str = ""
    fault_at_s: float | None = None  # after the phase's first send
    recovery: str = ""
    answers: list[Answer] = field(default_factory=list)
    verdicts: list[Verdict] = field(default_factory=list)
    logged: dict[str, list[str]] = field(default_factory=dict)
    died: list[str] = field(default_factory=list)  # processes that exited unasked
    error: str = ""


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--workers", choices=("vllm", "fake"), default="vllm")
    parser.add_argument("--worker-count", type=int, default=2)
    parser.add_argument(
        "--worker-urls", default="", help="comma-separated URLs of running workers to use"
    )
    parser.add_argument("--phases", default=",".join(PHASES), help=f"of {', '.join(PHASES)}")
    add_traffic_arguments(parser)
    parser.add_argument("--redis-down", type=float, default=3.0)
    parser.add_argument("--postgres-restart", choices=("fast", "immediate"), default="fast")
    parser.add_argument(
        "--postgres-down", type=float, default=3.0, help="seconds stopped (0: pg_ctl restart)"
    )
    parser.add_argument(
        "--celery", action="store_true", help="also a Celery worker with beat (the sweeper)"
    )
    args = parser.parse_args(argv)
    check_traffic_arguments(parser, args, PHASES)
    args.urls = [u.strip().rstrip("/") for u in args.worker_urls.split(",") if u.strip()]
    return args


def add_traffic_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of the clients, their phases, the stand-in workers and the results, which
    every benchmark running phases on a `Stack` shares (this one, `multihost.py`)."""
    parser.add_argument("--clients", type=int, default=4, help="conversation API users")
    parser.add_argument("--v1-clients", type=int, default=2, help="streamed /v1 users")
    parser.add_argument("--turns", type=int, default=3, help="turns per conversation")
    parser.add_argument("--think", type=float, default=0.5, help="most seconds between sends")
    parser.add_argument("--lead", type=float, default=6.0, help="seconds before the fault")
    parser.add_argument("--after", type=float, default=12.0, help="seconds of sends after it")
    parser.add_argument("--deadline", type=float, default=180.0, help="seconds an answer has")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--fake-tokens", type=int, default=40)
    parser.add_argument("--fake-token-delay", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", action="store_true", help="keep the stores' files and logs")
    parser.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results")


def check_traffic_arguments(
    parser: argparse.ArgumentParser, args: argparse.Namespace, phases: Sequence[str]
) -> None:
    """`args.phase_list` from `--phases`, each one of `phases`; at least one client."""
    args.phase_list = [p for p in args.phases.split(",") if p]
    for phase in args.phase_list:
        if phase not in phases:
            parser.error(f"unknown phase {phase!r}")
    if args.clients + args.v1_clients < 1:
        parser.error("at least one client")


# The fault of each phase


def _leases(redis: Any, worker_ids: dict[str, int]) -> dict[str, int]:
    from inference import queue

    return {url: int(redis.zcard(queue.lease_key(wid))) for url, wid in worker_ids.items()}


def _owned(redis: Any, stack: Stack) -> dict[str, int]:
    from inference import queue

    return {
        name: int(redis.scard(queue.owned_key(replica)))
        for name, replica in stack.replica_names.items()
        if stack.processes[name].alive()
    }


async def _running_somewhere(stack: Stack, worker_ids: dict[str, int], within: float) -> None:
    """Until an answer holds a lease on a worker, and a moment more for its first tokens."""
    assert stack.redis is not None
    deadline = time.monotonic() + within
    with stack.redis.client() as redis:
        while time.monotonic() < deadline:
            try:
                if sum(_leases(redis, worker_ids).values()) > 0:
                    break
            except Exception:  # noqa: S110 (Redis may be starting: look again)
                pass
            await asyncio.sleep(0.2)
    await asyncio.sleep(1.0)


async def inject(
    phase: str, stack: Stack, args: argparse.Namespace, worker_ids: dict[str, int], edges: Edges
) -> tuple[str, Any]:
    """Do the phase's fault; returns what was done and how to recover from it afterwards."""
    assert stack.redis is not None and stack.postgres is not None
    if phase == "none":
        return "none", None
    if phase == "worker":
        with stack.redis.client() as redis:
            leases = _leases(redis, worker_ids)
        url = max(leases, key=lambda u: leases[u])
        index = stack.worker_urls.index(url)
        stack.processes[f"worker-{index}"].kill()
        return f"kill -9 worker-{index} ({leases[url]} answers on it; leases {leases})", (
            "worker",
            index,
        )
    if phase == "scheduler":
        with stack.redis.client() as redis:
            owned = _owned(redis, stack)
        name = max(owned, key=lambda n: owned[n])
        replica = stack.replica_names[name]
        stack.processes[name].kill()
        return f"kill -9 {name} (replica {replica}, owning {owned[name]}; owned {owned})", (
            "scheduler",
            name,
        )
    if phase == "edge":
        counts = collections.Counter(edges.current.values())
        index = counts.most_common(1)[0][0] if counts else 0
        stack.processes[f"edge-{index}"].kill()
        return f"kill -9 edge-{index} ({counts[index]} clients on it)", ("edge", index)
    if phase == "redis":
        started = time.monotonic()
        stack.redis.kill()
        await asyncio.sleep(args.redis_down)
        await asyncio.to_thread(stack.redis.start)
        down = time.monotonic() - started
        return f"kill -9 redis-server, started again on its AOF after {down:.1f} s", None
    started = time.monotonic()
    mode = args.postgres_restart
    if not args.postgres_down:
        await asyncio.to_thread(stack.postgres.restart, mode)
        return f"pg_ctl restart -m {mode} ({time.monotonic() - started:.1f} s)", None
    await asyncio.to_thread(stack.postgres.stop, mode)
    await asyncio.sleep(args.postgres_down)
    await asyncio.to_thread(stack.postgres.start)
    down = time.monotonic() - started
    return f"pg_ctl stop -m {mode}, started again after {down:.1f} s", None


# A phase's fault: (phase, stack, args, worker ids, edges) -> (what was done, how to undo it).
Inject = Callable[
    [str, Stack, argparse.Namespace, dict[str, int], Edges], Awaitable[tuple[str, Any]]
]


def recover(stack: Stack, undo: Any) -> str:
    """Start again what the fault killed; returns how long that took."""
    if undo is None:
        return ""
    kind, which = undo
    started = time.monotonic()
    if kind == "worker":
        stack.restart_worker(which)
        wait_worker_healthy(stack, stack.worker_urls[which])
    elif kind == "scheduler":
        stack.start_scheduler(which)
        stack.wait_scheduler(which)
    else:
        stack.restart_edge(which)
    return f"{kind} back in {time.monotonic() - started:.1f} s"


def wait_worker_healthy(stack: Stack, url: str, within: float = 60.0) -> None:
    """Until the replicas have seen the restarted worker answer (its row healthy again)."""
    from django.db import connections

    from inference.models import Worker

    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        connections.close_all()
        if Worker.objects.filter(url=url, state=Worker.State.HEALTHY).exists():
            return
        time.sleep(0.5)


# A phase


async def client_loop(
    index: int,
    door: str,
    key: str,
    edges: Edges,
    args: argparse.Namespace,
    tag: str,
    phase: str,
    stop: asyncio.Event,
    answers: list[Answer],
) -> None:
    from django.conf import settings

    loop = asyncio.get_running_loop()
    rng = random.Random(f"{args.seed}-{phase}-{index}")
    conversation: str | None = None
    turns = 0
    number = 0
    while not stop.is_set():
        number += 1
        until = loop.time() + args.deadline
        content = f"[{tag} {phase} c{index} #{number}] {rng.choice(QUESTIONS)}"
        if door == "conversations":
            if conversation is None or turns >= args.turns:
                conversation = await create_conversation(edges, index, key, until=until)
                turns = 0
            if conversation is None:
                answer = Answer(door, index, content, sent_at=time.time())
                answer.refused = "could not create a conversation"
            else:
                answer = await conversation_turn(
                    edges, index, key, conversation, content, until=until
                )
                turns += 1
        else:
            answer = await v1_turn(
                edges,
                index,
                key,
                settings.DEFAULT_MODEL,
                content,
                stream=True,
                max_tokens=args.max_tokens,
                until=until,
            )
        answers.append(answer)
        await asyncio.sleep(rng.uniform(0, args.think))


async def run_phase(
    phase: str,
    stack: Stack,
    args: argparse.Namespace,
    worker_ids: dict[str, int],
    users: list[tuple[int, str]],
    tag: str,
    inject: Inject = inject,
) -> tuple[PhaseResult, Any]:
    result = PhaseResult(phase)
    offsets = {p.name: log_lines(p, 0)[0] for p in _all(stack)}
    edges = Edges(stack.edge_urls, read_timeout=10.0)
    stop = asyncio.Event()
    doors = ["conversations"] * args.clients + ["v1-stream"] * args.v1_clients
    tasks = [
        asyncio.create_task(
            client_loop(i, door, users[i][1], edges, args, tag, phase, stop, result.answers)
        )
        for i, door in enumerate(doors)
    ]
    undo = None
    started = time.monotonic()
    try:
        await asyncio.sleep(args.lead)
        await _running_somewhere(stack, worker_ids, within=60)
        result.fault_at_s = time.monotonic() - started
        result.fault, undo = await inject(phase, stack, args, worker_ids, edges)
        print(f"  {phase}: {result.fault} at +{result.fault_at_s:.1f} s", flush=True)
        await asyncio.sleep(args.after)
    finally:
        stop.set()
        # Each answer has its own deadline; this only bounds the wait for the last ones.
        done, pending = await asyncio.wait(tasks, timeout=args.deadline + 60)
        for task in pending:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await edges.aclose()
    for task in done:
        if task.exception() is not None:
            result.error = f"a client failed: {task.exception()!r}"
    killed = killed_name(undo)
    for process in _all(stack):
        if not process.alive() and process.name != killed:
            result.died.append(f"{process.name}: {process.tail(15)}")
    for process in _all(stack):
        _, lines = log_lines(process, offsets.get(process.name, 0))
        if found := notable(lines):
            result.logged[process.name] = found
    return result, undo


def killed_name(undo: Any) -> str:
    """The name of the process a fault killed (its group is started again afterwards)."""
    if undo is None:
        return ""
    kind, which = undo
    return str(which) if kind == "scheduler" else f"{kind}-{which}"


def _all(stack: Stack) -> list[Process]:
    processes = list(stack.processes.values())
    if stack.redis is not None:
        processes.append(stack.redis.process)
    return processes


def verdicts_for(answers: list[Answer]) -> list[Verdict]:
    """`check_answers`, retried while Postgres is still coming back."""
    from django.db import OperationalError, connections

    for attempt in range(30):
        try:
            return check_answers(answers)
        except OperationalError:
            connections.close_all()
            time.sleep(1.0 + attempt * 0.1)
    return check_answers(answers)


async def run(
    args: argparse.Namespace,
    stack: Stack,
    worker_ids: dict[str, int],
    users: list[tuple[int, str]],
    tag: str,
    *,
    inject: Inject = inject,
    recover: Callable[[Stack, Any], str] = recover,
) -> list[PhaseResult]:
    """The phases of `args.phase_list` in turn: `inject` makes each one's fault, `recover`
    undoes it once the phase's answers are over (chaos' own by default)."""
    results = []
    for phase in args.phase_list:
        if phase == "worker" and stack.config.workers == "urls":
            results.append(PhaseResult(phase, fault="not run: the workers were not started here"))
            continue
        print(f"phase {phase}", flush=True)
        try:
            result, undo = await run_phase(phase, stack, args, worker_ids, users, tag, inject)
        except Exception as exc:
            results.append(PhaseResult(phase, error=f"{type(exc).__name__}: {exc}"))
            break
        await asyncio.sleep(2.0)  # the finish hooks of the last answers
        result.verdicts = await asyncio.to_thread(verdicts_for, result.answers)
        result.recovery = await asyncio.to_thread(recover, stack, undo)
        # A process that died by itself is started again too, so the next phase has a stack.
        for line in result.died:
            name = line.split(":", 1)[0]
            await asyncio.to_thread(_restart_named, stack, name)
        results.append(result)
        print(f"  {phase}: {summary(result)}", flush=True)
    return results


def _restart_named(stack: Stack, name: str) -> None:
    kind, _, index = name.partition("-")
    if kind == "scheduler":
        stack.start_scheduler(name)
        stack.wait_scheduler(name)
    elif kind == "edge":
        stack.restart_edge(int(index))
    elif kind == "worker":
        stack.restart_worker(int(index))
    elif kind == "celery":
        stack.processes[name].start()


# The report


def counts(verdicts: Sequence[Verdict], answers: Sequence[Answer]) -> dict[str, int]:
    return {
        "answers": len(answers),
        "completed": sum(v.completed for v in verdicts),
        "restarted": sum(v.restarted for v in verdicts),
        "failed": sum(v.failed for v in verdicts),
        "stuck": sum(v.stuck for v in verdicts),
        "lost": sum(v.lost for v in verdicts),
        "duplicated": sum(v.duplicated for v in verdicts),
        "charged twice": sum(v.charged_twice for v in verdicts),
        "uncharged": sum(v.uncharged for v in verdicts),
        "text mismatch": sum(v.mismatch for v in verdicts),
    }


def summary(result: PhaseResult) -> str:
    total = counts(result.verdicts, result.answers)
    return ", ".join(f"{k} {v}" for k, v in total.items())


def rows_of(result: PhaseResult) -> list[tuple[str, dict[str, int]]]:
    rows = []
    for door in ("conversations", "v1-stream"):
        pairs = [(a, v) for a, v in zip(result.answers, result.verdicts, strict=False)]
        chosen = [(a, v) for a, v in pairs if a.door == door]
        if chosen:
            rows.append((door, counts([v for _, v in chosen], [a for a, _ in chosen])))
    rows.append(("all", counts(result.verdicts, result.answers)))
    return rows


def table(results: Sequence[PhaseResult]) -> str:
    rows = []
    for result in results:
        for door, numbers in rows_of(result):
            rows.append([result.phase, door, *(str(numbers[c]) for c in COLUMNS)])
    return render(["phase", "door", *COLUMNS], rows)


def failures(results: Sequence[PhaseResult]) -> list[str]:
    lines = []
    for result in results:
        for answer, verdict in zip(result.answers, result.verdicts, strict=False):
            if verdict.completed and not (verdict.mismatch or verdict.duplicated):
                continue
            what = "stuck" if verdict.stuck else "failed" if verdict.failed else "completed, but"
            extra = [
                name
                for name, flag in (
                    ("mismatch", verdict.mismatch),
                    ("duplicated", verdict.duplicated),
                    ("lost", verdict.lost),
                )
                if flag
            ]
            lines.append(
                f"  {result.phase:9} {answer.door:13} {what} {' '.join(extra)}"
                f" gen {answer.generation_id or '-'}: client {answer.status or '-'}"
                f"{'/' + answer.error if answer.error else ''}, db {verdict.db_status or '-'}"
                f"{'/' + verdict.db_error if verdict.db_error else ''}"
                f"{', refused: ' + answer.refused if answer.refused else ''}"
                f", restarts {answer.restarts}, drops {answer.drops}"
                f", {'; '.join(answer.http_errors[:4])}"
            )
    return lines


def report(args: argparse.Namespace, stack: Stack, results: Sequence[PhaseResult]) -> str:
    workers = (
        f"{len(stack.worker_urls)} worker(s) given by URL"
        if stack.config.workers == "urls"
        else f"{stack.config.worker_count} {stack.config.workers} worker(s)"
    )
    celery = ", a Celery worker with beat" if stack.config.celery else ""
    header = [
        f"chaos benchmark, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, "
        f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}",
        f"{stack.config.edges} edges, {stack.config.schedulers} scheduler replicas, {workers}"
        f"{celery}; "
        f"own Postgres and Redis (appendonly yes, appendfsync {stack.config.redis_fsync})",
        f"{args.clients} conversation API + {args.v1_clients} streamed /v1 clients, think "
        f"<= {args.think} s, {args.max_tokens} tokens per answer; fault {args.lead} s after the "
        f"first sends (once answers run), sends for {args.after} s more; deadline "
        f"{args.deadline:.0f} s per answer",
        "",
    ]
    return "\n".join([*header, table(results), "", *details(results)])


def details(results: Sequence[PhaseResult]) -> list[str]:
    """The lines below the table: each phase's fault, the answers that did not complete,
    processes that exited unasked, and what the processes logged."""
    faults = ["faults:"]
    for result in results:
        at = f" at +{result.fault_at_s:.1f} s" if result.fault_at_s is not None else ""
        recovery = f"; {result.recovery}" if result.recovery else ""
        error = f"; ERROR {result.error}" if result.error else ""
        faults.append(f"  {result.phase:9} {result.fault}{at}{recovery}{error}")
    parts = faults
    unfinished = failures(results)
    parts += ["", "answers that did not complete:" if unfinished else "every answer completed"]
    parts += unfinished
    for result in results:
        if result.died:
            parts += ["", f"{result.phase}: processes that exited unasked:", *result.died]
    logged = [
        f"  {result.phase:9} {name}: {line}"
        for result in results
        for name, lines in result.logged.items()
        for line in lines
    ]
    parts += ["", "warnings and errors the processes logged, per phase (first of each kind):"]
    parts += logged or ["  none"]
    return parts


def as_json(args: argparse.Namespace, results: Sequence[PhaseResult]) -> dict[str, Any]:
    return {
        "args": {k: v for k, v in vars(args).items() if k not in ("results",)},
        "columns": list(COLUMNS),
        "phases": [
            {
                "phase": result.phase,
                "fault": result.fault,
                "fault_at_s": result.fault_at_s,
                "recovery": result.recovery,
                "error": result.error,
                "rows": {door: numbers for door, numbers in rows_of(result)},
                "answers": [
                    {**answer.as_dict(), "verdict": vars(verdict)}
                    for answer, verdict in zip(result.answers, result.verdicts, strict=False)
                ],
                "died": result.died,
                "logged": result.logged,
            }
            for result in results
        ],
    }


def save(args: argparse.Namespace, text: str, data: dict[str, Any], name: str = "chaos") -> Path:
    args.results.mkdir(parents=True, exist_ok=True)
    stem = args.results / f"{name}-{datetime.now(UTC):%Y%m%d-%H%M%S}"
    stem.with_suffix(".txt").write_text(text + "\n")
    stem.with_suffix(".json").write_text(json.dumps(data, indent=1, default=str) + "\n")
    return stem.with_suffix(".txt")


def bring_up(
    stack: Stack, args: argparse.Namespace, users_prefix: str
) -> tuple[dict[str, int], list[tuple[int, str]]]:
    """The stores, the migrations, the workers in the default pool, the clients' users, then
    the replicas and edges; returns each worker URL's id and the users (id, API key)."""
    stack.start_stores()
    stack.migrate()
    stack.django()
    urls = stack.start_workers()
    worker_ids = dict(prepare_fleet(urls, stack.served_model(), args.max_tokens))
    users = make_users(args.clients + args.v1_clients, users_prefix)
    from django.db import connections

    connections.close_all()
    stack.start_service()
    print("stack up", flush=True)
    return worker_ids, users


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    # SIGTERM as SystemExit, so that the stack's `with` stops what was started.
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    folder = Path(tempfile.mkdtemp(prefix="chaos-"))
    config = StackConfig(
        edges=2,
        schedulers=2,
        workers="urls" if args.urls else args.workers,
        worker_count=len(args.urls) or args.worker_count,
        worker_urls=args.urls,
        celery=args.celery,
        beat=args.celery,
        fake_tokens=args.fake_tokens,
        fake_token_delay=args.fake_token_delay,
        env={
            # Heartbeats often, so that a client notices a dead connection within seconds.
            "STREAM_HEARTBEAT_SECONDS": "2",
            "SCHEDULER_MAX_QUEUE_SECONDS": "600",
        },
    )
    tag = secrets.token_hex(3)
    results: list[PhaseResult] = []
    try:
        with Stack(folder, config) as stack:
            print(f"stack in {folder}", flush=True)
            worker_ids, users = bring_up(stack, args, f"chaos-{tag}")
            results = asyncio.run(run(args, stack, worker_ids, users, tag))
            text = report(args, stack, results)
    finally:
        if not args.keep:
            for data in (folder / "postgres", folder / "redis"):
                shutil.rmtree(data, ignore_errors=True)
    print(text)
    path = save(args, text, as_json(args, results))
    shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    print(f"\nwritten to {shown} (and .json); logs in {folder}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
