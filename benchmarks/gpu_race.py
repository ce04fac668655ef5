"""The race on a real GPU: vLLM workers sharing one GPU, their KV cache limited, the routers and
this service over them, in under 8 minutes; and which KV cache events a real GPU worker sends.

Issue 35 proves the scheduler on emulated H100-class workers (`router_race.py --emulated`);
this plays the same race against vLLM itself on a GPU, whenever one is at hand for a few
minutes:

1. `--workers` vLLM servers of the project's model (`manage.py run_worker --device gpu`), all
   at once on the one GPU, each with `--kv-cache-gib` of KV cache (small, so that placement
   decides what stays cached) and its share of the GPU's memory; prefix caching, priority
   scheduling and KV events on, as the project runs every worker;
2. while the race plays, the first worker's KV events are read straight from its publisher:
   which kinds of event came, with which fields, and whether the scheduler's own decoder
   (`inference.scheduler.kv_events.decode`) read every batch;
3. `router_race.py` over those workers, its `+events` sides following their KV events, with
   its usual table.

Both go to benchmarks/results/gpu_race-<UTC date-time>.txt, with the time each phase took.
Run it on a machine with an NVIDIA GPU, set up as for `make run` (`make worker-venv` installs
vLLM's GPU build there, as `nvidia-smi` works), Postgres and Redis answering:

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/chatsite_race_bench \\
    REDIS_URL=redis://127.0.0.1:6379/8 SECRET_KEY=x PLUGINS_ENCRYPTION_KEY=x HF_HUB_OFFLINE=1 \\
        .venv/bin/python benchmarks/gpu_race.py

Without a GPU, or without vLLM's GPU build in the worker environment, it says which is missing
and stops (exit 2) before starting anything.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import django_start, service_env, write_result  # noqa: E402
from benchmarks.emulator.launch import free_ports  # noqa: E402
from benchmarks.openai_api import start, stop  # noqa: E402

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/chatsite_race_bench"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/8"
DEFAULT_SIDES = (
    "vllm-router:round_robin,vllm-router:consistent_hash,sglang-router:cache_aware,"
    "v1:predicted_ttft,v1:predicted_ttft+events,conversations:predicted_ttft"
)
# A GPU worker compiles and captures its CUDA graphs before /health answers: a minute or two.
START_TIMEOUT_S = 300
# Checks, in the worker environment, that vLLM's GPU build is there and sees a GPU.
VLLM_ON_GPU = "import torch, vllm; assert torch.cuda.is_available(); print(vllm.__version__)"


def missing() -> str | None:
    """What this machine lacks for the race on a GPU (a sentence), or None."""
    from django.conf import settings

    from inference.management.commands.run_worker import detect_device

    if detect_device() != "gpu":
        return "no GPU here: `nvidia-smi -L` lists none"
    python = Path(settings.WORKER_PYTHON)
    if not python.is_file():
        return f"no worker environment ({python}): run `make worker-venv` on this machine"
    try:
        found = subprocess.run(  # noqa: S603 (our own interpreter and code)
            [str(python), "-c", VLLM_ON_GPU], capture_output=True, text=True, timeout=120
        )
    except subprocess.TimeoutExpired:
        return "the worker environment did not answer whether vLLM sees the GPU"
    if found.returncode != 0:
        return (
            "the worker environment has no vLLM GPU build that sees the GPU (`make worker-venv` "
            f"on this machine installs requirements-worker-gpu.txt): {found.stderr[-300:]}"
        )
    return None


def worker_command(args: argparse.Namespace, port: int, events_port: int) -> list[str]:
    """One GPU worker of the race: its KV cache of `--kv-cache-gib`, and the share of the GPU's
    memory vLLM may take (its check at start wants that much free, and the workers start
    together)."""
    return [
        sys.executable,
        "manage.py",
        "run_worker",
        *("--device", "gpu", "--port", str(port), "--kv-events-port", str(events_port)),
        *("--kv-cache-gib", f"{args.kv_cache_gib:g}", "--max-num-seqs", str(args.max_num_seqs)),
        *("--extra", "--gpu-memory-utilization", f"{args.gpu_share / args.workers:.3f}"),
    ]


@dataclass
class EventTap:
    """A worker's KV event batches, read from its publisher on a thread of their own."""

    endpoint: str
    batches: int = 0
    decoded: int = 0
    kinds: Counter[str] = field(default_factory=Counter)
    fields: dict[str, str] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._read, name="kv-event-tap", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _read(self) -> None:
        import zmq

        context = zmq.Context()
        socket = context.socket(zmq.SUB)
        socket.setsockopt(zmq.SUBSCRIBE, b"")
        socket.setsockopt(zmq.RCVTIMEO, 200)
        socket.connect(self.endpoint)
        try:
            while not self._stop.is_set():
                try:
                    frames = socket.recv_multipart()
                except zmq.Again:
                    continue
                self.take(frames[-1])
        finally:
            socket.close(linger=0)
            context.term()

    def take(self, payload: bytes) -> None:
        """One batch: its events' kinds and fields as sent, and whether the scheduler's
        decoder reads it."""
        import msgspec

        from inference.scheduler import kv_events

        self.batches += 1
        try:
            kv_events.decode(payload)
            self.decoded += 1
        except msgspec.DecodeError as error:
            if len(self.failures) < 3:
                self.failures.append(str(error))
        batch = msgspec.msgpack.decode(payload)
        for event in batch[1] if isinstance(batch, list) and len(batch) > 1 else []:
            kind, shape = describe_event(event)
            self.kinds[kind] += 1
            self.fields.setdefault(kind, shape)

    def report(self) -> str:
        lines = [
            f"KV events of the first worker ({self.endpoint}): {self.batches} batches, "
            f"{self.decoded} read by the scheduler's decoder"
        ]
        lines += [f"  {kind}: {n} events; {self.fields[kind]}" for kind, n in self.kinds.items()]
        lines += [f"  not read: {failure}" for failure in self.failures]
        return "\n".join(lines)


