"""Time the CPU SSD forward kernel (``ssmkit._cpu.ssd._forward_kernel``) of the tree this
runs in, without checkpoints: batch 1, L 4096, H 8, P 64, N 64, float32, best of 5.
The two-channel trial: run it as is, then with ``fwd_pairs.patch`` applied
(``git apply benchmarks/results/ssd_cpu_pairs/fwd_pairs.patch``).

    python3 benchmarks/results/ssd_cpu_pairs/time_forward.py
"""
import math
import os
import sys
import time

import numpy as np

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..")
sys.path.insert(0, ROOT)
from ssmkit import _ssd  # noqa: E402
from ssmkit._cpu import ssd as cs  # noqa: E402

rng = np.random.default_rng(0)
batch, L, H, P, N = 1, 4096, 8, 64, 64
a = lambda *s: rng.standard_normal(s).astype(np.float32)
p, _, _ = _ssd._prepare("ssd", a(batch, L, H, P), a(batch, L, H), -np.abs(a(H)),
                        a(batch, L, 1, N), a(batch, L, 1, N), 256, a(H), None, None, True,
                        (0.0, math.inf), None, None, None)
dte, _ = _ssd.effective_dt(p)
keep, h0 = cs._keep(p), np.zeros((batch, H, P, N), np.float32)


def run():
    y = np.empty_like(p.x)
    final = np.zeros((batch, H, P, N), np.float32)
    cs._forward_kernel(p.x, dte, p.A, p.B, p.C, p.D, p.x, h0, keep, p.slot, False, 256,
                       False, y, final, np.zeros((1, 1, 1, 1, 1), np.float32))


run()  # compile
times = []
for _ in range(5):
    t = time.perf_counter()
    run()
    times.append(time.perf_counter() - t)
print(f"_forward_kernel {min(times) * 1e3:.2f} ms")
