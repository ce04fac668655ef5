"""Conversation affinity versus round-robin on real vLLM workers, and the overhead of our path.

Two questions, answered in one run against the same two vLLM CPU workers:

1. Placement. A multi-turn workload (N conversations of T turns, at most C active at once, one
   long system prompt shared by all conversations of a phase) is sent once per placement
   policy through the real service code: `conversations.turns.turn_send`, the Redis queue, an
   in-process `inference.scheduler.Scheduler`, the workers. Per policy: vLLM's prefix-cache
   hit rate (the change of its `prefix_cache_hits` / `prefix_cache_queries` counters over the
   phase, summed over the workers), TTFT p50/p99 (first `delta` entry of the generation's Redis
   Stream minus its `meta queued` entry: both ids are Redis' ms clock), and tokens/s.
   Each phase gets a fresh random tag at the head of its system prompt, so no phase finds the
   blocks an earlier phase (or an earlier run) left in the workers' caches.
2. Path overhead. Sequential single requests: POST /api/v1/conversations/<id>/messages through
   DRF's APIClient (the edge in-process) until the first `delta` entry lands in Redis, versus
   the same kind of prompt streamed straight from the worker until its first content chunk.
   The two alternate (a-b, b-a, ...) and each request has its own tag, so both see the same
   cache state: the system prompt cached, the question not.

Run it (it starts and stops two workers itself unless --workers is given):

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/chatsite_bench \\
    REDIS_URL=redis://127.0.0.1:6379/9 SECRET_KEY=x \\
    .venv/bin/python benchmarks/scheduler_affinity.py --conversations 16 --turns 4

It uses its own database (created and migrated if missing; the name must contain "bench") and
its own Redis database (never db 0; flushed at start), prints one table and writes it to
benchmarks/results/scheduler_affinity-<UTC date-time>.txt.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import secrets
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, cast

import httpx

if TYPE_CHECKING:
    from django.contrib.auth.models import User
    from redis.asyncio import Redis as AsyncRedis

    from inference.client import WorkerLoad
    from inference.models import ModelPool
    from inference.scheduler import Scheduler

# Run as a script (`python benchmarks/<name>.py`): the project root must be importable.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import (
    django_start,
    free_port,
    percentile,
    prepare_stores,
    render,
    write_result,
)
from chatsite.stream_events import StreamEvent

BASE_DIR = Path(__file__).resolve().parent.parent
RESULTS_DIR = BASE_DIR / "benchmarks" / "results"
DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/chatsite_bench"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/9"
PLACEMENTS = ("affinity", "round_robin", "least_loaded")
WORKER_START_SECONDS = 600
# Threads (each with its own database connection) for the ORM calls the edge would make.
EDGE_THREADS = ThreadPoolExecutor(max_workers=4, thread_name_prefix="bench-edge")

# The shared system prompt of a phase is built from these until it is long enough to fill
# several of vLLM's 128-token cache blocks.
POLICY_LINES = [
    "Members may borrow up to two bicycles at a time for a maximum of fourteen days.",
    "The workshop opens at eight in the morning and closes at seven in the evening.",
    "On Sundays only the self-service repair corner is open, from ten until four.",
    "A yearly membership costs forty euros; students and retirees pay twenty-five.",
    "Cargo bikes must be booked at least one day ahead and returned before noon.",
    "Lost keys cost fifteen euros to replace; a lost lock costs thirty-five euros.",
    "Punctures are repaired free of charge for members within two working days.",
    "Children's bicycles are lent together with a helmet of the matching size.",
    "Volunteers who give four hours a month get their membership for free.",
    "Electric bicycles need a separate safety briefing before the first loan.",
    "Damage must be reported at the counter on return, with a short description.",
    "The cooperative never shares members' addresses or phone numbers with anyone.",
    "Payment is by card or bank transfer; the counter does not accept cash.",
    "Group rides leave from the front door on the first Saturday of every month.",
    "Bicycles returned late are charged two euros per day, up to a cap of twenty.",
    "Questions about invoices go to the treasurer by e-mail, not to the workshop.",
]
SYSTEM_HEAD = (
    "You are the assistant of the Harbour Lane bicycle cooperative. Answer members' "
    "questions briefly, politely and only from the rules below. If a rule does not cover "
    "the question, say so and suggest asking at the counter."
)
QUESTIONS = [
    "How many bicycles can I borrow at once?",
    "When is the workshop open on weekdays?",
    "Can I come in on a Sunday to fix my brakes?",
    "How much is a membership for a student?",
    "I want a cargo bike for Saturday, what do I do?",
    "I lost my key, what will it cost me?",
    "My tyre is flat, will you fix it for free?",
    "Do you lend helmets for kids?",
    "How can I get my membership without paying?",
    "What do I need before I can take an electric bike?",
    "I scratched the frame, what should I do?",
    "Can I pay the late fee in cash?",
]


# Setup: Django, stores, workers


def bootstrap() -> None:
    """Configure and start Django with this script's own database and Redis by default."""
    django_start(database_url=DEFAULT_DATABASE_URL, redis_url=DEFAULT_REDIS_URL)

    import logging

    from django.conf import settings

    # Workers come from this script only; nothing is registered from the environment.
    settings.INFERENCE_WORKERS = []
    # A benchmark measures latency under load; it must not turn slow answers into rejections.
    settings.SCHEDULER_MAX_QUEUE_SECONDS = max(settings.SCHEDULER_MAX_QUEUE_SECONDS, 600)
    # The APIClient's requests arrive as host "testserver".
    settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "testserver"]
    logging.getLogger("inference").setLevel(logging.WARNING)
    logging.getLogger("httpx").setLevel(logging.WARNING)


