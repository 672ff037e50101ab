// ssm_common.cuh: pieces shared by ssmkit's CUDA kernels.
//
// Self-contained on purpose: no CUDA header is included, so NVRTC compiles the
// sources with no include path at all (CuPy at run time, ssmkit._nvrtc_check in
// CI). The host side (ssmkit/_gpu/compiler.py) pastes this file in place of the
// `#include "ssm_common.cuh"` line; nvcc finds it beside the .cu file.
#pragma once

typedef long long ssm_i64;

// ---------------------------------------------------------------------------
// 16-bit storage types. Only their bits are stored; arithmetic is in float.
// ---------------------------------------------------------------------------
struct ssm_half { unsigned short bits; };  // IEEE binary16
struct ssm_bf16 { unsigned short bits; };  // bfloat16 (upper half of a float)

template <typename T> struct ssm_compute_of { typedef float type; };
template <> struct ssm_compute_of<double> { typedef double type; };

template <typename A, typename B> struct ssm_same { static constexpr bool value = false; };
template <typename A> struct ssm_same<A, A> { static constexpr bool value = true; };

__device__ __forceinline__ float ssm_bits_to_float(unsigned int u) {
    float f;
    asm("mov.b32 %0, %1;" : "=f"(f) : "r"(u));
    return f;
}

// Widen a stored value to its compute type.
__device__ __forceinline__ float ssm_load(const ssm_half& x) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x.bits));
    return f;
}
__device__ __forceinline__ float ssm_load(const ssm_bf16& x) {
    return ssm_bits_to_float(((unsigned int)x.bits) << 16);  // exact
}
__device__ __forceinline__ float ssm_load(const float& x) { return x; }
__device__ __forceinline__ double ssm_load(const double& x) { return x; }

// Narrow a compute value to its storage type (round to nearest even).
__device__ __forceinline__ void ssm_store(ssm_half* p, float v) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
    p->bits = h;
}
__device__ __forceinline__ void ssm_store(ssm_bf16* p, float v) {
    unsigned short h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(v));
    p->bits = h;
}
__device__ __forceinline__ void ssm_store(float* p, float v) { *p = v; }
__device__ __forceinline__ void ssm_store(double* p, double v) { *p = v; }

// ---------------------------------------------------------------------------
// Math in the compute type. In float the decay exp(dt*A) is one hardware
// exp2: A is pre-scaled by log2(e) once, so the hot loop computes
// ex2(dt * A2) with A2 = A*log2(e); sums of q*A2 are scaled back by ln(2).
// In double everything is the libm function and the scales are 1.
// ---------------------------------------------------------------------------
template <typename T> struct ssm_math;

template <> struct ssm_math<float> {
    static constexpr float kLog2e = 1.4426950408889634f;
    static constexpr float kLn2 = 0.6931471805599453f;
    // 2^x; flushes results below 2^-126 to 0 (a decay that small is 0 anyway).
    static __device__ __forceinline__ float decay(float x) {
        float r;
        asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
        return r;
    }
    static __device__ __forceinline__ float softplus(float x) {
        return x <= 20.0f ? log1pf(expf(x)) : x;
    }
    static __device__ __forceinline__ float sigmoid(float x) {
        return 1.0f / (1.0f + expf(-x));
    }
    // The same two from the hardware approximations (a few units in the last place, or
    // about 2e-6 relative in softplus for x near -2; no branch, about a third of the
    // instructions of expf and log1pf). sigmoid_fast: 1 / (1 + 2^(-x log2 e)); below
    // about x = -88 the power overflows and the result is 0 (instead of below 1e-38).
    // softplus_fast: x above 20; else log(1 + e), e = 2^(x log2 e), by its series to e^7
    // for e < 1/8 (relative error below 1e-7) and by ln 2 lg2(1 + e) above.
    static __device__ __forceinline__ float ex2_fast(float x) { return decay(x); }
    static __device__ __forceinline__ float rcp_fast(float x) {
        float r;
        asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
        return r;
    }
    static __device__ __forceinline__ float lg2_fast(float x) {
        float r;
        asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
        return r;
    }
    static __device__ __forceinline__ float sigmoid_fast(float x) {
        return rcp_fast(1.0f + ex2_fast(x * -kLog2e));
    }
    static __device__ __forceinline__ float softplus_fast(float x) {
        const float e = ex2_fast(x * kLog2e);
        float p = -1.0f / 8.0f;  // log(1 + e) = e (1 - e/2 + e^2/3 - ... + e^6/7 ...)
        p = p * e + 1.0f / 7.0f;
        p = p * e - 1.0f / 6.0f;
        p = p * e + 1.0f / 5.0f;
        p = p * e - 1.0f / 4.0f;
        p = p * e + 1.0f / 3.0f;
        p = p * e - 1.0f / 2.0f;
        p = p * e + 1.0f;
        const float r = e < 0.125f ? p * e : kLn2 * lg2_fast(1.0f + e);
        return x <= 20.0f ? r : x;
    }
    // softplus_grad from the same approximations (x <= 20).
    static __device__ __forceinline__ void softplus_grad_fast(float x, float& sp, float& dsp) {
        sp = softplus_fast(x);
        dsp = sigmoid_fast(x);
    }
    // softplus(x) and its derivative sigmoid(x), for x <= 20, from one exp.
    static __device__ __forceinline__ void softplus_grad(float x, float& sp, float& dsp) {
        const float e = expf(x);
        sp = log1pf(e);
        dsp = e / (1.0f + e);
    }
};

