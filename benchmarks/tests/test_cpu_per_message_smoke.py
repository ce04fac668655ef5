"""A tiny run of `benchmarks/cpu_per_message.py` against the suite's real workers, so that the
benchmark keeps working: every message of its trace is answered, and the CPU of every kind of
process is read back from its report."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from inference.tests.fixtures import RealWorker

from .support import run_benchmark

pytestmark = pytest.mark.e2e


def test_the_cpu_per_message_benchmark_accounts_every_process(
    real_workers: list[RealWorker], tmp_path: Path
) -> None:
    done = run_benchmark(
        "cpu_per_message.py",
        [
            *("--workers", real_workers[0].url),
            *("--conversations", "2", "--turns", "2", "--arrival", "10", "--think", "0.2"),
            *("--idle", "1", "--max-tokens", "4", "--results", str(tmp_path)),
        ],
        database_suffix="_cpu_smoke_bench",
        redis_db=15,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = next(tmp_path.glob("cpu_per_message-*.txt")).read_text()
    assert re.search(r"^4/4 messages completed", report, re.M), report
    # The one edge's warm-up turn: a fresh process's first message, timed apart.
    assert re.search(
        r"^first message on each fresh edge .*: POST \d+ ms, TTFT \d+ ms$", report, re.M
    ), report
    assert re.search(r"^all\s+4\s+4\s+0\s+\d+\s+\d+\s+\d+\s+\d+$", report, re.M), report
    number = r"(-?\d+\.\d+)"
    rows = {
        match["kind"]: match
        for match in re.finditer(
            rf"^(?P<kind>[a-z]+)\s+(?P<processes>\d+)\s+{number}\s+{number}\s+{number}"
            rf"\s+(?P<raw>{number})\s+(?P<net>{number})$",
            report,
            re.M,
        )
    }
    assert set(rows) == {"edge", "scheduler", "celery", "postgres", "redis", "total"}, report
    assert float(rows["total"]["raw"]) > 0, report
    # Celery counts its prefork children: the main process and both of them.
    assert int(rows["celery"]["processes"]) >= 3, report
    assert "errors: none" in report
