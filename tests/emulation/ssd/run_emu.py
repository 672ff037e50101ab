"""Run ssmkit._gpu.ssd.ssd_forward with NumPy arrays: the tensor-core kernels emulated on the
host (build.py), ssd.cu's layout (dt', chunk sums), cumsum and state passing as NumPy mirrors. Compare with the float64
reference on several shapes.

    python3 tests/emulation/ssd/run_emu.py [case numbers] [--asan]

With --asan, run under LD_PRELOAD=$(g++ -print-file-name=libasan.so) ASAN_OPTIONS=detect_leaks=0.
Prints one OK/FAIL line per case and "ALL OK" or "SOME FAILED" last.
"""
import ctypes, dataclasses, math, os, sys, time
import numpy as np, ml_dtypes
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import build  # puts the repository on sys.path
sys.path.insert(0, os.path.join(build.REPO, "tests"))
from ssmkit import _ssd
from ssmkit._gpu import ssd as gssd
import importlib; ref = importlib.import_module("ssmkit.reference.ssd")
from helpers import FORWARD_RTOL, rel_err, ssd_walk_blob_outputs

lib = ctypes.CDLL(build.build(asan="--asan" in sys.argv))

class EmuBuf(ctypes.Structure):
    _fields_ = [("p", ctypes.c_void_p), ("n", ctypes.c_longlong)]

SYM = {}
for k, (name, *_r) in build.KERNELS.items():
    SYM[name] = getattr(lib, "emu_" + k)

def np_cumsum(args):
    a, out, starts, L, H, nc, reverse = args
    batch = a.shape[0]
    for c in range(int(nc)):
        t0, t1 = int(starts[c]), int(starts[c + 1])
        seg = a[:, t0:t1, :].astype(np.float32)
        out[:, t0:t1, :] = (np.cumsum(seg[:, ::-1], axis=1)[:, ::-1] if reverse else np.cumsum(seg, axis=1))

def np_chunk_dt(args):
    """ssd.cu's ssd_chunk_dt: dt' and its derivative as ssmkit._ssd.effective_dt, chunk sums of
    dt' A (the kernel text itself is checked by run_emu_mm.py)."""
    dt, bias, A, starts, dte, factor, cum, L, H, nc, softplus, clip, lo, hi = args
    raw = dt if bias is gssd._NULL or bias is None else dt + bias[None, None, :]
    v, f = raw, np.ones_like(raw)
    if softplus:
        capped = np.minimum(raw, 20.0).astype(raw.dtype)
        v = np.where(raw <= 20.0, np.log1p(np.exp(capped)), raw).astype(raw.dtype)
        f = np.where(raw <= 20.0, 1.0 / (1.0 + np.exp(-capped)), 1.0).astype(raw.dtype)
    if clip:
        f = np.where((v >= lo) & (v <= hi), f, 0.0).astype(raw.dtype)
        v = np.clip(v, lo, hi).astype(raw.dtype)
    dte[...] = v
    if not (factor is gssd._NULL or factor is None):
        factor[...] = f
    np_cumsum((v * A[None, None, :], cum, starts, L, H, nc, 0))

def np_passing(args):
    chunk, cum, seq, starts, h0, states, L, H, PN, nc, entering, _bf16, bslot, final = args
    batch = chunk.shape[0]
    hv = np.zeros(chunk.shape[:1] + chunk.shape[2:], np.float32) if h0 is gssd._NULL or h0 is None else h0.copy()

    def keep(j):  # the boundary states, or (states null) only the final ones
        if isinstance(states, np.ndarray):
            states[:, j] = hv
            return
        for b in range(batch):
            if bslot[b, j] >= 0:
                final[bslot[b, j]] = hv[b]
    keep(0)
    for c in range(int(nc)):
        if isinstance(entering, np.ndarray):  # rounded to nearest even, as ssm_store
            entering[:, c] = hv.astype(entering.dtype)
        t0, E = int(starts[c]), int(starts[c + 1]) - 1
        for b in range(batch):
            same = True if seq is gssd._NULL or seq is None else seq[b, E] == seq[b, max(t0 - 1, 0)]
            d = np.exp(cum[b, E, :]).astype(np.float32) if same else np.zeros(H, np.float32)
            hv[b] = d[:, None, None] * hv[b] + chunk[b, c]
        keep(c + 1)

