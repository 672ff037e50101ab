#!/bin/bash
# ssd_tf32_bwd's compile-time variants, each in a process of its own, 2 alternating rounds
# (ran at 396bea0, whose ssd_mma.cu had the HOIST and PREFETCH=2 forms; they lost and were taken out after)
pip install -q --no-index --no-deps --target /tmp/np .whl/numpy-*.whl 2>/dev/null
export PYTHONPATH=/tmp/np:$PWD
for r in 1 2; do for d in "SSD_TF32_BWD_HOIST=0" "SSD_TF32_BWD_HOIST=1" "SSD_TF32_BWD_HOIST=2" "SSD_TF32_BWD_PREFETCH=2"; do
  SSMKIT_CUDA_DEFINES="$d" timeout 150 python3 benchmarks/ab_ssd_switch.py TF32_BWD_WALK 1 True 1 > $OUT/ab_${d/=/_}_$r.log 2>&1
  echo "$d round $r: $(grep AB $OUT/ab_${d/=/_}_$r.log | cut -c60-220)"
done; done
