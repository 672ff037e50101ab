"""Time every GPU algorithm of ssmkit.linear_scan across shapes, against the copy bandwidth.

For each shape (few long rows, a middle case, many short rows; float32 and
complex64) and each algorithm: the CUDA-event-timed median after warm-up of one
``linear_scan`` call, its effective bandwidth (compulsory traffic: a and b read,
h written, 3 arrays) and that as a fraction of the device-to-device copy
bandwidth measured in the same run. ``"auto"`` is timed too, and the algorithm
it picks is recorded. Every row records its layout: ``blocked`` (16-byte vector
loads and stores; what these aligned inputs get) or ``staged`` (element loads
through shared memory, what unaligned or odd-length rows get); each algorithm
is also timed ``staged`` where it suits the shape, for comparison. Writes
``results/linear_scan_<gpu>.json`` (a list of rows) and a markdown table beside it.

Usage::

    python benchmarks/bench_linear_scan.py [--quick] [--out DIR]
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import timing  # noqa: E402
from timing import commit, copy_tbps  # noqa: E402
import ssmkit  # noqa: E402

cuda_median_ms = functools.partial(timing.cuda_median_ms, warmup=2, reps=7)  # this script's repetitions

# (rows, L): few long rows, a middle case, many short rows; 2^26 or 2^28 elements
SHAPES = [(4, 1 << 24), (64, 1 << 22), (16384, 16384), (1 << 20, 64), (1 << 22, 64)]
DTYPES = ("float32", "complex64")
ALGORITHMS = ("sequential", "kogge_stone", "blelloch", "chunked", "lookback", "auto")


def write(rows_out, name, copy, out):
    """Write the rows so far: JSON list and markdown table; print the table."""
    os.makedirs(out, exist_ok=True)
    stem = os.path.join(out, "linear_scan_" + name.split()[-1].lower())
    with open(stem + ".json", "w") as f:
        json.dump(rows_out, f, indent=1)
    lines = [f"# linear_scan on {name}, commit {rows_out[0]['commit']}, {rows_out[0]['date']}",
             "",
             f"Copy bandwidth in the same run: {copy:.3f} TB/s. Traffic counted: a, b read, "
             "h written (3 arrays). ms: device time per call, median over 7 runs of 5 "
             "back-to-back calls (CUDA events) after 2 warm-ups; latency: one call alone, "
             "host launch path included (median of 5).",
             "",
             "| dtype | rows | L | algorithm | layout | ms | latency ms | TB/s | of copy |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows_out:
        if r["op"] != "linear_scan":
            continue
        alg = r["algorithm"] + (f" ({r['picks']})" if r["algorithm"] == "auto" else "")
        lines.append(f"| {r['dtype']} | {r['rows']} | {r['L']} | {alg} | {r['layout']} | "
                     f"{r['ms']:.3f} | "
                     f"{r['latency_ms']:.3f} | "
                     f"{r['tbps']:.2f} | {r['fraction_of_copy']:.0%} |")
    lines += ["", "selective_scan forward (float32, batch 8, dim 1536, L 2048, N 16, D, z, "
              "delta_bias, softplus; median of 5 single calls):", "",
              "| backend | fwd ms |", "|---|---|"]
    lines += [f"| {r['backend']} | {r['fwd_ms']:.3f} |" for r in rows_out
              if r["op"] == "selective_scan"]
    with open(stem + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)


def main():
    import cupy
    from ssmkit._numba_cuda import linear_scan as gpu

    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="first two shapes, float32 only")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    args = ap.parse_args()
    dev = cupy.cuda.Device()
    name = cupy.cuda.runtime.getDeviceProperties(dev.id)["name"].decode()
    sms = dev.attributes["MultiProcessorCount"]
    copy = copy_tbps()
    print(f"{name}: copy {copy:.3f} TB/s", flush=True)
    rows_out = []
    shapes = SHAPES[:2] if args.quick else SHAPES
    cupy.random.seed(0)
    for dtype in (DTYPES[:1] if args.quick else DTYPES):
        for rows, L in shapes:
            a = cupy.random.uniform(0.5, 0.999, (rows, L), dtype=cupy.float32).astype(dtype)
            b = cupy.random.standard_normal((rows, L), dtype=cupy.float32).astype(dtype)
            nbytes = 3 * a.nbytes
            h0 = cupy.zeros(rows, dtype)
            runs = []
            for alg in ALGORITHMS:
                if alg == "sequential" and rows < 1024:
                    continue  # one thread per row: a handful of threads, seconds per call
                if alg in ("kogge_stone", "blelloch") and rows < sms:
                    continue  # one block per row: a few blocks walking millions of steps
                runs.append((alg, "blocked" if gpu._blocked_ok(b, L) else "staged",
                             lambda alg=alg: ssmkit.linear_scan(a, b, algorithm=alg)))
                short = L <= 256  # block-per-tile algorithms on short rows: not worth timing twice
                if alg != "auto" and (alg == "sequential") == short:
                    runs.append((alg, "staged", lambda alg=alg: gpu.linear_scan_rows(
                        a, b, h0, False, alg, blocked=False)))
            for alg, layout, call in runs:
                latency = cuda_median_ms(call, reps=5)
                ms = cuda_median_ms(call, calls=5)
                tbps = nbytes / (ms * 1e-3) / 1e12
                row = dict(op="linear_scan", gpu=name, dtype=dtype, rows=rows, L=L,
                           algorithm=alg, picks=(gpu.choose_algorithm(rows, L, sms, a.itemsize)
                                                 if alg == "auto" else alg), layout=layout,
                           ms=round(ms, 4), latency_ms=round(latency, 4), tbps=round(tbps, 3),
                           fraction_of_copy=round(tbps / copy, 3), copy_tbps=round(copy, 3),
                           commit=commit(), date=datetime.date.today().isoformat())
                rows_out.append(row)
                print(json.dumps(row), flush=True)
            a = b = None
            cupy.get_default_memory_pool().free_all_blocks()
            write(rows_out, name, copy, args.out)
    # the selective scan's forward: fused CUDA kernel against the Numba scans
    # (mamba_ssm's first row: float32, batch 8, dim 1536, L 2048, N 16, D, z, bias, softplus)
    batch, dim, L, N = 8, 1536, 2048, 16
    u, delta, z = (cupy.random.standard_normal((batch, dim, L), dtype=cupy.float32)
                   for _ in range(3))
    A = -cupy.exp(cupy.random.standard_normal((dim, N), dtype=cupy.float32) * 0.5)
    B, C = (cupy.random.standard_normal((batch, N, L), dtype=cupy.float32) for _ in range(2))
    D = cupy.random.standard_normal(dim, dtype=cupy.float32)
    bias = cupy.random.standard_normal(dim, dtype=cupy.float32) * 0.1
    for backend in ("cuda", "numba", "numba:kogge_stone", "numba:lookback"):
        ms = cuda_median_ms(lambda: ssmkit.selective_scan(u, delta, A, B, C, D, z, bias, True,
                                                          backend=backend), reps=5)
        row = dict(op="selective_scan", gpu=name, dtype="float32", batch=batch, dim=dim, L=L,
                   N=N, backend=backend, fwd_ms=round(ms, 4), copy_tbps=round(copy, 3),
                   commit=commit(), date=datetime.date.today().isoformat())
        rows_out.append(row)
        print(json.dumps(row), flush=True)
    write(rows_out, name, copy, args.out)


if __name__ == "__main__":
    main()