@dataclass
class WorkerProcess:
    """A vLLM worker this script started (`manage.py run_worker`)."""

    url: str
    process: subprocess.Popen[bytes]
    log: Path


def start_workers(count: int, log_dir: Path, started: list[WorkerProcess]) -> None:
    """Start `count` workers, each appended to `started` as soon as it runs (for cleanup)."""
    from django.conf import settings

    if (
        not Path(settings.WORKER_PYTHON).exists()
        or not (settings.MODEL_DIR / "config.json").exists()
    ):
        fail("The vLLM worker venv or the prepared model is missing: make worker-venv model.")
    for index, cpus in enumerate(cpu_shares(count)):
        port = free_port()
        log = log_dir / f"vllm-worker-{index}.log"
        env = dict(os.environ)
        # vLLM's "auto" binding puts every server on one machine onto the same first core;
        # give each worker its own share of the cores, as separate machines would have.
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", ",".join(map(str, cpus)))
        process = subprocess.Popen(  # noqa: S603 (our own command line)
            [sys.executable, "manage.py", "run_worker", "--port", str(port)],
            cwd=BASE_DIR,
            env=env,
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, so SIGTERM reaches vLLM's children
        )
        started.append(WorkerProcess(url=f"http://127.0.0.1:{port}", process=process, log=log))


