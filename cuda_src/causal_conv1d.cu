// causal_conv1d.cu: depthwise causal convolution over time, its backward, and decoding steps.
//
// y[b, d, t] = bias[d] + sum_k w[d, k] * xpad[b, d, t + k]  (then silu), where xpad is x
// preceded by the W-1 values of the initial state. With seq_idx, an input of another
// sequence than step t counts as zero; the initial state belongs to the first sequence.
//
// Layout: x, y, dy, dx are (batch, dim, L), time contiguous. An item is one time tile of
// one channel row (b, d); items are numbered rows x tiles, tile fastest. Every global access
// of the tile body is a 16-byte vector (when L and the pointers allow it). Thread `tid` owns
// vectors v*THREADS + tid (v < cc1d_shape<T>::VPT) of the tile, so that each warp-wide
// access is one contiguous 512-byte run, and keeps them in registers.
//
// Grid: at most one resident wave of blocks (the host sizes it from the kernel's registers);
// block i works on items i, i + gridDim.x, ... and reads the next item's vectors (and its
// few scalars: taps, bias, the steps at the tile's edges) into registers before it computes
// the current one (CC1D_PREFETCH). With one item per block, as before, a block's loads and
// its arithmetic alternate, and bfloat16, which does twice the arithmetic per byte of
// float32, stayed at 0.64-0.78 (forward) and 0.40-0.59 (backward) of copy bandwidth while
// float32 reached 0.90-0.97; the working explanation, which the benchmark's A/B columns
// test, is that too few loads were in flight per SM while the blocks computed.
// 16-bit vectors stay packed in registers until used (four registers per prefetched vector).
//
// Kernel design and instruction counts. The W-1 neighbours a step needs from the steps
// before it (forward) or after it (backward) come from the registers of the lanes below
// (above) through warp shuffles; only the H = W-1 steps at each warp chunk's edge go through
// shared memory (a few words per chunk, one __syncthreads; the backward has a second one for
// the edges of g and a third for the weight-gradient partials). silu and silu' use
// ex2.approx and rcp.approx in float. Static SASS
// instructions per element of the 16-byte-vector path (nvcc 13.0, sm_90, W=4, bias+silu, no
// seq_idx; the scalar fallback and the final-state-cotangent block removed, the per-thread
// setup divided over the thread's VPT*E elements):
//                    before (tile staged in smem, expf + divide)   after
//   float32  fwd / bwd              51 / 103                       25 / 47
//   bfloat16 fwd / bwd              51 /  97                       25 / 49
// (these counts predate the item loop and the read-ahead).
// The arithmetic left per element: W FFMA + 5 (silu) forward; 3W FFMA + 8 (silu', dbias)
// backward, plus about one shuffle per neighbour and vector.
//
// Template parameters: T the storage type (ssm_half, ssm_bf16, float, double; arithmetic in
// float, or double for double), W the width (1..8, compile time: the taps live in
// registers), and the flags HAS_BIAS, SILU, HAS_SEQ, so the hot loops carry no branch.
//
// Determinism: the backward writes per-item partial sums of dweight and dbias (reduced
// inside the block by a fixed reduce-scatter tree per warp and then over warps in order);
// cc1d_wsum adds them over batch and tiles in a fixed order. No atomics: every result
// repeats bit for bit, and does not depend on the grid size.
#include "ssm_common.cuh"

// Threads per block, and 16-byte vectors per thread per tile: 4 for 4-byte storage
// (float32 measured 0.79 / 0.96 of copy bandwidth forward / backward with 4 against
// 0.69 / 0.79 with 2), 2 for the others (the best bfloat16 shape measured; both with the
// earlier kernel that staged the whole tile in shared memory). The host
// (ssmkit/_gpu/causal_conv1d.py) assumes these values; the benchmark overrides them
// with -D to time other tile shapes.
#ifndef CC1D_THREADS
#define CC1D_THREADS 128
#endif

static_assert(CC1D_THREADS % 32 == 0, "whole warps: the neighbour shuffles use every lane");

// Software pipelining, off by default: with CC1D_PREFETCH=1 a block reads the next item's
// inputs into registers before it works on the current one, so that its loads overlap its
// arithmetic. Measured on the H200 it was slower in every case (float32 forward 0.82-0.94 of
// copy against 0.98-1.05 without it, bfloat16 0.60-0.73 against 0.75-0.88: the extra
// registers cost more resident warps than the overlap gains), so each item's inputs are
// read when its turn comes; kept for A/B timing (benchmarks/bench_causal_conv1d.py).
#ifndef CC1D_PREFETCH
#define CC1D_PREFETCH 0
#endif

template <typename T> struct alignas(16) cc1d_vec { T v[16 / sizeof(T)]; };

template <typename T> struct cc1d_shape {
    static constexpr int E = 16 / (int)sizeof(T);  // elements per vector
#ifdef CC1D_VPT
    static constexpr int VPT = CC1D_VPT;
#else
    static constexpr int VPT = sizeof(T) == 4 ? 4 : 2;
#endif
    static constexpr int TILE = CC1D_THREADS * VPT * E;  // steps per block
    // Blocks walk several items, reading the next one ahead (CC1D_PREFETCH above). Not for
    // double, which has no speed target and where the loop made ptxas spill a few bytes
    // (cc1d_bwd<double, 4, true, true, true>, <double, 3, false, true, true>): there a
    // block does the one item blockIdx.x, and the host launches one block per item.
    static constexpr bool WALK = sizeof(T) <= 4;
    static constexpr bool PREFETCH = CC1D_PREFETCH != 0 && WALK;
};

// 16 bytes of compute registers as the four 32-bit words of their storage type (rounded to
// nearest even), for one 128-bit store: nvcc splits a store of the cc1d_vec aggregate.
template <typename T> struct cc1d_pack;
template <> struct cc1d_pack<float> {
    static __device__ __forceinline__ void run(const float (&r)[4], unsigned (&w)[4]) {
#pragma unroll
        for (int i = 0; i < 4; ++i) asm("mov.b32 %0, %1;" : "=r"(w[i]) : "f"(r[i]));
    }
};
template <> struct cc1d_pack<double> {
    static __device__ __forceinline__ void run(const double (&r)[2], unsigned (&w)[4]) {
#pragma unroll
        for (int i = 0; i < 2; ++i)
            asm("mov.b64 {%0, %1}, %2;" : "=r"(w[2 * i]), "=r"(w[2 * i + 1]) : "d"(r[i]));
    }
};
template <> struct cc1d_pack<ssm_half> {  // element 2i in the low half of word i
    static __device__ __forceinline__ void run(const float (&r)[8], unsigned (&w)[4]) {
#pragma unroll
        for (int i = 0; i < 4; ++i)
            asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(w[i]) : "f"(r[2 * i + 1]), "f"(r[2 * i]));
    }
};
template <> struct cc1d_pack<ssm_bf16> {
    static __device__ __forceinline__ void run(const float (&r)[8], unsigned (&w)[4]) {
#pragma unroll
        for (int i = 0; i < 4; ++i)
            asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(w[i]) : "f"(r[2 * i + 1]), "f"(r[2 * i]));
    }
};

// Compute registers into elements [t, t + E) of a row; nothing past L.
template <typename T, typename CT, int E>
__device__ __forceinline__ void cc1d_store(T* __restrict__ row, ssm_i64 t, ssm_i64 L,
                                           bool vec_ok, const CT (&r)[E]) {
    if (vec_ok && t + E <= L) {
        unsigned w[4];
        cc1d_pack<T>::run(r, w);
        asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};"
                     :: "l"(row + t), "r"(w[0]), "r"(w[1]), "r"(w[2]), "r"(w[3]) : "memory");
    } else {
#pragma unroll
        for (int i = 0; i < E; ++i)
            if (t + i < L) ssm_store(row + t + i, r[i]);
    }
}

// silu and its derivative d silu(z) / dz = s (1 + z (1 - s)), s = sigmoid(z). In float
// the sigmoid is 1 / (1 + 2^(-z log2 e)) from the hardware approximations ex2.approx and
// rcp.approx (a few units in the last place; a full-precision expf and IEEE divide cost
// about 30 instructions per element). For z below about -88, 2^(-z log2 e) overflows to
// +inf and s to 0: silu(z) is then 0 instead of a value below 1e-36.
template <typename CT> struct cc1d_act;
template <> struct cc1d_act<float> {
    static __device__ __forceinline__ float sigmoid(float z) { return ssm_math<float>::sigmoid_fast(z); }
    static __device__ __forceinline__ float silu(float z) { return z * sigmoid(z); }
    static __device__ __forceinline__ float dsilu(float z) {
        const float s = sigmoid(z);
        return s * (1.0f + z * (1.0f - s));
    }
};
template <> struct cc1d_act<double> {
    // 1 / (1 + exp(-z)) with the reciprocal from rcp.approx refined by two Newton steps (to
    // about an ulp; the IEEE divide's slow-path call made the NVRTC 12 ptxas spill in
    // cc1d_fwd<double, 8, false, true, false>). exp's argument is capped at 700 so that the denominator stays finite.
    static __device__ __forceinline__ double sigmoid(double z) {
        const double d = 1.0 + exp(fmin(-z, 700.0));
        double r;
        asm("rcp.approx.ftz.f64 %0, %1;" : "=d"(r) : "d"(d));
        r = fma(r, fma(-d, r, 1.0), r);
        r = fma(r, fma(-d, r, 1.0), r);
        return r;
    }
    static __device__ __forceinline__ double silu(double z) { return z * sigmoid(z); }
    static __device__ __forceinline__ double dsilu(double z) {
        const double s = sigmoid(z);
        return s * (1.0 + z * (1.0 - s));
    }
};

// Work item (row, tile) of the rows x n_tiles items, tile fastest. Each block walks the items
// blockIdx.x, blockIdx.x + gridDim.x, ... (the host launches at most one resident wave).
struct cc1d_place {
    ssm_i64 row;  // b * dim + d
    int b, d, tile;
    __device__ __forceinline__ cc1d_place(unsigned item, int dim, int n_tiles) {
        // 32-bit division: the host checks that there are fewer than 2^31 items
        const unsigned r = item / (unsigned)n_tiles;
        row = r;
        tile = (int)(item - r * (unsigned)n_tiles);
        b = (int)(r / (unsigned)dim);
        d = (int)(r - (unsigned)b * (unsigned)dim);
    }
};

// One 16-byte vector of a row as stored (E elements; zeros past L), kept in registers
// between its prefetch and its use. 16-bit types stay packed two to a word, so that a
// prefetched vector costs four registers whatever the type.
template <typename T> struct cc1d_raw {  // 4- and 8-byte types: the values themselves
    typedef typename ssm_compute_of<T>::type CT;
    static constexpr int E = 16 / (int)sizeof(T);
    cc1d_vec<T> v;
    __device__ __forceinline__ void load(const T* __restrict__ row, ssm_i64 t, ssm_i64 L, bool vec_ok) {
        if (vec_ok && t + E <= L) {
            v = *reinterpret_cast<const cc1d_vec<T>*>(row + t);
        } else {
#pragma unroll
            for (int i = 0; i < E; ++i) v.v[i] = (t + i < L) ? row[t + i] : (T)0;
        }
    }
    __device__ __forceinline__ void unpack(CT (&r)[E]) const {
#pragma unroll
        for (int i = 0; i < E; ++i) r[i] = ssm_load(v.v[i]);
    }
};
struct alignas(16) cc1d_words { unsigned w[4]; };
template <typename T16> struct cc1d_raw16 {  // element 2i in the low half of word i
    static constexpr int E = 8;
    cc1d_words u;
    __device__ __forceinline__ void load(const T16* __restrict__ row, ssm_i64 t, ssm_i64 L, bool vec_ok) {
        if (vec_ok && t + E <= L) {
            u = *reinterpret_cast<const cc1d_words*>(row + t);
        } else {
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const unsigned lo = (t + 2 * i < L) ? row[t + 2 * i].bits : 0u;
                const unsigned hi = (t + 2 * i + 1 < L) ? row[t + 2 * i + 1].bits : 0u;
                u.w[i] = lo | (hi << 16);
            }
        }
    }
};
template <> struct cc1d_raw<ssm_bf16> : cc1d_raw16<ssm_bf16> {
    __device__ __forceinline__ void unpack(float (&r)[8]) const {
#pragma unroll
        for (int i = 0; i < 4; ++i) {  // a bfloat16 is the upper half of a float: one op each
            r[2 * i] = ssm_bits_to_float(u.w[i] << 16);
            r[2 * i + 1] = ssm_bits_to_float(u.w[i] & 0xffff0000u);
        }
    }
};
template <> struct cc1d_raw<ssm_half> : cc1d_raw16<ssm_half> {
    __device__ __forceinline__ void unpack(float (&r)[8]) const {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            r[2 * i] = ssm_load(ssm_half{(unsigned short)(u.w[i] & 0xffffu)});
            r[2 * i + 1] = ssm_load(ssm_half{(unsigned short)(u.w[i] >> 16)});
        }
    }
};

