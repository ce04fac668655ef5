"""Where one answer's first-token time goes, with nothing else running.

One request at a time, by three sides in alternating rounds: the worker called directly, the
service's `/v1/chat/completions` and the conversation API (`POST .../messages`, then the
answer's Server-Sent Events). For each service answer, the stages between the request and
its first text, from the clocks of this machine: the client's, the job's timestamps in Redis
(`enqueued_ms` set by the edge, `claimed_ms` by the scheduler's claim, `first_token_ms` when
the worker's first text reached the scheduler) and the ids of the stream's entries (a Redis
Stream id starts with the millisecond it was added):

    edge in        request sent -> job enqueued (parse, auth, limits, the turn's rows)
    to claim       enqueued -> claimed (commit, the queue, the scheduler waking up)
    to worker      claimed -> `meta` running written (placement, lease, the job read)
    worker TTFT    `meta` -> first text at the scheduler (the worker's prefill; compare direct)
    to stream      first text at the scheduler -> its `delta` entry
    to client      `delta` entry -> the client reads the text (the edge's reader, SSE)

A `/v1` answer the edge reads from the worker itself (a key that keeps nothing: inference/
relay.py) has no `meta` running and no `delta` a token: its `to worker` ends at the `relay`
order's entry, its `worker TTFT` at the edge's first text (the job's `relay_first`), and its
`to stream` is nothing (the text goes from the edge's read straight to the client).

For the conversation API the POST's answer time and the time its stream opened are shown too
(the stream is opened after the POST). All values are medians over the rounds, in milliseconds;
a stage is only as exact as Redis's millisecond ids. The job's timestamps are read as the
first text arrives; an answer that was already over by then (its job is deleted at the end)
is not traced ("traced" counts those that were): answers of a few dozen tokens leave the
client hundreds of milliseconds for it.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/chatsite_latency_bench \\
    REDIS_URL=redis://127.0.0.1:6379/13 SECRET_KEY=x \\
    .venv/bin/python benchmarks/latency.py --workers http://127.0.0.1:8201 --rounds 20

It prints one table and writes it to benchmarks/results/latency-<UTC date-time>.txt.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import platform
import secrets
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import (  # noqa: E402
    django_start,
    percentile,
    prepare_stores,
    render,
    write_result,
)
from benchmarks.openai_api import prepare, prompt, running_service  # noqa: E402
from benchmarks.overhead import sse_events  # noqa: E402

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/chatsite_latency_bench"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/13"
SIDES = ("direct", "v1", "conversations")
STAGES = ("edge in", "to claim", "to worker", "worker TTFT", "to stream", "to client")


@dataclass
class Trace:
    """One answer: its first-token time and, for the service, the times of its stages."""

    ttft_ms: float | None = None
    post_ms: float | None = None
    open_ms: float | None = None
    stages: dict[str, float] = field(default_factory=dict)
    error: str = ""


def now_ms() -> float:
    return time.time() * 1000


# How many times to read a relayed answer's marks before its first-token mark is in.
RELAY_MARK_TRIES = 100


def entry_ms(entry_id: str) -> float:
    return float(entry_id.split("-", 1)[0])


async def server_marks(redis: Any, generation_id: str) -> dict[str, float]:
    """The job's timestamps and the ids of its stream's first entries, read as the first text
    arrives (the job is deleted once the answer is final). A relayed answer's edge notes its
    first token just after sending it: read again, a few ms apart, until that mark is in."""
    from inference import queue, relay

    for _ in range(RELAY_MARK_TRIES):
        job, entries = await asyncio.gather(
            redis.hgetall(queue.job_key(generation_id)),
            redis.xrange(queue.stream_key(generation_id), count=20),
        )
        relayed = any(fields.get("event") == "relay" for _, fields in entries)
        if not relayed or not job or relay.FIRST_FIELD in job:
            break
        await asyncio.sleep(0.005)
    marks = {
        name: float(job[name])
        for name in ("enqueued_ms", "claimed_ms", "first_token_ms")
        if name in job
    }
    for entry_id, fields in entries:
        event = fields.get("event")
        if event == "meta" and "running" in fields.get("data", "") and "meta" not in marks:
            marks["meta"] = entry_ms(entry_id)
        if event == "relay" and "meta" not in marks:
            marks["meta"] = entry_ms(entry_id)
        if event == "delta" and "delta" not in marks:
            marks["delta"] = entry_ms(entry_id)
    if relay.FIRST_FIELD in job:
        # Relayed: the first text as the edge read it, on its way to the client at once.
        _, first_ms = relay.parse_beat(job[relay.FIRST_FIELD])
        marks["first_token_ms"] = marks["delta"] = float(first_ms)
    return marks


def stages(sent: float, first: float, marks: dict[str, float]) -> dict[str, float]:
    needed = ("enqueued_ms", "claimed_ms", "meta", "first_token_ms", "delta")
    if any(name not in marks for name in needed):
        return {}
    points = [sent, *(marks[name] for name in needed), first]
    return {name: points[i + 1] - points[i] for i, name in enumerate(STAGES)}


def first_text(data: str) -> bool:
    if data == "[DONE]":
        return False
    choices = json.loads(data).get("choices") or []
    return bool(choices and (choices[0].get("delta") or {}).get("content"))


async def completion(
    client: httpx.AsyncClient, redis: Any, model: str, messages: Any, max_tokens: int
) -> Trace:
    """One streamed `/v1/chat/completions` (the worker's or the service's)."""
    trace = Trace()
    body = {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
    }
    sent = now_ms()
    try:
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            response.raise_for_status()
            async for _, data in sse_events(response):
                if trace.ttft_ms is None and first_text(data):
                    first = now_ms()
                    trace.ttft_ms = first - sent
                    request_id = response.headers.get("x-request-id", "")
                    if redis is not None and request_id.startswith("chatcmpl-"):
                        marks = await server_marks(redis, request_id.removeprefix("chatcmpl-"))
                        trace.stages = stages(sent, first, marks)
    except (httpx.HTTPError, ValueError) as exc:
        trace.error = f"{type(exc).__name__}: {exc}"[:200]
    return trace


async def conversation(client: httpx.AsyncClient, redis: Any, messages: Any) -> Trace:
    """One message through the conversation API: the POST, then its answer's stream."""
    trace = Trace()
    try:
        created = await client.post(
            "/api/v1/conversations", json={"system_prompt": messages[0]["content"]}
        )
        created.raise_for_status()
        sent = now_ms()
        posted = await client.post(
            f"/api/v1/conversations/{created.json()['id']}/messages",
            json={"content": messages[1]["content"]},
        )
        trace.post_ms = now_ms() - sent
        posted.raise_for_status()
        generation = posted.json()["generation"]
        async with client.stream("GET", generation["stream_url"]) as response:
            response.raise_for_status()
            trace.open_ms = now_ms() - sent
            async for event, _ in sse_events(response):
                if event == "delta" and trace.ttft_ms is None:
                    first = now_ms()
                    trace.ttft_ms = first - sent
                    trace.stages = stages(sent, first, await server_marks(redis, generation["id"]))
                if event in ("done", "error"):
                    break
    except (httpx.HTTPError, KeyError, ValueError) as exc:
        trace.error = f"{type(exc).__name__}: {exc}"[:200]
    return trace


