"""Host check of ssd.cu's ssd_chunk_mm (the CUDA-core chunk products: register tiles of R
rows, MR x MR entries per thread) against exact_mm.py's float64 mirror: the kernel text
compiled for the host (emu_common.h: a fiber per CUDA thread, a block barrier for
__syncthreads), every product kind (y with D and z, ycore, GB, dB, dC), float and double,
every column-group count VM, on chunk boundaries from ssmkit's own chunk_starts (a length-1
row, chunks that end inside a tile, sequence ends inside chunks, K and V that are not
multiples of the stage or of the column group) and head groups of U, W and Vv; and the
backward's per-step pass ssd_bwd_rows and its gate pass ssd_bwd_gate, the chunk states ssd_chunk_state (both forms) and
the per-chunk passes ssd_chunk_dt (the layout), ssd_chunk_cumsum and ssd_bwd_dt,
ssd_diag_cb and the adjoint walk ssd_adjoint_passing against NumPy (all cases, with no
arguments).

    python3 tests/emulation/ssd/run_emu_mm.py [case ...]      # all cases by default
    python3 tests/emulation/ssd/run_emu_mm.py --cases 0,2,4    # these, and every other check

SSD_EMU_MUTATE='old=>new' plants a deliberate bug (first occurrence) to see the check fail.
Ends with "ALL OK" or "SOME FAILED" (exit status 0 or 1).
"""
import ctypes, math, os, sys, types
import numpy as np
import build  # puts the repository on sys.path
from emu_build import COMMON_REPL, compile_so, replace_all, replace_mma
from ssmkit._gpu import compiler
from ssmkit._gpu import ssd as gssd
from ssmkit._ssd import effective_dt
import exact_mm

PTRS = ("const T*,const T*,const T*,const T*,const T*,const T*,const T*,const T*,const int*,"
        "const ssm_i64*,T*").split(",")
SCALARS = ["ssm_i64", "int", "int", "int", "int", "int", "int", "ssm_i64", "ssm_i64", "int"]
TAIL_P, TAIL_S = ["const T*"], ["int"]  # cb, classes
# ssd_chunk_mm_tc: cb, then ROWS's x, ycore, xGB, dcum, dD_part, then classes
TC_TAIL_P = ["const T*", "const T*", "const T*", "T*", "T*", "T*"]
CB_PTRS = "const T*,const T*,const ssm_i64*,T*".split(",")
CB_SCALARS = ["ssm_i64", "int", "int", "int", "ssm_i64", "int", "int"]
ROWS_PTRS = "const T*,const T*,const T*,const T*,const T*,const T*,T*,T*,T*,T*".split(",")
ROWS_SCALARS = ["ssm_i64", "int", "int", "int"]
GATE_PTRS = "const T*,const T*,const T*,const T*,const T*,T*,T*".split(",")
GATE_SCALARS = ["ssm_i64", "ssm_i64"]
# ssd_chunk_hblocks_tc, ssd_chunk_hsum_tc (dB and dC summed over heads)
HB_PTRS = "const T*,const T*,const T*,const T*,const int*,const ssm_i64*,T*".split(",")
HB_SCALARS = ["ssm_i64", "int", "int", "ssm_i64", "int", "int", "int", "ssm_i64"]
HS_PTRS = ("const T*,const T*,const T*,const T*,const T*,const T*,const int*,const ssm_i64*,"
           "T*").split(",")
HS_SCALARS = ["ssm_i64", "int", "int", "int", "int", "int", "ssm_i64", "ssm_i64", "int", "int",
              "int", "ssm_i64"]
STATE_PTRS = "const T*,const T*,const T*,const T*,const int*,const ssm_i64*,T*".split(",")
STATE_SCALARS = ["ssm_i64", "int", "int", "int", "int", "ssm_i64"]
IO = {"float32": ("float", np.float32), "float64": ("double", np.float64)}




def kernels():
    """{wrapper symbol: (instance name, C type, signature)} for every kind and VM of float
    and double, each kind of ssd_chunk_mm_tc (float), and ssd_chunk_cb."""
    out = {}
    for io, (T, _) in IO.items():
        for kind in gssd.MM_KINDS:
            for vm in gssd.vm_values(io):
                out[f"mm_{io}_{kind}_{vm}"] = (gssd.mm_name(kind, io, io, vm), T, PTRS, SCALARS,
                                               TAIL_P, TAIL_S)
            if io == "float32":
                for nt in gssd.TC_NT:
                    out[f"mm_tc_{kind}_{nt}"] = (gssd.mm_tc_name(kind, io, io, nt), T, PTRS,
                                                 SCALARS, TC_TAIL_P, TAIL_S)
                    if kind == "y":  # the instance for the output with z
                        out[f"mm_tc_{kind}_{nt}_gate"] = (gssd.mm_tc_name(kind, io, io, nt, gate=True),
                                                          T, PTRS, SCALARS, TC_TAIL_P, TAIL_S)
                    if kind == "GB":  # the per-step pass in the epilogue
                        out[f"mm_tc_{kind}_{nt}_rows"] = (gssd.mm_tc_name(kind, io, io, nt, rows=True),
                                                          T, PTRS, SCALARS, TC_TAIL_P, TAIL_S)
                    if kind in gssd.HSUM_KINDS:
                        out[f"hs_{kind}_{nt}"] = (gssd.hsum_name(kind, io, io, nt), T, HS_PTRS,
                                                  HS_SCALARS)
        if io == "float32":
            out["hb"] = (gssd.hblocks_name(io), T, HB_PTRS, HB_SCALARS)
        out[f"cb_{io}"] = (f"ssd_chunk_cb<{T}, {T}>", T, CB_PTRS, CB_SCALARS)
        out[f"rows_{io}"] = (f"ssd_bwd_rows<{T}, {T}>", T, ROWS_PTRS, ROWS_SCALARS)
        out[f"gate_{io}"] = (f"ssd_bwd_gate<{T}, {T}, {T}, {T}>", T, GATE_PTRS, GATE_SCALARS)
        for adj in ("false", "true"):
            out[f"state_{io}_{adj}"] = (f"ssd_chunk_state<{T}, {T}, {T}, {adj}>", T, STATE_PTRS,
                                        STATE_SCALARS)
            if io == "float32":
                for nt in gssd.TC_NT:
                    out[f"state_tc_{adj}_{nt}"] = (gssd.state_name(io, io, adj == "true", nt=nt),
                                                   T, STATE_PTRS, STATE_SCALARS)
    return out


