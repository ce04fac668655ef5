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

`--through-scheduler` adds the side `v1-sched`: `/v1` through an edge of its own started with
`INFERENCE_DIRECT_RELAY=0`, so every token passes through the scheduler and Redis, as before
the edge read the worker itself; `v1` beside it, in the same run, is the relay.

`--profile DIR` records the edge and the scheduler with py-spy (only samples holding the GIL)
while they idle, and during the highest level, or `--profile-level N`
(py-spy's raw collapsed stacks, one file per process and side; the frames with the most
own samples go into the report).
It prints one table, writes it to benchmarks/results/overhead-<UTC date-time>.txt and, with
matplotlib installed, a plot of TTFT and tokens/s against concurrency beside it (.png).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
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
from collections.abc import Callable, Iterator, Mapping, Sequence
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
    worker_urls,
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
    start,
    stop,
    wait_up,
)
from benchmarks.peers import PEERS, STARTERS, Peer, parse_peers  # noqa: E402

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/chatsite_overhead_bench"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/12"
# The sides every run has; the peers (`--peers`) come after them.
SIDES = ("direct", "v1", "conversations")
# With `--through-scheduler`, after them: `/v1` through an edge that does not read the worker
# itself (`INFERENCE_DIRECT_RELAY=0`): every token through the scheduler and Redis, the design
# before the relay, in the same run as the relay.
THROUGH_SCHEDULER = "v1-sched"
SERVICE_SIDES = ("v1", "conversations", THROUGH_SCHEDULER)
# The service's kinds of process, whose CPU a service side is charged (and direct's column
# shows: the service idling meanwhile). A peer side is charged its own process tree.
SERVICE_KINDS = ("edge", "scheduler", "celery", "postgres", "redis")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
# As the Procfile runs it (beat included: its periodic tasks are part of the service's work).
# As the Procfile starts it.
CELERY_COMMAND = [
    *("-A", "chatsite", "worker", "-B", "--loglevel", "WARNING", "--concurrency", "2"),
    *("--without-gossip", "--without-mingle", "--without-heartbeat"),
]
CELERY_START_SECONDS = 120
# The bars (#34): at 1 stream the TTFT p50 ratio to direct at most this ...
ALONE_TTFT_RATIO = 1.10
# ... and a kept conversation turn's CPU at most this many times Open WebUI's per answer.
KEPT_CPU_OVER_OPENWEBUI = 1.5


def side_kinds(side: str) -> tuple[str, ...]:
    """The kinds of process whose CPU is charged to `side`."""
    return (side,) if side in PEERS else SERVICE_KINDS


@dataclass
class Result:
    """One side at one level, with the POST times and the CPU of the side's processes."""

    level: Level
    posts: list[float] = field(default_factory=list)
    cpu: dict[str, float] = field(default_factory=dict)

    def cpu_per_answer(self) -> float:
        answers = len(self.level.ok)
        return sum(self.cpu.values()) / answers if answers else float("nan")


# The processes and their CPU time


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


def children_by_parent() -> dict[int, list[int]]:
    children: dict[int, list[int]] = collections.defaultdict(list)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            # The parent's pid is the second field after the command's closing parenthesis.
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children[parent].append(int(entry.name))
    return children


def with_descendants(roots: Sequence[int], children: Mapping[int, list[int]]) -> list[int]:
    found, pending = [], list(roots)
    while pending:
        pid = pending.pop()
        found.append(pid)
        pending.extend(children.get(pid, ()))
    return found


def cpu_by_kind(roots: Mapping[str, Sequence[int]]) -> dict[str, float]:
    """CPU seconds so far of each kind of process: the processes started here (`roots`, each
    with every process under it: a child that exited and was waited for is in its parent's
    counters, so a tree's sum loses nothing), and every `postgres` and `redis-server` process
    on the machine (shared servers: any other load on them counts too)."""
    children = children_by_parent()
    pids = {kind: with_descendants(found, children) for kind, found in roots.items()}
    pids |= {"postgres": pids_named("postgres"), "redis": pids_named("redis-server")}
    return {kind: sum(map(cpu_seconds, found)) for kind, found in pids.items()}


