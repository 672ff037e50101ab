#!/usr/bin/env bash
# The second exchange form (benchmarks/NOTES.md, after version 28), on the GPU in one call:
# (The run recorded here took these steps from an ad hoc copy of this script, with the
# patched files copied in place of the patches.)
#   benchmarks/results/ss_bwd_exchange/h100_split_stores/run.sh OUT_DIR
# a: this tree (f1a741d when measured); b: exchange_per_step.patch (XR 1); c:
# exchange_2steps.patch (XR 2). Rows 0 1 2 3 4 6 of bench_selective_scan.TABLE, two rounds
# (a b c, c b a), Nsight Compute of the backward kernel at two shapes, the selective-scan and
# layer GPU tests in b and c. Keep numpy's own path in PYTHONPATH beforehand.
set -u
O=${1:?usage: run.sh OUT_DIR}
mkdir -p "$O"; O=$(cd "$O" && pwd)
cd "$(dirname "$0")/../../../.."
A=$PWD; B=/tmp/tree_xr1; C=/tmp/tree_xr2
P=benchmarks/results/ss_bwd_exchange/h100_split_stores
benchmarks/patched_tree.sh "$B" "$P/exchange_per_step.patch" || exit 1
benchmarks/patched_tree.sh "$C" "$P/exchange_2steps.patch" || exit 1
base=${PYTHONPATH:-}
in_tree() { (cd "$1" && shift && PYTHONPATH="$PWD${base:+:$base}" "$@"); }
rows="0 1 2 3 4 6"
nvidia-smi --query-gpu=name,driver_version --format=csv > "$O/nvidia_smi.txt"
for t in A B C; do
  in_tree "${!t}" timeout 300 python3 benchmarks/tune_selective_scan.py '{}' --rows $rows > "$O/warm_$t.log" 2>&1 &
done
wait
for r in 1 2; do
  for t in $([ $r = 1 ] && echo "a b c" || echo "c b a"); do
    T=${t^^}
    echo "== tree $t round $r" >> "$O/ab.log"
    in_tree "${!T}" timeout 200 python3 benchmarks/tune_selective_scan.py '{}' --rows $rows 2>&1 \
      | grep '^|' | grep -v -- '---' | grep -v '^| row' >> "$O/ab.log"
  done
done
M=gpu__time_duration.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,smsp__inst_executed.sum
for t in a b c; do
  T=${t^^}
  for shape in "float32 8 1536 2048 16" "bfloat16 8 1536 2048 16"; do
    tag=$(echo "$shape" | tr ' ' _)
    in_tree "${!T}" timeout 100 ncu --clock-control none -k regex:ssm_scan_bwd --metrics $M --csv \
      python3 benchmarks/profile_selective_scan.py $shape > "$O/k_${t}_$tag.csv" 2> "$O/k_${t}_$tag.err"
    in_tree "${!T}" python3 benchmarks/ncu_kernel_times.py "$O/k_${t}_$tag.csv" --rounds 2 \
      > "$O/kernels_${t}_$tag.txt" 2>&1
  done
done
for t in B C; do
  in_tree "${!t}" timeout 120 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE -n 8 \
    tests/test_selective_scan.py tests/test_layers.py > "$O/pytest_$t.log" 2>&1
  echo "exit $?" >> "$O/pytest_$t.log"
done
cat "$O/ab.log"