def describe_event(event: Any) -> tuple[str, str]:
    """An event's kind and its fields as msgpack carried them: a tagged array (the tag, then
    the values in order) or a map."""
    if isinstance(event, list) and event and isinstance(event[0], str):
        values = ", ".join(type(value).__name__ for value in event[1:])
        return event[0], f"an array of the tag and {len(event) - 1} values ({values})"
    if isinstance(event, dict):
        kind = str(event.get("type", "?"))
        return kind, "a map of " + ", ".join(sorted(str(key) for key in event))
    return type(event).__name__, "not an event vLLM documents"


def wait_healthy(urls: Sequence[str], processes: Sequence[Any], logs: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    waiting = list(urls)
    while waiting:
        for index, process in enumerate(processes):
            if process.poll() is not None:
                log = (logs / f"worker-{index}.log").read_text(errors="replace")
                raise SystemExit(f"worker {index} stopped while starting:\n{log[-3000:]}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{waiting[0]}/health", timeout=2).status_code == 200:
                waiting.pop(0)
                continue
        if time.monotonic() > deadline:
            raise SystemExit(f"{waiting[0]} did not answer /health in {START_TIMEOUT_S} s")
        time.sleep(1)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=4, help="vLLM workers on the one GPU")
    parser.add_argument(
        "--kv-cache-gib",
        type=float,
        default=0.25,
        help="each worker's KV cache, GiB (SmolLM2-135M: ~11,600 tokens in 0.25; vLLM wants "
        "room for one request of max_model_len, 8,192 tokens)",
    )
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument(
        "--gpu-share",
        type=float,
        default=0.8,
        help="the share of the GPU's memory the workers may take together",
    )
    parser.add_argument("--sides", default=DEFAULT_SIDES)
    parser.add_argument(
        "--race",
        default="--conversations 60 --turns 3 --prompts 8 --system-tokens 800 --max-tokens 64 "
        "--think 0.5 --rate 6",
        help="router_race.py's trace options (sized to play every side within the budget)",
    )
    parser.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    django_start(database_url=DEFAULT_DATABASE_URL, redis_url=DEFAULT_REDIS_URL)
    lacking = missing()
    if lacking:
        print(f"gpu_race: cannot run here: {lacking}", file=sys.stderr)
        return 2
    began = time.monotonic()
    logs = Path(tempfile.mkdtemp(prefix="gpu-race-"))
    ports, events = free_ports(args.workers), free_ports(2 * args.workers)
    urls = [f"http://127.0.0.1:{ports + i}" for i in range(args.workers)]
    endpoints = [f"tcp://127.0.0.1:{events + 2 * i}" for i in range(args.workers)]
    env = service_env()
    processes = [
        start(worker_command(args, ports + i, events + 2 * i), logs / f"worker-{i}.log", env)
        for i in range(args.workers)
    ]
    tap = EventTap(endpoints[0])
    try:
        wait_healthy(urls, processes, logs)
        started = time.monotonic() - began
        tap.start()
        race = subprocess.run(  # noqa: S603 (our own benchmark)
            [
                sys.executable,
                str(ROOT / "benchmarks" / "router_race.py"),
                *("--workers", ",".join(urls), "--kv-events", ",".join(endpoints)),
                *("--sides", args.sides, "--results", str(args.results)),
                *args.race.split(),
            ],
            cwd=ROOT,
            env={**os.environ},
            capture_output=True,
            text=True,
            check=False,
        )
        tap.stop()
    finally:
        tap.stop()
        for process in processes:
            stop(process)
    played = time.monotonic() - began - started
    gpu = subprocess.run(  # noqa: S603 (a fixed command line)
        [shutil.which("nvidia-smi") or "nvidia-smi", "-L"], capture_output=True, text=True
    ).stdout.strip()
    table = race.stdout.split("router race:", 1)[-1] if race.returncode == 0 else ""
    report = (
        f"gpu_race: {args.workers} vLLM workers on {gpu}, {args.kv_cache_gib:g} GiB of KV cache "
        f"and max_num_seqs {args.max_num_seqs} each; started in {started:.0f} s, the race "
        f"played in {played:.0f} s (logs in {logs})\n\n{tap.report()}\n\n"
        + (
            f"router race:{table}"
            if table
            else f"the race failed (exit {race.returncode}):\n{race.stdout[-3000:]}"
            f"\n{race.stderr[-3000:]}"
        )
    )
    print(report)
    print(f"\nwritten to {write_result(args.results, 'gpu_race', report)}")
    return 0 if race.returncode == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
