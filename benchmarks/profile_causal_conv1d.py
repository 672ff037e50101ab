"""Drive causal_conv1d's GPU backend for a profiler: a few forward and backward calls.

    ncu --clock-control none -k regex:cc1d_bwd_mma --launch-skip 2 --launch-count 1 \
        --section SpeedOfLight --section WarpStateStats --section SourceCounters \
        python3 benchmarks/profile_causal_conv1d.py [dtype batch dim L W]

Defaults: bfloat16 8 3072 2048 8, bias and silu (the first shape of bench_causal_conv1d.py).
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def main(dtype="bfloat16", batch=8, dim=3072, L=2048, W=8):
    import cupy

    from ssmkit import _causal_conv1d as api
    from ssmkit._gpu import causal_conv1d as backend

    if dtype == "bfloat16":
        import ml_dtypes

        dtype = ml_dtypes.bfloat16
    rng = cupy.random.default_rng(0)
    x = rng.standard_normal((batch, dim, L), dtype=cupy.float32).astype(dtype)
    dy = rng.standard_normal((batch, dim, L), dtype=cupy.float32).astype(dtype)
    w = rng.standard_normal((dim, W), dtype=cupy.float32) / W
    b = rng.standard_normal(dim, dtype=cupy.float32)
    p, _ = api._prepare("profile", x, w, b, "silu", None, None)
    for _ in range(3):
        backend.forward(p)
        backend.backward(p, dy, None)
    cupy.cuda.Device().synchronize()


if __name__ == "__main__":
    a = sys.argv[1:]
    main(*(a[:1] + [int(v) for v in a[1:]]))
