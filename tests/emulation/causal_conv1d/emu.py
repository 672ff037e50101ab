r"""Host emulation of cuda_src/causal_conv1d.cu (fwd/bwd) checked against ssmkit.reference.

Builds every fwd/bwd instance for the chosen dtypes and widths (EMU_W, default 1..8) into one
.so under $TMPDIR/ssmkit_emu/causal_conv1d, then runs lengths around the warp and tile edges
(with and without bias, SiLU, seq_idx, initial state) and compares y, the final state and the
gradients with reference.causal_conv1d_vjp. The weight gradients come from the emulated
cc1d_wsum, checked bit for bit against the same fixed-order sum in NumPy. Every other case
launches 3 blocks that walk all the items (float32 and 16-bit: the read-ahead hand-over),
the others one block per item.

    LD_PRELOAD=$(g++ -print-file-name=libasan.so) ASAN_OPTIONS=detect_leaks=0 \
        EMU_W=4 python3 tests/emulation/causal_conv1d/emu.py float32 [values_per_thread]

Prints the worst error per (dtype, output) and "fails N" last (0 is a pass). EMU_MUT=1..15 plants
a known bug to see the check fail (1: chunk edge after, 2: tile halo lost, 3: the backward's
steps after the tile, 4: the read-ahead fetches the wrong item; for `emu.py mma`, the
tensor-core kernels: 5: the row after a chunk, 6: the row before a chunk, 7: the taps'
residuals, 8: the forward skips a span's last chunk, 9: chunks past L read without
checks; for `emu.py warp`, cc1d_bwd_warp: 10: lane 0's hand-over of g, 11: lane 31's
read-ahead x, 12: g after the span, 13: a span's first chunk skipped; cc1d_fwd_warp: 14:
lane 31's x handed to the next chunk, 15: x before the span).

    python3 tests/emulation/causal_conv1d/emu.py mma [bfloat16,float16]   # cc1d_*_mma
    python3 tests/emulation/causal_conv1d/emu.py warp [bfloat16,float16,float32]   # cc1d_*_warp
"""
import ctypes, os, sys, itertools
import numpy as np
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, REPO); sys.path.insert(0, os.path.join(REPO, "tests"))
from ssmkit._gpu import compiler, causal_conv1d as cc
from ssmkit import reference
sys.path.insert(0, os.path.dirname(HERE))
from emu_build import COMMON_REPL, LDSM_REPL, compile_so, replace_all, replace_mma  # noqa: E402
REPL = COMMON_REPL + LDSM_REPL + [
    ('extern __shared__ cc1d_words cc1d_dyn[];', 'cc1d_words* const cc1d_dyn = reinterpret_cast<cc1d_words*>(emu_smem_ptr);'),
    ('asm("rcp.approx.ftz.f64 %0, %1;" : "=d"(r) : "d"(d));', 'r = emu_rcp64(d);'),
    ('for (int i = 0; i < 4; ++i) asm("mov.b32 %0, %1;" : "=r"(w[i]) : "f"(r[i]));', 'for (int i = 0; i < 4; ++i) memcpy(&w[i], &r[i], 4);'),
    ('asm("mov.b64 {%0, %1}, %2;" : "=r"(w[2 * i]), "=r"(w[2 * i + 1]) : "d"(r[i]));', 'memcpy(&w[2 * i], &r[i], 8);'),
    ('asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(w[i]) : "f"(r[2 * i + 1]), "f"(r[2 * i]));', 'w[i] = emu_pack2(emu_f2h(r[2 * i]), emu_f2h(r[2 * i + 1]));'),
    ('asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(w[i]) : "f"(r[2 * i + 1]), "f"(r[2 * i]));', 'w[i] = emu_pack2(emu_f2bf(r[2 * i]), emu_f2bf(r[2 * i + 1]));'),
    ('''asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};"
                     :: "l"(row + t), "r"(w[0]), "r"(w[1]), "r"(w[2]), "r"(w[3]) : "memory");''',
     'if (((unsigned long)(row + t)) % 16) emu_fail("misaligned store"); memcpy((void*)(row + t), w, 16);'),
    # cc1d_bwd_mma
    ('return *reinterpret_cast<const unsigned*>(p);\n}\ntemplate <typename T>\n__device__ __forceinline__ unsigned cc1d_word(',
     'return *emu_al<const unsigned>(p);\n}\ntemplate <typename T>\n__device__ __forceinline__ unsigned cc1d_word('),
    ('*reinterpret_cast<unsigned*>(dp', '*emu_al<unsigned>(dp'),
    ('*reinterpret_cast<unsigned*>(yr + ', '*emu_al<unsigned>(yr + '),
    ('asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(w) : "f"(hi), "f"(lo));', 'w = emu_pack2(emu_f2bf(lo), emu_f2bf(hi));'),
    ('asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(w) : "f"(hi), "f"(lo));', 'w = emu_pack2(emu_f2h(lo), emu_f2h(hi));'),
    ('asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(d) : "r"(a));', 'd = emu_movmatrix_trans(a);'),
    # cc1d_bwd_mma's ring of chunks in shared memory (dst: a byte offset into it)
    ('asm volatile("ld.shared.u32 %0, [%1];" : "=r"(r) : "r"(a) : "memory");',
     'memcpy(&r, emu_smem_at(a), 4);'),
    # cc1d_bwd_warp's 16-byte vectors
    ('for (int v = 0; v < NV; ++v) u[v] = reinterpret_cast<const cc1d_words*>(p)[v];',
     'for (int v = 0; v < NV; ++v) u[v] = *emu_al<const cc1d_words>(p + v * E);'),
    ('''asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};"
                         :: "l"(p + v * E), "r"(w[0]), "r"(w[1]), "r"(w[2]), "r"(w[3]) : "memory");''',
     'memcpy((void*)emu_al<cc1d_words>(p + v * E), w, 16);'),
]

