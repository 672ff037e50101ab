"""Run ssmkit._gpu.ssd.ssd_forward + ssd_backward with NumPy arrays and SSMKIT_SSD_MMA_BWD=1:
the tensor-core kernels (forward and backward chunk products, the adjoint chunk state, the fused
per-step passes) emulated on the host (build.py), ssd.cu's layout, cumsum, state passing and
adjoint passing (and the CUDA-core adjoint chunk state, switch off) as NumPy mirrors.
Compare every gradient with the float64 reference ssd_vjp, and with the switch off (the CUDA-core
products from exact_mm.py, a float64 NumPy mirror of ssd_chunk_mm).

    python3 tests/emulation/ssd/run_emu_bwd.py [case numbers] [--asan]

Prints per gradient: on vs reference / off vs reference / |on - off| over |reference|, then
the largest |fused - unfused| over |reference| (the per-step work in ycore's and GB's
epilogues against ssd_mma_bwd_rows: the same arithmetic, row sums in another order, both
without shared blocks), then the largest |shared - not| over |reference| outside dt and
dt_bias, and in them (dB from dC's summed blocks, x_s . (G B)_s from GB's epilogue, against
dB's own blocks and row dots: MMA_SHARED_BLOCKS), then the largest |dcum from dC - from
ycore| over |reference| (without z: MMA_DC_DCUM), then "ALL OK" or "SOME FAILED". Mutation check: SSD_EMU_MUTATE='old=>new' ... run_emu_bwd.py 9
"""
import dataclasses, math, os, sys, time
os.environ["SSMKIT_SSD_MMA_BWD"] = "1"
# the CUDA-core comparison runs ssd_chunk_mm (this library's kernels); ssd_chunk_mm_tc has its
# own check in run_emu_mm.py, and asking for it would query a device
os.environ["SSMKIT_SSD_TF32"] = "0"
import numpy as np, ml_dtypes
import run_emu as E
import exact_mm
from run_emu import gssd, _ssd, DT
from helpers import GRAD_RTOL, FORWARD_RTOL, rel_err
import importlib; ref = importlib.import_module("ssmkit.reference.ssd")

NULL = lambda a: a is gssd._NULL or a is None

def np_chunk_state_adj(args):
    X, Y, dte, cum, seq, starts, out, L, H, P, GY, N, nc = args
    batch = X.shape[0]
    g = np.arange(H) // (H // int(GY))
    for c in range(int(nc)):
        t0, t1 = int(starts[c]), int(starts[c + 1])
        for b in range(batch):
            ref_s = 0 if NULL(seq) else seq[b, t0 - 1 if t0 > 0 else 0]
            keep = np.ones(t1 - t0, bool) if NULL(seq) else seq[b, t0:t1] == ref_s
            w = np.exp(cum[b, t0:t1, :].astype(np.float64)) * keep[:, None]       # (T, H)
            Xw = X[b, t0:t1].astype(np.float64) * w[:, :, None]                     # (T, H, P)
            Yh = Y[b, t0:t1][:, g, :].astype(np.float64)                            # (T, H, N)
            out[b, c] = np.einsum("thp,thn->hpn", Xw, Yh).astype(np.float32)

