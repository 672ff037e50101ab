#!/usr/bin/env bash
# The ring backward's summary pass (bwd_sum_ring) against ssm_scan_bwd_sum in one process
# (TUNING knob, --check), then the bench table and the GPU tests; logs packed in one archive.
set -u
cd "$(dirname "$0")"
pip install -q --no-index --no-deps --target /tmp/np .whl/numpy-*.whl 2>/dev/null
O=/tmp/o3; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv > $O/nvidia_smi.txt 2>&1
cd b; export PYTHONPATH=/tmp/np:$PWD PYTHONUNBUFFERED=1
timeout 200 python3 benchmarks/tune_selective_scan.py '{}' '{"bwd_sum_ring": false}' --rows 2 3 --rounds 2 --check --summary > $O/ab_sum_ring.log 2>&1
SSMKIT_COMMIT=$(cat COMMIT) timeout 200 python3 benchmarks/bench_selective_scan.py --out $O > $O/bench_selective_scan.log 2>&1
timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE -n 8 tests/test_selective_scan.py tests/test_layers.py > $O/pytest_gpu.log 2>&1; echo "exit $?" >> $O/pytest_gpu.log
tar -C $O -czf $OUT/o3.tgz .
tail -n 8 $O/ab_sum_ring.log; tail -n 12 $O/bench_selective_scan.log; tail -n 3 $O/pytest_gpu.log
