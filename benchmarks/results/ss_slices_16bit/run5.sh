#!/usr/bin/env bash
# Two lanes by default wherever the slices run: every GPU test, and the default against one
# lane at float32 8x1536x2048 and 4x1536x2048 N 128:
#   benchmarks/results/ss_slices_16bit/run5.sh OUT_DIR
set -u
O=${1:?usage: run5.sh OUT_DIR}; mkdir -p "$O"
cd "$(dirname "$0")/../../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$O/nvidia_smi.txt" 2>&1
timeout 330 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE -n 12 --timeout 250 > "$O/pytest_gpu_all.log" 2>&1
tail -2 "$O/pytest_gpu_all.log"
timeout 200 python3 benchmarks/tune_selective_scan.py '{}' '{"bwd_state_slices_lanes": 1}' \
    --rows 5 7 --shape float32,4,1536,2048,128 --rounds 2 --check --summary > "$O/tune_default.log" 2>&1
sed -n '/^Fastest round/,$p' "$O/tune_default.log"
