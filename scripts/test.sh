#!/usr/bin/env bash
# The test command: set up (CPU torch without a GPU), then run the whole suite.
# Kernels run through the Triton interpreter on CPU and compiled on a GPU.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup.sh" test
cd "$root"
exec "${FUSEKIT_VENV:-$root/.venv}/bin/python" -m pytest tests -q "$@"