def cpu_shares(count: int) -> list[list[int]]:
    """Split the cores this process may use into `count` disjoint shares (shared when there
    are fewer cores than workers)."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < count:
        return [[cores[index % len(cores)]] for index in range(count)]
    size = len(cores) // count
    return [cores[index * size : (index + 1) * size] for index in range(count)]


def wait_healthy(workers: Sequence[WorkerProcess]) -> None:
    deadline = time.monotonic() + WORKER_START_SECONDS
    for worker in workers:
        while True:
            if worker.process.poll() is not None:
                fail(f"vLLM worker exited early:\n{worker.log.read_text()[-3000:]}")
            try:
                if httpx.get(f"{worker.url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                fail(f"vLLM worker did not start:\n{worker.log.read_text()[-3000:]}")
            time.sleep(1)


def stop_workers(workers: Sequence[WorkerProcess]) -> None:
    for worker in workers:
        if worker.process.poll() is None:
            os.killpg(worker.process.pid, signal.SIGTERM)
    for worker in workers:
        try:
            worker.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(worker.process.pid, signal.SIGKILL)
            worker.process.wait()


def fail(message: str) -> NoReturn:
    raise SystemExit(f"scheduler_affinity: {message}")


def _exit_on_sigterm(signum: int, frame: object) -> None:
    # Turn SIGTERM into SystemExit so the `finally` that stops the workers runs.
    raise SystemExit(128 + signum)


# Measuring


def in_thread(function: Callable[..., Any]) -> Callable[..., Any]:
    """Run blocking ORM code in the edge's threads, not the scheduler's database thread: the
    edge is another process in production, and must not queue behind the scheduler here."""
    from asgiref.sync import sync_to_async

    return sync_to_async(function, thread_sensitive=False, executor=EDGE_THREADS)


@dataclass
class StreamTrace:
    """What one generation's Redis Stream showed, timed by its entry ids (Redis' ms clock)."""

    queued_ms: int | None = None
    admitted_ms: int | None = None
    first_delta_ms: int | None = None
    last_delta_ms: int | None = None
    done_ms: int | None = None
    status: str = ""
    worker: str = ""
    output_tokens: int | None = None
    restarts: int = 0

    def add(self, entry_id: str, fields: dict[str, str]) -> None:
        ms = int(entry_id.split("-", 1)[0])
        event = fields.get("event")
        data = json.loads(fields.get("data") or "{}")
        if event == StreamEvent.META:
            if data.get("status") == "queued" and self.queued_ms is None:
                self.queued_ms = ms
            elif data.get("status") == "running":
                self.admitted_ms = self.admitted_ms or ms
                self.worker = str(data.get("worker") or "")
        elif event == StreamEvent.DELTA:
            self.first_delta_ms = self.first_delta_ms or ms
            self.last_delta_ms = ms
        elif event == StreamEvent.RESTART:
            self.restarts += 1
        elif event == StreamEvent.DONE:
            self.done_ms = ms
            self.status = str(data.get("status") or "")
            self.output_tokens = data.get("output_tokens")


async def follow(redis: AsyncRedis, generation_id: str, *, within: float) -> StreamTrace:
    """Read a generation's stream from its start until its `done` event, or give up after
    `within` seconds with the status `timeout`."""
    from inference import queue

    trace = StreamTrace()
    last = "0-0"
    deadline = asyncio.get_running_loop().time() + within
    while trace.done_ms is None:
        if asyncio.get_running_loop().time() > deadline:
            trace.status = "timeout"
            break
        reply = cast(
            list[tuple[str, list[tuple[str, dict[str, str]]]]],
            await redis.xread({queue.stream_key(generation_id): last}, block=1000),
        )
        for _, entries in reply:
            for entry_id, fields in entries:
                last = entry_id
                trace.add(entry_id, fields)
    return trace


@dataclass
class TurnResult:
    conversation: int
    turn: int
    generation_id: str
    trace: StreamTrace
    worker_id: int | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None

    @property
    def ttft_ms(self) -> float | None:
        if self.trace.first_delta_ms is None or self.trace.queued_ms is None:
            return None
        return float(self.trace.first_delta_ms - self.trace.queued_ms)

    @property
    def wait_ms(self) -> float | None:
        if self.trace.admitted_ms is None or self.trace.queued_ms is None:
            return None
        return float(self.trace.admitted_ms - self.trace.queued_ms)

    @property
    def stream_tokens_per_s(self) -> float | None:
        """Decode speed one user sees: tokens after the first over the time they took."""
        trace, tokens = self.trace, self.trace.output_tokens
        if trace.first_delta_ms is None or trace.last_delta_ms is None or not tokens:
            return None
        elapsed = (trace.last_delta_ms - trace.first_delta_ms) / 1000
        return (tokens - 1) / elapsed if tokens > 1 and elapsed > 0 else None


@dataclass
class PhaseResult:
    policy: str
    turns: list[TurnResult]
    wall_s: float
    prefix_queries: float
    prefix_hits: float
    requests_per_worker: list[int] = field(default_factory=list)


@dataclass
class OverheadResult:
    post_ms: list[float] = field(default_factory=list)
    admitted_ms: list[float] = field(default_factory=list)
    path_ms: list[float] = field(default_factory=list)
    direct_ms: list[float] = field(default_factory=list)
    failures: int = 0


@dataclass
class Bench:
    """What every phase shares: the workers, the user, the clients, the parameters."""

    args: argparse.Namespace
    urls: list[str]
    served_model: str
    tag: str
    user: User
    redis: AsyncRedis
    http: httpx.AsyncClient
    phase_tags: dict[str, str] = field(default_factory=dict)
    system_prompt_tokens: int = 0


def make_pool(*, bench: Bench, label: str) -> ModelPool:
    """A fresh pool whose fresh worker rows point at the benchmark's workers."""
    from inference.models import ModelPool, Worker

    Worker.objects.filter(url__in=bench.urls).delete()
    ModelPool.objects.filter(name__startswith="bench-").update(is_active=False)
    pool = ModelPool.objects.create(
        name=f"bench-{label.replace('_', '-')}-{bench.tag}",
        served_model=bench.served_model,
        max_output_tokens=bench.args.max_tokens,
    )
    for index, url in enumerate(bench.urls):
        Worker.objects.create(
            pool=pool, name=f"{pool.name}-w{index}", url=url, state=Worker.State.HEALTHY
        )
    return pool


