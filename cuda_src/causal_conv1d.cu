// causal_conv1d.cu: depthwise causal convolution over time, its backward, and decoding steps.
//
// y[b, d, t] = bias[d] + sum_k w[d, k] * xpad[b, d, t + k]  (then silu), where xpad is x
// preceded by the W-1 values of the initial state. With seq_idx, an input of another
// sequence than step t counts as zero; the initial state belongs to the first sequence.
//
// Layout: x, y, dy, dx are (batch, dim, L), time contiguous. A block owns one time tile of
// one channel row (b, d); the grid is rows x tiles, tile fastest. The memory traffic is the
// whole cost, so every global access of the tile body is a 16-byte vector (when L and the
// pointers allow it), and the W-1 neighbours that a step needs from the steps before it
// (forward) or after it (backward) are read from a shared-memory copy of the tile with
// halos. Thread `tid` owns vectors v*THREADS + tid (v < cc1d_shape<T>::VPT) of the tile, so that each
// warp-wide access is one contiguous 512-byte run.
//
// Template parameters: T the storage type (ssm_half, ssm_bf16, float, double; arithmetic in
// float, or double for double), W the width (1..8, compile time: the taps live in
// registers), and the flags HAS_BIAS, SILU, HAS_SEQ, so the hot loops carry no branch.
//
// Determinism: the backward writes per-block partial sums of dweight and dbias (reduced
// inside the block by a fixed shuffle tree and then over warps in order); the host sums
// them over tiles and batch in a fixed order. No atomics.
#include "ssm_common.cuh"

// Threads per block, and 16-byte vectors per thread per tile: 4 for 4-byte storage
// (float32 measured 0.79 / 0.96 of copy bandwidth forward / backward with 4 against
// 0.69 / 0.79 with 2), 2 for the others (the best bfloat16 shape measured). The host
// (ssmkit/_gpu/causal_conv1d.py) assumes these values; the benchmark overrides them
// with -D to time other tile shapes.
#ifndef CC1D_THREADS
#define CC1D_THREADS 128
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
};

// Elements [t, t + E) of a row into compute registers; zeros past L.
template <typename T, typename CT, int E>
__device__ __forceinline__ void cc1d_load(const T* __restrict__ row, ssm_i64 t, ssm_i64 L,
                                          bool vec_ok, CT (&r)[E]) {
    if (vec_ok && t + E <= L) {
        const cc1d_vec<T> v = *reinterpret_cast<const cc1d_vec<T>*>(row + t);
#pragma unroll
        for (int i = 0; i < E; ++i) r[i] = ssm_load(v.v[i]);
    } else {
#pragma unroll
        for (int i = 0; i < E; ++i) r[i] = (t + i < L) ? (CT)ssm_load(row[t + i]) : (CT)0;
    }
}

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

template <typename CT>
__device__ __forceinline__ CT cc1d_silu(CT z) { return z * ssm_math<CT>::sigmoid(z); }

// d silu(z) / dz = s (1 + z (1 - s)), s = sigmoid(z).
template <typename CT>
__device__ __forceinline__ CT cc1d_dsilu(CT z) {
    const CT s = ssm_math<CT>::sigmoid(z);
    return s * ((CT)1 + z * ((CT)1 - s));
}

// Block (row, tile) of a rows x n_tiles grid, tile fastest.
struct cc1d_place {
    ssm_i64 row;  // b * dim + d
    int b, d, tile;
    __device__ __forceinline__ cc1d_place(int dim, int n_tiles) {
        const ssm_i64 blk = blockIdx.x;
        row = blk / n_tiles;
        tile = (int)(blk - row * n_tiles);
        b = (int)(row / dim);
        d = (int)(row - (ssm_i64)b * dim);
    }
};

