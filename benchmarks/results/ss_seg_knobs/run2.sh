#!/usr/bin/env bash
# f2f2019 + the ring forward's segments at 1 wave (fwd_ring_seg_waves) and the backward's at
# least 8192 steps (bwd_min_seg_steps): against the old values and other summary splits, the
# long rows; the selective-scan and layer GPU tests.
set -u
cd "$(dirname "$0")"
pip install -q --no-index --no-deps --target /tmp/np .whl/numpy-*.whl 2>/dev/null
mkdir -p /tmp/o
cd b
PYTHONPATH=/tmp/np:$PWD timeout 300 python3 benchmarks/tune_selective_scan.py '{}' '{"fwd_ring_seg_waves": 2.0, "bwd_min_seg_steps": 4096}' \
  '{"sum_split": 2}' '{"sum_split": 8}' --rows 2 3 --rounds 2 --check --summary > /tmp/o/tune_seg2.log 2>&1
PYTHONPATH=/tmp/np:$PWD timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE -n 8 tests/test_selective_scan.py tests/test_layers.py > /tmp/o/pytest.log 2>&1; echo "exit $?" >> /tmp/o/pytest.log
tar -C /tmp/o -czf $OUT/o.tgz .
tail -n 6 /tmp/o/tune_seg2.log; tail -n 2 /tmp/o/pytest.log