LAUNCH = r'''
template <typename F>
static void emu_launch(F call, unsigned grid, unsigned block) {
    for (unsigned bi = 0; bi < grid; ++bi) {
        blockIdx.x = bi; blockDim.x = block; gridDim.x = grid;
        std::vector<EmuMmaX> mx((block + 31) / 32);
        emu_mmax = mx.data();
        emu_run_block(call, block);
    }
}
'''
CXX = {"float32": "float", "float64": "double", "bfloat16": "ssm_bf16", "float16": "ssm_half"}

def wrapper(key, i):
    io = CXX[key.io]; ct = "double" if key.io == "float64" else "float"
    name = cc.name_expression(key)
    if key.kind == "wsum":
        return f'''extern "C" void k{i}(void** p, long long* s, unsigned grid) {{
    emu_launch([=] {{ {name}((const {ct}*)p[0], ({ct}*)p[1], ({ct}*)p[2], (int)s[0], (int)s[1], (int)s[2], (int)s[3]); }}, grid, CC1D_THREADS);
}}
'''
    if key.kind in ("fwd_mma", "fwd_warp", "bwd_mma", "bwd_warp"):  # a warp per span
        st = "int" if key.kind.endswith("_mma") else "ssm_i64"  # the type of L and the span
        tail = f"(int)s[0], ({st})s[1], ({st})s[2], (int)s[3], (int)s[4]"
        if key.kind.startswith("fwd"):
            head = f"(const {io}*)p[0], (const float*)p[1], (const float*)p[2], ({io}*)p[3], ({io}*)p[4]"
        else:
            head = (f"(const {io}*)p[0], (const float*)p[1], (const float*)p[2], (const {io}*)p[3], "
                    f"(const float*)p[4], ({io}*)p[5], (float*)p[6]")
        return f'''extern "C" void k{i}(void** p, long long* s, unsigned grid) {{
    emu_launch([=] {{ {name}({head}, {tail}); }}, grid, CC1D_THREADS);
}}
'''
    if key.kind == "fwd":
        return f'''extern "C" void k{i}(void** p, long long* s, unsigned grid) {{
    emu_launch([=] {{ {name}((const {io}*)p[0], (const {ct}*)p[1], (const {ct}*)p[2], (const {ct}*)p[3], (const int*)p[4], ({io}*)p[5], ({io}*)p[6], (int)s[0], (ssm_i64)s[1], (int)s[2], (int)s[3], (int)s[4]); }}, grid, CC1D_THREADS);
}}
'''
    return f'''extern "C" void k{i}(void** p, long long* s, unsigned grid) {{
    emu_launch([=] {{ {name}((const {io}*)p[0], (const {ct}*)p[1], (const {ct}*)p[2], (const {ct}*)p[3], (const int*)p[4], (const {io}*)p[5], (const {ct}*)p[6], ({io}*)p[7], ({ct}*)p[8], ({ct}*)p[9], (int)s[0], (ssm_i64)s[1], (int)s[2], (int)s[3], (int)s[4]); }}, grid, CC1D_THREADS);
}}
'''

