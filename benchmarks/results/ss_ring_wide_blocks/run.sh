#!/usr/bin/env bash
# The ring forward in blocks of up to 512 threads (ssm_scan_fwd_ring_wide) against 256, on the GPU:
#   benchmarks/results/ss_ring_wide_blocks/run.sh OUT_DIR
# 1. the selective-scan and layer GPU tests with SSMKIT_FWD_RING_THREADS=512 (pytest_wide.log);
# 2. tune_selective_scan.py, '{}' against '{"fwd_ring_threads": 512}', 2 rounds in alternating
#    order, outputs and gradients compared (tune.log): rows 4, 5 (float32 N 64, 128), 6 (float32
#    64x1536x256 N 16: 128 channels a block at 512), 0 (a control: unchanged), and bfloat16 N 64
#    and 128, float32 2x1536x8192 N 128;
# 3. Nsight Compute's speed of light of the N 128 ring forward in both (ncu_*.txt).
set -u
O=${1:?usage: run.sh OUT_DIR}; mkdir -p "$O"
cd "$(dirname "$0")/../../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$O/nvidia_smi.txt" 2>&1
SSMKIT_FWD_RING_THREADS=512 timeout 300 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE -n 12 --timeout 250 \
    tests/test_selective_scan.py tests/test_layers.py > "$O/pytest_wide.log" 2>&1
tail -2 "$O/pytest_wide.log"
timeout 400 python3 benchmarks/tune_selective_scan.py '{}' '{"fwd_ring_threads": 512}' --rows 4 5 6 0 7 8 9 \
    --shape bfloat16,8,1536,2048,128 --shape bfloat16,8,1536,2048,64 --shape float32,2,1536,8192,128 \
    --rounds 2 --check --summary > "$O/tune.log" 2>&1
for t in 256 512; do
  SSMKIT_FWD_RING_THREADS=$t timeout 100 ncu --clock-control none -k regex:ssm_scan_fwd_ring --launch-skip 2 --launch-count 1 \
      --section SpeedOfLight --section Occupancy --section SchedulerStats \
      python3 benchmarks/profile_selective_scan.py float32 8 1536 2048 128 fwd > "$O/ncu_n128_$t.txt" 2>&1
  grep -E "ssm_scan_fwd_ring|Duration|L2 Cache Throughput|Compute \(SM\)|Eligible Warps|Achieved Occupancy" "$O/ncu_n128_$t.txt"
done
sed -n '/^Fastest round/,$p' "$O/tune.log"
