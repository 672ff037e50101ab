#!/usr/bin/env bash
# float32 N 33-48 through the slices (bwd_state_slices_padded_from 33) against ssm_scan_bwd:
#   benchmarks/results/ss_slices_16bit/run3.sh OUT_DIR
set -u
O=${1:?usage: run3.sh OUT_DIR}; mkdir -p "$O"
cd "$(dirname "$0")/../../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$O/nvidia_smi.txt" 2>&1
timeout 300 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE -n 12 --timeout 250 \
    tests/test_selective_scan.py tests/test_layers.py > "$O/pytest.log" 2>&1
tail -2 "$O/pytest.log"
timeout 300 python3 benchmarks/tune_selective_scan.py '{}' '{"bwd_state_slices_padded_from": null}' \
    --rows 7 8 9 10 11 12 --shape float32,8,1536,2048,33 --shape float32,8,1536,2048,40 \
    --shape float32,8,1536,2048,48 --shape float32,2,1536,8192,48 --shape float32,64,1536,256,48 \
    --shape float32,4,1536,2048,48 \
    --rounds 2 --check --summary > "$O/tune_padded.log" 2>&1
sed -n '/^Fastest round/,$p' "$O/tune_padded.log"
