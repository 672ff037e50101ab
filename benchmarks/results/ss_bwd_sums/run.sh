#!/usr/bin/env bash
# The ring backward's dB/dC block sums with their loop invariants hoisted and its tile count
# by shift, against the parent's kernel, on the GPU in one call:
#   benchmarks/results/ss_bwd_sums/run.sh OUT_DIR PARENT_SELECTIVE_SCAN_CU
# a: this tree with the parent's selective_scan.cu; b: this tree.
# 1. tune_selective_scan.py '{}' in a and b, rows 0 1 2 3 6 4 and float32 8x1536x2048 N 32,
#    two rounds in alternating order (ab.log);
# 2. ncu kernel times and instructions, float32 8x1536x2048 N 16 and 32 (kernels_*.txt);
# 3. the selective-scan and layer GPU tests in b (pytest_gpu.log).
set -u
O=${1:?usage: run.sh OUT_DIR PARENT_CU}; H=${2:?usage: run.sh OUT_DIR PARENT_CU}
mkdir -p "$O"; O=$(cd "$O" && pwd); H=$(cd "$(dirname "$H")" && pwd)/$(basename "$H")
cd "$(dirname "$0")/../../.."
B=$PWD; A=/tmp/tree_a
rm -rf "$A"; mkdir -p "$A"; tar --exclude=./.whl --exclude=./.git -cf - . | tar -xf - -C "$A"
cp "$H" "$A/cuda_src/selective_scan.cu"
base=${PYTHONPATH:-}
run() { local t=$B; [ "$1" = a ] && t=$A; shift; (cd "$t" && PYTHONPATH="$PWD${base:+:$base}" "$@"); }
nvidia-smi --query-gpu=name,driver_version --format=csv > "$O/nvidia_smi.txt" 2>&1; cat "$O/nvidia_smi.txt"
SHAPE="--shape float32,8,1536,2048,32"
for v in a b; do run $v timeout 200 python3 benchmarks/tune_selective_scan.py '{}' --rows 0 1 4 7 $SHAPE > "$O/warm_$v.log" 2>&1 & done
wait
for r in 1 2; do
  for v in $([ $r = 1 ] && echo "a b" || echo "b a"); do
    echo "== $v round $r" >> "$O/ab.log"
    run $v timeout 90 python3 benchmarks/tune_selective_scan.py '{}' --rows 0 1 2 3 6 4 7 $SHAPE 2>&1 \
      | grep '^|' | grep -v -- '---' | grep -v '^| row' >> "$O/ab.log"
  done
done
cat "$O/ab.log"
for v in a b; do
  for n in 16 32; do
    run $v timeout 60 ncu --clock-control none -k regex:ssm_ --metrics gpu__time_duration.sum,smsp__inst_executed.sum --csv \
      python3 benchmarks/profile_selective_scan.py float32 8 1536 2048 $n > "$O/k.csv" 2> /dev/null
    run $v python3 benchmarks/ncu_kernel_times.py "$O/k.csv" --rounds 2 > "$O/kernels_${v}_$n.txt" 2>&1
    echo "== $v N $n"; grep -E 'bwd_ring' "$O/kernels_${v}_$n.txt" | cut -c1-110
  done
done
rm -f "$O/k.csv"
run b timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE -n 12 \
  tests/test_selective_scan.py tests/test_layers.py > "$O/pytest_gpu.log" 2>&1
echo "exit $?" >> "$O/pytest_gpu.log"; tail -n 2 "$O/pytest_gpu.log"
