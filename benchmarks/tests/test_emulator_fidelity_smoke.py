"""A tiny run of `benchmarks/emulator_fidelity.py`, so that it keeps working. Its reference
here is an emulated worker too (the suite's real workers are busy elsewhere and slow to fit),
with the fitted profile given: the run starts its own emulated worker with that profile, plays
the trace on both sides and writes the table with its verdicts."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from benchmarks.common import free_port
from benchmarks.emulator.launch import start_fleet
from chatsite.testing import budget

from .support import ROOT


def test_the_fidelity_run_compares_both_sides(tmp_path: Path) -> None:
    reference = start_fleet(["--port", str(free_port()), "--profile", "h100-8b"])
    try:
        fitted = {"step_ms": 8.0, "step_ms_per_stream": 0.06, "prefill_ms_per_token": 0.05}
        done = subprocess.run(  # noqa: S603 (our own command line)
            [
                sys.executable,
                "benchmarks/emulator_fidelity.py",
                *("--worker", reference.urls[0], "--concurrency", "1,2", "--rounds", "2"),
                *("--max-tokens", "8", "--fitted", json.dumps(fitted)),
                *("--results", str(tmp_path)),
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=budget(600),
        )
    finally:
        reference.stop()
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = next(tmp_path.glob("emulator_fidelity-*.txt")).read_text()
    for streams in ("1", "2"):
        for side in ("real", "emulated"):
            row = re.search(rf"^{streams}\s+{side}\s+(\d+)/(\d+)\s+\d+", report, re.M)
            assert row is not None, report
            assert row[1] == row[2] == str(int(streams) * 2), report
        for figure in ("TTFT p50", "TTFT p99", "output tok/s"):
            assert re.search(
                rf"^{streams}\s+{figure}\s+\d+\.\d\d\s+within 15%\s+(met|NOT met)$", report, re.M
            ), report
    # The emulator's own CPU per answer is reported for its side.
    assert re.search(r"^1\s+emulated\s+.*\s\d+\.\d$", report, re.M), report