template <> struct ssm_math<double> {
    static constexpr double kLog2e = 1.0;
    static constexpr double kLn2 = 1.0;
    static __device__ __forceinline__ double decay(double x) { return exp(x); }
    static __device__ __forceinline__ double softplus(double x) {
        return x <= 20.0 ? log1p(exp(x)) : x;
    }
    static __device__ __forceinline__ double sigmoid(double x) {
        return 1.0 / (1.0 + exp(-x));
    }
    static __device__ __forceinline__ void softplus_grad(double x, double& sp, double& dsp) {
        const double e = exp(x);
        sp = log1p(e);
        dsp = e / (1.0 + e);
    }
    // In double the "fast" forms are the exact ones (the kernels call them for any type).
    static __device__ __forceinline__ double sigmoid_fast(double x) { return sigmoid(x); }
    static __device__ __forceinline__ void softplus_grad_fast(double x, double& sp, double& dsp) {
        softplus_grad(x, sp, dsp);
    }
    static __device__ __forceinline__ double softplus_fast(double x) { return softplus(x); }
};

// ---------------------------------------------------------------------------
// Vector moves of 4 compute values between registers and 16-byte aligned
// shared memory (one 128-bit access for float, two for double).
// ---------------------------------------------------------------------------
struct alignas(16) ssm_f4 { float v[4]; };
struct alignas(16) ssm_d2 { double v[2]; };

__device__ __forceinline__ void ssm_ld4(float* r, const float* p) {
    const ssm_f4 t = *reinterpret_cast<const ssm_f4*>(p);
    r[0] = t.v[0]; r[1] = t.v[1]; r[2] = t.v[2]; r[3] = t.v[3];
}
__device__ __forceinline__ void ssm_ld4(double* r, const double* p) {
    const ssm_d2 a = reinterpret_cast<const ssm_d2*>(p)[0];
    const ssm_d2 b = reinterpret_cast<const ssm_d2*>(p)[1];
    r[0] = a.v[0]; r[1] = a.v[1]; r[2] = b.v[0]; r[3] = b.v[1];
}
__device__ __forceinline__ void ssm_st4(float* p, const float* r) {
    ssm_f4 t;
    t.v[0] = r[0]; t.v[1] = r[1]; t.v[2] = r[2]; t.v[3] = r[3];
    *reinterpret_cast<ssm_f4*>(p) = t;
}
__device__ __forceinline__ void ssm_st4(double* p, const double* r) {
    ssm_d2 a, b;
    a.v[0] = r[0]; a.v[1] = r[1]; b.v[0] = r[2]; b.v[1] = r[3];
    reinterpret_cast<ssm_d2*>(p)[0] = a;
    reinterpret_cast<ssm_d2*>(p)[1] = b;
}

