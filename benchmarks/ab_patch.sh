#!/usr/bin/env bash
# A kernel patch timed against the tree as it is, on the GPU in one call: tree a is this
# checkout, tree b a copy with PATCH applied (patched_tree.sh), and ab_OP_trees.sh times them
# and runs the GPU tests in b.
#
#   benchmarks/ab_patch.sh OP PATCH OUT_DIR [ARGS...]
#
# OP: selective_scan (ab_selective_scan_trees.sh: ARGS are its ROWS and TUNE_ARGS) or ssd
# (ab_ssd_trees.sh: ARGS is its DTYPE). PATCH: relative to the repository root. Keep numpy's
# own path in PYTHONPATH beforehand. The outputs are many small files: tar OUT_DIR where a
# machine returns only a few.
set -u
usage="usage: benchmarks/ab_patch.sh OP PATCH OUT_DIR [ARGS...]"
op=${1:?$usage}
patch=${2:?$usage}
out=${3:?$usage}
shift 3
cd "$(dirname "$0")/.."
b=/tmp/tree_$(basename "$patch" .patch)
benchmarks/patched_tree.sh "$b" "$patch" || exit 1
exec "benchmarks/ab_${op}_trees.sh" "$PWD" "$b" "$out" "$@"
