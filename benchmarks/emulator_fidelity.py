"""Emulator fidelity: a real vLLM worker and an emulated one fitted to it, on the same trace.

The profile is fitted to the real worker first (`fleet_sim.calibrate`: a first token after a
short and a long fresh prompt, answers alone and 16 at once), then an emulated worker with that
profile and the real worker's cache size is started, and the same trace runs on each, the
sides alternating per level: streamed chat answers of `--max-tokens` (with `min_tokens`, so a
real answer is as long as an emulated one) under shared system prompts, at each concurrency.
Each side's prompts carry a nonce of their own, so each starts with a cold cache.

Per level and side: TTFT p50 / p99, decode tokens/s per stream p50, output tokens/s over the
level; then the emulator over the real worker, with issue 35's bar (within 15%), and the
emulator's own CPU per answer (its process, from its /metrics).

    .venv/bin/python benchmarks/emulator_fidelity.py --worker http://127.0.0.1:8201

No database or Redis; it prints a table and writes it to benchmarks/results/.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import free_port, percentile, ratio, render, write_result  # noqa: E402
from benchmarks.emulator.launch import Fleet, process_cpu_seconds, start_fleet  # noqa: E402
from benchmarks.fleet_sim import WorkerModel, calibrate  # noqa: E402
from inference.client import parse_metrics  # noqa: E402

BAR = 0.15
TOPICS = ("the sea", "mountains", "old trains", "bread baking", "the night sky", "rivers")


@dataclass
class Level:
    side: str
    streams: int
    ttft: list[float] = field(default_factory=list)
    decode_rate: list[float] = field(default_factory=list)
    tokens: int = 0
    seconds: float = 0.0
    errors: int = 0
    cpu_seconds: float | None = None

    @property
    def output_rate(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


def system_prompt(nonce: str, number: int) -> str:
    topic = TOPICS[number % len(TOPICS)]
    return f"[{nonce}] You are a patient guide who explains {topic} plainly. " * 8


async def one(
    client: httpx.AsyncClient, url: str, model: str, level: Level, messages: list[Any], n: int
) -> None:
    body = {
        "model": model,
        "messages": messages,
        "max_tokens": n,
        "min_tokens": n,
        "temperature": 0,
        "stream": True,
    }
    started = time.perf_counter()
    first = last = 0.0
    chunks = 0
    try:
        async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
            response.raise_for_status()
            async for line in response.aiter_lines():
                if (
                    line.startswith("data: {")
                    and '"content":"' in line
                    and '"content":""' not in line
                ):
                    last = time.perf_counter()
                    first = first or last
                    chunks += 1
    except httpx.HTTPError:
        level.errors += 1
        return
    level.ttft.append((first - started) * 1000)
    if chunks > 1:
        level.decode_rate.append((chunks - 1) / (last - first))
    level.tokens += chunks


async def run_level(
    url: str, model: str, side: str, streams: int, rounds: int, max_tokens: int
) -> Level:
    level = Level(side, streams)
    nonce = f"{side}-{streams}-{random.randrange(10**9)}"
    async with httpx.AsyncClient(timeout=600) as client:

        async def user(number: int) -> None:
            for turn in range(rounds):
                messages = [
                    {"role": "system", "content": system_prompt(nonce, number)},
                    {"role": "user", "content": f"Question {number}.{turn}: tell me more."},
                ]
                await one(client, url, model, level, messages, max_tokens)

        started = time.perf_counter()
        await asyncio.gather(*(user(number) for number in range(streams)))
        level.seconds = time.perf_counter() - started
    return level


def start_emulator(model: WorkerModel, served: str, port: int) -> Fleet:
    return start_fleet(
        [
            *("--port", str(port), "--profile", "cpu-smollm2", "--served-model-name", served),
            *("--num-blocks", str(model.num_blocks), "--block-size", str(model.block_size)),
            *("--step-ms", f"{model.step_ms:.3f}"),
            *("--decode-ms-per-stream", f"{model.step_ms_per_stream:.4f}"),
            *("--prefill-ms-per-token", f"{model.prefill_ms_per_token:.4f}"),
        ]
    )


def report(levels: list[Level], fitted: WorkerModel, facts: str) -> tuple[str, bool]:
    rows, verdicts = [], []
    for level in levels:
        rows.append(
            [
                str(level.streams),
                level.side,
                f"{len(level.ttft)}/{len(level.ttft) + level.errors}",
                f"{percentile(level.ttft, 50):.0f}",
                f"{percentile(level.ttft, 99):.0f}",
                f"{percentile(level.decode_rate, 50):.1f}",
                f"{level.output_rate:.1f}",
                "" if level.cpu_seconds is None else f"{level.cpu_seconds * 1000:.1f}",
            ]
        )
    by = {(level.streams, level.side): level for level in levels}
    ratios = []
    for streams in sorted({level.streams for level in levels}):
        real, emulated = by.get((streams, "real")), by.get((streams, "emulated"))
        if real is None or emulated is None:
            continue
        figures = {
            "TTFT p50": (percentile(emulated.ttft, 50), percentile(real.ttft, 50)),
            "TTFT p99": (percentile(emulated.ttft, 99), percentile(real.ttft, 99)),
            "output tok/s": (emulated.output_rate, real.output_rate),
        }
        for name, (mine, theirs) in figures.items():
            met = bool(theirs) and abs(mine / theirs - 1) <= BAR
            verdicts.append(met)
            ratios.append(
                [
                    str(streams),
                    name,
                    ratio(mine, theirs),
                    f"within {BAR:.0%}",
                    "met" if met else "NOT met",
                ]
            )
    text = "\n\n".join(
        [
            facts,
            f"fitted profile: step {fitted.step_ms:.1f} ms + {fitted.step_ms_per_stream:.2f} ms "
            f"per stream + {fitted.prefill_ms_per_token:.2f} ms per prompt token; "
            f"{fitted.num_blocks} blocks of {fitted.block_size}",
            render(
                [
                    "streams",
                    "side",
                    "ok/all",
                    "TTFT p50 ms",
                    "TTFT p99 ms",
                    "decode tok/s p50",
                    "output tok/s",
                    "emulator CPU ms/answer",
                ],
                rows,
            ),
            render(["streams", "emulated / real", "ratio", "bar", "verdict"], ratios),
        ]
    )
    return text, all(verdicts)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--worker", required=True, help="the real vLLM worker's URL")
    parser.add_argument(
        "--concurrency", default="1,8", type=lambda t: [int(p) for p in t.split(",") if p]
    )
    parser.add_argument("--rounds", type=int, default=3, help="answers per stream per level")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument(
        "--fitted",
        default="",
        help="a profile fitted before, as JSON (step_ms, step_ms_per_stream, "
        "prefill_ms_per_token): skips the calibration",
    )
    parser.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    url = args.worker.rstrip("/")
    served = httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"]
    load = parse_metrics(httpx.get(f"{url}/metrics", timeout=10).text)
    block_size, num_blocks = load.block_size or 16, load.num_gpu_blocks or 1024
    if args.fitted:
        fitted = WorkerModel(
            **json.loads(args.fitted), block_size=block_size, num_blocks=num_blocks
        )
    else:
        print("fitting the profile to the real worker ...", flush=True)
        # Decode fitted at the trace's own highest concurrency: a CPU worker's step does not
        # grow in a straight line with its streams.
        fitted = calibrate(url, block_size, num_blocks, streams=max(max(args.concurrency), 2))
    port = free_port()
    emulator = start_emulator(fitted, served, port)
    emulated_url = f"http://127.0.0.1:{port}"
    levels: list[Level] = []
    try:
        for number, streams in enumerate(args.concurrency):
            sides = [("real", url), ("emulated", emulated_url)]
            for side, side_url in sides if number % 2 == 0 else sides[::-1]:
                before = process_cpu_seconds(emulated_url)
                level = asyncio.run(
                    run_level(side_url, served, side, streams, args.rounds, args.max_tokens)
                )
                if side == "emulated":
                    answers = max(len(level.ttft), 1)
                    level.cpu_seconds = (process_cpu_seconds(emulated_url) - before) / answers
                levels.append(level)
                print(f"{side} x{streams}: {len(level.ttft)} answers", flush=True)
    finally:
        emulator.stop()
    facts = (
        f"emulator fidelity, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; real worker "
        f"{url} ({served}); {args.rounds} streamed answers of {args.max_tokens} tokens per "
        f"stream per level; sides alternate per level"
    )
    text, met = report(levels, fitted, facts)
    text += f"\n\nfidelity (every figure within {BAR:.0%}): {'met' if met else 'NOT met'}"
    print(text)
    path = write_result(args.results, "emulator_fidelity", text)
    print(f"\nwritten to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
