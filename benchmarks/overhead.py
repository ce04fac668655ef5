"""What the service costs in front of a vLLM worker: direct vs `/v1` vs the conversation API.

The same prompts, streamed at each concurrency level (`--concurrency`, default 1, 8, 32 and 64
streams at once), by three sides in alternating order (the order rotates per level, so no
side always runs on a warmer machine):

- direct: `POST /v1/chat/completions` straight to the workers, spread over them in turn;
- v1: the same request to the service's `/v1/chat/completions` (a real edge, or
  `--edges` of them behind the client's round robin, and a scheduler process, both started
  here), with the official `openai` client;
- conversations: the conversation API as the web page uses it, with the user's API key: the
  conversation is created first (not timed), then `POST .../messages` and its answer's
  Server-Sent Events (`GET /api/v1/generations/<id>/stream`), read with httpx.

Per level and side: TTFT (request sent to first text) p50/p99, the POST's answer time p50/p99
(conversations only), decode speed of one stream p50, output tokens/s over the level's wall
time, errors, and the CPU seconds the service's processes (edges, scheduler, Postgres, Redis)
used during the level, per answer; then each service side's ratios to direct. Each side's
prompts start with their own random tag, so no side finds another's prompts in the cache.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/chatsite_overhead_bench \\
    REDIS_URL=redis://127.0.0.1:6379/12 SECRET_KEY=x \\
    .venv/bin/python benchmarks/overhead.py --workers http://127.0.0.1:8201

`--profile DIR` records the edge and the scheduler with py-spy (only samples holding the GIL)
during the highest level, or `--profile-level N`
(py-spy's raw collapsed stacks, one file per process and side; the frames with the most
own samples go into the report).
It prints one table, writes it to benchmarks/results/overhead-<UTC date-time>.txt and, with
matplotlib installed, a plot of TTFT and tokens/s against concurrency beside it (.png).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import logging
import os
import platform
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
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
    render,
    service_env,
    write_result,
)
from benchmarks.openai_api import (  # noqa: E402
    Level,
    Sample,
    ms,
    num,
    one,
    prepare,
    prompt,
    ratio,
    start,
    stop,
    wait_up,
)

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/chatsite_overhead_bench"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/12"
SIDES = ("direct", "v1", "conversations")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class Result:
    """One side at one level, with the POST times and the service's CPU."""

    level: Level
    posts: list[float] = field(default_factory=list)
    cpu: dict[str, float] = field(default_factory=dict)

    def cpu_per_answer(self) -> float:
        answers = len(self.level.ok)
        return sum(self.cpu.values()) / answers if answers else float("nan")


# The service's processes and their CPU time


