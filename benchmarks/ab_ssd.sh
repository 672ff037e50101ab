#!/usr/bin/env bash
# SSD on one GPU: the GPU tests of tests/test_ssd.py, then bench_ssd.py --quick (the peer
# bfloat16 and float32 rows, the bfloat16 forward and backward split into stages), and a
# short table last: this tree against the recorded 05fe5d2 row and mamba_ssm.
# Usage: benchmarks/ab_ssd.sh OUT_DIR        (at most 195 s: 45 + 90 + 60 s time limits)
set -uo pipefail
out=${1:?usage: benchmarks/ab_ssd.sh OUT_DIR}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
export SSMKIT_COMMIT=${SSMKIT_COMMIT:-"HEAD+working tree"}
# Compile every ssd kernel once, in parallel, into CuPy's on-disk cache (the test workers
# would otherwise each compile the ones they meet).
timeout 45 python3 -c "from ssmkit._gpu import ssd; print('ssd kernels compiled:', ssd.warmup())" \
    2>&1 | tail -1 | tee "$out/warmup.log"
par=()
python3 -c "import xdist" 2>/dev/null && par=(-n 8)
python3 -c "import pytest_timeout" 2>/dev/null && par+=(--timeout 80)
timeout 90 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE --durations=8 "${par[@]}" \
    tests/test_ssd.py 2>&1 | tee "$out/pytest_ssd_gpu.log"
echo "pytest exit status: ${PIPESTATUS[0]}" | tee -a "$out/pytest_ssd_gpu.log"
timeout 60 python3 benchmarks/bench_ssd.py --quick --out "$out" 2>&1 | tee "$out/bench_ssd.log"
echo "bench exit status: ${PIPESTATUS[0]}" | tee -a "$out/bench_ssd.log"
python3 - "$out" <<'PY'
import json, os, sys
out = sys.argv[1]
print("\n== ssd A/B (ms) ==")
print("pytest:", [l for l in open(os.path.join(out, "pytest_ssd_gpu.log")).read().splitlines()
                  if " passed" in l or " failed" in l or " error" in l][-1:])
before = {"bfloat16": (3.24, 24.67), "float32": (15.50, 70.88)}  # 05fe5d2, ssd_h200.md
path = os.path.join(out, "ssd_h200.json")
if not os.path.exists(path):
    path = os.path.join(out, "ssd_gpu.json")
rows = json.load(open(path)) if os.path.exists(path) else []
print(f"{'dtype':9s} {'fwd':>7s} {'05fe5d2':>8s} {'mamba':>6s} | {'fwd+bwd':>8s} {'05fe5d2':>8s} {'mamba':>6s}")
for r in rows:
    b = before.get(r["dtype"], (None, None))
    f = lambda v: "-" if v is None else f"{v:.3f}"
    print(f"{r['dtype']:9s} {f(r['fwd_ms']):>7s} {f(b[0]):>8s} {f(r['mamba_ssm_fwd_ms']):>6s} | "
          f"{f(r['fwd_bwd_ms']):>8s} {f(b[1]):>8s} {f(r['mamba_ssm_fwd_bwd_ms']):>6s}")
for line in open(os.path.join(out, "bench_ssd.log")).read().splitlines():
    if line.startswith('{"forward stages') or line.startswith('{"backward stages'):
        k, v = next(iter(json.loads(line).items()))
        print(k + ": " + ", ".join(f"{a} {b:.3f}" for a, b in v.items()))
PY
