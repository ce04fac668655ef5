"""Checks per second of the default moderation backend, and the latency it adds per window
of a streamed answer.

Two questions, answered in one run against real Postgres and Redis (thresholds and staff
rules are read through the cache, as in production):

1. Throughput. One thread calls `moderation.engine.evaluate` in a loop for a few seconds,
   on the labelled corpus' inputs (short user messages) and on 200-token windows of answer
   text. Reported: checks per second and p50/p99 of one check.
2. Streaming. The scheduler's own path for one window (`moderation.output.check`: the policy
   through `sync_to_async`, the classifiers in a worker thread) awaited in an event loop, with
   S concurrent streams checking at once. Reported: p50/p99 of the time a stream's flush
   waits for its check, and that time spread over the window's tokens.

Run it:

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/chatsite_bench_moderation \\
    REDIS_URL=redis://127.0.0.1:6379/12 SECRET_KEY=x \\
    .venv/bin/python benchmarks/moderation_throughput.py --seconds 3

It uses its own database (created and migrated if missing; the name must contain "bench") and
its own Redis database (never db 0; flushed at start), prints one table and writes it to
benchmarks/results/moderation_throughput-<UTC date-time>.txt.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

# Run as a script (`python benchmarks/<name>.py`): the project root must be importable.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import django_start, percentile, prepare_stores, render

BASE_DIR = Path(__file__).resolve().parent.parent
RESULTS_DIR = BASE_DIR / "benchmarks" / "results"
CORPUS = BASE_DIR / "moderation" / "tests" / "corpus.tsv"
DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/chatsite_bench_moderation"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/12"
WINDOW_TOKENS = 200
CHARS_PER_TOKEN = 4


def bootstrap() -> None:
    django_start(database_url=DEFAULT_DATABASE_URL, redis_url=DEFAULT_REDIS_URL)


def corpus_texts() -> list[str]:
    return [
        line.split("\t")[2]
        for line in CORPUS.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]


def answer_windows(texts: list[str], count: int = 50) -> list[str]:
    """Windows of about 200 tokens of prose, cut from the corpus' benign lines."""
    prose = " ".join(texts)
    size = WINDOW_TOKENS * CHARS_PER_TOKEN
    step = max(1, (len(prose) - size) // count)
    return [prose[i : i + size] for i in range(0, len(prose) - size, step)][:count]


def loop_checks(check: Callable[[str], object], texts: list[str], seconds: float) -> list[float]:
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds
    index = 0
    while time.perf_counter() < deadline:
        started = time.perf_counter()
        check(texts[index % len(texts)])
        latencies.append(time.perf_counter() - started)
        index += 1
    return latencies


async def stream_waits(windows: list[str], streams: int, rounds: int) -> list[float]:
    from moderation.output import check

    waits: list[float] = []

    async def one_stream(offset: int) -> None:
        for round_ in range(rounds):
            started = time.perf_counter()
            await check(windows[(offset + round_) % len(windows)])
            waits.append(time.perf_counter() - started)

    await asyncio.gather(*(one_stream(index) for index in range(streams)))
    return waits


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="per throughput row")
    parser.add_argument("--rounds", type=int, default=20, help="windows per stream")
    args = parser.parse_args()
    bootstrap()
    prepare_stores()
    from django.conf import settings

    from moderation import engine

    texts = corpus_texts()
    windows = answer_windows(texts)
    policy = engine.policy()
    engine.evaluate("warm up the model", policy)

    rows = []
    for name, inputs in (("corpus inputs", texts), ("200-token windows", windows)):
        latencies = loop_checks(lambda text: engine.evaluate(text, policy), inputs, args.seconds)
        rows.append(
            [
                f"evaluate, {name}",
                "1",
                f"{len(latencies) / sum(latencies):.0f}/s",
                ms(percentile(latencies, 50)),
                ms(percentile(latencies, 99)),
                "-",
            ]
        )
    for streams in (1, 4, 16):
        waits = asyncio.run(stream_waits(windows, streams, args.rounds))
        rows.append(
            [
                "stream window check",
                str(streams),
                f"{len(waits) / sum(waits) * streams:.0f}/s",
                ms(percentile(waits, 50)),
                ms(percentile(waits, 99)),
                f"{percentile(waits, 50) * 1000 / WINDOW_TOKENS:.3f} ms",
            ]
        )
    table = render(
        ["check", "streams", "checks", "p50", "p99", "p50 per token"],
        rows,
    )
    header = (
        f"moderation backends: {', '.join(settings.MODERATION_BACKENDS)}\n"
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}; windows of {WINDOW_TOKENS} tokens "
        f"({WINDOW_TOKENS * CHARS_PER_TOKEN} characters)\n"
    )
    print(header + table)
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    (RESULTS_DIR / f"moderation_throughput-{stamp}.txt").write_text(header + table + "\n")


if __name__ == "__main__":
    main()
