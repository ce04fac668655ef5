"""A soak: simulated users for a long stretch, then what the service's processes and Redis
have kept that they should not have.

The script starts a service of its own (`benchmarks/stack.py`, as `chaos.py` does): Postgres
and Redis (append-only file) on free ports in a temporary folder, two edges, two scheduler
replicas, a Celery worker with its beat (`--no-celery` to leave it out) and the workers (real
vLLM CPU workers by default, `--workers fake` for the suite's stand-in, or `--worker-urls`).
`--users` simulated users (`benchmarks/traffic.py`) then use it for `--seconds`: each picks
the conversation API (a conversation of up to `--turns` turns: send, stream the answer's
events with resume), streamed `/v1/chat/completions` or a whole one, in the proportions of
`--mix`, and thinks a random while (exponential, mean `--think` s) between answers.

Reported:

- per door: requests, completed, failed (visibly: an error event, an error status, a refused
  send), stuck (no final state within `--deadline`), the error rate (failed + stuck over all),
  TTFT p50/p99 as the client saw it;
- per process (each edge, replica, worker and Celery, with every process of its group):
  resident memory sampled every `--sample` s; its value at the end of the warm-up
  (`--warmup` s, default a fifth of the run), at the end, the most, the growth over the
  warm-up value (the target: at most 5%) and the least-squares slope after the warm-up
  (MiB per hour); with Redis' keys and memory and the tasks waiting in Celery's queue;
- Redis keys: once every answer is final and the service has been idle for `--settle` s
  (the detach grace, housekeeping, Celery drained), every key, grouped by pattern, with how
  many have no TTL, and a verdict: `fleet` (state of a live worker, pool or replica, bounded
  by the fleet), `expires` (a TTL takes it: the answers' streams after
  GENERATION_STREAM_TTL_SECONDS, idempotency records, affinity, task results), `backlog`
  (tasks still waiting in Celery's queue, listed by task), or `LEAK`
  (a key of an answer, user or replica that should be gone, without a TTL, or a queue,
  lease or ownership entry left after every answer ended). Then the same after the service's
  processes were stopped (SIGTERM), before Redis is.

    SECRET_KEY=x .venv/bin/python benchmarks/soak.py --workers vllm --users 20 --seconds 600
    SECRET_KEY=x .venv/bin/python benchmarks/soak.py --workers fake --users 5 --seconds 30

It prints the tables and writes them to benchmarks/results/soak-<UTC date-time>.txt, with the
samples in .json beside it. Every process it started is stopped at the end, even on error.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import platform
import random
import re
import secrets
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import percentile, render  # noqa: E402
from benchmarks.stack import (  # noqa: E402
    KeyGroup,
    Process,
    Stack,
    StackConfig,
    key_census,
    log_lines,
    make_users,
    members,
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

DOORS = ("conversations", "v1-stream", "v1")
QUESTIONS = (
    "What is a good name for a grey cat?",
    "Give me three tips for a job interview.",
    "Explain photosynthesis to a child.",
    "Write a haiku about autumn rain.",
    "How do I boil an egg?",
    "What does a compiler do?",
    "Suggest a weekend trip near the mountains.",
    "Summarise the plot of a heist film in two sentences.",
)
MIB = 1024 * 1024
# kombu's Redis transport: tasks wait in a list named after their queue.
CELERY_QUEUE = "celery"
GROWTH_TARGET = 5.0


@dataclass
class Sample:
    """One reading: seconds since the start, resident bytes per process, Redis' own size."""

    at: float
    rss: dict[str, int]
    redis_keys: int = 0
    redis_memory: int = 0
    celery_waiting: int = 0  # tasks in Celery's queue, not yet taken by a worker


