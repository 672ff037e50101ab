#!/usr/bin/env bash
# The ring summary kernels with ptxas asked for 2 or 3 resident blocks (SSM_RING_SUM_MIN_BLOCKS)
# against none asked, the long rows: each define in its own process, compiled first, then
# timed in 2 rounds, the order reversed in the second.
set -u
cd "$(dirname "$0")"
pip install -q --no-index --no-deps --target /tmp/np .whl/numpy-*.whl 2>/dev/null
O=/tmp/o9; mkdir -p $O
cd b; export PYTHONPATH=/tmp/np:$PWD
for d in 0 2 3; do
  SSMKIT_CUDA_DEFINES="SSM_RING_SUM_MIN_BLOCKS=$d" timeout 240 python3 benchmarks/tune_selective_scan.py '{}' --rows 2 3 > $O/warm_$d.log 2>&1 &
done
wait
for r in 1 2; do
  for d in $([ $r = 1 ] && echo "0 2 3" || echo "3 2 0"); do
    echo "== min blocks $d round $r" >> $O/ab.log
    SSMKIT_CUDA_DEFINES="SSM_RING_SUM_MIN_BLOCKS=$d" timeout 120 python3 benchmarks/tune_selective_scan.py '{}' --rows 2 3 2>&1 \
      | grep '^|' | grep -v -- '---' | grep -v '^| row' >> $O/ab.log
  done
done
tar -C $O -czf $OUT/o.tgz .
cat $O/ab.log
