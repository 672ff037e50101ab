"""Build a host emulation (.so) of cuda_src/ssd_mma.cu: the same text with its PTX replaced.

REPL swaps the inline-PTX lines (ldmatrix and cp.async among them) and vector casts for
emu_common.h / prelude_mma.h C++;
replace_mma (emu_build.py) swaps both mma.sync.m16n8k16 blocks for emu_mma (the PTX ISA
fragment layout). Every
ssd_mma_chunk_state / ssd_mma_state_walk / ssd_mma_fwd / ssd_mma_bwd / ssd_tf32_fwd / ssd_tf32_bwd / ssd_mma_cb / ssd_mma_chunk_out instance (both chunk-state forms) and the backward
ssd_mma_chunk_mm and ssd_mma_bwd_rows instances get an extern "C" wrapper (KERNELS).
Products go to $TMPDIR/ssmkit_emu/ssd.

    python3 tests/emulation/ssd/build.py [--asan]     # build only, print the .so path

SSD_EMU_MUTATE='old=>new' plants a deliberate bug (first occurrence) to see the checks fail.
"""
import os, re, sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, REPO)
from ssmkit._gpu import compiler

sys.path.insert(0, os.path.dirname(HERE))
from emu_build import COMMON_REPL, LDSM_REPL, compile_so, replace_all, replace_mma  # noqa: E402

# ssm_tf32.cuh's 3 x TF32 products (ssd.cu's and ssd_mma.cu's float32 kernels): mma.sync
# emulated by prelude_mma.h
TF32_REPL = [
    ('asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, "\n'
     '        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"\n'
     '        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])\n'
     '        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));',
     'emu_mma_tf32(d, a, b0, b1);'),
]

REPL = COMMON_REPL + LDSM_REPL + TF32_REPL + [
    ('return *reinterpret_cast<const unsigned*>(p);', 'return *emu_al<const unsigned>(p);'),
    ('*reinterpret_cast<const ssd_mma_u4*>(p)', '*emu_al<const ssd_mma_u4>(p)'),
    ('*reinterpret_cast<ssd_mma_u4*>(dst) = w;', '*emu_al<ssd_mma_u4>(dst) = w;'),
    ('*reinterpret_cast<ssm_f4*>(cb + ssd_mma_cb_at(', '*emu_al<ssm_f4>(cb + ssd_mma_cb_at('),
    ('*reinterpret_cast<unsigned*>(p) = ssd_mma_pack<T>(v[0], v[1]);', '*emu_al<unsigned>(p) = ssd_mma_pack<T>(v[0], v[1]);'),
    ('*reinterpret_cast<const ssm_f4*>(cb + ssd_mma_cb_at(', '*emu_al<const ssm_f4>(cb + ssd_mma_cb_at('),
    ('*reinterpret_cast<ssm_f4*>(cbt + ssd_mma_cb_at(', '*emu_al<ssm_f4>(cbt + ssd_mma_cb_at('),
    ('*reinterpret_cast<ssd_mma_f2*>(dst + o) = ', '*emu_al<ssd_mma_f2>(dst + o) = '),
    ('float* const fs = reinterpret_cast<float*>(cs);', 'float* const fs = emu_al<float>(cs);'),
    ('extern __shared__ ssm_v16 ssd_mma_dyn[];', 'ssm_v16* const ssd_mma_dyn = reinterpret_cast<ssm_v16*>(emu_smem_ptr);'),
    ('if (PIN) asm volatile("" : "+r"(a));', ''),
]

