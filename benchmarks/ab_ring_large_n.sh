#!/usr/bin/env bash
# A/B of the selective-scan forward for N > 16 on the GPU: the ring forward (4 states per lane
# on up to 32 lanes per channel; the default, TUNING["fwd_ring_max_n"] 128) against ssm_scan_fwd
# (8 states per lane on 16 lanes; fwd_ring_max_n 16).
#
#   benchmarks/ab_ring_large_n.sh OUT_DIR
#
# 1. the selective-scan and layer GPU tests (the ring forward taking N up to 128), log in
#    OUT_DIR/pytest.log;
# 2. both forwards timed in the same run, forward and forward+backward, two rounds in
#    alternating order, y and the u, delta, B, C gradients compared: rows 4 and 5 of
#    bench_selective_scan.TABLE (float32 8x1536x2048 N 64 and 128), the N 16 rows 0 and 6
#    (unchanged: a control), and N 32 / 64 / 128 at other dtypes and sizes. A third variant
#    also takes the backward by state slices from N 17 (default 65) with the ring forward: the
#    float32 N 24 / 32 / 48 / 64 rows' backward as 2 / 2 / 3 / 4 slices against ssm_scan_bwd.
#    Full table in OUT_DIR/tune.log; the summary comes last.
set -u
out=${1:?usage: benchmarks/ab_ring_large_n.sh OUT_DIR}
mkdir -p "$out"
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
par=()
python3 -c "import xdist" 2>/dev/null && par=(-n "${SSMKIT_TEST_WORKERS:-12}")
python3 -c "import pytest_timeout" 2>/dev/null && par+=(--timeout 300)
python3 -m pytest -m gpu -q -p no:cacheprovider -rfE "${par[@]}" \
    tests/test_selective_scan.py tests/test_layers.py > "$out/pytest.log" 2>&1
tail -3 "$out/pytest.log"
python3 benchmarks/tune_selective_scan.py '{"fwd_ring_max_n": 16}' '{}' \
    '{"bwd_state_slices_from": 17}' --rows 4 5 0 6 7 8 9 10 \
    --shape float32,8,1536,2048,32 --shape bfloat16,8,1536,2048,64 \
    --shape float32,2,1536,2048,128 --shape bfloat16,2,1536,8192,128 \
    --shape float32,8,1536,2048,24 --shape float32,8,1536,2048,48 \
    --rounds 2 --check --summary > "$out/tune.log" 2>&1
sed -n '/^Fastest round/,$p' "$out/tune.log"