def system_prompt(*, bench: Bench, label: str) -> str:
    """A long system prompt whose first tokens are unique to this run and phase."""
    from django.conf import settings

    from conversations.context import count_tokens, load_tokenizer

    tokenizer = load_tokenizer(str(settings.MODEL_DIR))
    phase_tag = bench.phase_tags.setdefault(label, secrets.token_hex(6))
    parts = [f"Session {phase_tag}.", SYSTEM_HEAD]
    index = 0
    while count_tokens(tokenizer, " ".join(parts)) < bench.args.system_tokens:
        parts.append(f"Rule {index + 1}: {POLICY_LINES[index % len(POLICY_LINES)]}")
        index += 1
    text = " ".join(parts)
    bench.system_prompt_tokens = count_tokens(tokenizer, text)
    return text


async def worker_loads(bench: Bench) -> list[WorkerLoad]:
    from inference.client import parse_metrics

    loads = []
    for url in bench.urls:
        response = await bench.http.get(f"{url}/metrics")
        response.raise_for_status()
        loads.append(parse_metrics(response.text))
    return loads


async def wait_idle(bench: Bench) -> None:
    """Let the workers finish whatever is still running before counters are read."""
    async with asyncio.timeout(120):
        while True:
            loads = await worker_loads(bench)
            if all(load.running + load.waiting == 0 for load in loads):
                return
            await asyncio.sleep(0.2)


async def start_scheduler(bench: Bench, label: str) -> tuple[Scheduler, asyncio.Task[None]]:
    """One in-process scheduler replica, returned once it has measured every worker."""
    from inference.scheduler import Scheduler

    scheduler = Scheduler(replica_id=f"bench-{label}-{bench.tag}")
    task = asyncio.create_task(scheduler.run())
    async with asyncio.timeout(60):
        while sum(view.load is not None for view in scheduler.workers.values()) < len(bench.urls):
            if task.done():
                await task
                fail("the scheduler stopped while starting")
            await asyncio.sleep(0.05)
    return scheduler, task


async def stop_scheduler(scheduler: Scheduler, task: asyncio.Task[None]) -> None:
    scheduler.stop()
    await task


def turn_content(conversation: int, turn: int) -> str:
    question = QUESTIONS[(conversation + 5 * turn) % len(QUESTIONS)]
    if turn == 0:
        return f"Hello, I am member number {conversation + 1}. {question}"
    return question


def generation_facts(ids: list[str]) -> dict[str, tuple[int | None, int | None, int | None]]:
    from inference.models import Generation

    rows = Generation.objects.filter(id__in=ids).values_list(
        "id", "worker_id", "prompt_tokens", "cached_tokens"
    )
    return {str(gid): (worker, prompt, cached) for gid, worker, prompt, cached in rows}