LAUNCH = r'''
struct EmuBuf { void* p; long long n; };
// The next launch's dynamic shared memory (emu_set_dyn_smem), in this library's static data
// so that its shared-window offsets (emu_cvta_shared) fit in 32 bits; 0xff bytes at each
// block's start (a read of what no copy wrote is a NaN).
alignas(16) static unsigned char emu_dyn_buf[128 * 1024];
static unsigned emu_next_smem = 0;
extern "C" void emu_set_dyn_smem(unsigned n) {
    if (n > sizeof(emu_dyn_buf)) emu_fail("dynamic shared memory past the emulation's buffer");
    emu_next_smem = n;
}
template <typename F>
static void emu_launch(F call, unsigned gx, unsigned gy, unsigned gz, unsigned block) {
    emu_dyn_smem = emu_next_smem;
    emu_smem_ptr = emu_dyn_buf;
    unsigned nw = (block + 31) / 32;
    std::vector<EmuMmaX> mx(nw);
    emu_mmax = mx.data();
    for (unsigned bz = 0; bz < gz; ++bz)
    for (unsigned by = 0; by < gy; ++by)
    for (unsigned bx = 0; bx < gx; ++bx) {
        blockIdx.x = bx; blockIdx.y = by; blockIdx.z = bz;
        blockDim.x = block; gridDim.x = gx; gridDim.y = gy; gridDim.z = gz;
        memset(emu_dyn_buf, 0xff, emu_dyn_smem);
        emu_run_block(call, block);
    }
}
static std::vector<void*> emu_copy_in(EmuBuf* a, int n) {
    std::vector<void*> r(n);
    for (int i = 0; i < n; ++i) {
        if (!a[i].p) { r[i] = nullptr; continue; }
        r[i] = malloc(a[i].n ? a[i].n : 1);
        memcpy(r[i], a[i].p, a[i].n);
    }
    return r;
}
static void emu_copy_out(EmuBuf* a, std::vector<void*>& r, int n) {
    for (int i = 0; i < n; ++i) if (r[i]) { memcpy(a[i].p, r[i], a[i].n); free(r[i]); }
}
'''

STATE_T = "const T*,const T*,const float*,const float*,const int*,const ssm_i64*,float*".split(",")
STATE_S = ["ssm_i64", "int", "int", "int", "int", "ssm_i64"]
OUT_T = ("const T*,const float*,const T*,const T*,const float*,const T*,const float*,const float*,"
         "const int*,const ssm_i64*,T*").split(",")
OUT_S = ["ssm_i64", "int", "int", "int", "int", "ssm_i64", "int", "int", "int"]
WALK_T = ("const T*,const T*,const float*,const float*,const int*,const ssm_i64*,const float*,"
          "float*,T*,const int*,float*").split(",")
WALK_S = ["ssm_i64", "int", "int", "int", "int", "ssm_i64"]
FWD_T = ("const T*,const T*,const T*,const float*,const T*,const float*,const float*,"
         "const ssm_i64*,const float*,float*,T*,const int*,float*,T*,T*,float*").split(",")
FWD_S = ["ssm_i64", "int", "int", "int", "int", "int", "ssm_i64"]
CB_T = "const T*,const T*,const ssm_i64*,float*,float*".split(",")
CB_S = ["ssm_i64", "int", "int", "int", "ssm_i64", "int", "int"]


def wrapper(sym, name, T, ptypes, stypes, tail_p=(), tail_s=()):
    """tail_p, tail_s: a pointer and a scalar that follow the scalars in the signature."""
    np_, ns = len(ptypes), len(stypes)
    ptypes = [t.replace("T*", T + "*") for t in list(ptypes) + list(tail_p)]
    pargs = ", ".join(f"({t})r[{i}]" for i, t in enumerate(ptypes[:np_]))
    sargs = ", ".join(f"({t})s[{i}]" for i, t in enumerate(stypes))
    if tail_p or tail_s:
        sargs += "".join(f", ({t})r[{np_ + i}]" for i, t in enumerate(ptypes[np_:]))
        sargs += "".join(f", ({t})s[{ns + i}]" for i, t in enumerate(tail_s))
    n = len(ptypes)
    return f'''
extern "C" void {sym}(EmuBuf* a, long long* s, unsigned gx, unsigned gy, unsigned gz, unsigned block) {{
    std::vector<void*> r = emu_copy_in(a, {n});
    auto call = [&r, s] {{ {name}({pargs}, {sargs}); }};
    emu_launch(call, gx, gy, gz, block);
    emu_copy_out(a, r, {n});
}}
'''