def np_adjoint_passing(args):
    K, cum, seq, starts, bslot, dfinal, dHx, dinit, L, H, PN, nc, dHx16, _bf16, dot_with, shift, part = args
    batch = K.shape[0]
    gv = np.zeros((batch,) + K.shape[2:], np.float32)
    have = not NULL(bslot) and not NULL(dfinal)
    for c in range(int(nc) - 1, -1, -1):
        for b in range(batch):
            if have and bslot[b, c + 1] >= 0:
                gv[b] += dfinal[bslot[b, c + 1]]
        if isinstance(dHx, np.ndarray):  # (null: only the 16-bit copy wanted)
            dHx[:, c] = gv
        if isinstance(dHx16, np.ndarray):  # rounded to nearest even, as ssm_store
            dHx16[:, c] = gv.astype(dHx16.dtype)
        if isinstance(part, np.ndarray):  # the whole dot in the first block's place
            part[:, c] = 0
            part[:, c, :, 0] = (gv * dot_with[:, c + int(shift)]).sum(axis=(2, 3))
        t0, E_ = int(starts[c]), int(starts[c + 1]) - 1
        for b in range(batch):
            same = True if NULL(seq) else seq[b, E_] == seq[b, max(t0 - 1, 0)]
            d = np.exp(cum[b, E_, :]).astype(np.float32) if same else np.zeros(K.shape[2], np.float32)
            gv[b] = d[:, None, None] * gv[b] + K[b, c]
    for b in range(batch):
        if have and bslot[b, 0] >= 0:
            gv[b] += dfinal[bslot[b, 0]]
    dinit[...] = gv

def np_bwd_rows(args):
    """ssd_bwd_rows (the CUDA-core backward's per-step pass; its kernel text is checked by
    run_emu_mm.py): dx, xGB, dcum and the dD partial sums (all in the first block's place)."""
    X, GB, dY, ycore, dte, D, dx, xGB, dcum, part, steps, H, P, _ = args
    f = lambda a: np.asarray(a).astype(np.float64)
    xgb = (f(X) * f(GB)).sum(-1)
    xGB[...] = xgb
    dcum[...] = (f(dY) * f(ycore)).sum(-1) - f(dte) * xgb
    dx[...] = (f(dte)[..., None] * f(GB) + (0 if NULL(D) else f(D) * f(dY))).astype(dx.dtype)
    if isinstance(part, np.ndarray):
        part[...] = 0
        part[0] = (f(dY) * f(X)).reshape(-1, int(H), int(P)).sum(0)

def np_bwd_gate(args):
    """ssd_bwd_gate (the gate's backward; its kernel text is checked by run_emu_mm.py): dz and
    dY from dy, z, x and ycore."""
    dy, z, X, ycore, D, dz, dY, _, _ = args
    f = lambda a: np.asarray(a).astype(np.float64)
    sg = 1 / (1 + np.exp(-f(z)))
    y_pre = f(ycore) + (0 if NULL(D) else f(D) * f(X))
    dz[...] = (f(dy) * y_pre * sg * (1 + f(z) * (1 - sg))).astype(dz.dtype)
    dY[...] = (f(dy) * f(z) * sg).astype(dY.dtype)

calls = []
_base = gssd._launch
def launch(name, grid, args, **kw):
    calls.append(name)
    if name.startswith("ssd_chunk_state<") and name.endswith("true>"):
        return np_chunk_state_adj(args)
    if name.startswith("ssd_adjoint_passing"):
        return np_adjoint_passing(args)
    if name.startswith("ssd_chunk_mm<"):  # the switch off: the CUDA-core products, exact
        return exact_mm.np_chunk_mm(name, args)
    if name.startswith("ssd_chunk_cb<"):  # C B^T blocks for ssd_chunk_mm: its mirror sums them
        return None
    if name.startswith("ssd_bwd_rows<"):
        return np_bwd_rows(args)
    if name.startswith("ssd_bwd_gate<"):
        return np_bwd_gate(args)
    return _base(name, grid, args, **kw)
gssd._launch = launch

