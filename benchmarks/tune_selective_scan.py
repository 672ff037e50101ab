"""Time the GPU selective scan under variants of the launch planner's TUNING knobs.

Each variant is a JSON object of overrides for ``ssmkit._gpu.selective_scan.TUNING`` (and
optionally ``"chunk_size"``, passed to the calls: the forward's checkpoint interval); every
variant is timed on every row (median device time per call over back-to-back calls, as in
bench_selective_scan.py). Results do not depend on the knobs, only speed does: ``--check``
verifies that on every row (y and the gradients of u, delta, B, C against the first
variant's, as the largest difference relative to the largest magnitude).

Usage::

    python benchmarks/tune_selective_scan.py '{}' '{"bwd_min_tl": 16}' --rows 0 2 5
    python benchmarks/tune_selective_scan.py '{"fwd_async": false}' '{"fwd_async": true}' \\
        --rows 0 1 2 5 --rounds 2 --check --summary
    python benchmarks/tune_selective_scan.py '{}' --shape float32,8,1536,2048,256 --rows 7

``--rounds R`` times the variants R times per row, in reverse order on every other round,
and keeps each variant's fastest round (so a slow spell on the machine does not land on one
variant only). ``--summary`` ends with one line per row: each variant's times and their
ratio to the first variant's.
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import cupy  # noqa: E402

import ssmkit  # noqa: E402
from ssmkit._gpu import selective_scan as gpu_scan  # noqa: E402
from bench_selective_scan import TABLE, cuda_median_ms, make_inputs  # noqa: E402

_CHECKED = ("u", "delta", "B", "C")


def _outputs(x, dy, chunk_size=None):
    """y and the gradients _CHECKED, as float64 NumPy arrays."""
    y, pullback = ssmkit.selective_scan_vjp(**x, delta_softplus=True, chunk_size=chunk_size)
    grads = pullback(dy)
    out = {"y": y}
    out.update({name: getattr(grads, name) for name in _CHECKED})
    return {k: cupy.asnumpy(v.astype(cupy.float64)) for k, v in out.items()}


def _rel_diff(a, b):
    import numpy as np

    return max(float(np.max(np.abs(a[k] - b[k])) / max(float(np.max(np.abs(b[k]))), 1e-30)) for k in b)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("variants", nargs="+", help="JSON objects of TUNING overrides")
    parser.add_argument("--rows", type=int, nargs="+", default=list(range(len(TABLE))),
                        help="indices into bench_selective_scan.TABLE")
    parser.add_argument("--rounds", type=int, default=1, help="timing rounds per row (fastest kept)")
    parser.add_argument("--check", action="store_true",
                        help="compare every variant's y and gradients with the first variant's")
    parser.add_argument("--summary", action="store_true", help="end with a per-row comparison table")
    parser.add_argument("--shape", action="append", default=[], metavar="DTYPE,BATCH,DIM,L,N",
                        help="an extra row (not in the table): row index len(TABLE), then on")
    args = parser.parse_args()
    table = list(TABLE)
    for spec in args.shape:
        dt, *sizes = spec.split(",")
        table.append((dt, *map(int, sizes), None, None))
    default = dict(gpu_scan.TUNING)
    print("| row | dtype | batch | L | N | variant | round | fwd ms | fwd+bwd ms | max rel diff |\n"
          "|---|---|---|---|---|---|---|---|---|---|")
    best = {}   # (row, variant index) -> [fwd, fwd+bwd]
    diffs = {}  # (row, variant index) -> relative difference to variant 0
    for i in args.rows:
        dtype, batch, dim, L, N, _, _ = table[i]
        x = make_inputs(cupy, dtype, batch, dim, L, N)
        dy = cupy.ones_like(x["u"])

        def fwd_bwd(chunk_size):
            _, pullback = ssmkit.selective_scan_vjp(**x, delta_softplus=True, chunk_size=chunk_size)
            pullback(dy)

        ref = None
        for rnd in range(args.rounds):
            order = list(enumerate(args.variants))
            if rnd % 2:
                order.reverse()
            for v, variant in order:
                knobs = json.loads(variant)
                chunk = knobs.pop("chunk_size", None)
                gpu_scan.TUNING.clear()
                gpu_scan.TUNING.update(default, **knobs)
                diff = ""
                if args.check and rnd == 0:  # round 0 runs the variants in order: 0 first
                    out = _outputs(x, dy, chunk)
                    if v == 0:
                        ref = out
                    else:
                        diffs[(i, v)] = _rel_diff(out, ref)
                        diff = f"{diffs[(i, v)]:.2e}"
                fwd = cuda_median_ms(lambda: ssmkit.selective_scan(**x, delta_softplus=True,
                                                                   chunk_size=chunk), calls=5)
                fb = cuda_median_ms(lambda: fwd_bwd(chunk), reps=7, calls=3)
                b = best.setdefault((i, v), [fwd, fb])
                b[0], b[1] = min(b[0], fwd), min(b[1], fb)
                print(f"| {i} | {dtype} | {batch} | {L} | {N} | {variant} | {rnd} | {fwd:.3f} | "
                      f"{fb:.3f} | {diff} |", flush=True)
        del x, dy
        cupy.get_default_memory_pool().free_all_blocks()
    gpu_scan.TUNING.clear()
    gpu_scan.TUNING.update(default)
    if args.summary:
        print("\nFastest round per variant; ratio = variant / first variant "
              f"({args.variants[0]}).\n")
        head = "| row | shape |"
        for v, variant in enumerate(args.variants):
            head += f" v{v} fwd ms | v{v} fwd+bwd ms |" + (" fwd ratio | fwd+bwd ratio |" if v else "")
        if args.check:
            head += " max rel diff |"
        print(head)
        print("|" + "---|" * (head.count("|") - 1))
        for i in args.rows:
            dtype, batch, dim, L, N, _, _ = table[i]
            f0, b0 = best[(i, 0)]
            line = f"| {i} | {dtype} {batch}x{dim}x{L} N{N} |"
            for v in range(len(args.variants)):
                f, b = best[(i, v)]
                line += f" {f:.3f} | {b:.3f} |" + (f" {f / f0:.3f} | {b / b0:.3f} |" if v else "")
            if args.check:
                line += " " + ", ".join(f"{diffs[(i, v)]:.1e}" for v in range(1, len(args.variants))) + " |"
            print(line)
        print("\nvariants: " + "; ".join(f"v{v} = {s}" for v, s in enumerate(args.variants)))


if __name__ == "__main__":
    main()
