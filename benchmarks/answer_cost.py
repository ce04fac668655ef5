"""What one `/v1` answer costs each of the service's processes, split into what any answer
costs and what streaming its tokens costs, beside what reading the same stream costs at
least.

`overhead.py` charges each side's processes their CPU over a level; at one stream an answer
costs several times what it costs at 64, and the level alone does not say why. This splits
it, one stream at a time, in rounds (`--rounds`), each round in the same order:

- idle: the processes' CPU per second while nothing is asked of them (`--idle` seconds);
- short: `--answers` answers of one token through `/v1` (a key that keeps nothing): what an
  answer costs whatever its length (accepting it, placing it, settling it);
- long: as many answers of `--max-tokens` tokens: the above, the stream, and the processes'
  idle work while it lasts;
- bare: the same long answers read straight from the worker by this process, once over a
  plain socket and once with aiohttp (the library the scheduler reads workers with): the
  least any relay of those tokens pays for reading them on this machine, whatever its design.

Per process it prints the CPU of a short and of a long answer, the idle work a long answer's
extra seconds account for, and what is left per streamed token; then the bare reads. A
process woken once per token pays for each wake; the totals say how many processes stand on
the token path.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/chatsite_overhead_bench \\
    REDIS_URL=redis://127.0.0.1:6379/12 SECRET_KEY=x \\
    .venv/bin/python benchmarks/answer_cost.py --workers http://127.0.0.1:8201

It prints one table and writes it to benchmarks/results/answer_cost-<UTC date-time>.txt.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import platform
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp
import openai

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import render, worker_urls, write_result  # noqa: E402
from benchmarks.openai_api import one, prompt  # noqa: E402
from benchmarks.overhead import SERVICE_KINDS, Service, cpu_by_kind, idle_cpu, stack  # noqa: E402


@dataclass
class Phase:
    """One kind of measurement summed over the rounds: answers, their tokens and seconds,
    and the CPU seconds of each kind of process (or of this one, for the bare reads)."""

    answers: int = 0
    tokens: int = 0
    seconds: float = 0.0
    cpu: dict[str, float] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    def add_cpu(self, before: dict[str, float], after: dict[str, float]) -> None:
        for kind in after:
            self.cpu[kind] = self.cpu.get(kind, 0.0) + after[kind] - before[kind]

    def ms_per_answer(self, kind: str) -> float:
        return self.cpu.get(kind, 0.0) * 1000 / self.answers if self.answers else float("nan")

    @property
    def seconds_per_answer(self) -> float:
        return self.seconds / self.answers if self.answers else float("nan")

    @property
    def tokens_per_answer(self) -> float:
        return self.tokens / self.answers if self.answers else float("nan")


@dataclass
class Measured:
    idle: dict[str, float] = field(default_factory=dict)  # ms of CPU per second, per kind
    short: Phase = field(default_factory=Phase)
    long: Phase = field(default_factory=Phase)
    socket: Phase = field(default_factory=Phase)
    aiohttp: Phase = field(default_factory=Phase)


def own_cpu() -> dict[str, float]:
    """This process's CPU seconds so far, every thread included."""
    return {"this process": time.process_time()}


async def through_service(
    client: openai.AsyncOpenAI, service: Service, phase: Phase, tag: str, count: int, tokens: int
) -> None:
    before = cpu_by_kind(service.roots)
    started = time.perf_counter()
    for index in range(count):
        sample = await one(client, service.model, prompt(tag, index), tokens)
        if sample.error is not None:
            phase.errors.append(sample.error)
            continue
        phase.answers += 1
        phase.tokens += sample.tokens
    phase.seconds += time.perf_counter() - started
    phase.add_cpu(before, cpu_by_kind(service.roots))


def worker_body(served: str, tag: str, index: int, tokens: int) -> bytes:
    return json.dumps(
        {
            "model": served,
            "messages": prompt(tag, index),
            "max_tokens": tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    ).encode()


async def read_by_socket(url: str, body: bytes) -> int:
    """The streamed answer's bytes as they come, over a plain socket; returns the reads."""
    parts = urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port or 80)
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\nConnection: close\r\n\r\n%s"
        % (parts.netloc.encode(), len(body), body)
    )
    reads = 0
    while await reader.read(65536):
        reads += 1
    writer.close()
    return reads


async def read_by_aiohttp(session: aiohttp.ClientSession, url: str, body: bytes) -> int:
    """The streamed answer line by line with aiohttp; returns the `data:` lines."""
    lines = 0
    async with session.post(
        f"{url}/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}
    ) as response:
        response.raise_for_status()
        async for line in response.content:
            lines += line.startswith(b"data:")
    return lines


async def bare(
    phase: Phase,
    read: Callable[[str, bytes], Awaitable[object]],
    url: str,
    served: str,
    tag: str,
    count: int,
    tokens: int,
) -> None:
    before = own_cpu()
    started = time.perf_counter()
    for index in range(count):
        try:
            await read(url, worker_body(served, tag, index, tokens))
        except (OSError, aiohttp.ClientError) as exc:
            phase.errors.append(repr(exc))
            continue
        phase.answers += 1
    phase.seconds += time.perf_counter() - started
    phase.add_cpu(before, own_cpu())


