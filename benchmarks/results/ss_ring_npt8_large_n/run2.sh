#!/usr/bin/env bash
# After run.sh: 8 states per lane on by default from N 17 (always through the wide kernel, whose
# launch bound of 384 keeps ptxas from capping them at 128 registers). On the GPU:
#   benchmarks/results/ss_ring_npt8_large_n/run2.sh OUT_DIR
# 1. the selective-scan, layer and compile GPU tests (pytest_gpu.log);
# 2. tune_selective_scan.py: 4 states per lane (both knobs null) against the default, 2 rounds
#    in alternating order, outputs compared (tune.log): rows 4, 5, 0 (control), float32 N 32,
#    float32 2x1536x32768 N 64 (long: time split or not);
# 4. the summaries at 8 states per lane at N 16 (2 lanes a channel; the main passes at 4): '{}'
#    against the forward's ('{"fwd_sum_npt8_min_n": 9}') and the backward's, the long rows 2
#    and 3 (tune_sum.log);
# 3. bench_selective_scan.py, the whole table (bench_selective_scan.log; its .json and .md
#    into OUT_DIR).
set -u
O=${1:?usage: run2.sh OUT_DIR}; mkdir -p "$O"
cd "$(dirname "$0")/../../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$O/nvidia_smi.txt" 2>&1
cat "$O/nvidia_smi.txt"
timeout 100 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE -n 12 \
    tests/test_selective_scan.py tests/test_layers.py tests/test_cuda_compile.py > "$O/pytest_gpu.log" 2>&1
tail -3 "$O/pytest_gpu.log"
timeout 130 python3 benchmarks/tune_selective_scan.py '{"fwd_ring_npt8_min_n": null, "fwd_sum_npt8_min_n": null}' '{}' \
    --rows 4 5 0 7 8 --shape float32,8,1536,2048,32 --shape float32,2,1536,32768,64 \
    --rounds 2 --check --summary > "$O/tune.log" 2>&1
timeout 110 python3 benchmarks/bench_selective_scan.py --out "$O" > "$O/bench_selective_scan.log" 2>&1
timeout 60 python3 benchmarks/tune_selective_scan.py '{}' '{"fwd_sum_npt8_min_n": 9}' '{"bwd_sum_npt8_min_n": 9}' \
    --rows 2 3 \
    --rounds 2 --check --summary > "$O/tune_sum.log" 2>&1
sed -n '/^Fastest round/,/^variants/p' "$O/tune.log" "$O/tune_sum.log"; tail -n 12 "$O"/selective_scan_*.md
