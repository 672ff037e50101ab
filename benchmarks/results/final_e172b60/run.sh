#!/usr/bin/env bash
# Every GPU test at e172b60 (the tree: e172b60 and this script); on an H200 also the
# selective-scan and SSD bench tables (gpu_check.sh), on another card the tests only.
#   benchmarks/results/final_e172b60/run.sh OUT_DIR
set -u
O=${1:?usage: run.sh OUT_DIR}; mkdir -p "$O"
cd "$(dirname "$0")/../../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" SSMKIT_COMMIT=e172b60
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "GPU: $gpu"
if [[ "$gpu" == *H200* ]]; then
  timeout 560 benchmarks/gpu_check.sh "$O" selective_scan ssd > "$O/gpu_check.log" 2>&1
  grep -E "passed|failed" "$O/pytest_gpu.log" | tail -2
  tail -12 "$O/bench_selective_scan.log"; tail -10 "$O/bench_ssd.log"
else
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$O/nvidia_smi.txt" 2>&1
  timeout 330 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE -n 12 --timeout 250 > "$O/pytest_gpu.log" 2>&1
  tail -2 "$O/pytest_gpu.log"
fi
