"""`benchmarks/gpu_race.py` without a GPU: it says what the machine lacks before starting
anything, its workers are started as the project starts a GPU worker, sharing the card, and
its tap on a worker's KV events reports the kinds, the fields and what the scheduler's decoder
read (fed here with batches in vLLM's wire format, as the emulator sends them)."""

from __future__ import annotations

import sys
from pathlib import Path

import msgspec
import pytest
from django.test import override_settings

from benchmarks import gpu_race
from benchmarks.emulator.events import encode
from inference.management.commands import run_worker


def test_without_a_gpu_it_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(run_worker, "detect_device", lambda: "cpu")
    assert gpu_race.missing() == "no GPU here: `nvidia-smi -L` lists none"


def test_without_vllms_gpu_build_it_says_so(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(run_worker, "detect_device", lambda: "gpu")
    with override_settings(WORKER_PYTHON=str(tmp_path / "python")):
        assert "no worker environment" in (gpu_race.missing() or "")
    # The suite's own interpreter has neither torch nor vLLM.
    with override_settings(WORKER_PYTHON=sys.executable):
        assert "has no vLLM GPU build" in (gpu_race.missing() or "")


def test_the_workers_share_the_gpu_with_their_kv_events_on() -> None:
    args = gpu_race.parse_args(["--workers", "4", "--kv-cache-gib", "0.25"])
    argv = gpu_race.worker_command(args, 8301, 5601)
    assert argv[1:3] == ["manage.py", "run_worker"]
    flags = dict(zip(argv[3::2], argv[4::2], strict=False))
    assert flags["--device"] == "gpu"
    assert (flags["--port"], flags["--kv-events-port"]) == ("8301", "5601")
    assert flags["--kv-cache-gib"] == "0.25"
    # Four workers split the 0.8 of the card's memory they may take.
    assert argv[-3:] == ["--extra", "--gpu-memory-utilization", "0.200"]


def test_the_event_tap_reports_kinds_fields_and_what_the_decoder_read() -> None:
    tap = gpu_race.EventTap("tcp://127.0.0.1:1")
    tap.take(encode([("stored", [11, 12], None, list(range(32)))], 16))
    tap.take(encode([("removed", [11]), ("cleared",)], 16))
    tap.take(msgspec.msgpack.encode([1.0, [{"type": "BlockStored", "block_hashes": "x"}]]))
    assert tap.batches == 3 and tap.decoded == 2
    assert tap.kinds == {"BlockStored": 2, "BlockRemoved": 1, "AllBlocksCleared": 1}
    assert "block_hashes" in tap.fields["BlockStored"]
    assert "token_ids" in tap.fields["BlockStored"]
    report = tap.report()
    assert "3 batches, 2 read by the scheduler's decoder" in report
    assert "not read:" in report
