#!/usr/bin/env bash
# The main job: set up, then run the cross-domain benchmark suite (`--quick` for the small form).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup.sh" bench
cd "$root"
exec "${FUSEKIT_VENV:-$root/.venv}/bin/python" -m benchmarks "$@"
