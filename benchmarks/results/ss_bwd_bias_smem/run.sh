#!/usr/bin/env bash
# The ring backward's staging bias from shared memory (bias_smem.patch) against the tree as
# it is, on the GPU in one call:  benchmarks/results/ss_bwd_bias_smem/run.sh OUT_DIR
# a: this tree; b: a copy with bias_smem.patch applied; benchmarks/ab_selective_scan_trees.sh
# times them (the N 16 rows and N 64, two alternating rounds), reads Nsight Compute's kernel
# metrics and runs the selective-scan and layer GPU tests in b. Keep numpy's own path in
# PYTHONPATH beforehand.
set -u
O=${1:?usage: run.sh OUT_DIR}
cd "$(dirname "$0")/../../.."
B=/tmp/tree_bias_smem
benchmarks/patched_tree.sh "$B" benchmarks/results/ss_bwd_bias_smem/bias_smem.patch || exit 1
benchmarks/ab_selective_scan_trees.sh "$PWD" "$B" "$O" "0 1 2 3 4 6"