# The per-chunk passes over (batch, L, H) arrays, float and double.
RUN_PTRS = {"cumsum": "const T*,T*,const ssm_i64*".split(","),
            "bwd_dt": ("const T*,const T*,const T*,const T*,const T*,const ssm_i64*,T*,T*,"
                       "const T*,const int*,const T*,const T*").split(",")}
RUN_SCALARS = {"cumsum": ["ssm_i64", "int", "ssm_i64", "int"],
               "bwd_dt": ["ssm_i64", "int", "ssm_i64", "int"]}


def run_kernels():
    return {f"{k}_{io}": (f"ssd_{'chunk_cumsum' if k == 'cumsum' else k}<{T}>", T, RUN_PTRS[k],
                          RUN_SCALARS[k])
            for k in RUN_PTRS for io, (T, _) in IO.items()}


# ssd_diag_cb has two types: wrappers of its own (B and C in TB, out in CT).
DIAG_TYPES = {"float32": ("float", "float"), "float64": ("double", "double"),
              "bfloat16": ("ssm_bf16", "float")}
DIAG_CB_WRAPPERS = "".join(f'''
extern "C" void emu_diag_cb_{io}(EmuBuf* a, long long* s, unsigned gx) {{
    std::vector<void*> r = emu_copy_in(a, 3);
    auto call = [&r, s] {{
        ssd_diag_cb<{TB}, {CT}>((const {TB}*)r[0], (const {TB}*)r[1], ({CT}*)r[2], (ssm_i64)s[0],
                               (int)s[1], (int)s[2], (int)s[3], (int)s[4], (int)s[5]);
    }};
    emu_launch(call, gx, 1, 1, 256);
    emu_copy_out(a, r, 3);
}}
''' for io, (TB, CT) in DIAG_TYPES.items())

# ssd_chunk_dt takes its clip bounds as floating-point scalars: a wrapper of its own.
CHUNK_DT_WRAPPERS = "".join(f'''
extern "C" void emu_chunk_dt_{T}(EmuBuf* a, long long* s, double* f, unsigned gx, unsigned gy) {{
    std::vector<void*> r = emu_copy_in(a, 7);
    auto call = [&r, s, f] {{
        ssd_chunk_dt<{T}>((const {T}*)r[0], (const {T}*)r[1], (const {T}*)r[2],
                          (const ssm_i64*)r[3], ({T}*)r[4], ({T}*)r[5], ({T}*)r[6],
                          (ssm_i64)s[0], (int)s[1], (ssm_i64)s[2], (int)s[3], (int)s[4],
                          ({T})f[0], ({T})f[1]);
    }};
    emu_launch(call, gx, gy, 1, {threads});
    emu_copy_out(a, r, 7);
}}
''' for T in ("float", "double") for threads in [gssd.CHUNK_THREADS])


# ssd_adjoint_passing interleaves pointers and scalars, its 16-bit copy a void*: a wrapper of
# its own (float).
ADJOINT_WRAPPER = """
extern "C" void emu_adjoint_passing(EmuBuf* a, long long* s, unsigned gx, unsigned gy) {
    std::vector<void*> r = emu_copy_in(a, 11);
    auto call = [&r, s] {
        ssd_adjoint_passing<float>((const float*)r[0], (const float*)r[1], (const int*)r[2],
            (const ssm_i64*)r[3], (const int*)r[4], (const float*)r[5], (float*)r[6],
            (float*)r[7], (ssm_i64)s[0], (int)s[1], (ssm_i64)s[2], (ssm_i64)s[3], r[8],
            (int)s[4], (const float*)r[9], (int)s[5], (float*)r[10]);
    };
    emu_launch(call, gx, gy, 1, 256);
    emu_copy_out(a, r, 11);
}
"""


def build_so():
    src = compiler.kernel_source(gssd.SOURCE_FILE)
    mut = os.environ.get("SSD_EMU_MUTATE")
    if mut:
        old, new = mut.split("=>")
        assert src.count(old) >= 1, old
        src = src.replace(old, new, 1)
    src = replace_mma(replace_all(src, COMMON_REPL + build.TF32_REPL), emulate=False)
    text = ('#include "prelude_mma.h"\nstruct alignas(16) uint4 { unsigned x, y, z, w; };\n' + src + build.LAUNCH + "".join(
        build.wrapper("emu_" + sym, *v) for sym, v in {**kernels(), **run_kernels()}.items())
        + CHUNK_DT_WRAPPERS + DIAG_CB_WRAPPERS + ADJOINT_WRAPPER)
    return compile_so("ssd_mm", text, asan=os.environ.get("ASAN", "0") == "1", opt="-O1",
                      include_dir=build.HERE, extra_flags=("-fno-strict-aliasing", build.TF32_FLAG))


class EmuBuf(ctypes.Structure):
    _fields_ = [("p", ctypes.c_void_p), ("n", ctypes.c_longlong)]


