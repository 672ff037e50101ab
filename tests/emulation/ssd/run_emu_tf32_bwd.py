"""Run ssmkit._gpu.ssd's float32 backward (ssd_backward's branch for float32 x on tensor cores)
on NumPy arrays with ssd.cu's tensor-core kernels emulated on the host (run_emu_mm.py's build:
ssd_chunk_cb, ssd_chunk_state_tc, ssd_chunk_mm_tc, ssd_chunk_hblocks_tc, ssd_chunk_hsum_tc,
ssd_bwd_gate) and the forward as run_emu_tf32.py runs it (the one kernel where it applies);
the adjoint passing, the per-step pass ssd_bwd_rows and the per-chunk passes as NumPy mirrors
(run_emu_bwd.py, run_emu.py). Each case runs the backward three times (SETTINGS): with the
backward walk (ssd_tf32_bwd, ssd_mma.cu) where it applies, with the per-step pass in GB's
epilogue (GB_ROWS, ssd_chunk_mm_tc's ROWS), and with GB written, then ssd_bwd_rows. Each is
compared with the float64 reference ssd_vjp (every gradient within 4 GRAD_RTOL, as the GPU
test asks) and with the last (the same sums in another order: ROWS_GAP of the reference's
norm).

    python3 tests/emulation/ssd/run_emu_tf32_bwd.py [case numbers]

SSD_EMU_MUTATE='old=>new' plants a bug in ssd.cu (run_emu_mm.py's build), SSD_EMU_MUTATE_MMA
one in ssd_mma.cu (the forward and the backward walk). SSD_EMU_TF32_PASSES=1 runs the
problems with allow_tf32 on that variant's build (run_emu_tf32.py), every gradient within
TF32_RTOL["grad"] (A and dt_bias: TF32_RTOL["sums"]) and the largest error above TF32_RTOL["at_least"]. Prints one OK/FAIL line per case and
"ALL OK" or "SOME FAILED" last.
"""
import math, os, sys, time
import numpy as np
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
_mut = os.environ.pop("SSD_EMU_MUTATE", None)
_mut_mma = os.environ.pop("SSD_EMU_MUTATE_MMA", None)
if _mut_mma is not None:  # a planted bug in ssd_mma.cu (run_emu's build, at its import)
    os.environ["SSD_EMU_MUTATE"] = _mut_mma
import run_emu_tf32 as T  # noqa: E402  ssd_mma.cu's emulation (the forward in one kernel)
os.environ.pop("SSD_EMU_MUTATE", None)
if _mut is not None:  # (run_emu_tf32 built ssd.cu's kernels without it: for ssd.cu here)
    os.environ["SSD_EMU_MUTATE"] = _mut
    import ctypes
    import run_emu_mm
    T.mm_lib = ctypes.CDLL(run_emu_mm.build_so())
    T.MM_SYM.update({v[0]: getattr(T.mm_lib, "emu_" + k)
                     for k, v in {**run_emu_mm.kernels(), **run_emu_mm.run_kernels()}.items()})
import run_emu_bwd  # noqa: E402  its launcher: the adjoint passing and row mirrors first
from ssmkit import _ssd  # noqa: E402
from ssmkit._gpu import ssd as gssd  # noqa: E402


def launch(name, grid, args, **kw):
    # C B^T's blocks are read by the tensor-core products here (run_emu_bwd's CUDA-core
    # mirror makes its own, so its launcher skips the kernel)
    if name.startswith("ssd_chunk_cb<"):
        return T.launch(name, grid, args, **kw)
    return run_emu_bwd.launch(name, grid, args, **kw)


gssd._launch = launch
import importlib  # noqa: E402
from helpers import GRAD_RTOL, TF32_RTOL, TF32_SUM_FIELDS, rel_err  # noqa: E402
ref = importlib.import_module("ssmkit.reference.ssd")

FIELDS = ("x", "dt", "A", "B", "C", "D", "z", "dt_bias", "initial_state")
# GB's epilogue against GB then ssd_bwd_rows's float64 mirror (one TF32 pass: the products
# round their operands at other points)
ROWS_GAP = 4e-3 if T.ONE_PASS else 2e-5


