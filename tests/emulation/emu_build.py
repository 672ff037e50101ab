"""What every emulation build shares: the C++ that replaces ssm_common.cuh's inline PTX, the
text substitution with its checks, and the cached g++ build of the host library.

Each family's build script adds its own replacements (its kernels' PTX and vector casts), its
prelude header and its extern "C" wrappers, then calls :func:`compile_so`.
"""
import fcntl
import hashlib
import re
import os
import subprocess
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))

# The inline PTX of cuda_src/ssm_common.cuh (in every kernel source) and its emulation
# (emu_common.h).
COMMON_REPL = [
    ('asm("mov.b32 %0, %1;" : "=f"(f) : "r"(u));', 'memcpy(&f, &u, 4);'),
    ('asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x.bits));', 'f = emu_h2f(x.bits);'),
    ('asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));', 'h = emu_f2h(v);'),
    ('asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(v));', 'h = emu_f2bf(v);'),
    ('asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));', 'r = emu_ex2_ftz(x);'),
    ('asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));', 'r = emu_rcp_ftz(x);'),
    ('asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));', 'r = emu_lg2_ftz(x);'),
    ('asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(r));', 'r = emu_dyn_smem;'),
    ('asm volatile("mov.u32 %0, %%tid.x;" : "=r"(r));', 'r = (int)threadIdx.x;'),
    ('asm volatile("mov.u32 %0, %%ctaid.x;" : "=r"(r));', 'r = (int)blockIdx.x;'),
    ('asm volatile("prefetch.global.L2 [%0];" : : "l"(p));', 'emu_prefetch(p);'),
    # cp.async (ssm_common.cuh): the sm_80 branch is the one emulated, its copies landing at
    # the waits (emu_common.h)
    ('#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800\n#define SSM_CP_ASYNC_ARCH 1',
     '#if 1\n#define SSM_CP_ASYNC_ARCH 1'),
    ('asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" : : "r"(ssm_smem_addr(dst)), "l"(src) : "memory");',
     'emu_cp_async(dst, src, 16, true);'),
    ('asm volatile("cp.async.ca.shared.global [%0], [%1], %2;" : : "r"(ssm_smem_addr(dst)), "l"(src), "n"(BYTES) : "memory");',
     'emu_cp_async(dst, src, BYTES, false);'),
    ('''asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"
                 : : "r"(dst), "l"(src), "r"(live ? 16 : 0) : "memory");''',
     'emu_cp16(emu_smem_at(dst), src, live);'),
    ('asm volatile("cp.async.commit_group;" : : : "memory");', 'emu_cp_commit();'),
    ('asm volatile("cp.async.wait_group %0;" : : "n"(PENDING) : "memory");', 'emu_cp_wait(PENDING);'),
] + [(ptx, 'emu_fail("sm_90 bulk copy");') for ptx in (
    # The bulk copies' sm_90 branch: the host build takes the block-wide copy of the
    # pre-sm_90 branch instead (ssm_bulk_wait), so these lines are never compiled here.
    'asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" : : "r"(ssm_smem_addr(bar)) : "memory");',
    'asm volatile("fence.proxy.async.shared::cta;" : : : "memory");',
    """asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                 : : "r"(ssm_smem_addr(bar)), "r"(bytes) : "memory");""",
    """asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 : : "r"(ssm_smem_addr(dst)), "l"(src), "r"(bytes), "r"(ssm_smem_addr(bar)) : "memory");""",
    """asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0; selp.u32 %0, 1, 0, p; }"
                     : "=r"(done) : "r"(b) : "memory");""")]


# ldmatrix from a shared-window address a (the tensor-core kernels of causal_conv1d.cu and
# ssd_mma.cu; an offset from emu_common.h's anchor here).
LDSM_REPL = [
    ('''asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a) : "memory");''',
     'emu_ldsm<true>(r, (const unsigned short*)emu_smem_at(a));'),
    ('''asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a) : "memory");''',
     'emu_ldsm<false>(r, (const unsigned short*)emu_smem_at(a));'),
]


# The two mma.sync blocks of ssm_common.cuh's ssm_mma16 (bfloat16, float16 operands).
MMA_RE = re.compile(r'asm volatile\(\s*"mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.(bf16|f16)\..*?"r"\(b1\)\);', re.S)


def replace_mma(src, emulate=True):
    """``src`` with both mma.sync blocks replaced: by emu_mma (ssd/prelude_mma.h, the PTX ISA
    fragment layout) where the kernels use them, else by a failure should one run."""
    def sub(m):
        if not emulate:
            return 'emu_fail("mma.sync is not emulated in this build");'
        return f"emu_mma<{'true' if m.group(1) == 'bf16' else 'false'}>(d, a, b0, b1);"
    src, n = MMA_RE.subn(sub, src)
    assert n == 2, f"expected the two mma.sync blocks of ssm_mma16, found {n}"
    return src


def replace_all(src, repl):
    """``src`` with every (old, new) of ``repl`` applied; each old text must be in it, so a
    kernel change stops the build with the line that no longer matches."""
    for old, new in repl:
        if old not in src:
            raise SystemExit("emulation: text not in the kernel source: " + old)
        src = src.replace(old, new)
    return src


def _headers():
    """The text of every header under tests/emulation (emu_common.h, the preludes), which the
    generated text includes: an edit there must rebuild too."""
    out = []
    for d, _, files in sorted(os.walk(HERE)):
        out += [open(os.path.join(d, f)).read() for f in sorted(files) if f.endswith(".h")]
    return "".join(out)


def compile_so(family, text, *, asan, opt, include_dir, extra_flags=()):
    """Build ``text`` (C++) into a shared library under $TMPDIR/ssmkit_emu/<family>/, named by
    a hash of everything that goes into it (the text, the flags, the emulation's headers;
    reused while that is unchanged); its path."""
    build_dir = os.path.join(tempfile.gettempdir(), "ssmkit_emu", family)
    flags = ["-std=c++20", opt, "-g", "-fPIC", "-shared", "-pthread", "-Wno-unknown-pragmas",
             *extra_flags]
    if asan:
        flags = ["-fsanitize=address", "-fno-omit-frame-pointer"] + flags
    h = hashlib.md5((text + " ".join(flags) + _headers()).encode()).hexdigest()[:12]
    os.makedirs(build_dir, exist_ok=True)
    so = os.path.join(build_dir, f"emu_{h}.so")
    if os.path.exists(so):
        return so
    # One process builds a library; others that want it at the same time (pytest -n) wait
    # for it instead of building it again, and none sees a half-written one.
    with open(os.path.join(build_dir, f"emu_{h}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.exists(so):
            part = os.path.join(build_dir, f"emu_{h}.{os.getpid()}")
            with open(part + ".cpp", "w") as f:
                f.write(text)
            subprocess.run(["g++", *flags, "-I", include_dir, "-I", HERE, part + ".cpp", "-o",
                            part + ".so"], check=True)
            os.replace(part + ".so", so)
            os.replace(part + ".cpp", os.path.join(build_dir, f"emu_{h}.cpp"))
    return so
