#!/usr/bin/env bash
# The 16-bit SSD forward's D from shared memory (d_smem.patch) against the tree as it is, on
# the GPU in one call:  benchmarks/results/ssd_fwd_d_smem/run.sh OUT_DIR
# a: this tree; b: a copy with d_smem.patch applied; benchmarks/ab_ssd_trees.sh times them
# (ab.log) and runs the SSD GPU tests in b (pytest_b.log).
set -u
O=${1:?usage: run.sh OUT_DIR}
cd "$(dirname "$0")/../../.."
B=/tmp/tree_d_smem
benchmarks/patched_tree.sh "$B" benchmarks/results/ssd_fwd_d_smem/d_smem.patch || exit 1
benchmarks/ab_ssd_trees.sh "$PWD" "$B" "$O"
