#!/bin/bash
# GB_ROWS: GPU tests, A/B, profile, chunk sweep
set -x
pip install -q --no-index --no-deps --target /tmp/np .whl/numpy-*.whl
export PYTHONPATH=/tmp/np:$PWD
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $OUT/nvsmi.txt 2>&1
git log -1 --format=%H > $OUT/commit.txt 2>/dev/null
timeout 200 python3 -m pytest -q -m gpu tests/test_ssd.py tests/test_ssd_cuda_compile.py -x -k "rows_in_gb or matches_reference or cancelling or compile" > $OUT/pytest_gbrows.log 2>&1; echo "pytest rc $?"
tail -3 $OUT/pytest_gbrows.log
timeout 150 python3 benchmarks/ab_ssd_switch.py GB_ROWS 3 True,False 1 > $OUT/ab_gbrows.log 2>&1; echo "ab rc $?"
grep AB $OUT/ab_gbrows.log | cut -c1-220
timeout 120 python3 benchmarks/ssd_chunk_sweep.py 1 2 64,128,256 > $OUT/chunk_sweep.log 2>&1; echo "sweep rc $?"
grep CHUNK $OUT/chunk_sweep.log | cut -c1-220
timeout 240 python3 -c "
import sys, pytest
import ssmkit._gpu.ssd as g
g.GB_ROWS = True
sys.exit(pytest.main(['-q', '-m', 'gpu', 'tests/test_ssd.py', '-x', '-p', 'no:cacheprovider']))
" > $OUT/pytest_ssd_gbrows_on.log 2>&1; echo "pytest on rc $?"
tail -3 $OUT/pytest_ssd_gbrows_on.log
