#!/usr/bin/env bash
# The backward by state slices for 16-bit u (on float32 copies) against ssm_scan_bwd, on the GPU:
#   benchmarks/results/ss_slices_16bit/run.sh OUT_DIR
# 1. the selective-scan and layer GPU tests (pytest.log);
# 2. tune_selective_scan.py '{}' '{"bwd_state_slices_16bit": false}', 2 rounds, alternating,
#    gradients compared: bfloat16 and float16 8x1536x2048 N 128, bfloat16 N 96 and N 80,
#    bfloat16 4x1536x2048 N 128 (one slice's grid below the slices' warp rule: unchanged), and
#    row 5 (float32 N 128: a control) (tune.log).
set -u
O=${1:?usage: run.sh OUT_DIR}; mkdir -p "$O"
cd "$(dirname "$0")/../../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$O/nvidia_smi.txt" 2>&1
timeout 300 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE -n 12 --timeout 250 \
    tests/test_selective_scan.py tests/test_layers.py > "$O/pytest.log" 2>&1
tail -2 "$O/pytest.log"
timeout 400 python3 benchmarks/tune_selective_scan.py '{}' '{"bwd_state_slices_16bit": false}' \
    --rows 7 8 9 10 11 5 --shape bfloat16,8,1536,2048,128 --shape float16,8,1536,2048,128 \
    --shape bfloat16,8,1536,2048,96 --shape bfloat16,8,1536,2048,80 --shape bfloat16,4,1536,2048,128 \
    --rounds 2 --check --summary > "$O/tune.log" 2>&1
sed -n '/^Fastest round/,$p' "$O/tune.log"
