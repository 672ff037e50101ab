#!/usr/bin/env bash
# One pass on a GPU machine: every GPU test, then the benchmarks named.
# Usage: benchmarks/gpu_check.sh RESULTS_DIR [OP ...]
#   OP is an operation with a benchmarks/bench_OP.py (selective_scan, ssd, state_update,
#   causal_conv1d, linear_scan); default: selective_scan. Logs and result files go to RESULTS_DIR.
set -uo pipefail
out=${1:?usage: benchmarks/gpu_check.sh RESULTS_DIR [OP ...]}
shift
ops=("$@")
[ ${#ops[@]} -eq 0 ] && ops=(selective_scan)
mkdir -p "$out"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv \
    > "$out/nvidia_smi.txt" 2>&1
python3 -c "import cupy, numpy, numba; print('cupy', cupy.__version__, 'numpy', numpy.__version__, 'numba', numba.__version__)" \
    | tee "$out/versions.txt"
# Most of a GPU test run is kernel compiles (NVRTC and Numba), which are CPU work: spread the
# tests over the machine's cores when pytest-xdist is there, with a per-test time limit.
par=()
python3 -c "import xdist" 2>/dev/null && par=(-n "${SSMKIT_TEST_WORKERS:-12}")
python3 -c "import pytest_timeout" 2>/dev/null && par+=(--timeout 300)
python3 -m pytest -m gpu -q -p no:cacheprovider -rfE --durations=15 "${par[@]}" 2>&1 | tee "$out/pytest_gpu.log"
echo "pytest -m gpu exit status: ${PIPESTATUS[0]}" | tee -a "$out/pytest_gpu.log"
for op in "${ops[@]}"; do
    python3 "benchmarks/bench_$op.py" --out "$out" 2>&1 | tee "$out/bench_$op.log"
done
