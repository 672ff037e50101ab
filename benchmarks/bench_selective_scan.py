"""Time ssmkit.selective_scan (forward, forward+backward) and set each time against its floor.

GPU mode (default when CuPy sees a GPU) runs the selective-scan table of
../shared/docs/peers-h200.md in one call: CUDA-event-timed medians after warm-up,
the copy bandwidth and the exp2f rate measured in the same run, the floor
max(compulsory bytes / copy bandwidth, exponentials / exp2f rate) and the fraction
of it reached. It writes ``results/selective_scan_<gpu>.json`` (rows as
../shared/docs/gpu-machine.md describes) and a markdown table beside it.

CPU mode (``--cpu``) compares the Numba backend with a vectorised NumPy loop
over time, the loop a user without ssmkit would write.

Usage::

    python benchmarks/bench_selective_scan.py [--quick] [--out DIR]
    python benchmarks/bench_selective_scan.py --cpu
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from timing import commit, copy_tbps, cuda_median_ms  # noqa: E402,F401  (tune_selective_scan imports them from here)
import ssmkit  # noqa: E402

# (dtype, batch, dim, L, N, mamba_ssm fwd ms, mamba_ssm fwd+bwd ms) from peers-h200.md
TABLE = [
    ("float32", 8, 1536, 2048, 16, 0.917, 3.21),
    ("bfloat16", 8, 1536, 2048, 16, 0.494, 2.49),
    ("bfloat16", 2, 1536, 32768, 16, 2.26, 10.55),
    ("float32", 2, 1536, 32768, 16, 3.98, 13.27),
    ("float32", 8, 1536, 2048, 64, 3.14, 10.71),
    ("float32", 8, 1536, 2048, 128, 6.19, 21.19),
    ("float32", 64, 1536, 256, 16, 0.691, 3.28),
]


_EXP_KERNEL = r"""
extern "C" __global__ void exp_rate(float* out, float seed, int iters) {
    float a = seed + threadIdx.x * 1e-7f, b = a + 0.1f, c = a + 0.2f, d = a + 0.3f;
    for (int i = 0; i < iters; ++i) {
        a = exp2f(a) - 1.5f; b = exp2f(b) - 1.5f; c = exp2f(c) - 1.5f; d = exp2f(d) - 1.5f;
    }
    if (a + b + c + d == 12345.f) out[0] = a;  // keep the work alive
}
"""


def exp2_rate_tps():
    """exp2f throughput in tera-operations per second (4 independent chains per thread)."""
    import cupy

    kern = cupy.RawKernel(_EXP_KERNEL, "exp_rate")
    sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
    blocks, threads, iters = sms * 16, 256, 4096
    out = cupy.zeros(1, dtype=cupy.float32)
    ms = cuda_median_ms(lambda: kern((blocks,), (threads,),
                                     (out, np.float32(0.3), np.int32(iters))), reps=10)
    return blocks * threads * iters * 4 / (ms * 1e-3) / 1e12


def make_inputs(xp, dtype, batch, dim, L, N, seed=0):
    """The peers' configuration: D, z, delta_bias, softplus, B/C (batch, N, L)."""
    rng = np.random.default_rng(seed)

    def rand(shape, scale=1.0, shift=0.0, dt=dtype):
        x = xp.asarray(rng.standard_normal(shape, dtype=np.float32) * scale + shift)
        return x.astype(dt) if dt != "float32" else x

    return dict(u=rand((batch, dim, L)), delta=rand((batch, dim, L), 0.5, -1.0),
                A=-xp.exp(rand((dim, N), 0.5, dt="float32")), B=rand((batch, N, L)),
                C=rand((batch, N, L)), D=rand((dim,), dt="float32"), z=rand((batch, dim, L)),
                delta_bias=rand((dim,), 0.1, dt="float32"))


