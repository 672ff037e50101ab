"""Run ssmkit's GPU selective scan host code (ssmkit._gpu.selective_scan) with the kernels
emulated on the CPU (build.py), and compare forward and every gradient with the float64
ssmkit.reference.selective_scan_vjp.

Run one case:  python3 tests/emulation/selective_scan/run.py
(sweep.py runs the case lists.) Environment: ASAN=0 builds without AddressSanitizer (then no
LD_PRELOAD is needed); SEGS / MINSEG force the segment split; SM sets the emulated SM count;
FWD_ASYNC=0 runs the forward kernels that stage from global memory instead of the cp.async ones;
FWD_RING=0 / BWD_RING=0 turn the ring forward / backward kernels off (where they apply they are
the default); FWD_RING_MAX_N sets the largest N of the ring forward (sweep.py ring: 128), BWD_RING_MAX_N
that of the ring backward in one pass and its state slices' width (16 or 32); FWD_RING_WIDE_MIN_N=n
lets its blocks grow to 512 threads (ssm_scan_fwd_ring_wide) from N = n (0: never); SUM_SPLIT=m splits the ring summaries' segments in m; FWD_SUM_TILES=1 gives the
forward's summary its own tiles;
STATE_SLICES=1 / 0 runs the backward of every N > 16 (32) as slices of 16 (32) states through the ring backward (or none;
SLICE_LANES=1: one slice at a time, not the default two lanes);
SS_EMU_MUTATE='old=>new' plants a bug in the kernel text (see build.py).
"""
import ctypes, sys, os, itertools, time
import numpy as np
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import build  # puts the repository on sys.path
from ssmkit._gpu import selective_scan as ss, compiler
from ssmkit._problem import SelectiveScanProblem
from ssmkit import reference as ref

if os.environ.get("SEGS"): ss.TUNING["force_segments"] = int(os.environ["SEGS"])
if os.environ.get("FWD_ASYNC"): ss.TUNING["fwd_async"] = os.environ["FWD_ASYNC"] == "1"
if os.environ.get("FWD_RING"): ss.TUNING["fwd_ring"] = os.environ["FWD_RING"] == "1"
if os.environ.get("BWD_RING"): ss.TUNING["bwd_ring"] = os.environ["BWD_RING"] == "1"
if os.environ.get("FWD_RING_MAX_N"): ss.TUNING["fwd_ring_max_n"] = int(os.environ["FWD_RING_MAX_N"])
if os.environ.get("BWD_RING_MAX_N"): ss.TUNING["bwd_ring_max_n"] = int(os.environ["BWD_RING_MAX_N"])
if os.environ.get("SUM_SPLIT"): ss.TUNING["sum_split"] = int(os.environ["SUM_SPLIT"])
if os.environ.get("FWD_RING_WIDE_MIN_N"): ss.TUNING["fwd_ring_wide_min_n"] = int(os.environ["FWD_RING_WIDE_MIN_N"]) or None
def state_slices(on):
    """The backward of every N past the ring backward's (16 or 32) by slices of that many states
    (on), or of none; in two lanes (odd slices adding into buffers of their own), SLICE_LANES=1:
    one."""
    ss.TUNING["bwd_state_slices_from"] = 17 if on else None
    ss.TUNING["bwd_state_slices_min_warps"] = 0
    ss.TUNING["bwd_state_slices_lanes"] = int(os.environ.get("SLICE_LANES", "2"))
if os.environ.get("STATE_SLICES"): state_slices(os.environ["STATE_SLICES"] == "1")
if os.environ.get("FWD_SUM_TILES"): ss.TUNING["fwd_sum_tiles"] = os.environ["FWD_SUM_TILES"] == "1"
if os.environ.get("MINSEG"): ss.TUNING["min_seg_steps"] = ss.TUNING["bwd_min_seg_steps"] = int(os.environ["MINSEG"])
compiler.device_limits = lambda: {"sm_count": int(os.environ.get("SM", "132")), "smem_optin": 232448, "smem_per_sm": 233472}

class EmuBuf(ctypes.Structure):
    _fields_ = [("p", ctypes.c_void_p), ("n", ctypes.c_longlong)]

_libs = {}
LAUNCHES = []

def emu_launch(key, plan, args):
    so = build.build([key], asan=os.environ.get("ASAN", "1") == "1")
    lib = _libs.get(so) or ctypes.CDLL(so)
    _libs[so] = lib
    sig = build.SIGS[key.kind]
    assert len(args) == len(sig), (key.kind, len(args), len(sig))
    arrs = [a for a, t in zip(args, sig) if build.is_ptr(t)]
    scal = [a for a, t in zip(args, sig) if not build.is_ptr(t)]
    for v, t in zip(scal, [t for t in sig if not build.is_ptr(t)]):
        want = np.int64 if t == "ssm_i64" else np.int32
        assert type(v) is want, (t, type(v))
    nptr = len(arrs)
    bufs = (EmuBuf * nptr)()
    for i, a in enumerate(arrs):
        if isinstance(a, np.ndarray):  # (a view: from its first element to its last's end)
            assert a.flags.c_contiguous or all(s > 0 for s in a.strides)
            bufs[i].p = a.ctypes.data; bufs[i].n = np.lib.array_utils.byte_bounds(a)[1] - a.ctypes.data
        else:
            assert type(a) is np.uint64 and a == 0, (key.kind, i, type(a))
            bufs[i].p = None; bufs[i].n = 0
    s = (ctypes.c_longlong * len(scal))(*[int(v) for v in scal])
    LAUNCHES.append((key.kind, dict(plan)))
    getattr(lib, build.symbol(key))(bufs, s, ctypes.c_uint(plan["blocks"]), ctypes.c_uint(plan["threads"]), ctypes.c_uint(plan["smem"]))

