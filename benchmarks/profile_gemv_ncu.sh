export PYTHONPATH=. PYTHONUNBUFFERED=1
S="--section SpeedOfLight --section WarpStateStats --section LaunchStats --section Occupancy --section SchedulerStats --section MemoryWorkloadAnalysis"
for cfg in "4096 28672 4 gemv" "4096 28672 4 gemv_cluster" "4096 28672 2 gemv" "14336 4096 4 gemv_cluster"; do
  set -- $cfg
  echo "=== in=$1 out=$2 k=$3 path=$4"
  timeout 120 ncu $S -k regex:"gemv" --launch-skip 1 --launch-count 1 python3 benchmarks/profile_kernel.py --in $1 --out $2 --k $3 --path $4 2>&1 | grep -v "^==PROF==" | grep -E "Duration|Throughput|Issue|Active|Stall|Warp Cycles|Registers|Occupancy|Eligible|No Eligible|Bank|L1|L2|DRAM|Mem Pipes|One or More|Block Limit|Issued" | head -45
done
