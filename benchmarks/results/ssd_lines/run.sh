#!/usr/bin/env bash
# Executed instructions and stall samples by source line of the bfloat16 SSD's one-kernel
# forward (ssd_mma_fwd, ssd's own launch) and backward walk (ssd_mma_bwd), at the peer row:
#   benchmarks/results/ssd_lines/run.sh OUT_DIR
set -u
O=${1:?usage: run.sh OUT_DIR}; mkdir -p "$O"; O=$(cd "$O" && pwd)
cd "$(dirname "$0")/../../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" SSMKIT_LINEINFO=1
nvidia-smi --query-gpu=name --format=csv,noheader > "$O/gpu.txt" 2>&1
prof() {  # KERNEL_REGEX SKIP TAG ARGS...
  local k=$1 s=$2 t=$3; shift 3
  timeout 150 ncu --clock-control none -k regex:$k --launch-skip $s --launch-count 1 --section SourceCounters \
    --section WarpStateStats --page source --print-source cuda,sass --csv \
    python3 benchmarks/profile_ssd_launch.py "$@" > "$O/$t.csv" 2> /dev/null
  python3 benchmarks/ncu_lines.py "$O/$t.csv" --src cuda_src --top 50 > "$O/$t.txt" 2>&1
  rm -f "$O/$t.csv"; echo "== $t"; head -n 16 "$O/$t.txt" | cut -c1-150
}
prof ssd_mma_fwd 1 fwd_bfloat16 bfloat16 fwd
prof ssd_mma_bwd 1 bwd_bfloat16 bfloat16
