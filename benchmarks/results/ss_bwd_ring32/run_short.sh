#!/usr/bin/env bash
# run.sh cut to what little device time was left: the slices' GPU tests (both widths), then
# '{}' against bwd_ring_max_n 32 with slices from N 33 on float32 8x1536x2048 N 32, 64, 128
# (tune.log), then on an H200 the whole table. On the GPU:
#   benchmarks/results/ss_bwd_ring32/run_short.sh OUT_DIR
set -u
O=${1:?usage: run_short.sh OUT_DIR}; mkdir -p "$O"
cd "$(dirname "$0")/../../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$O/nvidia_smi.txt" 2>&1
cat "$O/nvidia_smi.txt"; git log -1 --format='commit %h %cd' > "$O/commit.txt" 2>/dev/null
timeout 100 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE -n 12 -k "slices or ring" \
    tests/test_selective_scan.py > "$O/pytest_gpu.log" 2>&1
tail -2 "$O/pytest_gpu.log"
timeout 120 python3 benchmarks/tune_selective_scan.py '{}' '{"bwd_ring_max_n": 32, "bwd_state_slices_from": 33}' \
    --rows 7 4 5 --shape float32,8,1536,2048,32 --rounds 2 --check --summary > "$O/tune.log" 2>&1
sed -n '/^Fastest round/,$p' "$O/tune.log" | tail -6
if grep -q H200 "$O/nvidia_smi.txt"; then
  timeout 110 python3 benchmarks/bench_selective_scan.py --out "$O" > "$O/bench_selective_scan.log" 2>&1
  tail -n 9 "$O"/selective_scan_*.md
fi