FIELDS = ("x", "dt", "A", "B", "C", "D", "z", "dt_bias", "initial_state")
FUSED_GAP = 5e-4  # fused against unfused per-step work: float32 row sums in another order
# dB from dC's summed blocks against dB's own: the same sums, but dB's own entries were
# dt'_r (w (x . dY)) and dC's are (w dt'_q) (dY . x), float32 products associated
# otherwise, which can flip a 16-bit rounding of the sum (0 in 21 cases, 1.0e-6 in case 12:
# SHARED_GAP); dt and dt_bias
# take x_s . (G B)_s from GB's epilogue instead of dB's row dots, other roundings: their gap
# is bounded by GRAD_RTOL (8.6e-3 measured on case 18 in bfloat16, where the shared path's
# dt_bias is 2.0e-3 from the reference and the other's 8.0e-3)
# Without z dC also gives dcum's first half (MMA_DC_DCUM): then dt, A and dt_bias differ from
# ycore's by float32 sums in another order only (DCUM_GAP; against ycore's rows, shared blocks
# both times)
SHARED_GAP, DT_FIELDS, DCUM_GAP = 1e-5, ("dt", "A", "dt_bias"), 1e-4

def case(dtype, batch, L, H, P, G, N, chunk, *, D="head", z=True, seq=False, cu=False, init=False,
         softplus=True, GC=None, seed=0, mma=True, sum_blocks=2048, fused=True, shared=True,
         dc_dcum=True, walk=False):
    os.environ["SSMKIT_SSD_MMA_BWD"] = "1" if mma else "0"
    gssd.MMA_BWD_WALK = walk  # the backward as one walk (ssd_mma_bwd, run_emu_walk.py)
    gssd.MMA_ROWS_FUSED = fused  # the per-step work in ycore's and GB's epilogues
    gssd.MMA_SHARED_BLOCKS = shared  # dB from dC's summed blocks (where it applies)
    gssd.MMA_DC_DCUM = dc_dcum  # without z, dcum's first half from dC instead of ycore
    gssd.MMA_SUM_BLOCKS = sum_blocks  # small: dB, dC summed over runs of several heads
    rng = np.random.default_rng(seed)
    GC = GC or G
    q = lambda a: a.astype(DT[dtype])
    x = q(rng.standard_normal((batch, L, H, P)))
    B = q(rng.standard_normal((batch, L, G, N)))
    C = q(rng.standard_normal((batch, L, GC, N)))
    dt = rng.uniform(-3, 0.5, (batch, L, H)).astype(np.float32)
    A = -rng.uniform(0.5, 4, H).astype(np.float32)
    dt_bias = rng.uniform(-1, 0.5, H).astype(np.float32)
    if not softplus:
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
    f32 = lambda a: None if a is None else (a.astype(np.float32) if a.dtype != np.int32 else a)
    p, user, passthrough = _ssd._prepare("ssd", f32(x), dt, A, f32(B), f32(C), chunk, Dv, f32(zv),
                                         dt_bias, softplus, (0.0, math.inf), h0, seq_idx, cu_seqlens)
    p = dataclasses.replace(p, x=x, B=B, C=C, z=zv)
    assert gssd.uses_mma(p) and gssd.uses_mma_bwd(p) == mma
    t = time.time()
    calls.clear()
    y, final, ckpt = gssd.ssd_forward(p, save_checkpoints=True)
    dy = q(rng.standard_normal(y.shape))
    dfinal = rng.standard_normal(final.shape).astype(np.float32)
    g = gssd.ssd_backward(p, ckpt, dy, dfinal)
    el = time.time() - t
    assert (ckpt[3] is not None) == walk, "the WALK forward runs where the walk applies"
    if walk:
        assert calls.count(gssd.mma_bwd_walk_name(dtype, N)) == 1, calls
        assert not any(k in n for n in calls for k in ("ssd_mma_chunk_mm", "chunk_state<",
                                                       "adjoint_passing")), calls
    # with z, the one-kernel forward keeps the output before the gate for the tensor-core
    # backward, which then takes the gate's backward first and the rest as without z
    kept = ckpt[2] is not None
    assert kept == (mma and zv is not None and gssd.uses_mma_fwd(p, y)), (kept, mma)
    assert sum(n.startswith("ssd_bwd_gate") for n in calls) == (
        1 if kept or (zv is not None and not mma) else 0), calls
    pk = dataclasses.replace(p, z=None) if kept else p
    no_ycore = mma and gssd._dc_dcum(pk, gssd._shared_blocks(pk, fused))
    if not walk:
        assert sum(k in n for n in calls for k in ("ssd_mma_chunk_mm", "ssd_mma_chunk_dc", "ssd_mma_chunk_db")) == (
            (3 if no_ycore else 4) if mma else 0), calls
        assert sum(n.startswith("ssd_chunk_mm") for n in calls) == (0 if mma else 4), calls
        assert sum(n.startswith("ssd_mma_bwd_rows") for n in calls) == (
            0 if not mma or fused else 1 + (pk.z is not None)), calls
    if h0 is not None:
        for slot, row in passthrough:
            g["initial_state"][row] += dfinal[slot]
    if Dv is not None and Dv.ndim == 1:
        g["D"] = g["D"].sum(axis=1)
    (yr, fr), pb = ref.ssd_vjp(x.astype(np.float64), dt, A, B.astype(np.float64), C.astype(np.float64),
                               chunk_size=chunk, D=Dv, z=None if zv is None else zv.astype(np.float64),
                               dt_bias=dt_bias, dt_softplus=softplus, initial_state=h0, seq_idx=seq_idx,
                               cu_seqlens=cu_seqlens, return_final_state=True)
    gr = pb(dy.astype(np.float64), dfinal.astype(np.float64))
    errs = {}
    for n in FIELDS:
        r = getattr(gr, n)
        if r is None:
            continue
        errs[n] = rel_err(np.asarray(g[n]).astype(np.float64), r)
    ok = max(errs.values()) <= 4 * GRAD_RTOL[dtype]  # the bound of tests/test_ssd.py
    return errs, ok, el, (g, gr)

