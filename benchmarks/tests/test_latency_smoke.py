"""A tiny run of `benchmarks/latency.py` against the suite's real workers, so that the
benchmark keeps working: every side answers, and each service answer's stages are read from
Redis and add up to its first-token time."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from inference.tests.fixtures import RealWorker

from .support import run_benchmark

pytestmark = pytest.mark.e2e

NUMBER = r"(\d+\.\d)"


def test_the_latency_benchmark_traces_every_stage(
    real_workers: list[RealWorker], tmp_path: Path
) -> None:
    done = run_benchmark(
        "latency.py",
        [
            *("--worker", real_workers[0].url),
            *("--rounds", "1", "--max-tokens", "48", "--pause", "0"),
            *("--results", str(tmp_path)),
        ],
        database_suffix="_latency_smoke_bench",
        redis_db=13,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = next(tmp_path.glob("latency-*.txt")).read_text()
    assert "errors:" not in report, report
    assert re.search(rf"^direct\s+1/1\s+{NUMBER}\s", report, re.M), report
    for side in ("v1", "conversations"):
        # TTFT p50, p90, the excess over direct, the POST, the stream's opening, six stages.
        # The job's marks are read as the first text arrives: 47 tokens more to go then.
        row = re.search(rf"^{side}\s+1/1\s+1/1\s+(.*)$", report, re.M)
        assert row is not None, report
        cells = row[1].split()
        ttft, stages = float(cells[0]), [float(cell) for cell in cells[-6:]]
        # One answer per side: its stages run from the request to its first text.
        assert sum(stages) == pytest.approx(ttft, abs=0.5), report
        assert stages[3] > 0, report  # the worker's own time to first token
