#!/usr/bin/env bash
# The ring backward at N 17-32 in one pass (TUNING bwd_ring_max_n 32) and the state slices of
# 32 (the default now) against the old width of 16, and the H200 table. On the GPU:
#   benchmarks/results/ss_bwd_ring32/run.sh OUT_DIR
# 1. the selective-scan and layer GPU tests (pytest_gpu.log; the slices' tests at both widths);
# 2. tune_selective_scan.py: the old backward (bwd_ring_max_n 16, slices from N 65) against the
#    default (32, slices from N 33): float32
#    8x1536x2048 N 64, N 128 (rows 4, 5), N 32 (row 7) and bfloat16 N 64 (row 8) (tune.log);
# 3. on an H200 only, bench_selective_scan.py, the whole table;
set -u
O=${1:?usage: run.sh OUT_DIR}; mkdir -p "$O"
cd "$(dirname "$0")/../../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$O/nvidia_smi.txt" 2>&1
cat "$O/nvidia_smi.txt"; git log -1 --format='commit %h %cd' > "$O/commit.txt" 2>/dev/null
timeout 130 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE -n 12 \
    tests/test_selective_scan.py tests/test_layers.py > "$O/pytest_gpu.log" 2>&1
tail -2 "$O/pytest_gpu.log"
timeout 150 python3 benchmarks/tune_selective_scan.py '{"bwd_ring_max_n": 16, "bwd_state_slices_from": 65}' '{}' \
    --rows 4 5 7 8 --shape float32,8,1536,2048,32 --shape bfloat16,8,1536,2048,64 \
    --rounds 2 --check --summary > "$O/tune.log" 2>&1
sed -n '/^Fastest round/,$p' "$O/tune.log" | tail -8
if grep -q H200 "$O/nvidia_smi.txt"; then
  timeout 110 python3 benchmarks/bench_selective_scan.py --out "$O" > "$O/bench_selective_scan.log" 2>&1
  tail -n 9 "$O"/selective_scan_*.md
fi
# 4. each kernel's time (ncu, durations only) at float32 8x1536x2048, N 16, 32 and 64: where the
#    backward above N 16 spends its extra time per state (kernels_N.txt).
for n in 16 32 64; do
  timeout 100 ncu --clock-control none --metrics gpu__time_duration.sum --csv \
      python3 benchmarks/profile_selective_scan.py float32 8 1536 2048 $n > "$O/kernels_$n.csv" 2> "$O/kernels_$n.err"
  python3 benchmarks/ncu_kernel_times.py "$O/kernels_$n.csv" --rounds 2 > "$O/kernels_$n.txt" 2>&1
  echo "N $n"; cat "$O/kernels_$n.txt" | cut -c1-110
done
