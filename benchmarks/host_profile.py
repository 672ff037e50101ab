"""Host time of ssmkit's public GPU calls, and where it goes (cProfile).

Each call runs on a small problem, so the GPU work is negligible and the wall time per
call (median of repeated timed loops, no synchronisation inside a loop) is the host side:
argument checks, allocation, launch. Then cProfile over the same calls lists the functions
with the most time of their own.

    python3 benchmarks/host_profile.py [--top 25] [--only causal_conv1d,...]
"""
from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ssmkit  # noqa: E402
from timing import host_median_us  # noqa: E402


def cases():
    """name -> a no-argument callable making one public call on a small GPU problem."""
    import cupy
    import ml_dtypes

    rng = np.random.default_rng(0)
    bf16 = ml_dtypes.bfloat16

    def arr(*shape, dtype=np.float32):
        return cupy.asarray(rng.standard_normal(shape).astype(np.float32)).astype(dtype)

    x, w, b = arr(2, 64, 256, dtype=bf16), arr(64, 4), arr(64)
    dy = arr(2, 64, 256, dtype=bf16)
    _, pullback = ssmkit.causal_conv1d_vjp(x, w, b, activation="silu")
    xt, conv_state = arr(2, 64, dtype=bf16), arr(2, 64, 3, dtype=bf16)
    st = arr(2, 4, 16, 32, dtype=bf16)  # Mamba-2: (batch, H, P, N), per-head dt and A
    sx = arr(2, 4, 16, dtype=bf16)
    sdt = cupy.broadcast_to(arr(2, 4, 1, dtype=bf16), (2, 4, 16))
    sA = cupy.broadcast_to(-cupy.abs(arr(4, 1, 1)), (4, 16, 32))
    sB, sC = arr(2, 1, 32, dtype=bf16), arr(2, 1, 32, dtype=bf16)
    u, delta = arr(2, 64, 256), arr(2, 64, 256)
    A, Bs, Cs = -np.abs(arr(64, 16)), arr(2, 16, 256), arr(2, 16, 256)
    # Mamba-2 SSD at the peer row's head shape (P 64, N 128), 4 heads and 256 steps
    sd = dict(x=arr(1, 256, 4, 64, dtype=bf16), dt=arr(1, 256, 4), A=-cupy.abs(arr(4)),
              B=arr(1, 256, 1, 128, dtype=bf16), C=arr(1, 256, 1, 128, dtype=bf16),
              D=arr(4), dt_bias=arr(4))
    sd32 = {k: v.astype(np.float32) for k, v in sd.items()}
    sdy, sdy32 = arr(1, 256, 4, 64, dtype=bf16), arr(1, 256, 4, 64)
    _, ssd_pullback = ssmkit.ssd_vjp(**sd, dt_softplus=True)
    _, ssd_pullback32 = ssmkit.ssd_vjp(**sd32, dt_softplus=True)
    return {
        "ssd bfloat16": lambda: ssmkit.ssd(**sd, dt_softplus=True),
        "ssd_vjp bfloat16": lambda: ssmkit.ssd_vjp(**sd, dt_softplus=True),
        "ssd pullback bfloat16": lambda: ssd_pullback(sdy),
        "ssd float32": lambda: ssmkit.ssd(**sd32, dt_softplus=True),
        "ssd_vjp float32": lambda: ssmkit.ssd_vjp(**sd32, dt_softplus=True),
        "ssd pullback float32": lambda: ssd_pullback32(sdy32),
        "causal_conv1d": lambda: ssmkit.causal_conv1d(x, w, b, activation="silu"),
        "causal_conv1d_vjp": lambda: ssmkit.causal_conv1d_vjp(x, w, b, activation="silu"),
        "causal_conv1d pullback": lambda: pullback(dy),
        "causal_conv1d_update": lambda: ssmkit.causal_conv1d_update(xt, conv_state, w, b,
                                                                    activation="silu"),
        "state_update (mamba2)": lambda: ssmkit.state_update(st, sx, sdt, sA, sB, sC,
                                                             dt_softplus=True),
        "selective_scan": lambda: ssmkit.selective_scan(u, delta, A, Bs, Cs,
                                                        delta_softplus=True),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--only", default="")
    args = parser.parse_args()
    only = [s for s in args.only.split(",") if s]
    table = []
    for name, fn in cases().items():
        if only and not any(o in name for o in only):
            continue
        try:
            us = host_median_us(fn, calls=200, reps=9, warmup=20, sync=True)
        except Exception as e:  # a case that does not run here: say so, go on
            print(f"{name}: failed: {e!r}")
            continue
        table.append((name, us))
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(300):
            fn()
        prof.disable()
        print(f"\n== {name}: {us:.1f} us per call (host)")
        pstats.Stats(prof).sort_stats("tottime").print_stats(args.top)
    print("| call | host us |\n|---|---|")
    for name, us in table:
        print(f"| {name} | {us:.1f} |")


if __name__ == "__main__":
    main()