@dataclass
class Soak:
    answers: list[Answer] = field(default_factory=list)
    verdicts: list[Verdict] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    idle_keys: dict[str, KeyGroup] = field(default_factory=dict)
    idle_members: dict[str, int] = field(default_factory=dict)
    stopped_keys: dict[str, KeyGroup] = field(default_factory=dict)
    stopped_members: dict[str, int] = field(default_factory=dict)
    unfinished_after_wait: int = 0
    celery_left: dict[str, int] = field(default_factory=dict)  # waiting tasks by name, at the end
    seconds: float = 0.0
    logged: dict[str, list[str]] = field(default_factory=dict)
    died: list[str] = field(default_factory=list)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--workers", choices=("vllm", "fake"), default="vllm")
    parser.add_argument("--worker-count", type=int, default=2)
    parser.add_argument("--worker-urls", default="", help="comma-separated running workers")
    parser.add_argument("--users", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--warmup", type=float, default=None, help="default: a fifth of --seconds")
    parser.add_argument("--think", type=float, default=5.0, help="mean seconds between answers")
    parser.add_argument("--turns", type=int, default=4, help="turns per conversation")
    parser.add_argument(
        "--mix", default="0.6,0.25,0.15", help="shares of conversations, v1-stream, v1"
    )
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--sample", type=float, default=10.0, help="seconds between readings")
    parser.add_argument("--deadline", type=float, default=180.0, help="seconds an answer has")
    parser.add_argument("--settle", type=float, default=None, help="idle seconds before keys")
    parser.add_argument("--no-celery", action="store_true")
    parser.add_argument("--fake-tokens", type=int, default=24)
    parser.add_argument("--fake-token-delay", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", action="store_true", help="keep the stores' files")
    parser.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)
    args.urls = [u.strip().rstrip("/") for u in args.worker_urls.split(",") if u.strip()]
    shares = [float(part) for part in args.mix.split(",")]
    if len(shares) != len(DOORS) or min(shares) < 0 or sum(shares) <= 0:
        parser.error("--mix: three shares, not all zero")
    args.shares = shares
    if args.warmup is None:
        args.warmup = args.seconds / 5
    if args.users < 1 or args.seconds <= 0:
        parser.error("--users and --seconds must be positive")
    return args


# The users


async def user_loop(
    index: int,
    key: str,
    edges: Edges,
    args: argparse.Namespace,
    tag: str,
    stop_at: float,
    answers: list[Answer],
) -> None:
    from django.conf import settings

    loop = asyncio.get_running_loop()
    rng = random.Random(f"{args.seed}-{index}")
    conversation: str | None = None
    turns = 0
    number = 0
    # Users arrive over the first think time, not all at once.
    await asyncio.sleep(rng.uniform(0, args.think))
    while loop.time() < stop_at:
        number += 1
        door = rng.choices(DOORS, weights=args.shares)[0]
        until = loop.time() + args.deadline
        content = f"[{tag} u{index} #{number}] {rng.choice(QUESTIONS)}"
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
                stream=door == "v1-stream",
                max_tokens=args.max_tokens,
                until=until,
            )
        answers.append(answer)
        await asyncio.sleep(min(rng.expovariate(1 / args.think), 4 * args.think))


def watched(stack: Stack) -> list[Process]:
    """The processes whose memory is followed (the stores are not the service's)."""
    return [
        p for p in stack.processes.values() if p.kind in ("edge", "scheduler", "worker", "celery")
    ]


def reading(stack: Stack, started: float) -> Sample:
    sample = Sample(at=time.monotonic() - started, rss={p.name: p.rss() for p in watched(stack)})
    assert stack.redis is not None
    try:
        with stack.redis.client() as redis:
            sample.redis_keys = int(redis.dbsize())
            sample.redis_memory = int(redis.info("memory")["used_memory"])
            sample.celery_waiting = int(redis.llen(CELERY_QUEUE))
    except Exception:  # noqa: S110 (a reading without Redis' figures)
        pass
    return sample


async def sampler(stack: Stack, every: float, started: float, samples: list[Sample]) -> None:
    while True:
        samples.append(await asyncio.to_thread(reading, stack, started))
        await asyncio.sleep(every)


