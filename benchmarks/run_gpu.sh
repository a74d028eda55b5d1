#!/usr/bin/env bash
# One full run on a GPU machine that already has torch and triton (run from the repo root):
# the test suite compiled, then the benchmark suite; everything lands in $OUT_DIR
# (default ./bench-out): tests.log, bench.log, results.jsonl and the plots packed in results.tgz.
#   bash benchmarks/run_gpu.sh [benchmark args...]      e.g. --domain gnn --domain sim
set -uo pipefail
out="${OUT_DIR:-bench-out}"
mkdir -p "$out/bench"
export PYTHONUNBUFFERED=1 PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$out/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$out/gpu.txt"
if [ -z "${SKIP_TESTS:-}" ]; then
    timeout "${TEST_TIMEOUT:-900}" python3 -m pytest tests -q -p no:cacheprovider ${TEST_ARGS:-} 2>&1 | tee "$out/tests.log"
fi
timeout "${BENCH_TIMEOUT:-1500}" python3 -m benchmarks --out "$out/bench" "$@" 2>&1 | tee "$out/bench.log"
status=$?
tar -czf "$out/results.tgz" -C "$out" bench
exit $status