KERNELS = {}
for T, tag in (("ssm_half", "f16"), ("ssm_bf16", "bf16")):
    for nw in (64, 128):
        for adj in ("false", "true"):
            KERNELS[f"state_{tag}_{nw}_{adj}"] = (f"ssd_mma_chunk_state<{T}, {nw}, {adj}>", T,
                                                  STATE_T, STATE_S)
    for pw in (32, 64, 128):
        KERNELS[f"out_{tag}_{pw}"] = (f"ssd_mma_chunk_out<{T}, {pw}, {128 if pw <= 64 else 64}>", T, OUT_T, OUT_S)
    KERNELS[f"cb_{tag}"] = (f"ssd_mma_cb<{T}, 128>", T, CB_T, CB_S)
    for nw in (64, 128):
        KERNELS[f"walk_{tag}_{nw}"] = (f"ssd_mma_state_walk<{T}, {nw}>", T, WALK_T, WALK_S)
        for keep, walk in (("false", "false"), ("true", "false"), ("false", "true")):
            KERNELS[f"fwd_{tag}_{nw}_{keep}" + ("_walk" if walk == "true" else "")] = (
                f"ssd_mma_fwd<{T}, {nw}, {keep}, {walk}>", T, FWD_T, FWD_S)

# ssd_tf32_fwd (float32): cb, tiles_per_chunk and classes among its arguments
TF32_FWD_T = ("const T*,const T*,const T*,const float*,const float*,const T*,const float*,"
              "const float*,const ssm_i64*,const float*,float*,const int*,float*,T*,float*").split(",")
TF32_FWD_S = ["ssm_i64", "int", "int", "int", "int", "int", "ssm_i64", "int", "int"]
for nw in (64, 128):
    for keep in ("false", "true"):
        KERNELS[f"tf32_fwd_{nw}_{keep}"] = (f"ssd_tf32_fwd<{nw}, {keep}>", "float", TF32_FWD_T,
                                            TF32_FWD_S)

# ssd_tf32_bwd (float32): dY, B, C, cb, x, ycore, D, dte, cum, starts, states, bslot, dfinal,
# then the outputs dx, xgb, dcum, dD_part, dHx, dinit, end_part
TF32_BWD_T = ("const T*,const T*,const T*,const float*,const T*,const float*,const float*,"
              "const float*,const float*,const ssm_i64*,const float*,const int*,const float*,"
              "T*,float*,float*,float*,float*,float*,float*").split(",")
for nw in (64, 128):
    KERNELS[f"tf32_bwd_{nw}"] = (f"ssd_tf32_bwd<{nw}>", "float", TF32_BWD_T, TF32_FWD_S)

# ssd_mma_bwd (16-bit; the backward as one walk): dY, B, C, x, yblob, D, dte, cum, starts,
# states, bslot, dfinal, dx, xgb, dcum, dD_part, dHx, dinit, end_part
MMA_BWD_T = ("const T*,const T*,const T*,const T*,const float*,const float*,const float*,"
             "const float*,const ssm_i64*,const float*,const int*,const float*,T*,float*,float*,"
             "float*,T*,float*,float*").split(",")
for tag, T in (("half", "ssm_half"), ("bf16", "ssm_bf16")):
    for nw in (64, 128):
        KERNELS[f"mma_bwd_{tag}_{nw}"] = (f"ssd_mma_bwd<{T}, {nw}>", T, MMA_BWD_T, FWD_S)

MM_T = "const T*,const T*,const T*,const T*,const float*,const float*,const int*,const ssm_i64*,float*,const T*,float*,const T*,float*".split(",")
MM_S = ["ssm_i64", "int", "int", "int", "int", "int", "int", "ssm_i64", "ssm_i64", "int", "int",
        "int", "int", "ssm_i64", "int", "int"]
# cbm, the fused per-step work's arrays (dy, z, X, D, cbd, dY16, dz, dx, dcum, dD_part), classes:
# after the scalars above
MM_T2 = ("const float*,const T*,const T*,const T*,const float*,const float*,T*,T*,T*,float*,"
         "float*").split(",")
