#!/usr/bin/env bash
# usage: run_ab.sh LABEL ROWS...   (trees a = before, b = after under .rec/)
set -u
cd "$(dirname "$0")"
pip install -q --no-index --no-deps --target /tmp/np .whl/numpy-*.whl
label=$1; shift
rows="$*"
O=$OUT/$label; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv > $O/nvidia_smi.txt 2>&1
for t in a b; do
  (cd $t && PYTHONPATH=/tmp/np:$PWD timeout 250 python3 benchmarks/tune_selective_scan.py '{}' --rows $rows > $O/warm_$t.log 2>&1) &
  (cd $t && PYTHONPATH=/tmp/np:$PWD timeout 250 python3 benchmarks/ab_ssd_trees.py warm float32 > $O/warm_ssd_$t.log 2>&1) &
done
(cd b && PYTHONPATH=/tmp/np:$PWD timeout 300 python3 -m pytest -m gpu -q -p no:cacheprovider -n 10 tests/test_selective_scan.py tests/test_layers.py tests/test_ssd.py tests/test_ssd_chunked.py > $O/pytest_b.log 2>&1; echo "pytest exit $?" >> $O/pytest_b.log)
wait
for r in 1 2; do
  for t in $( [ $r = 1 ] && echo "a b" || echo "b a" ); do
    echo "== tree $t round $r" >> $O/ab.log
    (cd $t && PYTHONPATH=/tmp/np:$PWD timeout 200 python3 benchmarks/tune_selective_scan.py '{}' --rows $rows 2>&1 | grep '^|' | grep -v -- '---' ) >> $O/ab.log
    (cd $t && PYTHONPATH=/tmp/np:$PWD timeout 100 python3 benchmarks/ab_ssd_trees.py $t float32 2>&1 | grep ABROW ) >> $O/ab.log
  done
done
tail -3 $O/pytest_b.log
cat $O/ab.log
