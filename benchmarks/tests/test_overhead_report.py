"""The overhead benchmark's report, on made-up measurements: the bars of #34 are checked
against the better peer of the run, each side is charged its own processes' CPU, and the
peers are started with their own stores, not this project's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import peers
from benchmarks.openai_api import Level, Sample
from benchmarks.overhead import Result, checks, checks_table, cpu_table, side_kinds, table


def result(side: str, n: int, *, ttft: float, tokens: int, wall: float, cpu: float) -> Result:
    level = Level(side=side, concurrency=n, wall=wall)
    level.samples = [Sample(ttft=ttft, decode_tps=20.0, tokens=tokens) for _ in range(n)]
    return Result(level=level, cpu={kind: cpu / len(side_kinds(side)) for kind in side_kinds(side)})


def level(n: int, **ours: float) -> dict[str, Result]:
    """One level: direct, the service's two sides (`ours`: v1's ttft, wall, cpu), two peers."""
    return {
        "direct": result("direct", n, ttft=0.100, tokens=48, wall=2.0, cpu=0.0),
        "v1": result("v1", n, ttft=ours["ttft"], tokens=48, wall=ours["wall"], cpu=ours["cpu"]),
        "conversations": result("conversations", n, ttft=0.2, tokens=48, wall=3.0, cpu=n * 0.040),
        "litellm": result("litellm", n, ttft=0.130, tokens=48, wall=2.4, cpu=n * 0.040),
        "openwebui": result("openwebui", n, ttft=0.125, tokens=48, wall=2.2, cpu=n * 0.030),
    }


def verdicts(levels: list[dict[str, Result]]) -> dict[str, tuple[float, float, bool]]:
    return {check.what: (check.ours, check.bar, check.met) for check in checks(levels)}


def test_each_bar_is_judged_against_the_better_peer_of_the_same_level() -> None:
    found = verdicts(
        [level(1, ttft=0.105, wall=2.0, cpu=0.025), level(8, ttft=0.140, wall=2.1, cpu=8 * 0.025)]
    )

    ours, bar, met = found["x1 v1 TTFT p50 / direct"]
    assert (round(ours, 2), bar, met) == (1.05, 1.10, True)
    # At 8 streams: Open WebUI's TTFT (1.25) is the better peer's, and v1's 1.40 misses it.
    ours, bar, met = found["x8 v1 TTFT p50 / direct vs the better peer"]
    assert (round(ours, 2), round(bar, 2), met) == (1.40, 1.25, False)
    # Throughput: the better peer delivers 2.0/2.2 of direct; v1 2.0/2.1, which is more.
    ours, bar, met = found["x8 v1 tok/s / direct vs the better peer"]
    assert (round(ours, 3), round(bar, 3), met) == (0.952, 0.909, True)
    # CPU: 25 ms per answer against Open WebUI's 30; a kept turn's 40 against 1.5 x 30.
    assert found["x8 v1 CPU ms/answer vs Open WebUI"] == pytest.approx((25.0, 30.0, True))
    ours, bar, met = found["x8 conversation turn CPU ms/answer vs 1.5x Open WebUI's"]
    assert (ours, bar, met) == pytest.approx((40.0, 45.0, True))
    assert "NOT met" in checks_table(checks([level(8, ttft=0.140, wall=2.1, cpu=0.2)]))


def test_without_peers_only_the_alone_bar_is_checked() -> None:
    levels = [
        {
            side: r
            for side, r in level(n, ttft=0.12, wall=2.0, cpu=0.1).items()
            if side not in peers.PEERS
        }
        for n in (1, 8)
    ]
    assert list(verdicts(levels)) == ["x1 v1 TTFT p50 / direct"]
    assert verdicts(levels)["x1 v1 TTFT p50 / direct"][2] is False  # 1.20 > 1.10


def test_the_tables_charge_each_side_its_own_processes() -> None:
    levels = [level(8, ttft=0.14, wall=2.1, cpu=0.8)]
    cpu = cpu_table(levels)
    header, _, *rows = cpu.splitlines()
    assert header.split()[2:4] == ["edge", "CPU"]
    by_side = {row.split()[1]: row.split()[2:] for row in rows}
    # v1's 0.8 s over 5 kinds and 8 answers: 20 ms each; a peer has its one column only.
    assert by_side["v1"] == ["20", "20", "20", "20", "20"]
    assert by_side["openwebui"] == ["30"]
    main = table(levels)
    assert "openwebui/direct" in main and "litellm/direct" in main
    assert "v1/direct" in main and "direct/direct" not in main


def test_litellm_gets_a_deployment_per_worker_and_a_master_key() -> None:
    config = json.loads(
        peers.litellm_config(["http://w1:8201", "http://w2:8202"], "smollm2-135m", "sk-x")
    )
    assert config["general_settings"] == {"master_key": "sk-x"}
    assert [m["litellm_params"] for m in config["model_list"]] == [
        {"model": "hosted_vllm/smollm2-135m", "api_base": "http://w1:8201/v1"},
        {"model": "hosted_vllm/smollm2-135m", "api_base": "http://w2:8202/v1"},
    ]
    assert {m["model_name"] for m in config["model_list"]} == {"smollm2-135m"}


def test_the_peers_never_see_this_projects_stores(tmp_path: Path) -> None:
    ours = {"DATABASE_URL": "postgres://x", "REDIS_URL": "redis://y/1", "PATH": "/bin"}
    for env in (
        peers.litellm_env(ours),
        peers.openwebui_env(ours, ["http://w1:8201", "http://w2:8202"], tmp_path, "s"),
    ):
        assert "DATABASE_URL" not in env and "REDIS_URL" not in env
        assert env["PATH"] == "/bin" and env["HF_HUB_OFFLINE"] == "1"
    webui = peers.openwebui_env(ours, ["http://w1:8201", "http://w2:8202"], tmp_path, "s")
    assert webui["OPENAI_API_BASE_URLS"] == "http://w1:8201/v1;http://w2:8202/v1"
    assert webui["OPENAI_API_KEYS"] == "none;none"
    assert webui["OFFLINE_MODE"] == "true" and webui["DATA_DIR"] == str(tmp_path)


def test_peers_are_named_or_refused_with_a_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    assert peers.parse_peers("none") == []
    with pytest.raises(ValueError, match="unknown peer"):
        peers.parse_peers("litellm,nginx")
    monkeypatch.setattr(peers, "executable", lambda name: Path("/nonexistent") / name)
    assert peers.parse_peers("auto") == []
    with pytest.raises(ValueError, match="make peers"):
        peers.parse_peers("openwebui")