CASES = [
    # dtype, batch, L, H, P, G, N, chunk, options
    ("bfloat16", 2, 200, 4, 64, 1, 128, 64, {}),
    ("float16", 2, 200, 4, 64, 1, 128, 64, {}),
    ("float16", 1, 1, 2, 64, 1, 64, 64, {}),
    ("bfloat16", 1, 1, 2, 32, 1, 16, 256, {"D": "chan"}),
    ("float16", 2, 130, 4, 40, 2, 72, 128, {"D": "chan", "init": True}),
    ("bfloat16", 1, 300, 4, 128, 2, 128, 256, {"seq": True, "init": True, "GC": 1}),
    ("float16", 1, 257, 2, 100, 1, 48, 256, {"seq": True, "z": False, "D": None}),
    ("float16", 1, 150, 2, 16, 1, 32, 16, {"init": True, "softplus": False}),
    ("bfloat16", 1, 190, 3, 64, 1, 64, 64, {"cu": [0, 50, 50, 121, 190], "init": True}),
    ("float16", 2, 65, 2, 8, 2, 8, 32, {"seq": True}),
    ("float16", 1, 140, 2, 64, 1, 100, 128, {"init": True, "seq": True}),
    ("bfloat16", 2, 100, 2, 32, 2, 128, 64, {"D": "chan", "GC": 1}),
    ("float16", 1, 300, 2, 128, 1, 128, 256, {"init": True}),
    ("bfloat16", 1, 64, 2, 64, 1, 128, 64, {"z": False}),
    ("float16", 2, 17, 2, 3, 1, 5, 4, {"seq": True, "init": True, "D": "chan"}),
    ("bfloat16", 1, 7, 2, 5, 2, 6, 1, {"init": True}),
    ("float16", 1, 40, 4, 2, 2, 3, 3, {"softplus": False, "z": False}),
    ("bfloat16", 2, 131, 4, 64, 4, 32, 65, {"seq": True, "GC": 2}),
    # dB, dC over runs of several heads: one run per group (3 heads), uneven runs (3 + 2)
    ("bfloat16", 1, 150, 6, 32, 2, 64, 64, {"seq": True, "init": True, "sum_blocks": 1}),
    ("float16", 2, 90, 5, 16, 1, 24, 32, {"sum_blocks": 8, "D": "chan"}),
    ("float16", 1, 200, 4, 64, 2, 128, 128, {"sum_blocks": 1, "GC": 1, "z": False}),
    # whole tiles without restarts (the factored weights of ycore, GB, dC, and of dB as a
    # head-summing ssd_mma_chunk_mm: B in fewer groups than C), runs of two heads
    ("float16", 1, 160, 4, 16, 1, 16, 128, {"GC": 2, "init": True, "sum_blocks": 1}),
    # without z, dcum's first half from dC (MMA_DC_DCUM): 4 row tiles per chunk, the last
    # chunk's last tile short (nr 8) after whole tiles, runs of heads; restarts, two row tiles
    ("bfloat16", 1, 456, 4, 64, 1, 128, 256, {"z": False, "init": True, "sum_blocks": 1}),
    ("float16", 2, 200, 3, 32, 1, 64, 128, {"z": False, "seq": True, "sum_blocks": 4}),
]

