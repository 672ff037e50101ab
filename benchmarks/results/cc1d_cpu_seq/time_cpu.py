"""causal_conv1d on the CPU with seq_idx: forward and forward+backward ms (medians of 3) at 1
(no seq_idx), 16 and 4096 sequences in 1 x 1536 x 65536, width 4, silu, float32, for the
tree at argv[1]. Run alternating two trees:

    NUMBA_NUM_THREADS=2 python3 time_cpu.py TREE
"""
import sys
import time

import numpy as np

sys.path.insert(0, sys.argv[1])
import ssmkit  # noqa: E402

rng = np.random.default_rng(0)
x = rng.standard_normal((1, 1536, 65536)).astype(np.float32)
w = rng.standard_normal((1536, 4)).astype(np.float32)
out = []
for K in (1, 16, 4096):
    seq = None
    if K > 1:
        cuts = np.sort(rng.choice(np.arange(1, 65536), K - 1, replace=False))
        seq = np.zeros((1, 65536), np.int32)
        for c in cuts:
            seq[0, c:] += 1
    for name in ("fwd", "fwd+bwd"):
        def run():
            if name == "fwd":
                ssmkit.causal_conv1d(x, w, seq_idx=seq, activation="silu")
            else:
                y, pullback = ssmkit.causal_conv1d_vjp(x, w, seq_idx=seq, activation="silu")
                pullback(y)
        run()
        ts = []
        for _ in range(3):
            t = time.perf_counter()
            run()
            ts.append((time.perf_counter() - t) * 1e3)
        out.append(f"K{K} {name} {np.median(ts):.0f}")
print(sys.argv[1][-8:], " | ".join(out), flush=True)