def launch(lib, sym, grid, arrays, scalars, grid_y=1, threads=256):
    bufs = (EmuBuf * len(arrays))(*[EmuBuf(None, 0) if a is None else
                                    EmuBuf(a.ctypes.data, a.nbytes) for a in arrays])
    s = (ctypes.c_longlong * len(scalars))(*[int(v) for v in scalars])
    getattr(lib, sym)(bufs, s, grid, grid_y, 1, threads)


# (io, batch, L, chunk, seq ends or None, H, XU, XW, XV, K, V)
CASES = [
    ("float32", 1, 1, 64, None, 2, 1, 1, 2, 16, 8),
    ("float32", 1, 150, 64, None, 2, 1, 1, 2, 128, 64),
    ("float32", 2, 77, 100, [30, 31, 64], 2, 2, 1, 1, 40, 72),
    ("float32", 1, 70, 70, None, 4, 2, 4, 1, 24, 150),
    ("float32", 1, 20, 8, [3, 11], 1, 1, 1, 1, 5, 3),
    ("float64", 1, 45, 40, [17], 2, 1, 2, 2, 17, 33),
    ("float64", 1, 33, 64, None, 1, 1, 1, 1, 9, 250),
    ("float32", 1, 230, 200, [150], 2, 1, 1, 2, 20, 16),  # 4 tiles per chunk
    ("float64", 1, 100, 100, None, 2, 1, 2, 1, 12, 8),
    ("float32", 1, 200, 256, [90], 4, 2, 4, 1, 32, 72),  # 4 heads per class: runs of heads
]


def chunked_problem(rng, dt, batch, L, chunk, ends, H):
    """Chunk boundaries (ssmkit's chunk_starts), seq_idx with sequences starting at ``ends``
    (or None), chunk sums cum of a <= 0 and dt' in (0.05, 1): (starts, seq, cum, dte)."""
    starts = gssd.chunk_starts(L, chunk, ends)
    seq = None
    if ends:
        seq = np.zeros((batch, L), np.int32)
        for e in ends:
            seq[:, e:] += 1
    cum = np.zeros((batch, L, H), dt)
    for c in range(len(starts) - 1):
        t0, t1 = starts[c], starts[c + 1]
        cum[:, t0:t1] = np.cumsum(-rng.uniform(0, 0.2, (batch, t1 - t0, H)), axis=1)
    dte = rng.uniform(0.05, 1.0, (batch, L, H)).astype(dt)
    return starts, seq, cum, dte


def max_rel_err(out, ref):
    """max |out - ref| / max |ref|; infinite where out holds a NaN (an entry not written)."""
    if np.isnan(out).any():
        return float("inf")
    return float(np.abs(out - ref).max() / max(np.abs(ref).max(), 1e-30))


def check(label, out, ref, tol):
    """Prints the relative error of out against ref and whether it is under tol."""
    err = max_rel_err(out, ref)
    print(f"{label}: rel err {err:.2e} {'ok' if err < tol else 'FAIL'}")
    return err < tol


