"""A prototype of the decoding step with a warp per run of channels and the state read through
a ring of shared-memory slots (16-byte cp.async, AHEAD chunks ahead), timed against the
library's kernel and the plain in-place copy in the same run. bfloat16 state and inputs,
Mamba-2 peer shape (batch 64, H 80, P 64, N 128, one group, per-head dt / A / D / dt_bias,
dt_softplus, no z).

A chunk is two channels (2 x 128 states x 2 bytes = 512 bytes: 16 bytes per lane); lane l
holds states 8 (l % 16) .. + 7 of channel 2k + l / 16 of chunk k. Each lane copies its own
16 bytes and reads back only those, so waiting for its own copies is all the ordering needed.
B and C (the lane's 8 values of each), dt', the decay and the run's x stay in registers.

    python3 benchmarks/su_warp_ring.py [--out FILE]

VARIANTS holds the last sweep's variants; the earlier sweeps (channels per warp, chunks ahead,
register bounds, block sizes) and their results are in benchmarks/STATE_UPDATE.md and
results/su_warp/. The library's kernel, ssm_state_update_warp, grew out of this one.

Prints one row per variant (channels per warp, chunks ahead, blocks per SM the register bound
must allow (1: none), B and C kept as 16-bit pairs, threads per block, evict-first stores):
kernel ms, fraction of the copy bandwidth, errors of y and the state against a float32 step
in CuPy.
"""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench_state_update import (compulsory_bytes, f32_step, inplace_ceiling_ms,  # noqa: E402
                                make_inputs, rel)
from timing import copy_tbps, cuda_median_ms  # noqa: E402

SOURCE = r"""
typedef unsigned short bf16_t;
__device__ __forceinline__ float bf_lo(unsigned w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf_hi(unsigned w) { return __uint_as_float(w & 0xffff0000u); }
__device__ __forceinline__ float bf_ld(const bf16_t* p) { return __uint_as_float(((unsigned)*p) << 16); }
__device__ __forceinline__ unsigned bf_pack(float lo, float hi) {
    unsigned r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
__device__ __forceinline__ void unpack8(uint4 v, float (&f)[8]) {
    const unsigned w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) { f[2 * i] = bf_lo(w[i]); f[2 * i + 1] = bf_hi(w[i]); }
}

// A warp per run of CPW channels of one (row, head); N = 128; MINB blocks per SM (the
// register bound).
template <int CPW, int AHEAD, int MINB, bool PACKED, int THREADS = 128, bool STREAM = false>
__global__ void __launch_bounds__(THREADS, MINB) su_ring(
    bf16_t* __restrict__ state, const bf16_t* __restrict__ x, const bf16_t* __restrict__ dt,
    int dt_s0, int dt_s1, const float* __restrict__ A, int a_s, const bf16_t* __restrict__ Bm,
    const bf16_t* __restrict__ Cm, const float* __restrict__ D, int d_s,
    const float* __restrict__ dt_bias, int bias_s, bf16_t* __restrict__ y, int H, int P,
    int n_warps) {
    constexpr int N = 128, SLOTS = AHEAD + 1, NCH = CPW / 2;
    constexpr unsigned FULL = 0xffffffffu;
    constexpr int WARPS = THREADS / 32;
    __shared__ uint4 ring[WARPS][SLOTS][32];
    const int lane = threadIdx.x & 31, wi = threadIdx.x >> 5;
    const int w = blockIdx.x * WARPS + wi;
    if (w >= n_warps) return;
    const int runs = P / CPW;
    const int bh = w / runs, run = w - bh * runs;
    const int b = bh / H, h = bh - b * H;
    const long long ch0 = (long long)bh * P + run * CPW;  // the run's first channel
    bf16_t* const st = state + ch0 * N + lane * 8;         // chunk k at st + 256 k
    const unsigned sring = (unsigned)__cvta_generic_to_shared(&ring[wi][0][lane]);
    auto copy = [&](int k) {
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;"
                     : : "r"(sring + (unsigned)(k % SLOTS) * 512u), "l"(st + 256ll * k) : "memory");
    };
#pragma unroll
    for (int k = 0; k < AHEAD; ++k) {
        if (k < NCH) copy(k);
        asm volatile("cp.async.commit_group;" : : : "memory");
    }
    const int n0 = (lane & 15) * 8;
    const uint4 bw = *reinterpret_cast<const uint4*>(Bm + (long long)b * N + n0);
    const uint4 cw = *reinterpret_cast<const uint4*>(Cm + (long long)b * N + n0);
    float bv[8], cv[8];
    if (!PACKED) {
        unpack8(bw, bv);
        unpack8(cw, cv);
    }
    const float d_raw = bf_ld(dt + (long long)b * dt_s0 + (long long)h * dt_s1) + dt_bias[h * bias_s];
    const float d = d_raw <= 20.0f ? log1pf(__expf(d_raw)) : d_raw;
    const float decay = exp2f(d * A[h * a_s] * 1.4426950408889634f);
    const float dd = D[h * d_s];
    const float xa = bf_ld(x + ch0 + (lane & (CPW - 1)));
    const float xb = CPW > 32 ? bf_ld(x + ch0 + 32 + (lane & (CPW - 1) & 31)) : 0.0f;
#pragma unroll 1
    for (int k = 0; k < NCH; ++k) {
        if (k + AHEAD < NCH) copy(k + AHEAD);
        asm volatile("cp.async.commit_group;" : : : "memory");
        asm volatile("cp.async.wait_group %0;" : : "n"(AHEAD) : "memory");
        const uint4 v = ring[wi][k % SLOTS][lane];
        const int c = 2 * k + (lane >> 4);
        const float xs = __shfl_sync(FULL, (2 * k) >= 32 ? xb : xa, c & 31);
        const float dx = d * xs;
        float s[8];
        unpack8(v, s);
        if (PACKED) {  // B and C held as 16-bit pairs (8 registers fewer), widened per chunk
            uint4 bk = bw, ck = cw;  // (opaque here: the widening is not hoisted out of the loop)
            asm volatile("" : "+r"(bk.x), "+r"(bk.y), "+r"(bk.z), "+r"(bk.w));
            asm volatile("" : "+r"(ck.x), "+r"(ck.y), "+r"(ck.z), "+r"(ck.w));
            unpack8(bk, bv);
            unpack8(ck, cv);
        }
        float acc = 0.0f;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            s[j] = fmaf(s[j], decay, dx * bv[j]);
            acc = fmaf(s[j], cv[j], acc);
        }
        uint4 o;
        o.x = bf_pack(s[0], s[1]); o.y = bf_pack(s[2], s[3]);
        o.z = bf_pack(s[4], s[5]); o.w = bf_pack(s[6], s[7]);
        if (STREAM)  // evict-first in L2: the state is not read again by this step
            asm volatile("st.global.cs.v4.u32 [%0], {%1, %2, %3, %4};"
                         : : "l"(st + 256ll * k), "r"(o.x), "r"(o.y), "r"(o.z), "r"(o.w) : "memory");
        else
            *reinterpret_cast<uint4*>(st + 256ll * k) = o;
#pragma unroll
        for (int m = 8; m >= 1; m >>= 1) acc += __shfl_xor_sync(FULL, acc, m);
        if ((lane & 15) == 0) {
            const float out = acc + dd * xs;
            y[ch0 + c] = (bf16_t)(bf_pack(out, 0.0f) & 0xffffu);
        }
    }
}
"""