async def traffic(
    args: argparse.Namespace, stack: Stack, users: list[tuple[int, str]], tag: str, soak: Soak
) -> None:
    loop = asyncio.get_running_loop()
    started = time.monotonic()
    edges = Edges(stack.edge_urls, read_timeout=30.0)
    samples = asyncio.create_task(sampler(stack, args.sample, started, soak.samples))
    stop_at = loop.time() + args.seconds
    tasks = [
        asyncio.create_task(user_loop(i, key, edges, args, tag, stop_at, soak.answers))
        for i, (_, key) in enumerate(users)
    ]
    last_report = loop.time()
    try:
        while not all(task.done() for task in tasks):
            await asyncio.sleep(1.0)
            if loop.time() - last_report >= 60:
                last_report = loop.time()
                print(
                    f"  {time.monotonic() - started:.0f} s: {len(soak.answers)} answers",
                    flush=True,
                )
        for task in tasks:
            task.result()  # a user that failed is the benchmark's bug: say so
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        # The last reading is taken while everything is still up.
        soak.samples.append(await asyncio.to_thread(reading, stack, started))
        samples.cancel()
        await asyncio.gather(samples, return_exceptions=True)
        await edges.aclose()
        soak.seconds = time.monotonic() - started


# After the traffic


def unfinished() -> int:
    from django.db import connections

    from inference.models import Generation

    connections.close_all()
    count = Generation.objects.exclude(status__in=Generation.FINAL_STATUSES).count()
    connections.close_all()
    return count


def wait_quiet(args: argparse.Namespace, stack: Stack) -> int:
    """Until no answer is unfinished in Postgres (at most `--deadline` s), then `--settle`
    idle seconds and Celery's queue empty; returns the answers still unfinished."""
    deadline = time.monotonic() + args.deadline
    while (left := unfinished()) and time.monotonic() < deadline:
        time.sleep(1.0)
    time.sleep(args.settle)
    if stack.config.celery:
        assert stack.redis is not None
        until = time.monotonic() + 120
        with stack.redis.client() as redis:
            while time.monotonic() < until and (redis.llen(CELERY_QUEUE) or redis.hlen("unacked")):
                time.sleep(1.0)
    return left


def celery_waiting_tasks(stack: Stack) -> dict[str, int]:
    """The tasks waiting in Celery's queue, by task name (kombu's message headers)."""
    assert stack.redis is not None
    names: collections.Counter[str] = collections.Counter()
    with stack.redis.client() as redis:
        for message in redis.lrange(CELERY_QUEUE, 0, -1):
            try:
                names[json.loads(message)["headers"]["task"]] += 1
            except (ValueError, KeyError, TypeError):
                names["(unreadable)"] += 1
    return dict(names.most_common())


def census(stack: Stack) -> tuple[dict[str, KeyGroup], dict[str, int]]:
    """The key groups, and for each small group (at most 200 keys) the members its keys
    hold (a set's members, a hash's fields, a stream's entries; 1 for a string)."""
    assert stack.redis is not None
    with stack.redis.client() as redis:
        groups = key_census(redis)
        held = {
            pattern: sum(members(redis, key) for key in group.keys)
            for pattern, group in groups.items()
            if group.count <= 200
        }
    return groups, held


