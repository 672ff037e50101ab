#!/usr/bin/env bash
# The selective-scan and SSD bench tables at 955077c (GPU code as at 06d9741, the last GPU
# test record), on an H200 only: on another card it prints the card and stops, since the
# H100 rows of this code are already recorded (results/ss_slices_16bit/, ssd_allow_tf32/).
#   benchmarks/results/final_955077c/run.sh OUT_DIR
set -u
O=${1:?usage: run.sh OUT_DIR}; mkdir -p "$O"
cd "$(dirname "$0")/../../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" SSMKIT_COMMIT=955077c PYTHONUNBUFFERED=1
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "GPU: $gpu"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$O/nvidia_smi.txt" 2>&1
if [[ "$gpu" == *H200* ]]; then
  for op in selective_scan ssd; do
    timeout 270 python3 "benchmarks/bench_$op.py" --out "$O" > "$O/bench_$op.log" 2>&1
    tail -12 "$O/bench_$op.log"
  done
fi
