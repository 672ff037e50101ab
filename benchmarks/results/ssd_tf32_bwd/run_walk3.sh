#!/bin/bash
# The float32 backward walk, rule "auto": GPU tests, launch order A/B, L2 prefetch A/B.
pip install -q --no-index --no-deps --target /tmp/np .whl/numpy-*.whl 2>/dev/null
export PYTHONPATH=/tmp/np:$PWD
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $OUT/nvsmi.txt 2>&1
timeout 90 python3 -c "from ssmkit._gpu import ssd; ssd.warmup()" > $OUT/warmup.log 2>&1; echo "warmup rc $?"
timeout 300 python3 -m pytest -q -m gpu tests/test_ssd.py tests/test_ssd_chunked.py tests/test_layers.py -p no:cacheprovider > $OUT/pytest_ssd.log 2>&1; echo "pytest rc $?"; tail -3 $OUT/pytest_ssd.log
timeout 100 python3 benchmarks/ab_ssd_switch.py TF32_WALK_FIRST 3 True,False 1 > $OUT/ab_walk_first.log 2>&1; echo "ab rc $?"
grep AB $OUT/ab_walk_first.log | cut -c1-220
for r in 1 2; do for pf in 1 0; do
  SSMKIT_CUDA_DEFINES="SSD_TF32_BWD_PREFETCH=$pf" timeout 100 python3 benchmarks/ab_ssd_switch.py TF32_BWD_WALK 1 True 1 > $OUT/ab_prefetch${pf}_$r.log 2>&1
  echo "prefetch $pf round $r: $(grep AB $OUT/ab_prefetch${pf}_$r.log | cut -c60-220)"
done; done
