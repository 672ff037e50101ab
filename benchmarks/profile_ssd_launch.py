"""Run ssd (forward) and ssd_vjp with its pullback at the peer configuration of bench_ssd.py,
twice each (the first compiles), for a profiler that picks one launch by name::

    SSMKIT_LINEINFO=1 ncu -k regex:ssd_mma_fwd --launch-skip 1 --launch-count 1 \\
        --section SourceCounters --page source --print-source cuda,sass --csv \\
        python3 benchmarks/profile_ssd_launch.py bfloat16 > src.csv

Arguments: dtype (bfloat16, float16 or float32), then optionally ``fwd`` (the forward only).
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import cupy  # noqa: E402

import ssmkit  # noqa: E402
from bench_ssd import TABLE, make_inputs  # noqa: E402

PEER, CHUNK = TABLE[0][1:7], TABLE[0][7]  # (batch, L, H, P, G, N), chunk of the peer row


def main():
    dtype = sys.argv[1]
    x = make_inputs(cupy, dtype, *PEER)
    kw = dict(chunk_size=CHUNK, dt_softplus=True)
    for _ in range(2):
        ssmkit.ssd(**x, **kw)
    if sys.argv[2:3] != ["fwd"]:
        for _ in range(2):
            y, pullback = ssmkit.ssd_vjp(**x, **kw)
            pullback(cupy.ones_like(y))
    cupy.cuda.Device().synchronize()


if __name__ == "__main__":
    main()