def celery_ready(process: subprocess.Popen[bytes], log: Path) -> None:
    """Until the worker answers a ping (its prefork children are up by then)."""
    from chatsite.celery import app

    deadline = time.monotonic() + CELERY_START_SECONDS
    while not app.control.ping(timeout=1.0):
        if process.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"The Celery worker did not come up:\n{log.read_text()[-2000:]}")


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
    """What was started: the service's processes and the peers, and how to call them."""

    edge_urls: list[str]
    roots: dict[str, list[int]]  # kind of process -> the pids started (edge, scheduler, ...)
    raw_key: str
    model: str
    peers: list[Peer] = field(default_factory=list)
    # The edge that does not relay (`--through-scheduler`), if one was started.
    through_scheduler_url: str | None = None

    @property
    def sides(self) -> list[str]:
        ours = [*SIDES, *([THROUGH_SCHEDULER] if self.through_scheduler_url else [])]
        return [*ours, *(peer.side for peer in self.peers)]


async def idle_cpu(service: Service, seconds: float) -> dict[str, float]:
    """CPU milliseconds per second of each kind of process while nothing is asked of it."""
    before = cpu_by_kind(service.roots)
    started = time.monotonic()
    await asyncio.sleep(seconds)
    after = cpu_by_kind(service.roots)
    elapsed = time.monotonic() - started
    return {kind: (after[kind] - before[kind]) * 1000 / elapsed for kind in before}


async def measure(
    args: argparse.Namespace, service: Service, urls: list[str], profile: Callable[[str], Any]
) -> tuple[list[dict[str, Result]], dict[str, float], str]:
    direct = [openai.AsyncOpenAI(base_url=f"{u}/v1", api_key="none", max_retries=0) for u in urls]
    v1 = [
        openai.AsyncOpenAI(base_url=f"{u}/v1", api_key=service.raw_key, max_retries=0)
        for u in service.edge_urls
    ]
    through_scheduler = (
        openai.AsyncOpenAI(
            base_url=f"{service.through_scheduler_url}/v1",
            api_key=service.raw_key,
            max_retries=0,
        )
        if service.through_scheduler_url
        else None
    )
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
    peers = {peer.side: peer for peer in service.peers}
    served = (await direct[0].models.list()).data[0].id
    await one(v1[0], service.model, prompt("warm", 0), 4)
    if through_scheduler is not None:
        await one(through_scheduler, service.model, prompt("warm", 0), 4)
    await one(direct[0], served, prompt("warm", 0), 4)
    await conversation_one(conversations[0], prompt("warm", 0), [])
    for peer in peers.values():
        warm = await one(peer.client, peer.model, prompt("warm", 0), 4)
        if warm.error is not None:
            raise SystemExit(f"{peer.side} does not answer: {warm.error}")
    profiling = profile("idle")
    idle = await idle_cpu(service, args.idle)
    if profiling is not None:
        profiling()

    sides = service.sides
    levels: list[dict[str, Result]] = []
    for index, concurrency in enumerate(args.concurrency):
        requests = max(concurrency * args.rounds, args.min_requests)
        results: dict[str, Result] = {}
        # The order rotates per level, so no side always runs on a warmer machine.
        shift = index % len(sides)
        for side in sides[shift:] + sides[:shift]:
            profiled = side in SERVICE_SIDES and concurrency == (
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
                if side == THROUGH_SCHEDULER and through_scheduler is not None:
                    return await one(through_scheduler, service.model, messages, args.max_tokens)
                if side in peers:
                    peer = peers[side]
                    return await one(peer.client, peer.model, messages, args.max_tokens)
                client = conversations[i % len(conversations)]
                return await conversation_one(client, messages, result.posts)

            before = cpu_by_kind(service.roots)
            result.level = await run_side(side, run, concurrency=concurrency, requests=requests)
            after = cpu_by_kind(service.roots)
            result.cpu = {kind: after[kind] - before[kind] for kind in side_kinds(side)}
            results[side] = result
            if profiling is not None:
                profiling()
            print(
                f"  {side:13} x{concurrency}: {len(result.level.ok)}/{requests} ok "
                f"in {result.level.wall:.1f} s",
                flush=True,
            )
        levels.append({side: results[side] for side in sides})
    for client in conversations:
        await client.aclose()
    facts = (
        f"overhead benchmark, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, "
        f"{os.cpu_count()} CPUs; workers {', '.join(urls)} ({served}); {len(service.edge_urls)} "
        f"edge process(es), 1 scheduler, 1 Celery worker (-B); peers: "
        f"{', '.join(peers) or 'none'}; max_tokens {args.max_tokens}, temperature 0, "
        f">= {args.rounds} requests per stream slot (at least {args.min_requests}) per level; "
        f"sides in rotating order per level"
    )
    return levels, idle, facts


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
        "CPU ms/answer",
    ]
    rows = []
    for results in levels:
        direct = results["direct"].level
        for side, result in results.items():
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
        for side, result in results.items():
            if side == "direct":
                continue
            level = result.level
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
    note = (
        "CPU ms/answer: the side's own processes over its run, idle work included (a peer: its "
        "process tree; the service: edge, scheduler, Celery, Postgres, Redis; direct: the "
        "service idling meanwhile)"
    )
    return render(headers, rows) + "\n" + note


