#!/usr/bin/env bash
# A/B of the ring staging change (a = before, b = after), then in b: the selective-scan bench
# table and every GPU test.
set -u
cd "$(dirname "$0")"
pip install -q --no-index --no-deps --target /tmp/np .whl/numpy-*.whl 2>/dev/null
O=$OUT/final; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv > $O/nvidia_smi.txt 2>&1
rows="0 1 2 6"
for t in a b; do
  (cd $t && PYTHONPATH=/tmp/np:$PWD timeout 150 python3 benchmarks/tune_selective_scan.py '{}' --rows $rows > $O/warm_$t.log 2>&1) &
done
wait
for r in 1 2; do
  for t in $( [ $r = 1 ] && echo "a b" || echo "b a" ); do
    echo "== tree $t round $r" >> $O/ab.log
    (cd $t && PYTHONPATH=/tmp/np:$PWD timeout 100 python3 benchmarks/tune_selective_scan.py '{}' --rows $rows 2>&1 | grep '^|' | grep -v -- '---' | grep -v "^| row" ) >> $O/ab.log
  done
done
cat $O/ab.log
cd b; export PYTHONPATH=/tmp/np:$PWD PYTHONUNBUFFERED=1
SSMKIT_COMMIT=$(cat COMMIT) timeout 200 python3 benchmarks/bench_selective_scan.py --out $O > $O/bench_selective_scan.log 2>&1
timeout 240 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE -n 12 --timeout 200 > $O/pytest_gpu.log 2>&1; echo "pytest -m gpu exit status: $?" >> $O/pytest_gpu.log
tail -12 $O/bench_selective_scan.log; tail -3 $O/pytest_gpu.log
