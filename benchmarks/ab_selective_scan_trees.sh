#!/usr/bin/env bash
# Two source trees of ssmkit timed against each other on the GPU, in one call: the selective
# scan's bench rows (forward and forward+backward, tune_selective_scan.py with no overrides)
# in both trees, two rounds in alternating order (a b, then b a), then Nsight Compute's time
# (and shared-memory wavefronts, instructions) of every kernel of one warm forward+backward in
# each tree, then the selective-scan and layer GPU tests in tree b.
#
#   benchmarks/ab_selective_scan_trees.sh TREE_A TREE_B OUT_DIR [ROWS [TUNE_ARGS...]]
#
# TREE_A, TREE_B: directories holding a checkout each (git archive REV | tar -x -C DIR; or a
# copy of the working tree with one source file swapped for its parent's, or with a patch
# applied: benchmarks/patched_tree.sh);
# ROWS: indices into bench_selective_scan.TABLE (default "0 1 2 3 6", the N = 16 rows);
# TUNE_ARGS: more arguments of tune_selective_scan.py, such as --shape float32,8,1536,2048,32
# (rows beyond the table's). Each tree runs with itself first on PYTHONPATH (keep numpy's own
# path in PYTHONPATH beforehand).
# Writes ab.log (the rows of every round), kernels_{a,b}_{dtype}_{shape}.txt and
# pytest_b.log under OUT_DIR, and prints the short results last.
set -u
A=$(cd "${1:?usage: TREE_A TREE_B OUT_DIR [ROWS [TUNE_ARGS...]]}" && pwd)
B=$(cd "${2:?usage: TREE_A TREE_B OUT_DIR [ROWS [TUNE_ARGS...]]}" && pwd)
O=${3:?usage: TREE_A TREE_B OUT_DIR [ROWS [TUNE_ARGS...]]}
rows=${4:-"0 1 2 3 6"}
shift $(($# < 4 ? $# : 4))
extra=("$@")
mkdir -p "$O"
O=$(cd "$O" && pwd)
base=${PYTHONPATH:-}
in_tree() { (cd "$1" && shift && PYTHONPATH="$PWD${base:+:$base}" "$@"); }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv > "$O/nvidia_smi.txt" 2>&1
# compile each tree's kernels first (both at once), so the rounds time warm processes
for t in A B; do
  in_tree "${!t}" timeout 300 python3 benchmarks/tune_selective_scan.py '{}' --rows $rows "${extra[@]}" > "$O/warm_$t.log" 2>&1 &
done
wait
for r in 1 2; do
  for t in $([ $r = 1 ] && echo "a b" || echo "b a"); do
    T=${t^^}
    echo "== tree $t round $r" >> "$O/ab.log"
    in_tree "${!T}" timeout 200 python3 benchmarks/tune_selective_scan.py '{}' --rows $rows "${extra[@]}" 2>&1 \
      | grep '^|' | grep -v -- '---' | grep -v '^| row' >> "$O/ab.log"
  done
done
M=gpu__time_duration.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,smsp__inst_executed.sum
for t in a b; do
  T=${t^^}
  for shape in "float32 8 1536 2048 16" "bfloat16 8 1536 2048 16" "bfloat16 2 1536 32768 16"; do
    tag=$(echo "$shape" | tr ' ' _)
    in_tree "${!T}" timeout 150 ncu --clock-control none -k regex:ssm_scan --metrics $M --csv \
      python3 benchmarks/profile_selective_scan.py $shape > "$O/k_${t}_$tag.csv" 2> "$O/k_${t}_$tag.err"
    in_tree "${!T}" python3 benchmarks/ncu_kernel_times.py "$O/k_${t}_$tag.csv" --rounds 2 \
      > "$O/kernels_${t}_$tag.txt" 2>&1
  done
done
in_tree "$B" timeout 240 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE -n 8 \
  tests/test_selective_scan.py tests/test_layers.py > "$O/pytest_b.log" 2>&1
echo "exit $?" >> "$O/pytest_b.log"
cat "$O/ab.log"
for f in "$O"/kernels_*.txt; do echo "== $(basename "$f")"; grep -E 'ssm_scan_(fwd|bwd)|total' "$f"; done
tail -n 3 "$O/pytest_b.log"
