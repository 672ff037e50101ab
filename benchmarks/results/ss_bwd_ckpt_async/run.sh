#!/usr/bin/env bash
# The ring backward's chunk checkpoints by cp.async a tile ahead (ckpt_async.patch) against
# the tree as it is, on the GPU in one call:  benchmarks/results/ss_bwd_ckpt_async/run.sh OUT_DIR
# a: this tree; b: a copy with ckpt_async.patch applied; benchmarks/ab_selective_scan_trees.sh
# times them (the N 16 rows and N 64, two alternating rounds), reads Nsight Compute's kernel
# metrics and runs the selective-scan and layer GPU tests in b. Keep numpy's own path in
# PYTHONPATH beforehand.
set -u
O=${1:?usage: run.sh OUT_DIR}
cd "$(dirname "$0")/../../.."
B=/tmp/tree_ckpt_async
benchmarks/patched_tree.sh "$B" benchmarks/results/ss_bwd_ckpt_async/ckpt_async.patch || exit 1
benchmarks/ab_selective_scan_trees.sh "$PWD" "$B" "$O" "0 1 2 3 4 6"
