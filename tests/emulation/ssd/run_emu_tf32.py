"""Run ssmkit._gpu.ssd.ssd_forward on float32 NumPy arrays with the float32 forward in one
kernel (ssd_mma.cu's ssd_tf32_fwd, 3 x TF32) emulated on the host (build.py), and compare
it with the float64 reference and with the chunked float32 kernels of ssd.cu (ssd_chunk_cb,
ssd_chunk_state_tc, ssd_chunk_mm_tc; emulated by run_emu_mm.py's build), with and without
checkpoints; with them, also its outputs before D and the gate (KEEP_Y) against the
reference's. ssd_chunk_dt and ssd_state_passing run as run_emu.py's NumPy mirrors.

    python3 tests/emulation/ssd/run_emu_tf32.py [case numbers]

SSD_EMU_MUTATE='old=>new' plants a bug in ssd_mma.cu (build.py), not in ssd.cu.
SSD_EMU_TF32_PASSES=1 builds both as ssd's allow_tf32 variant and runs the problems with
allow_tf32: the bounds are then TF32's (helpers.TF32_RTOL), and y's error must be above
TF32_RTOL["at_least"] (the products did run as single TF32 products).

Prints one OK/FAIL line per case and "ALL OK" or "SOME FAILED" last.
"""
import ctypes, dataclasses, math, os, sys, time
import numpy as np
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run_emu  # builds ssd_mma.cu's emulation; its launcher serves ssd_mma.cu's kernels
import run_emu_mm  # ssd.cu's kernels
from ssmkit import _ssd
from ssmkit._gpu import ssd as gssd
import importlib; ref = importlib.import_module("ssmkit.reference.ssd")
from helpers import FORWARD_RTOL, TF32_RTOL, rel_err

_mut = os.environ.pop("SSD_EMU_MUTATE", None)  # (a planted bug is for ssd_mma.cu only)
mm_lib = ctypes.CDLL(run_emu_mm.build_so())
if _mut is not None:
    os.environ["SSD_EMU_MUTATE"] = _mut
MM_SYM = {v[0]: getattr(mm_lib, "emu_" + k)
          for k, v in {**run_emu_mm.kernels(), **run_emu_mm.run_kernels()}.items()}
RAN = []  # the kernels each forward ran, by name


def launch(name, grid, args, *, source=gssd.SOURCE_FILE, threads=gssd.THREADS, smem=0,
           defines=()):
    RAN.append(name)
    if source == gssd.MMA_SOURCE_FILE or not name in MM_SYM:
        return run_emu.emu_launch(name, grid, args, source=source, threads=threads, smem=smem,
                                  defines=defines)
    run_emu.build.check_defines(name, defines)
    bufs, scal = [], []
    for a in args:
        if isinstance(a, np.ndarray):
            assert a.flags.c_contiguous
            bufs.append(run_emu.EmuBuf(a.ctypes.data, a.nbytes))
        elif isinstance(a, np.uint64):  # the null pointer
            bufs.append(run_emu.EmuBuf(None, 0))
        else:
            scal.append(int(a))
    g = tuple(grid) + (1,) * (3 - len(grid))
    MM_SYM[name]((run_emu.EmuBuf * len(bufs))(*bufs), (ctypes.c_longlong * len(scal))(*scal),
                 g[0], g[1], g[2], threads)


gssd._launch = launch
gssd.uses_tc = lambda compute, kind: compute == "float32" and kind in gssd.TC_KINDS


def forward(p, fused, save):
    saved = gssd.TF32_FUSED_FWD
    gssd.TF32_FUSED_FWD = fused
    RAN.clear()
    try:
        y, final, ck = gssd.ssd_forward(p, save_checkpoints=save)
    finally:
        gssd.TF32_FUSED_FWD = saved
    ran = any(n.startswith("ssd_tf32_fwd") for n in RAN)
    assert ran == bool(fused), (fused, RAN)
    if ck is not None:  # the outputs before D and the gate: kept by the one kernel only
        assert (ck[2] is not None) == bool(fused), fused
    return y, final, (ck[0] if ck else None), (ck[2] if ck else None)


ONE_PASS = run_emu.build.TF32_PASSES == 1
# the one kernel against the chunked kernels, relative to the largest entry (one TF32 pass:
# each rounds its operands at other points)
GAP = 2e-3 if ONE_PASS else 2e-6
TOL = TF32_RTOL["forward"] if ONE_PASS else FORWARD_RTOL["float32"]