def np_bwd_dt(args):
    """ssd.cu's ssd_bwd_dt: chunk suffix sums of dcum plus each chunk's boundary term (at its
    last step), ddt, per-chunk partial sums."""
    dcum, xGB, A, dte, factor, starts, ddt, part, cum, seq, end_part, bnd, L, H, nc, _ = args
    batch = dcum.shape[0]
    null = lambda a: a is gssd._NULL or a is None
    dcum = dcum.copy()
    for c in range(int(nc)):
        t0, E = int(starts[c]), int(starts[c + 1]) - 1
        e = end_part[:, c].sum(axis=-1) if not null(end_part) else np.zeros((batch, H), dcum.dtype)
        if not null(cum):
            for b in range(batch):
                same = null(seq) or seq[b, E] == seq[b, max(t0 - 1, 0)]
                e[b] = e[b] * np.exp(cum[b, E]) if same else 0
        if not null(bnd):
            e = e + bnd[:, t0:E + 1].sum(axis=1)
        dcum[:, E] += e
    sd = np.empty_like(dcum)
    np_cumsum((dcum, sd, starts, L, H, nc, 1))
    ddt[...] = (xGB + A[None, None, :] * sd) * factor
    for c in range(int(nc)):
        t0, t1 = int(starts[c]), int(starts[c + 1])
        part.reshape(batch, int(nc), 2, H)[:, c, 0] = (dte[:, t0:t1] * sd[:, t0:t1]).sum(axis=1)
        part.reshape(batch, int(nc), 2, H)[:, c, 1] = ddt[:, t0:t1].sum(axis=1)

def np_sum_parts(args):
    part, out, n, parts = args
    acc = part[0].copy()
    for k in range(1, int(parts)):
        acc += part[k]  # in run order, as the kernel
    out[...] = acc

