"""SSD on the CPU with packed sequences (cu_seqlens), without final states: forward and
forward+backward ms (medians of 5) at 1, 16 and 2048 sequences of 1 x 16384 steps, H 8, P 64,
N 64, float32, for the tree at argv[1]. Run alternating two trees:

    NUMBA_NUM_THREADS=2 python3 time_cpu.py TREE
"""
import sys
import time

import numpy as np

sys.path.insert(0, sys.argv[1])
import ssmkit  # noqa: E402

rng = np.random.default_rng(0)
b, L, H, P, N = 1, 16384, 8, 64, 64
f = np.float32
x = rng.standard_normal((b, L, H, P)).astype(f)
dt = rng.standard_normal((b, L, H)).astype(f)
A = -np.exp(rng.standard_normal(H)).astype(f)
B = rng.standard_normal((b, L, 1, N)).astype(f)
C = rng.standard_normal((b, L, 1, N)).astype(f)
out = []
for K in (1, 16, 2048):
    cu = (np.concatenate(([0], np.sort(rng.choice(np.arange(1, L), K - 1, replace=False)), [L]))
          if K > 1 else None)
    kw = dict(dt_softplus=True, cu_seqlens=cu)

    def fwd():
        ssmkit.ssd(x, dt, A, B, C, **kw)

    def vjp():
        y, pullback = ssmkit.ssd_vjp(x, dt, A, B, C, **kw)
        pullback(y)

    for name, fn in (("fwd", fwd), ("fwd+bwd", vjp)):
        fn()
        ts = []
        for _ in range(5):
            t = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t) * 1e3)
        out.append(f"K{K} {name} {np.median(ts):.1f}")
print(sys.argv[1][-8:], " | ".join(out), flush=True)
