#!/usr/bin/env bash
# causal_conv1d on a GPU machine: the GPU tests, then the benchmark with its A/B columns
# (old structure / resident grid without read-ahead / the library). Logs go to OUT_DIR; the
# last lines printed are the A/B table.
# Usage: benchmarks/ab_causal_conv1d.sh OUT_DIR
set -uo pipefail
out=${1:?usage: benchmarks/ab_causal_conv1d.sh OUT_DIR}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv \
    > "$out/nvidia_smi.txt" 2>&1
python3 -c "import cupy, numpy; print('cupy', cupy.__version__, 'numpy', numpy.__version__)" \
    | tee "$out/versions.txt"
# The GPU tests are mostly NVRTC compiles: spread them over the cores when pytest-xdist is there.
par=()
python3 -c "import xdist" 2>/dev/null && par=(-n "${SSMKIT_TEST_WORKERS:-12}")
python3 -c "import pytest_timeout" 2>/dev/null && par+=(--timeout 120)
start=$(date +%s)
python3 -m pytest -m gpu -q -p no:cacheprovider -rfE --durations=8 "${par[@]}" \
    tests/test_causal_conv1d.py 2>&1 | tee "$out/pytest_gpu_causal_conv1d.log"
echo "pytest -m gpu exit status: ${PIPESTATUS[0]} ($(( $(date +%s) - start )) s)" \
    | tee -a "$out/pytest_gpu_causal_conv1d.log"
start=$(date +%s)
python3 benchmarks/bench_causal_conv1d.py --out "$out" > "$out/bench_causal_conv1d.log" 2>&1
status=$?
grep -v '^{' "$out/bench_causal_conv1d.log" | tail -n 40
echo "bench exit status: $status ($(( $(date +%s) - start )) s)"
echo "pytest: $(grep -E 'passed|failed|error' "$out/pytest_gpu_causal_conv1d.log" | tail -n 1)"