async def run_phase(bench: Bench, policy: str) -> PhaseResult:
    """The multi-turn workload under one placement policy."""
    from django.conf import settings

    from conversations.turns import conversation_start, turn_send

    args = bench.args
    settings.SCHEDULER_PLACEMENT = policy
    pool = await in_thread(make_pool)(bench=bench, label=policy)
    prompt = system_prompt(bench=bench, label=policy)
    await wait_idle(bench)
    before = await worker_loads(bench)
    scheduler, task = await start_scheduler(bench, policy)
    active = asyncio.Semaphore(args.concurrency)

    async def converse(index: int) -> list[TurnResult]:
        async with active:
            conversation = await in_thread(conversation_start)(
                user=bench.user, model=pool.name, system_prompt=prompt
            )
            results = []
            for turn in range(args.turns):
                sent = await in_thread(turn_send)(
                    user=bench.user, conversation=conversation, content=turn_content(index, turn)
                )
                generation_id = str(sent.generation.id)
                trace = await follow(bench.redis, generation_id, within=bench.args.turn_timeout)
                results.append(TurnResult(index, turn, generation_id, trace))
                if trace.status != "complete":
                    break  # the next turn would be refused or answer a broken history
            return results

    started = time.monotonic()
    try:
        conversations = await asyncio.gather(*(converse(i) for i in range(args.conversations)))
        wall = time.monotonic() - started
    finally:
        await stop_scheduler(scheduler, task)
    await wait_idle(bench)
    after = await worker_loads(bench)

    turns = [turn for conversation in conversations for turn in conversation]
    facts = await in_thread(generation_facts)([t.generation_id for t in turns])
    worker_ids = sorted(await in_thread(_worker_ids)(pool=pool))
    for turn in turns:
        turn.worker_id, turn.prompt_tokens, turn.cached_tokens = facts.get(
            turn.generation_id, (None, None, None)
        )
    return PhaseResult(
        policy=policy,
        turns=turns,
        wall_s=wall,
        prefix_queries=sum(
            a.prefix_cache_queries - b.prefix_cache_queries
            for a, b in zip(after, before, strict=True)
        ),
        prefix_hits=sum(
            a.prefix_cache_hits - b.prefix_cache_hits for a, b in zip(after, before, strict=True)
        ),
        requests_per_worker=[sum(t.worker_id == wid for t in turns) for wid in worker_ids],
    )


def _worker_ids(*, pool: ModelPool) -> list[int]:
    return list(pool.workers.values_list("id", flat=True))


async def direct_first_chunk_ms(
    bench: Bench,
    *,
    url: str,
    messages: list[dict[str, Any]],
    priority: int,
    max_tokens: int | None = None,
) -> float:
    """Time from sending a request straight to a worker to its first content chunk."""
    body = {
        "model": bench.served_model,
        "messages": messages,
        "max_tokens": max_tokens or bench.args.max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "priority": priority,
    }
    first: float | None = None
    started = time.perf_counter()
    async with bench.http.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue
            payload = line[5:].strip()
            if payload == "[DONE]":
                break
            if first is None:
                choices = json.loads(payload).get("choices") or []
                if choices and (choices[0].get("delta") or {}).get("content"):
                    first = time.perf_counter()
    if first is None:
        raise RuntimeError("the worker sent no content")
    return (first - started) * 1000


async def warm_up(bench: Bench) -> None:
    """One short untimed request per worker: a fresh vLLM process is slow on its first one.
    Its prompt has a tag of its own, so it leaves the phases no cached block."""
    prompt = system_prompt(bench=bench, label="warm-up")
    for url in bench.urls:
        await direct_first_chunk_ms(
            bench,
            url=url,
            messages=[
                {"role": "system", "content": prompt},
                {"role": "user", "content": "Say hello in three words."},
            ],
            priority=0,
            max_tokens=4,
        )


