#!/usr/bin/env bash
# (On a tree with clusters.patch applied: the library at 742adfd has no TUNING["bwd_ring_cluster"].)
# The shortest form of run.sh, for little device time: clusters of 4 against none at float32
# 8x1536x2048 N 32 (row 7) and N 16 (row 0) (tune.log), then the cluster GPU tests
# (pytest_gpu_cluster.log).   benchmarks/results/ss_bwd_cluster/run_short.sh OUT_DIR
set -u
O=${1:?usage: run_short.sh OUT_DIR}; mkdir -p "$O"
cd "$(dirname "$0")/../../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$O/nvidia_smi.txt" 2>&1
cat "$O/nvidia_smi.txt"
timeout 100 python3 benchmarks/tune_selective_scan.py '{}' '{"bwd_ring_cluster": 4}' \
    --rows 7 0 --shape float32,8,1536,2048,32 --rounds 2 --check --summary > "$O/tune.log" 2>&1
sed -n '/^Fastest round/,$p' "$O/tune.log" | tail -6
timeout 80 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE -n 8 tests/test_selective_scan.py \
    -k "cluster" > "$O/pytest_gpu_cluster.log" 2>&1
tail -2 "$O/pytest_gpu_cluster.log"