def cpu_table(levels: list[dict[str, Result]]) -> str:
    """Where each side's CPU went, per answer, per kind of process."""
    kinds = list(
        dict.fromkeys(kind for results in levels for r in results.values() for kind in r.cpu)
    )
    rows = []
    for results in levels:
        for side, result in results.items():
            answers = len(result.level.ok) or 1
            rows.append(
                [
                    str(result.level.concurrency),
                    side,
                    *(
                        ms(result.cpu[kind] / answers) if kind in result.cpu else ""
                        for kind in kinds
                    ),
                ]
            )
    return render(["streams", "side", *(f"{k} CPU ms/answer" for k in kinds)], rows)


def idle_table(idle: Mapping[str, float], seconds: float) -> str:
    rows = [[kind, f"{rate:.1f}"] for kind, rate in idle.items()]
    return render([f"process (idle {seconds:.0f} s)", "idle CPU ms/s"], rows)


@dataclass(frozen=True)
class Check:
    """One of the issue's bars, as this run measured it."""

    what: str
    ours: float
    bar: float
    higher_is_better: bool = False

    @property
    def met(self) -> bool:
        return self.ours >= self.bar if self.higher_is_better else self.ours <= self.bar

    def row(self) -> list[str]:
        sign = ">=" if self.higher_is_better else "<="
        return [
            self.what,
            f"{self.ours:.2f}",
            f"{sign} {self.bar:.2f}",
            "met" if self.met else "NOT met",
        ]


def checks(levels: list[dict[str, Result]]) -> list[Check]:
    """The bars #34 sets, against the better peer of this run; none without peers."""
    found: list[Check] = []
    for results in levels:
        peers = [side for side in results if side in PEERS]
        direct = results["direct"].level
        ours = results["v1"].level
        n = direct.concurrency
        ttft = ours.ttft(50) / direct.ttft(50)
        if n == 1:
            found.append(Check(f"x{n} v1 TTFT p50 / direct", ttft, ALONE_TTFT_RATIO))
        elif peers:
            best_ttft = min(results[p].level.ttft(50) for p in peers) / direct.ttft(50)
            best_tps = max(results[p].level.throughput() for p in peers) / direct.throughput()
            found.append(Check(f"x{n} v1 TTFT p50 / direct vs the better peer", ttft, best_ttft))
            found.append(
                Check(
                    f"x{n} v1 tok/s / direct vs the better peer",
                    ours.throughput() / direct.throughput(),
                    best_tps,
                    higher_is_better=True,
                )
            )
        if "openwebui" in results:
            webui = results["openwebui"].cpu_per_answer() * 1000
            found.append(
                Check(
                    f"x{n} v1 CPU ms/answer vs Open WebUI",
                    results["v1"].cpu_per_answer() * 1000,
                    webui,
                )
            )
            found.append(
                Check(
                    f"x{n} conversation turn CPU ms/answer vs "
                    f"{KEPT_CPU_OVER_OPENWEBUI}x Open WebUI's",
                    results["conversations"].cpu_per_answer() * 1000,
                    webui * KEPT_CPU_OVER_OPENWEBUI,
                )
            )
    return found


