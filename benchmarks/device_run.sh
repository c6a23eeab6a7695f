#!/usr/bin/env bash
# On the GPU machine, from the repo root, with kbit_vllm/lib carried prebuilt:
#   PYTHONPATH=. bash benchmarks/device_run.sh [bench args...]
# Runs the CUDA tests, then the benchmark; logs and JSON go to $OUT (or ./device_out).
set -o pipefail
OUT=${OUT:-device_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:-.}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
python3 -c "from kbit_vllm.backends.cuda import library; print(library.STATUS)" | tee -a "$OUT/gpu.txt"
timeout 240 python3 -m pytest -q -x tests/test_cuda_kbit.py 2>&1 | tail -40 | tee "$OUT/tests.log"
timeout 330 python3 benchmarks/bench_kbit.py --json "$OUT/bench_kbit.json" "$@" 2>&1 | tee "$OUT/bench.log"
