"""A tiny run of `benchmarks/input_checks.py`, so that the benchmark keeps working: both ways
check and encode every request, agree on every verdict and every token id, and the parts way
keeps the scores of the parts that come back."""

from __future__ import annotations

import re
from pathlib import Path

from .support import run_benchmark


def test_the_input_checks_benchmark_times_both_ways(tmp_path: Path) -> None:
    done = run_benchmark(
        "input_checks.py",
        [
            *("--conversations", "3", "--turns", "2", "--prompts", "2"),
            *("--system-tokens", "200", "--results", str(tmp_path)),
        ],
        database_suffix="_input_checks_smoke_bench",
        redis_db=10,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = next(tmp_path.glob("input_checks-*.txt")).read_text()
    ways = ("joined \\(before\\)", "parts, kept scores", "whole prompt encoded \\(before\\)")
    for way in (*ways, "pieces, kept ids"):
        row = re.search(rf"^{way}\s+6\s+(\d+\.\d\d)\s+(\d+\.\d\d)\s+(\d+\.\d\d)\s+", report, re.M)
        assert row is not None, report
        assert float(row[3]) > 0, report
    assert "verdicts: 0 requests blocked, 0 where the two ways disagree" in report, report
    assert "token ids: 0 requests where the two ways differ" in report, report
    # Two system prompts, three first questions, three answers and three second questions
    # (some questions repeat across conversations): every part scored once is kept.
    memo = re.search(r"^memo: (\d+) entries at the end$", report, re.M)
    assert memo is not None and 5 <= int(memo[1]) <= 11, report