// One 16-byte vector of shared memory, widened to the compute type (a bfloat16 in one
// operation each: the upper half of a float).
template <typename T, typename CT, int E>
__device__ __forceinline__ void cc1d_unpack_words(const cc1d_words& w, CT (&r)[E]) {
    cc1d_raw<T> raw;
    if constexpr (sizeof(T) == 2) raw.u = w;
    else raw.v = *reinterpret_cast<const cc1d_vec<T>*>(&w);
    raw.unpack(r);
}

// Neighbours from registers. A warp's v-th vectors form chunk c = v * NWARPS + warp of the
// tile: CHUNK = 32 E consecutive steps, lane l holding [l E, l E + E). A step k <= H before
// (or after) a lane's vector is element (-k) mod E of the lane ceil(k / E) below (above),
// fetched with one shuffle; the lanes at the chunk's edge read it instead from `edge`, the H
// steps before (after) the chunk, which shared memory holds for every chunk.
//
// prev[j] = step -H + j of this lane's vector (j < H); edge: steps [-H, 0) of the chunk.
template <int H, int E, typename V>
__device__ __forceinline__ void cc1d_before(const V (&r)[E], const V* edge, int lane, V (&prev)[H > 0 ? H : 1]) {
#pragma unroll
    for (int j = 0; j < H; ++j) {
        const int k = H - j;             // steps back
        const int delta = (k + E - 1) / E;  // lanes back
        const V up = __shfl_up_sync(0xffffffffu, r[(E - k % E) % E], delta);
        // lane < delta: chunk position lane E - k < 0, which is edge[H + lane E - k]
        prev[j] = lane >= delta ? up : edge[j + (lane < delta ? lane : 0) * E];
    }
}

// next[j] = step E + j of this lane's vector (j < H); edge: steps [CHUNK, CHUNK + H).
template <int H, int E, typename V>
__device__ __forceinline__ void cc1d_after(const V (&r)[E], const V* edge, int lane, V (&next)[H > 0 ? H : 1]) {
#pragma unroll
    for (int j = 0; j < H; ++j) {
        const int delta = 1 + j / E;  // lanes ahead
        const V down = __shfl_down_sync(0xffffffffu, r[j % E], delta);
        // lane + delta > 31: position (lane + 1) E + j - CHUNK, which is edge[j + (lane + 1 - 32) E]
        next[j] = lane + delta < 32 ? down : edge[j + (lane + delta < 32 ? 0 : lane + 1 - 32) * E];
    }
}

// tail[q] = step CHUNK - H + q of the chunk, for q < H (the next chunk's `edge` in
// cc1d_before), from the lanes that hold those steps.
template <int H, int E, typename V>
__device__ __forceinline__ void cc1d_put_last(const V (&r)[E], V* tail, int lane) {
    constexpr int CHUNK = 32 * E;
#pragma unroll
    for (int i = 0; i < E; ++i) {
        const int p = lane * E + i;
        if (p >= CHUNK - H) tail[p - (CHUNK - H)] = r[i];
    }
}

// head[q] = step q of the chunk, for q < H (the previous chunk's `edge` in cc1d_after).
template <int H, int E, typename V>
__device__ __forceinline__ void cc1d_put_first(const V (&r)[E], V* head, int lane) {
#pragma unroll
    for (int i = 0; i < E; ++i) {
        const int p = lane * E + i;
        if (p < H) head[p] = r[i];
    }
}

// Window position m (step -H + m of a lane's vector): prev[m] for m < H, else own[m - H].
// Both indices stay in range, so that the arrays stay in registers.
template <int H, int E, typename V>
__device__ __forceinline__ V cc1d_pick(const V (&prev)[H > 0 ? H : 1], const V (&own)[E], int m) {
    return m < H ? prev[m < H ? m : 0] : own[m < H ? 0 : m - H];
}

// Sequence ids of elements [t, t + E) of a row; -1 past L (such steps have no effect).
template <int E>
__device__ __forceinline__ void cc1d_load_seq(const int* __restrict__ srow, ssm_i64 t, ssm_i64 L,
                                              int (&r)[E]) {
#pragma unroll
    for (int i = 0; i < E; ++i) r[i] = (t + i < L) ? srow[t + i] : -1;
}

// The step t0 - H + tid before a tile (thread tid < H): from x, or for a step < 0 from the
// initial state (zero without one), whose steps belong to the first sequence.
template <typename T, typename CT, int H, bool HAS_SEQ>
__device__ __forceinline__ void cc1d_halo_before(const T* __restrict__ xrow, const CT* __restrict__ h0row,
                                                 const int* __restrict__ srow, ssm_i64 t0, CT& hv,
                                                 int& hs) {
    // With the item loop, tid read afresh: kept live through the loop, t0 - H + tid got
    // spilled (cc1d_fwd<float, 5, true, true, false>); without it (double) the volatile
    // read itself made ptxas spill.
    const ssm_i64 s = t0 - H + (cc1d_shape<T>::WALK ? ssm_fresh_tid() : (int)threadIdx.x);
    hv = 0;
    hs = 0;
    if (s >= 0) {
        hv = ssm_load(xrow[s]);
        if constexpr (HAS_SEQ) hs = srow[s];
    } else {
        if (h0row != nullptr) hv = h0row[H + s];
        if constexpr (HAS_SEQ) hs = srow[0];
    }
}

// Item `item`'s inputs into `in`: read ahead into `nxt` by the previous step (and the next
// item's read ahead now) with PREFETCH, else read here.
template <bool PREFETCH, typename In, typename F>
__device__ __forceinline__ void cc1d_take(unsigned item, unsigned n_items, In& in, In& nxt, F& fetch) {
    if constexpr (PREFETCH) {
        in = nxt;
        if (item + gridDim.x < n_items) fetch(item + gridDim.x, nxt);
    } else {
        fetch(item, in);
    }
}

// ---------------------------------------------------------------------------------------
// Forward: y, and the final state (last W-1 steps of xpad), written by the threads that
// hold those steps. Shared memory holds only the H steps before each chunk: xprev[c H + j]
// = x at step c CHUNK - H + j of the tile (chunk 0: before the tile), two copies by item
// parity so that one barrier per item suffices.
// ---------------------------------------------------------------------------------------
template <typename T, int W, bool HAS_SEQ> struct cc1d_fwd_in {  // one item's inputs
    typedef typename ssm_compute_of<T>::type CT;
    cc1d_raw<T> x[cc1d_shape<T>::VPT];
    int s[HAS_SEQ ? cc1d_shape<T>::VPT : 1][cc1d_shape<T>::E];
    CT w[W], bv;
    CT halo;    // threads tid < W-1: the step t0 - (W-1) + tid
    int shalo;  // and its sequence id
    int slast;  // the sequence id of step L-1 (with seq_idx and a final state)
};

template <typename T, int W, bool HAS_BIAS, bool SILU, bool HAS_SEQ>
__global__ void __launch_bounds__(CC1D_THREADS)
cc1d_fwd(const T* __restrict__ x, const typename ssm_compute_of<T>::type* __restrict__ weight,
         const typename ssm_compute_of<T>::type* __restrict__ bias,
         const typename ssm_compute_of<T>::type* __restrict__ h0, const int* __restrict__ seq,
         T* __restrict__ y, T* __restrict__ final_state, int dim, ssm_i64 L, int n_tiles,
         int n_items, int vec_ok) {
    typedef typename ssm_compute_of<T>::type CT;
    constexpr int H = W - 1;
    constexpr int HS = H > 0 ? H : 1;  // array sizes
    constexpr int E = cc1d_shape<T>::E;
    constexpr int VPT = cc1d_shape<T>::VPT;
    constexpr int TILE = cc1d_shape<T>::TILE;
    constexpr int NWARPS = CC1D_THREADS / 32;
    constexpr int NCH = VPT * NWARPS;  // chunks per tile
    static_assert(32 * E >= H, "a chunk must hold the halo");
    __shared__ CT xprev_buf[2][NCH * HS];
    __shared__ int sprev_buf[2][HAS_SEQ ? NCH * HS : 1];
    typedef cc1d_fwd_in<T, W, HAS_SEQ> In;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const bool vok = vec_ok != 0;

    auto fetch = [&](unsigned item, In& in) {
        const cc1d_place at(item, dim, n_tiles);
        const ssm_i64 t0 = (ssm_i64)at.tile * TILE;
        const T* xrow = x + at.row * L;
        const int* srow = HAS_SEQ ? seq + (ssm_i64)at.b * L : nullptr;
#pragma unroll
        for (int v = 0; v < VPT; ++v) {
            const int lt = (v * CC1D_THREADS + tid) * E;
            in.x[v].load(xrow, t0 + lt, L, vok);
            if constexpr (HAS_SEQ) cc1d_load_seq<E>(srow, t0 + lt, L, in.s[v]);
        }
#pragma unroll
        for (int k = 0; k < W; ++k) in.w[k] = weight[(ssm_i64)at.d * W + k];
        in.bv = HAS_BIAS ? bias[at.d] : (CT)0;
        if (H > 0 && tid < H)
            cc1d_halo_before<T, CT, H, HAS_SEQ>(xrow, h0 == nullptr ? nullptr : h0 + at.row * H,
                                                srow, t0, in.halo, in.shalo);
        in.slast = 0;
        if (HAS_SEQ && H > 0 && final_state != nullptr) in.slast = srow[L - 1];
    };

    In nxt;
    unsigned item = blockIdx.x;
    if (cc1d_shape<T>::PREFETCH && item < (unsigned)n_items) fetch(item, nxt);
    for (int parity = 0; item < (unsigned)n_items; item += gridDim.x, parity ^= 1) {
        In in;
        cc1d_take<cc1d_shape<T>::PREFETCH>(item, (unsigned)n_items, in, nxt, fetch);
        const cc1d_place at(item, dim, n_tiles);
        const ssm_i64 t0 = (ssm_i64)at.tile * TILE;
        CT* xprev = xprev_buf[parity];
        int* sprev = sprev_buf[parity];

        CT xr[VPT][E];
#pragma unroll
        for (int v = 0; v < VPT; ++v) in.x[v].unpack(xr[v]);
        if constexpr (H > 0) {
            if (tid < H) {
                xprev[tid] = in.halo;
                if constexpr (HAS_SEQ) sprev[tid] = in.shalo;
            }
#pragma unroll
            for (int v = 0; v < VPT; ++v) {
                const int c = v * NWARPS + warp;
                if (c + 1 < NCH) {
                    cc1d_put_last<H, E>(xr[v], xprev + (c + 1) * H, lane);
                    if constexpr (HAS_SEQ) cc1d_put_last<H, E>(in.s[v], sprev + (c + 1) * H, lane);
                }
            }
            __syncthreads();
        }

#pragma unroll
        for (int v = 0; v < VPT; ++v) {
            const int lt = (v * CC1D_THREADS + tid) * E;
            const int c = v * NWARPS + warp;
            CT win[E + H];  // steps [lt - H, lt + E)
            int sw[HAS_SEQ ? E + H : 1];
            if constexpr (H > 0) {
                CT prev[HS];
                cc1d_before<H, E>(xr[v], xprev + c * H, lane, prev);
#pragma unroll
                for (int j = 0; j < H; ++j) win[j] = prev[j];
                if constexpr (HAS_SEQ) {
                    int sp[HS];
                    cc1d_before<H, E>(in.s[v], sprev + c * H, lane, sp);
#pragma unroll
                    for (int j = 0; j < H; ++j) sw[j] = sp[j];
                }
            }
#pragma unroll
            for (int i = 0; i < E; ++i) {
                win[H + i] = xr[v][i];
                if constexpr (HAS_SEQ) sw[H + i] = in.s[v][i];
            }
            CT out[E];
#pragma unroll
            for (int i = 0; i < E; ++i) {
                CT acc = in.bv;
#pragma unroll
                for (int k = 0; k < W; ++k) {
                    if constexpr (HAS_SEQ) {
                        acc += (sw[i + k] == sw[i + H]) ? in.w[k] * win[i + k] : (CT)0;
                    } else {
                        acc += in.w[k] * win[i + k];
                    }
                }
                out[i] = SILU ? cc1d_act<CT>::silu(acc) : acc;
            }
            const ssm_i64 s0 = t0 + lt;
            cc1d_store<T, CT, E>(y + at.row * L, s0, L, vok, out);
            if (H > 0 && final_state != nullptr && s0 + E > L - H && s0 < L) {
                // the vector holds final-state steps: step s0 + i is final step s0 + i - (L - H)
#pragma unroll
                for (int i = 0; i < E; ++i) {
                    const ssm_i64 f = s0 + i - (L - H);
                    if (f >= 0 && f < H) {
                        CT val = xr[v][i];
                        if constexpr (HAS_SEQ) {
                            if (in.s[v][i] != in.slast) val = 0;  // an earlier sequence's input
                        }
                        ssm_store(final_state + at.row * H + f, val);
                    }
                }
            }
        }

        // L < W-1: the first final-state steps are initial-state steps (or zeros)
        if (H > 0 && final_state != nullptr && L < H && tid < H - L) {
            const ssm_i64 s = L - H + tid;  // < 0
            CT val = h0 != nullptr ? h0[at.row * H + H + s] : (CT)0;
            if constexpr (HAS_SEQ) {
                if (seq[(ssm_i64)at.b * L] != in.slast) val = 0;
            }
            ssm_store(final_state + at.row * H + tid, val);
        }
        if constexpr (!cc1d_shape<T>::WALK) break;
    }
}

