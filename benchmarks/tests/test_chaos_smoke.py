"""A tiny run of `benchmarks/chaos.py` on stand-in workers, so that the fault benchmark keeps
working: it starts its own Postgres, Redis, edges, replicas and workers, kills a worker and a
scheduler replica mid-answer, and its table says that no answer was stuck, lost or charged
twice; nothing it started is left running."""

from __future__ import annotations

import json
import re
from pathlib import Path

from benchmarks.stack import leftovers

from .support import run_benchmark

COLUMNS = (
    "answers",
    "completed",
    "restarted",
    "failed",
    "stuck",
    "lost",
    "duplicated",
    "charged twice",
    "uncharged",
    "text mismatch",
)


def test_the_chaos_benchmark_kills_a_worker_and_a_replica(tmp_path: Path) -> None:
    done = run_benchmark(
        "chaos.py",
        [
            *("--workers", "fake", "--phases", "worker,scheduler"),
            *("--clients", "2", "--v1-clients", "1", "--lead", "2", "--after", "3"),
            *("--deadline", "60", "--fake-tokens", "20", "--results", str(tmp_path)),
        ],
        database_suffix="_chaos_smoke_bench",
        redis_db=13,
    )
    output = done.stdout[-3000:] + done.stderr[-3000:]
    assert done.returncode == 0, output
    folder = re.search(r"^stack in (\S+)$", done.stdout, re.M)
    assert folder is not None, output
    assert leftovers(folder[1]) == [], output

    report = next(tmp_path.glob("chaos-*.txt")).read_text()
    header = re.search(r"^phase\s+door\s+(.+)$", report, re.M)
    assert header is not None, report
    assert re.split(r"\s{2,}", header[1].strip()) == list(COLUMNS), report
    rows = {
        (match["phase"], match["door"]): dict(
            zip(COLUMNS, map(int, match["numbers"].split()), strict=True)
        )
        for match in re.finditer(
            r"^(?P<phase>worker|scheduler)\s+(?P<door>conversations|v1-stream|all)"
            r"\s+(?P<numbers>(?:\d+\s+){9}\d+)\s*$",
            report,
            re.M,
        )
    }
    assert set(rows) == {
        (phase, door)
        for phase in ("worker", "scheduler")
        for door in ("conversations", "v1-stream", "all")
    }, report
    for phase in ("worker", "scheduler"):
        total = rows[(phase, "all")]
        assert total["answers"] > 0, report
        assert total["stuck"] == 0 and total["lost"] == 0, report
        assert total["charged twice"] == 0, report
        # Every answer ended one way or the other.
        assert total["completed"] + total["failed"] == total["answers"], report
        assert re.search(rf"^  {phase}\s+kill -9 {phase}-\d .* at \+[\d.]+ s; ", report, re.M)

    saved = json.loads(next(tmp_path.glob("chaos-*.json")).read_text())
    assert [p["phase"] for p in saved["phases"]] == ["worker", "scheduler"]
    for phase in saved["phases"]:
        assert phase["rows"]["all"] == rows[(phase["phase"], "all")]
        assert len(phase["answers"]) == phase["rows"]["all"]["answers"]
