"""A tiny run of `benchmarks/overhead.py` against the suite's real workers, so that the
benchmark keeps working: every side answers, and its tables are read back. The peers (LiteLLM
proxy, Open WebUI) are not installed by `make test`: the smoke run goes without them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from inference.tests.fixtures import RealWorker

from .support import run_benchmark

pytestmark = pytest.mark.e2e


def test_the_overhead_benchmark_measures_every_side(
    real_workers: list[RealWorker], tmp_path: Path
) -> None:
    done = run_benchmark(
        "overhead.py",
        [
            *("--workers", real_workers[0].url),
            *("--concurrency", "1", "--rounds", "1", "--min-requests", "1"),
            *("--max-tokens", "4", "--results", str(tmp_path), "--profile", str(tmp_path)),
            *("--peers", "none", "--idle", "1"),
        ],
        database_suffix="_overhead_smoke_bench",
        redis_db=13,
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
    # Each kind of the service's process, Celery's included, is charged and measured idle.
    assert re.search(r"^streams\s+side\s+edge CPU.*celery CPU ms/answer", report, re.M), report
    idle = dict(re.findall(r"^(edge|scheduler|celery|postgres|redis)\s+(\d+\.\d)$", report, re.M))
    assert set(idle) == {"edge", "scheduler", "celery", "postgres", "redis"}, report
    assert re.search(
        r"^x1 v1 TTFT p50 / direct\s+\d+\.\d\d\s+<= 1.10\s+(met|NOT met)$", report, re.M
    )
    # py-spy recorded the edge, the scheduler and Celery while they idled and while each
    # service side ran.
    assert {p.name for p in tmp_path.glob("*-*.txt") if not p.name.startswith("overhead-")} == {
        f"{process}-{label}.txt"
        for process in ("edge", "scheduler", "celery")
        for label in ("idle", "v1-x1", "conversations-x1")
    }