_libs = {}
MUT = []
if os.environ.get('EMU_MUT') == '1':
    MUT = [('edge[j + (lane + delta < 32 ? 0 : lane + 1 - 32) * E]', 'edge[j]')]
if os.environ.get('EMU_MUT') == '2':  # the halo before each tile lost
    MUT = [('xprev[tid] = in.halo;', 'xprev[tid] = 0;')]
if os.environ.get('EMU_MUT') == '3':  # the backward's steps after the tile read wrongly
    MUT = [('xnext[q < 0 ? 0 : q]', 'xnext[0]')]
if os.environ.get('EMU_MUT') == '4':  # the prefetched item handed over wrongly
    MUT = [('if (item + gridDim.x < n_items) fetch(item + gridDim.x, nxt);', 'if (item + gridDim.x < n_items) fetch(item, nxt);')]
if os.environ.get('EMU_MUT') == '5':  # cc1d_bwd_mma: the row after the chunk lost
    MUT = [('__shfl_sync(FULL, g == 0 ? nh : gh[1], above)', '__shfl_sync(FULL, g == 0 ? 0u : gh[1], above)')]
if os.environ.get('EMU_MUT') == '6':  # cc1d_bwd_mma: the row before the chunk lost
    MUT = [('g == 7 ? xb : x0', 'g == 7 ? 0u : x0')]
if os.environ.get('EMU_MUT') == '7':  # cc1d_bwd_mma: the taps' residuals dropped
    MUT = [('MMA::run(z, ax, bz[1][0], bz[1][1]);', '')]
if os.environ.get('EMU_MUT') == '9':  # the tensor-core kernels: chunks past L read unchecked
    MUT = [('if (c0 >= 8 && c0 + CC1D_MMA_CHUNK <= L && !row0) {', 'if (c0 >= 8 && !row0) {'),
           ('if (c0 >= 8 && c0 + CHUNK <= L) {', 'if (c0 >= 8) {')]
if os.environ.get('EMU_MUT') == '8':  # cc1d_fwd_mma: the last chunk of a span skipped
    MUT = [('for (int c = 0; c < at.nc; ++c) {', 'for (int c = 0; c + 1 < at.nc; ++c) {')]
if os.environ.get('EMU_MUT') == '10':  # cc1d_bwd_warp: lane 0's hand-over of g to lane 31 lost
    MUT = [('lane == 0 ? gkeep[j] : g[j]', 'lane == 0 ? 0.0f : g[j]')]
if os.environ.get('EMU_MUT') == '11':  # cc1d_bwd_warp: lane 31's read-ahead x not handed over
    MUT = [('lane == 31 ? xn[8 - H + j] : xv[8 - H + j]', 'xv[8 - H + j]')]
