#!/usr/bin/env bash
# A/B of the B/C piece order (a = before, b = rows in octets, padded raw rows): N16 rows,
# shared-memory wavefronts of one bf16 forward+backward, GPU tests of b; logs in one archive.
set -u
cd "$(dirname "$0")"
pip install -q --no-index --no-deps --target /tmp/np .whl/numpy-*.whl 2>/dev/null
O=/tmp/o4; mkdir -p $O
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
for t in a b; do for dt in bfloat16 float32; do
  (cd $t && PYTHONPATH=/tmp/np:$PWD timeout 120 ncu --clock-control none -k regex:ssm_scan --metrics $M --csv python3 benchmarks/profile_selective_scan.py $dt 8 1536 2048 16 > $O/k_${t}_$dt.csv 2> $O/k_${t}_$dt.err
   python3 benchmarks/ncu_kernel_times.py $O/k_${t}_$dt.csv --rounds 2 > $O/kernels_${t}_$dt.txt 2>&1)
done; done
cd b; export PYTHONPATH=/tmp/np:$PWD PYTHONUNBUFFERED=1
timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE -n 8 tests/test_selective_scan.py tests/test_layers.py > $O/pytest_gpu.log 2>&1; echo "exit $?" >> $O/pytest_gpu.log
tar -C $O -czf $OUT/o4.tgz .
cat $O/ab.log; cat $O/kernels_*.txt; tail -n 3 $O/pytest_gpu.log