async def measure_overhead(bench: Bench) -> OverheadResult:
    """Sequential requests: the whole path versus the worker called directly."""
    from django.conf import settings
    from rest_framework.test import APIClient

    from billing.selectors import user_tier
    from conversations.turns import conversation_start
    from inference import queue
    from inference.services import tier_priority

    settings.SCHEDULER_PLACEMENT = "affinity"
    pool = await in_thread(make_pool)(bench=bench, label="overhead")
    prompt = system_prompt(bench=bench, label="overhead")
    urls_by_name = {f"{pool.name}-w{i}": url for i, url in enumerate(bench.urls)}
    priority = await in_thread(lambda: tier_priority(user_tier(user=bench.user)))()
    client = APIClient()
    client.force_authenticate(user=bench.user)
    template: list[dict[str, Any]] = [{"role": "system", "content": prompt}]
    target = bench.urls[0]
    result = OverheadResult()

    def content(index: int, side: str) -> str:
        return f"(ticket {bench.tag}-{index:03d}{side}) {QUESTIONS[index % len(QUESTIONS)]}"

    async def via_path(text: str) -> tuple[float, float, float] | None:
        nonlocal template, target
        conversation = await in_thread(conversation_start)(
            user=bench.user, model=pool.name, system_prompt=prompt
        )
        started_ms = time.time() * 1000
        response = await in_thread(client.post)(
            f"/api/v1/conversations/{conversation.id}/messages", {"content": text}, format="json"
        )
        returned_ms = time.time() * 1000
        if response.status_code != 201:
            raise RuntimeError(f"POST answered {response.status_code}: {response.content[:300]!r}")
        generation_id = str(response.json()["generation"]["id"])
        sent = await bench.redis.hget(queue.job_key(generation_id), "messages")
        if sent:
            template = json.loads(sent)[:-1]
        trace = await follow(bench.redis, generation_id, within=bench.args.turn_timeout)
        target = urls_by_name.get(trace.worker, target)
        if trace.status != "complete" or trace.first_delta_ms is None or trace.admitted_ms is None:
            return None
        return (
            returned_ms - started_ms,
            trace.admitted_ms - started_ms,
            trace.first_delta_ms - started_ms,
        )

    async def direct(text: str) -> float:
        messages = [*template, {"role": "user", "content": text}]
        return await direct_first_chunk_ms(bench, url=target, messages=messages, priority=priority)

    await wait_idle(bench)
    scheduler, task = await start_scheduler(bench, "overhead")
    try:
        # Warm both paths: the system prompt enters the worker's cache, connections open.
        await via_path(content(0, "w"))
        await direct(content(0, "v"))
        for index in range(1, bench.args.overhead_prompts + 1):
            sides = "ab" if index % 2 else "ba"
            for side in sides:
                if side == "a":
                    timing = await via_path(content(index, "a"))
                    if timing is None:
                        result.failures += 1
                        continue
                    result.post_ms.append(timing[0])
                    result.admitted_ms.append(timing[1])
                    result.path_ms.append(timing[2])
                else:
                    try:
                        result.direct_ms.append(await direct(content(index, "b")))
                    except (httpx.HTTPError, RuntimeError):
                        result.failures += 1
    finally:
        await stop_scheduler(scheduler, task)
    return result


# Reporting


def ms(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:,.0f} ms"


def pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"


def placement_table(phases: Sequence[PhaseResult]) -> str:
    headers = [
        "policy",
        "turns",
        "failed",
        "restarts",
        "per worker",
        "same worker",
        "prefix hit (vLLM)",
        "cached/prompt",
        "wait p50",
        "TTFT p50",
        "TTFT p99",
        "TTFT p50 t>1",
        "out tok/s",
        "stream tok/s",
    ]
    rows = []
    for phase in phases:
        turns = phase.turns
        ok = [t for t in turns if t.trace.status == "complete"]
        ttfts = [t.ttft_ms for t in ok if t.ttft_ms is not None]
        waits = [t.wait_ms for t in ok if t.wait_ms is not None]
        later = [t.ttft_ms for t in ok if t.ttft_ms is not None and t.turn > 0]
        previous = {(t.conversation, t.turn): t.worker_id for t in turns}
        follow_ups = [t for t in turns if t.turn > 0]
        stayed = sum(previous.get((t.conversation, t.turn - 1)) == t.worker_id for t in follow_ups)
        tokens = sum(t.trace.output_tokens or 0 for t in ok)
        speeds = [s for t in ok if (s := t.stream_tokens_per_s) is not None]
        prompt = sum(t.prompt_tokens or 0 for t in ok)
        cached = sum(t.cached_tokens or 0 for t in ok)
        rows.append(
            [
                phase.policy,
                str(len(turns)),
                str(len(turns) - len(ok)),
                str(sum(t.trace.restarts for t in turns)),
                "/".join(map(str, phase.requests_per_worker)),
                pct(stayed, len(follow_ups)),
                f"{pct(phase.prefix_hits, phase.prefix_queries)} "
                f"({phase.prefix_hits:,.0f}/{phase.prefix_queries:,.0f})",
                pct(cached, prompt),
                ms(percentile(waits, 50)),
                ms(percentile(ttfts, 50)),
                ms(percentile(ttfts, 99)),
                ms(percentile(later, 50)),
                f"{tokens / phase.wall_s:.1f}" if phase.wall_s else "-",
                f"{sum(speeds) / len(speeds):.1f}" if speeds else "-",
            ]
        )
    return render(headers, rows)


