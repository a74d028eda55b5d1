#!/usr/bin/env bash
# The test command: set up (CPU torch without a GPU), then run the whole suite.
# Kernels run through the Triton interpreter on CPU and compiled on a GPU.
# The test files are spread over FUSEKIT_TEST_WORKERS processes (pytest-xdist; default: the CPU
# count, at most 8; 1 runs them in this process), each file whole in one worker (--dist loadfile:
# a module's fixtures are built once).  On a 2-core CI machine two workers took pytest from 72 to
# 44 minutes (session 29: 4327 s serial, 2638 s on a fresh clone with two workers).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup.sh" test
cd "$root"
workers="${FUSEKIT_TEST_WORKERS:-$(nproc 2>/dev/null || echo 1)}"
if [ "$workers" -gt 8 ]; then workers=8; fi
parallel=()
if [ "$workers" -gt 1 ]; then parallel=(-n "$workers" --dist loadfile); fi
exec "${FUSEKIT_VENV:-$root/.venv}/bin/python" -m pytest tests -q "${parallel[@]}" "$@"
