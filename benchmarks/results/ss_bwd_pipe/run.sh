#!/usr/bin/env bash
# Pipelined ring kernels against the tree before them, on the GPU, in one call:
#   benchmarks/results/ss_bwd_pipe/run.sh OUT_DIR HEAD_SELECTIVE_SCAN_CU
# HEAD_SELECTIVE_SCAN_CU: cuda_src/selective_scan.cu of the parent commit. Variants:
#   a   this tree with the parent's selective_scan.cu;
#   b   this tree (the backward's sub-blocks pipelined: SSM_BRING_PIPE 1, each sub-block's
#       adjoint beside the recompute of the one before it);
#   r   b with the ring forward at up to 168 registers (SSM_RING_FWD_REGS=168);
#   p   r with the ring forward's blocks pipelined (SSM_RING_FWD_PIPE=1: a block's output
#       reduce-scatter beside the next block's scan).
# 1. every variant's kernels compiled at once (warm_*.log);
# 2. tune_selective_scan.py '{}' for a and b: rows 0 1 2 3 6 (N 16), 4 (N 64) and float32
#    8x1536x2048 N 32, two rounds in alternating order (ab.log);
# 3. the selective-scan and layer GPU tests in b (pytest_gpu.log);
# 4. b, r and p on rows 0 1 2 3 6, two rounds (fwd.log);
# 5. on an H200, bench_selective_scan.py in b, the whole table;
# 6. ncu kernel times, float32 8x1536x2048 N 16, a and b (kernels_{a,b}.txt).
set -u
O=${1:?usage: run.sh OUT_DIR HEAD_CU}; H=${2:?usage: run.sh OUT_DIR HEAD_CU}
mkdir -p "$O"; O=$(cd "$O" && pwd); H=$(cd "$(dirname "$H")" && pwd)/$(basename "$H")
cd "$(dirname "$0")/../../.."
B=$PWD; A=/tmp/tree_a
rm -rf "$A"; mkdir -p "$A"; tar --exclude=./.whl --exclude=./.git -cf - . | tar -xf - -C "$A"
cp "$H" "$A/cuda_src/selective_scan.cu"
base=${PYTHONPATH:-}
# run VARIANT CMD...: in the variant's tree with its defines
run() {
  local v=$1; shift
  local tree=$B defs=""
  case $v in
    a) tree=$A ;;
    r) defs="SSM_RING_FWD_REGS=168" ;;
    p) defs="SSM_RING_FWD_REGS=168 SSM_RING_FWD_PIPE=1" ;;
  esac
  (cd "$tree" && PYTHONPATH="$PWD${base:+:$base}" SSMKIT_CUDA_DEFINES="$defs" "$@")
}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$O/nvidia_smi.txt" 2>&1
cat "$O/nvidia_smi.txt"
SHAPE="--shape float32,8,1536,2048,32"
for v in a b; do run $v timeout 240 python3 benchmarks/tune_selective_scan.py '{}' --rows 0 1 4 7 $SHAPE > "$O/warm_$v.log" 2>&1 & done
for v in r p; do run $v timeout 240 python3 benchmarks/tune_selective_scan.py '{}' --rows 0 1 > "$O/warm_$v.log" 2>&1 & done
wait
for r in 1 2; do
  for v in $([ $r = 1 ] && echo "a b" || echo "b a"); do
    echo "== $v round $r" >> "$O/ab.log"
    run $v timeout 100 python3 benchmarks/tune_selective_scan.py '{}' --rows 0 1 2 3 6 4 7 $SHAPE 2>&1 \
      | grep '^|' | grep -v -- '---' | grep -v '^| row' >> "$O/ab.log"
  done
done
cat "$O/ab.log"
run b timeout 170 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE -n 12 \
  tests/test_selective_scan.py tests/test_layers.py > "$O/pytest_gpu.log" 2>&1
echo "exit $?" >> "$O/pytest_gpu.log"; tail -n 3 "$O/pytest_gpu.log"
for r in 1 2; do
  for v in $([ $r = 1 ] && echo "b r p" || echo "p r b"); do
    echo "== $v round $r" >> "$O/fwd.log"
    run $v timeout 80 python3 benchmarks/tune_selective_scan.py '{}' --rows 0 1 2 3 6 2>&1 \
      | grep '^|' | grep -v -- '---' | grep -v '^| row' >> "$O/fwd.log"
  done
done
cat "$O/fwd.log"
if grep -q H200 "$O/nvidia_smi.txt"; then
  run b timeout 110 python3 benchmarks/bench_selective_scan.py --out "$O" > "$O/bench_selective_scan.log" 2>&1
  tail -n 9 "$O"/selective_scan_*.md
fi
for v in a b; do
  run $v timeout 60 ncu --clock-control none -k regex:ssm_ --metrics gpu__time_duration.sum,smsp__inst_executed.sum --csv \
    python3 benchmarks/profile_selective_scan.py float32 8 1536 2048 16 > "$O/k_$v.csv" 2> "$O/k_$v.err"
  run $v python3 benchmarks/ncu_kernel_times.py "$O/k_$v.csv" --rounds 2 > "$O/kernels_$v.txt" 2>&1
  echo "== $v"; grep -E 'bwd|fwd|total' "$O/kernels_$v.txt" | cut -c1-120
done