def cpu_seconds(pid: int) -> float:
    """User and system CPU of a process and its waited-for children, from /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    # utime, stime, cutime, cstime are fields 14-17 of stat; [0] here is field 3.
    return sum(int(value) for value in fields[11:15]) / CLOCK_TICKS


def pids_named(name: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == name:
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def service_cpu(edges: Sequence[int], scheduler: int) -> dict[str, float]:
    """CPU seconds so far of each kind of process the service runs (not the workers)."""
    return {
        "edge": sum(cpu_seconds(pid) for pid in edges),
        "scheduler": cpu_seconds(scheduler),
        "postgres": sum(cpu_seconds(pid) for pid in pids_named("postgres")),
        "redis": sum(cpu_seconds(pid) for pid in pids_named("redis-server")),
    }


# The conversation API as a client


async def conversation_one(
    client: httpx.AsyncClient, messages: list[dict[str, str]], posts: list[float]
) -> Sample:
    sample = Sample()
    try:
        created = await client.post(
            "/api/v1/conversations", json={"system_prompt": messages[0]["content"]}
        )
        created.raise_for_status()
        conversation_id = created.json()["id"]
        started = time.perf_counter()
        sent = await client.post(
            f"/api/v1/conversations/{conversation_id}/messages",
            json={"content": messages[1]["content"]},
        )
        posts.append(time.perf_counter() - started)
        sent.raise_for_status()
        stream_url = sent.json()["generation"]["stream_url"]
        first = last = 0.0
        async with client.stream("GET", stream_url) as response:
            response.raise_for_status()
            async for event, data in sse_events(response):
                if event == "delta":
                    last = time.perf_counter()
                    if sample.ttft is None:
                        first = last
                        sample.ttft = first - started
                elif event == "error":
                    sample.error = f"error event: {data}"[:200]
                elif event == "done":
                    sample.tokens = int(json.loads(data).get("output_tokens") or 0)
                    break
    except (httpx.HTTPError, KeyError, ValueError) as exc:
        sample.error = f"{type(exc).__name__}: {exc}"[:200]
        return sample
    if sample.tokens > 1 and last > first:
        sample.decode_tps = (sample.tokens - 1) / (last - first)
    return sample


async def sse_events(response: httpx.Response) -> Any:
    """(event, data) per Server-Sent Event, whatever order its fields come in."""
    event, data = "message", ""
    async for line in response.aiter_lines():
        if not line:
            if data:
                yield event, data
            event, data = "message", ""
        elif line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data = line[5:].strip()


# A level


async def run_side(
    side: str,
    run: Callable[[int, list[dict[str, str]]], Any],
    *,
    concurrency: int,
    requests: int,
) -> Level:
    level = Level(side=side, concurrency=concurrency)
    tag = secrets.token_hex(4)
    gate = asyncio.Semaphore(concurrency)

    async def bounded(index: int) -> Sample:
        async with gate:
            sample: Sample = await run(index, prompt(tag, index))
            return sample

    started = time.perf_counter()
    level.samples = list(await asyncio.gather(*(bounded(i) for i in range(requests))))
    level.wall = time.perf_counter() - started
    return level


@dataclass
class Service:
    edge_urls: list[str]
    edge_pids: list[int]
    scheduler_pid: int
    raw_key: str
    model: str


async def measure(
    args: argparse.Namespace, service: Service, urls: list[str], profile: Callable[[str], Any]
) -> tuple[list[dict[str, Result]], str]:
    direct = [openai.AsyncOpenAI(base_url=f"{u}/v1", api_key="none", max_retries=0) for u in urls]
    v1 = [
        openai.AsyncOpenAI(base_url=f"{u}/v1", api_key=service.raw_key, max_retries=0)
        for u in service.edge_urls
    ]
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    conversations = [
        httpx.AsyncClient(
            base_url=u,
            headers={"Authorization": f"Bearer {service.raw_key}"},
            timeout=600,
            limits=limits,
        )
        for u in service.edge_urls
    ]
    served = (await direct[0].models.list()).data[0].id
    await one(v1[0], service.model, prompt("warm", 0), 4)
    await one(direct[0], served, prompt("warm", 0), 4)
    await conversation_one(conversations[0], prompt("warm", 0), [])

    levels: list[dict[str, Result]] = []
    for index, concurrency in enumerate(args.concurrency):
        requests = max(concurrency * args.rounds, args.min_requests)
        results: dict[str, Result] = {}
        order = list(SIDES[index % 3 :] + SIDES[: index % 3])
        for side in order:
            profiled = side != "direct" and concurrency == (
                args.profile_level or max(args.concurrency)
            )
            profiling = profile(f"{side}-x{concurrency}") if profiled else None
            result = Result(level=Level(side=side, concurrency=concurrency))

            async def run(
                i: int, messages: list[dict[str, str]], side: str = side, result: Result = result
            ) -> Sample:
                if side == "direct":
                    return await one(direct[i % len(direct)], served, messages, args.max_tokens)
                if side == "v1":
                    return await one(v1[i % len(v1)], service.model, messages, args.max_tokens)
                client = conversations[i % len(conversations)]
                return await conversation_one(client, messages, result.posts)

            before = service_cpu(service.edge_pids, service.scheduler_pid)
            result.level = await run_side(side, run, concurrency=concurrency, requests=requests)
            after = service_cpu(service.edge_pids, service.scheduler_pid)
            result.cpu = {kind: after[kind] - before[kind] for kind in before}
            results[side] = result
            if profiling is not None:
                profiling()
            print(
                f"  {side:13} x{concurrency}: {len(result.level.ok)}/{requests} ok "
                f"in {result.level.wall:.1f} s",
                flush=True,
            )
        levels.append(results)
    for client in conversations:
        await client.aclose()
    facts = (
        f"overhead benchmark, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, "
        f"{os.cpu_count()} CPUs; workers {', '.join(urls)} ({served}); {len(service.edge_urls)} "
        f"edge process(es); max_tokens {args.max_tokens}, temperature 0, >= {args.rounds} "
        f"requests per stream slot (at least {args.min_requests}) per level"
    )
    return levels, facts


# The report


def table(levels: list[dict[str, Result]]) -> str:
    headers = [
        "streams",
        "side",
        "ok/all",
        "TTFT p50 ms",
        "TTFT p99 ms",
        "POST p50 ms",
        "POST p99 ms",
        "decode tok/s p50",
        "output tok/s",
        "service CPU ms/answer",
    ]
    rows = []
    for results in levels:
        direct = results["direct"].level
        for side in SIDES:
            result = results[side]
            level = result.level
            rows.append(
                [
                    str(level.concurrency),
                    side,
                    f"{len(level.ok)}/{len(level.samples)}",
                    ms(level.ttft(50)),
                    ms(level.ttft(99)),
                    ms(percentile(result.posts, 50)) if result.posts else "",
                    ms(percentile(result.posts, 99)) if result.posts else "",
                    num(level.decode()),
                    num(level.throughput()),
                    ms(result.cpu_per_answer()),
                ]
            )
        for side in SIDES[1:]:
            level = results[side].level
            rows.append(
                [
                    str(level.concurrency),
                    f"{side}/direct",
                    "",
                    ratio(level.ttft(50), direct.ttft(50)),
                    ratio(level.ttft(99), direct.ttft(99)),
                    "",
                    "",
                    ratio(level.decode(), direct.decode()),
                    ratio(level.throughput(), direct.throughput()),
                    "",
                ]
            )
    return render(headers, rows)


def cpu_table(levels: list[dict[str, Result]]) -> str:
    """Where the service's CPU went, per answer, per kind of process."""
    kinds = ["edge", "scheduler", "postgres", "redis"]
    rows = []
    for results in levels:
        for side in SIDES:
            result = results[side]
            answers = len(result.level.ok) or 1
            rows.append(
                [
                    str(result.level.concurrency),
                    side,
                    *(ms(result.cpu.get(kind, 0.0) / answers) for kind in kinds),
                ]
            )
    return render(["streams", "side", *(f"{k} CPU ms/answer" for k in kinds)], rows)


