#!/usr/bin/env bash
# run3.sh's checks and table, then where 8 states per lane start to pay. On the GPU:
#   benchmarks/results/ss_ring_npt8_large_n/run4.sh OUT_DIR
# 1. the selective-scan and layer GPU tests at the final rule (pytest_gpu.log);
# 2. on an H200 only, bench_selective_scan.py, the whole table;
# 3. tune_selective_scan.py, 4 against 8 states per lane (fwd_ring_npt8_min_warps 1000 / 0)
#    on grids of 5.8 to 11.6 warps per SM at 8 (warps.log): float32 N 32 at batch 4, 5, 6
#    and N 64 at batch 3 (8.7 warps per SM).
set -u
O=${1:?usage: run4.sh OUT_DIR}; mkdir -p "$O"
cd "$(dirname "$0")/../../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$O/nvidia_smi.txt" 2>&1
cat "$O/nvidia_smi.txt"; git log -1 --format='commit %h %cd' > "$O/commit.txt" 2>/dev/null
timeout 100 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE -n 12 \
    tests/test_selective_scan.py tests/test_layers.py > "$O/pytest_gpu.log" 2>&1
tail -2 "$O/pytest_gpu.log"
if grep -q H200 "$O/nvidia_smi.txt"; then
  timeout 110 python3 benchmarks/bench_selective_scan.py --out "$O" > "$O/bench_selective_scan.log" 2>&1
fi
timeout 120 python3 benchmarks/tune_selective_scan.py '{"fwd_ring_npt8_min_warps": 1000}' '{"fwd_ring_npt8_min_warps": 0}' \
    --shape float32,4,1536,2048,32 --shape float32,5,1536,2048,32 --shape float32,6,1536,2048,32 \
    --shape float32,3,1536,2048,64 --rows 7 8 9 10 --rounds 2 --check --summary > "$O/warps.log" 2>&1
sed -n '/^Fastest round/,$p' "$O/warps.log" | tail -8
tail -n 9 "$O"/selective_scan_*.md 2>/dev/null