# What each key family is. Patterns as `key_pattern` writes them; the first match decides.
FAMILIES: list[tuple[str, str, str]] = [
    (
        r"^cs:stream:\{s<n>\}:<uuid>$",
        "expires",
        "an answer's events, kept GENERATION_STREAM_TTL_SECONDS",
    ),
    (r"^\{cs\}:aff:<uuid>$", "expires", "a conversation's worker (SCHEDULER_AFFINITY_TTL_SECONDS)"),
    (r"^cs:events:\{s<n>\}:<n>$", "expires", "a user's event stream (sidebar, titles)"),
    (r"^\{cs\}:title-pending:<uuid>$", "expires", "a conversation's title task, queued or running"),
    (r"^\{cs\}:(metrics|placed):<n>$", "fleet", "per worker: last load, rate of placements"),
    (r"^\{cs:prefix\}:<n>", "fleet", "per worker: the estimated prefix cache"),
    (r"^\{cs\}:rr:", "fleet", "per pool: the round-robin counter"),
    (r"^\{cs\}:fair:", "fleet", "per pool and tier: the fair queue's clock"),
    (r"^\{cs\}:housekeeping", "fleet", "housekeeping's turn between replicas (TTL)"),
    (r"^\{cs\}:replica:", "fleet", "a live replica's heartbeat (TTL)"),
    (r"^\{cs\}:replicas$", "fleet", "replicas by last beat (members: live replicas only)"),
    (r"^catalog:version$", "fleet", "the model catalogue's version (one key)"),
    (r"^\{cs\}:watchers:<uuid>$", "answer", "how many clients read an answer's stream"),
    (r"^\{cs\}:job:<uuid>$", "answer", "an answer's job"),
    (r"^\{cs\}:(lease|lease-tokens|prefill):<n>$", "must-go", "leases on a worker"),
    (r"^\{cs\}:owned:", "must-go", "answers a replica owns"),
    (r"^\{cs\}:(q|qt):", "must-go", "a queue"),
    (r"^\{cs\}:detached$", "must-go", "answers nobody watches"),
    (r"^cs:bill:\{u<n>\}:res:<uuid>$", "must-go", "an open reservation"),
    (r"^cs:bill:open$", "must-go", "reservations not yet settled"),
    (r"^cs:bill:\{u<n>\}:idem:", "expires", "an Idempotency-Key's result (a day)"),
    (r"^cs:bill:", "expires", "a user's buckets and message-cap window"),
    (r"^celery$", "queue", "Celery's queue: tasks waiting"),
    (r"^(_kombu\.|unacked)", "fleet", "Celery's broker (kombu)"),
    (r"^celery-task-meta-", "expires", "Celery task results (a day)"),
    (r"^chatsite:<n>:moderation:rules-version$", "fleet", "Django's cache: rules version"),
    (r"^chatsite:", "expires", "Django's cache"),
]


def verdict(group: KeyGroup, held: int, *, stopped: bool) -> tuple[str, str]:
    """(verdict, what the family is) for one key group.

    `fleet`: bounded by the workers, pools and live replicas; `expires`: its TTL takes it;
    `LEAK`: an answer's or user's key without a TTL, anything of a family that must be gone
    once every answer ended (queues, leases, ownership, open reservations), members of the
    replicas' set once none runs, or a key of no known family without a TTL.
    """
    family, what = next(
        ((family, what) for pattern, family, what in FAMILIES if re.search(pattern, group.pattern)),
        ("unknown", "not a family this benchmark knows"),
    )
    if family == "fleet":
        if stopped and group.pattern == "{cs}:replicas" and held:
            return "LEAK", what + f"; {held} member(s) after every replica stopped"
        return "fleet", what
    if family == "queue":
        return ("backlog" if held else "fleet"), what + (f": {held}" if held else "")
    if family == "must-go":
        return "LEAK", what + (f"; {held} member(s) left" if held else "")
    if group.without_ttl:
        return "LEAK", what + f"; {group.without_ttl} without a TTL"
    if family == "answer":
        return "expires", what + "; left after the answer, its TTL takes it"
    return "expires", what


def keys_table(groups: dict[str, KeyGroup], held: dict[str, int], *, stopped: bool) -> str:
    rows, notes = [], []
    for pattern, group in groups.items():
        judged, what = verdict(group, held.get(pattern, 0), stopped=stopped)
        rows.append(
            [
                pattern,
                str(group.count),
                str(group.without_ttl),
                f"{group.max_ttl_s:,.0f}" if group.max_ttl_s else "-",
                judged,
            ]
        )
        notes.append(what)
    if not rows:
        return "(no keys)"
    lines = render(["key pattern", "keys", "no TTL", "max TTL s", "verdict"], rows).splitlines()
    # The family's description, left-aligned after the table's columns.
    return "\n".join(
        [
            f"{lines[0]}  what",
            lines[1],
            *(f"{line}  {note}" for line, note in zip(lines[2:], notes, strict=True)),
        ]
    )