// NPT consecutive values (NPT a multiple of 4) at a 16-byte aligned address.
template <int NPT, typename T>
__device__ __forceinline__ void ssm_ld_row(T (&r)[NPT], const T* p) {
    static_assert(NPT % 4 == 0, "NPT must be a multiple of 4");
#pragma unroll
    for (int i = 0; i < NPT / 4; ++i) ssm_ld4(&r[4 * i], p + 4 * i);
}
template <int NPT, typename T>
__device__ __forceinline__ void ssm_st_row(T* p, const T (&r)[NPT]) {
    static_assert(NPT % 4 == 0, "NPT must be a multiple of 4");
#pragma unroll
    for (int i = 0; i < NPT / 4; ++i) ssm_st4(p + 4 * i, &r[4 * i]);
}

// {dt, dt*u} of one (channel, step), read together by every lane of a channel.
template <typename T> struct alignas(2 * sizeof(T)) ssm_pair { T dt, du; };

// ---------------------------------------------------------------------------
// Warp reductions. All lanes named in `mask` must call these together.
// ---------------------------------------------------------------------------
__device__ __forceinline__ float ssm_shfl_xor(unsigned mask, float v, int m) {
    return __shfl_xor_sync(mask, v, m);
}
__device__ __forceinline__ double ssm_shfl_xor(unsigned mask, double v, int m) {
    return __shfl_xor_sync(mask, v, m);
}

// Sum over the K = 2*M lanes of an aligned group, in a fixed order (so the
// result is the same on every run); every lane gets the sum.
template <int M, typename T>
__device__ __forceinline__ T ssm_group_allreduce(T v, unsigned mask) {
    if constexpr (M >= 1) {
        v += ssm_shfl_xor(mask, v, M);
        return ssm_group_allreduce<M / 2>(v, mask);
    } else {
        return v;
    }
}

// Length of the slice each lane keeps after ssm_reduce_scatter<LEN, M>.
__host__ __device__ constexpr int ssm_rs_len(int len, int m) {
    return m < 1 ? len : ssm_rs_len(len % 2 == 0 ? len / 2 : len, m / 2);
}

// Reduce-scatter over the K = 2*M lanes of an aligned group (lane index s in
// [0, K)). Each lane holds a vector v[0..LEN); afterwards v[0..R) of lane s
// holds the sums over all K lanes of the entries [off, off + R) of the
// original vectors, R = ssm_rs_len(LEN, M). While the live length is even,
// each stage halves it (send one half, keep the other): K-1 shuffles per K
// values instead of log2(K) per value. Once it is odd the remaining stages
// exchange everything, and lanes that differ only in those low bits hold the
// same slice; `own` stays true on exactly one of them. STRIDE: the group's
// lanes are STRIDE apart (lane = s * STRIDE + fixed low bits), so one warp
// holds STRIDE interleaved groups.
template <int LEN, int M, int STRIDE = 1>
struct ssm_reduce_scatter {
    template <typename T, int V>
    static __device__ __forceinline__ void run(T (&v)[V], int s, unsigned mask,
                                               int& off, bool& own) {
        if constexpr (M >= 1) {
            if constexpr (LEN % 2 == 0) {
                constexpr int H = LEN / 2;
                const bool up = (s & M) != 0;  // this lane keeps the upper half
#pragma unroll
                for (int i = 0; i < H; ++i) {
                    const T send = up ? v[i] : v[i + H];
                    const T keep = up ? v[i + H] : v[i];
                    v[i] = keep + ssm_shfl_xor(mask, send, M * STRIDE);
                }
                if (up) off += H;
                ssm_reduce_scatter<H, M / 2, STRIDE>::run(v, s, mask, off, own);
            } else {
#pragma unroll
                for (int i = 0; i < LEN; ++i) v[i] += ssm_shfl_xor(mask, v[i], M * STRIDE);
                if (s & M) own = false;
                ssm_reduce_scatter<LEN, M / 2, STRIDE>::run(v, s, mask, off, own);
            }
        }
    }
};

// ---------------------------------------------------------------------------
// Small helpers.
// ---------------------------------------------------------------------------
__host__ __device__ constexpr int ssm_round_up(int x, int m) { return (x + m - 1) / m * m; }

