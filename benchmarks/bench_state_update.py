"""Time ssmkit.state_update (one decoding step) and set each time against the copy bandwidth.

The step is memory-bound: its floor is the compulsory bytes (the state read and
written, plus x, dt, B, C, y) over the device-to-device copy bandwidth measured
in the same run. For each configuration it reports:

* ``kernel_ms``: the kernel alone, replayed back to back with the launch
  arguments prepared once (what the GPU spends per step);
* ``ms``: the public call back to back (validation, dispatch and launch on the
  host overlap the previous call's kernel, as in a decoding loop);
* ``latency_ms``: one public call between two events, host work included;
* ``host_us``: the host side of one public call (checks, planning, launch
  arguments), the kernel replaced by a no-op: wall-clock median over
  batches of repeated calls (the repeated call replays a cached plan);
* ``launch_us``: CuPy's own time to launch the kernel with prepared
  arguments (wall clock, median), the rest of the host side.

Before timing, the result of the public call is compared with a CuPy float32
evaluation of the same step (relative error printed and stored). Each
configuration is also timed with ``warp=()`` (no state in the warp kernel), ``warp=all``
(every state the warp kernel can take in it), then also
``tile=()`` (no state in the tile kernel),
``one_pass=()`` (every state in the general kernel) and ``one_pass=all``
(every vector-form state in the one-pass kernel), and in the general kernel with ``stage_state=()`` (every state loaded
into registers) and ``stage_state=(2, 4, 8)`` (every vector-form state through
the shared-memory staging ring). With
``--sweep`` it also times the one-pass kernel under other block shapes, with
``--tile-sweep`` the tile kernel under other block shapes and tile sizes, and
keeps every variant's row. Writes ``results/state_update_<gpu>.json`` and a
markdown table beside it.

Usage::

    python benchmarks/bench_state_update.py [--sweep] [--out DIR]
"""

from __future__ import annotations

import argparse
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
from ssmkit import _state_update  # noqa: E402
from ssmkit._gpu import state_update as gsu  # noqa: E402

cuda_median_ms = functools.partial(timing.cuda_median_ms, warmup=5, reps=30)  # this script's repetitions

# (layout, state dtype, io dtype, batch, heads, headdim, N, mamba_ssm ms) -- peers-h200.md
# gives mamba_ssm's Triton selective_state_update for the Mamba-2 rows by state dtype.
CONFIGS = [
    (2, "float32", "float32", 64, 80, 64, 128, 0.102),
    (2, "float32", "bfloat16", 64, 80, 64, 128, None),
    (2, "bfloat16", "bfloat16", 64, 80, 64, 128, 0.141),
    (1, "float32", "float32", 64, 1, 3072, 16, None),
    (1, "float32", "bfloat16", 64, 1, 3072, 16, None),
    (1, "bfloat16", "bfloat16", 64, 1, 3072, 16, None),
]

# Always timed beside the default: every state in the general kernel, every vector-form state
# in the one-pass kernel; in the general kernel, every state loaded into registers, and every
# vector-form state through the staging ring.
AB = [dict(warp=()), dict(warp=gsu.ONE_PASS_ALL), dict(warp=(), tile=()),
      dict(warp=(), tile=(), one_pass=()),
      dict(warp=(), tile=(), one_pass=gsu.ONE_PASS_ALL),
      dict(warp=(), tile=(), one_pass=(), stage_state=()),
      dict(warp=(), tile=(), one_pass=(), stage_state=(2, 4, 8))]
# The one-pass vector kernel under other block shapes.
SWEEP = [dict(one_pass=gsu.ONE_PASS_ALL, threads=t, one_pass_bytes_per_thread=s)
         for t in (64, 128, 256) for s in (16, 32, 64)]
# The tile kernel under other block shapes and tile sizes.
TILE_SWEEP = [dict(tile=gsu.ONE_PASS_ALL, tile_threads=t, tile_bytes_per_thread=s, tile_bytes=b)
              for t in (64, 128, 256) for s in (16, 32) for b in (8192, 16384)]


