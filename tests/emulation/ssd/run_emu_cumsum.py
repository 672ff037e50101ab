"""Host check of ssd.cu's ssd_chunk_cumsum (the chunk prefix and suffix sums), ssd_chunk_dt
(the layout pass: dt', its derivative, chunk sums of dt' A) and ssd_bwd_dt (the backward's
ddt and its per-chunk sums): the kernel text compiled for the
host (g++, AddressSanitizer; ssm_math's softplus and sigmoid as libm expressions of the same
form), one thread at a time, against NumPy (cumsum; ssmkit._ssd.effective_dt) on chunk
boundaries from ssmkit's own chunk_starts (regular chunks, sequence ends, length 1, chunks
shorter and longer than the unrolled group of loads), with and without softplus, bias, clip.

    LD_PRELOAD=$(g++ -print-file-name=libasan.so) ASAN_OPTIONS=detect_leaks=0 \
        python3 tests/emulation/ssd/run_emu_cumsum.py

ASAN=0 builds it without AddressSanitizer (no LD_PRELOAD needed; what CI runs).

Ends with "ALL OK" or "SOME FAILED" (exit status 0 or 1).
"""
import ctypes, os, re, sys
import numpy as np
import build  # puts the repository on sys.path
from ssmkit._gpu import compiler
from ssmkit._gpu.ssd import chunk_starts

src = compiler.kernel_source("ssd.cu")
m = re.search(r"#define SSD_CUMSUM_ILP.*?\nssd_chunk_cumsum\(.*?\n}\n", src, re.S)
m2 = re.search(r"template <typename CT>\n__global__ void __launch_bounds__\(SSD_THREADS\)\n"
               r"ssd_chunk_dt\(.*?\n}\n", src, re.S)
m3 = re.search(r"template <typename CT>\n__global__ void __launch_bounds__\(SSD_THREADS\)\n"
               r"ssd_bwd_dt\(.*?\n}\n", src, re.S)
assert m and m2 and m3, "ssd_chunk_cumsum, ssd_chunk_dt or ssd_bwd_dt not found"
text = r'''
#include <cstdint>
typedef long long ssm_i64;
#define SSD_THREADS 256
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(n)
#define __restrict__
struct Idx { unsigned x; };
static thread_local Idx blockIdx, threadIdx;
#include <cmath>
template <typename T> struct ssm_math {
    static T softplus(T x) { return x <= T(20) ? std::log1p(std::exp(x)) : x; }
    static T sigmoid(T x) { return T(1) / (T(1) + std::exp(-x)); }
};
''' + m.group(0) + m2.group(0) + m3.group(0) + r'''
extern "C" void run(const float* a, float* out, const ssm_i64* starts, ssm_i64 L, int H,
                    ssm_i64 nc, ssm_i64 total, int reverse, unsigned blocks) {
    for (unsigned bx = 0; bx < blocks; ++bx)
        for (unsigned t = 0; t < SSD_THREADS; ++t) {
            blockIdx.x = bx; threadIdx.x = t;
            ssd_chunk_cumsum<float>(a, out, starts, L, H, nc, total, reverse);
        }
}
extern "C" void run_dt(const float* dt, const float* bias, const float* A, const ssm_i64* starts,
                       float* dte, float* factor, float* cum, ssm_i64 L, int H, ssm_i64 nc,
                       ssm_i64 total, int softplus, int clip, float lo, float hi, unsigned blocks) {
    for (unsigned bx = 0; bx < blocks; ++bx)
        for (unsigned t = 0; t < SSD_THREADS; ++t) {
            blockIdx.x = bx; threadIdx.x = t;
            ssd_chunk_dt<float>(dt, bias, A, starts, dte, factor, cum, L, H, nc, total,
                                softplus, clip, lo, hi);
        }
}
'''
text += r'''
extern "C" void run_bwd_dt(const float* dcum, const float* xGB, const float* A, const float* dte,
                           const float* factor, const ssm_i64* starts, float* ddt, float* pa,
                           float* pb, ssm_i64 L, int H, ssm_i64 nc, ssm_i64 total,
                           unsigned blocks) {
    for (unsigned bx = 0; bx < blocks; ++bx)
        for (unsigned t = 0; t < SSD_THREADS; ++t) {
            blockIdx.x = bx; threadIdx.x = t;
            ssd_bwd_dt<float>(dcum, xGB, A, dte, factor, starts, ddt, pa, pb, L, H, nc, total);
        }
}
'''
so = build.compile_so("ssd", text, asan=os.environ.get("ASAN", "1") != "0", opt="-O1",
                      include_dir=build.HERE)
