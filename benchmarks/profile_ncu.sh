#!/usr/bin/env bash
# Nsight Compute summary of kbit_linear kernel paths (GPU machine, repo root, library carried):
#   bash benchmarks/profile_ncu.sh "4096 28672 4 gemv 1" "4096 28672 4 mma 64" ...
# Each argument is "in out k path m"; the kernel is matched by the path's family name (gemv,
# mma, dequant). Prints throughput, issue, stall and occupancy lines per config.
export PYTHONPATH=${PYTHONPATH:-.} PYTHONUNBUFFERED=1
S="--section SpeedOfLight --section WarpStateStats --section LaunchStats --section Occupancy --section SchedulerStats --section MemoryWorkloadAnalysis --section InstructionStats --section ComputeWorkloadAnalysis"
[ $# -gt 0 ] || set -- "4096 28672 4 gemv 1" "14336 4096 4 gemv_cluster 1"
for cfg in "$@"; do
  read -r in_f out_f k path m <<< "$cfg"
  family=${path%%_*}
  echo "=== in=$in_f out=$out_f k=$k path=$path m=${m:-1}"
  timeout 120 ncu $S -k regex:"$family" --launch-skip 1 --launch-count 1 python3 benchmarks/profile_kernel.py \
      --in "$in_f" --out "$out_f" --k "$k" --path "$path" --m "${m:-1}" 2>&1 | grep -v "^==PROF==" \
    | grep -E "Duration|Throughput|Issue|Active|Stall|Warp Cycles|Registers|Occupancy|Eligible|No Eligible|Bank|L1|L2|DRAM|Mem Pipes|One or More|Block Limit|Issued|Executed Ipc|Pipe|Shared" | head -60
done