ss._launch = emu_launch
def _emu_plan(p, which, N=None, dtypes=None):
    io, bc = dtypes or (ss._dtype_name(p.io_dtype), ss._dtype_name(p.bc_dtype))
    plan = (ss._cached_plan(which, p.batch, p.dim, p.L, p.N if N is None else N, p.groups(p.B), p.groups(p.C), p.chunk_size,
                                ss._dtype_name(p.compute_dtype), 0, tuple(sorted(ss.TUNING.items())), io, bc))
    return None if plan is None else dict(plan)
ss._plan = _emu_plan

class NaNXP:
    """numpy, but empty() is NaN-filled so unwritten outputs show."""
    def __getattr__(self, name): return getattr(np, name)
    def empty(self, shape, dtype=float):
        dt = np.dtype(dtype)
        return np.full(shape, np.nan, dtype=dt) if dt.kind == "f" or dt.name == "bfloat16" else np.empty(shape, dt)
XP = NaNXP()

def make(rng, batch, dim, L, N, io="float32", bc=None, gb=1, gc=1, D=True, z=True, bias=True, softplus=True,
         h0=True, chunk=None):
    ct = ss._COMPUTE[io]
    bc = bc or io
    iod = np.dtype(io) if io != "bfloat16" else __import__("ml_dtypes").bfloat16
    bcd = np.dtype(bc) if bc != "bfloat16" else __import__("ml_dtypes").bfloat16
    def r(*s, scale=1.0): return (rng.standard_normal(s) * scale)
    u = r(batch, dim, L).astype(iod)
    delta = (r(batch, dim, L, scale=0.5) + (0 if softplus else 1.0)).astype(iod)
    if not softplus: delta = (np.abs(delta.astype(np.float64)) * 0.5).astype(iod)
    A = -np.exp(r(dim, N, scale=0.5)).astype(ct)
    B = (r(batch, gb, N, L) if gb else r(dim, N)).astype(bcd)
    C = (r(batch, gc, N, L) if gc else r(dim, N)).astype(bcd)
    Dv = r(dim).astype(ct) if D else None
    zv = r(batch, dim, L).astype(iod) if z else None
    bv = (r(dim, scale=0.5) if softplus else np.abs(r(dim, scale=0.5))).astype(ct) if bias else None
    h0v = r(batch, dim, N).astype(ct) if h0 else None
    p = SelectiveScanProblem(u=u, delta=delta, A=A, B=B, C=C, D=Dv, z=zv, delta_bias=bv, delta_softplus=softplus,
                             initial_state=h0v, chunk_size=chunk or max(1, L), xp=XP)
    return p

def f64(x): return None if x is None else np.asarray(x, dtype=np.float64)

def check(p, rng, tol, dfinal=True, label=""):
    y, fin, ck = ss.selective_scan_forward(p, save_checkpoints=True)
    (yr, finr), pull = ref.selective_scan_vjp(f64(p.u), f64(p.delta), f64(p.A), f64(p.B), f64(p.C), f64(p.D), f64(p.z),
                                            f64(p.delta_bias), p.delta_softplus, initial_state=f64(p.initial_state),
                                            return_final_state=True)
    errs = {}
    def err(name, a, b):
        a = f64(a); b = f64(b)
        assert a.shape == b.shape, (name, a.shape, b.shape)
        if a.size == 0: errs[name] = 0.0; return
        if not np.all(np.isfinite(a)): errs[name] = float("nan"); return
        errs[name] = float(np.max(np.abs(a - b)) / (np.max(np.abs(b)) + 1e-30))
    err("y", y, yr); err("final", fin, finr)
    # checkpoints: state entering each chunk
    dy = rng.standard_normal(p.u.shape).astype(p.u.dtype)
    dfin = rng.standard_normal(fin.shape).astype(p.compute_dtype) if dfinal else None
    g = ss.selective_scan_backward(p, ck, dy, dfin)
    gr = pull(f64(dy), f64(dfin))
    for name in ("u", "delta", "z", "A", "B", "C", "D", "delta_bias", "initial_state"):
        a, b = g[name], getattr(gr, name)
        if b is None or a is None:
            assert a is None and (b is None or name == "initial_state" and p.initial_state is None), name
            continue
        err("d" + name, a, b)
    bad = {k: v for k, v in errs.items() if not (v <= tol)}
    status = "OK " if not bad else "BAD"
    fp = ([pl for k, pl in LAUNCHES if k in ("fwd", "fwd_direct", "fwd_ring", "fwd_ring_wide")] or [{}])[-1]; bp = ([pl for k, pl in LAUNCHES if k in ("bwd", "bwd_ring")] or [{}])[-1]
    desc = (("ring:" if fp.get("ring") else "") + f"{fp.get('ch')},{fp.get('tl')},s{fp.get('nseg',1)}/"
            + ("ring:" if bp.get("ring") else "") + f"{bp.get('ch')},{bp.get('tl')},s{bp.get('nseg',1)}")
    print(f"{status} {label} {desc} max={max(errs.values()):.2e}" + ("" if not bad else f" bad={bad}"), flush=True)
    return not bad

if __name__ == "__main__":
    rng = np.random.default_rng(0)
    ok = True
    p = make(rng, 2, 8, 37, 16, chunk=16)
    ok &= check(p, rng, 1e-4, label="f32 N16 basic")
    sys.exit(0 if ok else 1)
