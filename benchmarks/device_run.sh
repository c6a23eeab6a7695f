#!/usr/bin/env bash
# The one GPU-machine script: checks and times the carried library (builds nothing).
# On the GPU machine, from the repo root, with kbit_vllm/lib carried prebuilt:
#   STEPS="tests fuzz sanitize bench_kbit bench_awq bench_moe bench_moe_layer bench_moe_experts ncu" bash benchmarks/device_run.sh
# Steps (default "tests bench_kbit"), each with its own time limit, logs under $OUT (./device_out):
#   tests       every GPU test module (CUDA kernels, HF on CUDA, MoE compute, fuzz short mode), or $TESTS
#   fuzz        scripts/fuzz_long.py for FUZZ_SECONDS (default 90)
#   sanitize    scripts/sanitize.sh (SANITIZE_TOOLS, SANITIZE_FAMILIES, SANITIZE_FILTER pass through)
#   bench_kbit  benchmarks/bench_kbit.py $BENCH_KBIT_ARGS     bench_awq  benchmarks/bench_awq.py $BENCH_AWQ_ARGS
#   bench_moe   benchmarks/bench_moe.py $BENCH_MOE_ARGS
#   bench_moe_layer  benchmarks/bench_moe_layer.py $BENCH_MOE_LAYER_ARGS (whole Qwen3-MoE layers, with variants)
#   bench_moe_experts  benchmarks/bench_moe_experts.py $BENCH_MOE_EXPERTS_ARGS (kbit_moe_experts: one kernel / five ops / fp16)
#   bench_floor benchmarks/bench_floor.py $BENCH_FLOOR_ARGS (the read of each layer's weights against the targets)
#   exp_rows    benchmarks/exp_wgmma_rows.py $EXP_ROWS_ARGS (issue 3: the wgmma kernel at each row tile past 64 rows)
#   ncu         benchmarks/profile_ncu.sh over NCU_CONFIGS ("in out k path m;in out k path m")
#   ab          benchmarks/ab_libs.py $AB_ARGS: library builds A/B, e.g. AB_ARGS="--libs base=/tmp/a.so,new=/tmp/b.so
#               --shapes 4096x28672 --ks 4 --ms 16,32 --paths wgmma" (each library in its own process, interleaved)
set -o pipefail
OUT=${OUT:-device_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:-.}
STEPS=${STEPS:-tests bench_kbit}
TESTS=${TESTS:-tests/test_cuda_kbit.py tests/test_cuda_awq.py tests/test_cuda_moe.py tests/test_cuda_moe_glue.py
  tests/test_cuda_moe_experts.py tests/test_cuda_pdl.py
  tests/test_moe_compute.py tests/test_hf_kbit.py tests/test_hf_awq.py tests/test_hf_moe.py tests/test_hf_awq_moe.py
  tests/test_fuzz.py tests/test_cuda_gemv_rows.py tests/test_cuda_stream_read.py}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
python3 -c "from kbit_vllm.backends.cuda import library; print(library.STATUS)" | tee -a "$OUT/gpu.txt"
git rev-parse --short HEAD 2>/dev/null | sed 's/^/commit: /' | tee -a "$OUT/gpu.txt"
for step in $STEPS; do
  start=$(date +%s)
  case $step in
    tests) timeout 240 python3 -m pytest -q -rs --durations=8 $TESTS 2>&1 | tail -60 > "$OUT/tests.log" ;;
    fuzz) timeout $(( ${FUZZ_SECONDS:-90} + 60 )) python3 scripts/fuzz_long.py --seconds "${FUZZ_SECONDS:-90}" \
             --out "$OUT/fuzz" > "$OUT/fuzz.log" 2>&1 ;;
    sanitize) OUT="$OUT/sanitize" timeout 420 bash scripts/sanitize.sh > "$OUT/sanitize.log" 2>&1; rc=$?
              # one archive of the per-family logs (the device returns a limited number of files)
              tar czf "$OUT/sanitize_logs.tgz" -C "$OUT" sanitize && rm -f "$OUT"/sanitize/sanitize_*.log; (exit $rc) ;;
    bench_kbit) timeout 330 python3 benchmarks/bench_kbit.py --json "$OUT/bench_kbit.json" $BENCH_KBIT_ARGS \
             > "$OUT/bench_kbit.log" 2>&1 ;;
    bench_awq) timeout 200 python3 benchmarks/bench_awq.py --json "$OUT/bench_awq.json" $BENCH_AWQ_ARGS \
             > "$OUT/bench_awq.log" 2>&1 ;;
    bench_moe) timeout 200 python3 benchmarks/bench_moe.py --json "$OUT/bench_moe.json" $BENCH_MOE_ARGS \
             > "$OUT/bench_moe.log" 2>&1 ;;
    bench_moe_layer) timeout 200 python3 benchmarks/bench_moe_layer.py $BENCH_MOE_LAYER_ARGS \
             > "$OUT/bench_moe_layer.log" 2>&1 ;;
    bench_moe_experts) timeout 200 python3 benchmarks/bench_moe_experts.py $BENCH_MOE_EXPERTS_ARGS \
             > "$OUT/bench_moe_experts.log" 2>&1 ;;
    bench_floor) timeout 300 python3 benchmarks/bench_floor.py --json "$OUT/bench_floor.json" $BENCH_FLOOR_ARGS \
             > "$OUT/bench_floor.log" 2>&1 ;;
    exp_rows) timeout 300 python3 benchmarks/exp_wgmma_rows.py --json "$OUT/exp_rows.json" \
             $EXP_ROWS_ARGS > "$OUT/exp_rows.log" 2>&1 ;;
    ab) timeout 450 python3 benchmarks/ab_libs.py $AB_ARGS --json "$OUT/ab.json" > "$OUT/ab.log" 2>&1 ;;
    ncu) IFS=';' read -r -a cfgs <<< "${NCU_CONFIGS:-4096 28672 4 gemv 1}"
         timeout 300 bash benchmarks/profile_ncu.sh "${cfgs[@]}" > "$OUT/ncu.log" 2>&1 ;;
    *) echo "unknown step $step" ;;
  esac
  echo "step $step: exit $? in $(( $(date +%s) - start )) s" | tee -a "$OUT/steps.txt"
done
tail -3 "$OUT/tests.log" 2>/dev/null