def leaks(groups: dict[str, KeyGroup], held: dict[str, int], *, stopped: bool) -> list[str]:
    return [
        pattern
        for pattern, group in groups.items()
        if verdict(group, held.get(pattern, 0), stopped=stopped)[0] == "LEAK"
    ]


# The report


def doors_table(soak: Soak) -> str:
    rows = []
    pairs = list(zip(soak.answers, soak.verdicts, strict=True))
    for door in (*DOORS, "all"):
        chosen = [(a, v) for a, v in pairs if door in ("all", a.door)]
        if not chosen:
            continue
        failed = sum(v.failed for _, v in chosen)
        stuck = sum(v.stuck for _, v in chosen)
        ttfts = [(a.first_token_at - a.sent_at) * 1000 for a, _ in chosen if a.first_token_at]
        rows.append(
            [
                door,
                str(len(chosen)),
                str(sum(v.completed for _, v in chosen)),
                str(failed),
                str(stuck),
                str(sum(v.lost for _, v in chosen)),
                f"{100 * (failed + stuck) / len(chosen):.2f}%",
                f"{percentile(ttfts, 50):,.0f}" if ttfts else "-",
                f"{percentile(ttfts, 99):,.0f}" if ttfts else "-",
            ]
        )
    headers = ["door", "requests", "completed", "failed", "stuck", "lost", "error rate"]
    return render([*headers, "TTFT p50 ms", "TTFT p99 ms"], rows)