// Dynamic shared memory given to this launch (bytes).
__device__ __forceinline__ unsigned ssm_dynamic_smem_bytes() {
    unsigned r;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(r));
    return r;
}

// threadIdx.x and blockIdx.x read afresh (volatile: not merged with earlier
// reads). Offsets needed only at a kernel's end are recomputed from these
// rather than kept live through the whole kernel, where ptxas tends to park
// such values in local memory.
__device__ __forceinline__ int ssm_fresh_tid() {
    int r;
    asm volatile("mov.u32 %0, %%tid.x;" : "=r"(r));
    return r;
}
__device__ __forceinline__ int ssm_fresh_ctaid() {
    int r;
    asm volatile("mov.u32 %0, %%ctaid.x;" : "=r"(r));
    return r;
}

// Ask L2 to fetch the 128-byte line holding *p (a hint: no register, no wait,
// no fault). Used to pull the next tile toward the SM while the current one is
// scanned, so that staging it later waits on L2 rather than on DRAM.
__device__ __forceinline__ void ssm_prefetch_l2(const void* p) {
    asm volatile("prefetch.global.L2 [%0];" : : "l"(p));
}

// Prefetch rows [0, nrows) of `len` elements each (row r at base + r * stride)
// into L2, spread over the nthr threads of a block (thread tid). Only
// addresses inside the rows are touched: every 128-byte stride of a row and
// its last element (a row need not start on a line).
template <typename T>
__device__ __forceinline__ void ssm_prefetch_rows(const T* base, ssm_i64 stride, int nrows, int len,
                                                  int tid, int nthr) {
    constexpr int E = 128 / sizeof(T) > 0 ? 128 / (int)sizeof(T) : 1;  // elements per line
    if (len <= 0) return;
    const int per_row = (len + E - 1) / E + 1;
#pragma unroll 1
    for (int i = tid; i < nrows * per_row; i += nthr) {
        const int r = i / per_row;
        const int j = i - r * per_row;
        const int off = j * E < len ? j * E : len - 1;
        ssm_prefetch_l2(base + (ssm_i64)r * stride + off);
    }
}

// Lanes that exist in this thread's warp (blocks smaller than a warp have one
// partial warp; block sizes are powers of two).
__device__ __forceinline__ unsigned ssm_warp_mask(int nthreads) {
    return nthreads >= 32 ? 0xffffffffu : ((1u << nthreads) - 1u);
}

// Lanes that walk consecutive steps when a block stages a tile (rows of W lanes, nthr / W rows
// at once): a warp's worth, but no more than the tile's steps, so the short tiles of large N
// keep every thread loading instead of leaving most of each warp idle. A power of two <= nthr
// (itself a power of two), so W divides nthr.
__device__ __forceinline__ int ssm_stage_width(int nthr, int TL) {
    int w = 1;
    while (w < TL && w < 32 && w < nthr) w *= 2;
    return w;
}

// ---------------------------------------------------------------------------
// Asynchronous copies global -> shared.
// ---------------------------------------------------------------------------
// Shared-window address of a pointer into shared memory (cp.async and the bulk copies take it).
__device__ __forceinline__ unsigned int ssm_smem_addr(const void* p) {
    return (unsigned int)__cvta_generic_to_shared(p);
}

struct alignas(16) ssm_v16 { unsigned int w[4]; };
struct alignas(8) ssm_v8 { unsigned int w[2]; };

// cp.async (sm_80): each thread's copies complete in the background, in groups;
// ssm_cp_commit closes the group of the copies issued since the last one, ssm_cp_wait<N>
// waits until at most N of the thread's groups are in flight, and a barrier then makes the
// landed copies the block's. ssm_cp_async falls back to plain copies before sm_80 or with
// SSM_NO_CP_ASYNC; the zero-filling 16-byte copy exists from sm_80 only (its kernels need
// sm_80's mma anyway).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define SSM_CP_ASYNC_ARCH 1
#else
#define SSM_CP_ASYNC_ARCH 0
#endif
#if SSM_CP_ASYNC_ARCH && !defined(SSM_NO_CP_ASYNC)
#define SSM_CP_ASYNC 1
#else
#define SSM_CP_ASYNC 0
#endif