def median(values: Sequence[float]) -> str:
    return f"{percentile(values, 50):.1f}" if values else "-"


def report(traces: dict[str, list[Trace]]) -> str:
    direct = [t.ttft_ms for t in traces["direct"] if t.ttft_ms is not None]
    headers = [
        "side",
        "ok/all",
        "traced",
        "TTFT p50",
        "TTFT p90",
        "vs direct",
        "POST p50",
        "stream open",
        *STAGES,
    ]
    rows = []
    for side in SIDES:
        done = [t for t in traces[side] if t.ttft_ms is not None]
        ttfts = [t.ttft_ms for t in done if t.ttft_ms is not None]
        traced = [t for t in done if t.stages]
        excess = (
            f"+{percentile(ttfts, 50) - percentile(direct, 50):.1f}"
            if side != "direct" and ttfts and direct
            else ""
        )
        rows.append(
            [
                side,
                f"{len(done)}/{len(traces[side])}",
                f"{len(traced)}/{len(done)}" if side != "direct" else "",
                median(ttfts),
                f"{percentile(ttfts, 90):.1f}" if ttfts else "-",
                excess,
                median([t.post_ms for t in done if t.post_ms is not None]),
                median([t.open_ms for t in done if t.open_ms is not None]),
                *(
                    median([t.stages[name] for t in traced]) if side != "direct" else ""
                    for name in STAGES
                ),
            ]
        )
    errors = [f"  {side}: {t.error}" for side in SIDES for t in traces[side] if t.error]
    return render(headers, rows) + ("\n\nerrors:\n" + "\n".join(errors[:20]) if errors else "")


