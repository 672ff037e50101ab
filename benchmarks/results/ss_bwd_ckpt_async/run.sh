#!/usr/bin/env bash
# The ring backward's chunk checkpoints by cp.async a tile ahead (ckpt_async.patch) against
# the tree as it is (the N 16 rows and N 64): benchmarks/results/ss_bwd_ckpt_async/run.sh OUT_DIR
cd "$(dirname "$0")/../../.." && exec benchmarks/ab_patch.sh selective_scan \
    benchmarks/results/ss_bwd_ckpt_async/ckpt_async.patch "${1:?usage: run.sh OUT_DIR}" "0 1 2 3 4 6"