// Copy BYTES (16: both addresses 16-byte aligned, through L2 only; 8 or 4: aligned to
// their size) from global src to shared dst.
template <int BYTES>
__device__ __forceinline__ void ssm_cp_async(void* dst, const void* src) {
    static_assert(BYTES == 4 || BYTES == 8 || BYTES == 16, "cp.async moves 4, 8 or 16 bytes");
#if SSM_CP_ASYNC
    if constexpr (BYTES == 16) {
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" : : "r"(ssm_smem_addr(dst)), "l"(src) : "memory");
    } else {
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2;" : : "r"(ssm_smem_addr(dst)), "l"(src), "n"(BYTES) : "memory");
    }
#else
    if constexpr (BYTES == 16) *static_cast<ssm_v16*>(dst) = *static_cast<const ssm_v16*>(src);
    else if constexpr (BYTES == 8) *static_cast<ssm_v8*>(dst) = *static_cast<const ssm_v8*>(src);
    else *static_cast<unsigned int*>(dst) = *static_cast<const unsigned int*>(src);
#endif
}

// 16 bytes from global src to the shared-window address dst (both 16-byte aligned); zeros,
// nothing read, when !live.
__device__ __forceinline__ void ssm_cp_async16_zfill(unsigned int dst, const void* src, bool live) {
#if SSM_CP_ASYNC_ARCH
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"
                 : : "r"(dst), "l"(src), "r"(live ? 16 : 0) : "memory");
#else
    (void)dst; (void)src; (void)live;
    __trap();
#endif
}

__device__ __forceinline__ void ssm_cp_commit() {
#if SSM_CP_ASYNC_ARCH
    asm volatile("cp.async.commit_group;" : : : "memory");
#endif
}

template <int PENDING>
__device__ __forceinline__ void ssm_cp_wait() {
#if SSM_CP_ASYNC_ARCH
    asm volatile("cp.async.wait_group %0;" : : "n"(PENDING) : "memory");
#endif
}

// Every copy of this thread (other threads' copies are visible only after their wait and a
// barrier).
__device__ __forceinline__ void ssm_cp_wait_all() { ssm_cp_wait<0>(); }

// ---------------------------------------------------------------------------
// Bulk asynchronous copies global -> shared (sm_90's cp.async.bulk, completing on an
// mbarrier): one thread moves a whole tile, the bytes in flight cost no registers. Before
// sm_90 the same calls copy with the whole block at the wait.
// ---------------------------------------------------------------------------

// One thread: make `bar` a barrier of one arrival (plus the copies' bytes), visible to the
// copy engine; the block synchronises before waiting on it.
__device__ __forceinline__ void ssm_bulk_bar_init(unsigned long long* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" : : "r"(ssm_smem_addr(bar)) : "memory");
    asm volatile("fence.proxy.async.shared::cta;" : : : "memory");
#else
    (void)bar;
#endif
}

// One thread: tell `bar` that `bytes` are coming (the total of the copies it waits for,
// issued after this call) and arrive on it.
__device__ __forceinline__ void ssm_bulk_expect(unsigned long long* bar, unsigned int bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                 : : "r"(ssm_smem_addr(bar)), "r"(bytes) : "memory");
#else
    (void)bar; (void)bytes;
#endif
}

// One thread: start copying `bytes` (a multiple of 16) from global `src` to shared `dst`
// (both 16-byte aligned), completing on `bar`. Before sm_90: nothing (ssm_bulk_wait copies).
__device__ __forceinline__ void ssm_bulk_copy(void* dst, const void* src, unsigned int bytes,
                                              unsigned long long* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 : : "r"(ssm_smem_addr(dst)), "l"(src), "r"(bytes), "r"(ssm_smem_addr(bar)) : "memory");
#else
    (void)dst; (void)src; (void)bytes; (void)bar;
#endif
}

// Every thread: wait until the copies on `bar` (its first phase) have landed. Before sm_90
// the block copies the `bytes` from `src` to `dst` here instead (and meets at a barrier):
// one wait per copy there.
__device__ __forceinline__ void ssm_bulk_wait(unsigned long long* bar, void* dst, const void* src,
                                              unsigned int bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    (void)dst; (void)src; (void)bytes;
    const unsigned int b = ssm_smem_addr(bar);
    unsigned int done;
    do {
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0; selp.u32 %0, 1, 0, p; }"
                     : "=r"(done) : "r"(b) : "memory");
    } while (!done);