if os.environ.get('EMU_MUT') == '12':  # cc1d_bwd_warp: g after the span not computed
    MUT = [('if (H > 0 && s1 < L) {', 'if (false) {')]
if os.environ.get('EMU_MUT') == '13':  # cc1d_bwd_warp: a span's first chunk skipped
    MUT = [('const bool more = c0 > s0;', 'const bool more = c0 > s0 + CH;')]
if os.environ.get('EMU_MUT') == '14':  # cc1d_fwd_warp: lane 31's x not handed to the next chunk
    MUT = [('lane == 31 ? xkeep[j] : xv[8 - H + j]', 'xv[8 - H + j]')]
if os.environ.get('EMU_MUT') == '15':  # cc1d_fwd_warp: the x before the span not read
    MUT = [('if (H > 0 && s0 > 0) {', 'if (false) {')]
def build(keys, defines=(), asan=True):
    src = compiler.kernel_source(cc.SOURCE_FILE)
    for a, b in MUT:
        assert a in src, "EMU_MUT: text not in the source: " + a
        src = src.replace(a, b)
    src = replace_all(src, REPL)
    src = replace_mma(src)  # ssm_common.cuh's mma.sync blocks: the emulated product
    text = "".join(f"#define {d}\n" for d in defines) + '#include "prelude.h"\n' + src + LAUNCH + "".join(wrapper(k, i) for i, k in enumerate(keys))
    so = compile_so("causal_conv1d", text, asan=asan, opt="-O1", include_dir=HERE)
    lib = ctypes.CDLL(so)
    return {k: getattr(lib, f"k{i}") for i, k in enumerate(keys)}

def to_io(a, io):
    if io == "bfloat16":
        import ml_dtypes
        return np.ascontiguousarray(a.astype(ml_dtypes.bfloat16))
    return np.ascontiguousarray(a.astype(io))

def ptr(a): return None if a is None else a.ctypes.data_as(ctypes.c_void_p)

def run(fn, arrays, scalars, grid):
    P = (ctypes.c_void_p * len(arrays))(*[ptr(a) for a in arrays])
    S = (ctypes.c_longlong * len(scalars))(*scalars)
    fn(P, S, ctypes.c_uint(grid))

def rel(x, ref):
    x = np.asarray(x, np.float64); d = np.linalg.norm(ref)
    assert np.all(np.isfinite(x))
    return np.linalg.norm(x - ref) / (d if d > 0 else 1.0)

