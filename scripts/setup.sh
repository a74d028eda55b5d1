#!/usr/bin/env bash
# Set up fusekit on a fresh machine: a virtual environment in .venv with torch, triton and the
# project installed editable with the extras named in $1 (default "test").
#   - with an NVIDIA GPU (nvidia-smi lists one): torch from the package index as usual;
#   - without one: torch's CPU build (FUSEKIT_TORCH, default "torch==2.13.0", the CPU wheel
#     these machines provide; elsewhere point pip at PyTorch's CPU wheel index), never the
#     several GB of CUDA packages.
# Re-running is cheap: what is installed already is kept.  Source it or run it.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
extras="${1:-test}"
venv="${FUSEKIT_VENV:-$root/.venv}"
python="${PYTHON:-python3}"

if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check)

if ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
        echo "[setup] GPU found: installing torch with CUDA"
        "${pip[@]}" "torch>=2.4"
    else
        echo "[setup] no GPU: installing torch's CPU build (${FUSEKIT_TORCH:-torch==2.13.0})"
        "${pip[@]}" "${FUSEKIT_TORCH:-torch==2.13.0}"
    fi
fi
echo "[setup] installing fusekit[$extras]"
"${pip[@]}" -e "$root[$extras]"
"$venv/bin/python" -c "import torch, triton, fusecore; print('[setup] ready:', fusecore.backend.describe())"
