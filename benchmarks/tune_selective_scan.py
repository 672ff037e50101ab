"""Time the GPU selective scan under variants of the launch planner's TUNING knobs.

Each variant is a JSON object of overrides for ``ssmkit._gpu.selective_scan.TUNING``; every
variant is timed on every row (median device time per call over back-to-back calls, as in
bench_selective_scan.py). Results do not depend on the knobs, only speed does.

Usage::

    python benchmarks/tune_selective_scan.py '{}' '{"bwd_min_tl": 16}' --rows 0 2 5
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


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("variants", nargs="+", help="JSON objects of TUNING overrides")
    parser.add_argument("--rows", type=int, nargs="+", default=list(range(len(TABLE))),
                        help="indices into bench_selective_scan.TABLE")
    args = parser.parse_args()
    default = dict(gpu_scan.TUNING)
    print("| row | dtype | batch | L | N | variant | fwd ms | fwd+bwd ms |\n|---|---|---|---|---|---|---|---|")
    for i in args.rows:
        dtype, batch, dim, L, N, _, _ = TABLE[i]
        x = make_inputs(cupy, dtype, batch, dim, L, N)
        dy = cupy.ones_like(x["u"])

        def fwd_bwd():
            _, pullback = ssmkit.selective_scan_vjp(**x, delta_softplus=True)
            pullback(dy)

        for variant in args.variants:
            gpu_scan.TUNING.clear()
            gpu_scan.TUNING.update(default, **json.loads(variant))
            fwd = cuda_median_ms(lambda: ssmkit.selective_scan(**x, delta_softplus=True),
                                 calls=5)
            fb = cuda_median_ms(fwd_bwd, reps=7, calls=3)
            print(f"| {i} | {dtype} | {batch} | {L} | {N} | {variant} | {fwd:.3f} | {fb:.3f} |",
                  flush=True)
        del x, dy
        cupy.get_default_memory_pool().free_all_blocks()
    gpu_scan.TUNING.clear()
    gpu_scan.TUNING.update(default)


if __name__ == "__main__":
    main()