// ---------------------------------------------------------------------------------------
// Forward through shared memory (cc1d_fwd_tile): no seq_idx, whole 16-byte vectors (L a
// multiple of E, aligned rows). An item is `steps` steps [t0, t0 + steps) of `rows_per_item`
// consecutive rows (several rows only when a tile holds whole rows, steps = L, so that the
// item is one contiguous run of x); one block per item, items numbered row groups x tiles,
// tile fastest. One thread copies the item's x into shared memory with a bulk asynchronous
// copy (sm_90; a block-wide copy before), while the others stage each row's taps, bias and
// the H steps before the tile (from x, or the initial state); then the threads walk the
// item's vectors, thread tid the vectors tid + k * CC1D_THREADS, computing each from a window
// read out of shared memory (its own vector and the one or two before it, or the staged
// steps at a row's start), and store y. The tile's bytes are in flight without holding
// registers, so the registers of the arithmetic no longer bound the loads an SM keeps in
// flight; several rows per item keep a block's bytes up when rows are short.
// Dynamic shared memory: rows_per_item * steps elements of T, then per row W taps, the bias
// and H edge steps in the compute type (cc1d_fwd_tile_smem).
// ---------------------------------------------------------------------------------------
template <typename T, int W, bool HAS_BIAS, bool SILU>
__global__ void __launch_bounds__(CC1D_THREADS)
cc1d_fwd_tile(const T* __restrict__ x, const typename ssm_compute_of<T>::type* __restrict__ weight,
              const typename ssm_compute_of<T>::type* __restrict__ bias,
              const typename ssm_compute_of<T>::type* __restrict__ h0, T* __restrict__ y,
              T* __restrict__ final_state, int dim, ssm_i64 L, int steps, int n_tiles,
              int rows_per_item, ssm_i64 n_rows) {
    typedef typename ssm_compute_of<T>::type CT;
    constexpr int H = W - 1;
    constexpr int E = cc1d_shape<T>::E;
    constexpr int NP = (H + E - 1) / E;  // vectors before its own that a window reaches
    extern __shared__ cc1d_words cc1d_dyn[];  // one type for every instantiation
    __shared__ unsigned long long bar;

    const int tid = threadIdx.x;
    const unsigned group = blockIdx.x / (unsigned)n_tiles;
    const int tile = (int)(blockIdx.x - group * (unsigned)n_tiles);
    const ssm_i64 r0 = (ssm_i64)group * rows_per_item;
    const int nr = (int)min((ssm_i64)rows_per_item, n_rows - r0);  // rows of this item
    const ssm_i64 t0 = (ssm_i64)tile * steps;
    const int n = (int)min((ssm_i64)steps, L - t0);  // steps per row, a multiple of E
    const T* const src = x + r0 * L + t0;             // nr rows of n steps: contiguous
    const unsigned int bytes = (unsigned int)(nr * n) * (unsigned int)sizeof(T);

    cc1d_vec<T>* const xt = reinterpret_cast<cc1d_vec<T>*>(cc1d_dyn);
    CT* const taps = reinterpret_cast<CT*>(cc1d_dyn) + (ssm_i64)rows_per_item * steps *
                                                           sizeof(T) / sizeof(CT);
    CT* const bvs = taps + rows_per_item * W;
    CT* const edge = bvs + rows_per_item;  // [row][H]: the steps t0 - H .. t0 - 1
    for (int i = tid; i < nr * W; i += CC1D_THREADS)
        taps[i] = weight[((r0 + i / W) % dim) * W + i % W];
    if (tid == 0) {  // after this thread's small loads, as in ssm_state_update_tile
        ssm_bulk_bar_init(&bar);
        ssm_bulk_expect(&bar, bytes);
        ssm_bulk_copy(xt, src, bytes, &bar);
    }
    for (int i = tid; i < nr; i += CC1D_THREADS) bvs[i] = HAS_BIAS ? bias[(r0 + i) % dim] : (CT)0;
    for (int i = tid; i < nr * H; i += CC1D_THREADS) {
        const ssm_i64 rr = r0 + i / H, s = t0 - H + i % H;  // step s of row rr
        CT v = 0;
        if (s >= 0) v = ssm_load(x[rr * L + s]);
        else if (h0 != nullptr) v = h0[rr * H + H + s];
        edge[i] = v;
    }
    __syncthreads();  // the barrier's initialisation and the staged values
    ssm_bulk_wait(&bar, xt, src, bytes);
    const T* const xs = reinterpret_cast<const T*>(cc1d_dyn);

    // vector j: row j * E / n, step lt of that row; thread tid walks j = tid + k * THREADS
    int row = (tid * E) / n, lt = tid * E - row * n;
    int w_row = -1;
    CT w[W], bv = 0;
    for (int j = tid; row < nr; j += CC1D_THREADS) {
        if (row != w_row) {  // a new row's taps
#pragma unroll
            for (int k = 0; k < W; ++k) w[k] = taps[row * W + k];
            bv = bvs[row];
            w_row = row;
        }
        CT win[E + H];  // steps [lt - H, lt + E) of the row
        CT own[E];
        cc1d_unpack_words<T>(cc1d_dyn[j], own);
#pragma unroll
        for (int i = 0; i < E; ++i) win[H + i] = own[i];
        if constexpr (H > 0) {
            if (lt >= NP * E) {  // the vectors before, whole, in the same row
#pragma unroll
                for (int a = 0; a < NP; ++a) {
                    CT pv[E];
                    cc1d_unpack_words<T>(cc1d_dyn[j - NP + a], pv);
#pragma unroll
                    for (int i = 0; i < E; ++i) {
                        const int q = a * E + i - (NP * E - H);  // window position
                        if (q >= 0) win[q] = pv[i];
                    }
                }
            } else {  // a row's first vectors: the steps before the tile from the edge
#pragma unroll
                for (int q = 0; q < H; ++q) {
                    const int idx = lt - H + q;
                    win[q] = idx >= 0 ? (CT)ssm_load(xs[j * E - lt + idx])
                                      : edge[row * H + (idx >= 0 ? 0 : H + idx)];
                }
            }
        }
        CT out[E];
#pragma unroll
        for (int i = 0; i < E; ++i) {
            CT acc = bv;
#pragma unroll
            for (int k = 0; k < W; ++k) acc += w[k] * win[i + k];
            out[i] = SILU ? cc1d_act<CT>::silu(acc) : acc;
        }
        cc1d_store<T, CT, E>(y + (r0 + row) * L, t0 + lt, L, true, out);
        lt += CC1D_THREADS * E;
        while (lt >= n) {
            lt -= n;
            ++row;
        }
    }

    // the final state of each row: the last H steps of xpad (x after the initial state)
    if (H > 0 && final_state != nullptr && tile == n_tiles - 1) {
        for (int i = tid; i < nr * H; i += CC1D_THREADS) {
            const int q = i % H;
            const ssm_i64 rr = r0 + i / H, s = L - H + q;
            CT val = 0;
            if (s >= 0) val = ssm_load(x[rr * L + s]);
            else if (h0 != nullptr) val = h0[rr * H + H + s];
            ssm_store(final_state + rr * H + q, val);
        }
    }
}

// ---------------------------------------------------------------------------------------
// Backward. For the tile [t0, t0 + TILE): g = dy * silu'(z) (or dy) on [t0, t0 + TILE + H),
// recomputing z from x; then dx[s] = sum_k w[k] g[s + H - k] (same-sequence pairs) plus the
// final-state cotangent, per-item partials of dweight[k] = sum g[t] x[t - H + k] and of
// dbias = sum g[t], and, in tile 0, dinitial_state.
// Registers hold x, dy and g of the thread's vectors; shared memory only the chunk edges:
// xprev[c H + j] = x at step c CHUNK - H + j (c = NCH: the tile's last H steps), xnext[j] =
// x at step TILE + j (the H steps after the tile), gnext[c H + j] = g at step c CHUNK + j
// (c = NCH: after the tile, computed by threads tid < H), the sequence ids of the same
// steps, and the final-state cotangent. Three barriers per item; every shared array is
// written before the first and read before the third, so one copy serves all items.
// partial: (batch, dim, n_tiles, W + 1) in the compute type, entry W holding dbias.
// ---------------------------------------------------------------------------------------
template <typename T, int W, bool HAS_SEQ> struct cc1d_bwd_in {  // one item's inputs
    typedef typename ssm_compute_of<T>::type CT;
    cc1d_raw<T> x[cc1d_shape<T>::VPT], dy[cc1d_shape<T>::VPT];
    int s[HAS_SEQ ? cc1d_shape<T>::VPT : 1][cc1d_shape<T>::E];
    CT w[W], bv;
    CT halo, xa, dya, dfin;  // threads tid < H: steps t0 - H + tid, t0 + TILE + tid; dfinal[tid]
    int shalo, sa;           // sequence ids of those steps (-1 past L)
    int slast;               // the sequence id of step L-1 (with seq_idx and dfinal)
};

