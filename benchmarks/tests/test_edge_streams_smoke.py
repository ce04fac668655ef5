"""A tiny run of `benchmarks/edge_streams.py`, so that the benchmark keeps reading the stream
the edge sends (it once stopped seeing events when their `id:` field moved to the end)."""

from __future__ import annotations

import re
from pathlib import Path

from .support import run_benchmark


def test_the_edge_streams_benchmark_delivers_every_event(tmp_path: Path) -> None:
    done = run_benchmark(
        "edge_streams.py",
        [
            *("--streams", "5", "--rate", "5", "--seconds", "1", "--ramp", ""),
            *("--budget", "60", "--results-dir", str(tmp_path)),
        ],
        database_suffix="_edge_smoke_bench",
        redis_db=14,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = next(tmp_path.glob("edge_streams-*.txt")).read_text()
    active = re.search(
        r"^active\s+5\s+(?P<held>\d+)\s+\S+\s+(?P<sent>\d+)\s+\S+\s+(?P<delivered>\d+)"
        r"\s+(?P<errors>\d+)",
        report,
        re.M,
    )
    assert active is not None, report
    assert int(active["sent"]) > 0, report
    assert active["delivered"] == active["sent"], report
    assert (active["held"], active["errors"]) == ("5", "0"), report
