"""A tiny run of `benchmarks/fleet_sim.py`, so that the simulator keeps working: every policy
places the trace on a small fleet, none beats one unlimited cache, and the table is read back.
It runs the live scheduler's policy, so a change to `PredictedTTFTPolicy` shows here too."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from chatsite.testing import budget

from .support import ROOT

POLICIES = ("random", "round_robin", "least_loaded", "consistent_hash", "sglang", "llmd", "ours")


def test_the_simulator_runs_every_policy(tmp_path: Path) -> None:
    done = subprocess.run(  # noqa: S603 (our own command line)
        [
            sys.executable,
            "benchmarks/fleet_sim.py",
            *("--workers", "4", "--seconds", "6", "--results", str(tmp_path)),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        # Only where a hung run gives up: a smoke run takes a minute or two on a quiet machine.
        timeout=budget(900),
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = next(tmp_path.glob("fleet_sim-*.txt")).read_text()
    rows = {
        m["policy"]: m
        for m in re.finditer(
            r"^4\s+(?P<policy>\w+)\s+(?P<hit>\d\.\d{3})\s+(?P<oracle>\d\.\d{3})\s+"
            r"(?P<paid50>[\d,]+)\s+[\d,]+\s+(?P<free50>[\d,]+)\s+[\d,]+\s+(?P<imbalance>\d+\.\d\d)"
            r"\s+(?P<goodput>\d+\.\d)\s+(?P<decision>\d+\.\d{3})\s+\d+\.\d{3}\s*$",
            report,
            re.M,
        )
    }
    assert set(rows) == set(POLICIES), report
    for row in rows.values():
        assert 0 < float(row["hit"]) <= float(row["oracle"]), report
        assert float(row["goodput"]) > 0, report
    # Placing by the prefix wins blocks that spreading the load loses.
    assert float(rows["ours"]["hit"]) > float(rows["round_robin"]["hit"]), report
