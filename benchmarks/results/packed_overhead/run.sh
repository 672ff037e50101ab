#!/usr/bin/env bash
# Where the in-place packed call's time goes beyond one row's, on a GPU in one call:
#   1. the packed GPU tests (the final-state one among them, not yet run on a GPU);
#   2. benchmarks/packed_overhead.py: host and GPU time per call, cProfile of the packed call;
#   3. each kernel's time under Nsight Compute, one row and packed, at 16 and 4096 sequences;
#   4. bench_packed.py --gpu (the table NOTES.md keeps).
#   benchmarks/results/packed_overhead/run.sh OUT_DIR   ($SNAP, if set, runs after each step)
set -u
O=${1:?usage: run.sh OUT_DIR}; mkdir -p "$O"; O=$(cd "$O" && pwd)
cd "$(dirname "$0")/../../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
snap() { [ -n "${SNAP:-}" ] && $SNAP; return 0; }
nvidia-smi --query-gpu=name,driver_version --format=csv > "$O/nvidia_smi.txt" 2>&1; cat "$O/nvidia_smi.txt"
timeout 200 python3 -m pytest -q -p no:cacheprovider -rfE -m gpu -n 8 tests/test_selective_scan_packed.py \
    > "$O/pytest_packed.log" 2>&1
tail -n 3 "$O/pytest_packed.log"; snap
timeout 120 python3 benchmarks/packed_overhead.py > "$O/overhead.log" 2>&1
grep '^|' "$O/overhead.log"; snap
for k in 16 4096; do
  timeout 100 ncu --clock-control none --metrics gpu__time_duration.sum --csv \
    python3 benchmarks/packed_overhead.py --kernels $k > "$O/k$k.csv" 2> "$O/k$k.err"
  python3 benchmarks/ncu_kernel_times.py "$O/k$k.csv" --rounds 2 > "$O/kernels_$k.txt" 2>&1
  rm -f "$O/k$k.csv"; echo "== kernels, $k sequences"; cat "$O/kernels_$k.txt" | cut -c1-120
done; snap
timeout 130 python3 benchmarks/bench_packed.py --gpu --out "$O" > "$O/bench_packed.log" 2>&1
tail -n 9 "$O/bench_packed.log"; snap
