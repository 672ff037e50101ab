"""Packed sequences as the GPU runs them (ssmkit._selective_scan_packed) through
ssmkit._gpu.selective_scan's host code with its kernels emulated (run.py): the forward (with
and without checkpoints) and every gradient against the float64 reference with seq_idx or
cu_seqlens, each case two ways: as padded rows, and in place (the ring kernels restarting
the state; final states asked for only where they are the rows' (seq_idx), cotangents
given for the rows' alone),
where the GPU module's restarts_in_place allows (the line says which ran); cu_seqlens cases
a third way, in place with every sequence's final state (the forward in place, those of
sequences ending inside the row from ssm_sequence_states; the VJP then as padded rows).
The row copies are the CPU's twin of cuda_src/packed_rows.cu (the two are checked against
each other in tests/test_emulation.py).

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


_in_place = ss.restarts_in_place


MODES = ("padded", "in place", "in place, all final states")


def check(p, seqs, rng, tol, label, mode):
    """Forward and gradients of ``p`` packed as ``seqs`` (("seq_idx", labels) or
    ("cu_seqlens", offsets)) against the reference, run as ``mode`` says (MODES; in place
    where allowed); prints one line, returns True if within ``tol`` (largest error over the
    largest reference entry, per array)."""
    name, value = seqs
    batch, L = p.batch, p.L
    if name == "cu_seqlens":
        labels, cu = np.searchsorted(value[1:], np.arange(L), side="right")[None], value
    else:
        labels, cu = value, None
    plan = packed.plan(labels, cu, batch, L, p.initial_state is not None, align=8)
    in_place = mode != "padded"
    ss.restarts_in_place = _in_place if in_place else (lambda *a, **k: False)
    # "in place": cotangents given for the rows' final states only, and final states asked
    # for with seq_idx alone (they are the rows'; cu_seqlens' every sequence's, which the
    # in-place backward does not take: the third mode)
    rows_only = mode == "in place"
    final_states = not rows_only or name == "seq_idx"
    y0, fin0, saved0 = packed.forward(p, plan, ss, save_checkpoints=False,
                                      final_states=final_states)
    y, fin, saved = packed.forward(p, plan, ss, save_checkpoints=True, final_states=final_states)
    assert (fin is None and fin0 is None) == (not final_states), "final states when not asked"
    (yr, finr), pull = ref.selective_scan_vjp(
        f64(p.u), f64(p.delta), f64(p.A), f64(p.B), f64(p.C), f64(p.D), f64(p.z),
        f64(p.delta_bias), p.delta_softplus, initial_state=f64(p.initial_state),
        return_final_state=True, **{name: value})
    dy = rng.standard_normal(p.u.shape).astype(p.u.dtype)
    dfin = rng.standard_normal(finr.shape).astype(p.compute_dtype)
    if rows_only:
        rows = np.zeros(finr.shape[0], bool)
        rows[packed.row_final_slots(plan)] = True
        rows[[s for s, _ in plan.passthrough]] = True
        dfin[~rows] = 0
    g = packed.backward(p, plan, ss, saved, dy, dfin)
    gr = pull(f64(dy), f64(dfin))
    errs = {}

    def err(key, a, b):
        a, b = f64(a), f64(b)
        assert a.shape == b.shape, (key, a.shape, b.shape)
        errs[key] = (float(np.max(np.abs(a - b)) / (np.max(np.abs(b)) + 1e-30))
                     if np.all(np.isfinite(a)) else float("nan"))

    err("y", y, yr), err("y nockpt", y0, yr)
    if final_states:
        err("final", fin, finr), err("final nockpt", fin0, finr)
    for key in FIELDS:
        if getattr(gr, key) is not None:
            err("d" + key, g[key], getattr(gr, key))
    bad = {k: v for k, v in errs.items() if not v <= tol}
    ran = ("in place" if saved0.in_place and saved.in_place else
           "in place: the forward alone; padded for the VJP" if saved0.in_place else
           f"padded, {len(plan.groups or [None])} calls"
           + (" (in place refused)" if in_place else ""))
    how = f"{mode}: {ran}" if in_place else ran
    print(f"{'OK ' if not bad else 'BAD'} {label} ({how}) max={max(errs.values()):.2e}"
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
        ("f32 N16 seq_idx, no softplus",
         dict(batch=2, dim=32, L=80, N=16, softplus=False, chunk=16), ("seq_idx", labels), 1e-4),
        ("bf16 N32 seq_idx, no bias",
         dict(batch=2, dim=16, L=80, N=32, io="bfloat16", bias=False, chunk=32),
         ("seq_idx", labels), 3e-2),
        ("f32 N64 seq_idx", dict(batch=2, dim=16, L=80, N=64, chunk=32), ("seq_idx", labels), 1e-4),
    ]


def random_cases(n, seed=1):
    """``n`` random problems and packings: shapes, B/C forms, options, 16-bit or not, both
    forms of sequences (empty ones too), chunk sizes that split sequences."""
    rng = np.random.default_rng(seed)
    for i in range(n):
        io = str(rng.choice(["float32", "bfloat16"]))
        cu_mode = bool(rng.integers(2))
        batch = 1 if cu_mode else int(rng.integers(1, 3))
        L = int(rng.integers(1, 200))
        if rng.integers(2):  # a multiple of 8: the ring kernels' (in place where they run)
            L = -(-L // 8) * 8
        N = int(rng.choice([1, 4, 16, 32]))
        args = dict(batch=batch, dim=int(rng.choice([8, 32, 64])), L=L, N=N, io=io,
                    gb=int(rng.choice([0, 1, 2])), gc=int(rng.choice([0, 1, 2])),
                    D=bool(rng.integers(2)), z=bool(rng.integers(2)),
                    bias=bool(rng.integers(2)), softplus=bool(rng.integers(2)),
                    h0=bool(rng.integers(2)), chunk=int(rng.choice([16, 64, 256])))
        if cu_mode:
            inner = np.sort(rng.integers(0, L + 1, int(rng.integers(0, 8))))
            seqs = ("cu_seqlens", np.concatenate(([0], inner, [L])))
        else:
            flips = rng.random((batch, L)) < rng.choice([0.01, 0.05, 0.3])
            flips[:, 0] = False
            seqs = ("seq_idx", np.cumsum(flips, axis=1))
        label = f"random {i}: {io} b{batch} L{L} N{N} {seqs[0]}"
        yield label, args, seqs, (3e-2 if io == "bfloat16" else 1e-4)


def main(which=None, n_random=0):
    rng = np.random.default_rng(0)
    ok = True
    for label, args, seqs, tol in list(cases()) + list(random_cases(n_random)):
        if which is None or label in which or label.startswith("random"):
            for mode in MODES[:3 if seqs[0] == "cu_seqlens" else 2]:
                ok &= check(make(rng, **args), seqs, rng, tol, label, mode)
    return ok


if __name__ == "__main__":
    # (python3 packed.py random 40: the fixed cases and 40 random ones)
    n = int(sys.argv[2]) if len(sys.argv) > 2 and sys.argv[1] == "random" else 0
    sys.exit(0 if main(n_random=n) else 1)
