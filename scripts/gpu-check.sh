#!/usr/bin/env bash
# Every GPU check of refplan in one command, for a machine with NVIDIA GPUs.
#
# Why a script: `make test` pins the CPU build of torch==2.13.0 (installed from local disk), so
# the CUDA and NCCL checks can never run in the project's own environment. This script builds
# its own venv (.venv-gpu) with a CUDA build of the *same* torch version, then runs:
#   1. tests/test_execute_gpu.py (CUDA local copies of every dtype, a one-process NCCL group and
#      a "cpu:gloo,cuda:nccl" group, CUDA buffers on gloo and mixed device types refused
#      collectively, and with 2+ GPUs the two-process NCCL transfer), showing every skip reason;
#   2. `refplan sync --backend nccl` under its own launcher (2+ GPUs) and under torchrun, one
#      process per GPU (1 GPU: a one-process job).
# With one GPU every check runs except the two-process NCCL ones, which skip with their reason.
#
# Where the CUDA wheel comes from, first that works:
#   TORCH_CUDA_WHEEL=/path/to/torch-2.13.0+cuXXX-....whl   a local wheel (offline machines)
#   TORCH_CUDA_INDEX=https://download.pytorch.org/whl/cuXXX  one index
#   pip's configured index (PyPI's Linux torch wheels are CUDA builds), then the pytorch.org
#   cu130, cu128 and cu126 indexes.
# The result must report torch.version.cuda and see a GPU, or the script stops.
#
# Usage: scripts/gpu-check.sh [--dry-run]     (--dry-run prints each step without running it)
set -euo pipefail

cd "$(dirname "$0")/.."
VENV=${GPU_VENV:-.venv-gpu}
PY="$VENV/bin/python"
TORCH_PIN="torch==2.13.0"
PYTORCH_INDEXES=${PYTORCH_INDEXES:-"https://download.pytorch.org/whl/cu130 https://download.pytorch.org/whl/cu128 https://download.pytorch.org/whl/cu126"}
DRY=0
if [[ "${1:-}" == "--dry-run" ]]; then DRY=1; fi

step() { echo "+ $*"; if (( DRY == 0 )); then "$@"; fi; }
say() { echo "gpu-check: $*"; }
is_cuda_build() {
    (( DRY == 1 )) && { echo "+ $PY -c 'import torch; assert torch.version.cuda'"; return 0; }
    "$PY" -c 'import torch, sys; sys.exit(0 if torch.version.cuda and torch.__version__.startswith("2.13.0") else 1)'
}

if (( DRY == 0 )); then
    command -v nvidia-smi >/dev/null && nvidia-smi -L || { say "no NVIDIA GPU visible (nvidia-smi -L failed)"; exit 2; }
fi

step python3 -m venv "$VENV"
step "$PY" -m pip install -q --upgrade pip

installed=0
if [[ -n "${TORCH_CUDA_WHEEL:-}" ]]; then
    step "$PY" -m pip install -q "$TORCH_CUDA_WHEEL" && is_cuda_build && installed=1
fi
if (( installed == 0 )) && [[ -n "${TORCH_CUDA_INDEX:-}" ]]; then
    step "$PY" -m pip install -q "$TORCH_PIN" --index-url "$TORCH_CUDA_INDEX" && is_cuda_build && installed=1
fi
if (( installed == 0 )); then
    { step "$PY" -m pip install -q "$TORCH_PIN" && is_cuda_build && installed=1; } || true
fi
if (( installed == 0 )); then
    for index in $PYTORCH_INDEXES; do
        if step "$PY" -m pip install -q --force-reinstall --no-deps "$TORCH_PIN" --index-url "$index" && is_cuda_build; then
            installed=1
            break
        fi
    done
fi
if (( installed == 0 )); then
    say "could not install a CUDA build of $TORCH_PIN (set TORCH_CUDA_WHEEL or TORCH_CUDA_INDEX)"
    exit 2
fi
# The project and its test tools; the pin keeps the CUDA build (2.13.0+cuXXX satisfies ==2.13.0).
step "$PY" -m pip install -q -e '.[test]' "$TORCH_PIN"
step "$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count()); assert torch.version.cuda and torch.cuda.is_available()'

GPUS=${GPU_CHECK_GPUS:-}
if [[ -z "$GPUS" ]]; then GPUS=$("$PY" -c 'import torch; print(torch.cuda.device_count())'); fi
say "$GPUS GPU(s)"

failed=0
step "$PY" -m pytest -p no:cacheprovider -q -rs tests/test_execute_gpu.py || failed=1
if (( GPUS >= 2 )); then
    step "$VENV/bin/refplan" sync --backend nccl --nproc "$GPUS" --model demo --timeout 120 || failed=1
else
    say "refplan sync --backend nccl with its own launcher needs 2 GPUs, $GPUS here: skipped"
fi
step "$VENV/bin/torchrun" --standalone --nproc_per_node "$GPUS" --no-python "$VENV/bin/refplan" sync \
    --backend nccl --model demo --timeout 120 || failed=1

if (( failed )); then say "FAILED (see above)"; exit 1; fi
say "every GPU check passed"