def slope_per_hour(points: Sequence[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, MiB), in MiB per hour."""
    if len(points) < 2:
        return float("nan")
    mean_x = sum(x for x, _ in points) / len(points)
    mean_y = sum(y for _, y in points) / len(points)
    var = sum((x - mean_x) ** 2 for x, _ in points)
    if not var:
        return float("nan")
    return sum((x - mean_x) * (y - mean_y) for x, y in points) / var * 3600


def memory_rows(soak: Soak, warmup: float) -> list[dict[str, Any]]:
    names = sorted({name for sample in soak.samples for name in sample.rss})
    rows = []
    for name in names:
        series = [(s.at, s.rss.get(name, 0) / MIB) for s in soak.samples if s.rss.get(name)]
        after = [(at, mib) for at, mib in series if at >= warmup]
        if not after:
            continue
        base, end = after[0][1], after[-1][1]
        rows.append(
            {
                "process": name,
                "samples": len(series),
                "warm MiB": base,
                "end MiB": end,
                "max MiB": max(mib for _, mib in series),
                "growth %": 100 * (end - base) / base if base else float("nan"),
                "slope MiB/h": slope_per_hour(after),
            }
        )
    return rows


def memory_table(rows: list[dict[str, Any]]) -> str:
    headers = ["process", "samples", "warm MiB", "end MiB", "max MiB", "growth %", "slope MiB/h"]
    body = [
        [
            row["process"],
            str(row["samples"]),
            f"{row['warm MiB']:,.1f}",
            f"{row['end MiB']:,.1f}",
            f"{row['max MiB']:,.1f}",
            f"{row['growth %']:+.1f}",
            f"{row['slope MiB/h']:+,.1f}",
        ]
        for row in rows
    ]
    return render(
        [*headers, "within 5%"],
        [[*r, "yes" if abs(float(r[5])) <= GROWTH_TARGET else "NO"] for r in body],
    )


def report(args: argparse.Namespace, stack: Stack, soak: Soak) -> str:
    workers = (
        f"{len(stack.worker_urls)} worker(s) given by URL"
        if stack.config.workers == "urls"
        else f"{stack.config.worker_count} {stack.config.workers} worker(s)"
    )
    celery = "a Celery worker with beat" if stack.config.celery else "no Celery"
    memory = memory_rows(soak, args.warmup)
    last = soak.samples[-1] if soak.samples else None
    first_after = next((s for s in soak.samples if s.at >= args.warmup), None)
    redis_line = (
        f"Redis: {first_after.redis_keys} keys / {first_after.redis_memory / MIB:.1f} MiB after "
        f"the warm-up, {last.redis_keys} keys / {last.redis_memory / MIB:.1f} MiB at the end"
        if last and first_after
        else "Redis: no readings"
    )
    celery_line = ""
    if stack.config.celery:
        most = max((s.celery_waiting for s in soak.samples), default=0)
        at_end = soak.samples[-1].celery_waiting if soak.samples else 0
        left = sum(soak.celery_left.values())
        by_name = ", ".join(f"{name} {n}" for name, n in soak.celery_left.items())
        celery_line = (
            f"Celery queue: at most {most} task(s) waiting, {at_end} when the traffic ended, "
            f"{left} after the wait{f' ({by_name})' if by_name else ''}"
        )
    idle_leaks = leaks(soak.idle_keys, soak.idle_members, stopped=False)
    stopped_leaks = leaks(soak.stopped_keys, soak.stopped_members, stopped=True)
    parts = [
        f"soak benchmark, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, "
        f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}",
        f"{stack.config.edges} edges, {stack.config.schedulers} scheduler replicas, {workers}, "
        f"{celery}; own Postgres and Redis (appendonly yes)",
        f"{args.users} users for {soak.seconds:.0f} s (asked {args.seconds:.0f}), think mean "
        f"{args.think} s, mix conversations/v1-stream/v1 {args.mix}, {args.max_tokens} tokens "
        f"per answer; memory every {args.sample:.0f} s, warm-up {args.warmup:.0f} s",
        "",
        doors_table(soak),
        "",
        "resident memory per process group (growth: end over the end of the warm-up):",
        memory_table(memory),
        redis_line,
        *([celery_line] if celery_line else []),
        "",
        f"Redis keys once every answer was final ({soak.unfinished_after_wait} unfinished after "
        f"the wait) and {args.settle:.0f} s idle:",
        keys_table(soak.idle_keys, soak.idle_members, stopped=False),
        f"leaks: {', '.join(idle_leaks) if idle_leaks else 'none'}",
        "",
        "Redis keys after the edges, replicas and Celery were stopped:",
        keys_table(soak.stopped_keys, soak.stopped_members, stopped=True),
        f"leaks: {', '.join(stopped_leaks) if stopped_leaks else 'none'}",
    ]
    unfinished_lines = [
        f"  {a.door:13} gen {a.generation_id or '-'}: client {a.status or '-'}"
        f"{'/' + a.error if a.error else ''}, db {v.db_status or '-'}"
        f"{', refused: ' + a.refused if a.refused else ''}, drops {a.drops}, "
        f"{'; '.join(a.http_errors[:3])}"
        for a, v in zip(soak.answers, soak.verdicts, strict=True)
        if not v.completed
    ]
    parts += [
        "",
        "answers that did not complete:" if unfinished_lines else "every answer completed",
    ]
    parts += unfinished_lines[:40]
    if soak.died:
        parts += ["", "processes that exited unasked:", *soak.died]
    logged = [f"  {name}: {line}" for name, lines in soak.logged.items() for line in lines]
    parts += ["", "warnings and errors the processes logged (first of each kind):"]
    parts += logged or ["  none"]
    return "\n".join(parts)


def as_json(args: argparse.Namespace, soak: Soak) -> dict[str, Any]:
    def groups(found: dict[str, KeyGroup], held: dict[str, int], stopped: bool) -> list[Any]:
        return [
            {
                "pattern": p,
                "count": g.count,
                "without_ttl": g.without_ttl,
                "max_ttl_s": g.max_ttl_s,
                "examples": g.examples,
                "held": held.get(p),
                "verdict": verdict(g, held.get(p, 0), stopped=stopped)[0],
            }
            for p, g in found.items()
        ]

    return {
        "args": {k: v for k, v in vars(args).items() if k != "results"},
        "seconds": soak.seconds,
        "memory": memory_rows(soak, args.warmup),
        "samples": [vars(sample) for sample in soak.samples],
        "keys_idle": groups(soak.idle_keys, soak.idle_members, False),
        "keys_stopped": groups(soak.stopped_keys, soak.stopped_members, True),
        "celery_left": soak.celery_left,
        "answers": [
            {**a.as_dict(), "verdict": vars(v)}
            for a, v in zip(soak.answers, soak.verdicts, strict=True)
            if not v.completed
        ],
        "totals": {
            "answers": len(soak.answers),
            "completed": sum(v.completed for v in soak.verdicts),
            "failed": sum(v.failed for v in soak.verdicts),
            "stuck": sum(v.stuck for v in soak.verdicts),
            "lost": sum(v.lost for v in soak.verdicts),
        },
    }


def save(args: argparse.Namespace, text: str, data: dict[str, Any]) -> Path:
    args.results.mkdir(parents=True, exist_ok=True)
    stem = args.results / f"soak-{datetime.now(UTC):%Y%m%d-%H%M%S}"
    stem.with_suffix(".txt").write_text(text + "\n")
    stem.with_suffix(".json").write_text(json.dumps(data, indent=1, default=str) + "\n")
    return stem.with_suffix(".txt")


def run_soak(args: argparse.Namespace, stack: Stack, tag: str) -> Soak:
    soak = Soak()
    urls = stack.start_workers()
    prepare_fleet(urls, stack.served_model(), args.max_tokens)
    users = make_users(args.users, f"soak-{tag}")
    from django.conf import settings
    from django.db import connections

    connections.close_all()
    stack.start_service()
    print("stack up", flush=True)
    offsets = {p.name: log_lines(p, 0)[0] for p in stack.processes.values()}
    asyncio.run(traffic(args, stack, users, tag, soak))
    print(f"traffic over: {len(soak.answers)} answers; waiting for the service to go idle")
    if args.settle is None:
        # The detach grace and housekeeping's next look, with room.
        args.settle = settings.STREAM_GRACE_SECONDS + 5
    soak.unfinished_after_wait = wait_quiet(args, stack)
    soak.verdicts = check_answers(soak.answers)
    soak.idle_keys, soak.idle_members = census(stack)
    soak.celery_left = celery_waiting_tasks(stack)
    for process in stack.processes.values():
        if not process.alive():
            soak.died.append(f"{process.name}: {process.tail(15)}")
        _, lines = log_lines(process, offsets.get(process.name, 0))
        if found := notable(lines):
            soak.logged[process.name] = found
    for kind in ("edge", "celery", "scheduler"):
        for process in stack.of_kind(kind):
            process.stop()
    soak.stopped_keys, soak.stopped_members = census(stack)
    return soak


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    folder = Path(tempfile.mkdtemp(prefix="soak-"))
    config = StackConfig(
        edges=2,
        schedulers=2,
        workers="urls" if args.urls else args.workers,
        worker_count=len(args.urls) or args.worker_count,
        worker_urls=args.urls,
        celery=not args.no_celery,
        beat=not args.no_celery,
        fake_tokens=args.fake_tokens,
        fake_token_delay=args.fake_token_delay,
        env={"SCHEDULER_MAX_QUEUE_SECONDS": "600"},
    )
    tag = secrets.token_hex(3)
    try:
        with Stack(folder, config) as stack:
            print(f"stack in {folder}", flush=True)
            stack.start_stores()
            stack.migrate()
            stack.django()
            soak = run_soak(args, stack, tag)
            text = report(args, stack, soak)
    finally:
        if not args.keep:
            for data in (folder / "postgres", folder / "redis"):
                shutil.rmtree(data, ignore_errors=True)
    print(text)
    path = save(args, text, as_json(args, soak))
    shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    print(f"\nwritten to {shown} (and .json); logs in {folder}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
