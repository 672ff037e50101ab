#!/usr/bin/env bash
# usage: run_abc.sh LABEL ROWS...   (trees a, b, c under .rec/)
set -u
cd "$(dirname "$0")"
pip install -q --no-index --no-deps --target /tmp/np .whl/numpy-*.whl 2>/dev/null
label=$1; shift
rows="$*"
O=$OUT/$label; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv > $O/nvidia_smi.txt 2>&1
for t in a b c; do
  (cd $t && PYTHONPATH=/tmp/np:$PWD timeout 250 python3 benchmarks/tune_selective_scan.py '{}' --rows $rows > $O/warm_$t.log 2>&1) &
done
for t in b c; do
(cd $t && PYTHONPATH=/tmp/np:$PWD timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider -n 8 tests/test_selective_scan.py tests/test_layers.py > $O/pytest_$t.log 2>&1; echo "pytest exit $?" >> $O/pytest_$t.log)
done
wait
for r in 1 2; do
  for t in $( [ $r = 1 ] && echo "a b c" || echo "c b a" ); do
    echo "== tree $t round $r" >> $O/ab.log
    (cd $t && PYTHONPATH=/tmp/np:$PWD timeout 200 python3 benchmarks/tune_selective_scan.py '{}' --rows $rows 2>&1 | grep '^|' | grep -v -- '---' | grep -v "^| row" ) >> $O/ab.log
  done
done
tail -2 $O/pytest_b.log $O/pytest_c.log
cat $O/ab.log
cd b; export PYTHONPATH=/tmp/np:$PWD
timeout 60 ncu --clock-control none -k regex:ssm_scan_fwd_ring --launch-skip 2 --launch-count 1 --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables python3 benchmarks/profile_selective_scan.py bfloat16 8 1536 2048 16 fwd > $O/details_fwd_ring_bf16.txt 2>&1
timeout 60 ncu --clock-control none -k regex:ssm_scan_fwd --launch-skip 2 --launch-count 1 --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables python3 benchmarks/profile_selective_scan.py float32 8 1536 2048 128 fwd > $O/details_fwd_n128.txt 2>&1
grep -E "^  [a-z]|Duration|L1/TEX Cache Throughput|Issue Slots Busy" $O/details_*.txt | cut -c1-150
