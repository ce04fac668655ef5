"""Starting a fleet of emulated workers from a benchmark or a test, and stopping it."""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .profiles import Profile, profile_named

ROOT = Path(__file__).resolve().parent.parent.parent


@dataclass
class Fleet:
    process: subprocess.Popen[str]
    workers: list[dict[str, Any]]  # per worker: url, and kv_events, kv_events_replay

    @property
    def urls(self) -> list[str]:
        return [worker["url"] for worker in self.workers]

    @property
    def kv_events(self) -> list[str]:
        return [worker["kv_events"] for worker in self.workers if "kv_events" in worker]

    def stop(self, timeout: float = 30) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def start_fleet(arguments: Sequence[str]) -> Fleet:
    """`python -m benchmarks.emulator ARGUMENTS`, once it says it is ready."""
    process = subprocess.Popen(  # noqa: S603 (our own command line)
        [sys.executable, "-m", "benchmarks.emulator", *arguments],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    workers: list[dict[str, Any]] = []
    for line in process.stdout:
        if line.strip() == "ready":
            return Fleet(process, workers)
        workers.append(json.loads(line))
    process.wait()
    raise RuntimeError(f"the emulator did not start (exit status {process.returncode})")


def process_cpu_seconds(url: str) -> float:
    """The emulator process's CPU so far, from a worker's /metrics (all report the same)."""
    import httpx

    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith("process_cpu_seconds_total "):
            return float(line.split()[1])
    return 0.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """A benchmark's options for running on an emulated fleet instead of `--workers`."""
    parser.add_argument(
        "--emulated",
        type=int,
        default=0,
        help="start this many emulated vLLM workers (benchmarks/emulator, with KV events) "
        "instead of naming --workers",
    )
    parser.add_argument("--profile", default="h100-8b", help="the emulated workers' profile")
    parser.add_argument("--num-blocks", type=int, default=0, help="emulated KV cache, blocks")
    parser.add_argument(
        "--max-num-seqs",
        type=int,
        default=0,
        help="answers an emulated worker runs at once (vLLM's max_num_seqs; 0: the profile's)",
    )
    parser.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="the emulated fleet's durations times this (a slower fleet, for a machine whose "
        "routing processes cannot keep up with the real speed)",
    )


def start_for(args: argparse.Namespace) -> Fleet | None:
    """The fleet `args` ask for (`add_arguments`), with `args.workers` set to its URLs; None
    when they name real workers."""
    if not args.emulated:
        return None
    fleet = start_fleet(
        [
            *("--workers", str(args.emulated), "--port", str(free_ports(args.emulated))),
            *("--kv-events-port", str(free_ports(2 * args.emulated))),
            *("--profile", args.profile, "--time-scale", str(args.time_scale)),
            *(("--num-blocks", str(args.num_blocks)) if args.num_blocks else ()),
            *(("--max-num-seqs", str(args.max_num_seqs)) if args.max_num_seqs else ()),
        ]
    )
    args.workers = ",".join(fleet.urls)
    return fleet


def describe(args: argparse.Namespace) -> str:
    scale = f", every duration x{args.time_scale:g}" if args.time_scale != 1 else ""
    sizes = "".join(
        f", {name} {value}"
        for name, value in (("num_blocks", args.num_blocks), ("max_num_seqs", args.max_num_seqs))
        if value
    )
    return f"emulated workers (benchmarks/emulator), profile {args.profile}{sizes}{scale}"


def emulated_profile(args: argparse.Namespace) -> Profile:
    """The emulated workers' profile as `args` size it."""
    return profile_named(args.profile).sized(
        num_blocks=args.num_blocks, max_num_seqs=args.max_num_seqs
    )


def free_ports(count: int) -> int:
    """The first of `count` consecutive ports free now."""
    from benchmarks.common import free_port

    for _ in range(100):
        first = free_port()
        try:
            for port in range(first, first + count):
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", port))
        except OSError:
            continue
        return first
    raise RuntimeError("no run of free ports")
