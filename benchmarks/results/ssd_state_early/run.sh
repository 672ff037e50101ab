#!/usr/bin/env bash
# The 16-bit backward walk's boundary state half staged in shared memory before G's update
# (SSD_MMA_BWD_STATE_EARLY=1, the default of early.patch, which ran at 0699bcd and was not
# kept) against reading it all after the update (=0), on the GPU in one call (apply
# early.patch first):  benchmarks/results/ssd_state_early/run.sh OUT_DIR
# 1. benchmarks/ab_ssd_trees.py in this tree, the define alternating, 3 rounds (ab.log);
# 2. Nsight Compute: ssd_mma_bwd's time and instructions in each form (kernels.txt);
# 3. the SSD GPU tests (pytest_ssd.log).
set -u
O=${1:?usage: run.sh OUT_DIR}; mkdir -p "$O"; O=$(cd "$O" && pwd)
cd "$(dirname "$0")/../../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,driver_version --format=csv > "$O/nvidia_smi.txt" 2>&1; cat "$O/nvidia_smi.txt"
for r in 1 2 3; do
  for v in $([ $r = 2 ] && echo "1 0" || echo "0 1"); do
    SSMKIT_CUDA_DEFINES="SSD_MMA_BWD_STATE_EARLY=$v" timeout 120 python3 benchmarks/ab_ssd_trees.py "early=$v" \
      2>&1 | grep ABROW >> "$O/ab.log"
  done
done
python3 - "$O/ab.log" <<'PY'
import json, sys
rows = [json.loads(l.split("ABROW ", 1)[1]) for l in open(sys.argv[1])]
keys = ["fwd b2b", "fwd+bwd b2b", "fwd+bwd b2b with z"]
print("tree", *keys, sep=" | ")
for r in rows: print(r["tree"], *[r.get(k) for k in keys], sep=" | ")
PY
for v in 0 1; do
  SSMKIT_CUDA_DEFINES="SSD_MMA_BWD_STATE_EARLY=$v" timeout 100 ncu --clock-control none -k regex:ssd_mma_bwd \
    --metrics gpu__time_duration.sum,smsp__inst_executed.sum --csv \
    python3 benchmarks/profile_ssd_launch.py bfloat16 > "$O/k.csv" 2> /dev/null
  echo "== early=$v" >> "$O/kernels.txt"; python3 benchmarks/ncu_kernel_times.py "$O/k.csv" --rounds 2 >> "$O/kernels.txt" 2>&1
done
rm -f "$O/k.csv"; cat "$O/kernels.txt" | cut -c1-200
timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE -n 12 tests/test_ssd.py > "$O/pytest_ssd.log" 2>&1
echo "exit $?" >> "$O/pytest_ssd.log"; tail -n 2 "$O/pytest_ssd.log"
