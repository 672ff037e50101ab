"""Where the forward's time goes between the kernel and the library call (bfloat16, W = 8).

Times cc1d_fwd_mma launched alone with the same output each call ('same'), with a fresh
allocation each call ('fresh'), rotating four outputs ('rotate4'), and through
``backend.forward`` with the tensor-core and with the tile kernel; prints fractions of the
copy bandwidth measured in the same process. Run from the repository root on a GPU:

    python3 benchmarks/cc1d_launch_gap.py
"""
import sys, os
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.join(os.getcwd(), 'benchmarks'))
import numpy as np, cupy, ml_dtypes, timing
from ssmkit import _causal_conv1d as api
from ssmkit._gpu import causal_conv1d as backend, compiler
bw = timing.copy_tbps()
for (batch, dim, L) in [(8, 3072, 2048), (4, 5376, 4096)]:
    W = 8
    rng = cupy.random.default_rng(0)
    x = rng.standard_normal((batch, dim, L), dtype=cupy.float32).astype(ml_dtypes.bfloat16)
    w = rng.standard_normal((dim, W), dtype=cupy.float32) / W
    b = rng.standard_normal(dim, dtype=cupy.float32)
    p, _ = api._prepare("gap", x, w, b, "silu", None, None)
    backend.TUNING["fwd_mma"] = ("bfloat16",)
    plan = backend.mma_plan(rows=batch * dim, L=L,
                            sm_count=compiler.device_limits()["sm_count"])
    key = backend.KernelKey("fwd_mma", "bfloat16", W, True, True, False)
    k = compiler.get_kernel(backend.SOURCE_FILE, backend.name_expression(key))
    y = cupy.empty_like(x); fin = cupy.empty((batch, dim, W - 1), dtype=x.dtype)
    args = lambda yy, ff: (x, w, b, yy, ff, np.int32(dim), np.int32(L), np.int32(plan["span"]), np.int32(plan["n_spans"]), np.int32(plan["n_items"]))
    grid = (plan["blocks"],)
    act = x.size * 2
    f = lambda ms: round(2 * act / (ms * 1e-3) / 1e12 / bw, 3)
    same = timing.cuda_median_ms(lambda: k(grid, (128,), args(y, fin)), calls=5)
    def fresh():
        yy = cupy.empty_like(x); ff = cupy.empty((batch, dim, W - 1), dtype=x.dtype)
        k(grid, (128,), args(yy, ff))
    fr = timing.cuda_median_ms(fresh, calls=5)
    ys = [cupy.empty_like(x) for _ in range(4)]
    it = iter(range(10**9))
    rot = timing.cuda_median_ms(lambda: k(grid, (128,), args(ys[next(it) % 4], fin)), calls=5)
    lib = timing.cuda_median_ms(lambda: backend.forward(p), calls=5)
    backend.TUNING["fwd_mma"] = ()
    tile = timing.cuda_median_ms(lambda: backend.forward(p), calls=5)
    print("GAP", batch, dim, L, "same", f(same), "fresh", f(fr), "rotate4", f(rot), "lib mma", f(lib), "lib tile", f(tile), flush=True)
