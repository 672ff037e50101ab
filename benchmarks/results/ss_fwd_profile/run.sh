#!/usr/bin/env bash
set -u
cd "$(dirname "$0")"
pip install -q --no-index --no-deps --target /tmp/np .whl/numpy-*.whl 2>/dev/null
O=$OUT/sweep; mkdir -p $O
cd b; export PYTHONPATH=/tmp/np:$PWD
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv > $O/nvidia_smi.txt 2>&1
which ncu > $O/ncu_where.txt 2>&1
prof() {
(export SSMKIT_LINEINFO=1 CUPY_CACHE_DIR=/tmp/cupy_li
 timeout 90 ncu --clock-control none -k regex:ssm_scan_fwd_ring --launch-skip 2 --launch-count 1 --section SourceCounters --section WarpStateStats --page source --print-source cuda,sass --csv python3 benchmarks/profile_selective_scan.py bfloat16 8 1536 2048 16 fwd > $O/src_fwd_bf16.csv 2> $O/ncu_fwd.err
 timeout 90 ncu --clock-control none -k regex:ssm_scan_fwd_ring --launch-skip 2 --launch-count 1 --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis python3 benchmarks/profile_selective_scan.py bfloat16 8 1536 2048 16 fwd > $O/details_fwd_bf16.txt 2>&1
 timeout 90 ncu --clock-control none -k regex:ssm_scan_bwd_ring --launch-skip 1 --launch-count 1 --section SourceCounters --section WarpStateStats --page source --print-source cuda,sass --csv python3 benchmarks/profile_selective_scan.py float32 8 1536 2048 16 > $O/src_bwd_f32.csv 2> $O/ncu_bwd.err
)
}
timeout 330 python3 benchmarks/tune_selective_scan.py '{}' '{"chunk_size": 32}' '{"chunk_size": 64}' '{"chunk_size": 128}' '{"bwd_min_tl": 32}' --rows 0 1 2 6 --rounds 2 --check --summary > $O/tune.log 2>&1
prof
for f in src_fwd_bf16 src_bwd_f32; do python3 benchmarks/ncu_lines.py $O/$f.csv --src cuda_src --top 45 > $O/lines_$f.txt 2>&1; done
ls -la $O; tail -12 $O/tune.log; grep -E "Duration|Issue Slots Busy|Achieved Occupancy|No Eligible|Warp Cycles Per Issued" $O/details_*.txt
