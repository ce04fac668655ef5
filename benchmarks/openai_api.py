"""The OpenAI-compatible API against the vLLM workers it fronts: what the whole path costs.

The same prompts, streamed with the official `openai` client (`AsyncOpenAI`, one per side)
at each concurrency level (`--concurrency`, default 1, 8 and 32 streams at once):

- path: `POST /v1/chat/completions` on a real edge (`chatsite.edge`, started here), through the key
  check, the plan and quota reservation, input moderation, the Redis queue, a scheduler
  process (started here, `manage.py run_scheduler`) and its placement, to the workers;
- direct: `POST /v1/chat/completions` straight to the workers, the requests spread over
  them in turn.

Per level and side: TTFT (request sent to first content chunk) p50/p99, decode speed of one
stream (completion tokens after the first over the time from the first chunk to the last)
p50, output tokens/s over the level's wall time, and errors; then the path/direct ratios.
Both sides decode greedily (temperature 0) with the same `--max-tokens`; each side's prompts
start with their own random tag, so neither finds the other's prompts in the prefix cache.
The sides alternate per level (direct first on even levels) so neither always runs on a
warmer machine.

Run it against running workers (the team's shared ones, or `make run`'s):

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/chatsite_oaibench \\
    REDIS_URL=redis://127.0.0.1:6379/11 SECRET_KEY=x \\
    .venv/bin/python benchmarks/openai_api.py --workers http://127.0.0.1:8201,http://127.0.0.1:8202

It uses its own database (created and migrated if missing; the name must contain "bench") and
its own Redis database (never db 0; flushed at start), prints one table and writes it to
benchmarks/results/openai_api-<UTC date-time>.txt.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import openai

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import (  # noqa: E402
    django_start,
    edge_command,
    free_port,
    percentile,
    prepare_stores,
    ratio,
    render,
    service_env,
    write_result,
)

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/chatsite_oaibench"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/11"
TOPICS = [
    "bread",
    "rivers",
    "bicycles",
    "tea",
    "owls",
    "glass",
    "maps",
    "bees",
    "clocks",
    "salt",
    "bridges",
    "paper",
]


@dataclass
class Sample:
    """One streamed answer as the client saw it."""

    ttft: float | None = None
    decode_tps: float | None = None
    tokens: int = 0
    error: str | None = None


@dataclass
class Level:
    """One side at one concurrency level."""

    side: str
    concurrency: int
    wall: float = 0.0
    samples: list[Sample] = field(default_factory=list)

    @property
    def ok(self) -> list[Sample]:
        return [s for s in self.samples if s.error is None and s.ttft is not None]

    def ttft(self, q: float) -> float:
        return percentile([s.ttft for s in self.ok if s.ttft is not None], q)

    def decode(self) -> float:
        return percentile([s.decode_tps for s in self.ok if s.decode_tps is not None], 50)

    def throughput(self) -> float:
        return sum(s.tokens for s in self.ok) / self.wall if self.wall else 0.0


def prompt(tag: str, index: int) -> list[Any]:
    topic = TOPICS[index % len(TOPICS)]
    return [
        {"role": "system", "content": f"[{tag}] You are a helpful assistant."},
        {"role": "user", "content": f"Request {index}: tell me three facts about {topic}."},
    ]


async def one(client: openai.AsyncOpenAI, model: str, messages: Any, max_tokens: int) -> Sample:
    sample = Sample()
    started = time.perf_counter()
    first = last = 0.0
    # A gateway that drops the usage chunk (`stream_options`) is read by its chunks: vLLM
    # sends one token per chunk.
    chunks = 0
    try:
        stream = await client.chat.completions.create(
            model=model,
            messages=messages,
            max_tokens=max_tokens,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                chunks += 1
                last = time.perf_counter()
                if sample.ttft is None:
                    first = last
                    sample.ttft = first - started
            if chunk.usage is not None:
                sample.tokens = chunk.usage.completion_tokens
    except openai.APIError as exc:
        sample.error = f"{type(exc).__name__}: {exc}"[:200]
        return sample
    sample.tokens = sample.tokens or chunks
    if sample.tokens > 1 and last > first:
        sample.decode_tps = (sample.tokens - 1) / (last - first)
    return sample


async def run_level(
    *,
    side: str,
    clients: Sequence[openai.AsyncOpenAI],
    model: str,
    concurrency: int,
    requests: int,
    max_tokens: int,
) -> Level:
    level = Level(side=side, concurrency=concurrency)
    tag = secrets.token_hex(4)
    gate = asyncio.Semaphore(concurrency)

    async def bounded(index: int) -> Sample:
        async with gate:
            client = clients[index % len(clients)]
            return await one(client, model, prompt(tag, index), max_tokens)

    started = time.perf_counter()
    level.samples = list(await asyncio.gather(*(bounded(i) for i in range(requests))))
    level.wall = time.perf_counter() - started
    return level


# Setup: Django, the stores, a user with a key, the pool, the edge and the scheduler


def bootstrap() -> None:
    django_start(database_url=DEFAULT_DATABASE_URL, redis_url=DEFAULT_REDIS_URL)


def prepare(urls: list[str], served_model: str) -> str:
    """Register the pool and a bench user on a roomy plan; returns the user's raw API key."""
    from django.conf import settings

    from inference.models import ModelPool, Worker

    pool, _ = ModelPool.objects.update_or_create(
        name=settings.DEFAULT_MODEL,
        defaults={"served_model": served_model, "max_output_tokens": 512, "is_active": True},
    )
    Worker.objects.filter(pool=pool).delete()
    for index, url in enumerate(urls):
        Worker.objects.create(pool=pool, name=f"bench-{index}", url=url, state=Worker.State.HEALTHY)
    return bench_key(tier="pro")