async def measure(args: argparse.Namespace, service: Service, url: str) -> Measured:
    client = openai.AsyncOpenAI(
        base_url=f"{service.edge_urls[0]}/v1", api_key=service.raw_key, max_retries=0
    )
    async with aiohttp.ClientSession() as session:
        served = (await (await session.get(f"{url}/v1/models")).json())["data"][0]["id"]
        # What a first answer loads (connections, tokenizers, classifiers), not charged.
        await one(client, service.model, prompt("warm", 0), 4)
        await read_by_socket(url, worker_body(served, "warm", 0, 4))
        await read_by_aiohttp(session, url, worker_body(served, "warm", 0, 4))
        measured = Measured()
        reads: list[tuple[Phase, Callable[[str, bytes], Awaitable[object]], str]] = [
            (measured.socket, read_by_socket, "r"),
            (measured.aiohttp, functools.partial(read_by_aiohttp, session), "a"),
        ]
        tag = os.urandom(3).hex()  # no round finds another's prompts cached
        for number in range(args.rounds):
            idle = await idle_cpu(service, args.idle)
            for kind, rate in idle.items():
                measured.idle[kind] = measured.idle.get(kind, 0.0) + rate
            await through_service(
                client, service, measured.short, f"{tag}s{number}", args.answers, 1
            )
            await through_service(
                client, service, measured.long, f"{tag}l{number}", args.answers, args.max_tokens
            )
            for phase, read, letter in reads:
                await bare(
                    phase,
                    read,
                    url,
                    served,
                    f"{tag}{letter}{number}",
                    args.answers,
                    args.max_tokens,
                )
        measured.idle = {kind: rate / args.rounds for kind, rate in measured.idle.items()}
    # A bare read streams as many tokens as the long answers did, on average.
    for phase in (measured.socket, measured.aiohttp):
        phase.tokens = round(measured.long.tokens_per_answer * phase.answers)
    return measured


def streamed_ms_per_token(measured: Measured, kind: str) -> float:
    """What a long answer costs `kind` beyond a short one and beyond its idle work over the
    long answer's extra seconds, per extra token."""
    short, long = measured.short, measured.long
    extra_tokens = long.tokens_per_answer - short.tokens_per_answer
    if not extra_tokens or extra_tokens != extra_tokens:  # none, or nan
        return float("nan")
    extra_seconds = long.seconds_per_answer - short.seconds_per_answer
    idle_ms = measured.idle.get(kind, 0.0) * extra_seconds
    return (long.ms_per_answer(kind) - short.ms_per_answer(kind) - idle_ms) / extra_tokens


def report(args: argparse.Namespace, url: str, measured: Measured) -> str:
    short, long = measured.short, measured.long
    extra_seconds = long.seconds_per_answer - short.seconds_per_answer
    rows = []
    for kind in (*SERVICE_KINDS, "total"):
        kinds = SERVICE_KINDS if kind == "total" else (kind,)
        idle = sum(measured.idle.get(k, 0.0) for k in kinds)
        rows.append(
            [
                kind,
                f"{idle:.1f}",
                f"{sum(short.ms_per_answer(k) for k in kinds):.1f}",
                f"{sum(long.ms_per_answer(k) for k in kinds):.1f}",
                f"{idle * extra_seconds:.1f}",
                f"{sum(streamed_ms_per_token(measured, k) for k in kinds):.2f}",
            ]
        )
    bare_rows = [
        [
            name,
            str(phase.answers),
            f"{phase.ms_per_answer('this process'):.1f}",
            f"{phase.ms_per_answer('this process') / phase.tokens_per_answer:.2f}"
            if phase.tokens
            else "-",
        ]
        for name, phase in (("plain socket", measured.socket), ("aiohttp lines", measured.aiohttp))
    ]
    errors = [*short.errors, *long.errors, *measured.socket.errors, *measured.aiohttp.errors]
    return "\n".join(
        [
            f"answer cost, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, "
            f"{os.cpu_count()} CPUs; worker {url}; {args.rounds} round(s) of {args.answers} "
            f"answer(s) each way, one at a time; idle {args.idle:g} s a round",
            "",
            f"short: {short.answers} answers of 1 token, {short.seconds_per_answer:.2f} s "
            f"each; long: {long.answers} answers of {long.tokens_per_answer:.1f} tokens "
            f"(--max-tokens {args.max_tokens}), {long.seconds_per_answer:.2f} s each",
            "",
            render(
                [
                    "process",
                    "idle ms/s",
                    "short answer ms",
                    "long answer ms",
                    "idle over the extra seconds ms",
                    "streamed ms/token",
                ],
                rows,
            ),
            "",
            "CPU of each kind of process per answer, from /proc, idle work included; streamed "
            "ms/token: (long - short - idle ms/s x the extra seconds) / the extra tokens",
            "",
            "the same long answers read straight from the worker by this process:",
            render(["read", "answers", "CPU ms/answer", "CPU ms/token"], bare_rows),
            "",
            f"errors: {'; '.join(errors[:5]) if errors else 'none'}",
        ]
    )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--workers", default=os.environ.get("CHATSITE_E2E_WORKER_URLS", ""))
    parser.add_argument("--max-tokens", type=int, default=48, help="a long answer's tokens")
    parser.add_argument("--answers", type=int, default=8, help="answers each way per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--idle", type=float, default=10.0, help="seconds idle per round")
    parser.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)
    # What `overhead.stack` reads: one edge, no peers.
    args.edges, args.peers, args.through_scheduler = 1, [], False
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    urls = worker_urls(args.workers)
    if not urls:
        raise SystemExit("Give the worker: --workers URL (or CHATSITE_E2E_WORKER_URLS).")
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    with stack(args, urls[:1]) as started:
        measured = asyncio.run(measure(args, started.service, urls[0]))
    text = report(args, urls[0], measured)
    print(text)
    out = write_result(args.results, "answer_cost", text)
    print(f"\nwritten to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
