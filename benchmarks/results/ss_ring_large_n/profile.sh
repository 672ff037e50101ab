#!/usr/bin/env bash
# Nsight Compute on the ring forward at N 128 and N 16 (float32 8x1536x2048): speed of light,
# warp states, pipes, and (N 128) stall samples by source line. Run from the project root:
#   benchmarks/results/ss_ring_large_n/profile.sh OUT_DIR
set -u
O=${1:?usage: profile.sh OUT_DIR}; mkdir -p "$O"
SEC="--section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section InstructionStats"
for n in 128 16; do
  timeout 120 ncu --clock-control none -k regex:ssm_scan_fwd_ring --launch-skip 2 --launch-count 1 $SEC \
      python3 benchmarks/profile_selective_scan.py float32 8 1536 2048 $n fwd > "$O/details_fwd_f32_n$n.txt" 2>&1
done
(export SSMKIT_LINEINFO=1 CUPY_CACHE_DIR=/tmp/cupy_li
 timeout 150 ncu --clock-control none -k regex:ssm_scan_fwd_ring --launch-skip 2 --launch-count 1 \
     --section SourceCounters --section WarpStateStats --page source --print-source cuda,sass --csv \
     python3 benchmarks/profile_selective_scan.py float32 8 1536 2048 128 fwd > "$O/src_fwd_f32_n128.csv" 2> "$O/ncu_src.err")
python3 benchmarks/ncu_lines.py "$O/src_fwd_f32_n128.csv" --src cuda_src --top 40 > "$O/lines_fwd_f32_n128.txt" 2>&1
rm -f "$O/src_fwd_f32_n128.csv"
grep -E "^  [a-z].*ssm_scan|Duration|Issue Slots Busy|Achieved Occupancy|No Eligible|Warp Cycles Per Issued|L1/TEX Cache Throughput|Registers Per|Shared Memory Config|Block Limit" "$O"/details_*.txt
