"""Host check of ssd.cu's ssd_chunk_cumsum (the chunk prefix and suffix sums) and ssd_bwd_dt
(the backward's ddt and its per-chunk sums): the kernel text compiled for the host (g++,
AddressSanitizer), one thread at a time, against NumPy on chunk boundaries from ssmkit's own
chunk_starts (regular chunks, sequence ends, length 1, chunks shorter and longer than the
unrolled group of loads). The layout pass ssd_chunk_dt, whose warps share a barrier, is
checked by run_emu_mm.py.

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
m3 = re.search(r"template <typename CT>\n__global__ void __launch_bounds__\(SSD_THREADS\)\n"
               r"ssd_bwd_dt\(.*?\n}\n", src, re.S)
assert m and m3, "ssd_chunk_cumsum or ssd_bwd_dt not found"
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
''' + m.group(0) + m3.group(0) + r'''
extern "C" void run(const float* a, float* out, const ssm_i64* starts, ssm_i64 L, int H,
                    ssm_i64 nc, ssm_i64 total, int reverse, unsigned blocks) {
    for (unsigned bx = 0; bx < blocks; ++bx)
        for (unsigned t = 0; t < SSD_THREADS; ++t) {
            blockIdx.x = bx; threadIdx.x = t;
            ssd_chunk_cumsum<float>(a, out, starts, L, H, nc, total, reverse);
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
