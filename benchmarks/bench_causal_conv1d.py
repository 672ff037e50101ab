"""Time ssmkit.causal_conv1d (forward, backward, decoding step) against the copy bandwidth.

The convolution is memory-bound: its floor is its compulsory bytes over the
device-to-device copy bandwidth measured in the same run. Bytes counted:

* forward: x in, y out;
* backward: dy and x in, dx out, plus dweight/dbias (dim * (W + 1) floats);
* update (one token): x in, y out, the W-1 state values of each channel read and written.

Each figure is a CUDA-event median over back-to-back calls after warm-up, for
the public call (``call``: argument checks and the launch included) and for the
kernel alone (``kernel``: the backend function on a prepared problem; for the
backward, the kernel plus ``cc1d_wsum``, which sums its per-item partials of
dweight/dbias). Beside them, for A/B in the same run, the backend with the other
kernels chosen through ``TUNING``: for bfloat16 the forward's tile kernel
(``fwd_mma`` off) and register kernel (``fwd_mma`` and ``fwd_tile`` off), the
backward's register kernel (``bwd_mma`` off).

``--history`` adds the earlier A/B: the source built with ``-DCC1D_PREFETCH=0``
(no read-ahead of the next item) launched two ways: ``old``, one block per item
with the partials summed by CuPy reductions as the host did before
(``partial.sum(axis=(0, 2))`` and two copies), which is the structure of commit
548eec1; and ``loop``, the resident grid of blocks walking the items with
``cc1d_wsum``, without the read-ahead. ``--mma-sweep`` times the tensor-core
kernels built with other read-ahead depths (``-DCC1D_MMA_FWD_BUFS``,
``-DCC1D_MMA_BWD_AHEAD``) and spans.
Writes ``results/causal_conv1d_h200.json`` (a list of rows) and a markdown table
beside it.

Usage::

    python benchmarks/bench_causal_conv1d.py [--quick] [--tiles] [--history] [--mma-sweep]
                                             [--out DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import timing  # noqa: E402
from timing import commit, copy_tbps  # noqa: E402
import ssmkit  # noqa: E402
from ssmkit import _causal_conv1d as api  # noqa: E402

cuda_median_ms = functools.partial(timing.cuda_median_ms, calls=5)  # this script's repetitions

# (batch, dim, L): Mamba-1's conv (d_inner 3072), Mamba-2's xBC conv (d_inner 4096 + 2 * 640).
SHAPES = [(8, 3072, 2048), (4, 5376, 4096)]
DTYPES = ["float32", "bfloat16"]
WIDTHS = [4, 8]


def _experiment(name, fn, *args):
    """``fn(*args)``, or [] when it fails: an experiment never loses the main table."""
    try:
        return fn(*args)
    except Exception as e:
        print(f"{name} failed: {e!r}", flush=True)
        return []


@contextlib.contextmanager
def tuning(backend, **values):
    """``backend.TUNING`` with ``values`` for the duration."""
    saved = {k: backend.TUNING[k] for k in values}
    backend.TUNING.update(values)
    try:
        yield
    finally:
        backend.TUNING.update(saved)


def run(args):
    import cupy

    from ssmkit._gpu import causal_conv1d as backend

    dev = cupy.cuda.Device()
    gpu = cupy.cuda.runtime.getDeviceProperties(dev.id)["name"].decode()
    copy_bw = copy_tbps()
    print(f"{gpu}: copy {copy_bw:.2f} TB/s", flush=True)
    rng = cupy.random.default_rng(0)
    rows = []
    shapes = SHAPES[:1] if args.quick else SHAPES
    for (batch, dim, L), dtype, W in [(s, d, w) for s in shapes for d in DTYPES for w in WIDTHS]:
        item = 2 if dtype == "bfloat16" else 4
        if dtype == "bfloat16":
            import ml_dtypes

            dtype = ml_dtypes.bfloat16
        x = rng.standard_normal((batch, dim, L), dtype=cupy.float32).astype(dtype)
        w = rng.standard_normal((dim, W), dtype=cupy.float32) / W
        b = rng.standard_normal(dim, dtype=cupy.float32)
        dy = rng.standard_normal((batch, dim, L), dtype=cupy.float32).astype(dtype)
        kw = dict(activation="silu")
        act = batch * dim * L * item
        fwd_bytes = 2 * act
        bwd_bytes = 3 * act + 2 * dim * (W + 1) * 4

        fwd_call = cuda_median_ms(lambda: ssmkit.causal_conv1d(x, w, b, **kw))
        p, _ = api._prepare("bench", x, w, b, "silu", None, None)
        fwd_kernel = cuda_median_ms(lambda: backend.forward(p))
        with tuning(backend, fwd_warp=(), fwd_mma=()):  # A/B: the tile kernel (16-bit)
            fwd_tile_kernel = cuda_median_ms(lambda: backend.forward(p))
        with tuning(backend, fwd_warp=(), fwd_mma=("bfloat16",), fwd_mma_min_width=1):  # mma
            fwd_mma_kernel = cuda_median_ms(lambda: backend.forward(p))
        with tuning(backend, fwd_warp=(), fwd_mma=(), fwd_tile=()):  # the register kernel cc1d_fwd
            fwd_reg_kernel = cuda_median_ms(lambda: backend.forward(p))
        with tuning(backend, fwd_warp=("float16", "bfloat16", "float32"), fwd_mma=()):  # warp
            fwd_warp_kernel = cuda_median_ms(lambda: backend.forward(p))
        _, pullback = ssmkit.causal_conv1d_vjp(x, w, b, **kw)
        bwd_call = cuda_median_ms(lambda: pullback(dy))
        bwd_kernel = cuda_median_ms(lambda: backend.backward(p, dy, None))
        with tuning(backend, bwd_warp=()):  # cc1d_bwd_mma where it applies, else cc1d_bwd
            bwd_mma_kernel = cuda_median_ms(lambda: backend.backward(p, dy, None))
        with tuning(backend, bwd_warp=(), bwd_mma=()):  # the register kernel cc1d_bwd
            bwd_reg_kernel = cuda_median_ms(lambda: backend.backward(p, dy, None))
        spans = {}
        if args.warp_sweep:  # cc1d_bwd_warp with other spans
            for span in (512, 1024, 4096):
                with tuning(backend, warp_span=span):
                    spans[span] = cuda_median_ms(lambda: backend.backward(p, dy, None))
        ab = ab_kernels(p, dy) if args.history else {}
        print(f"{np.dtype(dtype).name} {batch}x{dim}x{L} W={W}: fwd {fwd_call:.4f} ms "
              f"(kernel {fwd_kernel:.4f}, tile {fwd_tile_kernel:.4f}, registers "
              f"{fwd_reg_kernel:.4f}), bwd {bwd_call:.4f} ms (kernel {bwd_kernel:.4f}, "
              f"registers {bwd_reg_kernel:.4f}) {ab}", flush=True)

        # One decoding step for the same channels: rows by index from a pool twice the batch,
        # or without indices from the pool's first rows.
        pool = 2 * batch
        state = rng.standard_normal((pool, dim, W - 1), dtype=cupy.float32).astype(dtype)
        xt = x[:, :, 0].copy()
        idx = cupy.arange(batch, dtype=cupy.int64) * 2
        own = state[:batch]  # without indices: one state row per batch row
        upd_call = cuda_median_ms(lambda: ssmkit.causal_conv1d_update(xt, own, w, b, **kw))
        upd_idx_call = cuda_median_ms(lambda: ssmkit.causal_conv1d_update(
            xt, state, w, b, conv_state_indices=idx, **kw))
        xt3 = xt[:, :, None]
        upd_kernel = cuda_median_ms(lambda: backend.update(xt3, state, w, b, True, idx))
        upd_bytes = batch * dim * (2 * item + 2 * (W - 1) * item)

        def frac(nbytes, ms):
            return round(nbytes / (ms * 1e-3) / 1e12 / copy_bw, 3)

        row = dict(op="causal_conv1d", gpu=gpu, dtype=np.dtype(dtype).name, batch=batch, dim=dim, L=L, width=W,
                   activation="silu", bias=True,
                   fwd_ms=round(fwd_call, 4), fwd_kernel_ms=round(fwd_kernel, 4),
                   bwd_ms=round(bwd_call, 4), bwd_kernel_ms=round(bwd_kernel, 4),
                   update_ms=round(upd_call, 4), update_indexed_ms=round(upd_idx_call, 4),
                   update_kernel_ms=round(upd_kernel, 4),
                   fwd_reg_kernel_ms=round(fwd_reg_kernel, 4),
                   fwd_reg_kernel_of_copy=frac(fwd_bytes, fwd_reg_kernel),
                   fwd_tile_kernel_ms=round(fwd_tile_kernel, 4),
                   fwd_tile_kernel_of_copy=frac(fwd_bytes, fwd_tile_kernel),
                   fwd_mma_kernel_ms=round(fwd_mma_kernel, 4),
                   fwd_mma_kernel_of_copy=frac(fwd_bytes, fwd_mma_kernel),
                   fwd_warp_kernel_ms=round(fwd_warp_kernel, 4),
                   fwd_warp_kernel_of_copy=frac(fwd_bytes, fwd_warp_kernel),
                   bwd_reg_kernel_ms=round(bwd_reg_kernel, 4),
                   bwd_reg_kernel_of_copy=frac(bwd_bytes, bwd_reg_kernel),
                   bwd_mma_kernel_ms=round(bwd_mma_kernel, 4),
                   bwd_mma_kernel_of_copy=frac(bwd_bytes, bwd_mma_kernel),
                   **{f"bwd_span{k}_of_copy": frac(bwd_bytes, ms) for k, ms in spans.items()},
                   fwd_bytes=fwd_bytes, bwd_bytes=bwd_bytes, update_bytes=upd_bytes,
                   fwd_of_copy=frac(fwd_bytes, fwd_call), fwd_kernel_of_copy=frac(fwd_bytes, fwd_kernel),
                   bwd_of_copy=frac(bwd_bytes, bwd_call), bwd_kernel_of_copy=frac(bwd_bytes, bwd_kernel),
                   update_kernel_of_copy=frac(upd_bytes, upd_kernel),
                   copy_tbps=round(copy_bw, 3), commit=commit(),
                   date=datetime.date.today().isoformat())
        for k, ms in ab.items():
            row[k + "_ms"] = round(ms, 4)
            row[k + "_of_copy"] = frac(fwd_bytes if k.startswith("fwd") else bwd_bytes, ms)
        rows.append(row)
        print(json.dumps(row), flush=True)

    sweep = _experiment("mma variants", mma_variants, copy_bw) if args.mma_sweep else []
    variants = _experiment("tile variants", tile_variants, copy_bw) if args.tiles else []
    warps = _experiment("warp variants", warp_variants, copy_bw) if args.warp_blocks else []

    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, "causal_conv1d_h200" if "H200" in gpu else "causal_conv1d_gpu")
    with open(stem + ".json", "w") as f:
        json.dump(rows, f, indent=1)
    lines = [f"# causal_conv1d on {gpu}, commit {rows[0]['commit']}, {rows[0]['date']}",
             "",
             f"Copy bandwidth {copy_bw:.2f} TB/s (bytes read + written), measured in the same run. "
             "Times: CUDA-event medians of 5 back-to-back calls after warm-up, one untimed call "
             "queued before them (steady state); 'call' is the "
             "public function, 'kernel' the backend on a prepared problem (backward: kernel plus "
             "cc1d_wsum, the fixed-order sum of its partials). "
             "'of copy' = (compulsory bytes / time) / copy "
             "bandwidth; bytes: forward x + y, backward dy + x + dx (+ weight grads), update x + y "
             "+ state read and written. activation silu, bias; update: one token, pool 2 x batch.",
             "", "Command: `python3 benchmarks/bench_causal_conv1d.py "
             + " ".join("DIR" if a.startswith("/") else a for a in sys.argv[1:]).strip() + "`.",
             "",
             "| dtype | batch | dim | L | W | fwd ms | of copy | kernel of copy | bwd ms | of copy | "
             "kernel of copy | update ms | indexed ms | kernel ms |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['dtype']} | {r['batch']} | {r['dim']} | {r['L']} | {r['width']} | "
            f"{r['fwd_ms']:.3f} | {r['fwd_of_copy']:.2f} | {r['fwd_kernel_of_copy']:.2f} | "
            f"{r['bwd_ms']:.3f} | {r['bwd_of_copy']:.2f} | {r['bwd_kernel_of_copy']:.2f} | "
            f"{r['update_ms']:.4f} | {r['update_indexed_ms']:.4f} | {r['update_kernel_ms']:.4f} |")
    lines += ["", "A/B, kernel alone, fraction of copy bandwidth, in the same run: the library "
              "(new), and the other kernels chosen through TUNING: fwd registers: cc1d_fwd "
              "(fwd_warp, fwd_mma and fwd_tile off); fwd tile: cc1d_fwd_tile for 16-bit (fwd_warp "
              "and fwd_mma off); fwd mma: cc1d_fwd_mma for bfloat16 (fwd_warp off, fwd_mma on at "
              "every width); "
              "fwd warp: cc1d_fwd_warp (fwd_warp on for every dtype, fwd_mma off); "
              "bwd registers: cc1d_bwd (bwd_warp and bwd_mma off); bwd mma: bwd_warp off "
              "(cc1d_bwd_mma for bfloat16 from TUNING['bwd_mma_min_width'], else cc1d_bwd). "
              "float32 runs cc1d_fwd in the registers, tile and mma columns."
              + (" bwd span N: cc1d_bwd_warp with TUNING['warp_span'] = N." if args.warp_sweep
                 else ""), "",
              "| dtype | batch | dim | L | W | fwd registers | fwd tile | fwd mma | fwd warp | "
              "fwd new | bwd registers | bwd mma | bwd new |"
              + ("".join(f" bwd span {k} |" for k in (512, 1024, 4096)) if args.warp_sweep else ""),
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" * 3 if args.warp_sweep else "")]
    for r in rows:
        lines.append(
            f"| {r['dtype']} | {r['batch']} | {r['dim']} | {r['L']} | {r['width']} | "
            f"{r['fwd_reg_kernel_of_copy']:.2f} | {r['fwd_tile_kernel_of_copy']:.2f} | "
            f"{r['fwd_mma_kernel_of_copy']:.2f} | {r['fwd_warp_kernel_of_copy']:.2f} | "
            f"{r['fwd_kernel_of_copy']:.2f} | {r['bwd_reg_kernel_of_copy']:.2f} | "
            f"{r['bwd_mma_kernel_of_copy']:.2f} | {r['bwd_kernel_of_copy']:.2f} |"
            + "".join(f" {r[f'bwd_span{k}_of_copy']:.2f} |" for k in (512, 1024, 4096)
                      if args.warp_sweep))
    if args.history:
        lines += ["", "Earlier A/B (kernel alone, fraction of copy): old: built with "
                  "-DCC1D_PREFETCH=0, one block per item, partials summed by CuPy (the structure "
                  "of commit 548eec1); loop: the resident grid walking the items, no read-ahead, "
                  "cc1d_wsum.", "",
                  "| dtype | batch | dim | L | W | fwd old | fwd loop | bwd old | bwd loop |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            lines.append(
                f"| {r['dtype']} | {r['batch']} | {r['dim']} | {r['L']} | {r['width']} | "
                f"{r['fwd_old_of_copy']:.2f} | {r['fwd_loop_of_copy']:.2f} | "
                f"{r['bwd_old_of_copy']:.2f} | {r['bwd_loop_of_copy']:.2f} |")
    if sweep:
        lines += ["", "Tensor-core kernels built with -DCC1D_MMA_FWD_BUFS (chunks' words in "
                  "registers), -DCC1D_MMA_BWD_AHEAD (chunks copied ahead into shared memory) and -DCC1D_MMA_BWD_BLOCKS (the backward's register bound, "
                  "blocks per SM), launched with other spans (kernel alone; the backward without "
                  "cc1d_wsum; the library: the source's defaults, TUNING['mma_span']):", "",
                  "| dtype | batch | dim | L | W | fwd bufs | bwd ahead | bwd blocks | span | fwd ms "
                  "| of copy | bwd ms | of copy |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for v in sweep:
            lines.append(f"| {v['dtype']} | {v['batch']} | {v['dim']} | {v['L']} | {v['width']} "
                         f"| {v['fwd_bufs']} | {v['bwd_ahead']} | {v['bwd_blocks']} | {v['span']} "
                         f"| {v['fwd_ms']:.4f} | "
                         f"{v['fwd_of_copy']:.2f} | {v['bwd_ms']:.4f} | {v['bwd_of_copy']:.2f} |")
    if variants:
        lines += ["", "Other tile shapes (kernel alone, same bytes; the library uses 128 threads x 4 "
                  "vectors for 4-byte types, 2 for the others):", "",
                  "| dtype | W | threads | vectors/thread | fwd ms | of copy | bwd ms | of copy |",
                  "|---|---|---|---|---|---|---|---|"]
        for v in variants:
            lines.append(f"| {v['dtype']} | {v['width']} | {v['threads']} | {v['vpt']} | "
                         f"{v['fwd_ms']:.4f} | {v['fwd_of_copy']:.2f} | {v['bwd_ms']:.4f} | "
                         f"{v['bwd_of_copy']:.2f} |")
    if warps:
        lines += ["", "cc1d_fwd_warp / cc1d_bwd_warp built with -DCC1D_WARP_FWD_BLOCKS = "
                  "-DCC1D_WARP_BLOCKS (the register bound, blocks of 128 per SM), kernels alone "
                  "(no cc1d_wsum), bias and silu, fraction of copy, forward / backward "
                  "(registers in brackets):", ""]
        bl = sorted({v["blocks"] for v in warps})
        lines += ["| dtype | batch | dim | L | W | " + " | ".join(f"blocks {b}" for b in bl) + " |",
                  "|---|---|---|---|---|" + "---|" * len(bl)]
        cases = sorted({(v["dtype"], v["batch"], v["dim"], v["L"], v["width"]) for v in warps},
                       key=lambda c: (c[0], -c[1], c[4]))
        for c in cases:
            cells = []
            for b in bl:
                v = [v for v in warps if (v["dtype"], v["batch"], v["dim"], v["L"], v["width"],
                                          v["blocks"]) == c + (b,)]
                cells.append(f"{v[0]['fwd_of_copy']:.2f} ({v[0]['fwd_registers']}) / "
                             f"{v[0]['bwd_of_copy']:.2f} ({v[0]['registers']})" if v else "-")
            lines.append("| " + " | ".join(str(x) for x in c) + " | " + " | ".join(cells) + " |")
    with open(stem + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


_ab_modules: dict = {}


def ab_kernels(p, dy):
    """Kernel times (ms) of the A/B builds on problem ``p``: fwd/bwd 'old' and 'loop'.

    Both use the source built with -DCC1D_PREFETCH=0. 'old': one block per item and the
    partials summed by CuPy as the host did at 548eec1; 'loop': at most one resident wave
    of blocks walking the items, and cc1d_wsum.
    """
    import cupy

    from ssmkit._gpu import causal_conv1d as backend
    from ssmkit._gpu import compiler

    io = np.dtype(p.io_dtype).name
    W, H = p.width, p.width - 1
    keys = {kind: backend.name_expression(backend.KernelKey(
        kind, io, W, p.bias is not None, p.silu, p.seq_idx is not None)) for kind in ("fwd", "bwd")}
    mod_key = (io, W, p.bias is not None, p.silu)
    if mod_key not in _ab_modules:
        opts = compiler.compile_options() + ("-DCC1D_PREFETCH=0",)
        mod = cupy.RawModule(code=compiler.kernel_source(backend.SOURCE_FILE), options=opts,
                             name_expressions=list(keys.values()))
        _ab_modules[mod_key] = {k: mod.get_function(v) for k, v in keys.items()}
    fns = _ab_modules[mod_key]
    tile = backend.tile_steps(p.io_dtype)
    n_tiles = -(-p.L // tile)
    n_items = p.batch * p.dim * n_tiles
    y, dx = cupy.empty_like(p.x), cupy.empty_like(p.x)
    final = cupy.empty((p.batch, p.dim, H), dtype=p.io_dtype)
    cd = p.compute_dtype
    partial = cupy.empty((p.batch, p.dim, n_tiles, W + 1), dtype=cd)
    dweight = cupy.empty((p.dim, W), dtype=cd)
    dbias = cupy.empty((p.dim,), dtype=cd)
    wsum = compiler.get_kernel(backend.SOURCE_FILE, backend.name_expression(
        backend.KernelKey("wsum", np.dtype(cd).name, 0, False, False, False)))
    null = np.uint64(0)
    common = (np.int32(p.dim), np.int64(p.L), np.int32(n_tiles), np.int32(n_items), np.int32(1))
    fwd_args = (p.x, p.weight, p.bias, null, null, y, final) + common
    bwd_args = (p.x, p.weight, p.bias, null, null, dy, null, dx, null, partial) + common
    threads = backend.THREADS
    out = {}
    for name, grid in (("old", {k: n_items for k in fns}),
                       ("loop", {k: min(n_items, backend.resident_blocks(f))
                                 for k, f in fns.items()})):
        def fwd():
            fns["fwd"]((grid["fwd"],), (threads,), fwd_args)

        def bwd():
            fns["bwd"]((grid["bwd"],), (threads,), bwd_args)
            if name == "old":
                sums = partial.sum(axis=(0, 2))
                sums[:, :W].copy(), sums[:, W].copy()
            else:
                wsum((-(-p.dim * (W + 1) // threads),), (threads,),
                     (partial, dweight, dbias, np.int32(p.batch), np.int32(p.dim),
                      np.int32(n_tiles), np.int32(W)))

        out["fwd_" + name] = cuda_median_ms(fwd)
        out["bwd_" + name] = cuda_median_ms(bwd)
    return out


def _variant_row(copy_bw, act, fwd_ms, bwd_ms, **fields):
    """One row of a sweep of raw kernels, printed: ``fields``, the times and their fractions
    of copy (forward x + y, backward x + dy + dx: ``act`` bytes each)."""
    row = dict(fields, fwd_ms=round(fwd_ms, 4), bwd_ms=round(bwd_ms, 4),
               fwd_of_copy=round(2 * act / (fwd_ms * 1e-3) / 1e12 / copy_bw, 3),
               bwd_of_copy=round(3 * act / (bwd_ms * 1e-3) / 1e12 / copy_bw, 3))
    print(json.dumps(row), flush=True)
    return row


def _raw_arrays(rng, batch, dim, L, W, dtype):
    """Inputs and outputs for launching the kernels directly: x, dy (dtype), taps, bias
    (float32), y, dx and the final state."""
    import cupy

    x = rng.standard_normal((batch, dim, L), dtype=cupy.float32).astype(dtype)
    dy = rng.standard_normal((batch, dim, L), dtype=cupy.float32).astype(dtype)
    w = rng.standard_normal((dim, W), dtype=cupy.float32) / W
    b = rng.standard_normal(dim, dtype=cupy.float32)
    final = cupy.empty((batch, dim, W - 1), dtype=dtype)
    return x, dy, w, b, cupy.empty_like(x), cupy.empty_like(x), final


def mma_variants(copy_bw, shapes=((8, 3072, 2048), (4, 5376, 4096)), widths=(4, 8),
                 builds=((4, 3, 8), (6, 4, 8), (8, 6, 7)), spans=(1024, 2048, 4096)):
    """Time cc1d_fwd_mma / cc1d_bwd_mma (bfloat16, bias, silu) for each build (fwd bufs, bwd
    ahead, bwd blocks): -DCC1D_MMA_FWD_BUFS (chunks' words in registers, all but
    one in flight), -DCC1D_MMA_BWD_AHEAD (chunks the backward copies ahead into shared
    memory) and -DCC1D_MMA_BWD_BLOCKS (the backward's register bound, blocks per SM; 1:
    none), launched with each span."""
    import cupy
    import ml_dtypes

    from ssmkit._gpu import causal_conv1d as backend
    from ssmkit._gpu import compiler

    rng = cupy.random.default_rng(2)
    src = compiler.kernel_source(backend.SOURCE_FILE)
    dtype = np.dtype(ml_dtypes.bfloat16)
    out = []
    keys = {(kind, W): backend.name_expression(backend.KernelKey(kind, dtype.name, W, True, True,
                                                                 False))
            for kind in ("fwd_mma", "bwd_mma") for W in widths}
    for fwd_bufs, bwd_ahead, bwd_blocks in builds:
        opts = compiler.compile_options() + (f"-DCC1D_MMA_FWD_BUFS={fwd_bufs}",
                                             f"-DCC1D_MMA_BWD_AHEAD={bwd_ahead}",
                                             f"-DCC1D_MMA_BWD_BLOCKS={bwd_blocks}")
        mod = cupy.RawModule(code=src, options=opts, name_expressions=list(keys.values()))
        for (batch, dim, L), W in [(s, w) for s in shapes for w in widths]:
            x, dy, w, b, y, dx, final = _raw_arrays(rng, batch, dim, L, W, dtype)
            act = x.size * dtype.itemsize
            fwd, bwd = (mod.get_function(keys[k, W]) for k in ("fwd_mma", "bwd_mma"))
            for span in spans:
                n_spans = -(-L // span)
                n_items = batch * dim * n_spans
                grid = (-(-n_items // 4),)
                partial = cupy.empty((batch, dim, n_spans, W + 1), dtype=cupy.float32)
                tail = (np.int32(dim), np.int32(L), np.int32(span), np.int32(n_spans),
                        np.int32(n_items))
                fwd_ms = cuda_median_ms(lambda: fwd(grid, (backend.THREADS,),
                                                    (x, w, b, y, final) + tail))
                bwd_ms = cuda_median_ms(lambda: bwd(grid, (backend.THREADS,),
                                                    (x, w, b, dy, np.uint64(0), dx, partial)
                                                    + tail))
                out.append(_variant_row(copy_bw, act, fwd_ms, bwd_ms, dtype=dtype.name, width=W,
                                        batch=batch, dim=dim, L=L, fwd_bufs=fwd_bufs,
                                        bwd_ahead=bwd_ahead, bwd_blocks=bwd_blocks, span=span))
    return out


def warp_variants(copy_bw, blocks=(5, 6, 7, 8), widths=(2, 3, 4, 5, 6, 7, 8),
                  shapes=((8, 3072, 2048), (4, 5376, 4096)), dtypes=("bfloat16", "float32")):
    """Time cc1d_fwd_warp and cc1d_bwd_warp (bias, silu; kernels alone, the backward without
    cc1d_wsum) built with each -DCC1D_WARP_FWD_BLOCKS = -DCC1D_WARP_BLOCKS of ``blocks``
    (the register bound, blocks per SM), every width on the first shape and widths 4 and 8
    on the others, launched as the library plans it."""
    import cupy
    import ml_dtypes

    from ssmkit._gpu import causal_conv1d as backend
    from ssmkit._gpu import compiler

    rng = cupy.random.default_rng(3)
    src = compiler.kernel_source(backend.SOURCE_FILE)
    out = []
    for B in blocks:
        opts = compiler.compile_options() + (f"-DCC1D_WARP_BLOCKS={B}",
                                             f"-DCC1D_WARP_FWD_BLOCKS={B}")
        keys = {(kind, io, W): backend.name_expression(backend.KernelKey(kind, io, W, True, True,
                                                                         False))
                for kind in ("fwd_warp", "bwd_warp") for io in dtypes for W in widths}
        mod = cupy.RawModule(code=src, options=opts, name_expressions=list(keys.values()))
        for io in dtypes:
            dtype = np.dtype(ml_dtypes.bfloat16 if io == "bfloat16" else io)
            for j, (batch, dim, L) in enumerate(shapes):
                for W in widths if j == 0 else (4, 8):
                    x, dy, w, b, y, dx, final = _raw_arrays(rng, batch, dim, L, W, dtype)
                    plan = backend.warp_plan(rows=batch * dim, L=L)
                    partial = cupy.empty((batch, dim, plan["n_spans"], W + 1), dtype=cupy.float32)
                    fwd, bwd = (mod.get_function(keys[k, io, W]) for k in ("fwd_warp", "bwd_warp"))
                    tail = (np.int32(dim), np.int64(L), np.int64(plan["span"]),
                            np.int32(plan["n_spans"]), np.int32(plan["n_items"]))
                    grid, block = (plan["blocks"],), (backend.THREADS,)
                    fwd_ms = cuda_median_ms(lambda: fwd(grid, block, (x, w, b, y, final) + tail))
                    ms = cuda_median_ms(lambda: bwd(grid, block, (x, w, b, dy, np.uint64(0), dx,
                                                                  partial) + tail))
                    act = x.size * dtype.itemsize
                    row = dict(dtype=io, width=W, batch=batch, dim=dim, L=L, blocks=B,
                               registers=int(bwd.num_regs), bwd_ms=round(ms, 4),
                               bwd_of_copy=round(3 * act / (ms * 1e-3) / 1e12 / copy_bw, 3),
                               fwd_registers=int(fwd.num_regs), fwd_ms=round(fwd_ms, 4),
                               fwd_of_copy=round(2 * act / (fwd_ms * 1e-3) / 1e12 / copy_bw, 3))
                    print(json.dumps(row), flush=True)
                    out.append(row)
    return out


def tile_variants(copy_bw, batch=8, dim=3072, L=2048, W=4):
    """Time the raw kernels compiled with other tile shapes (-DCC1D_THREADS, -DCC1D_VPT)."""
    import cupy
    import ml_dtypes

    from ssmkit._gpu import causal_conv1d as backend
    from ssmkit._gpu import compiler

    rng = cupy.random.default_rng(1)
    src = compiler.kernel_source(backend.SOURCE_FILE)
    out = []
    for dtype in (np.dtype(np.float32), np.dtype(ml_dtypes.bfloat16)):
        x, dy, w, b, y, dx, final = _raw_arrays(rng, batch, dim, L, W, dtype)
        act = x.size * dtype.itemsize
        for threads, vpt in ((128, 2), (128, 1), (128, 4), (256, 1), (256, 2)):
            tile = threads * vpt * (16 // dtype.itemsize)
            n_tiles = -(-L // tile)
            partial = cupy.empty((batch, dim, n_tiles, W + 1), dtype=cupy.float32)
            opts = compiler.compile_options() + (f"-DCC1D_THREADS={threads}", f"-DCC1D_VPT={vpt}")
            keys = {kind: backend.name_expression(backend.KernelKey(
                kind, dtype.name, W, True, True, False)) for kind in ("fwd", "bwd")}
            mod = cupy.RawModule(code=src, options=opts, name_expressions=list(keys.values()))
            fwd = mod.get_function(keys["fwd"])
            bwd = mod.get_function(keys["bwd"])
            grid = (batch * dim * n_tiles,)
            n_items = batch * dim * n_tiles
            common = (np.int32(dim), np.int64(L), np.int32(n_tiles), np.int32(n_items),
                      np.int32(1))
            fwd_ms = cuda_median_ms(lambda: fwd(grid, (threads,), (
                x, w, b, np.uint64(0), np.uint64(0), y, final) + common))
            bwd_ms = cuda_median_ms(lambda: bwd(grid, (threads,), (
                x, w, b, np.uint64(0), np.uint64(0), dy, np.uint64(0), dx, np.uint64(0),
                partial) + common))
            out.append(_variant_row(copy_bw, act, fwd_ms, bwd_ms, dtype=dtype.name, width=W,
                                    batch=batch, dim=dim, L=L, threads=threads, vpt=vpt))
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="the first shape only")
    parser.add_argument("--tiles", action="store_true",
                        help="also time other tile shapes (-DCC1D_THREADS, -DCC1D_VPT)")
    parser.add_argument("--history", action="store_true",
                        help="also the earlier A/B builds (-DCC1D_PREFETCH=0, old and loop)")
    parser.add_argument("--mma-sweep", action="store_true",
                        help="also the tensor-core kernels with other read-ahead depths and spans")
    parser.add_argument("--warp-blocks", action="store_true",
                        help="also the _warp kernels built with other register bounds")
    parser.add_argument("--warp-sweep", action="store_true",
                        help="also cc1d_bwd_warp with spans of 512, 1024 and 4096 steps")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    run(parser.parse_args())


if __name__ == "__main__":
    main()