def bench_key(*, tier: str) -> str:
    """A new bench user on a roomy plan of `tier` (limits far past any benchmark's); returns
    its raw API key, which keeps no conversations."""
    from django.contrib.auth.models import User

    from accounts.services import api_key_create
    from billing.models import Plan
    from billing.services import subscription_set

    plan, _ = Plan.objects.get_or_create(
        slug="openai-benchmark" if tier == "pro" else f"openai-benchmark-{tier}",
        defaults={
            "name": f"OpenAI benchmark ({tier})",
            "tier": tier,
            "requests_per_minute": 100_000,
            "tokens_per_minute": 100_000_000,
            "max_concurrent": 1_000,
            "max_output_tokens": 4_096,
        },
    )
    user = User.objects.create_user(username=f"oai-bench-{secrets.token_hex(4)}")
    subscription_set(user=user, plan=plan)
    return api_key_create(user=user, name="benchmark", store_conversations=False)[1]


def start(command: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(  # noqa: S603 (our own command line)
        command,
        cwd=ROOT,
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def wait_up(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.HTTPError:
            if process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"{url} did not come up:\n{log.read_text()[-2000:]}") from None
            time.sleep(0.2)


@contextlib.contextmanager
def running_service(name: str) -> Iterator[tuple[str, Path]]:
    """One edge and one scheduler replica (`name`), started for a benchmark and stopped after
    it; yields the edge's URL, once it answers, and the folder of their logs."""
    logs = Path(tempfile.mkdtemp(prefix=f"{name}-"))
    env = service_env()
    port = free_port()
    edge = start(edge_command(port), logs / "edge.log", env)
    scheduler = start(
        [sys.executable, "manage.py", "run_scheduler", "--replica-id", name],
        logs / "scheduler.log",
        env,
    )
    edge_url = f"http://127.0.0.1:{port}"
    try:
        wait_up(f"{edge_url}/v1/models", edge, logs / "edge.log")
        yield edge_url, logs
    finally:
        stop(edge)
        stop(scheduler)


# The report


def ms(seconds: float) -> str:
    return "-" if seconds != seconds else f"{seconds * 1000:.0f}"


def num(value: float) -> str:
    return "-" if value != value else f"{value:.1f}"


def table(levels: list[tuple[Level, Level]]) -> str:
    headers = [
        "streams",
        "side",
        "ok/all",
        "TTFT p50 ms",
        "TTFT p99 ms",
        "decode tok/s p50",
        "output tok/s",
    ]
    rows = []
    for path, direct in levels:
        for level in (direct, path):
            rows.append(
                [
                    str(level.concurrency),
                    level.side,
                    f"{len(level.ok)}/{len(level.samples)}",
                    ms(level.ttft(50)),
                    ms(level.ttft(99)),
                    num(level.decode()),
                    num(level.throughput()),
                ]
            )
        rows.append(
            [
                str(path.concurrency),
                "path/direct",
                "",
                ratio(path.ttft(50), direct.ttft(50)),
                ratio(path.ttft(99), direct.ttft(99)),
                ratio(path.decode(), direct.decode()),
                ratio(path.throughput(), direct.throughput()),
            ]
        )
    return render(headers, rows)


def errors(levels: list[tuple[Level, Level]]) -> str:
    seen = [
        f"  {level.side} x{level.concurrency}: {sample.error}"
        for pair in levels
        for level in pair
        for sample in level.samples
        if sample.error
    ]
    return "\n".join(["errors:", *seen[:10]]) if seen else "errors: none"


async def measure(args: argparse.Namespace, edge_url: str, raw_key: str, urls: list[str]) -> str:
    from django.conf import settings

    path_client = [openai.AsyncOpenAI(base_url=f"{edge_url}/v1", api_key=raw_key, max_retries=0)]
    direct_clients = [
        openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0) for url in urls
    ]
    served = (await direct_clients[0].models.list()).data[0].id
    # Warm-up: one request each way, so neither side pays for first connections.
    await one(path_client[0], settings.DEFAULT_MODEL, prompt("warm", 0), 4)
    await one(direct_clients[0], served, prompt("warm", 0), 4)

    results: list[tuple[Level, Level]] = []
    for index, concurrency in enumerate(args.concurrency):
        requests = max(concurrency * args.rounds, args.min_requests)
        common = {"concurrency": concurrency, "requests": requests, "max_tokens": args.max_tokens}
        sides = [
            ("path", path_client, settings.DEFAULT_MODEL),
            ("direct", direct_clients, served),
        ]
        if index % 2 == 0:
            sides.reverse()
        done: dict[str, Level] = {}
        for side, clients, model in sides:
            done[side] = await run_level(side=side, clients=clients, model=model, **common)
            print(
                f"  {side:6} x{concurrency}: {len(done[side].ok)}/{requests} ok "
                f"in {done[side].wall:.1f} s",
                flush=True,
            )
        results.append((done["path"], done["direct"]))
    facts = (
        f"openai_api benchmark, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, "
        f"{os.cpu_count()} CPUs; workers {', '.join(urls)} ({served}); max_tokens "
        f"{args.max_tokens}, temperature 0, >= {args.rounds} requests per stream slot "
        f"(at least {args.min_requests}) per level"
    )
    return "\n".join([facts, "", table(results), "", errors(results)])


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "--workers",
        default=os.environ.get("CHATSITE_E2E_WORKER_URLS", ""),
        help="comma-separated URLs of running vLLM workers (default: CHATSITE_E2E_WORKER_URLS)",
    )
    parser.add_argument(
        "--concurrency",
        default="1,8,32",
        type=lambda text: [int(part) for part in text.split(",") if part],
        help="streams at once, per level (default 1,8,32)",
    )
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2, help="requests per stream slot")
    parser.add_argument("--min-requests", type=int, default=6)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    urls = [url.strip().rstrip("/") for url in args.workers.split(",") if url.strip()]
    if not urls:
        raise SystemExit("Give the workers: --workers URL[,URL] (or CHATSITE_E2E_WORKER_URLS).")
    bootstrap()
    prepare_stores()
    from django.db import connections

    served = httpx.get(f"{urls[0]}/v1/models", timeout=10).json()["data"][0]["id"]
    raw_key = prepare(urls, served)
    connections.close_all()

    with running_service("openai-bench") as (edge_url, logs):
        report = asyncio.run(measure(args, edge_url, raw_key, urls))
    print(report)
    out = write_result(ROOT / "benchmarks" / "results", "openai_api", report)
    print(f"\nwritten to {out.relative_to(ROOT)}; logs in {logs}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