def case(fns, io, W, batch, dim, L, bias, silu, seq_cuts, init, rng, vpt, misalign=False, grid=None):
    """One problem; ``grid`` blocks walk the items (None: one block per item)."""
    E = 16 // np.dtype("float32" if io == "float32" else ("float64" if io == "float64" else "float16")).itemsize
    tile = 128 * vpt * E
    n_tiles = -(-L // tile)
    H = W - 1
    ct = np.float64 if io == "float64" else np.float32
    x = to_io(rng.standard_normal((batch, dim, L)), io)
    xe = x.astype(np.float64)
    w = (rng.standard_normal((dim, W)) / np.sqrt(W)).astype(ct)
    b = rng.standard_normal(dim).astype(ct) if bias else None
    h0 = rng.standard_normal((batch, dim, H)).astype(ct) if init else None
    seq = None
    if seq_cuts is not None:
        seq = np.zeros((batch, L), np.int32)
        for c in seq_cuts:
            if c < L: seq[:, c:] += 1
    key_f = cc.KernelKey("fwd", io, W, bias, silu, seq is not None)
    key_b = cc.KernelKey("bwd", io, W, bias, silu, seq is not None)
    vec_ok = int(L % E == 0 and not misalign)
    y = np.zeros_like(x); fin = np.zeros((batch, dim, H), x.dtype)
    n_items = batch * dim * n_tiles
    grid = n_items if grid is None else min(grid, n_items)
    run(fns[key_f], [x, w, b, h0, seq, y, fin if H else None], [dim, L, n_tiles, n_items, vec_ok], grid)
    act = "silu" if silu else None
    kw = dict(activation=act, initial_state=None if h0 is None else h0.astype(np.float64),
              seq_idx=None if seq is None else seq.astype(np.int64), return_final_state=True)
    (yr, fr), pb = reference.causal_conv1d_vjp(xe, w.astype(np.float64), None if b is None else b.astype(np.float64), **kw)
    errs = {"y": rel(y.astype(np.float64), yr)}
    if H: errs["final"] = rel(fin.astype(np.float64), fr)
    dy = to_io(rng.standard_normal(yr.shape), io)
    dfin = rng.standard_normal(fr.shape).astype(ct)
    dx = np.zeros_like(x)
    dh0 = np.zeros((batch, dim, H), ct) if init else None
    part = np.full((batch, dim, n_tiles, W + 1), np.nan, ct)
    run(fns[key_b], [x, w, b, h0, seq, dy, dfin if H else None, dx, dh0 if H else None, part], [dim, L, n_tiles, n_items, vec_ok], grid)
    dw = np.full((dim, W), np.nan, ct)
    db = np.full(dim, np.nan, ct) if bias else None
    key_s = cc.KernelKey("wsum", "float64" if io == "float64" else "float32", 0, False, False, False)
    run(fns[key_s], [part, dw, db], [batch, dim, n_tiles, W], -(-dim * (W + 1) // 128))
    g = pb(dy.astype(np.float64), dfin.astype(np.float64))
    # cc1d_wsum sums b-major then tile, in the compute type
    order = part.transpose(1, 3, 0, 2).reshape(dim, W + 1, -1)
    expect = np.zeros((dim, W + 1), ct)
    for j in range(order.shape[2]):
        expect += order[:, :, j]
    if not (np.array_equal(dw, expect[:, :W]) and (db is None or np.array_equal(db, expect[:, W]))):
        errs["wsum_order"] = 1.0
    errs["dx"] = rel(dx.astype(np.float64), g.x)
    errs["dw"] = rel(dw, g.weight)
    if bias: errs["db"] = rel(db, g.bias)
    if init and H: errs["dh0"] = rel(dh0, g.initial_state)
    return errs

def case_spans(fns, family, io, W, batch, dim, L, bias, silu, span, with_dfinal, rng):
    """cc1d_fwd_<family> and cc1d_bwd_<family> ("mma" or "warp": a warp per span) with spans
    of ``span`` steps against the reference; the weight gradients through the emulated
    cc1d_wsum."""
    H = W - 1
    x = to_io(rng.standard_normal((batch, dim, L)), io)
    w = (rng.standard_normal((dim, W)) / np.sqrt(W)).astype(np.float32)
    b = rng.standard_normal(dim).astype(np.float32) if bias else None
    act = "silu" if silu else None
    (yr, fr), pb = reference.causal_conv1d_vjp(x.astype(np.float64), w.astype(np.float64),
                                               None if b is None else b.astype(np.float64),
                                               activation=act, return_final_state=True)
    dy = to_io(rng.standard_normal(yr.shape), io)
    dfin = rng.standard_normal(fr.shape).astype(np.float32) if (with_dfinal and H) else None
    n_spans = -(-L // span)
    n_items = batch * dim * n_spans
    y = np.full_like(x, np.nan)
    fin = np.full((batch, dim, H), np.nan, x.dtype)
    run(fns[cc.KernelKey("fwd_" + family, io, W, bias, silu, False)], [x, w, b, y, fin if H else None],
        [dim, L, span, n_spans, n_items], -(-n_items // 4))
    errs = {"y": rel(y.astype(np.float64), yr)}
    if H:
        errs["final"] = rel(fin.astype(np.float64), fr)
    if family == "mma" and L % 8:  # cc1d_bwd_mma copies 16-byte vectors of whole rows
        return errs
    dx = np.full_like(x, np.nan)
    part = np.full((batch, dim, n_spans, W + 1), np.nan, np.float32)
    key = cc.KernelKey("bwd_" + family, io, W, bias, silu, False)
    run(fns[key], [x, w, b, dy, dfin, dx, part], [dim, L, span, n_spans, n_items], -(-n_items // 4))
    dw = np.full((dim, W), np.nan, np.float32)
    db = np.full(dim, np.nan, np.float32) if bias else None
    run(fns[cc.KernelKey("wsum", "float32", 0, False, False, False)], [part, dw, db],
        [batch, dim, n_spans, W], -(-dim * (W + 1) // 128))
    g = pb(dy.astype(np.float64), None if dfin is None else dfin.astype(np.float64))
    errs.update(dx=rel(dx.astype(np.float64), g.x), dw=rel(dw, g.weight))
    if bias: errs["db"] = rel(db, g.bias)
    return errs


# (L, span): lengths (multiples of 8) at and around the chunk (256 steps) and the span, L < W
WARP_CASES = [(8, 256), (16, 256), (248, 256), (256, 256), (264, 256), (504, 256), (512, 256),
              (520, 512), (768, 256), (1024 + 8, 512), (1536 + 24, 768)]


def run_spans(family, ios, widths, cases, tol, tol_rest, defines, asan, seed):
    """The forward and backward kernels of ``family`` ("warp" or "mma") over ``cases``
    ((L, span) pairs), each width of ``widths``, the flags cycling: every output within
    ``tol[io]`` (y and dx: their own rounding), the final state exact, the rest (the weight
    gradients) within ``tol_rest``. Returns (worst error per (dtype, output), failures)."""
    rng = np.random.default_rng(seed)
    keys = [cc.KernelKey(f"{d}_{family}", io, W, hb, si, False) for d in ("fwd", "bwd")
            for io in ios for W in widths for hb, si in itertools.product((False, True), repeat=2)]
    keys += [cc.KernelKey("wsum", "float32", 0, False, False, False)]
    fns = build(keys, defines, asan=asan)
    worst, fails = {}, []
    for io in ios:
        for W in widths:
            for j, (L, span) in enumerate(cases):
                hb, si = [(True, True), (False, True), (True, False), (False, False)][(W + j) % 4]
                errs = case_spans(fns, family, io, W, 2, 3, L, hb, si, span, (W + j) % 3 != 0,
                                  rng)
                for name, e in errs.items():
                    t = tol[io] if name in ("dx", "y") else (0 if name == "final" else tol_rest)
                    worst[(io, name)] = max(worst.get((io, name), 0), e)
                    if not e <= t:
                        fails.append((io, W, L, span, hb, si, name, e))
    return worst, fails


def run_warp(ios, widths, cases=WARP_CASES, defines=(), asan=True, seed=2):
    """cc1d_fwd_warp and cc1d_bwd_warp over ``cases`` (:func:`run_spans`)."""
    tol = {"float16": 2e-3, "bfloat16": 1.5e-2, "float32": 1e-6}  # dx: its own rounding
    return run_spans("warp", ios, widths, cases, tol, 1e-5, defines, asan, seed)


MMA_CASES = [(2, 128), (8, 128), (126, 128), (128, 128), (130, 128), (136, 128), (254, 128),
             (264, 256), (384, 128), (390, 384), (512 + 6, 256), (1000, 384),
             (1536 + 6, 768), (16, 128), (256 + 8, 128), (512 + 8, 256),
             (1536 + 8, 768)]  # (L, span); the backward takes L a multiple of 8


def run_mma(ios, widths, cases=MMA_CASES, defines=(), asan=True, seed=1):
    """cc1d_fwd_mma and cc1d_bwd_mma over ``cases`` (even lengths at and around the chunk
    (128), the span and L < W; spans of 128, 256 and 384 steps; :func:`run_spans`)."""
    tol = {"float16": 2e-3, "bfloat16": 1.5e-2}  # a 16-bit dx: its rounding, 2^-9 / 2^-12
    return run_spans("mma", ios, widths, cases, tol, 1e-4, defines, asan, seed)


def main_mma(ios, sweep=None):
    """``emu.py mma [dtypes]``: :func:`run_mma` (or ``sweep``: ``emu.py warp``,
    :func:`run_warp`) over every width (EMU_W to choose)."""
    widths = [int(w) for w in os.environ.get("EMU_W", "1,2,3,4,5,6,7,8").split(",")]
    # EMU_DEFINES="CC1D_MMA_FWD_BUFS 8,CC1D_MMA_BWD_AHEAD 1": the source built with other settings
    worst, fails = (sweep or run_mma)(ios, widths,
                           defines=[d for d in os.environ.get("EMU_DEFINES", "").split(",") if d])
    for f in fails:
        print("FAIL", *f)
    for k, e in sorted(worst.items()): print(k, f"{e:.2e}")
    print("fails", len(fails))
    sys.exit(1 if fails else 0)


TOL_F = {"float64": 1e-10, "float32": 2e-5, "float16": 4e-3, "bfloat16": 2.5e-2}
TOL_G = {"float64": 1e-9, "float32": 1e-4, "float16": 1e-2, "bfloat16": 5e-2}

if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "mma":
    main_mma(sys.argv[2].split(",") if len(sys.argv) > 2 else ["bfloat16", "float16"])

if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "warp":
    main_mma(sys.argv[2].split(",") if len(sys.argv) > 2 else ["bfloat16", "float16", "float32"],
             run_warp)

if __name__ == "__main__":
    ios = sys.argv[1].split(",") if len(sys.argv) > 1 else ["float32", "float64", "bfloat16"]
    vpt = int(sys.argv[2]) if len(sys.argv) > 2 else None
    rng = np.random.default_rng(0)
    widths = [int(w) for w in os.environ.get("EMU_W", "1,2,3,4,5,6,7,8").split(",")]
    keys = [cc.KernelKey(k, io, W, hb, si, sq) for k in ("fwd", "bwd") for io in ios for W in widths
            for hb, si, sq in itertools.product((False, True), repeat=3)]
    keys += [cc.KernelKey("wsum", io, 0, False, False, False) for io in ("float32", "float64")]
    fns = build(keys, [f"CC1D_VPT {vpt}"] if vpt else [])
    worst = {}
    fails = 0
    for io in ios:
        v = vpt or (4 if io == "float32" else 2)
        E = {"float32": 4, "float64": 2, "bfloat16": 8, "float16": 8}[io]
        tile = 128 * v * E
        for W in widths:
            for j, L in enumerate([1, 2, 5, W - 1 if W > 1 else 3, 32 * E - 1, 32 * E + 3, tile, tile + 1, tile + E, 2 * tile + 5]):
                hb, si, sq = [(True, True, False), (False, True, True), (True, False, True), (True, True, True), (False, False, False)][(W + j) % 5]
                init = (W + j) % 3 != 0
                cuts = None
                if sq:
                    cuts = sorted(set([1, 3, 32 * E - 2, 32 * E, tile - 1, tile + 2, L - 1]))
                # every other case: 3 blocks walk the items (the read-ahead hand-over), else one
                # per item; float64 blocks do one item each (cc1d_shape<double>::WALK)
                walk = io != "float64" and (W + j) % 2
                errs = case(fns, io, W, 2, 2, L, hb, si, cuts, init, rng, v, misalign=False,
                            grid=3 if walk else None)
                for name, e in errs.items():
                    tol = TOL_F[io] if name in ("y", "final") else TOL_G[io]
                    worst[(io, name)] = max(worst.get((io, name), 0), e)
                    if not e <= tol:
                        fails += 1
                        print("FAIL", io, W, L, hb, si, sq, init, name, e)
    for k, e in sorted(worst.items()): print(k, f"{e:.2e}")
    print("fails", fails)
    sys.exit(1 if fails else 0)