def overhead_table(result: OverheadResult) -> str:
    rows = []
    for label, values in [
        ("whole path: POST -> 201 returned", result.post_ms),
        ("whole path: POST -> admitted (meta running)", result.admitted_ms),
        ("whole path: POST -> first delta in Redis", result.path_ms),
        ("direct: request -> first content chunk", result.direct_ms),
    ]:
        rows.append(
            [label, str(len(values)), ms(percentile(values, 50)), ms(percentile(values, 99))]
        )
    path50, direct50 = percentile(result.path_ms, 50), percentile(result.direct_ms, 50)
    path99, direct99 = percentile(result.path_ms, 99), percentile(result.direct_ms, 99)
    rows.append(["overhead (path - direct)", "", ms(path50 - direct50), ms(path99 - direct99)])
    rows.append(
        [
            "ratio (path / direct)",
            "",
            f"{path50 / direct50:.2f}x" if direct50 else "-",
            f"{path99 / direct99:.2f}x" if direct99 else "-",
        ]
    )
    text = render(["sequential requests", "n", "p50", "p99"], rows)
    if result.failures:
        text += f"\n{result.failures} request(s) did not complete and are left out."
    return text


def machine_facts() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = ""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory = f", {int(line.split()[1]) / 2**20:.0f} GiB RAM"
                break
    except OSError:
        pass
    load = ", ".join(f"{value:.2f}" for value in os.getloadavg())
    return (
        f"machine: {cpu}, {os.cpu_count()} cores{memory}, {platform.system()} "
        f"{platform.release()}, Python {platform.python_version()}; load average at start {load}"
    )


async def worker_facts(bench: Bench) -> str:
    """vLLM's version and cache geometry, as the first worker reports them."""
    from prometheus_client.parser import text_string_to_metric_families

    url = bench.urls[0]
    version = "?"
    try:
        response = await bench.http.get(f"{url}/version")
        version = str(response.json().get("version", "?"))
    except (httpx.HTTPError, ValueError):
        pass
    cache = ""
    metrics = (await bench.http.get(f"{url}/metrics")).text
    for family in text_string_to_metric_families(metrics):
        if family.name.startswith("vllm:cache_config_info"):
            labels = family.samples[0].labels if family.samples else {}
            cache = (
                f", block size {labels.get('block_size', '?')}, "
                f"{labels.get('num_gpu_blocks', '?')} KV blocks per worker"
            )
            break
    return f"workers: {len(bench.urls)} x vLLM {version} serving {bench.served_model!r}{cache}"


async def served_model(http: httpx.AsyncClient, url: str) -> str:
    response = await http.get(f"{url}/v1/models")
    response.raise_for_status()
    return str(response.json()["data"][0]["id"])


def bench_user(tag: str) -> User:
    """A user on a plan whose limits the workload never reaches (free tier's priority), so
    the benchmark measures placement, not quotas."""
    from django.contrib.auth.models import User

    from billing.models import Plan
    from billing.services import subscription_set

    user = User.objects.create_user(username=f"bench-{tag}")
    plan, _ = Plan.objects.get_or_create(
        slug="benchmark",
        defaults={
            "name": "Benchmark",
            "tier": "free",
            "monthly_price_micros": 0,
            "requests_per_minute": 100_000,
            "tokens_per_minute": 100_000_000,
            "max_concurrent": 1_000,
            "max_output_tokens": 4_096,
            "message_cap": 1_000_000,
            "message_cap_window_seconds": 3_600,
        },
    )
    subscription_set(user=user, plan=plan)
    return user


