#!/usr/bin/env bash
set -u
cd "$(dirname "$0")"
pip install -q --no-index --no-deps --target /tmp/np .whl/numpy-*.whl 2>/dev/null
export PYTHONPATH=/tmp/np
bash ab_selective_scan_trees.sh a b /tmp/o > /tmp/o_short.txt 2>&1
cp /tmp/o_short.txt /tmp/o/short.txt
tar -C /tmp/o -czf $OUT/o.tgz .
cat /tmp/o_short.txt | tail -n 60
