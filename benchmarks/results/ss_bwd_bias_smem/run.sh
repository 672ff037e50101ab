#!/usr/bin/env bash
# The ring backward's staging bias from shared memory (bias_smem.patch, version 29 since
# 16b2c1c) against the tree before it, as measured in h200/ (the N 16 rows and N 64):
#   benchmarks/results/ss_bwd_bias_smem/run.sh OUT_DIR   (at fc5e36a)
cd "$(dirname "$0")/../../.." && exec benchmarks/ab_patch.sh selective_scan \
    benchmarks/results/ss_bwd_bias_smem/bias_smem.patch "${1:?usage: run.sh OUT_DIR}" "0 1 2 3 4 6"