def run_case(lib, i):
    io, batch, L, chunk, ends, H, XU, XW, XV, K, V = CASES[i]
    T, dt = IO[io]
    rng = np.random.default_rng(100 + i)
    starts, seq, cum, dte = chunked_problem(rng, dt, batch, L, chunk, ends, H)
    nc = len(starts) - 1
    tiles = -(-int(np.diff(starts).max()) // gssd.tile_rows(io))
    a = lambda *s: rng.standard_normal(s).astype(dt)
    worst = 0.0
    for kind, (roles, upper, mt, dtq) in gssd.MM_KINDS.items():
        U, W, Vv = a(batch, L, XU, K), a(batch, L, XW, K), a(batch, L, XV, V)
        m_chunks = nc + 1 if kind in ("y", "ycore", "dC") else nc
        Mm = a(batch, m_chunks, H, K * V)
        D = a(H, V) if kind == "y" else None
        z = a(batch, L, XV, V) if kind == "y" else None
        ref = np.full((batch, L, H, V), np.nan, np.float64)
        vm = gssd.column_groups(V, io)
        name = gssd.mm_name(kind, io, io, vm)
        null = lambda v: gssd._NULL if v is None else v
        exact_mm.np_chunk_mm(name, [U, W, Vv, Mm, null(D), null(z), dte, cum, null(seq), starts,
                                    ref, L, H, XU, XW, XV, K, V, nc, m_chunks, tiles])
        # y, ycore (U = C, W = B) and GB (U = B, W = C) also from ssd_chunk_cb's blocks
        for with_cb in (False, True) if kind in ("y", "ycore", "GB") else (False,):
            cb, classes = None, 1
            if with_cb:
                Cm, Bm = (W, U) if upper else (U, W)
                GB, GC = Bm.shape[2], Cm.shape[2]
                classes = gssd.head_classes(H, GB, GC)
                pairs = tiles * (tiles + 1) // 2
                R = gssd.tile_rows(io)
                cb = np.full((batch, nc, classes, pairs, R * R), np.nan, dt)
                launch(lib, f"emu_cb_{io}", batch * nc * classes * pairs, [Cm, Bm, starts, cb],
                       [L, GB, GC, K, nc, classes, pairs])
            scal = [L, H, XU, XW, XV, K, V, nc, m_chunks, tiles, classes]
            # the CUDA-core kernel, then (float) the tensor-core one
            runs = [(f"VM {vm}", f"emu_mm_{io}_{kind}_{vm}", batch * H * nc * tiles, 256)]
            if io == "float32":  # both column widths, whatever V is
                runs += [(f"TF32 NT {nt:2d}", f"emu_mm_tc_{kind}_{nt}",
                          batch * H * nc * tiles * -(-V // (8 * nt)), gssd.TC_THREADS)
                         for nt in gssd.TC_NT]
                if kind == "y":  # GATE: the epilogue's loads grouped (used where z is given)
                    runs += [(f"TF32 NT {nt:2d} G", f"emu_mm_tc_{kind}_{nt}_gate",
                              batch * H * nc * tiles * -(-V // (8 * nt)), gssd.TC_THREADS)
                             for nt in gssd.TC_NT]
            for label, sym, grid, threads in runs:
                out = np.full((batch, L, H, V), np.nan, dt)
                args = [U, W, Vv, Mm, D, z, dte, cum, seq, starts, out, cb]
                if "_tc_" in sym:
                    args += [None] * 5
                launch(lib, sym, grid, args, scal, threads=threads)
                err = float(np.nanmax(np.abs(out - ref)) / max(np.abs(ref).max(), 1e-30))
                if np.isnan(out).any():
                    err = float("inf")
                worst = max(worst, err)
                tol = 2e-6 if io == "float32" else 1e-13
                print(f"case {i} {io} {kind:5s} {label:10s}{' cb' if with_cb else '   '}: "
                      f"rel err {err:.2e} {'ok' if err < tol else 'FAIL'}")
                if not err < tol:
                    return False
        if io == "float32" and kind == "GB" and not run_gb_rows(
                lib, i, U, W, Vv, Mm, dte, cum, seq, starts, ref, m_chunks, tiles):
            return False
        if io == "float32" and kind in gssd.HSUM_KINDS and not run_hsum(
                lib, i, kind, U, W, Vv, Mm, dte, cum, seq, starts, ref, m_chunks, tiles):
            return False
    return True


def run_gb_rows(lib, i, U, W, Vv, Mm, dte, cum, seq, starts, ref, m_chunks, tiles):
    """GB with the per-step pass as its epilogue (ssd_chunk_mm_tc's ROWS), with and without
    D, against ssd_bwd_rows's arithmetic on the float64 GB ``ref`` (dY = Vv, per head: the
    case's groups repeated). Where V exceeds a block's columns the host takes the plain GB:
    nothing to check."""
    batch, L, H, V = ref.shape
    if V > 8 * gssd.TC_NT[-1]:
        return True
    rng = np.random.default_rng(200 + i)
    dY = np.ascontiguousarray(np.repeat(Vv, H // Vv.shape[2], axis=2))
    x = rng.standard_normal((batch, L, H, V)).astype(np.float32)
    yc = rng.standard_normal((batch, L, H, V)).astype(np.float32)
    nc = len(starts) - 1
    K, XU, XW = U.shape[3], U.shape[2], W.shape[2]
    e = dte.astype(np.float64)[..., None]
    x64, dY64 = x.astype(np.float64), dY.astype(np.float64)
    xgb_ref = (x64 * ref).sum(axis=-1)
    dcum_ref = (dY64 * yc).sum(axis=-1) - e[..., 0] * xgb_ref
    ok = True
    for nt in gssd.TC_NT:
        if V > 8 * nt:
            continue
        for D in (None, rng.standard_normal((H, V)).astype(np.float32)):
            dx = np.full((batch, L, H, V), np.nan, np.float32)
            xgb = np.full((batch, L, H), np.nan, np.float32)
            dcum = np.full((batch, L, H), np.nan, np.float32)
            part = None if D is None else np.zeros((batch, H, nc * tiles, V), np.float32)
            launch(lib, f"emu_mm_tc_GB_{nt}_rows", batch * H * nc * tiles,
                   [U, W, dY, Mm, D, None, dte, cum, seq, starts, dx, None, x, yc, xgb, dcum,
                    part], [L, H, XU, XW, H, K, V, nc, m_chunks, tiles, 1],
                   threads=gssd.TC_THREADS)
            skip = 0.0 if D is None else D.astype(np.float64)[None, None] * dY64
            tag = f"case {i} float32 GB rows NT {nt:2d} {'D' if D is not None else '-'}"
            ok = check(f"{tag} dx", dx, e * ref + skip, 2e-6) and ok
            ok = check(f"{tag} x.GB", xgb, xgb_ref, 2e-6) and ok
            ok = check(f"{tag} dcum", dcum, dcum_ref, 2e-6) and ok
            if D is not None:
                ok = check(f"{tag} dD", part.astype(np.float64).sum(axis=(0, 2)),
                           (dY64 * x64).sum(axis=(0, 1)), 2e-6) and ok
    return ok


def run_hsum(lib, i, kind, U, W, Vv, Mm, dte, cum, seq, starts, ref, m_chunks, tiles):
    """dB or dC summed over classes of heads (ssd_chunk_hblocks_tc's blocks, then
    ssd_chunk_hsum_tc in runs of heads, the runs' partials added here) against the per-head
    reference summed (dB's heads times dt'). The blocks read dY and x per head: the case's
    grouped U, W repeated over their groups' heads (dC: dY = U, x = W; dB: the other way).
    Classes: one head each (the blocks in one run), and the heads of each Vv group (the
    blocks in one run per head, and in one run of all of them: a block's loop over heads);
    the products at NT 8 in one run per head and at NT 16 in one run."""
    batch, L, H, V = ref.shape
    K, XU, XV = U.shape[3], U.shape[2], Vv.shape[2]
    nc = len(starts) - 1
    per_head = lambda a: np.ascontiguousarray(np.repeat(a, H // a.shape[2], axis=2))
    dY, x = (per_head(U), per_head(W)) if kind == "dC" else (per_head(W), per_head(U))
    row_f = dte if gssd.HSUM_KINDS[kind][2] else np.ones_like(dte)
    pairs = tiles * (tiles + 1) // 2
    ok = True
    for classes, gs_runs in sorted({(H, 1), (XV, H // XV), (XV, 1)}):
        hpk = H // classes
        want = (ref * row_f[..., None]).reshape(batch, L, classes, hpk, V).sum(axis=3)
        gs = np.full((gs_runs, batch, nc, classes, pairs, 64 * 64), np.nan, np.float32)
        launch(lib, "emu_hb", batch * nc * classes * pairs * gs_runs,
               [dY, x, dte, cum, seq, starts, gs],
               [L, H, K, nc, tiles, classes, gs_runs, gs[0].size], threads=gssd.TC_THREADS)
        gs = gs.sum(axis=0, dtype=np.float32)  # the runs, in order (as ssd_sum_parts)
        # NT 8 in one run per head; NT 16 in one run (where a class has several heads)
        for nt, runs in ((gssd.TC_NT[0], hpk), (gssd.TC_NT[1], 1 if hpk > 1 else hpk)):
            v_blocks = -(-V // (8 * nt))
            part = np.full((runs, batch, L, classes, V), np.nan, np.float32)
            launch(lib, f"emu_hs_{kind}_{nt}", batch * nc * tiles * classes * runs * v_blocks,
                   [U, Vv, Mm, gs, dte, cum, seq, starts, part],
                   [L, H, XU, XV, K, V, nc, m_chunks, tiles, classes, runs,
                    batch * L * classes * V], threads=gssd.TC_THREADS)
            ok = check(f"case {i} float32 {kind:5s} summed, {classes} classes, "
                       f"{gs_runs} + {runs} runs, NT {nt:2d}",
                       part.astype(np.float64).sum(axis=0), want, 2e-6) and ok
    return ok


# ssd_bwd_rows: (io, rows = batch * L, H, P, with D)
ROW_CASES = [("float32", 1, 1, 1, True), ("float32", 130, 3, 64, True),
             ("float32", 64, 2, 200, False), ("float64", 77, 2, 33, True)]


def run_rows(lib, i):
    io, steps, H, P, with_d = ROW_CASES[i]
    T, dt = IO[io]
    rng = np.random.default_rng(200 + i)
    a = lambda *s: rng.standard_normal(s).astype(dt)
    x, GB, dY, ycore, dte = a(steps, H, P), a(steps, H, P), a(steps, H, P), a(steps, H, P), a(steps, H)
    D = a(H, P) if with_d else None
    blocks = -(-steps // gssd.ROW_STEPS)
    dx = np.full((steps, H, P), np.nan, dt)
    xGB, dcum = np.full((steps, H), np.nan, dt), np.full((steps, H), np.nan, dt)
    part = np.full((blocks, H, P), np.nan, dt) if with_d else None
    launch(lib, f"emu_rows_{io}", blocks, [x, GB, dY, ycore, dte, D, dx, xGB, dcum, part],
           [steps, H, P, gssd.ROW_STEPS], grid_y=H, threads=gssd.ROW_THREADS)
    f = lambda v: v.astype(np.float64)
    r_xgb = (f(x) * f(GB)).sum(-1)
    refs = dict(dx=f(dte)[..., None] * f(GB) + (f(D)[None] * f(dY) if with_d else 0),
                xGB=r_xgb, dcum=(f(dY) * f(ycore)).sum(-1) - f(dte) * r_xgb)
    outs = dict(dx=dx, xGB=xGB, dcum=dcum)
    if with_d:
        refs["dD"], outs["dD"] = (f(dY) * f(x)).sum(0), part.sum(0)
    # dcum cancels: relative to the size of its terms
    scale = dict(dcum=(np.abs(f(dY) * f(ycore)).sum(-1) + np.abs(f(dte) * r_xgb)).max())
    ok = True
    for k, r in refs.items():
        err = float(np.abs(outs[k] - r).max() / max(np.abs(r).max(), scale.get(k, 0), 1e-30))
        if np.isnan(outs[k]).any():
            err = float("inf")
        tol = 2e-6 if io == "float32" else 1e-13
        print(f"rows {i} {io} {k:5s}: rel err {err:.2e} {'ok' if err < tol else 'FAIL'}")
        ok = ok and err < tol
    return ok


# ssd_bwd_gate: (io, rows = batch * L, H * P, with D, grid): grids smaller than the arrays,
# so that blocks walk several rows and columns
GATE_CASES = [("float32", 1, 1, True, (1, 1)), ("float32", 37, 600, True, (5, 2)),
              ("float32", 9, 64, False, (9, 1)), ("float64", 20, 300, True, (3, 1))]


def run_gate(lib, i):
    io, rows, hp, with_d, (gx, gy) = GATE_CASES[i]
    T, dt = IO[io]
    rng = np.random.default_rng(250 + i)
    a = lambda *s: (2 * rng.standard_normal(s)).astype(dt)
    dy, z, x, ycore = a(rows, hp), a(rows, hp), a(rows, hp), a(rows, hp)
    D = a(hp) if with_d else None
    dz, dY = np.full((rows, hp), np.nan, dt), np.full((rows, hp), np.nan, dt)
    launch(lib, f"emu_gate_{io}", gx, [dy, z, x, ycore, D, dz, dY], [rows, hp], grid_y=gy)
    f = lambda v: v.astype(np.float64)
    sg = 1 / (1 + np.exp(-f(z)))
    y_pre = f(ycore) + (f(D)[None] * f(x) if with_d else 0)
    tol = 2e-6 if io == "float32" else 1e-13
    ok = check(f"gate {i} {io} dz", dz, f(dy) * y_pre * sg * (1 + f(z) * (1 - sg)), tol)
    return check(f"gate {i} {io} dY", dY, f(dy) * f(z) * sg, tol) and ok


# ssd_chunk_state: (io, batch, L, chunk, seq ends or None, H, GY, P, N)
STATE_CASES = [("float32", 1, 1, 64, None, 1, 1, 1, 1),
               ("float32", 2, 150, 64, [40, 41, 100], 2, 1, 64, 128),
               ("float32", 1, 90, 90, None, 2, 2, 70, 140),
               ("float64", 1, 50, 20, [7], 2, 1, 33, 65)]


def run_state(lib, i):
    io, batch, L, chunk, ends, H, GY, P, N = STATE_CASES[i]
    T, dt = IO[io]
    rng = np.random.default_rng(300 + i)
    starts, seq, cum, dte = chunked_problem(rng, dt, batch, L, chunk, ends, H)
    nc = len(starts) - 1
    a = lambda *s: rng.standard_normal(s).astype(dt)
    X, Y = a(batch, L, H, P), a(batch, L, GY, N)
    R = gssd.tile_rows(io)
    g = np.arange(H) // (H // GY)

    def reference(adj):
        ref = np.zeros((batch, nc, H, P, N))
        for b in range(batch):
            for c in range(nc):
                t0, t1 = int(starts[c]), int(starts[c + 1])
                E = t1 - 1
                for t in range(t0, t1):
                    if adj == "true":
                        sref = 0 if seq is None else seq[b, max(t0 - 1, 0)]
                        w = np.exp(cum[b, t].astype(np.float64))
                    else:
                        sref = 0 if seq is None else seq[b, E]
                        w = np.exp(cum[b, E].astype(np.float64) - cum[b, t]) * dte[b, t]
                    if seq is not None and seq[b, t] != sref:
                        continue
                    ref[b, c] += (w[:, None, None] * X[b, t].astype(np.float64)[:, :, None]
                                  * Y[b, t][g].astype(np.float64)[:, None, :])
        return ref

    refs = {adj: reference(adj) for adj in ("false", "true")}
    ok = True
    # the CUDA-core kernel (a block per R x 2R tile), then (float) the tensor-core one (R x 8 NT)
    runs = [(adj, "", f"emu_state_{io}_{adj}", 2 * R, 256) for adj in ("false", "true")]
    if io == "float32":
        runs += [(adj, f" TF32 NT {nt}", f"emu_state_tc_{adj}_{nt}", 8 * nt, gssd.TC_THREADS)
                 for adj in ("false", "true") for nt in gssd.TC_NT]
    for adj, label, sym, cols, threads in runs:
        out = np.full((batch, nc, H, P, N), np.nan, dt)
        grid = batch * nc  # (batch * nc, H, tiles): the wrapper takes gx, gy; z folded below
        tiles = -(-P // R) * -(-N // cols)
        bufs = [X, Y, dte, cum, seq, starts, out]
        s = (ctypes.c_longlong * 6)(L, H, P, GY, N, nc)
        eb = (EmuBuf * len(bufs))(*[EmuBuf(None, 0) if v is None else
                                    EmuBuf(v.ctypes.data, v.nbytes) for v in bufs])
        getattr(lib, sym)(eb, s, grid, H, tiles, threads)
        ref = refs[adj]
        err = float(np.abs(out - ref).max() / max(np.abs(ref).max(), 1e-30))
        if np.isnan(out).any():
            err = float("inf")
        tol = 2e-6 if io == "float32" else 1e-13
        print(f"state {i} {io}{label} adjoint={adj}: rel err {err:.2e} "
              f"{'ok' if err < tol else 'FAIL'}")
        ok = ok and err < tol
    return ok


# ssd_chunk_dt: (io, batch, L, H, chunk, sequence ends, softplus, bias, dt_limit)
CHUNK_DT_CASES = [
    ("float32", 2, 37, 3, 8, None, True, True, (0.0, math.inf)),
    ("float32", 1, 1, 2, 256, None, True, False, (0.0, math.inf)),
    ("float32", 3, 300, 5, 64, [5, 5, 100, 299], True, True, (0.05, 0.4)),
    ("float32", 2, 9, 4, 1, None, False, True, (0.0, math.inf)),
    ("float32", 1, 530, 7, 530, [3, 260], False, False, (0.1, math.inf)),
    ("float32", 2, 70, 40, 64, None, True, True, (0.0, math.inf)),  # two blocks of heads
    ("float64", 1, 100, 33, 37, [50], True, True, (0.0, 0.9)),
]


def run_chunk_dt(lib, i):
    """ssd_chunk_dt (block per chunk and 32 heads, runs of steps per warp) against NumPy:
    ssmkit._ssd.effective_dt and float64 chunk sums of dt' A."""
    io, batch, L, H, Q, ends, softplus, bias, lim = CHUNK_DT_CASES[i]
    T, dt_type = IO[io]
    rng = np.random.default_rng(400 + i)
    st = gssd.chunk_starts(L, Q, ends)
    nc = len(st) - 1
    dt = (rng.standard_normal((batch, L, H)) * 3 + (0 if softplus else 1)).astype(dt_type)
    dt[0, 0, 0] = 25.0  # past softplus's cut
    b = rng.standard_normal(H).astype(dt_type) if bias else None
    A = -rng.uniform(0.5, 2, H).astype(dt_type)
    clip = lim != (0.0, math.inf)
    p = types.SimpleNamespace(xp=np, dt=dt, dt_bias=b, dt_softplus=softplus, dt_lo=lim[0],
                              dt_hi=lim[1], dt_clip=clip, compute_dtype=dt_type)
    v_ref, f_ref = effective_dt(p)
    cum_ref = np.empty(v_ref.shape)
    for c in range(nc):
        cum_ref[:, st[c]:st[c + 1]] = np.cumsum((v_ref.astype(np.float64) * A)[:, st[c]:st[c + 1]], 1)
    dte, fac, cum = (np.full_like(dt, np.nan) for _ in range(3))
    bufs = [dt, b, A, st, dte, fac, cum]
    eb = (EmuBuf * 7)(*[EmuBuf(None, 0) if v is None else EmuBuf(v.ctypes.data, v.nbytes)
                        for v in bufs])
    s = (ctypes.c_longlong * 5)(L, H, nc, int(softplus), int(clip))
    f = (ctypes.c_double * 2)(lim[0], lim[1] if clip else 0.0)
    getattr(lib, f"emu_chunk_dt_{T}")(eb, s, f, batch * nc, -(-H // 32))
    tol = 2e-6 if io == "float32" else 1e-13
    return all([check(f"chunk_dt {i} {io} {name:6s}", out, ref, tol) for name, out, ref in
                (("dt'", dte, v_ref), ("factor", fac, f_ref), ("cum", cum, cum_ref))])


# ssd_chunk_cumsum and ssd_bwd_dt: (io, batch, L, H, chunk, sequence ends)
RUN_CASES = [("float32", 2, 37, 3, 8, None), ("float32", 1, 1, 2, 256, None),
             ("float32", 1, 17, 1, 17, None), ("float32", 3, 300, 5, 64, [5, 5, 100, 299]),
             ("float32", 2, 9, 4, 1, None), ("float32", 1, 530, 7, 530, [3, 260]),
             ("float32", 2, 70, 40, 64, None), ("float64", 1, 100, 33, 37, [50])]


def run_runs(lib, i):
    """ssd_chunk_cumsum (both directions) and ssd_bwd_dt against float64 NumPy."""
    io, batch, L, H, Q, ends = RUN_CASES[i]
    T, dt_type = IO[io]
    rng = np.random.default_rng(500 + i)
    st = gssd.chunk_starts(L, Q, ends)
    nc = len(st) - 1
    grid = (batch * nc, -(-H // 32))
    tol = 2e-6 if io == "float32" else 1e-13
    f = lambda v: v.astype(np.float64)
    sums = lambda v, rev: np.concatenate([  # chunk prefix (suffix) sums, float64
        (np.cumsum(f(v)[:, st[c]:st[c + 1]][:, ::-1], 1)[:, ::-1] if rev
         else np.cumsum(f(v)[:, st[c]:st[c + 1]], 1)) for c in range(nc)], axis=1)
    outs, refs = {}, {}
    a = rng.standard_normal((batch, L, H)).astype(dt_type)
    for rev in (0, 1):
        out = np.full_like(a, np.nan)
        launch(lib, f"emu_cumsum_{io}", grid[0], [a, out, st], [L, H, nc, rev], grid_y=grid[1],
               threads=gssd.CHUNK_THREADS)
        outs[f"cumsum rev {rev}"], refs[f"cumsum rev {rev}"] = out, sums(a, rev)
    dcum, xGB, dte, fac, bnd = (rng.standard_normal((batch, L, H)).astype(dt_type)
                                for _ in range(5))
    A = -rng.uniform(0.5, 2, H).astype(dt_type)
    ddt = np.full_like(dcum, np.nan)
    part = np.full((batch, nc, 2, H), np.nan, dt_type)
    # each chunk's boundary term at its last step: the sum of its end_part (fewer and more
    # parts than the block's 32 runs), decayed where cum is given (even cases, with bnd and
    # seq_idx labels from the sequence ends)
    parts = (5, 70)[i % 2]
    end_part = rng.standard_normal((batch, nc, H, parts)).astype(dt_type)
    decayed = i % 2 == 0
    cum = -rng.uniform(0, 3, (batch, L, H)).astype(dt_type) if decayed else None
    seq = (np.searchsorted(np.asarray(ends), np.arange(L), side="right")[None].repeat(batch, 0)
           .astype(np.int32) if decayed and ends else None)
    launch(lib, f"emu_bwd_dt_{io}", grid[0],
           [dcum, xGB, A, dte, fac, st, ddt, part, cum, seq, end_part,
            bnd if decayed else None], [L, H, nc, parts], grid_y=grid[1],
           threads=gssd.CHUNK_THREADS)
    dcum_e = f(dcum)
    for c in range(nc):
        t0, E = st[c], st[c + 1] - 1
        e = f(end_part[:, c]).sum(-1)
        if decayed:
            same = (np.ones(batch, bool) if seq is None
                    else seq[:, E] == seq[:, max(t0 - 1, 0)])
            e = e * np.exp(f(cum[:, E])) * same[:, None] + f(bnd[:, t0:E + 1]).sum(1)
        dcum_e[:, E] += e
    sd = sums(dcum_e, 1)
    ddt_ref = (f(xGB) + f(A) * sd) * f(fac)
    outs.update(ddt=ddt, part_dA=part[:, :, 0], part_dbias=part[:, :, 1])
    refs.update(ddt=ddt_ref,
                part_dA=np.stack([(f(dte) * sd)[:, st[c]:st[c + 1]].sum(1) for c in range(nc)], 1),
                part_dbias=np.stack([ddt_ref[:, st[c]:st[c + 1]].sum(1) for c in range(nc)], 1))
    return all([check(f"runs {i} {io} {name:12s}", out, refs[name], tol)
                for name, out in outs.items()])


# ssd_adjoint_passing: (batch, L, H, P*N, chunk, sequence starts or None, final states at
# every sequence end, dot_shift, the 16-bit copy (bfloat16) instead of the float32 dHx)
ADJOINT_CASES = [(2, 37, 3, 40, 4, None, False, 1, False),
                 (1, 601, 2, 300, 2, [77, 300], True, 0, True),  # 301 chunks, 2 blocks
                 (1, 20, 1, 256, 3, [6, 9], True, 1, False),
                 (3, 9, 2, 7, 1, None, True, 0, False)]


def run_adjoint(lib, i):
    """ssd_adjoint_passing (the adjoint walk: decays staged 256 chunks at a time, loads 4
    chunks ahead) against float64 NumPy: dHx (or its bfloat16 copy), dinit, the dot partials
    summed."""
    import ml_dtypes
    batch, L, H, PN, Q, ends, finals, shift, rounded = ADJOINT_CASES[i]
    rng = np.random.default_rng(700 + i)
    starts, seq, cum, _ = chunked_problem(rng, np.float32, batch, L, Q, ends, H)
    nc = len(starts) - 1
    K = rng.standard_normal((batch, nc, H, PN)).astype(np.float32)
    states = rng.standard_normal((batch, nc + 1, H, PN)).astype(np.float32)
    bslot, dfinal = None, None
    if finals:  # a final state at every boundary where a sequence ends, and at L
        bslot = np.full((batch, nc + 1), -1, np.int32)
        k = 0
        for b in range(batch):
            for j in range(1, nc + 1):
                if starts[j] == L or (ends and starts[j] in ends):
                    bslot[b, j], k = k, k + 1
        dfinal = rng.standard_normal((k, H, PN)).astype(np.float32)
    blocks = -(-PN // 256)
    dHx = None if rounded else np.full((batch, nc, H, PN), np.nan, np.float32)
    dHx16 = np.zeros((batch, nc, H, PN), ml_dtypes.bfloat16) if rounded else None
    dinit = np.full((batch, H, PN), np.nan, np.float32)
    part = np.full((batch, nc, H, blocks * 8), np.nan, np.float32)
    bufs = [K, cum, seq, starts, bslot, dfinal, dHx, dinit, dHx16, states, part]
    eb = (EmuBuf * 11)(*[EmuBuf(None, 0) if v is None else EmuBuf(v.ctypes.data, v.nbytes)
                         for v in bufs])
    sc = (ctypes.c_longlong * 6)(L, H, PN, nc, 1, shift)
    lib.emu_adjoint_passing(eb, sc, batch * H, blocks)
    # float64 reference
    f = lambda v: v.astype(np.float64)
    g = np.zeros((batch, H, PN))
    ref_dHx, ref_dot = np.zeros((batch, nc, H, PN)), np.zeros((batch, nc, H))
    for c in range(nc - 1, -1, -1):
        for b in range(batch):
            if finals and bslot[b, c + 1] >= 0:
                g[b] += f(dfinal[bslot[b, c + 1]])
        ref_dHx[:, c] = g
        ref_dot[:, c] = (g * f(states[:, c + shift])).sum(-1)
        t0, E = starts[c], starts[c + 1] - 1
        for b in range(batch):
            same = seq is None or seq[b, E] == seq[b, max(t0 - 1, 0)]
            g[b] = (np.exp(f(cum[b, E]))[:, None] if same else 0) * g[b] + f(K[b, c])
    for b in range(batch):
        if finals and bslot[b, 0] >= 0:
            g[b] += f(dfinal[bslot[b, 0]])
    out_dHx = f(dHx16) if rounded else dHx
    return all([check(f"adjoint {i} dHx{'16' if rounded else ''}", out_dHx, ref_dHx,
                      8e-3 if rounded else 2e-6),
                check(f"adjoint {i} dinit", dinit, g, 2e-6),
                check(f"adjoint {i} dot", part.sum(-1, dtype=np.float64), ref_dot, 2e-6)])


# ssd_diag_cb: (io, rows, H, GB, GC, N)
DIAG_CASES = [("bfloat16", 5, 4, 1, 1, 128), ("float32", 37, 6, 2, 3, 40),
              ("float32", 3, 8, 2, 1, 7), ("bfloat16", 70, 80, 1, 1, 128),
              ("float64", 9, 4, 4, 2, 66)]


def run_diag_cb(lib, i):
    """ssd_diag_cb (a warp per step, once per class of heads) against float64 NumPy."""
    import ml_dtypes
    io, rows, H, GB, GC, N = DIAG_CASES[i]
    rng = np.random.default_rng(600 + i)
    tb = {"bfloat16": ml_dtypes.bfloat16, "float32": np.float32, "float64": np.float64}[io]
    ct = np.float64 if io == "float64" else np.float32
    B = rng.standard_normal((rows, GB, N)).astype(tb)
    C = rng.standard_normal((rows, GC, N)).astype(tb)
    out = np.full((rows, H), np.nan, ct)
    bufs = [B, C, out]
    eb = (EmuBuf * 3)(*[EmuBuf(v.ctypes.data, v.nbytes) for v in bufs])
    s = (ctypes.c_longlong * 6)(rows, H, GB, GC, N, gssd.head_classes(H, GB, GC))
    getattr(lib, f"emu_diag_cb_{io}")(eb, s, -(-rows // 8))
    h = np.arange(H)
    ref = (B.astype(np.float64)[:, h // (H // GB)] * C.astype(np.float64)[:, h // (H // GC)]).sum(-1)
    return check(f"diag_cb {i} {io}", out, ref, 1e-13 if io == "float64" else 2e-6)


def main(argv):
    # "--cases I,J,..": those product cases and every other check (CI's subset)
    subset = argv[:1] == ["--cases"]
    if subset:
        which = [int(v) for v in argv[1].split(",")]
    else:
        which = [int(v) for v in argv] or range(len(CASES))
    lib = ctypes.CDLL(build_so())
    ok = all([run_case(lib, i) for i in which])
    if not argv or subset:
        ok = all([run_rows(lib, i) for i in range(len(ROW_CASES))]) and ok
        ok = all([run_gate(lib, i) for i in range(len(GATE_CASES))]) and ok
        ok = all([run_state(lib, i) for i in range(len(STATE_CASES))]) and ok
        ok = all([run_chunk_dt(lib, i) for i in range(len(CHUNK_DT_CASES))]) and ok
        ok = all([run_runs(lib, i) for i in range(len(RUN_CASES))]) and ok
        ok = all([run_diag_cb(lib, i) for i in range(len(DIAG_CASES))]) and ok
        ok = all([run_adjoint(lib, i) for i in range(len(ADJOINT_CASES))]) and ok
    print("ALL OK" if ok else "SOME FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