MM_S2 = ["int"]
DC_T = ("const T*,const T*,const T*,const T*,const float*,const float*,const int*,"
        "const ssm_i64*,float*").split(",")
DC_S = ["ssm_i64", "int", "int", "int", "int", "int", "ssm_i64", "int", "int", "ssm_i64"]
DB_T = ("const T*,const T*,const T*,const T*,const T*,const float*,const float*,const int*,"
        "const ssm_i64*,const float*,float*,float*").split(",")
DB_S = ["ssm_i64", "int", "int", "int", "int", "int", "ssm_i64", "int", "int", "ssm_i64", "int"]
ROWS_T = ("const T*,const T*,const T*,const float*,const float*,const float*,const float*,"
          "const float*,T*,T*,T*,float*,float*").split(",")
ROWS_S = ["ssm_i64", "int", "int", "int"]
from ssmkit._gpu import ssd as _gssd
for T, io in (("ssm_half", "float16"), ("ssm_bf16", "bfloat16")):
    for i, name in enumerate(_gssd.mma_bwd_kernel_names(io)):
        if name.startswith("ssd_mma_chunk_mm"):
            KERNELS[f"mm_{io}_{i}"] = (name, T, MM_T, MM_S, MM_T2, MM_S2)
        elif name.startswith("ssd_mma_chunk_db"):  # gs: a pointer after the scalars
            KERNELS[f"db_{io}_{i}"] = (name, T, DB_T, DB_S, ["const float*"])
        elif name.startswith("ssd_mma_chunk_dc"):
            # gs, C, cbl, dcum and classes after the scalars
            KERNELS[f"dc_{io}_{i}"] = (name, T, DC_T, DC_S,
                                       ["float*", "const T*", "const float*", "float*"], ["int"])
        elif name.startswith("ssd_mma_bwd_rows"):
            KERNELS[f"rows_{io}_{i}"] = (name, T, ROWS_T, ROWS_S)


# SSD_EMU_TF32_PASSES=1: the float32 tensor-core kernels built as ssd's allow_tf32 variant
# (cuda_src/ssm_tf32.cuh's SSM_TF32_PASSES); default 3, the plain build.
TF32_PASSES = int(os.environ.get("SSD_EMU_TF32_PASSES", "3"))
TF32_FLAG = f"-DSSM_TF32_PASSES={TF32_PASSES}"


def check_defines(name, defines):
    """A launch asks for the variant this emulation was built as: ssmkit._gpu.ssd.TF32_ONE_PASS
    for the kernels on ssm_tf32.cuh when built with one pass, none otherwise."""
    from ssmkit._gpu import ssd as gssd

    on_tf32 = TF32_PASSES == 1 and gssd.on_tf32_header(name)
    want = gssd.TF32_ONE_PASS if on_tf32 else ()
    assert tuple(defines) == want, (name, defines, want)


def build(asan=False, opt="-O2"):
    src = compiler.kernel_source("ssd_mma.cu")
    mut = os.environ.get("SSD_EMU_MUTATE")  # "old=>new": a deliberate bug, to see the check fail
    if mut:
        old, new = mut.split("=>")
        assert src.count(old) >= 1, old
        src = src.replace(old, new, 1)
    src = replace_all(src, REPL)
    assert "reinterpret_cast<const ssd_mma_u4" not in src and "reinterpret_cast<ssd_mma_u4" not in src
    src = replace_mma(src)
    assert "asm" not in src.replace("emu_", ""), [l for l in src.splitlines() if "asm" in l]
    text = '#include "prelude_mma.h"\n' + src + LAUNCH + "".join(
        wrapper("emu_" + k, *v) for k, v in KERNELS.items())
    return compile_so("ssd", text, asan=asan, opt=opt, include_dir=HERE,
                      extra_flags=("-fno-strict-aliasing", TF32_FLAG))

if __name__ == "__main__":
    print(build(asan="--asan" in sys.argv))