async def measure(args: argparse.Namespace, edge_url: str, raw_key: str) -> dict[str, list[Trace]]:
    from django.conf import settings

    from chatsite.redis import async_redis

    redis = async_redis()
    direct = httpx.AsyncClient(base_url=args.worker, timeout=120)
    service = httpx.AsyncClient(
        base_url=edge_url, headers={"Authorization": f"Bearer {raw_key}"}, timeout=120
    )
    served = (await direct.get("/v1/models")).json()["data"][0]["id"]
    traces: dict[str, list[Trace]] = {side: [] for side in SIDES}
    try:
        for warm in range(2):  # connections, the edge's and scheduler's first requests
            messages = prompt("warm", warm)
            await completion(direct, None, served, messages, 4)
            await completion(service, redis, settings.DEFAULT_MODEL, messages, 4)
            await conversation(service, redis, messages)
        tag = secrets.token_hex(4)
        for index in range(args.rounds):
            order = SIDES[index % 3 :] + SIDES[: index % 3]
            for side in order:
                # Each side's own prompt: none finds another's in the worker's cache.
                messages = prompt(f"{tag}-{side}", index)
                if side == "direct":
                    trace = await completion(direct, None, served, messages, args.max_tokens)
                elif side == "v1":
                    trace = await completion(
                        service, redis, settings.DEFAULT_MODEL, messages, args.max_tokens
                    )
                else:
                    trace = await conversation(service, redis, messages)
                traces[side].append(trace)
                await asyncio.sleep(args.pause)
    finally:
        await direct.aclose()
        await service.aclose()
        await redis.aclose()
    return traces


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", default=os.environ.get("CHATSITE_E2E_WORKER_URLS", ""))
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--pause", type=float, default=0.2, help="seconds between requests")
    parser.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    args.worker = args.worker.split(",")[0].strip().rstrip("/")
    if not args.worker:
        raise SystemExit("Give the worker: --worker URL (or CHATSITE_E2E_WORKER_URLS).")
    django_start(database_url=DEFAULT_DATABASE_URL, redis_url=DEFAULT_REDIS_URL)
    prepare_stores()
    from django.conf import settings
    from django.db import connections

    from chatsite.catalog import catalog_changed
    from inference.models import ModelPool

    served = httpx.get(f"{args.worker}/v1/models", timeout=10).json()["data"][0]["id"]
    raw_key = prepare([args.worker], served)
    # The conversation API has no max_tokens of its own: the pool's cap sets its answers'.
    ModelPool.objects.filter(name=settings.DEFAULT_MODEL).update(max_output_tokens=args.max_tokens)
    catalog_changed()  # update() sends no signal
    connections.close_all()

    with running_service("latency-bench") as (edge_url, logs):
        traces = asyncio.run(measure(args, edge_url, raw_key))
    facts = (
        f"latency benchmark, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, "
        f"{os.cpu_count()} CPUs; worker {args.worker} ({served}); one request at a time, "
        f"{args.rounds} rounds of the three sides in turn, max_tokens {args.max_tokens}; "
        "medians in ms"
    )
    text = "\n".join([facts, "", report(traces)])
    print(text)
    out = write_result(args.results, "latency", text)
    print(f"\nwritten to {out}; logs in {logs}")
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    raise SystemExit(main())
