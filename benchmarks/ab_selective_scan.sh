#!/usr/bin/env bash
# A/B of the selective-scan forward's tile staging on the GPU: the cp.async kernels (the next
# tile copied into a second shared buffer while this one is scanned; TUNING["fwd_async"] True,
# the default) against the kernels that stage straight from global memory (False).
#
#   benchmarks/ab_selective_scan.sh OUT_DIR
#
# 1. the selective-scan GPU tests (they run the default, cp.async, forward), log in
#    OUT_DIR/pytest_selective_scan.log;
# 2. both forwards timed in the same run on rows 0 1 2 5 of bench_selective_scan.TABLE
#    (float32 / bfloat16 8x1536x2048 N16, bfloat16 2x1536x32768 N16, float32 8x1536x2048 N128),
#    forward and forward+backward, two rounds in alternating order, with y and the u, delta,
#    B, C gradients of the two compared (they should agree to rounding, in fact bit for bit);
#    full table in OUT_DIR/ab_selective_scan.md. The short table comes last.
set -u
out=${1:?usage: benchmarks/ab_selective_scan.sh OUT_DIR}
mkdir -p "$out"
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
start=$(date +%s)
# Compile the timed rows' kernels (both forwards, the backward, the carry) into CuPy's disk cache
# in the background, one process per (dtype, N), while the tests run: the timing step then loads
# them instead of compiling them one after another.
for cfg in "float32 16" "bfloat16 16" "float32 128"; do
    python3 - $cfg > "$out/precompile_${cfg// /_}.log" 2>&1 <<'PY' &
import sys
from ssmkit._gpu import compiler, selective_scan as ss
io, N = sys.argv[1], int(sys.argv[2])
npt, nsplit = ss.state_split(N)
keys = [ss.KernelKey(k, io, io, npt, nsplit, True, True)
        for k in ("fwd", "fwd_sum", "fwd_direct", "fwd_sum_direct", "bwd", "bwd_sum")]
keys.append(ss.KernelKey("carry", "float32", "float32", 0, 0, False, False))
for key in keys:
    compiler.get_kernel(ss.SOURCE_FILE, ss.name_expression(key))
print("compiled", len(keys))
PY
done
par=()
python3 -c "import xdist" 2>/dev/null && par=(-n 8)
timeout 90 python3 -m pytest -m gpu -q -p no:cacheprovider ${par[@]+"${par[@]}"} tests/test_selective_scan.py \
    2>&1 | tee "$out/pytest_selective_scan.log" | tail -n 15
echo "pytest exit ${PIPESTATUS[0]} after $(( $(date +%s) - start )) s"
wait  # the compiles
timeout 55 python3 benchmarks/tune_selective_scan.py '{"fwd_async": false}' '{"fwd_async": true}' \
    --rows 0 1 2 5 --rounds 2 --check --summary > "$out/ab_selective_scan.md" 2>&1
rc=$?
echo "A/B exit $rc after $(( $(date +%s) - start )) s (v0: direct staging, v1: cp.async)"
echo "pytest: $(grep -E '(passed|failed|error)' "$out/pytest_selective_scan.log" | tail -n 1)"
if [ $rc -eq 0 ]; then
    sed -n '/^Fastest round/,$p' "$out/ab_selective_scan.md"
else
    tail -n 30 "$out/ab_selective_scan.md"
fi
