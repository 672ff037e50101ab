"""Packed sequences as the GPU runs them (padded rows, ssmkit._selective_scan_packed) through
ssmkit._gpu.selective_scan's host code with its kernels emulated (run.py): the forward (with
and without checkpoints) and every gradient against the float64 reference with seq_idx or
cu_seqlens. The row copies are the CPU's twin of cuda_src/packed_rows.cu (the two are checked
against each other in tests/test_emulation.py).

    python3 tests/emulation/selective_scan/packed.py        (ASAN=0: without AddressSanitizer)
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# (run.py redirects the GPU module's launches to the emulated kernels)
from run import f64, make, ref, ss  # noqa: E402
from ssmkit import _selective_scan_packed as packed  # noqa: E402
from ssmkit._cpu import packed as cpu_copies  # noqa: E402

packed._copies = lambda xp: cpu_copies  # (the emulation's arrays are NumPy's)

FIELDS = ("u", "delta", "z", "A", "B", "C", "D", "delta_bias", "initial_state")


def check(p, seqs, rng, tol, label):
    """Forward and gradients of ``p`` packed as ``seqs`` (("seq_idx", labels) or
    ("cu_seqlens", offsets)) against the reference; prints one line, returns True if within
    ``tol`` (largest error over the largest reference entry, per array)."""
    name, value = seqs
    batch, L = p.batch, p.L
    if name == "cu_seqlens":
        labels, cu = np.searchsorted(value[1:], np.arange(L), side="right")[None], value
    else:
        labels, cu = value, None
    plan = packed.plan(labels, cu, batch, L, p.initial_state is not None, align=8)
    y0, fin0, _ = packed.forward(p, plan, ss, save_checkpoints=False)
    y, fin, saved = packed.forward(p, plan, ss, save_checkpoints=True)
    (yr, finr), pull = ref.selective_scan_vjp(
        f64(p.u), f64(p.delta), f64(p.A), f64(p.B), f64(p.C), f64(p.D), f64(p.z),
        f64(p.delta_bias), p.delta_softplus, initial_state=f64(p.initial_state),
        return_final_state=True, **{name: value})
    dy = rng.standard_normal(p.u.shape).astype(p.u.dtype)
    dfin = rng.standard_normal(fin.shape).astype(p.compute_dtype)
    g = packed.backward(p, plan, ss, saved, dy, dfin)
    gr = pull(f64(dy), f64(dfin))
    errs = {}

    def err(key, a, b):
        a, b = f64(a), f64(b)
        assert a.shape == b.shape, (key, a.shape, b.shape)
        errs[key] = (float(np.max(np.abs(a - b)) / (np.max(np.abs(b)) + 1e-30))
                     if np.all(np.isfinite(a)) else float("nan"))

    err("y", y, yr), err("final", fin, finr), err("y nockpt", y0, yr), err("final nockpt", fin0, finr)
    for key in FIELDS:
        if getattr(gr, key) is not None:
            err("d" + key, g[key], getattr(gr, key))
    bad = {k: v for k, v in errs.items() if not v <= tol}
    calls = len(plan.groups or [None])
    print(f"{'OK ' if not bad else 'BAD'} {label} ({calls} calls) max={max(errs.values()):.2e}"
          + (f" bad={bad}" if bad else ""), flush=True)
    return not bad


def cases():
    """(label, problem arguments for run.make, sequences, tolerance)."""
    cu = ("cu_seqlens", np.array([0, 0, 5, 40, 41, 41, 100, 160]))
    labels = np.concatenate([np.zeros((2, 30), int), np.ones((2, 50), int)], axis=1)
    labels[1, 7:] += 3
    labels[1, 61:] += 1
    return [
        ("f32 N16 cu_seqlens", dict(batch=1, dim=32, L=160, N=16, chunk=64), cu, 1e-4),
        ("bf16 N16 cu_seqlens", dict(batch=1, dim=32, L=160, N=16, io="bfloat16", chunk=64),
         cu, 3e-2),
        ("f32 N4 seq_idx, no z", dict(batch=2, dim=8, L=80, N=4, z=False, chunk=16),
         ("seq_idx", labels), 1e-4),
        ("f32 N16 seq_idx, B const", dict(batch=2, dim=32, L=80, N=16, gb=0, chunk=32),
         ("seq_idx", labels), 1e-4),
    ]


def main(which=None):
    rng = np.random.default_rng(0)
    ok = True
    for label, args, seqs, tol in cases():
        if which is None or label in which:
            ok &= check(make(rng, **args), seqs, rng, tol, label)
    return ok


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
