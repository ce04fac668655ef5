"""Running a benchmark script as the suite's smoke runs do: its own database and Redis db."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from django.conf import settings

from chatsite.testing import budget

ROOT = Path(__file__).resolve().parents[2]


def run_benchmark(
    script: str, args: Sequence[str], *, database_suffix: str, redis_db: int
) -> subprocess.CompletedProcess[str]:
    """Run `benchmarks/<script>` with `args`, on a database named after the test database
    plus `database_suffix` (it must end in "bench") and Redis db `redis_db` (the benchmark
    flushes it), as the benchmarks insist; returns the finished process."""
    database = settings.DATABASES["default"]
    env = {
        **os.environ,
        "DATABASE_URL": (
            f"postgres://{database['USER']}@{database['HOST']}:{database['PORT']}"
            f"/{database['NAME']}{database_suffix}"
        ),
        "REDIS_URL": settings.REDIS_URL.rsplit("/", 1)[0] + f"/{redis_db}",
    }
    return subprocess.run(  # noqa: S603 (our own command line)
        [sys.executable, f"benchmarks/{script}", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        # Only where a hung run gives up: a smoke run takes a minute or two on a quiet machine.
        timeout=budget(900),
        check=False,
    )
