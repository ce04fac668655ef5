"""A tiny run of `benchmarks/conversation_drop.py`, so that the benchmark keeps working: both
sides drop their conversations, and the table is read back."""

from __future__ import annotations

import re
from pathlib import Path

from .support import run_benchmark


def test_both_sides_drop_their_conversations(tmp_path: Path) -> None:
    done = run_benchmark(
        "conversation_drop.py",
        ["--conversations", "3", "--messages", "2", "--rounds", "2", "--results", str(tmp_path)],
        database_suffix="_drop_smoke_bench",
        redis_db=4,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = next(tmp_path.glob("conversation_drop-*.txt")).read_text()
    statements = {}
    for side in ("one statement", "one by one"):
        row = re.search(
            rf"^{side}\s+(?P<cpu>\d+\.\d\d)\s+(?P<wall>\d+\.\d\d)\s+(?P<statements>\d+)\s+"
            r"(?P<rounds>(?:\d+\.\d\d/\d+\.\d\d ?){2})$",
            report,
            re.M,
        )
        assert row is not None, report
        assert float(row["cpu"]) > 0 and float(row["wall"]) > 0, report
        statements[side] = int(row["statements"])
    # The related models' deletes, the messages' and the row's became one statement.
    assert statements["one by one"] - statements["one statement"] >= 2, report
    assert re.search(r"one statement over one by one: \d+\.\d\d$", report, re.M), report