VARIANTS = [(cpw, 4, 1, "false", threads, stream) for cpw in (8, 16) for threads in (128, 256)
            for stream in ("false", "true")]


def main(out=None):
    import cupy as cp

    import ssmkit
    from ssmkit import _state_update
    from ssmkit._gpu import state_update as gsu

    batch, H, P, N = 64, 80, 64, 128
    a = make_inputs(cp, 2, "bfloat16", "bfloat16", batch, H, P, N)
    state0 = a["state"].copy()
    y_want, s_want = f32_step(cp, a)
    args = {k: v for k, v in a.items() if k != "state"}
    nbytes = compulsory_bytes(2, "bfloat16", "bfloat16", batch, H, P, N)
    bw = copy_tbps()
    rows = []

    def frac(ms):
        return round(nbytes / (ms * 1e-3) / 1e12 / bw, 3)

    # the library's kernel
    p, _ = _state_update._prepare(a["state"], args["x"], args["dt"], args["A"], args["B"],
                                  args["C"], args["D"], None, args["dt_bias"], True, None)
    kernel, launches, block, finish = gsu.launch_args(p)
    (grid, kargs), = launches
    lib_ms = cuda_median_ms(lambda: kernel(grid, block, kargs), calls=20)
    a["state"][...] = state0
    y = ssmkit.state_update(a["state"], **args, dt_softplus=True)
    rows.append(dict(variant="library", ms=round(lib_ms, 5), of_copy=frac(lib_ms),
                     err_y=rel(y, y_want), err_state=rel(a["state"], s_want)))
    ceiling = inplace_ceiling_ms(cp, 2 * batch * H * P * N)
    rows.append(dict(variant="in-place copy", ms=round(ceiling, 5), of_copy=frac(ceiling)))

    module = cp.RawModule(code=SOURCE, options=("-std=c++17",),
                          name_expressions=[f"su_ring<{c}, {k}, {m}, {q}, {t}, {u}>" for c, k, m, q, t, u in VARIANTS])
    xb = args["x"]
    dt = args["dt"]  # (batch, H, P) view with a zero last stride: dt[b, h, 0]
    A = args["A"]
    for cpw, ahead, minb, packed, threads, stream in VARIANTS:
        fn = module.get_function(f"su_ring<{cpw}, {ahead}, {minb}, {packed}, {threads}, {stream}>")
        n_warps = batch * H * (P // cpw)
        yk = cp.empty((batch, H, P), dtype=xb.dtype)
        i32 = np.int32
        kargs = (a["state"], xb, dt, i32(dt.strides[0] // 2), i32(dt.strides[1] // 2), A,
                 i32(A.strides[0] // 4), args["B"], args["C"], args["D"],
                 i32(args["D"].strides[0] // 4), args["dt_bias"],
                 i32(args["dt_bias"].strides[0] // 4), yk, i32(H), i32(P), i32(n_warps))
        g = (-(-n_warps // (threads // 32)),)
        a["state"][...] = state0
        fn(g, (threads,), kargs)
        err_y, err_s = rel(yk, y_want), rel(a["state"], s_want)
        ms = cuda_median_ms(lambda: fn(g, (threads,), kargs), calls=20)
        rows.append(dict(variant=f"ring cpw={cpw} ahead={ahead} minb={minb} packed={packed} threads={threads} stream={stream}", ms=round(ms, 5),
                         of_copy=frac(ms), err_y=err_y, err_state=err_s))
    for r in rows:
        print(json.dumps(r))
    print(f"copy {bw:.3f} TB/s; bytes {nbytes / 1e6:.1f} MB")
    if out:
        with open(out, "w") as f:
            json.dump(dict(copy_tbps=bw, rows=rows), f, indent=1)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    main(ap.parse_args().out)
