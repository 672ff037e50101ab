"""Where the forward's time goes between the kernel and the library call (bfloat16, W = 8).

Times cc1d_fwd_mma launched alone with the same output each call ('same'), with a fresh
allocation each call ('fresh'), rotating four outputs ('rotate4'), and through
``backend.forward`` with the tensor-core and with the tile kernel; prints fractions of the
copy bandwidth measured in the same process, one line per shape of bench_causal_conv1d.py.
Run from the repository root on a GPU:

    python3 benchmarks/cc1d_launch_gap.py
"""
import itertools
import os
import sys

import numpy as np

sys.path[:0] = [os.getcwd(), os.path.join(os.getcwd(), "benchmarks")]
import timing  # noqa: E402

W = 8


def main():
    import cupy
    import ml_dtypes

    from ssmkit import _causal_conv1d as api
    from ssmkit._gpu import causal_conv1d as backend
    from ssmkit._gpu import compiler

    bw = timing.copy_tbps()
    saved = backend.TUNING["fwd_mma"]
    for batch, dim, L in [(8, 3072, 2048), (4, 5376, 4096)]:
        rng = cupy.random.default_rng(0)
        x = rng.standard_normal((batch, dim, L), dtype=cupy.float32).astype(ml_dtypes.bfloat16)
        w = rng.standard_normal((dim, W), dtype=cupy.float32) / W
        b = rng.standard_normal(dim, dtype=cupy.float32)
        p, _ = api._prepare("gap", x, w, b, "silu", None, None)
        plan = backend.mma_plan(rows=batch * dim, L=L,
                                sm_count=compiler.device_limits()["sm_count"])
        key = backend.KernelKey("fwd_mma", "bfloat16", W, True, True, False)
        kernel = compiler.get_kernel(backend.SOURCE_FILE, backend.name_expression(key))
        scalars = (np.int32(dim), np.int32(L), np.int32(plan["span"]),
                   np.int32(plan["n_spans"]), np.int32(plan["n_items"]))
        final = cupy.empty((batch, dim, W - 1), dtype=x.dtype)

        def launch(y, fin=final):
            kernel((plan["blocks"],), (backend.THREADS,), (x, w, b, y, fin) + scalars)

        def fresh():
            launch(cupy.empty_like(x), cupy.empty((batch, dim, W - 1), dtype=x.dtype))

        y = cupy.empty_like(x)
        outs = itertools.cycle([cupy.empty_like(x) for _ in range(4)])
        times = {"same": lambda: launch(y), "fresh": fresh, "rotate4": lambda: launch(next(outs))}
        res = {k: timing.cuda_median_ms(fn, calls=5) for k, fn in times.items()}
        for label, kinds in (("library mma", ("bfloat16",)), ("library tile", ())):
            backend.TUNING["fwd_mma"] = kinds
            res[label] = timing.cuda_median_ms(lambda: backend.forward(p), calls=5)
        backend.TUNING["fwd_mma"] = saved
        frac = {k: round(2 * x.size * 2 / (ms * 1e-3) / 1e12 / bw, 3) for k, ms in res.items()}
        print(f"{batch} x {dim} x {L}:", frac, flush=True)


if __name__ == "__main__":
    main()
