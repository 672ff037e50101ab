"""Packed sequences in the selective scan: what seq_idx / cu_seqlens cost.

One row of L steps packed with K sequences of random lengths (log-normal, so some long and
many short), float32, N 16, B and C per step, D, z, delta_bias, softplus. Three ways to
compute the same thing, forward and forward+backward:

- ``one row``: the L steps as one sequence (no restarts): the floor the packed call pays
  its gathers, scatters and padding over;
- ``packed``: ``selective_scan(..., cu_seqlens=...)``: in place (the kernels restart the
  state where a sequence starts: the CPU always, the GPU where its ring kernels run it);
- ``padded``: the same call made to run padded rows of ordinary scans (the GPU's way
  elsewhere);
- ``loop``: one call per sequence, what a user without packed sequences writes.

    python benchmarks/bench_packed.py [--gpu] [--out DIR]

On the CPU (default) with medians of wall-clock time; with ``--gpu`` on CuPy arrays, with
CUDA events (``timing.cuda_median_ms``). Prints a markdown table and writes it to
``DIR/packed_{cpu,gpu}.md``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import ssmkit  # noqa: E402
import timing  # noqa: E402


def lengths(rng, L, K):
    """K sequence lengths (>= 1) summing to L, log-normal."""
    w = rng.lognormal(0.0, 1.0, K)
    n = np.maximum(1, np.floor(w / w.sum() * L)).astype(np.int64)
    n[np.argmax(n)] += L - n.sum()
    return n


def inputs(xp, rng, dim, L, N):
    f = np.float32

    def arr(*shape, scale=1.0, shift=0.0):
        return xp.asarray((rng.standard_normal(shape) * scale + shift).astype(f))

    return dict(u=arr(1, dim, L), delta=arr(1, dim, L, scale=0.7, shift=-1.0),
                A=xp.asarray(-np.exp(rng.standard_normal((dim, N)) * 0.5).astype(f)),
                B=arr(1, N, L), C=arr(1, N, L), D=arr(dim), z=arr(1, dim, L),
                delta_bias=arr(dim, scale=0.1))


def cpu_median_ms(fn, warmup=1, reps=5):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return float(np.median(times))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gpu", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.gpu:
        import cupy as xp
        from ssmkit._gpu import selective_scan as backend

        dim, L, N, ks = 1536, 65536, 16, (16, 256, 4096)
        median = timing.cuda_median_ms
        copy = timing.copy_tbps()
        # one row's compulsory bytes (u, delta, z, y, B, C in float32), as a copy would take
        floor_ms = 4 * (4 * dim * L + 2 * N * L) / (copy * 1e12) * 1e3
    else:
        xp = np
        from ssmkit._cpu import selective_scan as backend
        dim, L, N, ks = 256, 16384, 16, (16, 256, 2048)
        median = cpu_median_ms
        copy = floor_ms = None
    rng = np.random.default_rng(0)
    x = inputs(xp, rng, dim, L, N)
    kw = dict(delta_softplus=True)
    dy = xp.asarray(rng.standard_normal((1, dim, L)).astype(np.float32))

    def fwd(**extra):
        return lambda: ssmkit.selective_scan(**x, **kw, **extra)

    def fwd_bwd(**extra):
        def run():
            _, pullback = ssmkit.selective_scan_vjp(**x, **kw, **extra)
            pullback(dy)
        return run

    def padded(run):
        def padded_run():
            in_place = backend.restarts_in_place
            backend.restarts_in_place = lambda *args, **kwargs: False
            try:
                run()
            finally:
                backend.restarts_in_place = in_place
        return padded_run

    def loop(vjp, cu):
        def piece(a, b):
            return {k: (v[..., a:b] if v.ndim == 3 else v) for k, v in x.items()}

        def run():
            for a, b in zip(cu[:-1], cu[1:]):
                if vjp:
                    _, pullback = ssmkit.selective_scan_vjp(**piece(a, b), **kw)
                    pullback(dy[..., a:b])
                else:
                    ssmkit.selective_scan(**piece(a, b), **kw)
        return run

    where = "gpu" if args.gpu else "cpu"
    rows = [f"Packed selective scan ({where}), 1 x {dim} x {L}, N {N}, float32, commit "
            f"{timing.commit()}; ms, medians", "",
            "| sequences | shortest / longest | one row fwd | packed fwd | padded fwd | loop fwd "
            "| one row fwd+bwd | packed fwd+bwd | padded fwd+bwd | loop fwd+bwd |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for K in ks:
        n = lengths(rng, L, K)
        cu = np.concatenate(([0], np.cumsum(n)))
        cu_x = xp.asarray(cu)
        # one row timed again beside each packing: the host's speed drifts over minutes
        base = (median(fwd()), median(fwd_bwd()))
        t = [median(fwd(cu_seqlens=cu_x)), median(padded(fwd(cu_seqlens=cu_x))),
             median(loop(False, cu), warmup=1, reps=5),
             median(fwd_bwd(cu_seqlens=cu_x)), median(padded(fwd_bwd(cu_seqlens=cu_x))),
             median(loop(True, cu), warmup=1, reps=5)]
        rows.append(f"| {K} | {n.min()} / {n.max()} | {base[0]:.2f} | "
                    + " | ".join(f"{v:.2f}" for v in t[:3]) + f" | {base[1]:.2f} | "
                    + " | ".join(f"{v:.2f}" for v in t[3:]) + " |")
        print(rows[-1], flush=True)
    if copy is not None:
        rows += ["", f"Copy bandwidth in this run {copy:.2f} TB/s: the forward's compulsory bytes "
                     f"(u, delta, z, y, B, C) would take {floor_ms:.3f} ms."]
    text = "\n".join(rows) + "\n"
    print(text)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, f"packed_{where}.md"), "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
