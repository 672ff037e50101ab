#!/usr/bin/env bash
# A/B/C probe: trees .ab/a .ab/b .ab/c, tune rows in orders a b c, c b a (no ncu, no tests).
set -u
cd "$(dirname "$0")"
O=${1:?out}; mkdir -p $O
rows=${2:-"0 1 2 3 6"}
trees=${3:-"a b c"}
base=$PYTHONPATH
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $O/nvidia_smi.txt
cat $O/nvidia_smi.txt
in_tree() { (cd "$1" && shift && PYTHONPATH="$PWD:$base" "$@"); }
for t in $trees; do in_tree $t timeout 300 python3 benchmarks/tune_selective_scan.py '{}' --rows $rows > $O/warm_$t.log 2>&1 & done; wait
rev=$(echo $trees | tr ' ' '\n' | tac | tr '\n' ' ')
for r in 1 2; do for t in $([ $r = 1 ] && echo "$trees" || echo "$rev"); do
  echo "== tree $t round $r" >> $O/ab.log
  in_tree $t timeout 200 python3 benchmarks/tune_selective_scan.py '{}' --rows $rows 2>&1 | grep '^|' | grep -v -- '---' | grep -v '^| row' >> $O/ab.log
done; done
cat $O/ab.log
