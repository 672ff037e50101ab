#!/usr/bin/env bash
# The 16-bit SSD forward's D from shared memory (d_smem.patch) against the tree as it is, on
# the GPU in one call:  benchmarks/results/ssd_fwd_d_smem/run.sh OUT_DIR
# a: this tree; b: a copy with d_smem.patch applied. benchmarks/ab_ssd_trees.py in each,
# three rounds in alternating order (ab.log), then the SSD GPU tests in b (pytest_b.log).
set -u
O=${1:?usage: run.sh OUT_DIR}; mkdir -p "$O"; O=$(cd "$O" && pwd)
cd "$(dirname "$0")/../../.."
A=$PWD; B=/tmp/tree_d_smem; base=${PYTHONPATH:-}
rm -rf "$B"; mkdir -p "$B"; tar --exclude=./.whl --exclude=./.git -cf - . | tar -xf - -C "$B"
(cd "$B" && git apply benchmarks/results/ssd_fwd_d_smem/d_smem.patch) || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv > "$O/nvidia_smi.txt" 2>&1; cat "$O/nvidia_smi.txt"
run() { (cd "$1" && shift && PYTHONPATH="$PWD${base:+:$base}" "$@"); }
for r in 1 2 3; do
  for t in $([ $r = 2 ] && echo "b a" || echo "a b"); do
    T=$A; [ $t = b ] && T=$B
    run "$T" timeout 120 python3 benchmarks/ab_ssd_trees.py "$t" 2>&1 | grep ABROW >> "$O/ab.log"
  done
done
python3 - "$O/ab.log" <<'PY'
import json, sys
rows = [json.loads(l.split("ABROW ", 1)[1]) for l in open(sys.argv[1])]
keys = ["fwd b2b", "fwd latency", "fwd+bwd b2b"]
print("tree", *keys, sep=" | ")
for r in rows: print(r["tree"], *[r.get(k) for k in keys], sep=" | ")
PY
run "$B" timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE -n 12 tests/test_ssd.py > "$O/pytest_b.log" 2>&1
echo "exit $?" >> "$O/pytest_b.log"; tail -n 2 "$O/pytest_b.log"
