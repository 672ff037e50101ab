#!/bin/bash
# The float32 backward walk (ssd_tf32_bwd): GPU tests, A/B against the chunked kernels, profile.
pip install -q --no-index --no-deps --target /tmp/np .whl/numpy-*.whl 2>/dev/null
export PYTHONPATH=/tmp/np:$PWD
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $OUT/nvsmi.txt 2>&1
timeout 90 python3 -c "from ssmkit._gpu import ssd; ssd.warmup()" > $OUT/warmup.log 2>&1; echo "warmup rc $?"
timeout 240 python3 -m pytest -q -m gpu tests/test_ssd.py tests/test_ssd_chunked.py -p no:cacheprovider -x > $OUT/pytest_ssd.log 2>&1; echo "pytest rc $?"; tail -3 $OUT/pytest_ssd.log
timeout 150 python3 benchmarks/ab_ssd_switch.py TF32_BWD_WALK 3 True,False 1 > $OUT/ab_walk.log 2>&1; echo "ab rc $?"
grep AB $OUT/ab_walk.log | cut -c1-220
timeout 100 python3 benchmarks/profile_ssd.py --dtype float32 --reps 7 > $OUT/profile_float32.log 2>&1
grep "kernel\|ms (median" $OUT/profile_float32.log | head -30
