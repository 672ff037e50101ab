"""Where the time of one GPU ``ssd_vjp`` + pullback goes: a timeline of every kernel and of
the CuPy work between kernels.

Every launch through ``ssmkit._gpu.ssd._launch`` is bracketed by CUDA events; the time from
one kernel's end to the next one's start is the host-side array work between them (CuPy
element-wise passes, reductions, casts, matmuls), which the timeline lists as ``cupy`` rows
named after the kernel that follows. The events serialise nothing the stream did not
already serialise, so the sum of the rows is the call's time (plus event overhead).

Usage::

    python benchmarks/profile_ssd.py [--dtype bfloat16] [--reps 5] [--out DIR]

``--dtype`` is a dtype of ``bench_ssd.TABLE``: ``float32+tf32`` is float32 with allow_tf32.
``--serial`` runs the float32 backward on one stream (``TC_STREAMS`` off): each kernel's row is
then its own time (with two streams, the rows of kernels that overlap include each other's).

Prints the timeline of the median run (by total) of the peer configuration of
``bench_ssd.py`` (batch 4, L 4096, H 80, P 64, G 1, N 128, chunk 256) and the totals per
kind; with ``--out`` writes it as ``profile_ssd_<dtype>.json`` too.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench_ssd import TABLE, make_inputs, row_dtype  # noqa: E402
from timing import commit  # noqa: E402
import ssmkit  # noqa: E402
from ssmkit._gpu import ssd as gpu_ssd  # noqa: E402


def timeline(cupy, run):
    """Run ``run()`` once with every ssd kernel bracketed by events; return [(kind, name, ms)]."""
    marks = []  # (name, start event, end event)
    original = gpu_ssd._launch

    def launch(name, *args, **kwargs):
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        original(name, *args, **kwargs)
        end.record()
        marks.append((name, start, end))

    first = cupy.cuda.Event()
    cupy.cuda.Device().synchronize()
    first.record()
    gpu_ssd._launch = launch
    try:
        run()
    finally:
        gpu_ssd._launch = original
    last = cupy.cuda.Event()
    last.record()
    last.synchronize()
    rows, prev = [], first
    for name, start, end in marks:
        short = name.split("<")[0]
        rows.append(("cupy", f"before {short}", cupy.cuda.get_elapsed_time(prev, start)))
        rows.append(("kernel", name, cupy.cuda.get_elapsed_time(start, end)))
        prev = end
    rows.append(("cupy", "after the last kernel", cupy.cuda.get_elapsed_time(prev, last)))
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--out", default=None)
    parser.add_argument("--serial", action="store_true", help="one stream (TC_STREAMS off)")
    args = parser.parse_args()
    if args.serial:
        gpu_ssd.TC_STREAMS = False
    import cupy

    _, batch, L, H, P, G, N, chunk = next(r for r in TABLE if r[0] == args.dtype)[:8]
    dtype, options = row_dtype(args.dtype)
    x = make_inputs(cupy, dtype, batch, L, H, P, G, N)
    kw = dict(chunk_size=chunk, dt_softplus=True, **options)
    dy = cupy.ones_like(x["x"])

    def run():
        _, pullback = ssmkit.ssd_vjp(**x, **kw)
        pullback(dy)

    for _ in range(2):  # compile and warm up
        run()
    runs = [timeline(cupy, run) for _ in range(args.reps)]
    totals = [sum(ms for _, _, ms in r) for r in runs]
    rows = runs[int(np.argsort(totals)[len(totals) // 2])]
    total = sum(ms for _, _, ms in rows)
    print(f"ssd_vjp + pullback, {args.dtype}, batch {batch}, L {L}, H {H}, P {P}, G {G}, "
          f"N {N}, chunk {chunk}: {total:.3f} ms (median of {args.reps} by total)")
    print("| kind | what | ms | share |")
    print("|---|---|---|---|")
    for kind, name, ms in rows:
        if ms >= 0.005:
            print(f"| {kind} | {name} | {ms:.3f} | {ms / total:.1%} |")
    for kind in ("kernel", "cupy"):
        part = sum(ms for k, _, ms in rows if k == kind)
        print(f"{kind} total: {part:.3f} ms ({part / total:.1%})")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        stem = args.dtype.replace("+", "_") + ("_serial" if args.serial else "")
        with open(os.path.join(args.out, f"profile_ssd_{stem}.json"), "w") as f:
            json.dump(dict(dtype=args.dtype, serial=args.serial, batch=batch, L=L, heads=H, headdim=P, groups=G,
                           N=N, chunk_size=chunk, total_ms=round(total, 4), commit=commit(),
                           rows=[dict(kind=k, what=n, ms=round(ms, 4)) for k, n, ms in rows]),
                      f, indent=1)


if __name__ == "__main__":
    main()
