#!/usr/bin/env bash
# After run2.sh: 8 states per lane only where their grid has TUNING fwd_ring_npt8_min_warps (10)
# warps per SM; the summaries back at 4. On the GPU:
#   benchmarks/results/ss_ring_npt8_large_n/run3.sh OUT_DIR
# 1. the selective-scan and layer GPU tests (pytest_gpu.log);
# 2. tune_selective_scan.py '{}': float32 2x1536x32768 N 64 (now 4 states per lane, as before
#    the change) and row 5 (N 128, 8), one call (tune.log);
# 3. on an H200 only, bench_selective_scan.py, the whole table.
# (Not yet run: no device time was left when it was written.)
set -u
O=${1:?usage: run3.sh OUT_DIR}; mkdir -p "$O"
cd "$(dirname "$0")/../../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$O/nvidia_smi.txt" 2>&1
cat "$O/nvidia_smi.txt"
timeout 90 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE -n 12 \
    tests/test_selective_scan.py tests/test_layers.py > "$O/pytest_gpu.log" 2>&1
tail -2 "$O/pytest_gpu.log"
timeout 60 python3 benchmarks/tune_selective_scan.py '{}' --rows 5 7 --shape float32,2,1536,32768,64 \
    --summary > "$O/tune.log" 2>&1
sed -n '/^Fastest round/,/^variants/p' "$O/tune.log"
if grep -q H200 "$O/nvidia_smi.txt"; then
  timeout 100 python3 benchmarks/bench_selective_scan.py --out "$O" > "$O/bench_selective_scan.log" 2>&1
  tail -n 9 "$O"/selective_scan_*.md
fi
