#!/usr/bin/env bash
# The ring forward at 8 states per lane for N > 16 (TUNING fwd_ring_npt8_min_n; wide blocks of
# 384 threads) against 4, on the GPU:   benchmarks/results/ss_ring_npt8_large_n/run.sh OUT_DIR
# 1. the selective-scan and layer GPU tests with SSMKIT_FWD_RING_NPT8_MIN_N=9 (pytest_npt8.log);
# 2. tune_selective_scan.py '{}' against '{"fwd_ring_npt8_min_n": 17}', 2 rounds in alternating
#    order, outputs and gradients compared (tune.log): rows 4, 5 (float32 N 64, 128), 0 (N 16:
#    a control, unchanged), bfloat16 N 128 and 64, float32 N 32, float32 2x1536x8192 N 128.
set -u
O=${1:?usage: run.sh OUT_DIR}; mkdir -p "$O"
cd "$(dirname "$0")/../../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$O/nvidia_smi.txt" 2>&1
cat "$O/nvidia_smi.txt"
timeout 400 python3 benchmarks/tune_selective_scan.py '{}' '{"fwd_ring_npt8_min_n": 17}' --rows 4 5 0 7 8 9 10 \
    --shape bfloat16,8,1536,2048,128 --shape bfloat16,8,1536,2048,64 --shape float32,8,1536,2048,32 \
    --shape float32,2,1536,8192,128 --rounds 2 --check --summary > "$O/tune.log" 2>&1
SSMKIT_FWD_RING_NPT8_MIN_N=9 timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE -n 12 \
    tests/test_selective_scan.py tests/test_layers.py > "$O/pytest_npt8.log" 2>&1
tail -3 "$O/pytest_npt8.log"
sed -n '/^Fastest round/,$p' "$O/tune.log"; tail -12 "$O/tune.log"
