"""Run one warm forward and one warm forward+backward of a selective scan, for a profiler.

Usage (the kernels to look at are ssm_scan_fwd and ssm_scan_bwd)::

    ncu --clock-control none -k regex:ssm_scan --launch-skip 2 --launch-count 2 \
        python benchmarks/profile_selective_scan.py float32 8 1536 2048 16

A last argument ``fwd`` runs the forward alone (``ssmkit.selective_scan``), three times.
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import cupy  # noqa: E402

import ssmkit  # noqa: E402
from bench_selective_scan import make_inputs  # noqa: E402


def main():
    dtype, batch, dim, L, N = sys.argv[1], *map(int, sys.argv[2:6])
    x = make_inputs(cupy, dtype, batch, dim, L, N)
    if sys.argv[6:7] == ["fwd"]:
        for _ in range(3):
            ssmkit.selective_scan(**x, delta_softplus=True)
        cupy.cuda.Device().synchronize()
        return
    dy = cupy.ones_like(x["u"])
    for _ in range(2):  # the first round compiles; the second is the one to profile
        _, pullback = ssmkit.selective_scan_vjp(**x, delta_softplus=True)
        pullback(dy)
    cupy.cuda.Device().synchronize()


if __name__ == "__main__":
    main()
