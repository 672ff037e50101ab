"""Time ssmkit.ssd (forward, forward+backward) on the GPU, or the CPU backend against the reference.

GPU mode (default) times the Mamba-2 SSD configuration of ../shared/docs/peers-h200.md
(batch 4, L 4096, H 80, P 64, G 1, N 128, chunk 256, D, dt_bias, dt_softplus) in
bfloat16 and float32, and a few more shapes: CUDA-event-timed medians after warm-up,
the device-to-device copy bandwidth measured in the same run, each time set against
the compulsory traffic (bytes / copy bandwidth) and mamba_ssm's Triton time where
peers-h200.md has one. Writes ``results/ssd_<gpu>.json`` and a markdown table beside it.
16-bit rows run the forward on the tensor-core kernels (cuda_src/ssd_mma.cu) and also time it
with ``SSMKIT_SSD_MMA=0`` and ``SSMKIT_SSD_TF32=0`` (the CUDA-core kernels), and the
forward+backward also with ``SSMKIT_SSD_MMA_BWD=0`` and ``SSMKIT_SSD_TF32=0`` (the backward's
chunk products on CUDA cores; tensor cores by default); float32 rows run their chunk products
and chunk states on tensor cores as 3 x TF32 and also time both with ``SSMKIT_SSD_TF32=0``; the
row "float32+tf32" is the float32 peer row with ``allow_tf32=True`` (single TF32 products, the
precision of mamba_ssm's float32 Triton kernels); the
peer bfloat16 row's forward is split into its stages (effective dt + chunk sums, chunk states,
state passing, outputs), and so is its tensor-core backward (products, adjoint chunk state on
both paths, adjoint passing, the fused per-step pass, the whole backward).

CPU mode (``--cpu``) times the Numba backend against the float64 reference loop.

Usage::

    python benchmarks/bench_ssd.py [--quick] [--out DIR]
    python benchmarks/bench_ssd.py --cpu
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import timing  # noqa: E402
from timing import commit, copy_tbps  # noqa: E402
import ssmkit  # noqa: E402

cuda_median_ms = functools.partial(timing.cuda_median_ms, warmup=2, reps=10)  # this script's repetitions

# (dtype, batch, L, H, P, G, N, chunk, mamba_ssm fwd ms, fwd+bwd ms) from peers-h200.md;
# dtype "float32+tf32": float32 with allow_tf32 (single TF32 products, the precision of
# mamba_ssm's float32 Triton kernels)
TABLE = [
    ("bfloat16", 4, 4096, 80, 64, 1, 128, 256, 0.694, 3.67),
    ("float32", 4, 4096, 80, 64, 1, 128, 256, 1.18, 5.20),
    ("float32+tf32", 4, 4096, 80, 64, 1, 128, 256, 1.18, 5.20),
    ("bfloat16", 4, 4096, 80, 64, 1, 128, 128, None, None),
    ("float16", 4, 4096, 80, 64, 1, 128, 256, None, None),
    ("float32", 1, 4096, 8, 64, 1, 64, 256, None, None),
]


def row_dtype(name):
    """A TABLE dtype as (the arrays' dtype, extra ssd keywords): "float32+tf32" is float32
    with allow_tf32."""
    dtype, _, option = name.partition("+")
    return dtype, ({"allow_tf32": True} if option == "tf32" else {})


def make_inputs(xp, dtype, batch, L, H, P, G, N, seed=0):
    """The peers' configuration: D, dt_bias, dt_softplus; no z."""
    rng = np.random.default_rng(seed)

    def rand(shape, scale=1.0, shift=0.0, dt=dtype):
        a = xp.asarray(rng.standard_normal(shape, dtype=np.float32) * scale + shift)
        return a.astype(dt) if dt != "float32" else a

    return dict(x=rand((batch, L, H, P)), dt=rand((batch, L, H), 0.5, -1.0, dt="float32"),
                A=-xp.exp(rand((H,), 0.5, dt="float32")), B=rand((batch, L, G, N)),
                C=rand((batch, L, G, N)), D=rand((H,), dt="float32"),
                dt_bias=rand((H,), 0.1, dt="float32"))


def compulsory_bytes(dtype, batch, L, H, P, G, N):
    """Bytes the forward and forward+backward must move at least.

    Forward: read x, B, C, dt, write y. The backward adds: read dy, x, B, C, dt;
    write dx, dB, dC, ddt.
    """
    s = 2 if dtype in ("bfloat16", "float16") else np.dtype(dtype).itemsize
    xs = batch * L * H * P * s
    bc = 2 * batch * L * G * N * s
    dt = batch * L * H * 4
    fwd = 2 * xs + bc + dt
    bwd = 3 * xs + 2 * bc + 2 * dt
    return fwd, fwd + bwd


class _env:
    """Set one environment variable inside a with block (restored after)."""

    def __init__(self, name, value):
        self.name, self.value = name, value

    def __enter__(self):
        self.before = os.environ.get(self.name)
        os.environ[self.name] = self.value

    def __exit__(self, *exc):
        if self.before is None:
            del os.environ[self.name]
        else:
            os.environ[self.name] = self.before


def time_row(cupy, dtype, batch, L, H, P, G, N, chunk):
    """Forward and forward+backward milliseconds for one configuration, and the forward and
    the forward+backward with the CUDA-core kernels (16-bit dtypes: the forward, and the
    backward's products; float32: every product; none for float64)."""
    dtype, options = row_dtype(dtype)
    x = make_inputs(cupy, dtype, batch, L, H, P, G, N)
    kw = dict(chunk_size=chunk, dt_softplus=True, **options)
    fwd = lambda: ssmkit.ssd(**x, **kw)  # noqa: E731
    fwd_ms = cuda_median_ms(fwd, calls=5)
    fwd_lat_ms = cuda_median_ms(fwd)
    dy = cupy.ones_like(x["x"])

    def fwd_bwd():
        _, pullback = ssmkit.ssd_vjp(**x, **kw)
        pullback(dy)

    fb_ms = cuda_median_ms(fwd_bwd, reps=5, calls=3)
    fb_lat_ms = cuda_median_ms(fwd_bwd, reps=5)
    fwd_old_ms = fb_old_ms = None
    if dtype in ("float16", "bfloat16", "float32") and not options:
        sixteen = dtype != "float32"
        with _env("SSMKIT_SSD_TF32", "0"), _env("SSMKIT_SSD_MMA", "0" if sixteen else "1"):
            fwd_old_ms = cuda_median_ms(fwd, calls=5)  # the same forward on CUDA cores
        with _env("SSMKIT_SSD_TF32", "0"), _env("SSMKIT_SSD_MMA_BWD", "0" if sixteen else "1"):
            fb_old_ms = cuda_median_ms(fwd_bwd, reps=5, calls=3)  # the backward's products too
    return fwd_ms, fb_ms, fwd_old_ms, fb_old_ms, fwd_lat_ms, fb_lat_ms


def _back_to_back(fn):
    """Device time per call of ``fn`` over 5 back-to-back calls (see ``cuda_median_ms``)."""
    return cuda_median_ms(fn, calls=5)


def forward_stages(cupy, dtype, batch, L, H, P, G, N, chunk):
    """Milliseconds of each stage of the tensor-core forward (16-bit dtypes)."""
    import math

    from ssmkit import _ssd
    from ssmkit._gpu import ssd as gpu_ssd

    x = make_inputs(cupy, dtype, batch, L, H, P, G, N)
    p, _, _ = _ssd._prepare("ssd", x["x"], x["dt"], x["A"], x["B"], x["C"], chunk, x["D"], None,
                            x["dt_bias"], True, (0.0, math.inf), None, None, None)
    assert gpu_ssd.uses_mma(p)
    lay = gpu_ssd._Layout(p)
    chunk_states = lay.chunk_state_mma(p)
    final = cupy.zeros((p.n_slots, p.H, p.P, p.N), dtype=p.compute_dtype)
    _, entering = lay.passing(p, chunk_states, entering=True, final=final)
    cb = lay.cb_mma(p)
    y = cupy.empty(p.x.shape, dtype=p.io_dtype)
    return {
        "layout (dt', chunk sums)": cuda_median_ms(lambda: gpu_ssd._Layout(p, factor=False),
                                                   calls=5),
        "ssd_mma_chunk_state": cuda_median_ms(lambda: lay.chunk_state_mma(p), calls=5),
        # as the forward without checkpoints runs it: the final states kept, not every boundary
        "ssd_state_passing": cuda_median_ms(
            lambda: lay.passing(p, chunk_states, entering=True, final=final), calls=5),
        "ssd_state_passing, every boundary kept (the VJP's forward)": cuda_median_ms(
            lambda: lay.passing(p, chunk_states, entering=True), calls=5),
        "ssd_mma_state_walk (chunk states and passing in one kernel)": cuda_median_ms(
            lambda: lay.state_walk_mma(p, final=final), calls=5),
        "ssd_mma_state_walk, every boundary kept": cuda_median_ms(
            lambda: lay.state_walk_mma(p), calls=5),
        "ssd_mma_cb": cuda_median_ms(lambda: lay.cb_mma(p), calls=5),
        "ssd_mma_chunk_out": cuda_median_ms(lambda: lay.out_mma(p, entering, y, cb), calls=5),
        "ssd_mma_fwd (the whole forward in one kernel)": cuda_median_ms(
            lambda: lay.fwd_mma(p, y, final=final), calls=5),
        "ssd_mma_fwd, every boundary kept": cuda_median_ms(lambda: lay.fwd_mma(p, y), calls=5),
        **{f"whole forward, {label}": _forward_with_walk(cupy, x, chunk, walk)
           for walk, label in ((True, "state walk"), (False, "chunk states then passing"),
                               ("fused", "one kernel"))},
    }


def _with_switch(name, value, fn, **timing):
    """Device ms of ``fn`` (cuda_median_ms) with the switch ``ssmkit._gpu.ssd.<name>`` set to
    ``value``."""
    from ssmkit._gpu import ssd as gpu_ssd

    before = getattr(gpu_ssd, name)
    setattr(gpu_ssd, name, value)
    try:
        return cuda_median_ms(fn, **timing)
    finally:
        setattr(gpu_ssd, name, before)


def _forward_with_walk(cupy, x, chunk, walk):
    """Device ms per ssmkit.ssd call with ``ssmkit._gpu.ssd.MMA_STATE_WALK`` set to ``walk``
    and the one-kernel forward off, or (``walk = "fused"``) the one-kernel forward on."""
    from ssmkit._gpu import ssd as gpu_ssd

    call = lambda: ssmkit.ssd(**x, chunk_size=chunk, dt_softplus=True)  # noqa: E731
    if walk == "fused":
        return _with_switch("MMA_FUSED_FWD", True, call, calls=5)
    before = gpu_ssd.MMA_FUSED_FWD
    gpu_ssd.MMA_FUSED_FWD = False
    try:
        return _with_switch("MMA_STATE_WALK", walk, call, calls=5)
    finally:
        gpu_ssd.MMA_FUSED_FWD = before


def backward_stages(cupy, dtype, batch, L, H, P, G, N, chunk):
    """Milliseconds of each stage of the tensor-core backward (16-bit dtypes), on the
    forward's own boundary states and a random output cotangent (no z: dY = dy)."""
    import math

    from ssmkit import _ssd
    from ssmkit._gpu import ssd as gpu_ssd

    x = make_inputs(cupy, dtype, batch, L, H, P, G, N)
    p, _, _ = _ssd._prepare("ssd", x["x"], x["dt"], x["A"], x["B"], x["C"], chunk, x["D"], None,
                            x["dt_bias"], True, (0.0, math.inf), None, None, None)
    assert gpu_ssd.uses_mma_bwd(p)
    _, _, checkpoints = gpu_ssd.ssd_forward(p, save_checkpoints=True)
    entering = checkpoints[1]  # the states entering the chunks, 16 bits
    lay = gpu_ssd._Layout(p)
    rng = cupy.random.default_rng(1)
    dy = rng.standard_normal(p.x.shape, dtype=cupy.float32).astype(p.io_dtype)
    cb = gpu_ssd._diag_cb(p, p.compute_dtype)
    cbl, cbt = lay.cb_mma(p, transposed=True)
    yo = lay.mm_mma(p, "ycore", p.C, p.B, p.x, entering, with_diag=False, cb=cbl)
    K = lay.chunk_state_mma(p, dy, p.C, adjoint=True)
    _, _, dHx = gpu_ssd._adjoint_passing(p, lay, K, None, rounded=True)
    bnd = cupy.empty((batch, L, H), dtype=cupy.float32)
    xGB = cupy.empty((batch, L, H), dtype=cupy.float32)
    go = lay.mm_mma(p, "GB", p.B, p.C, dy, dHx, with_diag=False, Xd=p.x, bnd=bnd, cb=cbt)
    dyc = dy.astype(cupy.float32)
    rows = gpu_ssd._fused_rows(p, lay, dy, cb)
    gs = lay.shared_blocks(p)
    lay.dc_mma(p, dy, entering, gs)  # (dB's reads of gs: the blocks of this call)
    return {
        "layout (dt', chunk sums)": _back_to_back(lambda: gpu_ssd._Layout(p)),
        "C B^T and its transpose": _back_to_back(lambda: lay.cb_mma(p, transposed=True)),
        "ycore": _back_to_back(
            lambda: lay.mm_mma(p, "ycore", p.C, p.B, p.x, entering, with_diag=False, cb=cbl)),
        "adjoint chunk state (tensor cores)": _back_to_back(
            lambda: lay.chunk_state_mma(p, dy, p.C, adjoint=True)),
        "adjoint chunk state (CUDA cores, before)": _back_to_back(
            lambda: lay.chunk_state(p, dyc, p.C, adjoint=True)),
        "adjoint passing": _back_to_back(
            lambda: gpu_ssd._adjoint_passing(p, lay, K, None, rounded=True)),
        "GB": _back_to_back(
            lambda: lay.mm_mma(p, "GB", p.B, p.C, dy, dHx, with_diag=False, Xd=p.x, bnd=bnd,
                               cb=cbt)),
        "dB (summed over heads)": _back_to_back(lambda: lay.db_mma(p, dy, dHx, cbt, xGB)),
        "dC (summed over heads)": _back_to_back(lambda: lay.dc_mma(p, dy, entering)),
        "dC keeping its summed blocks": _back_to_back(lambda: lay.dc_mma(p, dy, entering, gs)),
        "dB from dC's summed blocks": _back_to_back(
            lambda: lay.db_mma(p, dy, dHx, None, None, gs)),
        "GB with the rows' final part and x.(G B) (fused, shared blocks)": _back_to_back(
            lambda: lay.mm_mma(p, "GB", p.B, p.C, dy, dHx, with_diag=False, Xd=p.x, bnd=bnd,
                               cb=cbt, rows=rows, rowdot=xGB)),
        "rows (dx, dcum, dD)": _back_to_back(lambda: gpu_ssd._rows(p, lay, dy, True, cb, yo, go)),
        "ycore with the rows' first part (fused)": _back_to_back(
            lambda: lay.mm_mma(p, "ycore", p.C, p.B, p.x, entering, with_diag=False, cb=cbl,
                               rows=rows)),
        "GB with the rows' final part (fused)": _back_to_back(
            lambda: lay.mm_mma(p, "GB", p.B, p.C, dy, dHx, with_diag=False, Xd=p.x, bnd=bnd,
                               cb=cbt, rows=rows)),
        **{f"whole backward, {label}": _with_switch(
            "MMA_ROWS_FUSED", fused, lambda: gpu_ssd.ssd_backward(p, checkpoints, dy, None),
            calls=5) for fused, label in ((True, "rows fused"), (False, "rows pass"))},
        "whole backward, rows fused, dB's own blocks": _with_switch(
            "MMA_SHARED_BLOCKS", False, lambda: gpu_ssd.ssd_backward(p, checkpoints, dy, None),
            calls=5),
    }


def run_gpu(args):
    import cupy

    dev = cupy.cuda.Device()
    gpu = cupy.cuda.runtime.getDeviceProperties(dev.id)["name"].decode()
    copy_bw = copy_tbps()
    print(f"{gpu}: copy {copy_bw:.2f} TB/s", flush=True)
    rows = []
    table = TABLE[:3] if args.quick else TABLE
    for dtype, batch, L, H, P, G, N, chunk, peer_fwd, peer_fb in table:
        fwd_ms, fb_ms, fwd_old_ms, fb_old_ms, fwd_lat_ms, fb_lat_ms = time_row(
            cupy, dtype, batch, L, H, P, G, N, chunk)
        cupy.get_default_memory_pool().free_all_blocks()
        fwd_bytes, fb_bytes = compulsory_bytes(row_dtype(dtype)[0], batch, L, H, P, G, N)
        rows.append(dict(
            op="ssd", gpu=gpu, dtype=dtype, batch=batch, L=L, heads=H, headdim=P, groups=G,
            N=N, chunk_size=chunk, fwd_ms=round(fwd_ms, 4), fwd_bwd_ms=round(fb_ms, 4),
            fwd_latency_ms=round(fwd_lat_ms, 4), fwd_bwd_latency_ms=round(fb_lat_ms, 4),
            fwd_path=("tensor cores" if dtype in ("float16", "bfloat16")
                      and os.environ.get("SSMKIT_SSD_MMA", "1") != "0" else "CUDA cores"),
            fwd_cuda_cores_ms=None if fwd_old_ms is None else round(fwd_old_ms, 4),
            bwd_path=("tensor cores" if dtype in ("float16", "bfloat16")
                      and os.environ.get("SSMKIT_SSD_MMA_BWD", "1") != "0" else "CUDA cores"),
            fwd_bwd_cuda_core_bwd_ms=None if fb_old_ms is None else round(fb_old_ms, 4),
            copy_tbps=round(copy_bw, 3),
            fwd_of_copy=round(fwd_bytes / (fwd_ms * 1e-3) / 1e12 / copy_bw, 4),
            fwd_bwd_of_copy=round(fb_bytes / (fb_ms * 1e-3) / 1e12 / copy_bw, 4),
            mamba_ssm_fwd_ms=peer_fwd, mamba_ssm_fwd_bwd_ms=peer_fb,
            commit=commit(), date=datetime.date.today().isoformat()))
        print(json.dumps(rows[-1]), flush=True)
    stages = forward_stages(cupy, *TABLE[0][:8])
    cupy.get_default_memory_pool().free_all_blocks()
    print(json.dumps({"forward stages ms": stages}), flush=True)
    bstages = backward_stages(cupy, *TABLE[0][:8])
    cupy.get_default_memory_pool().free_all_blocks()
    print(json.dumps({"backward stages ms": bstages}), flush=True)

    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, "ssd_h200" if "H200" in gpu else "ssd_gpu")
    with open(stem + ".json", "w") as f:
        json.dump(rows, f, indent=1)
    lines = [f"# ssd on {gpu}, commit {rows[0]['commit']}, {rows[0]['date']}",
             "",
             f"Copy bandwidth {copy_bw:.2f} TB/s, measured in the same run. fwd / fwd+bwd: "
             "median CUDA-event time per call over back-to-back calls after warm-up (5 forward, "
             "3 forward+backward calls between two events, one untimed call queued before "
             "them); latency: one call between two "
             "events, host work included. 'of copy': compulsory bytes "
             "/ time as a fraction of the copy bandwidth. mamba_ssm: its Triton "
             "mamba_chunk_scan_combined, from peers-h200.md (x mamba_ssm > 1 means faster). "
             "16-bit forwards run on tensor cores (cuda_src/ssd_mma.cu); 'fwd ms, CUDA "
             "cores': the same call with SSMKIT_SSD_MMA=0 and SSMKIT_SSD_TF32=0; 16-bit "
             "backwards run their chunk products on tensor cores; 'fwd+bwd ms, CUDA-core bwd': "
             "the same call with SSMKIT_SSD_MMA_BWD=0 and SSMKIT_SSD_TF32=0. float32 rows run "
             "their chunk products and chunk states on tensor cores as 3 x TF32 (float32's "
             "accuracy); their CUDA-core columns: the same calls with SSMKIT_SSD_TF32=0. "
             "float32+tf32: float32 with allow_tf32=True (each product one TF32 product, "
             "the precision of mamba_ssm's float32 Triton kernels).",
             "",
             "| dtype | batch | L | H | P | G | N | chunk | fwd ms | latency | of copy | "
             "x mamba_ssm | fwd ms, CUDA cores | fwd+bwd ms | latency | of copy | x mamba_ssm | "
             "fwd+bwd ms, CUDA-core bwd |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        pf = f"{r['mamba_ssm_fwd_ms'] / r['fwd_ms']:.2f}" if r["mamba_ssm_fwd_ms"] else "-"
        pb = (f"{r['mamba_ssm_fwd_bwd_ms'] / r['fwd_bwd_ms']:.2f}" if r["mamba_ssm_fwd_bwd_ms"]
              else "-")
        tc = r["fwd_bwd_cuda_core_bwd_ms"]
        tc = "-" if tc is None else f"{tc:.3f}"
        lines.append(
            f"| {r['dtype']} | {r['batch']} | {r['L']} | {r['heads']} | {r['headdim']} | "
            f"{r['groups']} | {r['N']} | {r['chunk_size']} | {r['fwd_ms']:.3f} | "
            f"{r['fwd_latency_ms']:.3f} | {r['fwd_of_copy']:.3f} | {pf} | "
            f"{'-' if r['fwd_cuda_cores_ms'] is None else format(r['fwd_cuda_cores_ms'], '.3f')} | "
            f"{r['fwd_bwd_ms']:.3f} | {r['fwd_bwd_latency_ms']:.3f} | "
            f"{r['fwd_bwd_of_copy']:.3f} | {pb} | {tc} |")
    lines += ["", "Forward stages of the first row (tensor-core path), ms: " +
              ", ".join(f"{k} {v:.3f}" for k, v in stages.items()) + ".",
              "", "Backward stages of the first row (tensor-core path), ms: " +
              ", ".join(f"{k} {v:.3f}" for k, v in bstages.items()) + "."]
    with open(stem + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


def run_cpu(args):
    from ssmkit import reference

    batch, L, H, P, G, N = 1, 4096, 8, 64, 1, 64
    x = make_inputs(np, "float32", batch, L, H, P, G, N)
    kw = dict(dt_softplus=True)

    def best_of(fn, reps=3):
        fn()  # compile / warm caches
        out = []
        for _ in range(reps):
            t = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t)
        return min(out)

    fwd = best_of(lambda: ssmkit.ssd(**x, **kw))
    dy = np.ones_like(x["x"])

    def fwd_bwd():
        _, pb = ssmkit.ssd_vjp(**x, **kw)
        pb(dy)

    fb = best_of(fwd_bwd)
    ref = best_of(lambda: reference.ssd(**x, **kw), reps=1)
    print(f"CPU ({os.cpu_count()} cores), batch {batch}, L {L}, H {H}, P {P}, N {N}, float32: "
          f"ssmkit.ssd {fwd * 1e3:.1f} ms, ssd_vjp + pullback {fb * 1e3:.1f} ms; "
          f"float64 reference loop (forward) {ref * 1e3:.1f} ms")


# ssd_mma_state_walk's variants: state columns per block (MMA_WALK_NW), compile-time defines
WALK_VARIANTS = [
    (64, "SSD_MMA_WALK_ROWS=32 SSD_MMA_WALK_BUFS=3"),  # the defaults
    (64, "SSD_MMA_WALK_ROWS=32 SSD_MMA_WALK_BUFS=4"),
    (64, "SSD_MMA_WALK_ROWS=16 SSD_MMA_WALK_BUFS=6"),
    (128, "SSD_MMA_WALK_ROWS=32 SSD_MMA_WALK_BUFS_WIDE=3"),
]


def walk_sweep():
    """Device ms of ssd_mma_state_walk (final states only, as ssmkit.ssd runs it) at the
    peer bfloat16 shape for each of WALK_VARIANTS, each compiled in a process of its own
    (SSMKIT_CUDA_DEFINES), against the two kernels it replaces, timed in the same process."""
    import subprocess

    code = (
        "import json, math, sys; sys.path.insert(0, %r)\n"
        "import cupy, bench_ssd\n"
        "from ssmkit import _ssd\n"
        "from ssmkit._gpu import ssd as g\n"
        "from timing import cuda_median_ms\n"
        "x = bench_ssd.make_inputs(cupy, 'bfloat16', 4, 4096, 80, 64, 1, 128)\n"
        "p, _, _ = _ssd._prepare('ssd', x['x'], x['dt'], x['A'], x['B'], x['C'], 256, x['D'], "
        "None, x['dt_bias'], True, (0.0, math.inf), None, None, None)\n"
        "g.MMA_WALK_NW = int(sys.argv[1])\n"
        "lay = g._Layout(p)\n"
        "final = cupy.zeros((p.n_slots, p.H, p.P, p.N), dtype=p.compute_dtype)\n"
        "cs = lay.chunk_state_mma(p)\n"
        "walk = cuda_median_ms(lambda: lay.state_walk_mma(p, final=final), calls=5)\n"
        "two = cuda_median_ms(lambda: (lay.chunk_state_mma(p), lay.passing(p, cs, "
        "entering=True, final=final)), calls=5)\n"
        "print(json.dumps(dict(walk_ms=round(walk, 4), two_kernels_ms=round(two, 4))))\n"
    ) % os.path.dirname(os.path.abspath(__file__))
    for nw, defines in WALK_VARIANTS:
        run = subprocess.run([sys.executable, "-c", code, str(nw)], capture_output=True,
                             text=True, env=dict(os.environ, SSMKIT_CUDA_DEFINES=defines))
        last = (run.stdout.strip().splitlines() or [run.stderr.strip()[-300:]])[-1]
        print(f"NW {nw}, {defines}: {last}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu", action="store_true", help="time the CPU backend")
    ap.add_argument("--quick", action="store_true", help="only the peers' rows")
    ap.add_argument("--walk-sweep", action="store_true",
                    help="time ssd_mma_state_walk's compile-time variants (WALK_VARIANTS)")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                  "results"))
    args = ap.parse_args()
    if args.walk_sweep:
        walk_sweep()
    else:
        run_cpu(args) if args.cpu else run_gpu(args)


if __name__ == "__main__":
    main()
