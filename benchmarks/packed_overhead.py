"""Where a packed selective-scan call's time goes beyond one row's, on the GPU.

``bench_packed.py`` found the in-place packed forward 1.8-3.6x slower than one row of the
same steps. This script separates the suspects, for 1 x 1536 x 65536, N 16, float32 (as
that bench) and K sequences:

- per call, the host's time and the GPU's (``cupyx.profiler.benchmark``: the host time of
  the call, and CUDA events around it), for one row and the packed call (``cu_seqlens`` is
  copied to the host: a sync), forward and forward+backward;
- the packed call with the A check's sync taken out (``restarts_in_place`` answered on
  the host), to see what the syncs cost;
- cProfile of the packed call: where the host's time goes, syncs included (time blocked
  in a device-to-host copy shows as that copy's own time), by own time and by cumulative
  time.

    python3 benchmarks/packed_overhead.py [--ks 16 4096] [--kernels K]

``--kernels K`` instead runs two rounds of one row and of the packed call with K sequences,
forward and forward+backward (the first round compiles), for ``ncu --metrics
gpu__time_duration.sum`` and ``ncu_kernel_times.py``: each kernel's own time.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ssmkit  # noqa: E402
from bench_packed import inputs, lengths  # noqa: E402


def main():
    import cupy
    from cupyx.profiler import benchmark
    from ssmkit._gpu import selective_scan as backend

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ks", type=int, nargs="+", default=[16, 4096])
    ap.add_argument("--kernels", type=int, default=None)
    args = ap.parse_args()
    dim, L, N = 1536, 65536, 16
    rng = np.random.default_rng(0)
    x = inputs(cupy, rng, dim, L, N)
    kw = dict(delta_softplus=True)

    dy = cupy.asarray(rng.standard_normal((1, dim, L)).astype(np.float32))

    def call(**extra):
        return lambda: ssmkit.selective_scan(**x, **kw, **extra)

    def vjp(**extra):
        def run():
            _, pullback = ssmkit.selective_scan_vjp(**x, **kw, **extra)
            pullback(dy)
        return run

    def cached_test(run):
        """``run`` with restarts_in_place's answer (and so its A check's sync) kept from the
        first call."""
        memo = []
        real = backend.restarts_in_place

        def test(*a, **k):
            if not memo:
                memo.append(real(*a, **k))
            return memo[0]

        def patched():
            backend.restarts_in_place = test
            try:
                run()
            finally:
                backend.restarts_in_place = real
        return patched

    if args.kernels is not None:
        n = lengths(rng, L, args.kernels)
        cu = cupy.asarray(np.concatenate(([0], np.cumsum(n))))
        for _ in range(2):
            call()()
            call(cu_seqlens=cu)()
            vjp()()
            vjp(cu_seqlens=cu)()
        cupy.cuda.Device().synchronize()
        return

    print(f"packed overhead, 1 x {dim} x {L}, N {N}, float32; ms per call "
          "(host: the call's host time; GPU: CUDA events around it), medians of 30")
    print("| sequences | call | host ms | GPU ms |")
    print("|---|---|---|---|")
    profiles = []
    for K in args.ks:
        n = lengths(rng, L, K)
        cu_dev = cupy.asarray(np.concatenate(([0], np.cumsum(n))))
        cases = [("one row", call()), ("packed, cu_seqlens on the device", call(cu_seqlens=cu_dev)),
                 ("packed, no A check", cached_test(call(cu_seqlens=cu_dev))),
                 ("one row, forward+backward", vjp()),
                 ("packed, forward+backward", vjp(cu_seqlens=cu_dev))]
        for name, fn in cases:
            r = benchmark(fn, n_repeat=30, n_warmup=3)
            print(f"| {K} | {name} | {np.median(r.cpu_times) * 1e3:.3f} | "
                  f"{np.median(r.gpu_times[0]) * 1e3:.3f} |", flush=True)
        prof = cProfile.Profile()
        fn = call(cu_seqlens=cu_dev)
        fn()
        cupy.cuda.Device().synchronize()
        prof.enable()
        for _ in range(10):
            fn()
        cupy.cuda.Device().synchronize()
        prof.disable()
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(30)
        pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(40)
        profiles.append(f"== cProfile, {K} sequences, 10 packed calls (cu_seqlens on the device)\n"
                        + s.getvalue())
    print("\n".join(profiles))


if __name__ == "__main__":
    main()