def floors(dtype, batch, dim, L, N, copy_bw, exp_rate):
    """Compulsory bytes and exponentials of the forward and of forward+backward, and floors."""
    io = 2 if dtype in ("bfloat16", "float16") else 4
    act = batch * dim * L * io          # one (batch, dim, L) array
    bc = batch * N * L * io             # one (batch, N, L) array
    fwd_bytes = 3 * act + act + 2 * bc  # u, delta, z in; y out; B, C in
    # backward: u, delta, z, dy, B, C in; du, ddelta, dz, dB, dC out
    bwd_bytes = 4 * act + 2 * bc + 3 * act + 2 * bc
    exps = batch * dim * L * N          # exp(dt A) once per (t, n); the backward needs it again
    fwd_floor = max(fwd_bytes / copy_bw, exps / exp_rate) * 1e3
    fb_floor = max((fwd_bytes + bwd_bytes) / copy_bw, 2 * exps / exp_rate) * 1e3
    return fwd_bytes, fwd_bytes + bwd_bytes, fwd_floor, fb_floor


def run_gpu(args):
    import cupy

    dev = cupy.cuda.Device()
    gpu = cupy.cuda.runtime.getDeviceProperties(dev.id)["name"].decode()
    copy_bw = copy_tbps()
    exp_rate = exp2_rate_tps()
    print(f"{gpu}: copy {copy_bw:.2f} TB/s, exp2f {exp_rate:.2f} T/s", flush=True)
    rows = []
    table = TABLE[:2] if args.quick else TABLE
    for dtype, batch, dim, L, N, peer_fwd, peer_fb in table:
        x = make_inputs(cupy, dtype, batch, dim, L, N)
        kw = dict(delta_softplus=True)
        fwd_ms = cuda_median_ms(lambda: ssmkit.selective_scan(**x, **kw), calls=5)
        fwd_latency_ms = cuda_median_ms(lambda: ssmkit.selective_scan(**x, **kw))
        dy = cupy.ones_like(x["u"])

        def fwd_bwd():
            _, pullback = ssmkit.selective_scan_vjp(**x, **kw)
            pullback(dy)

        fb_ms = cuda_median_ms(fwd_bwd, reps=10, calls=3)
        fb_latency_ms = cuda_median_ms(fwd_bwd, reps=10)
        fwd_bytes, fb_bytes, fwd_floor, fb_floor = floors(dtype, batch, dim, L, N,
                                                          copy_bw * 1e12, exp_rate * 1e12)
        rows.append(dict(
            op="selective_scan", gpu=gpu, dtype=dtype, batch=batch, dim=dim, L=L, N=N,
            fwd_ms=round(fwd_ms, 4), fwd_bwd_ms=round(fb_ms, 4),
            fwd_latency_ms=round(fwd_latency_ms, 4), fwd_bwd_latency_ms=round(fb_latency_ms, 4),
            copy_tbps=round(copy_bw, 3), exp2_tps=round(exp_rate, 3),
            fwd_tbps=round(fwd_bytes / (fwd_ms * 1e-3) / 1e12, 3),
            fwd_floor_ms=round(fwd_floor, 4), fwd_of_floor=round(fwd_floor / fwd_ms, 3),
            fwd_bwd_floor_ms=round(fb_floor, 4), fwd_bwd_of_floor=round(fb_floor / fb_ms, 3),
            mamba_ssm_fwd_ms=peer_fwd, mamba_ssm_fwd_bwd_ms=peer_fb,
            commit=commit(), date=datetime.date.today().isoformat()))
        print(json.dumps(rows[-1]), flush=True)
        del x, dy
        cupy.get_default_memory_pool().free_all_blocks()

    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, "selective_scan_h200" if "H200" in gpu else "selective_scan_gpu")
    with open(stem + ".json", "w") as f:
        json.dump(rows, f, indent=1)
    lines = [f"# selective_scan on {gpu}, commit {rows[0]['commit']}, {rows[0]['date']}",
             "",
             f"Copy bandwidth {copy_bw:.2f} TB/s and exp2f rate {exp_rate:.2f} T/s, measured in "
             "the same run. fwd / fwd+bwd: median CUDA-event time per call over back-to-back "
             "calls after warm-up (5 forward, 3 forward+backward calls between two events, one "
             "untimed call queued before them); "
             "latency: one call between two events, host work included. Floor = max(bytes / "
             "copy bandwidth, exponentials / exp2f rate). mamba_ssm times from peers-h200.md.",
             "",
             "| dtype | batch | dim | L | N | fwd ms | latency | of floor | x mamba_ssm | "
             "fwd+bwd ms | latency | of floor | x mamba_ssm |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['dtype']} | {r['batch']} | {r['dim']} | {r['L']} | {r['N']} | "
            f"{r['fwd_ms']:.3f} | {r['fwd_latency_ms']:.3f} | {r['fwd_of_floor']:.2f} | "
            f"{r['mamba_ssm_fwd_ms'] / r['fwd_ms']:.2f} | {r['fwd_bwd_ms']:.3f} | "
            f"{r['fwd_bwd_latency_ms']:.3f} | "
            f"{r['fwd_bwd_of_floor']:.2f} | {r['mamba_ssm_fwd_bwd_ms'] / r['fwd_bwd_ms']:.2f} |")
    with open(stem + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


def numpy_loop_scan(u, delta, A, B, C, D, z, delta_bias):
    """What a user without ssmkit writes: one vectorised NumPy step per time index."""
    dt = delta + delta_bias[None, :, None]
    dt = np.where(dt <= 20, np.log1p(np.exp(np.minimum(dt, 20))), dt).astype(np.float32)
    batch, dim, L = u.shape
    h = np.zeros((batch, dim, A.shape[1]), dtype=np.float32)
    y = np.empty_like(u)
    for t in range(L):
        h = np.exp(dt[:, :, t, None] * A) * h + (dt[:, :, t] * u[:, :, t])[..., None] * B[:, None, :, t]
        y[:, :, t] = np.einsum("bdn,bn->bd", h, C[:, :, t])
    y = y + D[None, :, None] * u
    return y * z / (1 + np.exp(-z))


def run_cpu(args):
    import numba

    batch, dim, L, N = (1, 64, 512, 16) if args.quick else (2, 256, 2048, 16)
    x = make_inputs(np, "float32", batch, dim, L, N)
    ssmkit.selective_scan(**x, delta_softplus=True)  # compile
    y_ref = numpy_loop_scan(**x)
    y = ssmkit.selective_scan(**x, delta_softplus=True)
    err = np.linalg.norm(y - y_ref) / np.linalg.norm(y_ref)

    def best_of(fn, reps=5):
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return float(np.median(times)) * 1e3

    # Round by round, one NumPy loop then ssmkit's median of five calls: the host's speed
    # drifts by up to 2x over minutes here, and each round's ratio sees one host state.
    rounds = 3 if args.quick else 7
    rows = []
    for _ in range(rounds):
        t_np = best_of(lambda: numpy_loop_scan(**x), reps=1)
        t_nb = best_of(lambda: ssmkit.selective_scan(**x, delta_softplus=True))
        rows.append((t_np, t_nb, t_np / t_nb))
    t_numpy, t_numba, ratio = (float(np.median([r[i] for r in rows])) for i in range(3))

    def fwd_bwd():
        _, pullback = ssmkit.selective_scan_vjp(**x, delta_softplus=True)
        pullback(x["u"])

    fwd_bwd()
    t_fb = best_of(fwd_bwd, reps=3)
    print(f"CPU ({numba.get_num_threads()} threads) float32 batch {batch} dim {dim} L {L} N {N}")
    print("| version | fwd ms | fwd+bwd ms |\n|---|---|---|")
    print(f"| NumPy loop over time | {t_numpy:.1f} | - |")
    print(f"| ssmkit (Numba) | {t_numba:.1f} | {t_fb:.1f} |")
    print(f"speed-up {ratio:.1f}x (median over {rounds} rounds; per round "
          + " ".join(f"{r[2]:.1f}" for r in rows) + f"); relative difference {err:.1e}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cpu", action="store_true", help="CPU comparison instead of the GPU table")
    parser.add_argument("--quick", action="store_true", help="a few small rows only")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    args = parser.parse_args()
    run_cpu(args) if args.cpu else run_gpu(args)


if __name__ == "__main__":
    main()
