"""A tiny run of `benchmarks/overhead.py` against the suite's real workers, so that the
benchmark keeps working: every side answers, and its table is read back."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings

from inference.tests.fixtures import RealWorker

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


def test_the_overhead_benchmark_measures_every_side(
    real_workers: list[RealWorker], tmp_path: Path
) -> None:
    database = settings.DATABASES["default"]
    env = {
        **os.environ,
        # Its own database and Redis db, as the benchmark insists (it flushes the Redis db).
        "DATABASE_URL": (
            f"postgres://{database['USER']}@{database['HOST']}:{database['PORT']}"
            f"/{database['NAME']}_overhead_smoke_bench"
        ),
        "REDIS_URL": settings.REDIS_URL.rsplit("/", 1)[0] + "/13",
    }
    done = subprocess.run(  # noqa: S603 (our own command line)
        [
            sys.executable,
            "benchmarks/overhead.py",
            *("--workers", real_workers[0].url),
            *("--concurrency", "1", "--rounds", "1", "--min-requests", "1"),
            *("--max-tokens", "4", "--results", str(tmp_path), "--profile", str(tmp_path)),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = next(tmp_path.glob("overhead-*.txt")).read_text()
    rows = {
        match["side"]: match
        for match in re.finditer(
            r"^1\s+(?P<side>[a-z1/]+)\s+(?P<ok>\d+/\d+)\s+(?P<ttft>\d+)\s+\d+", report, re.M
        )
    }
    for side in ("direct", "v1", "conversations"):
        assert rows[side]["ok"] == "1/1", report
        assert int(rows[side]["ttft"]) > 0, report
    assert re.search(r"^1\s+conversations/direct\s+\d+\.\d\d", report, re.M), report
    assert "errors: none" in report
    # py-spy recorded the edge and the scheduler while each service side ran.
    assert {p.name for p in tmp_path.glob("*-x1.txt")} == {
        "edge-v1-x1.txt",
        "edge-conversations-x1.txt",
        "scheduler-v1-x1.txt",
        "scheduler-conversations-x1.txt",
    }