// Stage the tile body [t0, t0 + TILE) of x (and of the sequence ids) in shared memory at
// offset OFF, and the H steps before it at OFF - H: from x, or for t < 0 from the initial
// state (zeros without one), whose steps belong to the first sequence.
template <typename T, typename CT, int H, int OFF, bool HAS_SEQ>
__device__ __forceinline__ void cc1d_stage_x(const T* __restrict__ xrow, const CT* __restrict__ h0row,
                                             const int* __restrict__ srow, ssm_i64 t0, ssm_i64 L,
                                             bool vec_ok, CT* xs, int* ss) {
    constexpr int E = cc1d_shape<T>::E;
    const int tid = threadIdx.x;
#pragma unroll
    for (int v = 0; v < cc1d_shape<T>::VPT; ++v) {
        const int lt = (v * CC1D_THREADS + tid) * E;
        CT r[E];
        cc1d_load<T, CT, E>(xrow, t0 + lt, L, vec_ok, r);
#pragma unroll
        for (int i = 0; i < E; ++i) xs[OFF + lt + i] = r[i];
        if constexpr (HAS_SEQ) {
#pragma unroll
            for (int i = 0; i < E; ++i) ss[OFF + lt + i] = (t0 + lt + i < L) ? srow[t0 + lt + i] : -1;
        }
    }
    if (tid < H) {
        const ssm_i64 s = t0 - H + tid;
        CT hv = 0;
        int hs = 0;
        if (s >= 0) {
            hv = ssm_load(xrow[s]);
            if constexpr (HAS_SEQ) hs = srow[s];
        } else {
            if (h0row != nullptr) hv = h0row[H + s];
            if constexpr (HAS_SEQ) hs = srow[0];
        }
        xs[OFF - H + tid] = hv;
        if constexpr (HAS_SEQ) ss[OFF - H + tid] = hs;
    }
}

// ---------------------------------------------------------------------------------------
// Forward: y, and the final state (last W-1 steps of xpad) from the last tile's block.
// ---------------------------------------------------------------------------------------
template <typename T, int W, bool HAS_BIAS, bool SILU, bool HAS_SEQ>
__global__ void __launch_bounds__(CC1D_THREADS)
cc1d_fwd(const T* __restrict__ x, const typename ssm_compute_of<T>::type* __restrict__ weight,
         const typename ssm_compute_of<T>::type* __restrict__ bias,
         const typename ssm_compute_of<T>::type* __restrict__ h0, const int* __restrict__ seq,
         T* __restrict__ y, T* __restrict__ final_state, int dim, ssm_i64 L, int n_tiles,
         int vec_ok) {
    typedef typename ssm_compute_of<T>::type CT;
    constexpr int H = W - 1;
    constexpr int E = cc1d_shape<T>::E;
    constexpr int TILE = cc1d_shape<T>::TILE;
    constexpr int OFF = ssm_round_up(H, 4);  // the body starts 16-byte aligned
    static_assert(TILE >= H, "a tile must hold the halo");
    __shared__ alignas(16) CT xs[OFF + TILE];
    __shared__ int ss[HAS_SEQ ? OFF + TILE : 1];

    const cc1d_place at(dim, n_tiles);
    const int tid = threadIdx.x;
    const ssm_i64 t0 = (ssm_i64)at.tile * TILE;
    const int* srow = HAS_SEQ ? seq + (ssm_i64)at.b * L : nullptr;
    cc1d_stage_x<T, CT, H, OFF, HAS_SEQ>(x + at.row * L, h0 == nullptr ? nullptr : h0 + at.row * H,
                                         srow, t0, L, vec_ok != 0, xs, ss);
    CT w[W];
#pragma unroll
    for (int k = 0; k < W; ++k) w[k] = weight[(ssm_i64)at.d * W + k];
    const CT bv = HAS_BIAS ? bias[at.d] : (CT)0;
    __syncthreads();

#pragma unroll
    for (int v = 0; v < cc1d_shape<T>::VPT; ++v) {
        const int lt = (v * CC1D_THREADS + tid) * E;
        CT win[E + H];
        int sw[HAS_SEQ ? E + H : 1];
#pragma unroll
        for (int j = 0; j < E + H; ++j) {
            win[j] = xs[OFF - H + lt + j];
            if constexpr (HAS_SEQ) sw[j] = ss[OFF - H + lt + j];
        }
        CT out[E];
#pragma unroll
        for (int i = 0; i < E; ++i) {
            CT acc = bv;
#pragma unroll
            for (int k = 0; k < W; ++k) {
                if constexpr (HAS_SEQ) {
                    acc += (sw[i + k] == sw[i + H]) ? w[k] * win[i + k] : (CT)0;
                } else {
                    acc += w[k] * win[i + k];
                }
            }
            out[i] = SILU ? cc1d_silu(acc) : acc;
        }
        cc1d_store<T, CT, E>(y + at.row * L, t0 + lt, L, vec_ok != 0, out);
    }

    if (H > 0 && final_state != nullptr && at.tile == n_tiles - 1 && tid < H) {
        const ssm_i64 s = L - H + tid;  // >= t0 - H, since the last tile starts before L
        const int p = OFF + (int)(s - t0);
        CT v = xs[p];
        if constexpr (HAS_SEQ) {
            if (ss[p] != ss[OFF + (int)(L - 1 - t0)]) v = 0;  // an earlier sequence's input
        }
        ssm_store(final_state + at.row * H + tid, v);
    }
}