def checks_table(found: Sequence[Check]) -> str:
    if not found:
        return "bars: none to check (no peers ran)"
    return render(["bar (#34)", "this run", "bar", "verdict"], [check.row() for check in found])


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
    for side in levels[0]:
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
                    # Celery's beat and pool processes are its children.
                    "--subprocesses",
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
    # At 6 requests, a level of one stream gave TTFT ratios of 0.82 and 1.29 in two runs two
    # hours apart: 16 at least.
    parser.add_argument("--min-requests", type=int, default=16)
    parser.add_argument("--edges", type=int, default=1, help="edge processes to start")
    parser.add_argument("--profile", type=Path, default=None, help="py-spy output directory")
    parser.add_argument(
        "--profile-level", type=int, default=0, help="the level to profile (default: highest)"
    )
    parser.add_argument(
        "--peers",
        default="auto",
        type=parse_peers,
        help="litellm, openwebui (comma-separated), none, or auto: those `make peers` installed",
    )
    parser.add_argument(
        "--idle", type=float, default=10.0, help="seconds of idle CPU measured before the levels"
    )
    parser.add_argument(
        "--through-scheduler",
        action="store_true",
        help=f"also the side {THROUGH_SCHEDULER}: /v1 with every token through the scheduler",
    )
    parser.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results")
    return parser.parse_args(argv)


@dataclass
class Stack:
    """A started service: how to call it, the pids to profile, the folder of its logs."""

    service: Service
    targets: dict[str, int]
    logs: Path


@contextlib.contextmanager
def stack(args: argparse.Namespace, urls: list[str]) -> Iterator[Stack]:
    """The service's processes (`args.edges` edges, a scheduler, a Celery worker) and the
    peers `args.peers` names, in front of the workers at `urls`, with a key whose plan lets
    it ask `args.max_tokens` of the pool; all stopped at the end."""
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
    started: dict[str, subprocess.Popen[bytes]] = {}
    peers: list[Peer] = []
    try:
        for port in ports:
            started[f"edge-{port}"] = start(edge_command(port), logs / f"edge-{port}.log", env)
        started["scheduler"] = start(
            [sys.executable, "manage.py", "run_scheduler", "--replica-id", "overhead-bench"],
            logs / "scheduler.log",
            env,
        )
        started["celery"] = start(
            [str(Path(sys.executable).parent / "celery"), *CELERY_COMMAND],
            logs / "celery.log",
            # Celery's prefork children must not inherit a connection pool (see the Procfile).
            {**env, "DB_POOL_MAX_SIZE": "0"},
        )
        if args.through_scheduler:
            port = free_port()
            ports.append(port)
            started[f"edge-{port}"] = start(
                edge_command(port),
                logs / f"edge-{port}.log",
                {**env, "INFERENCE_DIRECT_RELAY": "0"},
            )
        edge_urls = [f"http://127.0.0.1:{port}" for port in ports]
        for url, port in zip(edge_urls, ports, strict=True):
            wait_up(f"{url}/v1/models", started[f"edge-{port}"], logs / f"edge-{port}.log")
        celery_ready(started["celery"], logs / "celery.log")
        for name in args.peers:
            peer = STARTERS[name](start, urls=urls, served=served, port=free_port(), folder=logs)
            started[name] = peer.process
            peers.append(peer)
        roots = {
            "edge": [started[f"edge-{port}"].pid for port in ports],
            "scheduler": [started["scheduler"].pid],
            "celery": [started["celery"].pid],
            **{peer.side: [peer.process.pid] for peer in peers},
        }
        service = Service(
            edge_urls=edge_urls[: args.edges],
            through_scheduler_url=edge_urls[args.edges] if args.through_scheduler else None,
            roots=roots,
            raw_key=raw_key,
            model=settings.DEFAULT_MODEL,
            peers=peers,
        )
        targets = {
            "edge": roots["edge"][0],
            "scheduler": started["scheduler"].pid,
            "celery": started["celery"].pid,
        }
        yield Stack(service, targets, logs)
    finally:
        for process in started.values():
            stop(process)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    urls = worker_urls(args.workers)
    if not urls:
        raise SystemExit("Give the workers: --workers URL[,URL] (or CHATSITE_E2E_WORKER_URLS).")
    # SIGTERM as SystemExit, so that the `finally` below stops what was started.
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    with stack(args, urls) as started:
        profile = profiler(args.profile, started.targets)
        levels, idle, facts = asyncio.run(measure(args, started.service, urls, profile))
        logs = started.logs
    parts = [
        facts,
        "",
        table(levels),
        "",
        cpu_table(levels),
        "",
        idle_table(idle, args.idle),
        "",
        checks_table(checks(levels)),
        "",
        errors(levels),
    ]
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