#else
    (void)bar;
    for (unsigned int j = threadIdx.x; j < bytes / 16; j += blockDim.x)
        static_cast<ssm_v16*>(dst)[j] = static_cast<const ssm_v16*>(src)[j];
    __syncthreads();
#endif
}

// ---------------------------------------------------------------------------
// The row kernels' opening, the counterpart of ssm_warp_partials_sum: the block's steps
// [s0, s1) (steps_per_block of them from blockIdx.x's, cut at steps), and per lane
// Dv[k] = D[h, lane + 32 k] (0 past P, or without D) and its partial sums dd[k] = 0.
// ---------------------------------------------------------------------------
template <typename CT, int VALUES>
__device__ __forceinline__ void ssm_row_block_start(ssm_i64& s0, ssm_i64& s1, CT (&Dv)[VALUES], CT (&dd)[VALUES],
                                                    const CT* __restrict__ D, int h, int P, ssm_i64 steps,
                                                    int steps_per_block) {
    const int lane = threadIdx.x & 31;
    s0 = (ssm_i64)blockIdx.x * steps_per_block;
    s1 = s0 + steps_per_block < steps ? s0 + steps_per_block : steps;
#pragma unroll
    for (int k = 0; k < VALUES; ++k) {
        const int p = lane + 32 * k;
        Dv[k] = D && p < P ? D[(ssm_i64)h * P + p] : CT(0);
        dd[k] = CT(0);
    }
}

// ---------------------------------------------------------------------------
// A block's per-column sums of its warps' partials, in warp order (deterministic): lane l
// of warp w holds part[k] for column l + 32 k; out[p] = sum over w of those of column p, for
// p < P. Every thread of the block calls it (it has a barrier); sh is the block's
// WARPS x 32 VALUES shared scratch.
// ---------------------------------------------------------------------------
template <typename CT, int WARPS, int VALUES>
__device__ __forceinline__ void ssm_warp_partials_sum(CT (&sh)[WARPS][32 * VALUES],
                                                      const CT (&part)[VALUES],
                                                      CT* __restrict__ out, int P) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
    for (int k = 0; k < VALUES; ++k) sh[warp][lane + 32 * k] = part[k];
    __syncthreads();
    for (int p = threadIdx.x; p < P; p += 32 * WARPS) {
        CT v = 0;
#pragma unroll
        for (int w = 0; w < WARPS; ++w) v += sh[w][p];
        out[p] = v;
    }
}

// ---------------------------------------------------------------------------
// Tensor cores (sm_80+): D += A B for one warp, mma.sync m16n8k16 with 16-bit A and B
// and float32 accumulators, in the PTX ISA fragment layout (g = lane / 4, t = lane % 4):
// a0 = A[g][2t..2t+1], a1 = A[g+8][2t..], a2 = A[g][2t+8..], a3 = A[g+8][2t+8..];
// b0 = B[2t..2t+1][g], b1 = B[2t+8..2t+9][g]; d0, d1 = D[g][2t..2t+1], d2, d3 = D[g+8][..];
// the lower index in the low half of a register.
// ---------------------------------------------------------------------------
template <typename T> struct ssm_mma16;
template <> struct ssm_mma16<ssm_bf16> {
    static __device__ __forceinline__ void run(float (&d)[4], const unsigned (&a)[4],
                                               unsigned b0, unsigned b1) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
            "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};
template <> struct ssm_mma16<ssm_half> {
    static __device__ __forceinline__ void run(float (&d)[4], const unsigned (&a)[4],
                                               unsigned b0, unsigned b1) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
            "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};

// ---------------------------------------------------------------------------
// mma accumulators: NT D tiles of 16 x 8 per warp (float32), set to zero.
// ---------------------------------------------------------------------------
template <int NT>
__device__ __forceinline__ void ssm_mma_zero(float (&acc)[NT][4]) {
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[j][i] = 0.0f;
}
