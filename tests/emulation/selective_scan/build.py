"""Build a host-emulated .so of cuda_src/selective_scan.cu for given KernelKeys.

The kernel text is the runtime source (compiler.kernel_source) with the few inline-PTX lines
and vector casts replaced by the C++ of emu_common.h and prelude_ss.h (REPL below; each pattern must still be in the
source, else the assert names it). Used by run.py and sweep.py; not run on its own. Build products
(.cpp, .so) go to $TMPDIR/ssmkit_emu/selective_scan, keyed by a hash of the text.
"""
import hashlib, os, re, sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, REPO)
from ssmkit._gpu import compiler, selective_scan as ss

sys.path.insert(0, os.path.dirname(HERE))
from emu_build import COMMON_REPL, compile_so, replace_all, replace_mma  # noqa: E402

REPL = COMMON_REPL + [
    ('const ssm_f4 t = *reinterpret_cast<const ssm_f4*>(p);', 'const ssm_f4 t = *emu_al<const ssm_f4>(p);'),
    ('*reinterpret_cast<ssm_f4*>(p) = t;', '*emu_al<ssm_f4>(p) = t;'),
    ('const ssm_d2 a = reinterpret_cast<const ssm_d2*>(p)[0];', 'const ssm_d2 a = emu_al<const ssm_d2>(p)[0];'),
    ('reinterpret_cast<ssm_d2*>(p)[0] = a;', 'emu_al<ssm_d2>(p)[0] = a;'),
    ('__device__ __forceinline__ ssm_v16 ssm_ld16(const void* p) { return *reinterpret_cast<const ssm_v16*>(p); }',
     '__device__ __forceinline__ ssm_v16 ssm_ld16(const void* p) { return *emu_al<const ssm_v16>(p); }'),
    ('__device__ __forceinline__ void ssm_st16(void* p, const ssm_v16& q) { *reinterpret_cast<ssm_v16*>(p) = q; }',
     '__device__ __forceinline__ void ssm_st16(void* p, const ssm_v16& q) { *emu_al<ssm_v16>(p) = q; }'),
    ('extern __shared__ ssm_f4 ssm_smem[];', 'ssm_f4* const ssm_smem = reinterpret_cast<ssm_f4*>(emu_smem_ptr);'),
]

FWD_T = "const IO*,const IO*,const IO*,const CT*,const BC*,const BC*,const CT*,const CT*,const CT*,IO*,CT*,CT*,CT*,CT*".split(',')
SHAPE = ["int", "int", "int", "ssm_i64", "int", "int", "ssm_i64", "int", "int", "int"]
SEG = ["ssm_i64", "int", "int"]
BWD_T = "const IO*,const IO*,const IO*,const IO*,const CT*,const BC*,const BC*,const CT*,const CT*,const CT*,const CT*,IO*,IO*,IO*,CT*,CT*,CT*,CT*,CT*,CT*,CT*".split(',')
BSUM_T = "const IO*,const IO*,const IO*,const CT*,const BC*,const CT*,CT*,CT*".split(',')
RESTART = ["const unsigned char*"]  # packed sequences' restart flags
SIGS = {
    "fwd": FWD_T + SHAPE + SEG + RESTART,
    "fwd_sum": FWD_T + SHAPE + SEG + RESTART,
    "fwd_direct": FWD_T + SHAPE + SEG + RESTART,
    "fwd_sum_direct": FWD_T + SHAPE + SEG + RESTART,
    "fwd_ring": FWD_T + SHAPE + SEG + RESTART,
    "fwd_ring_wide": FWD_T + SHAPE + SEG + RESTART,
    "fwd_sum_ring": FWD_T + SHAPE + SEG + RESTART,
    "bwd_sum_ring": FWD_T + SHAPE + SEG + RESTART,
    "bwd": BWD_T + SHAPE + ["const CT*"] + SEG,
    "bwd_ring": BWD_T + SHAPE + ["const CT*"] + SEG + ["int"] + RESTART,
    "bwd_sum": BSUM_T + SHAPE + SEG,
    "carry": "const CT*,const CT*,const CT*,const CT*,CT*".split(',') + ["int"] * 5,
    "seq_states": "const IO*,const IO*,const CT*,const BC*,const CT*,const CT*".split(',')
    + ["const ssm_i64*"] * 4 + ["CT*", "int", "int", "int", "int", "ssm_i64", "int", "ssm_i64", "int"],
    "tile_sum": ["const CT*", "CT*", "int", "int", "ssm_i64"],
}
def is_ptr(t): return t.endswith("*")

LAUNCH = r'''
struct EmuBuf { void* p; long long n; };
template <typename F>
static void emu_launch(F call, unsigned grid, unsigned block, unsigned smem) {
    for (unsigned bi = 0; bi < grid; ++bi) {
        blockIdx.x = bi; blockDim.x = block; gridDim.x = grid;
        unsigned char* buf = (unsigned char*)malloc(smem ? smem : 1);
        memset(buf, 0xff, smem ? smem : 1);  // NaN: reads of unwritten smem poison results
        emu_smem_ptr = buf; emu_dyn_smem = smem;
        emu_run_block(call, block);
        free(buf);
    }
}
// Copy every array into an exact-size heap buffer (so ASan sees overruns), run, copy back.
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

def cxx_args(key):
    io = ss._CXX[key.io]; bc = ss._CXX[key.bc]; ct = ss._CXX[ss._COMPUTE[key.io]]
    return io, bc, ct

def symbol(key):
    return "emu_" + hashlib.md5(ss.name_expression(key).encode()).hexdigest()[:12]

def wrapper(key):
    io, bc, ct = cxx_args(key)
    types = [t.replace("IO", io).replace("BC", bc).replace("CT", ct) for t in SIGS[key.kind]]
    ip = isc = 0
    parts = []
    for t in types:
        if is_ptr(t):
            parts.append(f"({t})r[{ip}]"); ip += 1
        else:
            parts.append(f"({t})s[{isc}]"); isc += 1
    n = ip
    return f'''
extern "C" void {symbol(key)}(EmuBuf* a, long long* s, unsigned grid, unsigned block, unsigned smem) {{
    std::vector<void*> r = emu_copy_in(a, {n});
    auto call = [&r, s] {{ {ss.name_expression(key)}({", ".join(parts)}); }};
    emu_launch(call, grid, block, smem);
    emu_copy_out(a, r, {n});
}}
'''

def mutations():
    """Planted bugs from SS_EMU_MUTATE='old text=>new text[;;old=>new...]' (to check that the
    emulation catches them); each old text must occur in the kernel source."""
    spec = os.environ.get("SS_EMU_MUTATE", "")
    return [tuple(m.split("=>", 1)) for m in spec.split(";;") if m]


def build(keys, asan=True, opt="-O1"):
    src = compiler.kernel_source(ss.SOURCE_FILE)
    for a, b in mutations():
        assert a in src, "mutation target not in the source: " + a
        src = src.replace(a, b)
    src = replace_all(src, REPL)
    src = replace_mma(src, emulate=False)  # ssm_common.cuh's tensor-core wrapper, unused here
    left = [ln for ln in src.splitlines() if re.search(r"\basm\b", ln)]
    assert not left, "inline PTX left unemulated: " + "; ".join(left)
    text = '#include "prelude_ss.h"\n' + src + LAUNCH + "".join(wrapper(k) for k in keys)
    return compile_so("selective_scan", text, asan=asan, opt=opt, include_dir=HERE)
