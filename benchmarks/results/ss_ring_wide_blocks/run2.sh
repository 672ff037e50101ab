#!/usr/bin/env bash
# After 86c8e25 (wide ring-forward blocks from N 33 by default), on the GPU:
#   benchmarks/results/ss_ring_wide_blocks/run2.sh OUT_DIR
# 1. every GPU test (pytest_gpu_all.log);
# 2. where the wide blocks start: tune_selective_scan.py with fwd_ring_wide_min_n 33 (the
#    default), 17 and null (never), 2 rounds, N 24, 32, 48 (float32) and 32 (bfloat16), and
#    row 4 (N 64) (tune_min_n.log);
# 3. the whole bench table (bench_selective_scan.py, bench_*.{log,md,json}).
set -u
O=${1:?usage: run2.sh OUT_DIR}; mkdir -p "$O"
cd "$(dirname "$0")/../../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$O/nvidia_smi.txt" 2>&1
timeout 300 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE -n 12 --timeout 250 > "$O/pytest_gpu_all.log" 2>&1
tail -2 "$O/pytest_gpu_all.log"
timeout 300 python3 benchmarks/tune_selective_scan.py '{}' '{"fwd_ring_wide_min_n": 17}' '{"fwd_ring_wide_min_n": null}' \
    --rows 7 8 9 10 4 --shape float32,8,1536,2048,24 --shape float32,8,1536,2048,32 \
    --shape float32,8,1536,2048,48 --shape bfloat16,8,1536,2048,32 \
    --rounds 2 --check --summary > "$O/tune_min_n.log" 2>&1
mkdir -p "$O/bench"
timeout 400 python3 benchmarks/bench_selective_scan.py --out "$O/bench" > "$O/bench/bench.log" 2>&1
sed -n '/^Fastest round/,$p' "$O/tune_min_n.log"
tail -12 "$O/bench/bench.log"
