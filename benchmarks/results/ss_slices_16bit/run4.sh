#!/usr/bin/env bash
# The state slices in two lanes (two streams) for mid-sized grids:
#   benchmarks/results/ss_slices_16bit/run4.sh OUT_DIR
# 1. the selective-scan and layer GPU tests (pytest_lanes.log);
# 2. tune_selective_scan.py: the default (two lanes from 4 warps per SM a slice), the knob off
#    (ssm_scan_bwd below 8), and two lanes everywhere from 2 (tune_lanes.log).
set -u
O=${1:?usage: run4.sh OUT_DIR}; mkdir -p "$O"
cd "$(dirname "$0")/../../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$O/nvidia_smi.txt" 2>&1
timeout 300 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE -n 12 --timeout 250 \
    tests/test_selective_scan.py tests/test_layers.py > "$O/pytest_lanes.log" 2>&1
tail -2 "$O/pytest_lanes.log"
timeout 400 python3 benchmarks/tune_selective_scan.py '{}' '{"bwd_state_slices_pair_min_warps": null}' \
    '{"bwd_state_slices_min_warps": 1e9, "bwd_state_slices_pair_min_warps": 2}' \
    --rows 7 8 9 5 --shape float32,4,1536,2048,128 --shape bfloat16,4,1536,2048,128 \
    --shape float32,2,1536,2048,128 \
    --rounds 2 --check --summary > "$O/tune_lanes.log" 2>&1
sed -n '/^Fastest round/,$p' "$O/tune_lanes.log"