async def benchmark(args: argparse.Namespace, urls: list[str], origin: str) -> str:
    """Run every phase and return the report."""
    from django.conf import settings
    from django.db import connections

    from chatsite.redis import async_redis

    tag = secrets.token_hex(4)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600, connect=5)) as http:
        bench = Bench(
            args=args,
            urls=urls,
            served_model=await served_model(http, urls[0]),
            tag=tag,
            user=await in_thread(bench_user)(tag),
            redis=async_redis(socket_timeout=60),
            http=http,
        )
        facts = await worker_facts(bench)
        machine = machine_facts()
        try:
            await warm_up(bench)
            phases = [await run_phase(bench, policy) for policy in args.order]
            overhead = await measure_overhead(bench) if args.overhead_prompts else None
        finally:
            await bench.redis.aclose()
            await in_thread(connections.close_all)()

    header = [
        f"Scheduler placement benchmark, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC (run {tag})",
        machine,
        f"{facts} ({origin})",
        f"command: {shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]])}",
        "",
        f"Placement: {args.conversations} conversations x {args.turns} turns, at most "
        f"{args.concurrency} active at once, max_tokens {args.max_tokens}, one system prompt "
        f"of {bench.system_prompt_tokens} tokens per phase (a fresh random head each phase), "
        f"phases in this order: {' then '.join(args.order)}; one in-process scheduler replica "
        f"(coalescing {settings.SCHEDULER_COALESCE_MS} ms, affinity slack "
        f"{settings.SCHEDULER_AFFINITY_SLACK}).",
        "TTFT = first delta in the generation's Redis Stream - its enqueue (meta queued); "
        "'t>1' = follow-up turns only; wait = enqueue -> admitted to a worker (meta running);",
        "failed = not complete (an error, or no done event within --turn-timeout); "
        "'same worker' = follow-up turns placed on the worker of the turn before; restarts = "
        "answers moved to the other worker after a fault (e.g. no token for "
        f"{settings.SCHEDULER_STALL_SECONDS} s);",
        "prefix hit = change of vLLM's prefix_cache hits/queries (tokens) over the phase, both "
        "workers; cached/prompt = usage.prompt_tokens_details of the answers;",
        "out tok/s = output tokens / phase wall time; stream tok/s = mean decode speed of one "
        "answer after its first token.",
        "",
        placement_table(phases),
    ]
    if overhead is not None:
        header += [
            "",
            f"Path overhead: {args.overhead_prompts} prompts per path, one request at a time, "
            f"alternating path/direct, max_tokens {args.max_tokens}, the same system prompt "
            "(cached) and a fresh question tag per request, on the worker the path chose.",
            "Path = POST /api/v1/conversations/<id>/messages with DRF's APIClient (edge "
            "in-process, same process as the scheduler) -> Redis queue -> scheduler -> vLLM "
            "-> first delta entry in Redis.",
            "",
            overhead_table(overhead),
        ]
    return "\n".join(header) + "\n"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Conversation affinity vs round-robin on real vLLM workers, and the "
        "overhead of the whole path against calling vLLM directly."
    )
    parser.add_argument("--conversations", type=int, default=16)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=8, help="conversations active at once")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument(
        "--system-tokens", type=int, default=512, help="length of the shared system prompt"
    )
    parser.add_argument(
        "--overhead-prompts", type=int, default=20, help="requests per path; 0 skips it"
    )
    parser.add_argument(
        "--order",
        default="affinity,round_robin",
        help=f"placement policies, in the order run (from {', '.join(PLACEMENTS)})",
    )
    parser.add_argument(
        "--workers", default="", help="comma-separated worker URLs; default: start two"
    )
    parser.add_argument(
        "--turn-timeout",
        type=float,
        default=300,
        help="seconds to wait for one answer's done event before counting it failed",
    )
    parser.add_argument("--worker-count", type=int, default=2, help="workers to start")
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    args.order = [policy.strip() for policy in args.order.split(",") if policy.strip()]
    unknown = sorted(set(args.order) - set(PLACEMENTS))
    if unknown or not args.order:
        parser.error(f"--order takes policies from {', '.join(PLACEMENTS)}")
    args.workers = [url.strip().rstrip("/") for url in args.workers.split(",") if url.strip()]
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    bootstrap()
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    prepare_stores()
    started: list[WorkerProcess] = []
    try:
        if args.workers:
            urls = args.workers
            origin = "given with --workers"
        else:
            log_dir = Path(tempfile.mkdtemp(prefix="bench-vllm-"))
            print(f"starting {args.worker_count} vLLM workers (logs in {log_dir}) ...", flush=True)
            start_workers(args.worker_count, log_dir, started)
            wait_healthy(started)
            urls = [worker.url for worker in started]
            binding = os.environ.get("VLLM_CPU_OMP_THREADS_BIND") or " | ".join(
                ",".join(map(str, cpus)) for cpus in cpu_shares(args.worker_count)
            )
            origin = f"started by this script, cores per worker: {binding}"
        report = asyncio.run(benchmark(args, urls, origin=origin))
    finally:
        stop_workers(started)
    print(report)
    path = write_result(args.results_dir, "scheduler_affinity", report)
    print(f"written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