template <typename T, int W, bool HAS_BIAS, bool SILU, bool HAS_SEQ>
__global__ void __launch_bounds__(CC1D_THREADS)
cc1d_bwd(const T* __restrict__ x, const typename ssm_compute_of<T>::type* __restrict__ weight,
         const typename ssm_compute_of<T>::type* __restrict__ bias,
         const typename ssm_compute_of<T>::type* __restrict__ h0, const int* __restrict__ seq,
         const T* __restrict__ dy, const typename ssm_compute_of<T>::type* __restrict__ dfinal,
         T* __restrict__ dx, typename ssm_compute_of<T>::type* __restrict__ dh0,
         typename ssm_compute_of<T>::type* __restrict__ partial, int dim, ssm_i64 L, int n_tiles,
         int n_items, int vec_ok) {
    typedef typename ssm_compute_of<T>::type CT;
    constexpr int H = W - 1;
    constexpr int HS = H > 0 ? H : 1;
    constexpr int E = cc1d_shape<T>::E;
    constexpr int VPT = cc1d_shape<T>::VPT;
    constexpr int TILE = cc1d_shape<T>::TILE;
    constexpr int NWARPS = CC1D_THREADS / 32;
    constexpr int NCH = VPT * NWARPS;
    constexpr int RED = W + 1 <= 2 ? 2 : (W + 1 <= 4 ? 4 : (W + 1 <= 8 ? 8 : 16));  // padded
    static_assert(32 * E >= H, "a chunk must hold the halo");
    __shared__ CT xprev[(NCH + 1) * HS];
    __shared__ CT xnext[HS];
    __shared__ CT gnext[(NCH + 1) * HS];
    __shared__ CT dfs[HS];
    __shared__ int sprev[HAS_SEQ ? (NCH + 1) * HS : 1];
    __shared__ int snext[HAS_SEQ ? (NCH + 1) * HS : 1];
    __shared__ int sxnext[HAS_SEQ ? HS : 1];
    __shared__ CT red[NWARPS * (W + 1)];
    typedef cc1d_bwd_in<T, W, HAS_SEQ> In;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const bool vok = vec_ok != 0;
    const bool with_dfinal = H > 0 && dfinal != nullptr;

    auto fetch = [&](unsigned item, In& in) {
        const cc1d_place at(item, dim, n_tiles);
        const ssm_i64 t0 = (ssm_i64)at.tile * TILE;
        const T* xrow = x + at.row * L;
        const T* dyrow = dy + at.row * L;
        const int* srow = HAS_SEQ ? seq + (ssm_i64)at.b * L : nullptr;
#pragma unroll
        for (int v = 0; v < VPT; ++v) {
            const int lt = (v * CC1D_THREADS + tid) * E;
            in.x[v].load(xrow, t0 + lt, L, vok);
            in.dy[v].load(dyrow, t0 + lt, L, vok);
            if constexpr (HAS_SEQ) cc1d_load_seq<E>(srow, t0 + lt, L, in.s[v]);
        }
#pragma unroll
        for (int k = 0; k < W; ++k) in.w[k] = weight[(ssm_i64)at.d * W + k];
        in.bv = HAS_BIAS ? bias[at.d] : (CT)0;
        if (H > 0 && tid < H) {
            cc1d_halo_before<T, CT, H, HAS_SEQ>(xrow, h0 == nullptr ? nullptr : h0 + at.row * H,
                                                srow, t0, in.halo, in.shalo);
            const ssm_i64 t = t0 + TILE + tid;  // after the tile: zeros past L
            in.xa = t < L ? ssm_load(xrow[t]) : (CT)0;
            in.dya = t < L ? ssm_load(dyrow[t]) : (CT)0;
            in.sa = -1;
            if constexpr (HAS_SEQ) in.sa = t < L ? srow[t] : -1;
            in.dfin = with_dfinal ? dfinal[at.row * H + tid] : (CT)0;
        }
        in.slast = 0;
        if (HAS_SEQ && with_dfinal) in.slast = srow[L - 1];
    };

    In nxt;
    unsigned item = blockIdx.x;
    if (cc1d_shape<T>::PREFETCH && item < (unsigned)n_items) fetch(item, nxt);
    for (; item < (unsigned)n_items; item += gridDim.x) {
        In in;
        cc1d_take<cc1d_shape<T>::PREFETCH>(item, (unsigned)n_items, in, nxt, fetch);
        const cc1d_place at(item, dim, n_tiles);
        const ssm_i64 t0 = (ssm_i64)at.tile * TILE;

        CT xr[VPT][E], g[VPT][E];  // g holds dy until it becomes dy * silu'(z)
#pragma unroll
        for (int v = 0; v < VPT; ++v) {
            in.x[v].unpack(xr[v]);
            in.dy[v].unpack(g[v]);
        }
        if constexpr (H > 0) {
            if (tid < H) {
                xprev[tid] = in.halo;
                xnext[tid] = in.xa;
                gnext[NCH * H + tid] = in.dya;  // becomes g after the first barrier
                dfs[tid] = in.dfin;
                if constexpr (HAS_SEQ) {
                    sprev[tid] = in.shalo;
                    sxnext[tid] = in.sa;
                    snext[NCH * H + tid] = in.sa;
                }
            }
#pragma unroll
            for (int v = 0; v < VPT; ++v) {
                const int c = v * NWARPS + warp;
                cc1d_put_last<H, E>(xr[v], xprev + (c + 1) * H, lane);
                if constexpr (HAS_SEQ) {
                    cc1d_put_last<H, E>(in.s[v], sprev + (c + 1) * H, lane);
                    cc1d_put_first<H, E>(in.s[v], snext + c * H, lane);
                }
            }
            __syncthreads();
        }

        // g = dy * silu'(z) on the thread's steps; x before them stays in registers.
        CT xp[VPT][HS];
        int sp[HAS_SEQ ? VPT : 1][HS];
#pragma unroll
        for (int v = 0; v < VPT; ++v) {
            const int c = v * NWARPS + warp;
            if constexpr (H > 0) {
                cc1d_before<H, E>(xr[v], xprev + c * H, lane, xp[v]);
                if constexpr (HAS_SEQ) cc1d_before<H, E>(in.s[v], sprev + c * H, lane, sp[v]);
            }
            if constexpr (SILU) {
#pragma unroll
                for (int i = 0; i < E; ++i) {
                    CT z = in.bv;
#pragma unroll
                    for (int k = 0; k < W; ++k) {
                        const int m = i + k;  // window position: step lt - H + m
                        const CT xv = cc1d_pick<H, E>(xp[v], xr[v], m);
                        if constexpr (HAS_SEQ) {
                            const int sv = cc1d_pick<H, E>(sp[v], in.s[v], m);
                            z += (sv == in.s[v][i]) ? in.w[k] * xv : (CT)0;
                        } else {
                            z += in.w[k] * xv;
                        }
                    }
                    g[v][i] *= cc1d_act<CT>::dsilu(z);  // dy is zero past L
                }
            }
            if constexpr (H > 0) cc1d_put_first<H, E>(g[v], gnext + c * H, lane);
        }
        if constexpr (H > 0) {
            if (SILU && tid < H) {  // g at step TILE + tid after the tile (dy is zero past L)
                CT z = in.bv;
#pragma unroll
                for (int k = 0; k < W; ++k) {  // x at step TILE + q, q = tid - H + k in [-H, H)
                    const int q = tid - H + k;
                    const CT xv = q < 0 ? xprev[NCH * H + H + q] : xnext[q < 0 ? 0 : q];
                    if constexpr (HAS_SEQ) {
                        const int sv = q < 0 ? sprev[NCH * H + H + q] : sxnext[q < 0 ? 0 : q];
                        if (sv == in.sa) z += in.w[k] * xv;
                    } else {
                        z += in.w[k] * xv;
                    }
                }
                gnext[NCH * H + tid] = in.dya * cc1d_act<CT>::dsilu(z);
            }
            __syncthreads();
        }

        const int seq_last = (HAS_SEQ && with_dfinal) ? in.slast : 0;
        CT dw[RED];  // dw[W] accumulates dbias; entries past W stay zero
#pragma unroll
        for (int k = 0; k < RED; ++k) dw[k] = 0;
#pragma unroll
        for (int v = 0; v < VPT; ++v) {
            const int lt = (v * CC1D_THREADS + tid) * E;
            const int c = v * NWARPS + warp;
            CT gw[E + H];                    // g on [lt, lt + E + H)
            int sw[HAS_SEQ ? E + 2 * H : 1];  // sequence ids on [lt - H, lt + E + H)
#pragma unroll
            for (int i = 0; i < E; ++i) gw[i] = g[v][i];
            if constexpr (H > 0) {
                CT gn[HS];
                cc1d_after<H, E>(g[v], gnext + (c + 1) * H, lane, gn);
#pragma unroll
                for (int j = 0; j < H; ++j) gw[E + j] = gn[j];
            }
            if constexpr (HAS_SEQ) {
                int sn[HS];
                if constexpr (H > 0) cc1d_after<H, E>(in.s[v], snext + (c + 1) * H, lane, sn);
#pragma unroll
                for (int j = 0; j < H; ++j) {
                    sw[j] = sp[v][j];
                    sw[H + E + j] = sn[j];
                }
#pragma unroll
                for (int i = 0; i < E; ++i) sw[H + i] = in.s[v][i];
            }
            CT out[E];
#pragma unroll
            for (int i = 0; i < E; ++i) {
                CT acc = 0;
#pragma unroll
                for (int k = 0; k < W; ++k) {  // step s + H - k reads this input through tap k
                    if constexpr (HAS_SEQ) {
                        acc += (sw[2 * H + i - k] == sw[H + i]) ? in.w[k] * gw[i + H - k] : (CT)0;
                    } else {
                        acc += in.w[k] * gw[i + H - k];
                    }
                }
                out[i] = acc;
                const CT gi = gw[i];
                dw[W] += gi;
#pragma unroll
                for (int k = 0; k < W; ++k) {
                    const int m = i + k;  // x at step lt - H + m
                    const CT xv = cc1d_pick<H, E>(xp[v], xr[v], m);
                    if constexpr (HAS_SEQ) {
                        dw[k] += (sw[m] == sw[H + i]) ? gi * xv : (CT)0;
                    } else {
                        dw[k] += gi * xv;
                    }
                }
            }
            const ssm_i64 s0 = t0 + lt;
            if (with_dfinal && s0 + E > L - H && s0 < L) {  // the vector holds final-state steps
                const int f0 = (int)(s0 - (L - H));  // in (-E, H): step s0 + i is final step f0 + i
#pragma unroll
                for (int i = 0; i < E; ++i) {  // no branch per element: out stays in registers
                    const int f = f0 + i;
                    bool take = (unsigned)f < (unsigned)H;
                    // bitwise &: a short-circuit here let nvcc pick sw[H + i] by a run-time
                    // index, which put sw in local memory
                    if constexpr (HAS_SEQ) take = take & (sw[H + i] == seq_last);
                    const CT add = dfs[f < 0 ? 0 : (f < H ? f : H - 1)];
                    out[i] += take ? add : (CT)0;
                }
            }
            cc1d_store<T, CT, E>(dx + at.row * L, s0, L, vok, out);
        }

        if (H > 0 && dh0 != nullptr && at.tile == 0 && tid < H) {
            // Initial-state step j (xpad position j, time j - H) is read by steps t = j - k.
            const int j = tid;
            CT acc = 0;
#pragma unroll
            for (int k = 0; k < W; ++k) {
                if (k <= j) {
                    const int t = j - k;  // < H <= CHUNK: in gnext[0..H); g is zero past L
                    bool same = true;
                    if constexpr (HAS_SEQ) same = snext[t] == sprev[j];
                    if (same) acc += in.w[k] * gnext[t];
                }
            }
            if (with_dfinal && j >= L) {  // L < W-1: the final state still holds this value
                bool same = true;
                if constexpr (HAS_SEQ) same = sprev[j] == seq_last;
                if (same) acc += dfs[j - L];
            }
            dh0[at.row * H + j] = acc;
        }

        // Partials of dweight and dbias: a fixed reduce-scatter tree per warp (lane `own`
        // ends with the warp's sum of entry `off`), then the warps in order.
        int off = 0;
        bool own = true;
        ssm_reduce_scatter<RED, 16>::run(dw, lane, 0xffffffffu, off, own);
        if (own && off <= W) red[warp * (W + 1) + off] = dw[0];
        __syncthreads();
        if (tid <= W) {
            CT s = red[tid];
#pragma unroll
            for (int q = 1; q < NWARPS; ++q) s += red[q * (W + 1) + tid];
            partial[((ssm_i64)at.row * n_tiles + at.tile) * (W + 1) + tid] = s;
        }
        if constexpr (!cc1d_shape<T>::WALK) break;
        // Width 1 has no barrier in the next item before its warps write `red` again (the
        // others have two, for the halo): without this one they could overwrite it while the
        // threads above still read it (a wrong dweight now and then, 16-bit types).
        if constexpr (H == 0) __syncthreads();
    }
}

