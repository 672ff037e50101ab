#!/usr/bin/env bash
# Executed instructions and stall samples by source line (Nsight Compute's source page,
# SSMKIT_LINEINFO=1) of the ring kernels at the bench's first rows, for the next round of
# instruction cuts: benchmarks/results/ss_lines/run.sh OUT_DIR
#   bwd_{dtype}.txt: ssm_scan_bwd_ring, the warm forward+backward's launch (8x1536x2048 N 16);
#   fwd_{dtype}.txt: ssm_scan_fwd_ring, likewise; bwd32_float32.txt: N 32.
# ONLY="fwd_float32 fwd_bfloat16" (say) runs just those profiles, without the table.
set -u
O=${1:?usage: run.sh OUT_DIR}; mkdir -p "$O"; O=$(cd "$O" && pwd)
cd "$(dirname "$0")/../../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" SSMKIT_LINEINFO=1
nvidia-smi --query-gpu=name,driver_version --format=csv > "$O/nvidia_smi.txt" 2>&1; cat "$O/nvidia_smi.txt"
git log -1 --format='commit %h %cd' > "$O/commit.txt" 2>/dev/null
prof() {  # KERNEL_REGEX SKIP TAG DTYPE N
  [ -z "${ONLY:-}" ] || [[ " $ONLY " == *" $3 "* ]] || return 0
  timeout 150 ncu --clock-control none -k regex:$1 --launch-skip $2 --launch-count 1 --section SourceCounters \
    --section WarpStateStats --page source --print-source cuda,sass --csv \
    python3 benchmarks/profile_selective_scan.py $4 8 1536 2048 $5 > "$O/$3.csv" 2> "$O/$3.err"
  python3 benchmarks/ncu_lines.py "$O/$3.csv" --top 45 > "$O/$3.txt" 2>&1
  rm -f "$O/$3.csv"
  echo "== $3"; head -n 14 "$O/$3.txt" | cut -c1-150
}
prof ssm_scan_bwd_ring 1 bwd_float32 float32 16
prof ssm_scan_bwd_ring 1 bwd_bfloat16 bfloat16 16
prof ssm_scan_fwd_ring 1 fwd_float32 float32 16
prof ssm_scan_fwd_ring 1 fwd_bfloat16 bfloat16 16
prof ssm_scan_bwd_ring 1 bwd32_float32 float32 32
# on an H200, the whole table at this commit (version 24's defaults have no H200 table yet)
if [ -z "${ONLY:-}" ] && grep -q H200 "$O/nvidia_smi.txt"; then
  SSMKIT_LINEINFO=0 timeout 110 python3 benchmarks/bench_selective_scan.py --out "$O" > "$O/bench_selective_scan.log" 2>&1
  tail -n 9 "$O"/selective_scan_*.md
fi