// ---------------------------------------------------------------------------------------
// Backward. For the tile [t0, t0 + TILE): g = dy * silu'(z) (or dy) on [t0, t0 + TILE + H),
// recomputing z from x; then dx[s] = sum_k w[k] g[s + H - k] (same-sequence pairs) plus the
// final-state cotangent, per-block partials of dweight[k] = sum g[t] x[t - H + k] and of
// dbias = sum g[t], and, in tile 0, dinitial_state.
// partial: (batch, dim, n_tiles, W + 1) in the compute type, entry W holding dbias.
// ---------------------------------------------------------------------------------------
template <typename T, int W, bool HAS_BIAS, bool SILU, bool HAS_SEQ>
__global__ void __launch_bounds__(CC1D_THREADS)
cc1d_bwd(const T* __restrict__ x, const typename ssm_compute_of<T>::type* __restrict__ weight,
         const typename ssm_compute_of<T>::type* __restrict__ bias,
         const typename ssm_compute_of<T>::type* __restrict__ h0, const int* __restrict__ seq,
         const T* __restrict__ dy, const typename ssm_compute_of<T>::type* __restrict__ dfinal,
         T* __restrict__ dx, typename ssm_compute_of<T>::type* __restrict__ dh0,
         typename ssm_compute_of<T>::type* __restrict__ partial, int dim, ssm_i64 L, int n_tiles,
         int vec_ok) {
    typedef typename ssm_compute_of<T>::type CT;
    constexpr int H = W - 1;
    constexpr int E = cc1d_shape<T>::E;
    constexpr int TILE = cc1d_shape<T>::TILE;
    constexpr int OFF = ssm_round_up(H, 4);
    constexpr int NWARPS = CC1D_THREADS / 32;
    static_assert(TILE >= H, "a tile must hold the halo");
    __shared__ alignas(16) CT xs[OFF + TILE + H];  // x on [t0 - H, t0 + TILE + H)
    __shared__ alignas(16) CT gs[TILE + H];        // g on [t0, t0 + TILE + H)
    __shared__ int ss[HAS_SEQ ? OFF + TILE + H : 1];
    __shared__ CT red[NWARPS * (W + 1)];

    const cc1d_place at(dim, n_tiles);
    const int tid = threadIdx.x;
    const ssm_i64 t0 = (ssm_i64)at.tile * TILE;
    const bool vok = vec_ok != 0;
    const T* xrow = x + at.row * L;
    const T* dyrow = dy + at.row * L;
    const int* srow = HAS_SEQ ? seq + (ssm_i64)at.b * L : nullptr;
    cc1d_stage_x<T, CT, H, OFF, HAS_SEQ>(xrow, h0 == nullptr ? nullptr : h0 + at.row * H, srow,
                                         t0, L, vok, xs, ss);
    if (tid < H) {  // the H steps after the tile (zeros past L)
        const ssm_i64 s = t0 + TILE + tid;
        xs[OFF + TILE + tid] = s < L ? (CT)ssm_load(xrow[s]) : (CT)0;
        if constexpr (HAS_SEQ) ss[OFF + TILE + tid] = s < L ? srow[s] : -1;
    }
    CT dyr[cc1d_shape<T>::VPT][E];
#pragma unroll
    for (int v = 0; v < cc1d_shape<T>::VPT; ++v)
        cc1d_load<T, CT, E>(dyrow, t0 + (v * CC1D_THREADS + tid) * E, L, vok, dyr[v]);
    CT w[W];
#pragma unroll
    for (int k = 0; k < W; ++k) w[k] = weight[(ssm_i64)at.d * W + k];
    const CT bv = HAS_BIAS ? bias[at.d] : (CT)0;
    __syncthreads();

    // z at shared-memory position p (the step at xs[p]), over same-sequence inputs.
    auto pre = [&](int p) {
        CT acc = bv;
#pragma unroll
        for (int k = 0; k < W; ++k) {
            if constexpr (HAS_SEQ) {
                acc += (ss[p - H + k] == ss[p]) ? w[k] * xs[p - H + k] : (CT)0;
            } else {
                acc += w[k] * xs[p - H + k];
            }
        }
        return acc;
    };
#pragma unroll
    for (int v = 0; v < cc1d_shape<T>::VPT; ++v) {
        const int lt = (v * CC1D_THREADS + tid) * E;
#pragma unroll
        for (int i = 0; i < E; ++i) {
            CT g = dyr[v][i];  // zero past L
            if constexpr (SILU) g *= cc1d_dsilu(pre(OFF + lt + i));
            gs[lt + i] = g;
        }
    }
    if (tid < H) {
        const ssm_i64 t = t0 + TILE + tid;
        CT g = 0;
        if (t < L) {
            g = ssm_load(dyrow[t]);
            if constexpr (SILU) g *= cc1d_dsilu(pre(OFF + TILE + tid));
        }
        gs[TILE + tid] = g;
    }
    __syncthreads();

    const bool with_dfinal = H > 0 && dfinal != nullptr;
    const int seq_last = (HAS_SEQ && with_dfinal) ? srow[L - 1] : 0;
    CT dw[W + 1];  // dw[W] accumulates dbias
#pragma unroll
    for (int k = 0; k <= W; ++k) dw[k] = 0;
#pragma unroll
    for (int v = 0; v < cc1d_shape<T>::VPT; ++v) {
        const int lt = (v * CC1D_THREADS + tid) * E;
        CT gw[E + H], xw[E + H];
        int sw[HAS_SEQ ? E + 2 * H : 1];  // sequence ids on [s - H, s + E + H)
#pragma unroll
        for (int j = 0; j < E + H; ++j) {
            gw[j] = gs[lt + j];
            xw[j] = xs[OFF - H + lt + j];
        }
        if constexpr (HAS_SEQ) {
#pragma unroll
            for (int j = 0; j < E + 2 * H; ++j) sw[j] = ss[OFF - H + lt + j];
        }
        CT out[E];
#pragma unroll
        for (int i = 0; i < E; ++i) {
            CT acc = 0;
#pragma unroll
            for (int k = 0; k < W; ++k) {  // step s + H - k reads this input through tap k
                if constexpr (HAS_SEQ) {
                    acc += (sw[2 * H + i - k] == sw[H + i]) ? w[k] * gw[i + H - k] : (CT)0;
                } else {
                    acc += w[k] * gw[i + H - k];
                }
            }
            const ssm_i64 s = t0 + lt + i;
            if (with_dfinal && s >= L - H && s < L) {  // a final-state step
                bool same = true;
                if constexpr (HAS_SEQ) same = sw[H + i] == seq_last;
                if (same) acc += dfinal[at.row * H + (s - (L - H))];
            }
            out[i] = acc;
            const CT g = gw[i];
            dw[W] += g;
#pragma unroll
            for (int k = 0; k < W; ++k) {
                if constexpr (HAS_SEQ) {
                    dw[k] += (sw[i + k] == sw[H + i]) ? g * xw[i + k] : (CT)0;
                } else {
                    dw[k] += g * xw[i + k];
                }
            }
        }
        cc1d_store<T, CT, E>(dx + at.row * L, t0 + lt, L, vok, out);
    }

    if (H > 0 && dh0 != nullptr && at.tile == 0 && tid < H) {
        // Initial-state step j (xpad position j, time j - H) is read by steps t = j - k.
        const int j = tid;
        CT acc = 0;
#pragma unroll
        for (int k = 0; k < W; ++k) {
            if (k <= j) {
                const int t = j - k;  // < H <= TILE; g is zero past L
                bool same = true;
                if constexpr (HAS_SEQ) same = ss[OFF + t] == ss[OFF - H + j];
                if (same) acc += w[k] * gs[t];
            }
        }
        if (with_dfinal && j >= L) {  // L < W-1: the final state still holds this value
            bool same = true;
            if constexpr (HAS_SEQ) same = ss[OFF - H + j] == seq_last;
            if (same) acc += dfinal[at.row * H + (j - L)];
        }
        dh0[at.row * H + j] = acc;
    }

    // Partials of dweight and dbias: a fixed shuffle tree per warp, then warps in order.
    const int lane = tid & 31, warp = tid >> 5;
#pragma unroll
    for (int k = 0; k <= W; ++k) {
        const CT s = ssm_group_allreduce<16>(dw[k], 0xffffffffu);
        if (lane == 0) red[warp * (W + 1) + k] = s;
    }
    __syncthreads();
    if (tid <= W) {
        CT s = red[tid];
#pragma unroll
        for (int q = 1; q < NWARPS; ++q) s += red[q * (W + 1) + tid];
        partial[((ssm_i64)at.row * n_tiles + at.tile) * (W + 1) + tid] = s;
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
        ssm_store(yr + t, SILU ? cc1d_silu(acc) : acc);
    }
#pragma unroll
    for (int k = 0; k < H; ++k) ssm_store(sp + k * stride_k, win[k]);
}
