"""A tiny run of `benchmarks/turn_cpu.py`, so that the benchmark keeps working: every step
is counted, with its CPU and its statements, and the report ends with the bar's verdict."""

from __future__ import annotations

import re
from pathlib import Path

from .support import run_benchmark


def test_the_turn_cpu_benchmark_counts_every_step(tmp_path: Path) -> None:
    done = run_benchmark(
        "turn_cpu.py",
        ["--conversations", "2", "--turns", "2", "--results", str(tmp_path)],
        database_suffix="_turn_cpu_smoke_bench",
        redis_db=10,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = next(tmp_path.glob("turn_cpu-*.txt")).read_text()
    # Two conversations of two counted turns: four sends, finishes and reads; the flush once
    # a round, shared by its two answers; the floor's request once an answer.
    for step in ("send", "finish", "flush", "read", "floor"):
        row = re.search(rf"^{step}\s+4\s+(\d+\.\d\d)\s+(\d+\.\d\d)\s+(\d+\.\d\d)\s+", report, re.M)
        assert row is not None, report
        assert float(row[1]) > 0, report
    send = re.search(r"^send\s.*\s(\d+)-(\d+)$", report, re.M)
    assert send is not None and 1 <= int(send[1]) <= int(send[2]), report
    assert re.search(
        r"^bar \(#34\): a send costs the edge <= 3 ms of CPU: .*(met|NOT met)$", report, re.M
    ), report
    assert re.search(
        r"^the stack's floor: \d+\.\d\d ms p50; a send is \d+\.\d times it$", report, re.M
    ), report
