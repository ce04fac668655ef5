"""A tiny run of `benchmarks/answer_cost.py` against the suite's real workers, so that the
benchmark keeps working: every process is charged a short and a long answer, and the
worker's stream is read bare both ways."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from inference.tests.fixtures import RealWorker

from .support import run_benchmark

pytestmark = pytest.mark.e2e

NUMBER = r"-?\d+\.\d+"


def test_the_answer_cost_benchmark_splits_an_answers_cost_per_process(
    real_workers: list[RealWorker], tmp_path: Path
) -> None:
    done = run_benchmark(
        "answer_cost.py",
        [
            *("--workers", real_workers[0].url, "--rounds", "1", "--answers", "2"),
            *("--max-tokens", "6", "--idle", "1", "--results", str(tmp_path)),
        ],
        database_suffix="_answer_cost_smoke_bench",
        redis_db=13,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = next(tmp_path.glob("answer_cost-*.txt")).read_text()
    assert "errors: none" in report, report
    counts = re.search(
        r"short: (\d+) answers of 1 token.*long: (\d+) answers of (\d+\.\d) tokens", report
    )
    assert counts is not None, report
    assert counts[1] == counts[2] == "2", report
    assert float(counts[3]) > 1, report
    rows = dict(
        re.findall(
            rf"^(edge|scheduler|celery|postgres|redis|total)\s+({NUMBER}(?:\s+{NUMBER}){{4}})$",
            report,
            re.M,
        )
    )
    assert set(rows) == {"edge", "scheduler", "celery", "postgres", "redis", "total"}, report
    # The edge and the scheduler work for every answer, short or long.
    for process in ("edge", "scheduler"):
        _, short_ms, long_ms, *_ = (float(value) for value in rows[process].split())
        assert short_ms > 0 and long_ms > 0, report
    for read in ("plain socket", "aiohttp lines"):
        assert re.search(rf"^{read}\s+2\s+{NUMBER}\s+{NUMBER}$", report, re.M), report
