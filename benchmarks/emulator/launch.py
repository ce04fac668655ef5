"""Starting a fleet of emulated workers from a benchmark or a test, and stopping it."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
