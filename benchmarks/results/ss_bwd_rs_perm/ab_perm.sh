#!/usr/bin/env bash
# A/B of SSM_BWD_RING_PERM (1: the permuted states, 0: before), tune rows alternating processes.
set -u
O=$OUT/ab_perm; mkdir -p $O
rows=${ROWS:-"0 1 2 3 5 6"}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv > $O/nvidia_smi.txt 2>&1
# warm both variants' kernel caches at once
for v in 1 0; do SSMKIT_CUDA_DEFINES="SSM_BWD_RING_PERM=$v" timeout 240 python3 benchmarks/tune_selective_scan.py '{}' --rows 0 > $O/warm_$v.log 2>&1 & done; wait
for r in 1 2; do
  for v in $([ $r = 1 ] && echo "1 0" || echo "0 1"); do
    echo "== PERM=$v round $r" >> $O/ab.log
    SSMKIT_CUDA_DEFINES="SSM_BWD_RING_PERM=$v" timeout 200 python3 benchmarks/tune_selective_scan.py '{}' --rows $rows 2>&1 | grep '^|' | grep -v -- '---' | grep -v '^| row' >> $O/ab.log
  done
done
cat $O/ab.log