// ---------------------------------------------------------------------------------------
// On tensor cores: cc1d_fwd_mma and cc1d_bwd_mma, for 16-bit types without seq_idx or
// initial state; the forward for L even and rows 4-byte aligned, the backward for L a
// multiple of 8 and x, dy 16-byte aligned (the host sends every other case to the kernels
// above).
//
// cc1d_bwd does 3W FFMA per element (the recomputed pre-activation z, dx, dweight) and
// runs out of issue slots in bfloat16 (0.50 of copy at W = 8). Here the sums are mma.sync
// products; per element there remain silu or silu', a few conversions, loads and stores.
// Measured on the H200 (bench_causal_conv1d.py, bfloat16, benchmarks/CAUSAL_CONV1D.md): the
// forward 0.80-0.89 of copy (cc1d_fwd_tile 0.74-0.86 in the same runs), the backward at
// W = 8 0.81-0.84 (cc1d_bwd 0.50-0.54). Below W = 8 the warp kernels further down
// (cc1d_fwd_warp, cc1d_bwd_warp) are the faster ones, so the host uses these from W = 8.
//
// A warp owns one span of one row (items: rows x spans, span fastest) and walks it in
// chunks of 128 steps (the backward from the last to the first). A chunk is 16 rows of 8
// steps (row j: steps 8j .. 8j+7), and lane (g, t) = (lane / 4, lane % 4) holds steps
// 8g + 2t, +1 and 64 + 8g + 2t, +1: the accumulator layout of mma.sync, so that x, y, dy
// and dx move as one 32-bit word per lane and half chunk, and z comes out where dy is.
//   z  = bias + X Wz,  X[j][k] = x at step 8j - 8 + k (the row before and the row),
//                      Wz[k][n] = w[k - n + H - 8] (zero off the taps);
//   dx = G Wd,         G[j][k] = g at step 8j + k (the row and the row after),
//                      Wd[k][n] = w[n + H - k];
//   P += X^T G8,       G8[j][n] = g at step 8j + n; dweight[kk] = sum_n P[n + kk + 8 - H][n]
//                      (G8 transposed in registers by movmatrix).
// The forward's neighbouring rows of X come from lanes 4 apart by one shuffle per word,
// the row before the chunk read with it (lanes 28-31). The backward's chunks of x and dy
// come through shared memory (cc1d_mma_slot), whence ldmatrix reads X and X^T. The rows
// of G after the lane's come from lanes 4 apart, the row after the chunk being the first
// row of the chunk walked before (kept by lanes 0-3). The backward's walk starts with the
// 8 steps after the span when they hold a step < L, for their g only.
//
// Precision: x and dy are exact in the 16-bit type; the taps and g are split into a
// rounded high part and the rounded residual (hi + lo = v to about 2^-16 relative), and
// z = X Wz_hi + X Wz_lo, dx = Ghi Wd_hi + Glo Wd_hi + Ghi Wd_lo, P from Ghi and Glo,
// all accumulated in float: dx and y to the 16-bit rounding, dweight and dbias to about
// 1e-5 (cc1d_bwd: 1e-7).
// partial: (batch, dim, n_spans, W + 1) as in cc1d_bwd, a span in place of a tile.
// ---------------------------------------------------------------------------------------
#define CC1D_MMA_CHUNK 128  // steps per warp and round of products: 16 rows of 8
// The forward's chunks' words in registers, one computed and the others in flight
// (bench_causal_conv1d.py --mma-sweep, bfloat16, kernel alone: 0.75-0.77 of copy with 2,
// 0.80-0.85 with 3, 0.82-0.88 with 4, 0.84-0.88 with 6 and 8).
#ifndef CC1D_MMA_FWD_BUFS
#define CC1D_MMA_FWD_BUFS 6
#endif
// The backward holds no chunk in registers: its warps copy CC1D_MMA_BWD_AHEAD chunks ahead
// by cp.async into a ring of AHEAD + 1 slots of shared memory each (cc1d_mma_slot). In
// registers, more than one chunk ahead had cost the warps their eighth block per SM
// (0.66-0.67 of copy with 2 buffers at 8 blocks, 0.59-0.65 with 3 or 4 at 5-6), and one
// chunk ahead left a third of the stall samples on the first use of a chunk's words. The
// ring, bfloat16 W = 8, kernel and cc1d_wsum, three alternating rounds of
// benchmarks/ab_cc1d_trees.py (8 x 3072 x 2048 / 4 x 5376 x 4096): 0.81-0.83 / 0.81-0.85
// with 3 ahead, 0.82-0.85 / 0.84-0.87 with 4 (which spills at W = 1-2), the register kernel
// 0.68-0.73 / 0.69-0.74.
#ifndef CC1D_MMA_BWD_AHEAD
#define CC1D_MMA_BWD_AHEAD 3
#endif
// The warp kernels read one chunk ahead into registers; they also ask L2 for the chunk
// CC1D_L2_AHEAD_BWD (backward) or CC1D_L2_AHEAD_FWD (forward) chunks ahead: no registers are
// held, and the later loads wait on L2, not DRAM. bfloat16 W = 4, kernels alone, three
// alternating rounds of benchmarks/ab_cc1d_trees.py, fraction of copy (8 x 3072 x 2048 /
// 4 x 5376 x 4096): backward 0.71-0.72 / 0.76-0.78 without, 0.75-0.77 / 0.81-0.82 two chunks
// ahead, 0.73-0.75 / 0.79-0.81 four; forward 0.77-0.78 / 0.83-0.88 without, 0.80-0.83 /
// 0.87-0.88 two, 0.81-0.85 / 0.90-0.91 four. The tensor-core backward lost to it (W = 8:
// 0.59-0.61 without, 0.54-0.55 two ahead, 0.58-0.59 four): it is bound by its issue rate, and
// does not prefetch. 0: no prefetch.
#ifndef CC1D_L2_AHEAD_BWD
#define CC1D_L2_AHEAD_BWD 2
#endif
#ifndef CC1D_L2_AHEAD_FWD
#define CC1D_L2_AHEAD_FWD 4
#endif

// L2 prefetch of the STEPS steps of a row from step s (128-byte lines, one per lane from
// lane `first`); BOUNDED: only those before `end`.
template <typename T, int STEPS, bool BOUNDED>
__device__ __forceinline__ void cc1d_prefetch(const T* row, ssm_i64 s, ssm_i64 end, int lane,
                                              int first) {
    constexpr int LINE = 128 / (int)sizeof(T);
    const int i = lane - first;
    if (i >= 0 && i < STEPS / LINE && (!BOUNDED || s + i * LINE < end))
        ssm_prefetch_l2(row + s + i * LINE);
}

// Two 16-bit values at p (an even step of a row), as one word; cc1d_word: zero before step
// 0 and at or past L (which is even).
template <typename T>
__device__ __forceinline__ unsigned cc1d_ld_word(const T* p) {
    return *reinterpret_cast<const unsigned*>(p);
}
template <typename T>
__device__ __forceinline__ unsigned cc1d_word(const T* __restrict__ row, int s, int L) {
    return (s >= 0 && s < L) ? cc1d_ld_word(row + s) : 0u;
}

// The two values of a word (the lower step in the low half), and back (round to nearest).
template <typename T> struct cc1d_word16;
template <> struct cc1d_word16<ssm_bf16> {
    static __device__ __forceinline__ float lo(unsigned w) { return ssm_bits_to_float(w << 16); }
    static __device__ __forceinline__ float hi(unsigned w) { return ssm_bits_to_float(w & 0xffff0000u); }
    static __device__ __forceinline__ unsigned pack(float lo, float hi) {
        unsigned w;
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(w) : "f"(hi), "f"(lo));
        return w;
    }
};
template <> struct cc1d_word16<ssm_half> {
    static __device__ __forceinline__ float lo(unsigned w) { return ssm_load(ssm_half{(unsigned short)(w & 0xffffu)}); }
    static __device__ __forceinline__ float hi(unsigned w) { return ssm_load(ssm_half{(unsigned short)(w >> 16)}); }
    static __device__ __forceinline__ unsigned pack(float lo, float hi) {
        unsigned w;
        asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(w) : "f"(hi), "f"(lo));
        return w;
    }
};

// Two floats as a rounded word (hi) and the rounded residual (lo).
template <typename T>
__device__ __forceinline__ void cc1d_split(float a, float b, unsigned& hi, unsigned& lo) {
    typedef cc1d_word16<T> V;
    hi = V::pack(a, b);
    lo = V::pack(a - V::lo(hi), b - V::hi(hi));
}

// The transpose of an 8 x 8 matrix of 16-bit values held as one word per lane (row
// lane / 4, columns 2 (lane % 4), +1), in the same layout.
__device__ __forceinline__ unsigned cc1d_trans(unsigned a) {
    unsigned d;
    asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(d) : "r"(a));
    return d;
}

// The taps as B operands, Wz (DX false) or Wd: lane (g, t) holds column n = g, rows k = 2t,
// 2t + 1 (word 0) and 2t + 8, 2t + 9 (word 1); b[0] the rounded taps, b[1] the residuals.
// (Read from memory by a run-time index: a register array picked by comparisons went to
// local memory.)
template <typename T, int W, bool DX>
__device__ __forceinline__ void cc1d_mma_taps(const float* __restrict__ wrow, int g, int t,
                                              unsigned (&b)[2][2]) {
    constexpr int H = W - 1;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        float v[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const int k = 2 * t + 8 * i + e;
            const int kk = DX ? g + H - k : k - g + H - 8;
            v[e] = (kk >= 0 && kk < W) ? wrow[kk] : 0.0f;
        }
        cc1d_split<T>(v[0], v[1], b[0][i], b[1][i]);
    }
}

// A warp's item (rows x spans, span fastest): its row's pointer offset, channel, first
// step and chunks. Steps are ints (the host keeps L and the item count below 2^31).
struct cc1d_mma_span {
    ssm_i64 base;  // row * L
    unsigned row;
    int d, t0, nc;
    __device__ __forceinline__ cc1d_mma_span(unsigned item, int n_spans, int span, int dim, int L) {
        row = item / (unsigned)n_spans;
        d = (int)(row % (unsigned)dim);
        t0 = (int)(item - row * (unsigned)n_spans) * span;
        nc = (min(span, L - t0) + CC1D_MMA_CHUNK - 1) / CC1D_MMA_CHUNK;
        base = (ssm_i64)row * L;
    }
};

// The words of one chunk a lane reads: x and dy at its steps s = c0 + 8g + 2t and s + 64,
// and (lanes 28-31) x of the row before the chunk, at s - 64. Chunks wholly inside
// [8, L) read without a bound check (one test per chunk, the same for the whole warp).
// ROW0: only the chunk's row 0 (lanes 0-3) and the row before are wanted.
struct cc1d_mma_words {
    unsigned x0, x1, xb, dy0, dy1;
    template <typename T, bool DY>
    __device__ __forceinline__ void load(const T* __restrict__ xr, const T* __restrict__ dyr,
                                         int c0, int L, int g, int t, bool row0) {
        const int s = c0 + 8 * g + 2 * t;
        if (c0 >= 8 && c0 + CC1D_MMA_CHUNK <= L && !row0) {
            x0 = cc1d_ld_word(xr + s);
            x1 = cc1d_ld_word(xr + s + 64);
            xb = g == 7 ? cc1d_ld_word(xr + s - 64) : 0u;
            if (DY) {
                dy0 = cc1d_ld_word(dyr + s);
                dy1 = cc1d_ld_word(dyr + s + 64);
            }
        } else {
            x0 = (!row0 || g == 0) ? cc1d_word(xr, s, L) : 0u;
            x1 = row0 ? 0u : cc1d_word(xr, s + 64, L);
            xb = g == 7 ? cc1d_word(xr, s - 64, L) : 0u;
            if (DY) {
                dy0 = (!row0 || g == 0) ? cc1d_word(dyr, s, L) : 0u;
                dy1 = row0 ? 0u : cc1d_word(dyr, s + 64, L);
            }
        }
    }
};

// A chunk of x and dy in a warp's slot of shared memory, as the rows hold them: x's rows -1
// .. 15 (8 steps each; row -1 is the last of the chunk before), then dy's 128 steps. The
// lanes copy 16 bytes each (lanes 0-15 x's rows 0-15, 16-31 dy's), all to byte 16 + 16 lane;
// dy's words for lane (g, t) are dy[0][lane] and dy[1][lane] (steps 8g + 2t, +1 and 64 + ...).
struct alignas(16) cc1d_mma_slot {
    unsigned x[17][4];
    unsigned dy[2][32];
};

// A word of shared memory at the shared address a.
__device__ __forceinline__ unsigned cc1d_lds(unsigned a) {
    unsigned r;
    asm volatile("ld.shared.u32 %0, [%1];" : "=r"(r) : "r"(a) : "memory");
    return r;
}
// Four 8 x 8 matrices of 16-bit values from shared memory in one ldmatrix: lane l names row
// l % 8 of matrix l / 8 (its 16 bytes at the shared address a); r[i] holds for lane (g, t)
// row g, columns 2t and 2t + 1 of matrix i (TRANS: column g, rows 2t and 2t + 1).
template <bool TRANS>
__device__ __forceinline__ void cc1d_ldsm(unsigned (&r)[4], unsigned a) {
    if constexpr (TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a) : "memory");
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a) : "memory");
}

