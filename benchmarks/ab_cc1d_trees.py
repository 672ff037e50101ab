"""A/B of causal_conv1d's backward between source trees, in one GPU session.

Run in each tree (``cd TREE && PYTHONPATH=$PWD python3 /path/ab_cc1d_trees.py LABEL``): times
the tree's ``backend.backward`` (kernel plus cc1d_wsum; also with ``TUNING["bwd_mma"]``
off, the kernel the tree falls back to) and ``backend.forward`` on the bfloat16 shapes of
bench_causal_conv1d.py (bias, silu; widths from $AB_WIDTHS, default 4,8; the tensor-core
backward from width $AB_MMA_MIN_WIDTH if given), as CUDA-event medians of
back-to-back calls, and prints one ``ABROW`` JSON line per shape with the fraction of the
copy bandwidth measured in the same process, and the host time of one call (wall clock
over 100 calls, the GPU running behind).
"""
import json
import os
import sys
import time


# the timed tree (the working directory) first: Python puts this script's folder at the
# front, which holds another tree when the script is copied beside them
sys.path[:0] = [os.getcwd(), os.path.join(os.getcwd(), "benchmarks"),
                os.path.dirname(os.path.abspath(__file__))]
import timing  # noqa: E402

SHAPES = [(8, 3072, 2048), (4, 5376, 4096)]
WIDTHS = [int(w) for w in os.environ.get("AB_WIDTHS", "4,8").split(",")]
MMA_MIN_WIDTH = os.environ.get("AB_MMA_MIN_WIDTH")  # TUNING["bwd_mma_min_width"] if given


def main(label):
    import cupy
    import ml_dtypes

    from ssmkit import _causal_conv1d as api
    from ssmkit._gpu import causal_conv1d as backend

    copy_bw = timing.copy_tbps()
    if MMA_MIN_WIDTH:
        backend.TUNING["bwd_mma_min_width"] = int(MMA_MIN_WIDTH)
    rng = cupy.random.default_rng(0)
    for (batch, dim, L), W in [(s, w) for s in SHAPES for w in WIDTHS]:
        dt = ml_dtypes.bfloat16
        x = rng.standard_normal((batch, dim, L), dtype=cupy.float32).astype(dt)
        dy = rng.standard_normal((batch, dim, L), dtype=cupy.float32).astype(dt)
        w = rng.standard_normal((dim, W), dtype=cupy.float32) / W
        b = rng.standard_normal(dim, dtype=cupy.float32)
        p, _ = api._prepare("ab", x, w, b, "silu", None, None)
        act = x.size * 2
        fwd = timing.cuda_median_ms(lambda: backend.forward(p), calls=5)
        bwd = timing.cuda_median_ms(lambda: backend.backward(p, dy, None), calls=5)
        saved = backend.TUNING.get("bwd_mma")
        backend.TUNING["bwd_mma"] = ()  # the tree's other kernel (cc1d_bwd_warp or cc1d_bwd)
        bwd_reg = timing.cuda_median_ms(lambda: backend.backward(p, dy, None), calls=5)
        backend.TUNING["bwd_mma"] = saved
        host = {}  # the host side of one call (wall clock, the GPU running behind)
        for name, fn in (("fwd", lambda: backend.forward(p)),
                         ("bwd", lambda: backend.backward(p, dy, None))):
            cupy.cuda.Device().synchronize()
            t = time.perf_counter()
            for _ in range(100):
                fn()
            host[name] = (time.perf_counter() - t) / 100 * 1e6
            cupy.cuda.Device().synchronize()
        frac = lambda nbytes, ms: round(nbytes / (ms * 1e-3) / 1e12 / copy_bw, 3)  # noqa: E731
        print("ABROW " + json.dumps(dict(tree=label, batch=batch, dim=dim, L=L, width=W,
                                         fwd_ms=round(fwd, 4), fwd_of_copy=frac(2 * act, fwd),
                                         bwd_ms=round(bwd, 4),
                                         bwd_of_copy=frac(3 * act + 2 * dim * (W + 1) * 4, bwd),
                                         bwd_reg_of_copy=frac(3 * act + 2 * dim * (W + 1) * 4,
                                                              bwd_reg),
                                         fwd_host_us=round(host["fwd"], 1),
                                         bwd_host_us=round(host["bwd"], 1),
                                         copy_tbps=round(copy_bw, 3))), flush=True)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.getcwd())
