#!/usr/bin/env bash
# a = e4e17c1; b = + the ring backward's u/delta/z/dout copies and du/ddelta/dz rows in one walk,
# the ring summaries in sub-segments (TUNING sum_split, default 1) and the forward summary's
# own tiles (fwd_sum_tiles, default off): A/B of the defaults, then the knobs in tree b.
set -u
cd "$(dirname "$0")"
pip install -q --no-index --no-deps --target /tmp/np .whl/numpy-*.whl 2>/dev/null
export PYTHONPATH=/tmp/np
bash ab_selective_scan_trees.sh a b /tmp/o > /tmp/o_short.txt 2>&1
cd b
PYTHONPATH=/tmp/np:$PWD timeout 300 python3 benchmarks/tune_selective_scan.py '{}' '{"sum_split": 2}' '{"sum_split": 3}' '{"sum_split": 4}' \
  '{"fwd_sum_tiles": true}' '{"sum_split": 2, "fwd_sum_tiles": true}' '{"sum_split": 4, "fwd_sum_tiles": true}' \
  --rows 2 3 --rounds 2 --check --summary > /tmp/o/tune_split.log 2>&1
cp /tmp/o_short.txt /tmp/o/short.txt
tar -C /tmp/o -czf $OUT/o.tgz .
tail -n 30 /tmp/o_short.txt; tail -n 6 /tmp/o/tune_split.log