def make_inputs(cp, layout, st, io, batch, H, P, N, seed=0):
    """Mamba-2: per-head A, dt, D, dt_bias broadcast over P (and N) with zero strides, as
    users pass them; Mamba-1: full per-channel arrays, B/C (batch, N). No z (the peers' setup)."""
    rng = np.random.default_rng(seed)

    def rand(shape, scale=1.0, shift=0.0, dtype="float32"):
        a = cp.asarray(rng.standard_normal(shape, dtype=np.float32) * scale + shift)
        return a if dtype == "float32" else a.astype(dtype)

    if layout == 2:
        state = rand((batch, H, P, N), dtype=st)
        dt_h = rand((batch, H), 0.5, -1.0, io)
        return dict(state=state, x=rand((batch, H, P), dtype=io),
                    dt=cp.broadcast_to(dt_h[:, :, None], (batch, H, P)),
                    A=cp.broadcast_to(-cp.exp(rand((H,), 0.5))[:, None, None], (H, P, N)),
                    B=rand((batch, 1, N), dtype=io), C=rand((batch, 1, N), dtype=io),
                    D=cp.broadcast_to(rand((H,))[:, None], (H, P)),
                    dt_bias=cp.broadcast_to(rand((H,), 0.1)[:, None], (H, P)))
    dim = P
    return dict(state=rand((batch, dim, N), dtype=st), x=rand((batch, dim), dtype=io),
                dt=rand((batch, dim), 0.5, -1.0, io), A=-cp.exp(rand((dim, N), 0.5)),
                B=rand((batch, N), dtype=io), C=rand((batch, N), dtype=io), D=rand((dim,)),
                dt_bias=rand((dim,), 0.1))


def compulsory_bytes(layout, st, io, batch, H, P, N):
    s = np.dtype(st).itemsize if st != "bfloat16" else 2
    i = np.dtype(io).itemsize if io != "bfloat16" else 2
    state = 2 * batch * H * P * N * s          # read + written
    xy = 2 * batch * H * P * i                 # x in, y out
    dt = batch * H * i if layout == 2 else batch * H * P * i  # per head (broadcast) or per channel
    bc = 2 * batch * N * i                     # one group
    return state + xy + dt + bc


def f32_step(cp, a):
    """The step in CuPy float32 (a check of the kernel at full size): (y, new state)."""
    f = {k: v.astype(cp.float32) for k, v in a.items()}
    d = f["dt"] + f["dt_bias"]
    d = cp.where(d <= 20, cp.log1p(cp.exp(cp.minimum(d, 20))), d)
    if f["state"].ndim == 4:
        Bv, Cv = f["B"][:, 0][:, None, None, :], f["C"][:, 0][:, None, None, :]
    else:
        Bv, Cv = f["B"][:, None, :], f["C"][:, None, :]
    s = f["state"] * cp.exp(d[..., None] * f["A"]) + (d * f["x"])[..., None] * Bv
    y = (s * Cv).sum(-1) + f["D"] * f["x"]
    return y, s


def rel(a, b):
    a, b = a.astype("float32"), b.astype("float32")
    import cupy as cp

    return float(cp.linalg.norm(a - b) / cp.linalg.norm(b))


def time_config(cp, layout, st, io, batch, H, P, N):
    a = make_inputs(cp, layout, st, io, batch, H, P, N)
    state0 = a["state"].copy()
    y_want, s_want = f32_step(cp, a)
    args = {k: v for k, v in a.items() if k != "state"}
    y = ssmkit.state_update(a["state"], **args, dt_softplus=True)
    err_y, err_s = rel(y, y_want), rel(a["state"], s_want)
    a["state"][...] = state0

    # The kernel alone: arguments prepared once, launches replayed.
    p, _ = _state_update._prepare(a["state"], args["x"], args["dt"], args["A"], args["B"],
                                  args["C"], args["D"], None, args["dt_bias"], True, None)
    kernel, launches, block, finish = gsu.launch_args(p)
    (grid, kargs), = launches
    kernel_ms = cuda_median_ms(lambda: kernel(grid, block, kargs), calls=20)
    launch_us = launch_us_per_call(lambda: kernel(grid, block, kargs))
    ms = cuda_median_ms(lambda: ssmkit.state_update(a["state"], **args, dt_softplus=True),
                        calls=20)
    latency_ms = cuda_median_ms(lambda: ssmkit.state_update(a["state"], **args,
                                                            dt_softplus=True))
    items = (gsu._ITEMSIZE[st], gsu._ITEMSIZE[io])
    warp = layout == 2 and items in gsu.TUNING["warp"]
    tile = layout == 2 and items in gsu.TUNING["tile"] and not warp
    plan = gsu.plan_launch(batch=batch, H=H, P=P, N=N, state=st,
                           amode=gsu.A_HEAD if layout == 2 else gsu.A_FULL,
                           one_pass=items in gsu.TUNING["one_pass"] and not tile and not warp,
                           tile=tile, warp=warp)
    host_us = host_us_per_call(lambda: ssmkit.state_update(a["state"], **args,
                                                           dt_softplus=True))
    return dict(kernel_ms=kernel_ms, ms=ms, latency_ms=latency_ms, err_y=err_y, err_state=err_s,
                plan=plan, host_us=host_us, launch_us=launch_us)