if __name__ == "__main__":
    sel = [int(a) for a in sys.argv[1:] if a.isdigit()]
    allok = True
    for i, (dtype, *shape, opts) in enumerate(CASES):
        if sel and i not in sel: continue
        errs0, _, _, (g0, gr) = case(dtype, *shape, **opts, seed=i, mma=False)
        errs, ok, el, (g1, _) = case(dtype, *shape, **opts, seed=i, mma=True)
        _, _, _, (g2, _) = case(dtype, *shape, **opts, seed=i, mma=True, fused=False)
        _, _, _, (g3, _) = case(dtype, *shape, **opts, seed=i, mma=True, shared=False)
        _, _, _, (g4, _) = case(dtype, *shape, **opts, seed=i, mma=True, dc_dcum=False)
        def gap(k, ga, gb=g1):  # |ga - gb| / |reference| (absolute where the reference is 0), as the GPU test
            d = np.asarray(gb[k]).astype(np.float64) - np.asarray(ga[k]).astype(np.float64)
            n = np.linalg.norm(np.asarray(getattr(gr, k), np.float64))
            return np.linalg.norm(d) / (n if n > 0 else 1.0)
        gaps = {k: gap(k, g0) for k in errs}
        fgap = max(gap(k, g2, g3) for k in errs)  # fused against unfused, neither shared
        # dB from dC's blocks (the default, g1) against dB's own (g3)
        sgap = max(gap(k, g3) for k in errs if k not in DT_FIELDS)
        sdt = max((gap(k, g3) for k in errs if k in DT_FIELDS), default=0.0)
        dgap = max(gap(k, g4) for k in errs)  # dcum from dC against ycore's
        ok = (ok and max(gaps.values()) <= 4 * GRAD_RTOL[dtype] and fgap <= FUSED_GAP
              and sgap <= SHARED_GAP and sdt <= GRAD_RTOL[dtype] and dgap <= DCUM_GAP)
        allok &= ok
        es = " ".join(f"{k}={v:.1e}/{errs0[k]:.1e}/{gaps[k]:.1e}" for k, v in errs.items())
        print("  (per gradient: switch on vs reference / switch off vs reference / on vs off)")
        print(f"{i} {dtype:9s} batch,L,H,P,G,N,chunk={shape} {opts}: {es} (GRAD_RTOL {GRAD_RTOL[dtype]:g}, test bound 4x; worst on {max(errs.values()):.1e}, off {max(errs0.values()):.1e}; fused vs unfused {fgap:.1e}; shared blocks vs not {sgap:.1e}, dt {sdt:.1e}; dcum from dC vs ycore {dgap:.1e}) "
              f"{'OK' if ok else 'FAIL'} [{el:.1f}s]", flush=True)
    print("ALL OK" if allok else "SOME FAILED")
    sys.exit(0 if allok else 1)