def case(batch, L, H, P, G, N, chunk, *, D="head", z=True, init=False, softplus=True, GC=None,
         slow=False, seed=0):
    rng = np.random.default_rng(seed)
    GC = GC or G
    x = rng.standard_normal((batch, L, H, P)).astype(np.float32)
    B = rng.standard_normal((batch, L, G, N)).astype(np.float32)
    C = rng.standard_normal((batch, L, GC, N)).astype(np.float32)
    dt = rng.uniform(-3, 0.5, (batch, L, H)).astype(np.float32)
    A = -rng.uniform(0.5, 4, H).astype(np.float32)
    if slow:
        A = -rng.uniform(0.002, 0.01, H).astype(np.float32)
    dt_bias = rng.uniform(-1, 0.5, H).astype(np.float32)
    if not softplus:
        dt = rng.uniform(0.01, 0.5, (batch, L, H)).astype(np.float32)
        dt_bias = np.zeros(H, np.float32)
    Dv = None if D is None else (rng.standard_normal(H) if D == "head"
                                 else rng.standard_normal((H, P))).astype(np.float32)
    zv = rng.standard_normal((batch, L, H, P)).astype(np.float32) if z else None
    h0 = rng.standard_normal((batch, H, P, N)).astype(np.float32) if init else None
    p, _user, _pass = _ssd._prepare("ssd", x, dt, A, B, C, chunk, Dv, zv, dt_bias, softplus,
                                    (0.0, math.inf), h0, None, None, ONE_PASS)
    assert gssd.uses_tf32_fwd(p, x), "the case must take the one kernel"
    t = time.time()
    y, final, _, _ = forward(p, True, False)
    el = time.time() - t
    yr, fr = ref.ssd(x.astype(np.float64), dt, A, B.astype(np.float64), C.astype(np.float64),
                     D=Dv, z=None if zv is None else zv.astype(np.float64), dt_bias=dt_bias,
                     dt_softplus=softplus, initial_state=h0, return_final_state=True)
    ey, ef = rel_err(y.astype(np.float64), yr), rel_err(final, fr)
    ok = ey <= TOL and ef <= TOL
    if ONE_PASS and not ey > TF32_RTOL["at_least"]:
        print(f"  y rel err {ey:.2e}: not a TF32 product's")
        ok = False
    # with checkpoints, and the chunked kernels
    y1, f1, s1, ycore = forward(p, True, True)
    y0, f0, s0, _ = forward(p, False, True)
    yc_ref = ref.ssd(x.astype(np.float64), dt, A, B.astype(np.float64), C.astype(np.float64),
                     dt_bias=dt_bias, dt_softplus=softplus, initial_state=h0)
    ec = rel_err(ycore.astype(np.float64), yc_ref)
    if not ec <= TOL:
        print(f"  kept outputs before D and the gate: rel err {ec:.2e}")
        ok = False
    big = lambda a: max(np.abs(a).max(), 1e-30)
    gaps = {"y": np.abs(y1 - y0).max() / big(y0), "states": np.abs(s1 - s0).max() / big(s0),
            "final": np.abs(f1 - f0).max() / big(f0),
            "y, no checkpoints": np.abs(y - y1).max() / big(y1),
            "final, no checkpoints": np.abs(final - f1).max() / big(f1)}
    bad = {k: v for k, v in gaps.items() if not v <= GAP}
    if bad:
        print("  against the chunked kernels: " + ", ".join(f"{k} {v:.2e}" for k, v in bad.items()))
    return ey, ef, ok and not bad, el


CASES = [
    # batch, L, H, P, G, N, chunk, options
    (2, 200, 3, 64, 1, 128, 256, {}),
    (1, 1, 2, 64, 1, 64, 256, {}),
    (1, 33, 2, 64, 1, 128, 32, {"init": True}),
    (2, 65, 2, 36, 1, 68, 64, {"D": "chan", "init": True}),
    (1, 130, 4, 100, 2, 16, 100, {"GC": 1, "D": "chan"}),  # two p tiles, the second partial
    (1, 77, 2, 8, 1, 4, 5, {"init": True, "softplus": False}),  # tiles of 5 steps
    (1, 50, 2, 16, 1, 32, 1, {"z": False, "D": None}),  # one step per chunk
    (1, 300, 2, 64, 1, 128, 128, {"init": True, "slow": True}),
    (2, 97, 4, 128, 2, 128, 48, {"z": False, "init": True}),  # two full p tiles
    (1, 161, 6, 32, 3, 8, 256, {"slow": True}),  # groups, chunk capped at 128
]

if __name__ == "__main__":
    sel = [int(a) for a in sys.argv[1:] if a.isdigit()]
    allok = True
    for i, (*shape, opts) in enumerate(CASES):
        if sel and i not in sel:
            continue
        ey, ef, ok, el = case(*shape, **opts, seed=i)
        allok &= ok
        print(f"{i} batch,L,H,P,G,N,chunk={shape} {opts}: y rel err {ey:.2e}, final {ef:.2e} "
              f"(tol {TOL:g}) {'OK' if ok else 'FAIL'} [{el:.1f}s]", flush=True)
    print("ALL OK" if allok else "SOME FAILED")
    sys.exit(0 if allok else 1)
