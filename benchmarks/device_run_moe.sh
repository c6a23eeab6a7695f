#!/usr/bin/env bash
# On the GPU machine, from the repo root, with kbit_vllm/lib carried prebuilt (builds nothing):
#   PYTHONPATH=. bash benchmarks/device_run_moe.sh [bench_moe args...]
# Runs the grouped (MoE) kernel tests, the dense CUDA tests (the grouped kernels share code with
# them), then the MoE benchmark. Logs and JSON go to $OUT (or ./device_out); the timeouts keep the
# whole run under 4 minutes (the first H200 run took ~35 s).
set -o pipefail
OUT=${OUT:-device_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:-.}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
python3 -c "from kbit_vllm.backends.cuda import library; print(library.STATUS)" | tee -a "$OUT/gpu.txt"
timeout 70 python3 -m pytest -q -rs --durations=5 tests/test_cuda_moe.py 2>&1 | tail -60 | tee "$OUT/tests_moe.log"
timeout 50 python3 -m pytest -q -x tests/test_cuda_awq.py tests/test_cuda_kbit.py 2>&1 | tail -30 | tee "$OUT/tests_dense.log"
timeout 110 python3 benchmarks/bench_moe.py --json "$OUT/bench_moe.json" "$@" 2>&1 | tee "$OUT/bench_moe.log"
