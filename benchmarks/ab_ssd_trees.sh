#!/usr/bin/env bash
# Two source trees of ssmkit timed against each other on the SSD peer row, in one GPU call:
# benchmarks/ab_ssd_trees.py in each tree, three rounds in alternating order (a b, b a, a b),
# a short table of the forward and forward+backward times, then the SSD GPU tests in tree b.
#
#   benchmarks/ab_ssd_trees.sh TREE_A TREE_B OUT_DIR [DTYPE]
#
# TREE_A, TREE_B: directories holding a checkout each (git archive REV | tar -x -C DIR; or a
# copy of the working tree with a patch applied: benchmarks/patched_tree.sh); DTYPE as
# ab_ssd_trees.py's (default bfloat16). Each tree runs with itself first on PYTHONPATH (keep
# numpy's own path in PYTHONPATH beforehand). Writes ab.log (one ABROW line per tree and
# round), nvidia_smi.txt and pytest_b.log under OUT_DIR.
set -u
A=$(cd "${1:?usage: TREE_A TREE_B OUT_DIR [DTYPE]}" && pwd)
B=$(cd "${2:?usage: TREE_A TREE_B OUT_DIR [DTYPE]}" && pwd)
O=${3:?usage: TREE_A TREE_B OUT_DIR [DTYPE]}
dtype=${4:-bfloat16}
mkdir -p "$O"
O=$(cd "$O" && pwd)
base=${PYTHONPATH:-}
in_tree() { (cd "$1" && shift && PYTHONPATH="$PWD${base:+:$base}" "$@"); }
nvidia-smi --query-gpu=name,driver_version --format=csv > "$O/nvidia_smi.txt" 2>&1
cat "$O/nvidia_smi.txt"
for r in 1 2 3; do
  for t in $([ $r = 2 ] && echo "b a" || echo "a b"); do
    T=${t^^}
    in_tree "${!T}" timeout 120 python3 benchmarks/ab_ssd_trees.py "$t" "$dtype" 2>&1 | grep ABROW >> "$O/ab.log"
  done
done
python3 - "$O/ab.log" <<'PY'
import json, sys
rows = [json.loads(l.split("ABROW ", 1)[1]) for l in open(sys.argv[1])]
keys = ["fwd b2b", "fwd latency", "fwd+bwd b2b"]
print("tree", *keys, sep=" | ")
for r in rows:
    print(r["tree"], *[r.get(k) for k in keys], sep=" | ")
PY
in_tree "$B" timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE -n 12 tests/test_ssd.py \
  > "$O/pytest_b.log" 2>&1
echo "exit $?" >> "$O/pytest_b.log"
tail -n 2 "$O/pytest_b.log"
