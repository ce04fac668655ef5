"""A tiny run of `benchmarks/router_race.py` against the suite's real workers, so that the
race keeps working: a peer router, `/v1` and the conversation API each play the trace, and
the table is read back."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from inference.tests.fixtures import RealWorker

from .support import ROOT, run_benchmark

pytestmark = pytest.mark.e2e


def test_the_race_plays_the_trace_through_every_kind_of_side(
    real_workers: list[RealWorker], tmp_path: Path
) -> None:
    if not (ROOT / ".venv-routers" / "bin" / "vllm-router").exists():
        pytest.fail("the peer routers are missing (make routers-venv)")
    done = run_benchmark(
        "router_race.py",
        [
            *("--workers", ",".join(w.url for w in real_workers)),
            *("--sides", "sglang-router:round_robin,v1:predicted_ttft,conversations:affinity"),
            *("--conversations", "2", "--turns", "2", "--prompts", "1", "--system-tokens", "140"),
            *("--max-tokens", "4", "--think", "0", "--rate", "20", "--results", str(tmp_path)),
            "--stages",
        ],
        database_suffix="_race_smoke_bench",
        redis_db=12,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = next(tmp_path.glob("router_race-*.txt")).read_text()
    for side in ("sglang-router:round_robin", "v1:predicted_ttft", "conversations:affinity"):
        row = re.search(
            rf"^{re.escape(side)}\s+(?P<hit>\d\.\d{{3}})\s+(?P<usage>\d\.\d{{3}})\s+"
            r"(?P<oracle>\d\.\d{3})\s+\S+\s+"
            r"(?P<ttft>[\d,]+)\s+[\d,]+\s+(?P<tps>[\d.]+)\s+(?P<goodput>[\d.]+)\s+\d+\s+"
            r"(?P<spread>\d+ / \d+)\s+"
            r"(?P<errors>\d+)\s+(?P<vllm_ttft>[\d,]+) / [\d,]+ / [\d,]+\s+\d+\s+"
            r"(?P<routing_cpu>\d+\.\d) / (?P<stores_cpu>\d+\.\d)\s*$",
            report,
            re.M,
        )
        assert row is not None, report
        assert row["errors"] == "0", report
        assert int(row["ttft"].replace(",", "")) > 0, report
        assert int(row["vllm_ttft"].replace(",", "")) > 0, report
        # The service's edge and scheduler worked while the side played (tens of ms of CPU
        # per answer; the peer router's few ms may round to 0.0).
        if not side.startswith("sglang-router"):
            assert float(row["routing_cpu"]) > 0, report
        # Every turn reached a worker, and the second turn of each found its first cached,
        # by vLLM's counters and by the answers' usage.
        assert sum(int(n) for n in row["spread"].split(" / ")) == 4, report
        assert float(row["hit"]) > 0 and float(row["usage"]) > 0, report
        # No placement beats one unlimited cache.
        assert float(row["usage"]) <= float(row["oracle"]), report
    # Where the service's first-token time went: a row for each service side, over its 4
    # answers. How many of them were traced depends on the machine's speed (a 4-token answer
    # may be over, its job gone, when its first text arrives), so it is not asserted here;
    # latency_smoke checks the stages of answers long enough to be traced.
    stage = r"(?:-?[\d,]+ / -?[\d,]+|-)"
    for side in ("v1:predicted_ttft", "conversations:affinity"):
        row = re.search(
            rf"^{re.escape(side)}\s+(?P<traced>\d+)/(?P<ok>\d+)" + rf"\s+{stage}" * 6 + r"\s*$",
            report.split("where the service's first-token time went", 1)[1],
            re.M,
        )
        assert row is not None, report
        assert row["ok"] == "4", report
        assert int(row["traced"]) <= 4, report


def test_the_race_runs_on_an_emulated_fleet_with_kv_events(tmp_path: Path) -> None:
    """`--emulated N` starts its own fleet of emulated workers (no real ones needed), a
    `+events` side has the scheduler follow their KV events end to end, its index is compared
    with the workers' true caches, `--load` sets the pace from the fleet's capacity, and
    `--paid` mixes pro and free users (the router told each tier's priority)."""
    if not (ROOT / ".venv-routers" / "bin" / "vllm-router").exists():
        pytest.fail("the peer routers are missing (make routers-venv)")
    done = run_benchmark(
        "router_race.py",
        [
            *("--emulated", "2", "--profile", "h100-8b", "--max-num-seqs", "4"),
            *("--sides", "vllm-router:round_robin,v1:predicted_ttft+events"),
            *("--conversations", "3", "--turns", "2", "--prompts", "1", "--system-tokens", "140"),
            *("--max-tokens", "6", "--think", "0", "--load", "0.5", "--results", str(tmp_path)),
            *("--paid", "0.4"),
        ],
        database_suffix="_race_emulated_smoke_bench",
        redis_db=12,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = next(tmp_path.glob("router_race-*.txt")).read_text()
    assert "emulated workers (benchmarks/emulator), profile h100-8b" in report, report
    for side in ("vllm-router:round_robin", "v1:predicted_ttft+events"):
        row = re.search(
            rf"^{re.escape(side)}\s+(?P<hit>\d\.\d{{3}})\s+(?P<usage>\d\.\d{{3}})\s+"
            r"\S+\s+\S+\s+[\d,]+\s+[\d,]+\s+[\d.]+\s+(?P<goodput>[\d.]+)\s+\d+\s+"
            r"(?P<spread>\d+ / \d+)\s+(?P<errors>\d+)\s+.*"
            r"(?P<routing_cpu>\d+\.\d) / \d+\.\d / (?P<emulator_cpu>\d+\.\d)\s*$",
            report,
            re.M,
        )
        assert row is not None, report
        assert row["errors"] == "0", report
        assert sum(int(n) for n in row["spread"].split(" / ")) == 6, report
        # Each conversation's second turn finds its first one's blocks (block size 16).
        assert float(row["usage"]) > 0, report
        assert float(row["goodput"]) > 0, report
    # The pace: half of what two workers of four answers at once serve of this trace.
    capacity = re.search(r"^loads: x capacity, (?P<answers>[\d.]+) answers/s", report, re.M)
    assert capacity is not None and float(capacity["answers"]) > 0, report
    assert re.search(r"^== load 0\.5x capacity: [\d.]+ new conversations/s", report, re.M), report
    # The index that followed the events names what the caches hold (the bar: 99%).
    index = re.search(
        r"^v1:predicted_ttft\+events: (?P<agreement>\d\.\d{3}) \((?P<both>[\d,]+) of", report, re.M
    )
    assert index is not None, report
    assert float(index["agreement"]) >= 0.99 and int(index["both"].replace(",", "")) > 0, report
    # The fleet simulator's prediction for the same trace and profile, beside the live side.
    predicted = re.search(
        r"^v1:predicted_ttft\+events\s+ours\s+(?P<live>\d\.\d{3}) / (?P<sim>\d\.\d{3})\s+"
        r"[+-]\d\.\d{3}\s+(?P<live_p50>[\d,]+) / (?P<sim_p50>[\d,]+)\s",
        report.split("what benchmarks/fleet_sim.py predicted")[1],
        re.M,
    )
    assert predicted is not None, report
    # The second turn of each conversation finds its first in the simulated caches too.
    assert float(predicted["sim"]) > 0 and int(predicted["sim_p50"].replace(",", "")) > 0, report
    # Pro and free conversations, each answered, per side (seed 15 draws one pro, two free).
    tiers = report.split("per tier (40% of the conversations by pro users")[1]
    for side in ("vllm-router:round_robin", "v1:predicted_ttft+events"):
        row = re.search(
            rf"^{re.escape(side)}\s+[\d,]+ / [\d,]+ \((?P<pro>\d+) ok, 0 errors\)\s+"
            r"[\d,]+ / [\d,]+ \((?P<free>\d+) ok, 0 errors\)\s*$",
            tiers,
            re.M,
        )
        assert row is not None, report
        assert int(row["pro"]) > 0 and int(row["free"]) > 0, report
        assert int(row["pro"]) + int(row["free"]) == 6, report