def np_diag_cb(args):
    B, C, out, rows, H, GB, GC, N, classes = args
    h = np.arange(int(H))
    b = B.astype(np.float32)[:, :, h // (int(H) // int(GB))]
    c = C.astype(np.float32)[:, :, h // (int(H) // int(GC))]
    out[...] = (b * c).sum(axis=-1)

def emu_launch(name, grid, args, *, source=gssd.SOURCE_FILE, threads=gssd.THREADS, smem=0,
               defines=()):
    build.check_defines(name, defines)
    if name.startswith("ssd_sum_parts"):
        return np_sum_parts(args)
    if name.startswith("ssd_diag_cb"):
        return np_diag_cb(args)
    if name.startswith("ssd_chunk_cumsum"):
        return np_cumsum(args)
    if name.startswith("ssd_chunk_dt"):
        return np_chunk_dt(args)
    if name.startswith("ssd_state_passing"):
        return np_passing(args)
    if name.startswith("ssd_bwd_dt"):
        return np_bwd_dt(args)
    assert source == gssd.MMA_SOURCE_FILE and name in SYM, name
    arrs = [a for a in args if isinstance(a, np.ndarray) or a is gssd._NULL and False]
    bufs, scal = [], []
    for a in args:
        if isinstance(a, np.ndarray):
            assert a.flags.c_contiguous
            bufs.append(EmuBuf(a.ctypes.data, a.nbytes))
        elif isinstance(a, np.uint64):  # the null pointer
            bufs.append(EmuBuf(None, 0))
        else:
            scal.append(int(a))
    g = tuple(grid) + (1,) * (3 - len(grid))
    lib.emu_set_dyn_smem(ctypes.c_uint(smem))
    SYM[name]((EmuBuf * len(bufs))(*bufs), (ctypes.c_longlong * len(scal))(*scal),
              g[0], g[1], g[2], threads)

gssd._launch = emu_launch
DT = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16}

def case(dtype, batch, L, H, P, G, N, chunk, *, D="head", z=True, seq=False, cu=False, init=False,
         softplus=True, GC=None, seed=0, slow=False):
    """slow: small |A|, so that the state entering a chunk still weighs on its last rows
    (the output kernel's state term in every row tile)."""
    rng = np.random.default_rng(seed)
    GC = GC or G
    q = lambda a: a.astype(DT[dtype])
    x = q(rng.standard_normal((batch, L, H, P)))
    B = q(rng.standard_normal((batch, L, G, N)))
    C = q(rng.standard_normal((batch, L, GC, N)))
    dt = rng.uniform(-3, 0.5, (batch, L, H)).astype(np.float32)
    A = -rng.uniform(0.5, 4, H).astype(np.float32)
    if slow:
        A = -rng.uniform(0.002, 0.01, H).astype(np.float32)
    dt_bias = rng.uniform(-1, 0.5, H).astype(np.float32)
    if not softplus:  # dt' = dt + dt_bias must be positive
        dt = rng.uniform(0.01, 0.5, (batch, L, H)).astype(np.float32)
        dt_bias = np.zeros(H, np.float32)
    Dv = None if D is None else (rng.standard_normal(H) if D == "head" else rng.standard_normal((H, P))).astype(np.float32)
    zv = q(rng.standard_normal((batch, L, H, P))) if z else None
    h0 = rng.standard_normal((batch, H, P, N)).astype(np.float32) if init else None
    seq_idx = None
    if seq:
        cuts = np.sort(rng.choice(np.arange(1, L), size=min(3, L - 1), replace=False)) if L > 1 else []
        seq_idx = np.zeros((batch, L), np.int32)
        for cut in cuts: seq_idx[:, cut:] += 1
    cu_seqlens = np.asarray(cu, np.int64) if cu else None
    if cu: h0 = h0 if init else None
    kw = dict(chunk_size=chunk, D=Dv, z=zv, dt_bias=dt_bias, dt_softplus=softplus, initial_state=h0,
              seq_idx=seq_idx, cu_seqlens=cu_seqlens)
    f32 = lambda a: None if a is None else (a.astype(np.float32) if a.dtype != np.int32 else a)
    p, user, passthrough = _ssd._prepare("ssd", f32(x), dt, A, f32(B), f32(C), chunk, Dv, f32(zv),
                                         dt_bias, softplus, (0.0, math.inf), h0, seq_idx, cu_seqlens)
    p = dataclasses.replace(p, x=x, B=B, C=C, z=zv)
    assert gssd.uses_mma(p)
    t = time.time()
    y, final, _ = gssd.ssd_forward(p, save_checkpoints=False)
    el = time.time() - t
    yr, fr = ref.ssd(x.astype(np.float64), dt, A, B.astype(np.float64), C.astype(np.float64),
                     D=Dv, z=None if zv is None else zv.astype(np.float64), dt_bias=dt_bias,
                     dt_softplus=softplus, initial_state=h0, seq_idx=seq_idx, cu_seqlens=cu_seqlens,
                     return_final_state=True)
    if p.initial_state is not None:  # (else their final states stay zeros, as in ssmkit._ssd)
        for slot, row in passthrough:
            final[slot] = p.initial_state[row]
    ey, ef = rel_err(y.astype(np.float64), yr), rel_err(final, fr)
    ok = ey <= FORWARD_RTOL[dtype] and ef <= FORWARD_RTOL[dtype]
    if cu:  # as ssd without return_final_state: no final state kept, the same outputs
        p0, _, _ = _ssd._prepare("ssd", f32(x), dt, A, f32(B), f32(C), chunk, Dv, f32(zv), dt_bias,
                                 softplus, (0.0, math.inf), h0, seq_idx, cu_seqlens, sequence_finals=False)
        y0, final0, _ = gssd.ssd_forward(dataclasses.replace(p0, x=x, B=B, C=C, z=zv),
                                         save_checkpoints=False)
        if final0.shape[0] != 0 or not np.array_equal(y0, y):
            print(f"  without final states: {final0.shape[0]} kept, y equal: {np.array_equal(y0, y)}")
            ok = False
    # a VJP's forward that returns no final states (ssd_vjp without return_final_state):
    # none gathered, the same outputs and checkpoints
    y1, _, ck1 = gssd.ssd_forward(p, save_checkpoints=True)
    y2, final2, ck2 = gssd.ssd_forward(p, save_checkpoints=True, final_states=False)
    if final2 is not None or not np.array_equal(y1, y2) or not all(
            (a is None) == (b is None) and (a is None or np.array_equal(a, b)) for a, b in zip(ck1, ck2)):
        print(f"  a VJP's forward without final states: final {None if final2 is None else final2.shape}, "
              f"y or checkpoints differ")
        ok = False
    return ey, ef, ok and walk_matches_two_kernels(p, final), el

def walk_matches_two_kernels(p, final):
    """ssd_mma_state_walk (with checkpoints, at each width) against ssd_mma_chunk_state +
    ssd_state_passing: float32 states within float32 roundings of each other, the same
    16-bit entering states up to a last-bit rounding. Where ssd_mma_fwd applies (it ran
    above with the final states only), its checkpoints and outputs against the two
    kernels': within FUSED_GAP of the states' and outputs' largest entries (its operands
    w_s x_s and the state are rounded to 16 bits per tile of 64 steps, not per chunk)."""
    got, ys = {}, {}
    base = None  # with ssd_mma_fwd the default, the first other variant's final states
    widths = (64, 128)  # the state columns n of a block
    fused = gssd.uses_mma_fwd(p, p.x)
    variants = [(False, 64)] + [(True, w) for w in widths] + ([("fused", 0)] if fused else [])
    saved = gssd.MMA_STATE_WALK, gssd.MMA_WALK_NW, gssd.MMA_FUSED_FWD
    for walk, nw in variants:
        gssd.MMA_STATE_WALK, gssd.MMA_WALK_NW = walk is not False, nw or 64
        gssd.MMA_FUSED_FWD = walk == "fused"
        try:
            y, fin, (states, entering, ypre, _) = gssd.ssd_forward(p, save_checkpoints=True)
        finally:
            gssd.MMA_STATE_WALK, gssd.MMA_WALK_NW, gssd.MMA_FUSED_FWD = saved
        # with z the one kernel also keeps the output before the gate, for the backward:
        # gated, it is y up to one more 16-bit rounding
        assert (ypre is not None) == (walk == "fused" and p.z is not None), (walk, ypre is None)
        if ypre is not None:
            zf = p.z.astype(np.float64)
            gated = ypre.astype(np.float64) * zf / (1 + np.exp(-zf))
            yf = y.astype(np.float64)
            eg = np.abs(gated - yf).max() / max(np.abs(yf).max(), 1e-30)
            print(f"  output before the gate, gated, against y: {eg:.2e}")
            if not eg <= FUSED_GAP:
                return False
        got[walk, nw] = (states, entering.astype(np.float32))
        ys[walk, nw] = y.astype(np.float32)
        # the final states ssd_forward gathered from its checkpoints, against those it kept
        # without checkpoints (the default path's, or the first variant's when that is
        # not the default)
        want = final
        if walk != "fused" and fused:
            base = fin if walk is False else base
            want = base
        ef = np.abs(fin - want).max() / max(np.abs(want).max(), 1e-30)
        if not ef <= 1e-5:
            print(f"  final states with checkpoints (walk {walk}, NW {nw}): {ef:.2e}")
            return False
    s0, e0 = got[False, 64]
    lay = gssd._Layout(p)
    scale = max(np.abs(s0).max(), 1e-30)
    ok = True
    for nw in widths:
        s1, e1 = got[True, nw]
        if fused:
            final = base
        final_walk = final.copy()
        final_walk[lay.final_slots] = s1[lay.final_rows, lay.final_cols]  # the checkpoints'
        es = np.abs(s1 - s0).max() / scale
        ee = np.abs(e1 - e0).max() / scale
        ef = np.abs(final_walk - final).max() / scale
        if not (es <= 1e-5 and ee <= 2.0 ** -7 and ef <= 1e-5):
            ok = False
            print(f"  walk (NW {nw}) against two kernels: states {es:.2e}, "
                  f"entering {ee:.2e}, final {ef:.2e}")
    if fused:
        s1, e1 = got["fused", 0]
        es = np.abs(s1 - s0).max() / scale
        ee = np.abs(e1 - e0).max() / scale
        y0 = ys[False, 64]
        ey = np.abs(ys["fused", 0] - y0).max() / max(np.abs(y0).max(), 1e-30)
        print(f"  fused against two kernels: states {es:.2e}, entering {ee:.2e}, y {ey:.2e}")
        if not (es <= FUSED_GAP and ee <= FUSED_GAP and ey <= FUSED_GAP):
            ok = False
        ok &= walk_form_matches(p, got["fused", 0], ys["fused", 0])
    return ok


def walk_form_matches(p, fused_states, fused_y):
    """ssd_mma_fwd's WALK form (the forward a backward walk differentiates) against the
    plain one-kernel forward: the same states, entering states and outputs bit for bit (ssd
    runs the plain form, ssd_vjp this one), its float32 outputs before D and the gate (yblob,
    with the state's rounding residuals in their product) within the forward's tolerance of
    the float64 reference, and the outputs that D and the gate make of them within one 16-bit
    rounding."""
    lay = gssd._Layout(p, factor=False)
    y = np.empty(p.x.shape, p.x.dtype)
    blob = lay.walk_blob(p)
    states, entering = lay.fwd_mma(p, y, walk=True, yblob=blob)
    ycore = ssd_walk_blob_outputs(blob, p.x.shape, lay.Q).astype(np.float64)
    s0, e0 = fused_states
    same = np.array_equal(states, s0) and np.array_equal(entering.astype(np.float32), e0)
    yf = y.astype(np.float64)
    ey = np.abs(yf - fused_y).max() / max(np.abs(fused_y).max(), 1e-30)
    core = ref.ssd(p.x.astype(np.float64), p.dt, p.A, p.B.astype(np.float64),
                   p.C.astype(np.float64), dt_bias=p.dt_bias, dt_softplus=p.dt_softplus,
                   initial_state=p.initial_state)
    ec = rel_err(ycore, core)
    full = ycore
    if p.D is not None:
        Dv = np.asarray(p.D, np.float64)
        full = full + (Dv[:, None] if Dv.ndim == 1 else Dv) * p.x.astype(np.float64)
    if p.z is not None:
        zf = p.z.astype(np.float64)
        full = full * zf / (1 + np.exp(-zf))
    eo = np.abs(full - yf).max() / max(np.abs(yf).max(), 1e-30)
    dtype = "bfloat16" if p.x.dtype == ml_dtypes.bfloat16 else "float16"
    print(f"  walk form: states {'equal' if same else 'DIFFER'}, y against the fused {ey:.2e}, "
          f"ycore against float64 {ec:.2e}, y from ycore {eo:.2e}")
    return same and ey == 0 and ec <= FORWARD_RTOL[dtype] and eo <= 2.0 ** -7

FUSED_GAP = 2.0 ** -6

CASES = [
    # dtype, batch, L, H, P, G, N, chunk, options
    ("bfloat16", 2, 200, 4, 64, 1, 128, 64, {}),
    ("float16", 2, 200, 4, 64, 1, 128, 64, {}),
    ("float16", 1, 1, 2, 64, 1, 64, 64, {}),
    ("bfloat16", 1, 1, 2, 32, 1, 16, 256, {"D": "chan"}),
    ("float16", 2, 130, 4, 40, 2, 72, 128, {"D": "chan", "init": True}),
    ("bfloat16", 1, 300, 4, 128, 2, 256, 256, {"seq": True, "init": True, "GC": 1}),
    ("float16", 1, 257, 2, 100, 1, 48, 256, {"seq": True, "z": False, "D": None}),
    ("float16", 1, 150, 2, 16, 1, 32, 16, {"init": True, "softplus": False}),
    ("bfloat16", 1, 190, 3, 64, 1, 64, 64, {"cu": [0, 50, 50, 121, 190], "init": True}),
    ("float16", 2, 65, 2, 8, 2, 8, 32, {"seq": True}),
    ("float16", 1, 140, 2, 64, 1, 200, 128, {"init": True, "seq": True}),
    ("bfloat16", 2, 100, 2, 32, 2, 256, 64, {"D": "chan", "GC": 1}),
    ("bfloat16", 1, 64, 2, 64, 1, 128, 64, {"z": False}),
    ("float16", 1, 150, 2, 9, 1, 16, 32, {"D": "chan"}),  # odd P: the scalar epilogue
    # slow decay: the entering state weighs on every row tile of a chunk (the output
    # kernel keeps it staged from tile to tile without z, restages it with z)
    ("float16", 1, 300, 2, 64, 1, 128, 256, {"init": True, "slow": True}),
    ("bfloat16", 2, 520, 2, 64, 1, 96, 256, {"init": True, "slow": True, "z": False}),
    # a sequence without steps and no initial state: its final state must be zeros
    ("float16", 1, 190, 3, 64, 1, 64, 64, {"cu": [0, 50, 50, 121, 190]}),
]

if __name__ == "__main__":
    sel = [int(a) for a in sys.argv[1:] if a.isdigit()]
    allok = True
    for i, (dtype, *shape, opts) in enumerate(CASES):
        if sel and i not in sel: continue
        ey, ef, ok, el = case(dtype, *shape, **opts, seed=i)
        allok &= ok
        print(f"{i} {dtype:9s} batch,L,H,P,G,N,chunk={shape} {opts}: y rel err {ey:.2e}, final {ef:.2e} "
              f"(tol {FORWARD_RTOL[dtype]:g}) {'OK' if ok else 'FAIL'} [{el:.1f}s]", flush=True)
    print("ALL OK" if allok else "SOME FAILED")
    sys.exit(0 if allok else 1)
