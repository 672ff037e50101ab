#!/usr/bin/env bash
# Where the in-place packed call's time goes beyond one row's, on a GPU in one call:
#   1. the packed GPU tests (TESTS=0 skips them);
#   2. benchmarks/packed_overhead.py: host and GPU time per call, forward and
#      forward+backward, and cProfile of the packed call;
#   3. each kernel's time under Nsight Compute, one row and packed (16 sequences);
#   4. the plain path (no sequences) with the ring kernels' restart code compiled out
#      (SSMKIT_CUDA_DEFINES=SSM_RING_RESTARTS=0, tree b) against it in (a): bench rows 0-3,
#      two alternating rounds;
#   5. bench_packed.py --gpu (the table NOTES.md keeps).
#   benchmarks/results/packed_overhead/run.sh OUT_DIR   ($SNAP, if set, runs after each step)
set -u
O=${1:?usage: run.sh OUT_DIR}; mkdir -p "$O"; O=$(cd "$O" && pwd)
cd "$(dirname "$0")/../../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
snap() { [ -n "${SNAP:-}" ] && $SNAP; return 0; }
nvidia-smi --query-gpu=name,driver_version --format=csv > "$O/nvidia_smi.txt" 2>&1; cat "$O/nvidia_smi.txt"
if [ "${TESTS:-1}" != 0 ]; then
  timeout 200 python3 -m pytest -q -p no:cacheprovider -rfE -m gpu -n 8 tests/test_selective_scan_packed.py \
      > "$O/pytest_packed.log" 2>&1
  tail -n 3 "$O/pytest_packed.log"; snap
fi
timeout 150 python3 benchmarks/packed_overhead.py > "$O/overhead.log" 2>&1
grep '^|' "$O/overhead.log"; snap
timeout 120 ncu --clock-control none --metrics gpu__time_duration.sum --csv \
  python3 benchmarks/packed_overhead.py --kernels 16 > "$O/k16.csv" 2> "$O/k16.err"
python3 benchmarks/ncu_kernel_times.py "$O/k16.csv" --rounds 2 > "$O/kernels_16.txt" 2>&1
rm -f "$O/k16.csv"; echo "== kernels, 16 sequences"; cut -c1-110 "$O/kernels_16.txt"; snap
for t in a b b a; do
  echo "== tree $t" >> "$O/ab.log"
  d=""; [ $t = b ] && d="SSM_RING_RESTARTS=0"
  SSMKIT_CUDA_DEFINES="$d" timeout 100 python3 benchmarks/tune_selective_scan.py '{}' --rows 0 1 2 3 2>&1 \
    | grep '^|' | grep -v -- '---' | grep -v '^| row' >> "$O/ab.log"
done
cat "$O/ab.log"; snap
timeout 150 python3 benchmarks/bench_packed.py --gpu --out "$O" > "$O/bench_packed.log" 2>&1
tail -n 8 "$O/bench_packed.log"; snap