// X of a chunk from the lane's x words (x0, x1: its rows g and g + 8) and those of the
// lane 4 below; lanes 0-3 take rows 7 and -1 from lanes 28-31 (xb: the row before).
__device__ __forceinline__ void cc1d_mma_x(unsigned x0, unsigned x1, unsigned xb, int lane,
                                           unsigned (&ax)[4]) {
    const int g = lane >> 2, below = (lane + 28) & 31;
    ax[0] = __shfl_sync(0xffffffffu, g == 7 ? xb : x0, below);  // row g - 1
    ax[1] = __shfl_sync(0xffffffffu, g == 7 ? x0 : x1, below);  // row g + 7
    ax[2] = x0;
    ax[3] = x1;
}

// A warp per item (the grid covers them all).
template <typename T, int W, bool HAS_BIAS, bool SILU>
__global__ void __launch_bounds__(CC1D_THREADS)
cc1d_fwd_mma(const T* __restrict__ x, const float* __restrict__ weight,
             const float* __restrict__ bias, T* __restrict__ y, T* __restrict__ final_state,
             int dim, int L, int span, int n_spans, int n_items) {
    typedef cc1d_word16<T> V;
    constexpr int H = W - 1;
    constexpr int CHUNK = CC1D_MMA_CHUNK;
    static_assert(W >= 1 && W <= 8, "a row's window is the row and the 8 steps before it");
    const int lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;
    const unsigned item = blockIdx.x * (CC1D_THREADS / 32) + (threadIdx.x >> 5);
    if (item >= (unsigned)n_items) return;  // whole warps
    const cc1d_mma_span at(item, n_spans, span, dim, L);
    const T* const xr = x + at.base;
    T* const yr = y + at.base;
    unsigned bz[2][2];
    cc1d_mma_taps<T, W, false>(weight + (ssm_i64)at.d * W, g, t, bz);
    const float bv = HAS_BIAS ? bias[at.d] : 0.0f;

    auto step = [&](const cc1d_mma_words& cur, int c) {
        unsigned ax[4];
        cc1d_mma_x(cur.x0, cur.x1, cur.xb, lane, ax);
        float z[4] = {bv, bv, bv, bv};
        ssm_mma16<T>::run(z, ax, bz[0][0], bz[0][1]);
        ssm_mma16<T>::run(z, ax, bz[1][0], bz[1][1]);
        if constexpr (SILU) {
#pragma unroll
            for (int i = 0; i < 4; ++i) z[i] = cc1d_act<float>::silu(z[i]);
        }
        const int c0 = at.t0 + c * CHUNK, s = c0 + 8 * g + 2 * t;
        if (c0 + CHUNK <= L || s < L) *reinterpret_cast<unsigned*>(yr + s) = V::pack(z[0], z[1]);
        if (c0 + CHUNK <= L || s + 64 < L)
            *reinterpret_cast<unsigned*>(yr + s + 64) = V::pack(z[2], z[3]);
    };
    // CC1D_MMA_FWD_BUFS buffers in turn: the next BUFS - 1 chunks' words are read while one
    // chunk is computed (buffer indices fixed at compile time: no register copies).
    constexpr int NB = CC1D_MMA_FWD_BUFS;
    cc1d_mma_words buf[NB];
#pragma unroll
    for (int i = 0; i + 1 < NB; ++i)
        if (i < at.nc) buf[i].load<T, false>(xr, xr, at.t0 + i * CHUNK, L, g, t, false);
    bool more = true;
#pragma unroll 1
    for (int c = 0; more;) {
#pragma unroll
        for (int k = 0; k < NB; ++k) {
            const int ahead = c + NB - 1;
            if (ahead < at.nc)
                buf[(k + NB - 1) % NB].load<T, false>(xr, xr, at.t0 + ahead * CHUNK, L, g, t, false);
            step(buf[k], c);
            if (++c == at.nc) {
                more = false;
                break;
            }
        }
    }
    // the final state: the last H steps of x (zeros before step 0: no initial state)
    if (H > 0 && final_state != nullptr && at.t0 + span >= L && lane < H) {
        const int s = L - H + lane;
        final_state[(ssm_i64)at.row * H + lane] = s >= 0 ? xr[s] : T{0};
    }
}

// Blocks per SM the backward's register budget must allow: 8 (64 registers) measured 0.69
// of copy against 0.60 without a bound (78 registers), bench_causal_conv1d.py --mma-sweep.
#ifndef CC1D_MMA_BWD_BLOCKS
#define CC1D_MMA_BWD_BLOCKS 8
#endif
template <typename T, int W, bool HAS_BIAS, bool SILU>
__global__ void __launch_bounds__(CC1D_THREADS, CC1D_MMA_BWD_BLOCKS)
cc1d_bwd_mma(const T* __restrict__ x, const float* __restrict__ weight,
             const float* __restrict__ bias, const T* __restrict__ dy,
             const float* __restrict__ dfinal, T* __restrict__ dx, float* __restrict__ partial,
             int dim, int L, int span, int n_spans, int n_items) {
    typedef cc1d_word16<T> V;
    typedef ssm_mma16<T> MMA;
    constexpr int H = W - 1;
    constexpr int CHUNK = CC1D_MMA_CHUNK;
    constexpr int NWARPS = CC1D_THREADS / 32;
    constexpr unsigned FULL = 0xffffffffu;
    static_assert(W >= 1 && W <= 8, "a row's window is the row and the 8 steps before it");
    __shared__ float pshare[NWARPS][16 * 8];

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const unsigned item = blockIdx.x * NWARPS + warp;
    if (item >= (unsigned)n_items) return;  // whole warps: nothing below waits for the block
    const cc1d_mma_span at(item, n_spans, span, dim, L);
    const int t0 = at.t0, nc = at.nc;
    const T* const xr = x + at.base;
    const T* const dyr = dy + at.base;
    T* const dxr = dx + at.base;
    unsigned bz[2][2], bd[2][2];
    cc1d_mma_taps<T, W, false>(weight + (ssm_i64)at.d * W, g, t, bz);
    cc1d_mma_taps<T, W, true>(weight + (ssm_i64)at.d * W, g, t, bd);
    const float bv = HAS_BIAS ? bias[at.d] : 0.0f;
    const bool with_dfinal = H > 0 && dfinal != nullptr;

    // g on a chunk's steps of this lane, from the chunk's X operand and the lane's dy words:
    // gv as floats, gh the rounded words, gl the residuals
    auto grad = [&](const unsigned (&ax)[4], unsigned dy0, unsigned dy1, float (&gv)[4],
                    unsigned (&gh)[2], unsigned (&gl)[2]) {
        float z[4] = {bv, bv, bv, bv};
        MMA::run(z, ax, bz[0][0], bz[0][1]);
        MMA::run(z, ax, bz[1][0], bz[1][1]);
        gv[0] = V::lo(dy0);
        gv[1] = V::hi(dy0);
        gv[2] = V::lo(dy1);
        gv[3] = V::hi(dy1);
        if constexpr (SILU) {
#pragma unroll
            for (int i = 0; i < 4; ++i) gv[i] *= cc1d_act<float>::dsilu(z[i]);
        }
        cc1d_split<T>(gv[0], gv[1], gh[0], gl[0]);
        cc1d_split<T>(gv[2], gv[3], gh[1], gl[1]);
    };

    // The lane's steps in a chunk are lo and lo + 64; its pointer into dx at the chunk
    // computed next, stepped down a chunk per chunk.
    const int lo = 8 * g + 2 * t;
    T* dxc = dxr + t0 + lo + (nc - 1) * CHUNK;
    // The chunks reach the warp through a ring of slots in shared memory. The lane copies 16
    // bytes of each (lanes 0-15 x, 16-31 dy; steps v .. v + 7, v = c0 + 8 (lane % 16)) with one
    // pointer, stepped down a chunk per chunk, zeros outside [max(t0 - 8, 0), L) (nothing read
    // there); lane 15 also copies its x into row -1 of the slot of the chunk after (walked
    // before). The copies go on past chunk 0 (into slots no longer read): c = -1 brings the x
    // of the 8 steps before the span, and those after it zeros.
    constexpr int AHEAD = CC1D_MMA_BWD_AHEAD, SLOTS = AHEAD + 1;
    static_assert(AHEAD >= 2, "a chunk and its row -1 are read while the next copies land");
    __shared__ cc1d_mma_slot ring[NWARPS][SLOTS];
    constexpr unsigned SLOT = sizeof(cc1d_mma_slot);
    // The lane's addresses in slot 0 (pinned in registers: the compiler would rebuild them
    // at every use): its copy; its rows for ldmatrix of X (the A operand: rows g - 1, g + 7,
    // g, g + 8 of the chunk's x) and of X^T (rows g - 1, g, g + 7, g + 8), row r at 16 (r + 1);
    // its dy words.
    const unsigned ring0 = (unsigned)__cvta_generic_to_shared(&ring[warp][0]);
    unsigned at_copy = ring0 + 16 + 16 * lane;
    unsigned at_x = ring0 + 16 * ((lane & 15) + (lane >> 4));
    unsigned at_xt = ring0 + 16 * ((lane & 7) + ((lane >> 3) & 1) + ((lane >> 4) << 3));
    unsigned at_dy = ring0 + (unsigned)sizeof(cc1d_mma_slot::x) + 4 * lane;
    asm volatile("" : "+r"(at_copy), "+r"(at_x), "+r"(at_xt), "+r"(at_dy));
    const int vmin = max(t0 - 8, 0);
    int v = t0 + 8 * (lane & 15) + (nc - 1) * CHUNK;
    const T* src = (lane < 16 ? xr : dyr) + v;
    auto load = [&](int slot, bool row_before) {
        const bool live = v >= vmin && v < L;
        ssm_cp_async16_zfill(at_copy + slot * SLOT, src, live);
        if (row_before && lane == 15)
            ssm_cp_async16_zfill(ring0 + (slot + AHEAD) % SLOTS * SLOT, src, live);
        src -= CHUNK;
        v -= CHUNK;
    };

    // lanes 0-3: g on the row after the chunk (pair t), rounded and residual; first, chunk
    // nc's row 0 when it holds a step < L (past the span: its g only)
    unsigned nh = 0u, nl = 0u;
    if (t0 + nc * CHUNK < L) {
        cc1d_mma_words w;
        w.load<T, true>(xr, dyr, t0 + nc * CHUNK, L, g, t, true);
        unsigned ax[4], gh[2], gl[2];
        float gv[4];
        cc1d_mma_x(w.x0, w.x1, w.xb, lane, ax);
        grad(ax, w.dy0, w.dy1, gv, gh, gl);
        nh = gh[0];
        nl = gl[0];
    }
    float P[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    float db = 0.0f;
    const int above = (lane + 4) & 31;
    auto step = [&](int slot, int c) {
        unsigned ax[4], gh[2], gl[2];
        float gv[4];
        cc1d_ldsm<false>(ax, at_x + slot * SLOT);
        grad(ax, cc1d_lds(at_dy + slot * SLOT), cc1d_lds(at_dy + slot * SLOT + 128), gv, gh, gl);
        db += (gv[0] + gv[1]) + (gv[2] + gv[3]);
        // dx: G from the lane's words and those of the lane 4 above (lanes 28-31: lanes 0-3,
        // rows 8 and 16, the latter from the chunk after)
        const unsigned ah[4] = {gh[0], gh[1], __shfl_sync(FULL, g == 0 ? gh[1] : gh[0], above),
                                __shfl_sync(FULL, g == 0 ? nh : gh[1], above)};
        const unsigned al[4] = {gl[0], gl[1], __shfl_sync(FULL, g == 0 ? gl[1] : gl[0], above),
                                __shfl_sync(FULL, g == 0 ? nl : gl[1], above)};
        float o[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        MMA::run(o, ah, bd[0][0], bd[0][1]);
        MMA::run(o, al, bd[0][0], bd[0][1]);
        MMA::run(o, ah, bd[1][0], bd[1][1]);
        const int c0 = t0 + c * CHUNK;
        if (with_dfinal && c0 + CHUNK > L - H) {  // the final state's steps [L - H, L)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int f = c0 + lo + 64 * (i >> 1) + (i & 1) - (L - H);
                if (f >= 0 && f < H) o[i] += dfinal[(ssm_i64)at.row * H + f];
            }
        }
        T* const dp = dxc;
        dxc -= CHUNK;
        if (c0 + CHUNK <= L || c0 + lo < L) *reinterpret_cast<unsigned*>(dp) = V::pack(o[0], o[1]);
        if (c0 + CHUNK <= L || c0 + lo + 64 < L)
            *reinterpret_cast<unsigned*>(dp + 64) = V::pack(o[2], o[3]);

        // dweight: P += X^T G8, X^T read from the slot transposed, G8 transposed 8 x 8 block
        // by block in registers
        unsigned xt[4];
        cc1d_ldsm<true>(xt, at_xt + slot * SLOT);
        MMA::run(P, xt, cc1d_trans(gh[0]), cc1d_trans(gh[1]));
        MMA::run(P, xt, cc1d_trans(gl[0]), cc1d_trans(gl[1]));
        nh = gh[0];
        nl = gl[0];
    };
    // The walk: chunks nc - 1 down to 0, the i-th of them in slot i % (AHEAD + 1), copied
    // AHEAD chunks before it is computed. One group of copies per chunk: waiting for all but
    // the newest AHEAD - 1 groups lands this chunk and its row -1; __syncwarp makes the lanes'
    // copies the warp's.
#pragma unroll 1
    for (int i = 0; i < AHEAD; ++i) {
        load(i, i > 0);
        ssm_cp_commit();
    }
    auto walk = [&](int k, int c) {
        load((k + AHEAD) % SLOTS, true);
        ssm_cp_commit();
        ssm_cp_wait<AHEAD - 1>();
        __syncwarp();
        step(k, c);
    };
    int c = nc - 1;
#pragma unroll 1
    for (; c >= SLOTS - 1; c -= SLOTS) {  // whole turns of the ring
#pragma unroll
        for (int k = 0; k < SLOTS; ++k) walk(k, c - k);
    }
#pragma unroll 1
    for (int k = 0; k <= c; ++k) walk(k, c - k);  // the rest, c + 1 < SLOTS chunks
    ssm_cp_wait<0>();  // (the copies past c = -1 write zeros: none may be left in flight)

    // The span's partials: dweight[kk] from P's diagonals (P through shared memory), dbias
    float* const ps = pshare[warp];
    ps[g * 8 + 2 * t] = P[0];
    ps[g * 8 + 2 * t + 1] = P[1];
    ps[(g + 8) * 8 + 2 * t] = P[2];
    ps[(g + 8) * 8 + 2 * t + 1] = P[3];
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) db += __shfl_xor_sync(FULL, db, m);
    __syncwarp();
    float* const out = partial + (ssm_i64)item * (W + 1);
    if (lane < W) {
        float sum = 0.0f;
#pragma unroll
        for (int n = 0; n < 8; ++n) sum += ps[(n + lane + 8 - H) * 8 + n];
        out[lane] = sum;
    } else if (lane == W) {
        out[W] = db;
    }
}

