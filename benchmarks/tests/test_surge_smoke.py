"""A tiny run of `benchmarks/surge.py` against the suite's real workers, so that the surge
keeps working: both sides play it, and the table is read back."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from inference.tests.fixtures import RealWorker

from .support import run_benchmark

pytestmark = pytest.mark.e2e


def test_the_surge_is_played_on_both_sides(real_workers: list[RealWorker], tmp_path: Path) -> None:
    done = run_benchmark(
        "surge.py",
        [
            *("--workers", ",".join(w.url for w in real_workers)),
            *("--free", "6", "--pro", "2", "--cancel", "2", "--unloaded", "2"),
            *("--concurrency", "2", "--max-tokens", "8", "--results", str(tmp_path)),
        ],
        database_suffix="_surge_smoke_bench",
        redis_db=5,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = next(tmp_path.glob("surge-*.txt")).read_text()
    for side in ("even", "tiered"):
        row = re.search(
            rf"^{side}\s+1\s+(?P<unloaded>[\d,]+) / [\d,]+\s+(?P<alone>[\d,]+) / [\d,]+\s+"
            r"(?P<pro>[\d,]+)\s+[\d,]+\s+"
            r"(?P<ratio>\d+\.\d\d)\s+(?P<alone_ratio>\d+\.\d\d)\s+(?P<free>[\d,]+)\s+[\d,]+\s+\d+\s+(?P<pro_ended>\S+)\s+"
            r"(?P<free_ended>.+?)\s+(?P<waiting>\d+) / (?P<reached>\d+) \(\d+\)\s+\d+\s*$",
            report,
            re.M,
        )
        assert row is not None, report
        assert row["pro_ended"] == "complete=2", report
        # Every free answer ended answered or cancelled, none in error (the queue is too short
        # here for the overload policy to refuse new conversations).
        ended = dict(part.split("=") for part in row["free_ended"].split())
        assert set(ended) <= {"complete", "cancelled"}, report
        assert sum(map(int, ended.values())) == 6, report
        assert int(ended.get("cancelled", 0)) == int(row["waiting"]) + int(row["reached"]), report
        assert int(row["unloaded"].replace(",", "")) > 0 and float(row["ratio"]) > 0, report
        assert int(row["alone"].replace(",", "")) > 0 and float(row["alone_ratio"]) > 0, report


def test_the_surge_runs_on_an_emulated_fleet(tmp_path: Path) -> None:
    """`--emulated N` starts its own fleet (no real workers needed), ten times slower than the
    profile so that the bursts overlap the answers; one heavy free user sends three times as
    many as each of two others, and the report says how the tier was shared."""
    done = run_benchmark(
        "surge.py",
        [
            *("--emulated", "2", "--profile", "h100-8b", "--time-scale", "10"),
            *("--sides", "tiered", "--free", "6", "--pro", "2", "--cancel", "2"),
            *("--heavy", "3", "--light-users", "2"),
            *("--unloaded", "2", "--concurrency", "2", "--max-tokens", "8"),
            *("--results", str(tmp_path)),
        ],
        database_suffix="_surge_emulated_smoke_bench",
        redis_db=5,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = next(tmp_path.glob("surge-*.txt")).read_text()
    assert "emulated workers (benchmarks/emulator), profile h100-8b, every duration x10" in report
    row = re.search(
        r"^tiered\s+1\s+[\d,]+ / [\d,]+\s+.*?\s(?P<pro_ended>complete=\d+)\s", report, re.M
    )
    assert row is not None, report
    assert row["pro_ended"] == "complete=2", report
    fair = re.search(
        r"^tiered 1: (?P<figure>.+)$", report.split("fairness within the free tier:")[1], re.M
    )
    assert fair is not None, report
    # Sends of so few users may all be admitted as they arrive; where some waited, the
    # figure reads the tokens each was admitted against VTC's bound.
    assert fair["figure"].startswith(("the heavy user sent 67%", "no free user had to wait")), (
        report
    )
