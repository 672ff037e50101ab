"""Small random SSD problems in the style of tests/test_ssd.py, through the emulated GPU path
(run_emu_bwd.py's set-up: the tensor-core kernels of ssd_mma.cu on the host, ssd.cu's other
kernels as NumPy mirrors), checked exactly as check_against_reference checks them: the same
inputs (make_inputs with the problem's seed, dy and dfinal drawn next from the same rng),
gradients cast to the user's dtypes, rel_err against the float64 reference.

    python3 tests/emulation/ssd/run_emu_problems.py regress        # the fixed-seed cases
    python3 tests/emulation/ssd/run_emu_problems.py random 120 7   # 120 problems per dtype, seed 7
    python3 tests/emulation/ssd/run_emu_problems.py one 83 120 7 bfloat16   # problem #83 of those

``random`` draws L 1..40, chunk 1..16, N 1..8, P 1..4, H 1..3 (G a divisor of H), every
option (D, z, bias, initial state both ways, seq_idx cuts, softplus, clip), and prints the
worst rel_err per gradient field against the bound 4 GRAD_RTOL. As in check_against_reference,
a field over that bound passes within twice its reference's spread under one rounding of x, B
and C (``reference_spread``: d dt_bias and dA are sums that can cancel many-fold; random
120 7's problem #83 sums per-step ddt of 79 in absolute value to 0.0049). SSD_EMU_ADJ=cuda runs the
adjoint chunk state on the CUDA-core kernel (ssmkit._gpu.ssd.MMA_ADJOINT_STATE = False, its
NumPy mirror here) instead of the tensor-core one, to compare. Ends with "ALL OK" or
"SOME FAILED" (exit status 0 or 1).
"""
import dataclasses, math, os, sys
import numpy as np
import run_emu_bwd as R  # sets up the emulated launches
from run_emu_bwd import gssd, _ssd, ref
from helpers import FORWARD_RTOL, GRAD_RTOL, rel_err, as_dtype

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from test_ssd import make_inputs, cast, reference_spread, UNIT_ROUNDOFF  # noqa: E402  the tests' own

FIELDS = R.FIELDS
if os.environ.get("SSD_EMU_ADJ") == "cuda":
    gssd.MMA_ADJOINT_STATE = False

# (dtype, make_inputs kw, opts, seed): failures seen on the GPU, kept as regressions.
REGRESS = [
    ("bfloat16", dict(batch=1, L=3, H=1, P=1, G=1, N=4, D_form=None, with_z=False,
                      with_bias=False, with_init=True, seq_cuts=None),
     dict(chunk_size=1, dt_softplus=True), 1658),
]


def run_problem(dtype_name, kw, opts, seed, spread=None):
    """Errors of one problem: {"y": .., "final": .., field: rel_err, ...}, as the test measures.
    With a dict ``spread``, also what check_against_reference allows where a field misses its
    fixed bound: ``spread[name]``, the reference's own spread under one rounding of x, B and C
    (``reference_spread``; a field within twice it passes: a sum that cancels many-fold)."""
    os.environ["SSMKIT_SSD_MMA_BWD"] = "1"
    gssd.MMA_SUM_BLOCKS = 2048
    rng = np.random.default_rng(seed)
    inputs = make_inputs(rng, **kw)
    if not opts["dt_softplus"]:
        inputs["dt"] = rng.uniform(0.01, 0.5, inputs["dt"].shape)
    arrays, exact = cast(inputs, dtype_name, np)
    f32 = lambda a: None if a is None else np.asarray(a, np.float32)
    seq = arrays["seq_idx"]
    p, user, passthrough = _ssd._prepare(
        "ssd_vjp", f32(arrays["x"]), arrays["dt"], arrays["A"], f32(arrays["B"]),
        f32(arrays["C"]), opts["chunk_size"], arrays["D"], f32(arrays["z"]), arrays["dt_bias"],
        opts["dt_softplus"], opts.get("dt_limit", (0.0, math.inf)), arrays["initial_state"],
        seq, None)
    p = dataclasses.replace(p, x=arrays["x"], B=arrays["B"], C=arrays["C"], z=arrays["z"])
    assert gssd.uses_mma(p)
    y, final, ckpt = gssd.ssd_forward(p, save_checkpoints=True)
    (y_r, fin_r), pullback_r = ref.ssd_vjp(**exact, **opts, return_final_state=True)
    errs = {"y": rel_err(y.astype(np.float64), y_r), "final": rel_err(final, fin_r)}
    dy = rng.standard_normal(y_r.shape)
    dfin = rng.standard_normal(fin_r.shape)
    dy_c = as_dtype(dy, dtype_name)
    g = gssd.ssd_backward(p, ckpt, dy_c, dfin.astype(np.float32))
    g_r = pullback_r(dy_c.astype(np.float64), dfin.astype(np.float32))
    for name in FIELDS:
        r = getattr(g_r, name)
        if r is None:
            continue
        a = np.asarray(g[name])
        if name == "D" and np.ndim(inputs["D"]) == 1:
            a = a.sum(axis=1)
        a = a.astype(arrays[name].dtype)  # as the pullback returns it
        errs[name] = rel_err(a, r)
    if spread is not None and any(v >= _bound(k, dtype_name) for k, v in errs.items()):
        spread.update(reference_spread(exact, opts, dy_c.astype(np.float64),
                                       dfin.astype(np.float32), g_r, UNIT_ROUNDOFF[dtype_name]))
    return errs