_INPLACE_SOURCE = r"""
// Read every 16-byte vector of a buffer and write it back in place (xor with a run-time
// zero, so nothing is optimised away): VPT vectors per thread, all loads before the stores.
template <int VPT>
__global__ void inplace_rw(uint4* p, long long n, unsigned int key) {
    const long long i0 = ((long long)blockIdx.x * blockDim.x) * VPT + threadIdx.x;
    uint4 v[VPT];
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
        const long long i = i0 + (long long)k * blockDim.x;
        if (i < n) v[k] = p[i];
    }
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
        const long long i = i0 + (long long)k * blockDim.x;
        if (i < n) { v[k].x ^= key; p[i] = v[k]; }
    }
}
"""


def inplace_ceiling_ms(cp, nbytes):
    """Milliseconds of the best plain in-place read + write of ``nbytes`` (16-byte vectors,
    1, 2 or 4 per thread, 128 or 256 threads): what any state update of that state size
    can reach at most, launch and ramp included, measured in the same run."""
    module = cp.RawModule(code=_INPLACE_SOURCE, options=("-std=c++17",),
                          name_expressions=[f"inplace_rw<{v}>" for v in (1, 2, 4)])
    buf = cp.zeros(nbytes // 16 * 16, dtype=cp.uint8)
    n = buf.size // 16
    best = float("inf")
    for vpt in (1, 2, 4):
        kernel = module.get_function(f"inplace_rw<{vpt}>")
        for threads in (128, 256):
            grid = (-(-n // (threads * vpt)),)
            best = min(best, cuda_median_ms(
                lambda: kernel(grid, (threads,), (buf, np.int64(n), np.uint32(0))), calls=20))
    return best


def launch_us_per_call(launch, calls=100, reps=11):
    """Wall-clock microseconds CuPy takes to launch the kernel with prepared arguments
    (54 of them): the part of the host time that only fewer arguments would cut."""
    return timing.host_median_us(launch, calls=calls, reps=reps, sync=True)


def host_us_per_call(call, calls=200, reps=15):
    """Wall-clock microseconds of the host side of ``call``, every kernel a no-op (median
    over ``reps`` batches of ``calls``; known calls replay their plans)."""
    from ssmkit._gpu import compiler

    real = compiler.get_kernel
    compiler.get_kernel = lambda filename, name: (lambda grid, block, args, **launch: None)
    _state_update._KNOWN_CALLS.clear()  # plans made from here on hold the no-op kernel
    try:
        return timing.host_median_us(call, calls=calls, reps=reps, warmup=20)
    finally:
        compiler.get_kernel = real
        _state_update._KNOWN_CALLS.clear()


def write_markdown(rows, path):
    """The table of ``rows`` (this script's JSON rows, one run) as markdown at ``path``."""
    r0 = rows[0]
    lines = [f"# state_update on {r0['gpu']}, commit {r0['commit']}, {r0['date']}", "",
             f"Copy bandwidth {r0['copy_tbps']:.2f} TB/s (device-to-device, read + write), measured in the same "
             "run. Bytes: state read + written, x, dt (per head in Mamba-2), B, C, y. kernel: the "
             "kernel alone, 20 launches between two events (one untimed launch queued before "
             "them), median of 30; call: the public "
             "function back to back (host work overlapping the kernels); latency: one public call "
             "between two events; host us: the host side of one public call, kernel a no-op "
             "(wall clock, median); launch us: CuPy launching the kernel, arguments prepared. "
             "D, dt_bias, dt_softplus; Mamba-2 with per-head A/dt/D/dt_bias as zero-stride "
             "views. mamba_ssm: its Triton selective_state_update, peers-h200.md. in-place: "
             "the best plain kernel that reads the state's bytes and writes them back in place "
             "(no arithmetic), the ceiling at this size, as ms and as a fraction of copy.",
             "",
             "| layout | state | x | batch | H x P or dim | N | variant | kernel ms | of copy | "
             "call ms | of copy | latency ms | host us | launch us | mamba_ssm ms | rel err y "
             "| in-place ms | of copy |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        shape = f"{r['heads']} x {r['headdim']}" if "heads" in r else str(r["dim"])
        lines.append(f"| {r['layout']} | {r['state_dtype']} | {r['dtype']} | {r['batch']} "
                     f"| {shape} | {r['N']} | {r['variant']} | {r['kernel_ms']:.4f} "
                     f"| {r['kernel_of_copy']:.2f} "
                     f"| {r['ms']:.4f} | {r['of_copy']:.2f} | {r['latency_ms']:.4f} "
                     f"| {r['host_us']:.1f} | {r['launch_us']:.1f} | "
                     f"{r['mamba_ssm_ms'] if r['mamba_ssm_ms'] else '-'} | {r['rel_err_y']:.1e} "
                     f"| {r['inplace_ms']:.4f} | {r['inplace_of_copy']:.2f} |")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    parser.add_argument("--sweep", action="store_true", help="also time other block shapes")
    parser.add_argument("--tile-sweep", action="store_true",
                        help="also time the tile kernel under other block shapes and tile sizes")
    parser.add_argument("--configs", type=int, nargs="*", default=None,
                        help="indices into CONFIGS to time (default: all)")
    parser.add_argument("--profile", action="store_true",
                        help="profile the host side of the public call (cProfile, Mamba-2 float32)")
    args = parser.parse_args()
    import cupy as cp

    gpu = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["name"].decode()
    bw = copy_tbps()
    print(f"{gpu}: copy {bw:.2f} TB/s", flush=True)
    rows = []
    base = dict(gsu.TUNING)
    configs = CONFIGS if args.configs is None else [CONFIGS[i] for i in args.configs]
    for layout, st, io, batch, H, P, N, peer in configs:
        state_bytes = batch * H * P * N * {"float64": 8, "float32": 4}.get(st, 2)
        ceiling_ms = inplace_ceiling_ms(cp, state_bytes)
        variants = ([dict()] + AB + (SWEEP if args.sweep else [])
                    + (TILE_SWEEP if args.tile_sweep else []))
        for var in variants:
            gsu.TUNING.clear()
            gsu.TUNING.update(base, **var)
            r = time_config(cp, layout, st, io, batch, H, P, N)
            nbytes = compulsory_bytes(layout, st, io, batch, H, P, N)
            shape = (dict(heads=H, headdim=P) if layout == 2 else dict(dim=P))
            row = dict(op="state_update", layout=f"mamba{layout}", gpu=gpu, dtype=io,
                       state_dtype=st, batch=batch, **shape, N=N, groups=1,
                       D=True, dt_bias=True, dt_softplus=True, z=False,
                       variant="default" if not var else
                       ",".join(f"{k}={'all' if v == gsu.ONE_PASS_ALL else v}"
                                for k, v in var.items()),
                       threads=r["plan"]["threads"], ppt=r["plan"]["ppt"], tn=r["plan"]["tn"],
                       rows_per_block=r["plan"]["rows_per_block"],
                       kernel_ms=round(r["kernel_ms"], 5), ms=round(r["ms"], 5),
                       latency_ms=round(r["latency_ms"], 5), host_us=round(r["host_us"], 2),
                       launch_us=round(r["launch_us"], 2),
                       bytes=nbytes,
                       kernel_tbps=round(nbytes / (r["kernel_ms"] * 1e-3) / 1e12, 3),
                       kernel_of_copy=round(nbytes / (r["kernel_ms"] * 1e-3) / 1e12 / bw, 3),
                       of_copy=round(nbytes / (r["ms"] * 1e-3) / 1e12 / bw, 3),
                       inplace_ms=round(ceiling_ms, 5),
                       inplace_of_copy=round(2 * state_bytes / (ceiling_ms * 1e-3) / 1e12 / bw, 3),
                       copy_tbps=round(bw, 3), mamba_ssm_ms=peer,
                       rel_err_y=float(f"{r['err_y']:.2e}"),
                       rel_err_state=float(f"{r['err_state']:.2e}"),
                       commit=commit(), date=datetime.date.today().isoformat())
            rows.append(row)
            print(json.dumps(row), flush=True)
    gsu.TUNING.clear()
    gsu.TUNING.update(base)

    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, "state_update_h200" if "H200" in gpu else "state_update_gpu")
    with open(stem + ".json", "w") as f:
        json.dump(rows, f, indent=1)
    write_markdown(rows, stem + ".md")
    if args.profile:
        profile_host(cp, args.out)


def profile_host(cp, out):
    """Where the host time of one public call goes (Mamba-2, float32, the first config)."""
    import cProfile
    import io
    import pstats

    layout, st, io_dtype, batch, H, P, N, _ = CONFIGS[0]
    a = make_inputs(cp, layout, st, io_dtype, batch, H, P, N)
    args = {k: v for k, v in a.items() if k != "state"}
    for _ in range(5):
        ssmkit.state_update(a["state"], **args, dt_softplus=True)
    cp.cuda.Device().synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(200):
        ssmkit.state_update(a["state"], **args, dt_softplus=True)
    prof.disable()
    cp.cuda.Device().synchronize()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(25)
    with open(os.path.join(out, "state_update_host_profile.txt"), "w") as f:
        f.write("cProfile of 200 public calls (Mamba-2 float32, batch 64, H 80, P 64, N 128)\n")
        f.write(text.getvalue())
    print(text.getvalue()[:3000])


if __name__ == "__main__":
    main()
