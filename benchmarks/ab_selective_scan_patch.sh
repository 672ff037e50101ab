#!/usr/bin/env bash
# A patch to the selective-scan kernels timed against the tree as it is, on the GPU in one
# call: tree a is this checkout, tree b a copy with PATCH applied (patched_tree.sh), and
# ab_selective_scan_trees.sh times them (two alternating rounds of the bench rows ROWS,
# Nsight Compute's kernel metrics) and runs the selective-scan and layer GPU tests in b.
#
#   benchmarks/ab_selective_scan_patch.sh PATCH OUT_DIR [ROWS]
#
# PATCH: relative to the repository root; ROWS: as ab_selective_scan_trees.sh's (default
# "0 1 2 3 4 6", the N 16 rows and N 64). Keep numpy's own path in PYTHONPATH beforehand.
# The outputs are many small files: tar OUT_DIR where a machine returns only a few.
set -u
patch=${1:?usage: benchmarks/ab_selective_scan_patch.sh PATCH OUT_DIR [ROWS]}
out=${2:?usage: benchmarks/ab_selective_scan_patch.sh PATCH OUT_DIR [ROWS]}
rows=${3:-"0 1 2 3 4 6"}
cd "$(dirname "$0")/.."
b=/tmp/tree_$(basename "$patch" .patch)
benchmarks/patched_tree.sh "$b" "$patch" || exit 1
benchmarks/ab_selective_scan_trees.sh "$PWD" "$b" "$out" "$rows"