def _bound(name, dtype_name):
    """The fixed bound of check_against_reference for field ``name`` (or y, final)."""
    return 4 * (FORWARD_RTOL if name in ("y", "final") else GRAD_RTOL)[dtype_name]


def failing(errs, spread, dtype_name, outputs=False):
    """The fields of ``errs`` (gradients; with ``outputs`` y and final too) that miss both
    their fixed bound and twice their reference's spread, as check_against_reference asks."""
    return [k for k, v in errs.items() if (outputs or k not in ("y", "final"))
            and v >= _bound(k, dtype_name) and v >= 2 * spread.get(k, 0.0)]


def sample(rng):
    """One problem: make_inputs kw, opts, seed (the ranges of the module docstring)."""
    L = int(rng.integers(1, 41))
    chunk = int(rng.integers(1, 17))
    H = int(rng.integers(1, 4))
    G = int(rng.choice([g for g in (1, 2, 3) if H % g == 0]))
    cuts = None
    if rng.random() < 0.4 and L > 1:
        edge = list(range(chunk, L, chunk))[:1]
        pick = rng.integers(1, L, size=int(rng.integers(0, 4))).tolist()
        cuts = sorted(set(pick + edge))
    kw = dict(batch=int(rng.integers(1, 3)), L=L, H=H, P=int(rng.integers(1, 5)), G=G,
              N=int(rng.integers(1, 9)), D_form=[None, "head", "channel"][rng.integers(3)],
              with_z=bool(rng.integers(2)), with_bias=bool(rng.integers(2)),
              with_init=bool(rng.integers(2)), seq_cuts=cuts)
    opts = dict(chunk_size=chunk, dt_softplus=bool(rng.integers(2)))
    if rng.random() < 0.25:
        opts["dt_limit"] = (0.1, 0.6)
    return kw, opts, int(rng.integers(0, 2**32))


def main(argv):
    mode = argv[0] if argv else "regress"
    allok = True
    if mode == "regress":
        for dtype_name, kw, opts, seed in REGRESS:
            errs = run_problem(dtype_name, kw, opts, seed)
            bound = _bound("x", dtype_name)
            ok = not failing(errs, {}, dtype_name, outputs=True)  # (the fixed bounds only)
            allok &= ok
            print(dtype_name, kw, opts, seed, " ".join(f"{k}={v:.3g}" for k, v in errs.items()),
                  f"(bound {bound:g})", "OK" if ok else "FAIL", flush=True)
    elif mode == "one":  # one problem of a random list: one INDEX COUNT SEED DTYPE
        i, count, seed, dtype_name = int(argv[1]), int(argv[2]), int(argv[3]), argv[4]
        rng = np.random.default_rng(seed)
        kw, opts, pseed = [sample(rng) for _ in range(count)][i]
        spread = {}
        errs = run_problem(dtype_name, kw, opts, pseed, spread)
        allok = not failing(errs, spread, dtype_name)
        print(dtype_name, kw, opts, pseed, " ".join(f"{k}={v:.3g}" for k, v in errs.items()),
              "| reference spread " + " ".join(f"{k}={v:.3g}" for k, v in spread.items()
                                               if errs.get(k, 0) >= _bound(k, dtype_name)))
    else:
        count = int(argv[1]) if len(argv) > 1 else 100
        rng = np.random.default_rng(int(argv[2]) if len(argv) > 2 else 0)
        probs = [sample(rng) for _ in range(count)]
        for dtype_name in ("bfloat16", "float16"):
            worst = {}
            bound = 4 * GRAD_RTOL[dtype_name]
            for i, (kw, opts, seed) in enumerate(probs):
                spread = {}
                errs = run_problem(dtype_name, kw, opts, seed, spread)
                for k, v in errs.items():
                    if v > worst.get(k, (-1,))[0]:
                        worst[k] = (v, i)
                for k in errs:
                    if k not in ("y", "final") and errs[k] >= bound:
                        ok = k not in failing(errs, spread, dtype_name)
                        allok &= ok
                        print(f"  {'within twice the reference spread' if ok else 'FAIL'} "
                              f"{dtype_name} #{i} {kw} {opts} seed {seed}: {k}={errs[k]:.3g}, "
                              f"spread {spread.get(k, 0.0):.3g}", flush=True)
            print(f"{dtype_name}: {count} problems, worst rel_err per field (problem #), bound "
                  f"{bound:g} (grads) / {4 * FORWARD_RTOL[dtype_name]:g} (y, final):", flush=True)
            for k, (v, i) in worst.items():
                b = 4 * FORWARD_RTOL[dtype_name] if k in ("y", "final") else bound
                print(f"    {k:14s} {v:.3e}  ({v / b:.3f} of bound, #{i})", flush=True)
    print("ALL OK" if allok else "SOME FAILED")
    return 0 if allok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
