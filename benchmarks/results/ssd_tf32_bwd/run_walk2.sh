#!/bin/bash
# The float32 backward walk: GPU tests (fixed), streams A/B with the walk, shapes sweep.
pip install -q --no-index --no-deps --target /tmp/np .whl/numpy-*.whl 2>/dev/null
export PYTHONPATH=/tmp/np:$PWD
timeout 90 python3 -c "from ssmkit._gpu import ssd; ssd.warmup()" > $OUT/warmup.log 2>&1; echo "warmup rc $?"
timeout 240 python3 -m pytest -q -m gpu tests/test_ssd.py tests/test_ssd_chunked.py -p no:cacheprovider > $OUT/pytest_ssd.log 2>&1; echo "pytest rc $?"; tail -3 $OUT/pytest_ssd.log
timeout 100 python3 benchmarks/ab_ssd_switch.py TC_STREAMS 2 True,False 1 > $OUT/ab_streams_walk.log 2>&1; echo "ab rc $?"
grep AB $OUT/ab_streams_walk.log | cut -c1-220
timeout 200 python3 benchmarks/ssd_fused_shapes.py 2 noz float32 bwd > $OUT/shapes_bwd.log 2>&1; echo "shapes rc $?"
tail -20 $OUT/shapes_bwd.log
