#!/usr/bin/env bash
# Time-split knobs at f2f2019 (the long rows), after the summaries' sub-segments.
set -u
cd "$(dirname "$0")"
pip install -q --no-index --no-deps --target /tmp/np .whl/numpy-*.whl 2>/dev/null
mkdir -p /tmp/o
cd b
PYTHONPATH=/tmp/np:$PWD timeout 420 python3 benchmarks/tune_selective_scan.py '{}' '{"seg_waves": 3.0}' '{"seg_waves": 1.0}' \
  '{"bwd_min_seg_steps": 2048}' '{"bwd_min_seg_steps": 8192}' '{"min_seg_steps": 2048}' \
  --rows 2 3 --rounds 2 --check --summary > /tmp/o/tune_seg.log 2>&1
tar -C /tmp/o -czf $OUT/o.tgz .
tail -n 8 /tmp/o/tune_seg.log
