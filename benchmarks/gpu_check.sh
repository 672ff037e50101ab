#!/usr/bin/env bash
# One pass on a GPU machine: the GPU tests, then the selective-scan benchmark table.
# Usage: benchmarks/gpu_check.sh RESULTS_DIR   (logs and result files are written there)
set -uo pipefail
out=${1:?usage: benchmarks/gpu_check.sh RESULTS_DIR}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv \
    > "$out/nvidia_smi.txt" 2>&1
python3 -c "import cupy, numpy, numba; print('cupy', cupy.__version__, 'numpy', numpy.__version__, 'numba', numba.__version__)" \
    | tee "$out/versions.txt"
python3 -m pytest -m gpu -q -p no:cacheprovider 2>&1 | tee "$out/pytest_gpu.log"
echo "pytest -m gpu exit status: ${PIPESTATUS[0]}" | tee -a "$out/pytest_gpu.log"
python3 benchmarks/bench_selective_scan.py --out "$out" "${@:2}" 2>&1 | tee "$out/bench.log"
