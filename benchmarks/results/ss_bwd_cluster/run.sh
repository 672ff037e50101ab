#!/usr/bin/env bash
# (On a tree with clusters.patch applied: the library at 742adfd has no TUNING["bwd_ring_cluster"].)
# The ring backward in thread block clusters (TUNING bwd_ring_cluster 1, 2, 4). On the GPU:
#   benchmarks/results/ss_bwd_cluster/run.sh OUT_DIR
# 1. the selective-scan GPU tests of the ring kernels, the slices and the clusters
#    (pytest_gpu_ring.log);
# 2. tune_selective_scan.py {} against clusters of 2 and 4 on the table's rows 0, 1, 4 and float32
#    8x1536x2048 N 32 (row 7), 2 rounds, --check (tune.log);
# 3. on an H200 only, bench_selective_scan.py, the whole table, with the cluster size whose
#    forward+backward times had the smallest product in step 2 (SSMKIT_BWD_RING_CLUSTER);
# 4. each kernel's time (ncu, durations only) at float32 8x1536x2048 N 32, without clusters and
#    with that size (kernels_N32_c*.txt);
# 5. the selective-scan and layer GPU tests at the defaults (pytest_gpu.log).
set -u
O=${1:?usage: run.sh OUT_DIR}; mkdir -p "$O"
cd "$(dirname "$0")/../../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$O/nvidia_smi.txt" 2>&1
cat "$O/nvidia_smi.txt"
timeout 100 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE -n 12 tests/test_selective_scan.py \
    -k "cluster or ring or slices" > "$O/pytest_gpu_ring.log" 2>&1
tail -2 "$O/pytest_gpu_ring.log"
timeout 130 python3 benchmarks/tune_selective_scan.py '{}' '{"bwd_ring_cluster": 2}' '{"bwd_ring_cluster": 4}' \
    --rows 0 7 4 1 --shape float32,8,1536,2048,32 \
    --rounds 2 --check --summary > "$O/tune.log" 2>&1
sed -n '/^Fastest round/,$p' "$O/tune.log" | cut -d"|" -f2,3,5,9,13 | tail -13
# the cluster size with the smallest product of forward+backward ratios (1 where none is below)
CS=$(awk -F'|' '/^\| [0-9]+ \|/ && NF >= 15 { p2 += log($9); p4 += log($13) }
     END { c = 1; b = 0; if (p2 < b) { c = 2; b = p2 } if (p4 < b) { c = 4 } print c }' "$O/tune.log")
echo "cluster size kept: $CS" | tee "$O/cluster_kept.txt"
if grep -q H200 "$O/nvidia_smi.txt"; then
  SSMKIT_BWD_RING_CLUSTER=$CS timeout 110 python3 benchmarks/bench_selective_scan.py --out "$O" \
      > "$O/bench_selective_scan.log" 2>&1
  tail -n 9 "$O"/selective_scan_*.md
fi
for cs in $(printf "1\n%s\n" "$CS" | sort -u); do
  SSMKIT_BWD_RING_CLUSTER=$cs timeout 45 ncu --clock-control none --metrics gpu__time_duration.sum --csv \
      python3 benchmarks/profile_selective_scan.py float32 8 1536 2048 32 > "$O/kernels_N32_c$cs.csv" 2> "$O/kernels_N32_c$cs.err"
  python3 benchmarks/ncu_kernel_times.py "$O/kernels_N32_c$cs.csv" --rounds 2 > "$O/kernels_N32_c$cs.txt" 2>&1
  echo "N 32, clusters of $cs"; cut -c1-110 "$O/kernels_N32_c$cs.txt" | tail -12
done
timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE -n 12 \
    tests/test_selective_scan.py tests/test_layers.py > "$O/pytest_gpu.log" 2>&1
tail -2 "$O/pytest_gpu.log"
