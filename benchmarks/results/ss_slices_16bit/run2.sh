#!/usr/bin/env bash
# After the 16-bit slices: every GPU test, and where the slices should start (N 33 against the
# default 65) at N 48 and 64 in float32 and bfloat16:
#   benchmarks/results/ss_slices_16bit/run2.sh OUT_DIR
set -u
O=${1:?usage: run2.sh OUT_DIR}; mkdir -p "$O"
cd "$(dirname "$0")/../../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$O/nvidia_smi.txt" 2>&1
timeout 330 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE -n 12 --timeout 250 > "$O/pytest_gpu_all.log" 2>&1
tail -2 "$O/pytest_gpu_all.log"
timeout 240 python3 benchmarks/tune_selective_scan.py '{}' '{"bwd_state_slices_from": 33}' \
    --rows 4 7 8 9 --shape float32,8,1536,2048,48 --shape bfloat16,8,1536,2048,48 \
    --shape bfloat16,8,1536,2048,64 \
    --rounds 2 --check --summary > "$O/tune_from.log" 2>&1
sed -n '/^Fastest round/,$p' "$O/tune_from.log"
