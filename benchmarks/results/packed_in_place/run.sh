#!/usr/bin/env bash
# Packed sequences restarting in place in the ring kernels, on a GPU in one call:
#   1. the packed, selective-scan and layer GPU tests (test_restarts_in_place_on_gpu among them);
#   2. bench_packed.py --gpu: one row, packed in place, padded rows and a loop of calls;
#   3. the plain path (no sequences) against the tree before (before.patch undoes the change
#      in selective_scan.cu and the GPU module): bench rows 0-3 in each tree, twice.
#   benchmarks/results/packed_in_place/run.sh OUT_DIR
set -u
O=${1:?usage: run.sh OUT_DIR}; mkdir -p "$O"; O=$(cd "$O" && pwd)
cd "$(dirname "$0")/../../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv > "$O/nvidia_smi.txt" 2>&1; cat "$O/nvidia_smi.txt"
git log -1 --format='commit %h %cd' > "$O/commit.txt" 2>/dev/null
timeout 300 python3 -m pytest -q -p no:cacheprovider -rfE -m gpu -n 12 tests/test_selective_scan_packed.py \
    tests/test_selective_scan.py tests/test_layers.py > "$O/pytest_gpu.log" 2>&1
tail -n 3 "$O/pytest_gpu.log"; [ -n "${SNAP:-}" ] && $SNAP
timeout 130 python3 benchmarks/bench_packed.py --gpu --out "$O" > "$O/bench_packed.log" 2>&1
tail -n 9 "$O/bench_packed.log"; [ -n "${SNAP:-}" ] && $SNAP
[ "${AB:-1}" = 0 ] && exit 0  # (AB=0: steps 1 and 2 only)
# the plain path, this tree (a) against the one before (b): bench rows 0-3, alternating
benchmarks/patched_tree.sh /tmp/tree_before benchmarks/results/packed_in_place/before.patch
for t in a b b a; do
  d=$PWD; [ $t = b ] && d=/tmp/tree_before
  echo "== tree $t" >> "$O/ab.log"
  (cd "$d" && PYTHONPATH="$d:${PYTHONPATH#*:}" timeout 100 python3 benchmarks/tune_selective_scan.py '{}' \
      --rows 0 1 2 3 2>&1 | grep '^|' | grep -v -- '---' | grep -v '^| row') >> "$O/ab.log"
done
cat "$O/ab.log"