lib = ctypes.CDLL(so)
rng = np.random.default_rng(0)
allok = True
for batch, L, H, Q, ends in [(2, 37, 3, 8, None), (1, 1, 2, 256, None), (1, 17, 1, 17, None),
                             (3, 300, 5, 64, [5, 5, 100, 299]), (2, 9, 4, 1, None),
                             (1, 530, 7, 256, [3, 260])]:
    st = chunk_starts(L, Q, ends)
    nc = len(st) - 1
    total = batch * nc * H
    a = rng.standard_normal((batch, L, H)).astype(np.float32)
    for rev in (0, 1):
        out = np.full_like(a, np.nan)
        ptr = lambda x: x.ctypes.data_as(ctypes.c_void_p)
        lib.run(ptr(a), ptr(out), ptr(st), ctypes.c_longlong(L), ctypes.c_int(H),
                ctypes.c_longlong(nc), ctypes.c_longlong(total), ctypes.c_int(rev),
                ctypes.c_uint(-(-total // 256)))
        ref = np.empty_like(a)
        for c in range(nc):
            seg = a[:, st[c]:st[c + 1]].astype(np.float64)
            ref[:, st[c]:st[c + 1]] = (np.cumsum(seg[:, ::-1], 1)[:, ::-1] if rev
                                       else np.cumsum(seg, 1))
        ok = bool(np.allclose(out, ref, rtol=1e-5, atol=1e-5))
        allok &= ok
        print(f"batch {batch} L {L} H {H} chunk {Q} ends {ends} reverse {rev}: "
              f"{'OK' if ok else 'FAIL'}")

import math, types
from ssmkit._ssd import effective_dt
for batch, L, H, Q, ends, softplus, bias, lim in [
        (2, 37, 3, 8, None, True, True, (0.0, math.inf)),
        (1, 1, 2, 256, None, True, False, (0.0, math.inf)),
        (3, 300, 5, 64, [5, 5, 100, 299], True, True, (0.05, 0.4)),
        (2, 9, 4, 1, None, False, True, (0.0, math.inf)),
        (1, 530, 7, 256, [3, 260], False, False, (0.1, math.inf))]:
    st = chunk_starts(L, Q, ends)
    nc = len(st) - 1
    total = batch * nc * H
    dt = (rng.standard_normal((batch, L, H)) * 3 + (0 if softplus else 1)).astype(np.float32)
    dt[0, 0, 0] = 25.0  # past softplus's cut
    b = rng.standard_normal(H).astype(np.float32) if bias else None
    A = -rng.uniform(0.5, 2, H).astype(np.float32)
    p = types.SimpleNamespace(xp=np, dt=dt, dt_bias=b, dt_softplus=softplus, dt_lo=lim[0],
                              dt_hi=lim[1], dt_clip=lim != (0.0, math.inf),
                              compute_dtype=np.float32)
    v_ref, f_ref = effective_dt(p)
    cum_ref = np.empty_like(v_ref)
    for c in range(nc):
        cum_ref[:, st[c]:st[c + 1]] = np.cumsum((v_ref * A)[:, st[c]:st[c + 1]], 1)
    dte, fac, cum = (np.full_like(dt, np.nan) for _ in range(3))
    ptr = lambda x: None if x is None else x.ctypes.data_as(ctypes.c_void_p)
    lib.run_dt(ptr(dt), ptr(b), ptr(A), ptr(st), ptr(dte), ptr(fac), ptr(cum),
               ctypes.c_longlong(L), ctypes.c_int(H), ctypes.c_longlong(nc),
               ctypes.c_longlong(total), ctypes.c_int(softplus), ctypes.c_int(p.dt_clip),
               ctypes.c_float(lim[0]), ctypes.c_float(lim[1]), ctypes.c_uint(-(-total // 256)))
    ok = all(bool(np.allclose(a, r, rtol=2e-6, atol=1e-6))
             for a, r in ((dte, v_ref), (fac, f_ref), (cum, cum_ref)))
    allok &= ok
    print(f"chunk_dt batch {batch} L {L} H {H} chunk {Q} ends {ends} softplus {softplus} "
          f"bias {bias} dt_limit {lim}: {'OK' if ok else 'FAIL'}")
for batch, L, H, Q, ends in [(2, 37, 3, 8, None), (1, 1, 2, 256, None),
                             (3, 300, 5, 64, [5, 5, 100, 299]), (1, 530, 7, 256, [3, 260])]:
    st = chunk_starts(L, Q, ends)
    nc = len(st) - 1
    total = batch * nc * H
    dcum, xGB, dte, fac = (rng.standard_normal((batch, L, H)).astype(np.float32) for _ in range(4))
    A = -rng.uniform(0.5, 2, H).astype(np.float32)
    ddt = np.full_like(dcum, np.nan)
    pa, pb = (np.full((batch, nc, H), np.nan, np.float32) for _ in range(2))
    ptr = lambda x: x.ctypes.data_as(ctypes.c_void_p)
    lib.run_bwd_dt(ptr(dcum), ptr(xGB), ptr(A), ptr(dte), ptr(fac), ptr(st), ptr(ddt), ptr(pa),
                   ptr(pb), ctypes.c_longlong(L), ctypes.c_int(H), ctypes.c_longlong(nc),
                   ctypes.c_longlong(total), ctypes.c_uint(-(-total // 256)))
    sd = np.empty((batch, L, H))
    for c in range(nc):
        seg = dcum[:, st[c]:st[c + 1]].astype(np.float64)
        sd[:, st[c]:st[c + 1]] = np.cumsum(seg[:, ::-1], 1)[:, ::-1]
    ddt_ref = (xGB + A * sd) * fac
    pa_ref = np.stack([(dte * sd)[:, st[c]:st[c + 1]].sum(1) for c in range(nc)], 1)
    pb_ref = np.stack([ddt_ref[:, st[c]:st[c + 1]].sum(1) for c in range(nc)], 1)
    ok = all(bool(np.allclose(a, r, rtol=1e-4, atol=1e-4))
             for a, r in ((ddt, ddt_ref), (pa, pa_ref), (pb, pb_ref)))
    allok &= ok
    print(f"bwd_dt batch {batch} L {L} H {H} chunk {Q} ends {ends}: {'OK' if ok else 'FAIL'}")
print("ALL OK" if allok else "SOME FAILED")
sys.exit(0 if allok else 1)
