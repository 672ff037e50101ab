#!/usr/bin/env bash
# Ran at c42f8d3 (the knob fwd_ring_npt existed there; npt8.patch is its code, reverted after:
# slower on every row).
# The ring forward at 8 states per lane (TUNING fwd_ring_npt 8, 2 lanes a channel at N 16)
# against 4 (4 lanes), one process, 2 rounds, outputs compared; then the selective-scan
# GPU tests with SSMKIT_FWD_RING_NPT=8.   run.sh OUT_DIR
set -u
O=${1:?usage: run.sh OUT_DIR}; mkdir -p "$O"
cd "$(dirname "$0")/../../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$O/nvidia_smi.txt"
cat "$O/nvidia_smi.txt"
timeout 200 python3 benchmarks/tune_selective_scan.py '{}' '{"fwd_ring_npt": 8}' --rows 0 1 2 3 6 \
  --rounds 2 --check --summary > "$O/tune.log" 2>&1
SSMKIT_FWD_RING_NPT=8 timeout 170 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE -n 8 \
  tests/test_selective_scan.py > "$O/pytest_npt8.log" 2>&1
echo "exit $?" >> "$O/pytest_npt8.log"
tail -n 12 "$O/tune.log"; tail -n 3 "$O/pytest_npt8.log"
