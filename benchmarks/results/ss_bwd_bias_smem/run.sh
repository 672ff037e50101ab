#!/usr/bin/env bash
# The ring backward's staging bias from shared memory (bias_smem.patch, version 29 since
# 16b2c1c) against the tree before it, as measured in h200/:
#   benchmarks/results/ss_bwd_bias_smem/run.sh OUT_DIR   (at fc5e36a)
cd "$(dirname "$0")/../../.." && exec benchmarks/ab_selective_scan_patch.sh \
    benchmarks/results/ss_bwd_bias_smem/bias_smem.patch "${1:?usage: run.sh OUT_DIR}"
