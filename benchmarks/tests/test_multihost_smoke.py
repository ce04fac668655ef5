"""A tiny run of `benchmarks/multihost.py` on stand-in workers, so that the multi-host
benchmark keeps working: the service spread over network namespaces, an edge host, a
scheduler host and a worker host killed in turn under load; every phase's answers complete,
none is stuck or lost, and no namespace, link or process of the run is left behind.

It needs root and iproute2 (`ip netns add`): without them it is skipped, or fails where
CHATSITE_E2E_REQUIRED is set (CI)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

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
    "errors",
)
PHASES = ("none", "edge", "scheduler", "worker")


def require_network_namespaces() -> None:
    """Skip (fail under CHATSITE_E2E_REQUIRED) unless this process may make a namespace."""
    probe = f"mhprobe{os.getpid()}"
    try:
        done = subprocess.run(  # noqa: S603 (fixed argv)
            ["ip", "netns", "add", probe],  # noqa: S607 (iproute2 from PATH)
            capture_output=True,
            text=True,
            check=False,
        )
    except FileNotFoundError:
        reason = "`ip` (iproute2) is not installed"
    else:
        if done.returncode == 0:
            subprocess.run(["ip", "netns", "del", probe], check=True)  # noqa: S603, S607 (fixed argv)
            return
        reason = f"`ip netns add` failed: {done.stderr.strip()}"
    message = f"the multihost benchmark needs root and network namespaces: {reason}"
    if os.environ.get("CHATSITE_E2E_REQUIRED"):
        pytest.fail(message)
    pytest.skip(message)


def namespaces() -> list[str]:
    listed = subprocess.run(
        ["ip", "netns", "list"],  # noqa: S607 (iproute2 from PATH)
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [line.split()[0] for line in listed.splitlines() if line.strip()]


def test_the_multihost_benchmark_survives_a_host_of_each_kind(tmp_path: Path) -> None:
    require_network_namespaces()
    done = run_benchmark(
        "multihost.py",
        [
            *("--workers", "fake", "--phases", ",".join(PHASES)),
            *("--clients", "2", "--v1-clients", "1", "--lead", "2", "--after", "3"),
            *("--deadline", "60", "--fake-tokens", "20", "--results", str(tmp_path)),
        ],
        database_suffix="_multihost_smoke_bench",
        redis_db=12,
    )
    output = done.stdout[-3000:] + done.stderr[-3000:]
    started = re.search(r"^network (mh\w+) on \S+; stack in (\S+)$", done.stdout, re.M)
    assert started is not None, output
    prefix, folder = started[1], started[2]
    # Nothing of the run is left, whatever else happened.
    assert [name for name in namespaces() if name.startswith(f"{prefix}-")] == [], output
    assert leftovers(folder) == [], output
    assert done.returncode == 0, output

    report = next(tmp_path.glob("multihost-*.txt")).read_text()
    assert "left behind: no namespace, no link" in report, report
    header = re.search(r"^phase\s+door\s+(.+)$", report, re.M)
    assert header is not None, report
    assert re.split(r"\s{2,}", header[1].strip()) == list(COLUMNS), report
    rows = {
        match["phase"]: dict(zip(COLUMNS, map(int, match["numbers"].split()), strict=True))
        for match in re.finditer(
            rf"^(?P<phase>{'|'.join(PHASES)})\s+all\s+(?P<numbers>(?:\d+\s+){{10}}\d+)\s*$",
            report,
            re.M,
        )
    }
    assert set(rows) == set(PHASES), report
    for phase, total in rows.items():
        assert total["completed"] > 0, (phase, report)
        assert total["stuck"] == 0 and total["lost"] == 0, (phase, report)
        assert total["charged twice"] == 0, (phase, report)
        assert total["completed"] + total["failed"] == total["answers"], (phase, report)
    for host in ("edge1", "sched1", "worker1"):
        assert re.search(
            rf"^  \w+\s+{host} down: kill -9 .* at \+[\d.]+ s; \w+ back in ", report, re.M
        ), report

    saved = json.loads(next(tmp_path.glob("multihost-*.json")).read_text())
    assert [p["phase"] for p in saved["phases"]] == list(PHASES)
    for phase in saved["phases"]:
        assert phase["rows"]["all"] == rows[phase["phase"]]
