"""A tiny run of `benchmarks/soak.py` on stand-in workers, so that the soak keeps working: a
few users for a few seconds through both doors, every process's memory sampled, the Redis
keys counted twice; no answer stuck or lost, nothing it started left running."""

from __future__ import annotations

import json
import re
from pathlib import Path

from benchmarks.stack import leftovers

from .support import run_benchmark


def test_the_soak_benchmark_samples_every_process_and_counts_the_keys(tmp_path: Path) -> None:
    done = run_benchmark(
        "soak.py",
        [
            *("--workers", "fake", "--users", "3", "--seconds", "6", "--think", "0.3"),
            *("--sample", "1", "--settle", "2", "--deadline", "60"),
            *("--mix", "1,1,1", "--results", str(tmp_path)),
        ],
        database_suffix="_soak_smoke_bench",
        redis_db=13,
    )
    output = done.stdout[-3000:] + done.stderr[-3000:]
    assert done.returncode == 0, output
    folder = re.search(r"^stack in (\S+)$", done.stdout, re.M)
    assert folder is not None, output
    assert leftovers(folder[1]) == [], output

    report = next(tmp_path.glob("soak-*.txt")).read_text()
    doors = {
        match["door"]: [int(n) for n in match["numbers"].split()]
        for match in re.finditer(
            r"^(?P<door>conversations|v1-stream|v1|all)\s+(?P<numbers>(?:\d+\s+){4}\d+)"
            r"\s+\d+\.\d\d%\s+\S+\s+\S+\s*$",
            report,
            re.M,
        )
    }
    assert "all" in doors, report
    requests, completed, failed, stuck, lost = doors["all"]
    assert requests > 0 and completed + failed == requests, report
    assert stuck == 0 and lost == 0, report

    memory = set(
        re.findall(
            r"^(edge-\d|scheduler-\d|worker-\d|celery)\s+\d+\s+[\d,.]+\s+[\d,.]+\s+[\d,.]+"
            r"\s+[+-][\d.]+\s+[+-][\d,.]+\s+(?:yes|NO)\s*$",
            report,
            re.M,
        )
    )
    assert memory == {
        "edge-0", "edge-1", "scheduler-0", "scheduler-1", "worker-0", "worker-1", "celery"
    }, report  # fmt: skip
    assert len(re.findall(r"^key pattern\s+keys\s+no TTL\s+max TTL s\s+verdict", report, re.M)) == 2
    assert re.search(r"^cs:stream:\{s<n>\}:<uuid>\s+\d+\s+0\s+[\d,]+\s+expires", report, re.M), (
        report
    )
    assert len(re.findall(r"^leaks: ", report, re.M)) == 2, report

    saved = json.loads(next(tmp_path.glob("soak-*.json")).read_text())
    assert saved["totals"]["answers"] == requests and saved["totals"]["stuck"] == 0
    assert {row["process"] for row in saved["memory"]} == memory
    assert saved["samples"] and saved["keys_idle"] and saved["keys_stopped"] is not None
