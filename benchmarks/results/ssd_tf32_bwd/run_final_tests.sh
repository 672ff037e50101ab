#!/bin/bash
# The final tree's float32 backward GPU tests (the walk, streams, GB rows, the rules)
pip install -q --no-index --no-deps --target /tmp/np .whl/numpy-*.whl 2>/dev/null
export PYTHONPATH=/tmp/np:$PWD
timeout 70 python3 -c "from ssmkit._gpu import ssd; ssd.warmup((('float32', 'float32'),))" > $OUT/warmup.log 2>&1; echo "warmup rc $?"
timeout 100 python3 -m pytest -q -m gpu tests/test_ssd.py -p no:cacheprovider -k "float32_backward or walk or float32_forward" > $OUT/pytest_final.log 2>&1; echo "pytest rc $?"; tail -3 $OUT/pytest_final.log