// ---------------------------------------------------------------------------------------
// cc1d_bwd_warp: the backward with a warp per span and every neighbour in registers
// (16-bit types and float32; no seq_idx or initial state; L a multiple of 8, rows 16-byte
// aligned: the host sends every other case to the kernels above).
//
// cc1d_bwd's blocks meet at three barriers per tile and keep the chunk edges in shared
// memory; at W = 8 in bfloat16 they ran at half the issue rate with 20 warps per SM. Here a
// warp owns a span of one row (a multiple of CC1D_WARP_CHUNK steps) and walks it from its
// last chunk to its first; lane l holds the 8 steps c0 + 8l .. c0 + 8l + 7 of the chunk at
// c0 (one 16-byte vector of a 16-bit type, two of float32). Nothing waits for another warp:
// - x before a lane's steps comes from lane l - 1 by one shuffle per step; lane 0's from
//   lane 31 of the chunk before, which the warp has already read ahead (lane 31 hands over
//   those registers in place of its own, which no lane needs);
// - g after a lane's steps comes from lane l + 1; lane 31's from lane 0 of the chunk after,
//   walked just before (lane 0 keeps those H values of g for it). Before the first chunk
//   walked, every lane computes g on the H steps after the span (zero past L).
// The taps, the bias and the partial sums of dweight and dbias stay in registers for the
// whole span; at its end one reduce-scatter over the warp gives its partials, (batch, dim,
// n_spans, W + 1) as in cc1d_bwd_mma, summed by cc1d_wsum in a fixed order.
// The next chunk's words are read while this one is computed, into two buffers in turn.
// ---------------------------------------------------------------------------------------
#define CC1D_WARP_CHUNK 256  // steps per warp and round: 8 per lane
// Blocks of CC1D_THREADS per SM the register bound leaves room for (8: 64 registers, 7: 72,
// 6: 80, 5: 96). The backward's: the best of 5-8 measured per type and width
// (bench_causal_conv1d.py --warp-blocks, kernel alone, fraction of copy). 16-bit types gain
// from more warps while the window fits (bfloat16 W = 4: 0.73 / 0.78 / 0.81 / 0.82 with
// 5 / 6 / 7 / 8; 7 taken, as 8 made ptxas spill a few bytes without silu); wider windows
// spill below their need (W = 8: 0.62 / 0.62 / 0.56 / 0.45). float32 needs the registers
// sooner (W = 8: 0.95 / 0.76 / 0.65 / 0.59). The forward (cc1d_fwd_warp) holds less: 8,
// or 7 where ptxas spilled at 64 (16-bit W = 8, float32 from W = 5). -DCC1D_WARP_BLOCKS=n and
// -DCC1D_WARP_FWD_BLOCKS=n set n for every backward and forward instantiation.
#ifndef CC1D_WARP_BLOCKS
#define CC1D_WARP_BLOCKS 0  // 0: per type and width, as below
#endif
#ifndef CC1D_WARP_FWD_BLOCKS
#define CC1D_WARP_FWD_BLOCKS 0
#endif
template <typename T, int W, bool FWD = false> struct cc1d_warp_blocks {
    static constexpr int measured = FWD ? (W <= (sizeof(T) == 2 ? 7 : 4) ? 8 : 7)
                                        : sizeof(T) == 2 ? (W <= 3 ? 8 : W <= 5 ? 7 : W <= 7 ? 6 : 5)
                                                         : (W <= 5 ? 6 : 5);
    static constexpr int forced = FWD ? CC1D_WARP_FWD_BLOCKS : CC1D_WARP_BLOCKS;
    static constexpr int value = forced > 0 ? forced : measured;
};

// Eight consecutive steps of a row as stored: one 16-byte vector of a 16-bit type (kept
// packed until used), two of float32.
template <typename T> struct cc1d_oct {
    static constexpr int E = 16 / (int)sizeof(T);
    static constexpr int NV = 8 / E;
    cc1d_words u[NV];
    __device__ __forceinline__ void load(const T* __restrict__ p) {
#pragma unroll
        for (int v = 0; v < NV; ++v) u[v] = reinterpret_cast<const cc1d_words*>(p)[v];
    }
    __device__ __forceinline__ void zero() {
#pragma unroll
        for (int v = 0; v < NV; ++v) u[v].w[0] = u[v].w[1] = u[v].w[2] = u[v].w[3] = 0u;
    }
    __device__ __forceinline__ void unpack(float (&r)[8]) const {
#pragma unroll
        for (int v = 0; v < NV; ++v)
            cc1d_unpack_words<T, float, E>(u[v], *reinterpret_cast<float(*)[E]>(r + v * E));
    }
    static __device__ __forceinline__ void store(T* __restrict__ p, const float (&r)[8]) {
#pragma unroll
        for (int v = 0; v < NV; ++v) {
            unsigned w[4];
            cc1d_pack<T>::run(*reinterpret_cast<const float(*)[E]>(r + v * E), w);
            asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};"
                         :: "l"(p + v * E), "r"(w[0]), "r"(w[1]), "r"(w[2]), "r"(w[3]) : "memory");
        }
    }
};

// A warp's span: item = warp number in the grid (rows x spans, span fastest), the span
// [s0, s1) of row `row` (channel d); base = row * L; and the channel's taps.
struct cc1d_warp_span {
    unsigned item, row;
    int d;
    ssm_i64 s0, s1, base;
    __device__ __forceinline__ cc1d_warp_span(int n_spans, ssm_i64 span, int dim, ssm_i64 L) {
        item = blockIdx.x * (CC1D_THREADS / 32) + (threadIdx.x >> 5);
        row = item / (unsigned)n_spans;  // 32 bits: the host checks n_items < 2^31
        d = (int)(row % (unsigned)dim);
        s0 = (ssm_i64)(item - row * (unsigned)n_spans) * span;
        s1 = min(s0 + span, L);
        base = (ssm_i64)row * L;
    }
    // the channel's taps and bias (0 without)
    template <int W, bool HAS_BIAS>
    __device__ __forceinline__ void taps(const float* __restrict__ weight,
                                         const float* __restrict__ bias, float (&w)[W],
                                         float& bv) const {
#pragma unroll
        for (int k = 0; k < W; ++k) w[k] = weight[(ssm_i64)d * W + k];
        bv = HAS_BIAS ? bias[d] : 0.0f;
    }
};

// bias + sum_k w[k] x[i - H + k] for step i of a lane's 8: x before them in xp, theirs in xv.
template <int W>
__device__ __forceinline__ float cc1d_warp_z(const float (&w)[W], float bv,
                                             const float (&xp)[W > 1 ? W - 1 : 1],
                                             const float (&xv)[8], int i) {
    float z = bv;
#pragma unroll
    for (int k = 0; k < W; ++k) z += w[k] * cc1d_pick<W - 1, 8>(xp, xv, i + k);
    return z;
}

