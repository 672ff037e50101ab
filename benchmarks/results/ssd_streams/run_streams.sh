#!/bin/bash
# GPU tests of the SSD files (state passing after 5f12533, the streams test); TC_STREAMS A/B;
# the adjoint walk's loads-ahead depth 4 against 8 (a process per depth, alternating).
pip install -q --no-index --no-deps --target /tmp/np .whl/numpy-*.whl 2>/dev/null
export PYTHONPATH=/tmp/np:$PWD
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $OUT/nvsmi.txt 2>&1
timeout 60 python3 -c "from ssmkit._gpu import ssd; ssd.warmup()" > $OUT/warmup.log 2>&1; echo "warmup rc $?"
timeout 240 python3 -m pytest -q -m gpu tests/test_ssd.py tests/test_ssd_chunked.py -p no:cacheprovider > $OUT/pytest_ssd.log 2>&1; echo "pytest rc $?"; tail -2 $OUT/pytest_ssd.log
timeout 150 python3 benchmarks/ab_ssd_switch.py TC_STREAMS 3 True,False 1 > $OUT/ab_streams.log 2>&1; echo "ab rc $?"
grep AB $OUT/ab_streams.log | cut -c1-220
for r in 1 2; do for a in 4 8; do
  SSMKIT_CUDA_DEFINES="SSD_ADJ_AHEAD=$a" timeout 100 python3 benchmarks/profile_ssd.py --dtype float32 --reps 7 > $OUT/profile_f32_ahead${a}_$r.log 2>&1
  echo "ahead $a round $r: $(grep adjoint_passing $OUT/profile_f32_ahead${a}_$r.log | head -2 | tr '\n' ' ')"
done; done
