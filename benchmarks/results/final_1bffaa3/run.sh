#!/usr/bin/env bash
# The bench table and the selective-scan/layer GPU tests at the commit in a/COMMIT.
set -u
cd "$(dirname "$0")/a"
pip install -q --no-index --no-deps --target /tmp/np ../.whl/numpy-*.whl 2>/dev/null
export PYTHONPATH=/tmp/np:$PWD
mkdir -p /tmp/o
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv > /tmp/o/nvidia_smi.txt 2>&1
SSMKIT_COMMIT=$(cat COMMIT) timeout 300 python3 benchmarks/bench_selective_scan.py --out /tmp/o > /tmp/o/bench.log 2>&1
timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE -n 8 tests/test_selective_scan.py tests/test_layers.py > /tmp/o/pytest.log 2>&1; echo "exit $?" >> /tmp/o/pytest.log
tar -C /tmp/o -czf $OUT/o.tgz .
tail -n 10 /tmp/o/bench.log; tail -n 2 /tmp/o/pytest.log
