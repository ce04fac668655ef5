"""Unit tests for the worker commands: vLLM argv building and prepare_model's errors.

None of these touch the database, vLLM or the worker venv.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from inference.management.commands.run_worker import build_worker_argv, build_worker_env


def flag_value(argv: list[str], flag: str) -> str:
    """The value after ``flag`` in ``argv``."""
    return argv[argv.index(flag) + 1]


def test_cpu_argv_uses_eager_mode_and_always_on_features() -> None:
    argv = build_worker_argv(python="/venv/bin/python", model="/models/m", port=8101, device="cpu")

    assert argv[:3] == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    assert flag_value(argv, "--model") == "/models/m"
    assert flag_value(argv, "--port") == "8101"
    assert flag_value(argv, "--host") == "127.0.0.1"
    assert flag_value(argv, "--served-model-name") == "smollm2-135m"
    assert flag_value(argv, "--scheduling-policy") == "priority"
    assert flag_value(argv, "--max-model-len") == "8192"
    assert "--enable-prefix-caching" in argv
    assert "--enable-log-requests" in argv
    assert "--enforce-eager" in argv
    assert "--kv-cache-memory-bytes" not in argv
    assert "--max-num-seqs" not in argv


def test_gpu_argv_keeps_cuda_graphs_and_always_on_features() -> None:
    argv = build_worker_argv(
        python="python",
        model="m",
        port=9000,
        device="gpu",
        host="0.0.0.0",  # noqa: S104
        served_model_name="big",
        max_num_seqs=64,
        kv_cache_gib=2,
    )

    assert "--enforce-eager" not in argv
    assert "--enable-prefix-caching" in argv
    assert flag_value(argv, "--scheduling-policy") == "priority"
    assert flag_value(argv, "--served-model-name") == "big"
    assert flag_value(argv, "--host") == "0.0.0.0"  # noqa: S104
    assert flag_value(argv, "--max-num-seqs") == "64"
    assert flag_value(argv, "--kv-cache-memory-bytes") == str(2 * 2**30)


def test_gpu_argv_leaves_kv_cache_to_vllm_by_default() -> None:
    argv = build_worker_argv(python="python", model="m", port=9000, device="gpu")

    assert "--kv-cache-memory-bytes" not in argv


def test_extra_arguments_come_last_and_unchanged() -> None:
    extra = ["--max-model-len", "4096", "--seed", "1"]
    argv = build_worker_argv(
        python="python", model="m", port=1, device="cpu", max_model_len=None, extra=extra
    )

    assert argv[-4:] == extra
    assert argv.count("--max-model-len") == 1


def test_cpu_env_sets_kv_cache_space_and_offline_mode() -> None:
    env = build_worker_env(device="cpu", kv_cache_gib=None, base={"PATH": "/bin"})

    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert env["HF_HUB_OFFLINE"] == "1"
    assert env["PATH"] == "/bin"
    assert build_worker_env(device="cpu", kv_cache_gib=3, base={})["VLLM_CPU_KVCACHE_SPACE"] == "3"


def test_gpu_env_has_no_cpu_kv_cache_variable() -> None:
    env = build_worker_env(device="gpu", kv_cache_gib=2, base={})

    assert "VLLM_CPU_KVCACHE_SPACE" not in env
    assert env["HF_HUB_OFFLINE"] == "1"


def test_prepare_model_explains_missing_worker_venv(settings, tmp_path: Path) -> None:
    settings.WORKER_PYTHON = str(tmp_path / "no-venv" / "bin" / "python")
    # An empty data dir, so an already prepared model elsewhere cannot short-circuit the check.
    settings.DATA_DIR = tmp_path / "data"

    with pytest.raises(CommandError, match="make worker-venv"):
        call_command("prepare_model")


def test_run_worker_explains_missing_worker_venv(settings, tmp_path: Path) -> None:
    settings.WORKER_PYTHON = str(tmp_path / "no-venv" / "bin" / "python")

    with pytest.raises(CommandError, match="make worker-venv"):
        call_command("run_worker", "--port", "8101", "--device", "cpu")


def test_workers_can_be_bound_to_their_own_cores() -> None:
    env = build_worker_env(device="cpu", kv_cache_gib=None, base={}, cpus="1")
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "1"
    assert "VLLM_CPU_OMP_THREADS_BIND" not in build_worker_env(
        device="cpu", kv_cache_gib=None, base={}
    )
    assert "VLLM_CPU_OMP_THREADS_BIND" not in build_worker_env(
        device="gpu", kv_cache_gib=None, base={}, cpus="1"
    )


def test_kv_cache_events_are_published_on_the_port_asked_for() -> None:
    argv = build_worker_argv(python="python", model="m", port=1, device="gpu", kv_events_port=5557)
    config = json.loads(argv[argv.index("--kv-events-config") + 1])
    assert config == {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": "tcp://*:5557",
        "replay_endpoint": "tcp://*:5558",
    }
    assert "--kv-events-config" not in build_worker_argv(
        python="python", model="m", port=1, device="gpu"
    )