def case(batch, L, H, P, G, N, chunk, *, D=True, z=True, init=False, softplus=True, GC=None,
         seed=0):
    rng = np.random.default_rng(seed)
    GC = GC or G
    x = rng.standard_normal((batch, L, H, P)).astype(np.float32)
    B = rng.standard_normal((batch, L, G, N)).astype(np.float32)
    C = rng.standard_normal((batch, L, GC, N)).astype(np.float32)
    dt = rng.uniform(-3, 0.5, (batch, L, H)).astype(np.float32)
    A = -rng.uniform(0.5, 4, H).astype(np.float32)
    dt_bias = rng.uniform(-1, 0.5, H).astype(np.float32)
    if not softplus:
        dt = rng.uniform(0.01, 0.5, (batch, L, H)).astype(np.float32)
        dt_bias = np.zeros(H, np.float32)
    Dv = rng.standard_normal((H, P)).astype(np.float32) if D else None
    zv = rng.standard_normal((batch, L, H, P)).astype(np.float32) if z else None
    h0 = rng.standard_normal((batch, H, P, N)).astype(np.float32) if init else None
    p, _user, _pass = _ssd._prepare("ssd_vjp", x, dt, A, B, C, chunk, Dv, zv, dt_bias, softplus,
                                    (0.0, math.inf), h0, None, None, T.ONE_PASS)
    exact = dict(x=x.astype(np.float64), dt=dt.astype(np.float64), A=A.astype(np.float64),
                 B=B.astype(np.float64), C=C.astype(np.float64), D=Dv,
                 z=None if zv is None else zv.astype(np.float64), dt_bias=dt_bias,
                 initial_state=h0)
    (y_r, fin_r), pullback = ref.ssd_vjp(**exact, chunk_size=chunk, dt_softplus=softplus,
                                         return_final_state=True)
    dy = rng.standard_normal(y_r.shape).astype(np.float32)
    dfin = rng.standard_normal(fin_r.shape).astype(np.float32)
    g_r = pullback(dy.astype(np.float64), dfin)
    t = time.time()
    _y, _final, ck = gssd.ssd_forward(p, save_checkpoints=True)
    grads = {}
    walks = P <= 64 and (P | N) % 4 == 0 and gssd.head_classes(H, G, GC) < H
    for name, walk, rows in SETTINGS:
        gssd.TF32_BWD_WALK, gssd.GB_ROWS = walk, rows
        T.RAN.clear()
        g = gssd.ssd_backward(p, ck, dy, dfin)
        walked = any(n.startswith("ssd_tf32_bwd<") for n in T.RAN)
        fused = any(n.startswith("ssd_chunk_mm_tc") and n.endswith(", false, true>")
                    for n in T.RAN)
        assert walked == (walk and walks), (name, T.RAN)
        assert fused == (rows and not walked and P <= 8 * gssd.TC_NT[-1]), (name, T.RAN)
        grads[name] = {k: np.asarray(g[k], np.float64) for k in FIELDS if g[k] is not None}
    gssd.TF32_BWD_WALK, gssd.GB_ROWS = True, True
    el = time.time() - t
    errs, gaps = {}, {}
    for k, a in grads["pass"].items():
        r = np.asarray(getattr(g_r, k), np.float64)
        n = np.linalg.norm(r)
        errs[k] = max(rel_err(grads[s][k], r) for s in grads)
        gaps[k] = max(np.linalg.norm(grads[s][k] - a) for s in grads) / (n if n > 0 else 1.0)
    def bound(k):
        if not T.ONE_PASS:
            return 4 * GRAD_RTOL["float32"]
        return TF32_RTOL["sums" if k in TF32_SUM_FIELDS else "grad"]

    ok = all(e <= bound(k) for k, e in errs.items()) and max(gaps.values()) <= ROWS_GAP
    if T.ONE_PASS and not max(errs.values()) > TF32_RTOL["at_least"]:
        ok = False  # the products did not run as single TF32 products
    return errs, gaps, ok, el


# (name, TF32_BWD_WALK, GB_ROWS): the backward walk where it applies, GB with the per-step
# pass in its epilogue, GB written and then the pass (what the others are compared with)
SETTINGS = (("walk", True, True), ("rows", False, True), ("pass", False, False))


CASES = [
    # batch, L, H, P, G, N, chunk, options
    (1, 130, 2, 64, 1, 32, 64, {}),                            # two chunks, D, z
    (2, 77, 3, 36, 1, 16, 32, {"init": True, "z": False}),    # partial chunk, odd columns
    (1, 50, 2, 8, 1, 8, 1, {"D": False}),                     # one step per chunk
    (1, 40, 4, 100, 2, 16, 40, {"GC": 1, "softplus": False}),  # NT 16, groups
    (1, 20, 2, 136, 1, 8, 16, {}),                            # P past 128: GB then the pass
    (1, 70, 2, 64, 1, 128, 32, {"init": True}),               # the walk at N 128, 3 chunks
    (2, 45, 4, 20, 2, 36, 16, {"z": False}),                  # the walk: groups, N past 32
]

if __name__ == "__main__":
    sel = [int(a) for a in sys.argv[1:] if a.isdigit()]
    allok = True
    for i, (*shape, opts) in enumerate(CASES):
        if sel and i not in sel:
            continue
        errs, gaps, ok, el = case(*shape, **opts, seed=i)
        allok &= ok
        es = " ".join(f"{k}={errs[k]:.1e}/{gaps[k]:.1e}" for k in errs)
        print(f"{i} batch,L,H,P,G,N,chunk={shape} {opts}: (vs reference / gap to GB then the pass) "
              f"{es} {'OK' if ok else 'FAIL'} [{el:.1f}s]", flush=True)
    print("ALL OK" if allok else "SOME FAILED")
    sys.exit(0 if allok else 1)
