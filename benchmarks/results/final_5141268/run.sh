#!/usr/bin/env bash
# The selective-scan/layer GPU tests, then the bench table, at the commit in a/COMMIT.
set -u
cd "$(dirname "$0")/a"
pip install -q --no-index --no-deps --target /tmp/np ../.whl/numpy-*.whl 2>/dev/null
export PYTHONPATH=/tmp/np:$PWD
O=/tmp/o10; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv > $O/nvidia_smi.txt 2>&1
timeout 110 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE -n 8 tests/test_selective_scan.py tests/test_layers.py > $O/pytest.log 2>&1; echo "exit $?" >> $O/pytest.log
SSMKIT_COMMIT=$(cat COMMIT) timeout 170 python3 benchmarks/bench_selective_scan.py --out $O > $O/bench.log 2>&1
tar -C $O -czf $OUT/o.tgz .
tail -n 2 $O/pytest.log; tail -n 10 $O/bench.log
