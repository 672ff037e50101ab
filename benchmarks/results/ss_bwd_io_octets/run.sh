#!/usr/bin/env bash
# A/B of the ring backward's u, delta, z, dout rows copied in and du, ddelta, dz out in octets of rows (a = before, b = after), N16
# rows; shared-memory wavefronts in b; the bench table and GPU tests of b; one archive.
set -u
cd "$(dirname "$0")"
pip install -q --no-index --no-deps --target /tmp/np .whl/numpy-*.whl 2>/dev/null
O=/tmp/o8; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv > $O/nvidia_smi.txt 2>&1
rows="0 1 2 3 6"
for t in a b; do
  (cd $t && PYTHONPATH=/tmp/np:$PWD timeout 200 python3 benchmarks/tune_selective_scan.py '{}' --rows 0 2 > $O/warm_$t.log 2>&1) &
done
wait
for r in 1 2; do
  for t in $( [ $r = 1 ] && echo "a b" || echo "b a" ); do
    echo "== tree $t round $r" >> $O/ab.log
    (cd $t && PYTHONPATH=/tmp/np:$PWD timeout 150 python3 benchmarks/tune_selective_scan.py '{}' --rows $rows 2>&1 | grep '^|' | grep -v -- '---' | grep -v "^| row" ) >> $O/ab.log
  done
done
M=gpu__time_duration.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,smsp__inst_executed.sum
cd b; export PYTHONPATH=/tmp/np:$PWD PYTHONUNBUFFERED=1
for dt in float32; do
  timeout 120 ncu --clock-control none -k regex:ssm_scan_bwd_ring --metrics $M --csv python3 benchmarks/profile_selective_scan.py $dt 8 1536 2048 16 > $O/k_b_$dt.csv 2> $O/k_b_$dt.err
  python3 benchmarks/ncu_kernel_times.py $O/k_b_$dt.csv --rounds 2 > $O/kernels_b_$dt.txt 2>&1
done

timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE -n 8 tests/test_selective_scan.py tests/test_layers.py > $O/pytest_gpu.log 2>&1; echo "exit $?" >> $O/pytest_gpu.log
tar -C $O -czf $OUT/o8.tgz .
cat $O/ab.log; cat $O/kernels_b_*.txt; tail -n 12 $O/bench_selective_scan.log; tail -n 3 $O/pytest_gpu.log
