#!/usr/bin/env bash
# a = a30a492; b = + the ring backward's dB/dC warp sum reading rows B_n, C_n per warp.
# A/B of the defaults; the summary sub-segments 2 / 4 / 8 in tree b on the long rows; the
# bench table of tree a.
set -u
cd "$(dirname "$0")"
pip install -q --no-index --no-deps --target /tmp/np .whl/numpy-*.whl 2>/dev/null
export PYTHONPATH=/tmp/np
bash ab_selective_scan_trees.sh a b /tmp/o > /tmp/o_short.txt 2>&1
(cd b && PYTHONPATH=/tmp/np:$PWD timeout 200 python3 benchmarks/tune_selective_scan.py '{}' '{"sum_split": 2}' '{"sum_split": 8}' \
  --rows 2 3 --rounds 2 --summary > /tmp/o/tune_split.log 2>&1)
mkdir -p /tmp/o/bench
(cd a && PYTHONPATH=/tmp/np:$PWD SSMKIT_COMMIT=$(cat COMMIT) timeout 260 python3 benchmarks/bench_selective_scan.py --out /tmp/o/bench > /tmp/o/bench/bench.log 2>&1)
cp /tmp/o_short.txt /tmp/o/short.txt
tar -C /tmp/o -czf $OUT/o.tgz .
grep -A12 'tree a round 1' /tmp/o/ab.log | head -0; cat /tmp/o/ab.log | tail -n 12; tail -n 5 /tmp/o/tune_split.log; tail -n 12 /tmp/o/bench/bench.log; tail -n 2 /tmp/o/pytest_b.log
