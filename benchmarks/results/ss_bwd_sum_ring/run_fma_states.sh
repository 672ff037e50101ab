#!/usr/bin/env bash
# The ring backward summary (bwd_sum_ring, TUNING knob) and the summary passes' decays on the
# FMA pipe (SSM_SUM_FMA_STATES 0/1/2 via SSMKIT_CUDA_DEFINES), long rows; kernel times; GPU tests.
set -u
cd "$(dirname "$0")"
pip install -q --no-index --no-deps --target /tmp/np .whl/numpy-*.whl 2>/dev/null
O=$OUT/sumring; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv > $O/nvidia_smi.txt 2>&1
cd b; export PYTHONPATH=/tmp/np:$PWD PYTHONUNBUFFERED=1
rows="2 3"
tune() { timeout 150 python3 benchmarks/tune_selective_scan.py "$@"; }
# warm-up: compile every variant once (in parallel)
for s in 0 1 2; do (SSMKIT_CUDA_DEFINES="SSM_SUM_FMA_STATES=$s" tune '{}' --rows 2 > $O/warm_$s.log 2>&1) & done; wait
for r in 1 2; do
  for s in $( [ $r = 1 ] && echo "0 1 2" || echo "2 1 0" ); do
    echo "== SSM_SUM_FMA_STATES=$s round $r" >> $O/ab.log
    if [ $s = 0 ]; then v='{"bwd_sum_ring": false}'; else v=''; fi
    SSMKIT_CUDA_DEFINES="SSM_SUM_FMA_STATES=$s" tune '{}' $v --rows $rows $( [ $s = 0 ] && [ $r = 1 ] && echo --check ) 2>&1 | grep -E '^\||max' | grep -v -- '---' >> $O/ab.log
  done
done
cat $O/ab.log
for s in 0 1; do for r in "bfloat16 2 1536 32768 16" "float32 2 1536 32768 16"; do
  tag=$(echo $r | tr ' ' _)_fma$s
  SSMKIT_CUDA_DEFINES="SSM_SUM_FMA_STATES=$s" timeout 100 ncu --clock-control none --metrics gpu__time_duration.sum --csv python3 benchmarks/profile_selective_scan.py $r > $O/k_$tag.csv 2> $O/k_$tag.err
  python3 benchmarks/ncu_kernel_times.py $O/k_$tag.csv --rounds 2 > $O/kernels_$tag.txt 2>&1
done; done
grep -H "sum\|total" $O/kernels_*.txt
timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE -n 8 tests/test_selective_scan.py tests/test_layers.py > $O/pytest_gpu.log 2>&1; echo "exit $?" >> $O/pytest_gpu.log
SSMKIT_CUDA_DEFINES="SSM_SUM_FMA_STATES=1" timeout 120 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE -n 8 tests/test_selective_scan.py -k "segment or ring or long" > $O/pytest_gpu_fma1.log 2>&1; echo "exit $?" >> $O/pytest_gpu_fma1.log
tail -3 $O/pytest_gpu.log $O/pytest_gpu_fma1.log
