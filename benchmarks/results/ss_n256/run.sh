#!/usr/bin/env bash
set -u
cd "$(dirname "$0")"
pip install -q --no-index --no-deps --target /tmp/np .whl/numpy-*.whl 2>/dev/null
O=$OUT/n256; mkdir -p $O
args="--shape float32,8,1536,2048,256 --shape bfloat16,8,1536,2048,256 --rows 7 8"
for t in a b; do
  (cd $t && PYTHONPATH=/tmp/np:$PWD timeout 150 python3 benchmarks/tune_selective_scan.py '{}' $args > $O/warm_$t.log 2>&1) &
done
wait
for r in 1 2; do
  for t in $( [ $r = 1 ] && echo "a b" || echo "b a" ); do
    echo "== tree $t round $r" >> $O/ab.log
    (cd $t && PYTHONPATH=/tmp/np:$PWD timeout 80 python3 benchmarks/tune_selective_scan.py '{}' $args 2>&1 | grep '^|' | grep -v -- '---' | grep -v "^| row" ) >> $O/ab.log
  done
done
cat $O/ab.log; tail -3 $O/warm_b.log