template <typename T, int W, bool HAS_BIAS, bool SILU>
__global__ void __launch_bounds__(CC1D_THREADS, (cc1d_warp_blocks<T, W>::value))
cc1d_bwd_warp(const T* __restrict__ x, const float* __restrict__ weight,
              const float* __restrict__ bias, const T* __restrict__ dy,
              const float* __restrict__ dfinal, T* __restrict__ dx, float* __restrict__ partial,
              int dim, ssm_i64 L, ssm_i64 span, int n_spans, int n_items) {
    constexpr int H = W - 1;
    constexpr int HS = H > 0 ? H : 1;
    constexpr int CH = CC1D_WARP_CHUNK;
    constexpr int RED = W + 1 <= 2 ? 2 : (W + 1 <= 4 ? 4 : (W + 1 <= 8 ? 8 : 16));  // padded
    constexpr unsigned FULL = 0xffffffffu;
    static_assert(W >= 1 && W <= 8, "a lane's window is its 8 steps and the H before them");
    typedef cc1d_oct<T> Oct;

    const int lane = threadIdx.x & 31;
    const cc1d_warp_span at(n_spans, span, dim, L);
    if (at.item >= (unsigned)n_items) return;  // whole warps: nothing below waits for the block
    const unsigned row = at.row;
    const ssm_i64 s0 = at.s0, s1 = at.s1;
    const T* const xr = x + at.base;
    const T* const dyr = dy + at.base;
    T* const dxr = dx + at.base;
    float w[W], bv;
    at.taps<W, HAS_BIAS>(weight, bias, w, bv);
    const bool with_dfinal = H > 0 && dfinal != nullptr;

    // g = dy * silu'(z) (or dy) on a lane's 8 steps, from x on the H steps before them (xp)
    // and on the steps themselves (xv)
    auto grad_in = [&](const float (&xp)[HS], const float (&xv)[8], float (&g)[8]) {
        if constexpr (SILU) {
#pragma unroll
            for (int i = 0; i < 8; ++i) g[i] *= cc1d_act<float>::dsilu(cc1d_warp_z<W>(w, bv, xp, xv, i));
        }
    };

    // Lane 0's hand-over to lane 31: g on the H steps after the current chunk; first, after
    // the span (every lane computes it: x on [s1 - 8, s1 + 8), dy on [s1, s1 + 8), all
    // inside the row since s1 < L, both multiples of 8, and s1 >= CH).
    float gkeep[HS];
#pragma unroll
    for (int j = 0; j < HS; ++j) gkeep[j] = 0.0f;
    if (H > 0 && s1 < L) {
        Oct a, b, c;
        a.load(xr + s1 - 8);
        b.load(xr + s1);
        c.load(dyr + s1);
        float xa[8], xv[8], g[8];
        a.unpack(xa);
        b.unpack(xv);
        c.unpack(g);
        float xp[HS];
#pragma unroll
        for (int j = 0; j < HS; ++j) xp[j] = xa[(8 - H + j) & 7];
        grad_in(xp, xv, g);
#pragma unroll
        for (int j = 0; j < HS; ++j) gkeep[j] = g[j];
    }

    float dw[RED];  // dw[W] accumulates dbias; entries past W stay zero
#pragma unroll
    for (int k = 0; k < RED; ++k) dw[k] = 0.0f;

    // One chunk: compute `cur` (the chunk at c0) while `nxt` receives the one before it
    // (or, at the span's first chunk, lane 31 the 8 steps before the span); false when the
    // span is done.
    ssm_i64 c0 = s0 + (s1 - s0 - 1) / CH * CH;
    auto step = [&](const Oct& cx, const Oct& cdy, Oct& nx, Oct& ndy) {
        const ssm_i64 s = c0 + 8 * lane;  // this lane's first step
        const bool more = c0 > s0;
        if (more) {
            nx.load(xr + s - CH);
            ndy.load(dyr + s - CH);
            if (CC1D_L2_AHEAD_BWD > 0 && c0 - CC1D_L2_AHEAD_BWD * CH >= s0) {
                // (a whole chunk inside the span)
                cc1d_prefetch<T, CH, false>(xr, c0 - CC1D_L2_AHEAD_BWD * CH, 0, lane, 0);
                cc1d_prefetch<T, CH, false>(dyr, c0 - CC1D_L2_AHEAD_BWD * CH, 0, lane, 16);
            }
        } else if (lane == 31 && c0 > 0) {
            nx.load(xr + c0 - 8);
        } else {
            nx.zero();
        }
        float xv[8], g[8], xn[8];
        cx.unpack(xv);
        cdy.unpack(g);
        nx.unpack(xn);
        float xp[HS];
#pragma unroll
        for (int j = 0; j < H; ++j)
            xp[j] = __shfl_sync(FULL, lane == 31 ? xn[8 - H + j] : xv[8 - H + j], (lane + 31) & 31);
        grad_in(xp, xv, g);
        float gn[HS];  // g on the H steps after this lane's
#pragma unroll
        for (int j = 0; j < H; ++j) {
            gn[j] = __shfl_sync(FULL, lane == 0 ? gkeep[j] : g[j], (lane + 1) & 31);
            gkeep[j] = g[j];
        }
        float o[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            float acc = 0.0f;
#pragma unroll
            for (int k = 0; k < W; ++k) {  // step i + H - k reads step i through tap k
                const int m = i + H - k;
                acc += w[k] * (m < 8 ? g[m < 8 ? m : 0] : gn[m < 8 ? 0 : m - 8]);
            }
            o[i] = acc;
            dw[W] += g[i];
#pragma unroll
            for (int k = 0; k < W; ++k) dw[k] += g[i] * cc1d_pick<H, 8>(xp, xv, i + k);
        }
        if (with_dfinal && c0 + CH > L - H) {  // the final state's steps [L - H, L)
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                const ssm_i64 f = s + i - (L - H);
                if (f >= 0 && f < H) o[i] += dfinal[(ssm_i64)row * H + f];
            }
        }
        if (s < L) Oct::store(dxr + s, o);
        c0 -= CH;
        return more;
    };

    Oct ax, ady, bx, bdy;
    if (c0 + 8 * lane < L) {
        ax.load(xr + c0 + 8 * lane);
        ady.load(dyr + c0 + 8 * lane);
    } else {
        ax.zero();
        ady.zero();
    }
#pragma unroll 1
    while (step(ax, ady, bx, bdy) && step(bx, bdy, ax, ady)) {
    }

    // The span's partials: a fixed reduce-scatter over the warp (lane `own` ends with the
    // sum of entry `off`)
    int off = 0;
    bool own = true;
    ssm_reduce_scatter<RED, 16>::run(dw, lane, FULL, off, own);
    if (own && off <= W) partial[(ssm_i64)at.item * (W + 1) + off] = dw[0];
}

// The forward the same way (the same types and conditions; no initial state): a warp walks
// its span from the first chunk to the last; x before a lane's steps comes from lane l - 1,
// lane 0's from lane 31 of the chunk before (each lane keeps its last H values of x for
// that: lane 31's are the ones wanted). The next chunk's x is read while this one is
// computed. final: (batch, dim, W - 1), the last W - 1 steps of x (L >= 8 > W - 1).
template <typename T, int W, bool HAS_BIAS, bool SILU>
__global__ void __launch_bounds__(CC1D_THREADS, (cc1d_warp_blocks<T, W, true>::value))
cc1d_fwd_warp(const T* __restrict__ x, const float* __restrict__ weight,
              const float* __restrict__ bias, T* __restrict__ y, T* __restrict__ final,
              int dim, ssm_i64 L, ssm_i64 span, int n_spans, int n_items) {
    constexpr int H = W - 1;
    constexpr int HS = H > 0 ? H : 1;
    constexpr int CH = CC1D_WARP_CHUNK;
    constexpr unsigned FULL = 0xffffffffu;
    static_assert(W >= 1 && W <= 8, "a lane's window is its 8 steps and the H before them");
    typedef cc1d_oct<T> Oct;

    const int lane = threadIdx.x & 31;
    const cc1d_warp_span at(n_spans, span, dim, L);
    if (at.item >= (unsigned)n_items) return;  // whole warps: nothing below waits for the block
    const ssm_i64 s0 = at.s0, s1 = at.s1;
    const T* const xr = x + at.base;
    T* const yr = y + at.base;
    float w[W], bv;
    at.taps<W, HAS_BIAS>(weight, bias, w, bv);
    const bool with_final = H > 0 && final != nullptr;
    T* const fr = final + (ssm_i64)at.row * H;

    float xkeep[HS];  // x on the H steps before the chunk (zeros before step 0)
#pragma unroll
    for (int j = 0; j < HS; ++j) xkeep[j] = 0.0f;
    if (H > 0 && s0 > 0) {
        Oct a;
        a.load(xr + s0 - 8);
        float xa[8];
        a.unpack(xa);
#pragma unroll
        for (int j = 0; j < HS; ++j) xkeep[j] = xa[(8 - H + j) & 7];
    }

    ssm_i64 c0 = s0;
    // 16-bit types only: the forward runs float32 in cc1d_fwd, and here the prefetch made
    // ptxas spill it at 64-72 registers
    constexpr int AHEAD = sizeof(T) == 2 ? CC1D_L2_AHEAD_FWD : 0;
    auto step = [&](const Oct& cx, Oct& nx) {
        const ssm_i64 s = c0 + 8 * lane;  // this lane's first step
        const bool more = c0 + CH < s1;
        if (more && s + CH < L) {
            nx.load(xr + s + CH);
        } else {
            nx.zero();
        }
        if (AHEAD > 0 && c0 + AHEAD * CH < s1)
            cc1d_prefetch<T, CH, true>(xr, c0 + AHEAD * CH, s1, lane, 0);
        float xv[8];
        cx.unpack(xv);
        float xp[HS];
#pragma unroll
        for (int j = 0; j < H; ++j) {
            xp[j] = __shfl_sync(FULL, lane == 31 ? xkeep[j] : xv[8 - H + j], (lane + 31) & 31);
            xkeep[j] = xv[8 - H + j];
        }
        float o[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const float z = cc1d_warp_z<W>(w, bv, xp, xv, i);
            o[i] = SILU ? cc1d_act<float>::silu(z) : z;
        }
        if (s < L) Oct::store(yr + s, o);
        if (with_final && c0 + CH > L - H) {  // the final state's steps [L - H, L)
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                const ssm_i64 f = s + i - (L - H);
                if (f >= 0 && f < H) ssm_store(fr + f, xv[i]);
            }
        }
        c0 += CH;
        return more;
    };

    Oct a, b;
    if (c0 + 8 * lane < L) {
        a.load(xr + c0 + 8 * lane);
    } else {
        a.zero();
    }
#pragma unroll 1
    while (step(a, b) && step(b, a)) {
    }
}

// ---------------------------------------------------------------------------------------
// dweight[d, k] = sum over b and tiles of partial[b, d, tile, k], and dbias[d] the same of
// entry W: one thread per (d, k), summing b-major then tile, a fixed order (no atomics).
// The loads go out CC1D_WSUM_LOADS at a time before their sums: one after the other, each
// waiting for the sum before it, they took 5.3-6.0 us at 8 terms (Nsight Compute, H200),
// 6% of the bfloat16 backward at 8 x 3072 x 2048; together, 3.6 us.
// ---------------------------------------------------------------------------------------
#define CC1D_WSUM_LOADS 8
template <typename CT>
__global__ void __launch_bounds__(CC1D_THREADS)
cc1d_wsum(const CT* __restrict__ partial, CT* __restrict__ dweight, CT* __restrict__ dbias,
          int batch, int dim, int n_tiles, int width) {
    const ssm_i64 i = (ssm_i64)blockIdx.x * CC1D_THREADS + threadIdx.x;
    const int K = width + 1;
    if (i >= (ssm_i64)dim * K) return;
    const int d = (int)(i / K), k = (int)(i - (ssm_i64)d * K);
    if (k == width && dbias == nullptr) return;
    // term j = b n_tiles + t sits at partial[((b dim + d) n_tiles + t) K + k]
    const int n = batch * n_tiles;
    CT s = 0;
    for (int j0 = 0; j0 < n; j0 += CC1D_WSUM_LOADS) {
        CT v[CC1D_WSUM_LOADS];
#pragma unroll
        for (int u = 0; u < CC1D_WSUM_LOADS; ++u) {
            const int j = j0 + u, b = j / n_tiles, t = j - b * n_tiles;
            v[u] = j < n ? partial[(((ssm_i64)b * dim + d) * n_tiles + t) * K + k] : CT(0);
        }
#pragma unroll
        for (int u = 0; u < CC1D_WSUM_LOADS; ++u)
            if (j0 + u < n) s += v[u];
    }
    if (k < width) {
        dweight[(ssm_i64)d * width + k] = s;
    } else {
        dbias[d] = s;
    }
}

// ---------------------------------------------------------------------------------------
// Decoding steps: one thread per (b, d). Row b reads and writes state row rows[b] (b
// without rows); a negative index is a padding row (zeros out, state untouched). The host
// has checked that indices are < pool and not repeated. state: (pool, dim, W-1) with any
// strides (in elements); x, y: (batch, dim, steps) contiguous.
// ---------------------------------------------------------------------------------------
template <typename T, int W, bool HAS_BIAS, bool SILU>
__global__ void __launch_bounds__(CC1D_THREADS)
cc1d_update(const T* __restrict__ x, T* __restrict__ state,
            const typename ssm_compute_of<T>::type* __restrict__ weight,
            const typename ssm_compute_of<T>::type* __restrict__ bias,
            const ssm_i64* __restrict__ rows, T* __restrict__ y, int batch, int dim, ssm_i64 steps,
            ssm_i64 stride_pool, ssm_i64 stride_dim, ssm_i64 stride_k) {
    typedef typename ssm_compute_of<T>::type CT;
    constexpr int H = W - 1;
    const ssm_i64 i = (ssm_i64)blockIdx.x * CC1D_THREADS + threadIdx.x;
    if (i >= (ssm_i64)batch * dim) return;
    const int b = (int)(i / dim);
    const int d = (int)(i - (ssm_i64)b * dim);
    const ssm_i64 slot = rows == nullptr ? (ssm_i64)b : rows[b];
    const T* xr = x + i * steps;
    T* yr = y + i * steps;
    if (slot < 0) {
        for (ssm_i64 t = 0; t < steps; ++t) ssm_store(yr + t, (CT)0);
        return;
    }
    T* sp = state + slot * stride_pool + (ssm_i64)d * stride_dim;
    CT win[W];
#pragma unroll
    for (int k = 0; k < H; ++k) win[k] = ssm_load(sp[k * stride_k]);
    CT w[W];
#pragma unroll
    for (int k = 0; k < W; ++k) w[k] = weight[(ssm_i64)d * W + k];
    const CT bv = HAS_BIAS ? bias[d] : (CT)0;
#pragma unroll 1
    for (ssm_i64 t = 0; t < steps; ++t) {
        win[H] = ssm_load(xr[t]);
        CT acc = bv;
#pragma unroll
        for (int k = 0; k < W; ++k) acc += w[k] * win[k];
#pragma unroll
        for (int k = 0; k < H; ++k) win[k] = win[k + 1];
        ssm_store(yr + t, SILU ? cc1d_act<CT>::silu(acc) : acc);
    }
#pragma unroll
    for (int k = 0; k < H; ++k) ssm_store(sp + k * stride_k, win[k]);
}
