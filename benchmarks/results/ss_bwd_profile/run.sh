#!/usr/bin/env bash
# Where the float32 ring backward's shared-memory bank conflicts are: Nsight Compute's source
# page (CUDA + SASS, line information) of one ssm_scan_bwd_ring launch, and its memory tables.
set -u
cd "$(dirname "$0")"
pip install -q --no-index --no-deps --target /tmp/np .whl/numpy-*.whl 2>/dev/null
O=/tmp/o7; mkdir -p $O
cd b; export PYTHONPATH=/tmp/np:$PWD SSMKIT_LINEINFO=1 CUPY_CACHE_DIR=/tmp/cupy_li
timeout 150 ncu --clock-control none -k regex:ssm_scan_bwd_ring --launch-skip 1 --launch-count 1 --section SourceCounters --section MemoryWorkloadAnalysis_Tables --page source --print-source cuda,sass --csv python3 benchmarks/profile_selective_scan.py float32 8 1536 2048 16 > $O/src_bwd_f32.csv 2> $O/ncu.err
timeout 100 ncu --clock-control none -k regex:ssm_scan_bwd_ring --launch-skip 1 --launch-count 1 --section MemoryWorkloadAnalysis_Tables python3 benchmarks/profile_selective_scan.py float32 8 1536 2048 16 > $O/tables_bwd_f32.txt 2>&1
ls -la $O; head -c 600 $O/src_bwd_f32.csv; grep -n -i "bank\|wavefront" $O/tables_bwd_f32.txt | head
tar -C $O -czf $OUT/o7.tgz .
