#!/usr/bin/env bash
# On the GPU machine, from the repo root, with .carry/vllm (../shared/tools/vllm_gpu_bundle.sh)
# and kbit_vllm/lib carried:  bash benchmarks/vllm_gpu_run.sh tiny_kbit4 tiny_deq4 ...
# Unpacks vLLM into /tmp/site, registers this checkout as the kbit_vllm distribution (so vLLM's
# vllm.general_plugins lookup finds kbit_vllm:register) and runs benchmarks/vllm_gpu_e2e.py.
# Qwen3-30B-A3B shapes (12 of 48 layers unless KBIT_E2E_Q3MOE_LAYERS says otherwise), one call:
#   bash benchmarks/vllm_gpu_run.sh q3moe_bf16 q3moe_kbit4 q3moe_awq_orin q3moe_awq
# Two GPUs (the nvidia-h200-x2 machine), every engine at tensor_parallel_size=2, greedy agreement
# printed as AGREE lines:  KBIT_E2E_TP=2 bash benchmarks/vllm_gpu_run.sh tiny_kbit4 tiny_deq4 ...
# The bundle (~54 MB) and the compressed library (~13 MB) with the repo exceed one call's 64 MiB
# carry: carry the library in one call (unpacked into kbit_vllm/lib, it stays while the machine is
# warm), then .carry/vllm in the next, within the machine's idle release (30 s).
set -euo pipefail
[ -d /tmp/site/vllm ] || { mkdir -p /tmp/site && cat .carry/vllm/vllm-*.tar.xz.* | tar -xJf - -C /tmp/site; }
d=/tmp/site/kbit_vllm-0.1.0.dist-info
mkdir -p "$d"
printf 'Metadata-Version: 2.1\nName: kbit_vllm\nVersion: 0.1.0\n' > "$d/METADATA"
printf '[vllm.general_plugins]\nkbit = kbit_vllm:register\n' > "$d/entry_points.txt"
export PYTHONPATH="$PWD:/tmp/site" TVM_FFI_DISABLE_TORCH_C_DLPACK=1 VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1
df -h /tmp | tail -1
python3 benchmarks/vllm_gpu_e2e.py "$@"
