#!/usr/bin/env bash
# States per thread of the ring forward kernels (TUNING["ring_npt"]): 4 (as before), 2, 1,
# and 2 / 1 with the time split only below 30% of a wave (seg_min_fill 0.3).
set -u
pip install -q --no-index --no-deps --target /tmp/np .whl/numpy-*.whl 2>/dev/null
export PYTHONPATH=/tmp/np:$PWD
O=$OUT/x; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv > $O/nvidia_smi.txt 2>&1
timeout 480 python3 benchmarks/tune_selective_scan.py '{}' '{"ring_npt": 2}' '{"ring_npt": 1}' \
  '{"ring_npt": 2, "seg_min_fill": 0.3}' '{"ring_npt": 1, "seg_min_fill": 0.3}' \
  --rows 0 1 2 3 6 --rounds 2 --check --summary > $O/tune.log 2>&1
tar -czf $OUT/x.tgz -C $OUT x
tail -n 25 $O/tune.log