def errors(levels: list[dict[str, Result]]) -> str:
    seen = [
        f"  {side} x{result.level.concurrency}: {sample.error}"
        for results in levels
        for side, result in results.items()
        for sample in result.level.samples
        if sample.error
    ]
    return "\n".join(["errors:", *seen[:10]]) if seen else "errors: none"


def plot(levels: list[dict[str, Result]], out: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    figure, (ttft, tps) = plt.subplots(1, 2, figsize=(11, 4))
    x = [results["direct"].level.concurrency for results in levels]
    for side in SIDES:
        ttft.plot(x, [r[side].level.ttft(50) * 1000 for r in levels], marker="o", label=side)
        tps.plot(x, [r[side].level.throughput() for r in levels], marker="o", label=side)
    for axes, title in ((ttft, "TTFT p50 (ms)"), (tps, "output tokens/s")):
        axes.set_xscale("log", base=2)
        axes.set_xticks(x, [str(v) for v in x])
        axes.set_xlabel("concurrent streams")
        axes.set_title(title)
        axes.legend()
    figure.tight_layout()
    figure.savefig(out)
    plt.close(figure)
    return True


# py-spy


def profiler(directory: Path | None, targets: dict[str, int]) -> Callable[[str], Any]:
    """Starts py-spy on each target while one side runs its highest level; the returned call
    stops it (py-spy writes its profile on SIGINT).

    The side starts only once every recorder has said it is sampling: a SIGINT that reaches
    py-spy while it is still attaching kills it before it has written anything (a short side,
    as in the smoke run, used to end that early now and then).
    """

    def begin(label: str) -> Callable[[], None] | None:
        if directory is None:
            return None
        directory.mkdir(parents=True, exist_ok=True)
        spy = str(Path(sys.executable).parent / "py-spy")
        recorders = {
            name: subprocess.Popen(  # noqa: S603 (our own command line)
                [
                    # --gil: only samples that hold the GIL, i.e. Python using the CPU.
                    *(spy, "record", "--pid", str(pid), "--rate", "100", "--gil"),
                    *("--format", "raw"),
                    *("--output", str(directory / f"{name}-{label}.txt")),
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for name, pid in targets.items()
        }
        for name, recorder in recorders.items():
            _wait_until_sampling(name, recorder)

        def end() -> None:
            for recorder in recorders.values():
                recorder.send_signal(signal.SIGINT)
            for name, recorder in recorders.items():
                said, _ = recorder.communicate(timeout=60)
                if recorder.returncode != 0:
                    raise RuntimeError(f"py-spy on the {name} failed: {said.strip()[-500:]}")

        return end

    return begin


def _wait_until_sampling(name: str, recorder: subprocess.Popen[str]) -> None:
    """Reads py-spy's output until it says it samples; raises if it ends before that."""
    assert recorder.stdout is not None
    said = []
    for line in recorder.stdout:
        if "Sampling process" in line:
            return
        said.append(line)
    recorder.wait(timeout=10)
    raise RuntimeError(f"py-spy on the {name} did not start: {''.join(said).strip()[-500:]}")


def top_functions(path: Path, count: int = 12) -> str:
    """From a py-spy raw (collapsed) profile: the frames with the most own samples, and the
    project's functions with the most samples inside them (their callees included)."""
    apps = {entry.name for entry in ROOT.iterdir() if (entry / "apps.py").exists()} | {"chatsite"}
    own: collections.Counter[str] = collections.Counter()
    inside: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, samples = line.rpartition(" ")
        if not stack or not samples.isdigit():
            continue
        frames = stack.split(";")
        total += int(samples)
        own[frames[-1]] += int(samples)
        ours = {f.rsplit(":", 1)[0] for f in frames if f.partition("(")[2].split("/")[0] in apps}
        for frame in ours:
            inside[frame + ")"] += int(samples)
    if not total:
        return ""

    def rows(counter: collections.Counter[str]) -> list[list[str]]:
        return [[f[:110], f"{100 * n / total:.1f}%"] for f, n in counter.most_common(count)]

    return "\n".join(
        [
            render([f"{path.stem}: own ({total} samples)", "share"], rows(own)),
            "",
            render([f"{path.stem}: inside the project's functions", "share"], rows(inside)),
        ]
    )


# Setup


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--workers", default=os.environ.get("CHATSITE_E2E_WORKER_URLS", ""))
    parser.add_argument(
        "--concurrency",
        default="1,8,32,64",
        type=lambda text: [int(part) for part in text.split(",") if part],
    )
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=2, help="requests per stream slot")
    parser.add_argument("--min-requests", type=int, default=6)
    parser.add_argument("--edges", type=int, default=1, help="edge processes to start")
    parser.add_argument("--profile", type=Path, default=None, help="py-spy output directory")
    parser.add_argument(
        "--profile-level", type=int, default=0, help="the level to profile (default: highest)"
    )
    parser.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    urls = [url.strip().rstrip("/") for url in args.workers.split(",") if url.strip()]
    if not urls:
        raise SystemExit("Give the workers: --workers URL[,URL] (or CHATSITE_E2E_WORKER_URLS).")
    django_start(database_url=DEFAULT_DATABASE_URL, redis_url=DEFAULT_REDIS_URL)
    logging.getLogger("httpx2").setLevel(logging.WARNING)  # the openai client's own httpx
    prepare_stores()
    from django.conf import settings
    from django.db import connections

    served = httpx.get(f"{urls[0]}/v1/models", timeout=10).json()["data"][0]["id"]
    raw_key = prepare(urls, served)
    # The conversation API has no max_tokens of its own: the pool's cap makes its answers as
    # long as the other sides' (the prompts ask for more than that).
    from chatsite.catalog import catalog_changed
    from inference.models import ModelPool

    ModelPool.objects.filter(name=settings.DEFAULT_MODEL).update(max_output_tokens=args.max_tokens)
    catalog_changed()  # update() sends no signal
    connections.close_all()

    logs = Path(tempfile.mkdtemp(prefix="overhead-bench-"))
    env = service_env()
    ports = [free_port() for _ in range(args.edges)]
    edges = [start(edge_command(port), logs / f"edge-{port}.log", env) for port in ports]
    scheduler = start(
        [sys.executable, "manage.py", "run_scheduler", "--replica-id", "overhead-bench"],
        logs / "scheduler.log",
        env,
    )
    edge_urls = [f"http://127.0.0.1:{port}" for port in ports]
    service = Service(
        edge_urls=edge_urls,
        edge_pids=[edge.pid for edge in edges],
        scheduler_pid=scheduler.pid,
        raw_key=raw_key,
        model=settings.DEFAULT_MODEL,
    )
    targets = {"edge": edges[0].pid, "scheduler": scheduler.pid}
    profile = profiler(args.profile, targets)
    try:
        for url, edge, port in zip(edge_urls, edges, ports, strict=True):
            wait_up(f"{url}/v1/models", edge, logs / f"edge-{port}.log")
        levels, facts = asyncio.run(measure(args, service, urls, profile))
    finally:
        for edge in edges:
            stop(edge)
        stop(scheduler)
    parts = [facts, "", table(levels), "", cpu_table(levels), "", errors(levels)]
    if args.profile is not None:
        parts += ["", *(top_functions(p) for p in sorted(args.profile.glob("*.txt")))]
    report = "\n".join(parts)
    print(report)
    out = write_result(args.results, "overhead", report)
    drawn = plot(levels, out.with_suffix(".png"))
    print(f"\nwritten to {out}{' and .png' if drawn else ''}; logs in {logs}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
