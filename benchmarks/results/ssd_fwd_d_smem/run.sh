#!/usr/bin/env bash
# The 16-bit SSD forward's D from shared memory (d_smem.patch) against the tree as it is, on
# the GPU in one call (ab.log, and the SSD GPU tests in the patched tree: pytest_b.log):
#   benchmarks/results/ssd_fwd_d_smem/run.sh OUT_DIR
cd "$(dirname "$0")/../../.." && exec benchmarks/ab_patch.sh ssd \
    benchmarks/results/ssd_fwd_d_smem/d_smem.patch "${1:?usage: run.sh OUT_DIR}"
