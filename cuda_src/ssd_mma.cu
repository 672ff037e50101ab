// ssd_mma.cu: the matrix-heavy kernels of Mamba-2's SSD scan on tensor cores, for 16-bit
// x, B, C (float16 or bfloat16; products accumulate in float32), and the float32 forward and
// the backward's adjoint walk in one kernel each (ssd_tf32_fwd, ssd_tf32_bwd, 3 x TF32). Launched by ssmkit._gpu.ssd
// in place of ssd_chunk_state, ssd_state_passing and the forward ssd_chunk_mm of ssd.cu,
// and (unless SSMKIT_SSD_MMA_BWD=0) of the backward's four ssd_chunk_mm products
// (ssd_mma_chunk_mm), its adjoint chunk state (ssd_mma_chunk_state's adjoint form) and its
// CuPy element-wise work (in the epilogues of two of the products, ssd_mma_rows_epilogue;
// or ssd_mma_bwd_rows, at the end of this file); the layout, the chunk sums and the adjoint
// passing stay in ssd.cu.
// Notation, chunks, restarts (seq) and layouts are those of ssd.cu. Checked on the host
// by compiling this text with the PTX replaced by an emulation of the fragment layouts.
//
//   ssd_mma_chunk_state  S_c = sum_s w_s x_s B_s^T (P x N, float32 out),
//                        w_s = [seq_s == seq_E] exp(cum_E - cum_s) dt'_s;
//   ssd_mma_state_walk   the same sums and their passing between chunks (ssd.cu's
//                        ssd_state_passing) in one walk, the state in registers;
//   ssd_mma_fwd          the whole forward (chunk states, passing, outputs) in one walk;
//   ssd_mma_bwd          its WALK form's walk backwards in time: the 16-bit backward's
//                        adjoint states, (G B)_s and the per-step pass in one walk (where
//                        it applies: MMA_BWD_WALK in ssmkit._gpu.ssd);
//   ssd_tf32_fwd         the same for float32 x, B, C, every product 3 x TF32;
//   ssd_tf32_bwd         its walk backwards in time: the float32 backward's adjoint states,
//                        (G B)_s and the per-step pass in one walk;
//   ssd_mma_chunk_out    y_t = [seq_t == seq_prev] exp(cum_t) states[c] C_t
//                            + sum_{s<=t, seq_s == seq_t} exp(cum_t - cum_s) dt'_s (C_t.B_s) x_s
//                        then + D x_t and * silu(z_t).
//
// Every product is mma.sync.m16n8k16 (row.col, 16-bit inputs, float32 accumulators) on
// fragments read from shared memory as pairs of 16-bit values. Values that are not
// inputs enter the products rounded to the input's 16-bit type: w_s x_s (chunk state),
// the masked block exp(..) dt'_s (C_t.B_s) and the entering state (as mamba_ssm does);
// the one exception is the adjoint chunk state's w_s dY_s, a hi + lo pair of 16-bit values.
//
// Fragments (PTX ISA, mma.m16n8k16 .f16/.bf16; g = lane / 4, t = lane % 4):
//   A (16 x 16, row-major): a0 = A[g][2t, 2t+1], a1 = A[g+8][2t, 2t+1],
//                           a2 = A[g][2t+8, 2t+9], a3 = A[g+8][2t+8, 2t+9];
//   B (16 x 8, "col"):      b0 = B[2t, 2t+1][g], b1 = B[2t+8, 2t+9][g];
//   C/D (16 x 8, float):    d0, d1 = D[g][2t, 2t+1], d2, d3 = D[g+8][2t, 2t+1].
// The low 16 bits of a register hold the lower column (row for B). So every operand is
// kept in shared memory with its K index contiguous: A as [m][k], B as [n][k]. A D
// fragment pair of 16 x 8 tiles is, once rounded to 16 bits, exactly an A fragment of
// the next product (the masked block goes from one mma to the next in registers).
#include "ssm_common.cuh"
#include "ssm_tf32.cuh"

#define SSD_MMA_THREADS 128  // 4 warps
#define SSD_MMA_ROWS 64      // rows (steps) of a tile, 16 per warp; also steps per stage
#define SSD_MMA_LD 72        // shared row stride (16-bit values) of 64-wide K tiles
// Row strides are K + 8 values (K a multiple of 64): the 8 rows g = lane / 4 of a fragment
// read then fall 4 banks apart, and the 4 lanes t of a row on the next banks.

// A float rounded to T (round to nearest even), as its bits.
template <typename T>
__device__ __forceinline__ unsigned short ssd_mma_bits(float v) {
    T r;
    ssm_store(&r, v);
    return r.bits;
}
template <typename T>
__device__ __forceinline__ unsigned ssd_mma_pack(float lo, float hi) {
    return (unsigned)ssd_mma_bits<T>(lo) | ((unsigned)ssd_mma_bits<T>(hi) << 16);
}

// Two 16-bit values at an even index of a shared row, as one register.
__device__ __forceinline__ unsigned ssd_mma_pair(const unsigned short* p) {
    return *reinterpret_cast<const unsigned*>(p);
}

// The value of half k (0: low) of a register of two 16-bit values.
template <typename T>
__device__ __forceinline__ float ssd_mma_half(unsigned w, int k) {
    T v;
    v.bits = (unsigned short)(k ? w >> 16 : w & 0xffffu);
    return ssm_load(v);
}

__device__ __forceinline__ float ssd_mma_exp(float x) {  // exp(x) through the hardware exp2
    return ssm_math<float>::decay(x * ssm_math<float>::kLog2e);
}

__device__ __forceinline__ int ssd_mma_seq(const int* seq, ssm_i64 i) { return seq ? seq[i] : 0; }

struct alignas(16) ssd_mma_u4 { unsigned v[4]; };  // 8 16-bit values, one 128-bit access
struct alignas(8) ssd_mma_f2 { float v[2]; };      // 2 floats, one 64-bit access

// The staging loops below hand a block's items (8 consecutive values of a row) to its
// threads round-robin, BATCH items per thread at a time (SSD_MMA_STAGE_BATCH unless a
// kernel's registers are too tight for it): every load of a batch
// is issued before any of its values is converted and stored, so a thread keeps several
// loads in flight instead of waiting out one memory round trip per item.
#define SSD_MMA_STAGE_BATCH 2
template <int ITEMS, int BATCH, typename Raw, typename Fetch, typename Put>
__device__ __forceinline__ void ssd_mma_batched(int tid, Fetch fetch, Put put) {
    for (int i0 = tid; i0 < ITEMS; i0 += BATCH * SSD_MMA_THREADS) {
        Raw raw[BATCH];
#pragma unroll
        for (int k = 0; k < BATCH; ++k) {
            const int i = i0 + k * SSD_MMA_THREADS;
            if (i < ITEMS) fetch(i, raw[k]);
        }
#pragma unroll
        for (int k = 0; k < BATCH; ++k) {
            const int i = i0 + k * SSD_MMA_THREADS;
            if (i < ITEMS) put(i, raw[k]);
        }
    }
}

// 8 consecutive 16-bit values of a row as raw bits (zero past `left`; all zero when
// `live` is false). vec: they start 16-byte aligned (one 128-bit load).
template <typename T>
__device__ __forceinline__ void ssd_mma_fetch16(ssd_mma_u4& w, const T* p, int left, bool vec,
                                                bool live) {
    if (live && vec && left >= 8) {
        w = *reinterpret_cast<const ssd_mma_u4*>(p);
    } else {
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const unsigned lo = live && 2 * k < left ? p[2 * k].bits : 0u;
            const unsigned hi = live && 2 * k + 1 < left ? p[2 * k + 1].bits : 0u;
            w.v[k] = lo | (hi << 16);
        }
    }
}

// The 8 values of w as bits, each times *scale and rounded to T when scale is given.
template <typename T>
__device__ __forceinline__ void ssd_mma_unpack16(unsigned short (&u)[8], const ssd_mma_u4& w,
                                                 const float* scale) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        u[2 * k] = (unsigned short)(w.v[k] & 0xffffu);
        u[2 * k + 1] = (unsigned short)(w.v[k] >> 16);
    }
    if (scale) {
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            T v;
            v.bits = u[k];
            u[k] = ssd_mma_bits<T>(*scale * ssm_load(v));
        }
    }
}

// 8 values, as bits, into dst[0 .. 7] (one 128-bit store; dst 16-byte aligned).
__device__ __forceinline__ void ssd_mma_put8(unsigned short* dst, const unsigned short (&u)[8]) {
    ssd_mma_u4 w;
#pragma unroll
    for (int k = 0; k < 4; ++k) w.v[k] = u[2 * k] | ((unsigned)u[2 * k + 1] << 16);
    *reinterpret_cast<ssd_mma_u4*>(dst) = w;
}

// Stage a ROWS x COLS slice of a row-major matrix into a shared 16-bit tile as it lies,
// dst[r * LD + c], rounded to T: row r (< nrows, else zeros) starts at base + r * stride
// and has ncols values (zeros past them); row_scale[r] multiplies row r when given. Each
// item is 8 consecutive values of a row; consecutive threads take consecutive items of a
// row (coalesced reads, one 128-bit store each). Operands whose K index runs down the rows
// are transposed by ldmatrix when they are read (ssd_mma_load_at, ssd_mma_load_bt2).
template <typename T, int ROWS, int COLS, int LD, int BATCH = SSD_MMA_STAGE_BATCH>
__device__ __forceinline__ void ssd_mma_stage(unsigned short* dst, const T* base, ssm_i64 stride,
                                              int nrows, int ncols, bool vec,
                                              const float* row_scale, int tid) {
    constexpr int G8 = COLS / 8;
    ssd_mma_batched<ROWS * G8, BATCH, ssd_mma_u4>(
        tid,
        [&](int i, ssd_mma_u4& w) {
            const int r = i / G8, c = (i - r * G8) * 8;
            ssd_mma_fetch16(w, base + r * stride + c, ncols - c, vec, r < nrows);
        },
        [&](int i, const ssd_mma_u4& w) {
            const int r = i / G8, c = (i - r * G8) * 8;
            unsigned short u[8];
            ssd_mma_unpack16<T>(u, w, row_scale && r < nrows ? row_scale + r : nullptr);
            ssd_mma_put8(dst + r * LD + c, u);
        });
}

// Asynchronous staging (cp.async, ssm_common.cuh): 16 bytes global -> shared, in flight
// until ssm_cp_wait; zeros (nothing read) when !live.
__device__ __forceinline__ void ssd_mma_cp16(unsigned short* dst, const void* src, bool live) {
    ssm_cp_async16_zfill(ssm_smem_addr(dst), src, live);
}

// This thread's copies so far, committed and landed (a barrier then makes them the block's).
__device__ __forceinline__ void ssd_mma_cp_land() {
    ssm_cp_commit();
    ssm_cp_wait<0>();
}

// ssd_mma_stage without rounding or scaling, by cp.async when vec (every row 16-byte
// aligned, ncols a multiple of 8): no registers hold the bytes in flight and every copy of
// the tile is issued before any waits. Otherwise staged at once by ssd_mma_stage.
// UNROLLED = false keeps the copies in a loop: the backward's products, at their register
// bounds, spilled with it unrolled.
template <typename T, int ROWS, int COLS, int LD, bool UNROLLED = true>
__device__ __forceinline__ void ssd_mma_stage_async(unsigned short* dst, const T* base,
                                                    ssm_i64 stride, int nrows, int ncols,
                                                    bool vec, int tid) {
    if (!vec) {
        ssd_mma_stage<T, ROWS, COLS, LD, 1>(dst, base, stride, nrows, ncols, false, nullptr, tid);
        return;
    }
    constexpr int G8 = COLS / 8, STEP = SSD_MMA_THREADS / G8;  // rows a pass of the block covers
    static_assert(SSD_MMA_THREADS % G8 == 0 && ROWS % STEP == 0, "whole passes");
    // A thread keeps its 8 columns c and walks the rows r, r + STEP, ..
    const int r = tid / G8, c = (tid % G8) * 8;
    const T* src = base + r * stride + c;
    const ssm_i64 src_step = STEP * stride;
    const bool cols_live = c < ncols;
    auto copy = [&](int k) {
        const bool live = cols_live && r + k * STEP < nrows;
        ssd_mma_cp16(dst + (r + k * STEP) * LD + c, live ? src : base, live);
        src += src_step;
    };
    if (UNROLLED) {
#pragma unroll
        for (int k = 0; k < ROWS / STEP; ++k) copy(k);
    } else {
#pragma unroll 1
        for (int k = 0; k < ROWS / STEP; ++k) copy(k);
    }
}

// Whether every staged row of the 16-bit operands (x, B, C, states) starts 16-byte aligned.
__device__ __forceinline__ bool ssd_mma_vec(int P, int N, const void* a, const void* b,
                                            const void* c, const void* d) {
    const unsigned long long bits = (unsigned long long)a | (unsigned long long)b |
                                    (unsigned long long)c | (unsigned long long)d;
    return ((P | N) & 7) == 0 && (bits & 15) == 0;
}

// The group of head h when H heads form X groups of H / X consecutive heads: without an
// integer division (some 20 instructions) in the common cases X = H and X = 1.
__device__ __forceinline__ int ssd_mma_group(int h, int H, int X) {
    return X == H ? h : X == 1 ? 0 : h / (H / X);
}

// A whole tile's weighted entries (the factored weights of ssd_mma_chunk_mm): for each
// j < 8, f(j, v0, v1, v2, v3) with v_i = (row factor * col_w[s]) * g[j][i], s = 8 j + 2 t +
// (i & 1), the row factor fa for i < 2 (row g) and fb for i >= 2 (row g + 8).
template <typename F>
__device__ __forceinline__ void ssd_mma_weighed(const float (&g)[8][4], float fa, float fb,
                                                const float* col_w, int t, F f) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        const int s = 8 * j + 2 * t;
        const float w0 = col_w[s], w1 = col_w[s + 1];
        f(j, (fa * w0) * g[j][0], (fa * w1) * g[j][1], (fb * w0) * g[j][2], (fb * w1) * g[j][3]);
    }
}

// Four 8 x 8 matrices of 16-bit values from a shared tile (row stride LD values, every row
// 16-byte aligned) in one ldmatrix: matrix i has rows row0 + 8 ((i >> RB) & 1) .. + 7 and
// columns col0 + 8 ((i >> (1 - RB)) & 1) .. + 7, and r[i] holds, for lane (g, t), its row g,
// columns 2t and 2t + 1 (TRANS: its column g, rows 2t and 2t + 1). Lane l names row l % 8
// of matrix l / 8. With LD = K + 8 (K a multiple of 64) or any 16-byte multiple that is an
// odd multiple of 16 bytes modulo 128, the 8 rows of a matrix fall on distinct banks.
// A loop takes the lane's address once (ssd_mma_lane_a / _b: a 32-bit shared-window
// address, pinned in a register) and adds each step's offset (ssd_mma_load_*): computed at
// each use, the lane's part cost some 40 integer instructions per 5 ldmatrix.
typedef unsigned ssd_mma_saddr;  // a shared-window address, in bytes

// PIN = false leaves the compiler free to recompute it (where the register spilled).
template <int RB, int LD, bool PIN>
__device__ __forceinline__ ssd_mma_saddr ssd_mma_ldsm_lane(const unsigned short* tile, int lane) {
    const int i = lane >> 3;
    const unsigned short* p = tile + (8 * ((i >> RB) & 1) + (lane & 7)) * LD + 8 * ((i >> (1 - RB)) & 1);
    ssd_mma_saddr a = (ssd_mma_saddr)__cvta_generic_to_shared(p);
    if (PIN) asm volatile("" : "+r"(a));  // computed here, kept: not redone in the loops' branches
    return a;
}

// The lane addresses: _a for A fragments of [m][k] tiles and B fragments of [k][n] tiles
// (RB = 0), _b for B fragments of [n][k] tiles and A fragments of [k][m] tiles (RB = 1).
template <int LD, bool PIN = true>
__device__ __forceinline__ ssd_mma_saddr ssd_mma_lane_a(const unsigned short* tile, int lane) {
    return ssd_mma_ldsm_lane<0, LD, PIN>(tile, lane);
}
template <int LD, bool PIN = true>
__device__ __forceinline__ ssd_mma_saddr ssd_mma_lane_b(const unsigned short* tile, int lane) {
    return ssd_mma_ldsm_lane<1, LD, PIN>(tile, lane);
}

// ldmatrix of the matrices at (row0, col0) of the tile whose lane address is `lane`.
template <bool TRANS, int LD>
__device__ __forceinline__ void ssd_mma_ldsm_at(unsigned (&r)[4], ssd_mma_saddr lane, int row0,
                                                int col0) {
    const ssd_mma_saddr a = lane + 2 * (row0 * LD + col0);
    if (TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a) : "memory");
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a) : "memory");
}

// The A fragment (16 x 16) of rows m0 .., columns k0 .. of a [m][k] tile (lane: _lane_a).
template <int LD>
__device__ __forceinline__ void ssd_mma_load_a(unsigned (&a)[4], ssd_mma_saddr lane, int m0,
                                               int k0) {
    ssd_mma_ldsm_at<false, LD>(a, lane, m0, k0);
}

// The B fragments of two neighbouring 16 x 8 tiles, columns n0 .. n0 + 15 and K rows
// k0 .. k0 + 15, of a [n][k] tile (lane: _lane_b): b[0], b[1] for columns n0 .., b[2], b[3]
// for n0 + 8 ..
template <int LD>
__device__ __forceinline__ void ssd_mma_load_b2(unsigned (&b)[4], ssd_mma_saddr lane, int n0,
                                                int k0) {
    ssd_mma_ldsm_at<false, LD>(b, lane, n0, k0);
}

// The A fragment of rows m0 .. (of A), K columns k0 .., from a [k][m] tile (A^T as it lies
// in memory: ldmatrix transposes; lane: _lane_b).
template <int LD>
__device__ __forceinline__ void ssd_mma_load_at(unsigned (&a)[4], ssd_mma_saddr lane, int m0,
                                                int k0) {
    ssd_mma_ldsm_at<true, LD>(a, lane, k0, m0);
}

// ssd_mma_load_b2 from a [k][n] tile (B as it lies in memory; lane: _lane_a).
template <int LD>
__device__ __forceinline__ void ssd_mma_load_bt2(unsigned (&b)[4], ssd_mma_saddr lane, int n0,
                                                 int k0) {
    ssd_mma_ldsm_at<true, LD>(b, lane, k0, n0);
}

// acc[j], acc[j + 1] += a times the two B tiles of b (from ssd_mma_load_b2 / _bt2).
template <typename T>
__device__ __forceinline__ void ssd_mma_run2(float (&acc0)[4], float (&acc1)[4],
                                             const unsigned (&a)[4], const unsigned (&b)[4]) {
    ssm_mma16<T>::run(acc0, a, b[0], b[1]);
    ssm_mma16<T>::run(acc1, a, b[2], b[3]);
}

// acc[j] += A x B over one staged slice of KW columns (K): A the 16 rows 16 warp .. of `as`,
// B the rows 8 j + g of `bs` (j < NT), both [row][k] shared tiles of leading dimension LD;
// 16-column steps with base + k0 >= limit are skipped (uniform: the slice is zeros there).
// B_LDSM: B's fragments two tiles at a time by ldmatrix, the lane addresses pinned; false:
// pairs of 16-bit values one tile at a time, addresses as the compiler likes, for the kernels
// where the other form made ptxas spill (the head-summing dB / dC products).
// BT: bs holds B as [k][n] (row stride LDB) instead, read by ldmatrix (.trans) either way.
template <typename T, int NT, int KW, int LD, bool B_LDSM = true, bool BT = false, int LDB = LD>
__device__ __forceinline__ void ssd_mma_slice(float (&acc)[NT][4], const unsigned short* as,
                                              const unsigned short* bs, int base, int limit,
                                              int warp, int lane) {
    static_assert(NT % 2 == 0, "NT: B fragments go in pairs of tiles");
    constexpr bool PIN = B_LDSM;
    const ssd_mma_saddr a_lane = ssd_mma_lane_a<LD, PIN>(as, lane);
    ssd_mma_saddr b_lane;  // (one of the two: each pins its register)
    if constexpr (BT)
        b_lane = ssd_mma_lane_a<LDB, PIN>(bs, lane);
    else
        b_lane = ssd_mma_lane_b<LD, PIN>(bs, lane);
#pragma unroll 2  // fully unrolled, ptxas holds every fragment: 255 registers
    for (int k0 = 0; k0 < KW; k0 += 16) {
        if (base + k0 < limit) {
            unsigned a[4];
            ssd_mma_load_a<LD>(a, a_lane, 16 * warp, k0);
            if (BT) {
#pragma unroll
                for (int j = 0; j < NT; j += 2) {
                    unsigned bf[4];
                    ssd_mma_load_bt2<LDB>(bf, b_lane, 8 * j, k0);
                    ssd_mma_run2<T>(acc[j], acc[j + 1], a, bf);
                }
            } else if (B_LDSM) {
#pragma unroll
                for (int j = 0; j < NT; j += 2) {
                    unsigned bf[4];
                    ssd_mma_load_b2<LD>(bf, b_lane, 8 * j, k0);
                    ssd_mma_run2<T>(acc[j], acc[j + 1], a, bf);
                }
            } else {
#pragma unroll
                for (int j = 0; j < NT; ++j) {
                    const unsigned short* q = bs + (8 * j + (lane >> 2)) * LD + k0 + 2 * (lane & 3);
                    ssm_mma16<T>::run(acc[j], a, ssd_mma_pair(q), ssd_mma_pair(q + 8));
                }
            }
        }
    }
}

// An A fragment of 16-bit values whose K index is a step (a[0], a[1]: steps k0 + 2t, + 1;
// a[2], a[3]: k0 + 2t + 8, + 9) times the steps' weights w[k], rounded to T; with SPLIT,
// lo receives the rounding residuals (w x - round_T(w x), exact in float32) rounded to T.
template <typename T, bool SPLIT>
__device__ __forceinline__ void ssd_mma_weigh_a(unsigned (&a)[4], unsigned (&lo)[4],
                                                const float* w, int k0, int lane) {
    const int t = lane & 3;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int k = k0 + 2 * t + (i >= 2 ? 8 : 0);
        T v0, v1;
        v0.bits = (unsigned short)(a[i] & 0xffffu);
        v1.bits = (unsigned short)(a[i] >> 16);
        const float f0 = w[k] * ssm_load(v0), f1 = w[k + 1] * ssm_load(v1);
        a[i] = ssd_mma_pack<T>(f0, f1);
        if (SPLIT) {
            v0.bits = (unsigned short)(a[i] & 0xffffu);
            v1.bits = (unsigned short)(a[i] >> 16);
            lo[i] = ssd_mma_pack<T>(f0 - ssm_load(v0), f1 - ssm_load(v1));
        }
    }
}

// --------------------------------------------------------------------------------------
// Chunk states on tensor cores. A block computes a 64 (p) x NW (n) tile of S_c; warp w
// its rows 16w .. 16w + 15 (NW / 8 D tiles of 16 x 8, NW / 2 floats per thread). Per stage
// of 64 steps: xs[s][p] = x_s[p] and bs[s][n] = B_s[n] copied into shared memory as they lie
// (cp.async; ldmatrix transposes them into fragments with K = s), ws[s] = w_s; each A
// fragment is weighted in registers (w_s x_s rounded to T, ssd_mma_weigh_a). NW = 128 reads
// x once for N <= 128; NW = 64 serves N <= 64.
// ADJ = true: the backward's adjoint form of ssd_chunk_state (ssd.cu), X = dY (rounded to
// T), Bm = C, w_s = [seq_s == seq_prev] exp(cum_s), seq_prev = seq[t0 - 1] (seq[0] for the
// first chunk): K_c = sum_s w_s dY_s C_s^T. There w_s dY_s is a hi + lo pair of 16-bit
// values (ssd_mma_weigh_a with SPLIT) and each fragment multiplied twice into the same
// float32 sums, so K (hence the adjoint states, dA, ddt and the initial state's gradient)
// carries no 16-bit rounding of w_s dY_s: dA and ddt are sums whose terms can cancel
// many-fold, which magnifies each rounding on their path (2^-9 relative in bfloat16) past
// the test bound (benchmarks/SSD.md). C_s is an input: exact in T.
// Grid: (batch * nc, H, ceil(P / 64) * ceil(N / NW)); out (batch, nc, H, P, N) float.
// --------------------------------------------------------------------------------------
template <typename T, int NW, bool ADJ>
__global__ void __launch_bounds__(SSD_MMA_THREADS)
ssd_mma_chunk_state(const T* __restrict__ X, const T* __restrict__ Bm,
                    const float* __restrict__ dte, const float* __restrict__ cum,
                    const int* __restrict__ seq, const ssm_i64* __restrict__ starts,
                    float* __restrict__ out, ssm_i64 L, int H, int P, int G, int N, ssm_i64 nc) {
    alignas(16) __shared__ unsigned short xs[SSD_MMA_ROWS * SSD_MMA_LD];
    static_assert(NW % 64 == 0 && NW <= 128, "NW: 64 or 128");
    constexpr int NT = NW / 8;  // D tiles of 16 x 8 per warp
    constexpr int LDB = NW + 8;
    alignas(16) __shared__ unsigned short bs[SSD_MMA_ROWS * LDB];
    constexpr bool SPLIT = ADJ;  // w_s X_s as hi + lo (see above)
    __shared__ float ws[SSD_MMA_ROWS];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const ssm_i64 e = blockIdx.x;  // = b * nc + c
    const int h = blockIdx.y;
    const int p_tiles = (P + 63) / 64;
    const int p0 = (blockIdx.z % p_tiles) * 64, n0 = (blockIdx.z / p_tiles) * NW;
    const ssm_i64 b = blockIdx.x / (unsigned)nc, c = e - b * nc;  // 32-bit quotient
    const ssm_i64 t0 = starts[c], t1 = starts[c + 1], E = t1 - 1;
    const int gB = ssd_mma_group(h, H, G);
    const float cum_E = cum[(b * L + E) * H + h];
    const int seq_ref = ADJ ? ssd_mma_seq(seq, b * L + (t0 > 0 ? t0 - 1 : 0))
                            : ssd_mma_seq(seq, b * L + E);
    const bool vec = ssd_mma_vec(P, N, X, Bm, X, Bm);

    float acc[NT][4];
    ssm_mma_zero(acc);

    for (ssm_i64 s0 = t0; s0 < t1; s0 += SSD_MMA_ROWS) {
        const int ns = (int)(t1 - s0 < SSD_MMA_ROWS ? t1 - s0 : SSD_MMA_ROWS);
        __syncthreads();  // the previous stage's reads are done
        ssd_mma_stage_async<T, SSD_MMA_ROWS, 64, SSD_MMA_LD>(
            xs, X + ((b * L + s0) * H + h) * P + p0, (ssm_i64)H * P, ns, P - p0, vec, tid);
        ssd_mma_stage_async<T, SSD_MMA_ROWS, NW, LDB>(
            bs, Bm + ((b * L + s0) * G + gB) * N + n0, (ssm_i64)G * N, ns, N - n0, vec, tid);
        ssm_cp_commit();
        if (tid < SSD_MMA_ROWS) {  // while the copies land
            float w = 0.0f;
            if (tid < ns) {
                const ssm_i64 s = s0 + tid, i = (b * L + s) * H + h;
                if (ssd_mma_seq(seq, b * L + s) == seq_ref)
                    w = ADJ ? ssd_mma_exp(cum[i]) : ssd_mma_exp(cum_E - cum[i]) * dte[i];
            }
            ws[tid] = w;
        }
        ssm_cp_wait<0>();
        __syncthreads();
        const ssd_mma_saddr x_lane = ssd_mma_lane_b<SSD_MMA_LD>(xs, lane);
        const ssd_mma_saddr b_lane = ssd_mma_lane_a<LDB>(bs, lane);
#pragma unroll
        for (int k0 = 0; k0 < SSD_MMA_ROWS; k0 += 16) {
            if (k0 < ns) {  // uniform over the block
                unsigned a[4], al[4];
                ssd_mma_load_at<SSD_MMA_LD>(a, x_lane, 16 * warp, k0);
                ssd_mma_weigh_a<T, SPLIT>(a, al, ws, k0, lane);
#pragma unroll
                for (int j = 0; j < NT; j += 2) {
                    unsigned bf[4];
                    ssd_mma_load_bt2<LDB>(bf, b_lane, 8 * j, k0);
                    ssd_mma_run2<T>(acc[j], acc[j + 1], a, bf);
                    if (SPLIT) ssd_mma_run2<T>(acc[j], acc[j + 1], al, bf);  // hi, then lo
                }
            }
        }
    }
    const int g = lane >> 2, t = lane & 3;
    float* o = out + (e * H + h) * ((ssm_i64)P * N);
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int p = p0 + 16 * warp + g + (i >= 2 ? 8 : 0);
            const int n = n0 + 8 * j + 2 * t + (i & 1);
            if (p < P && n < N) o[(ssm_i64)p * N + n] = acc[j][i];
        }
}

// --------------------------------------------------------------------------------------
// The forward's chunk states and their passing in one walk along the chunks (tensor
// cores): what ssd_mma_chunk_state followed by ssd_state_passing (ssd.cu) compute, without
// the float32 chunk states' round trip through memory (at the peer shape of
// benchmarks/SSD.md, 168 MB written and read back). A block owns one (batch row, head) and
// a 64 (p) x NW (n) tile of the state, kept in registers (NW / 16 warps, each a 16 x 64
// piece), and walks the row's chunks in order:
//   entering[c] = S rounded to T (ssd_mma_chunk_out's operand);
//   S = d_c S + S_c, S_c = sum_s w_s x_s B_s^T on tensor cores, d_c and w_s as in
//   ssd_mma_chunk_state and ssd_state_passing (a sequence starting inside chunk c zeroes
//   d_c and the weights of the steps before it); the products accumulate onto d_c S (the
//   two kernels add d_c S to S_c summed from zero: the same terms, float32 roundings in
//   another order; a second set of accumulators made ptxas spill);
// and keeps the state at every boundary j in float32: states[b, j] (the checkpoints) or,
// with states null, final[k] for k = bslot[b, j] >= 0.
// The walk is a pipeline of stages of WR steps (never across a chunk's end) through WB >= 3
// shared buffers, one barrier per stage: while stage q is multiplied, the copies (cp.async)
// of stages q + 1 .. q + WB - 1 are in flight, and the chunk sums, dt' and labels of stage
// q + WB - 1 are loaded into registers, to become its weights (ws, and d_c in ds for a
// chunk's first stage) at the next stage. No global load is waited for on the way from
// one stage to the next.
// NW = 128 stages x once for 128 columns n (at NW = 64 two blocks read it, the second
// mostly from L2). Grid: (batch * H * ceil(P / 64) * ceil(N / NW)) blocks of 2 NW threads,
// the n tiles of a (row, head) adjacent. h0 (batch, H, P, N) or null; states (batch, nc + 1, H,
// P, N) or null; entering (batch, nc, H, P, N); bslot (batch, nc + 1); final (slots, H, P, N).
// --------------------------------------------------------------------------------------
#ifndef SSD_MMA_WALK_SM_THREADS
#define SSD_MMA_WALK_SM_THREADS 768  // threads per SM (6 blocks of 4 warps: 80 registers)
#endif
#ifndef SSD_MMA_WALK_ROWS
#define SSD_MMA_WALK_ROWS 32  // WR: steps per stage (a multiple of 16, at most 64)
#endif
#ifndef SSD_MMA_WALK_BUFS
#define SSD_MMA_WALK_BUFS 3  // WB: stage buffers at NW = 64 (WB - 1 stages in flight)
#endif
#ifndef SSD_MMA_WALK_BUFS_WIDE
#define SSD_MMA_WALK_BUFS_WIDE 3  // at NW = 128 (48 KiB of static shared memory hold 3)
#endif

// p[0], p[1] as the bits of one register (p[1] only when `two`, else 0); pair: one 32-bit
// load.
template <typename T>
__device__ __forceinline__ unsigned ssd_mma_get2(const T* p, bool pair, bool two) {
    if (pair) return ssd_mma_pair(reinterpret_cast<const unsigned short*>(p));
    return (unsigned)p[0].bits | (two ? (unsigned)p[1].bits << 16 : 0u);
}

// v rounded to T into p[0], p[1] (the second only when `two`); pair: one 32-bit store.
template <typename T>
__device__ __forceinline__ void ssd_mma_set2(T* p, bool pair, bool two, const float (&v)[2]) {
    if (pair) {
        *reinterpret_cast<unsigned*>(p) = ssd_mma_pack<T>(v[0], v[1]);
    } else {
        ssm_store(p, v[0]);
        if (two) ssm_store(p + 1, v[1]);
    }
}

// f(j, i, p N + n, n + 1 < N) for the live entries (p, n) of a warp tile's accumulators
// acc[j][i], i = 0 and 2 (with i + 1, the next column): p = pa + 8 (i >= 2), n = na + 8 j
// (pa = the warp's first row + g, na = the tile's first column + 2 t). P N < 2^31.
template <int NT, typename F>
__device__ __forceinline__ void ssd_mma_tile_pairs(int pa, int na, int P, int N, const F& f) {
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int i = 0; i < 4; i += 2) {
            const int p = pa + (i >= 2 ? 8 : 0), n = na + 8 * j;
            if (p < P && n < N) f(j, i, p * N + n, n + 1 < N);
        }
}

// A walk's state S (a warp tile of ssd_mma_tile_pairs: rows pa, pa + 8, columns na + 8 j,
// + 1) from the P x N matrix at src, or zeros when src is null.
template <int NT>
__device__ __forceinline__ void ssd_mma_state_init(float (&S)[NT][4], const float* src, int pa,
                                                   int na, int P, int N) {
    ssm_mma_zero(S);
    if (!src) return;
    ssd_mma_tile_pairs<NT>(pa, na, P, N, [&](int j, int i, int o, bool two) {
        S[j][i] = src[o];
        if (two) S[j][i + 1] = src[o + 1];
    });
}

// A walk's state at boundary jb of batch row b, head h, in float32: to states[b, jb, h]
// (states (batch, nc + 1, H, P, N)) or, with states null, to final[bslot[b, jb], h] when
// that slot is not -1. pair: N even (entries n, n + 1 as one 8-byte store).
template <int NT>
__device__ __forceinline__ void ssd_mma_state_keep(const float (&S)[NT][4], float* states,
                                                   const int* bslot, float* final, ssm_i64 b,
                                                   ssm_i64 jb, ssm_i64 nc, int H, int h,
                                                   int pa, int na, int P, int N, bool pair) {
    const ssm_i64 PN = (ssm_i64)P * N;
    float* dst;
    if (states) {
        dst = states + ((b * (nc + 1) + jb) * H + h) * PN;
    } else {
        const int k = bslot[b * (nc + 1) + jb];
        if (k < 0) return;
        dst = final + ((ssm_i64)k * H + h) * PN;
    }
    ssd_mma_tile_pairs<NT>(pa, na, P, N, [&](int j, int i, int o, bool two) {
        if (two && pair) {
            *reinterpret_cast<ssd_mma_f2*>(dst + o) = ssd_mma_f2{{S[j][i], S[j][i + 1]}};
        } else {
            dst[o] = S[j][i];
            if (two) dst[o + 1] = S[j][i + 1];
        }
    });
}

// A walk's state entering chunk c of batch row b, head h, rounded to T, to entering[b, c,
// h] (entering (batch, nc, H, P, N)). pair: N even.
template <typename T, int NT>
__device__ __forceinline__ void ssd_mma_state_enter(const float (&S)[NT][4], T* entering,
                                                    ssm_i64 b, ssm_i64 c, ssm_i64 nc, int H,
                                                    int h, int pa, int na, int P, int N,
                                                    bool pair) {
    T* dst = entering + ((b * nc + c) * H + h) * ((ssm_i64)P * N);
    ssd_mma_tile_pairs<NT>(pa, na, P, N, [&](int j, int i, int o, bool two) {
        const float v[2] = {S[j][i], S[j][i + 1]};
        ssd_mma_set2(dst + o, two && pair, two, v);
    });
}

// The backward walks' boundary work on their adjoint state G (a warp tile of
// ssd_mma_tile_pairs): G += dfinal[bslot[b, jb], h], the final state's cotangent of a
// sequence that ends at boundary jb (none where bslot or dfinal is null or the slot is -1).
template <int NT>
__device__ __forceinline__ void ssd_mma_add_final(float (&G)[NT][4], const int* bslot,
                                                  const float* dfinal, ssm_i64 b, ssm_i64 jb,
                                                  ssm_i64 nc, int H, int h, int pa, int na,
                                                  int P, int N) {
    const int k = bslot && dfinal ? bslot[b * (nc + 1) + jb] : -1;
    if (k < 0) return;
    const float* src = dfinal + ((ssm_i64)k * H + h) * ((ssm_i64)P * N);
    ssd_mma_tile_pairs<NT>(pa, na, P, N, [&](int j, int i, int o, bool two) {
        G[j][i] += src[o];
        if (two) G[j][i + 1] += src[o + 1];
    });
}

// This warp's part of <G, st> (st a P x N float32 matrix, N even), summed over the warp.
template <int NT>
__device__ __forceinline__ float ssd_mma_warp_dot(const float (&G)[NT][4], const float* st,
                                                  int pa, int na, int P, int N) {
    float v = 0.0f;
    ssd_mma_tile_pairs<NT>(pa, na, P, N, [&](int j, int i, int o, bool two) {
        const ssd_mma_f2 sv = *reinterpret_cast<const ssd_mma_f2*>(st + o);
        v += G[j][i] * sv.v[0] + (two ? G[j][i + 1] * sv.v[1] : 0.0f);
    });
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) v += __shfl_xor_sync(0xffffffffu, v, m);
    return v;
}

// Where a walk along a row's chunks stands: stage of steps s0 .. of chunk c (its end t1;
// t2 the next chunk's end, loaded a chunk ahead so that no stage waits for it).
struct ssd_mma_walker {
    ssm_i64 c, s0, t1, t2;
    bool first;  // s0 is the chunk's first step
    __device__ __forceinline__ ssd_mma_walker(const ssm_i64* starts, ssm_i64 nc)
        : c(0), s0(starts[0]), t1(starts[1]), t2(starts[nc > 1 ? 2 : 1]), first(true) {}
    __device__ __forceinline__ int rows(int WR) const { return (int)(t1 - s0 < WR ? t1 - s0 : WR); }
    __device__ __forceinline__ bool last(int WR) const { return s0 + WR >= t1; }
    // To the next stage; true when it starts a chunk.
    __device__ __forceinline__ bool advance(int WR, const ssm_i64* starts, ssm_i64 nc) {
        first = s0 + WR >= t1;
        if (!first) {
            s0 += WR;
        } else {
            ++c;
            s0 = t1;
            t1 = t2;
            if (c + 2 <= nc) t2 = starts[c + 2];
        }
        return first;
    }
};

template <typename T, int NW>
__global__ void __launch_bounds__(NW / 64 * SSD_MMA_THREADS,
                                  SSD_MMA_WALK_SM_THREADS / (NW / 64 * SSD_MMA_THREADS))
ssd_mma_state_walk(const T* __restrict__ X, const T* __restrict__ Bm,
                   const float* __restrict__ dte, const float* __restrict__ cum,
                   const int* __restrict__ seq, const ssm_i64* __restrict__ starts,
                   const float* __restrict__ h0, float* __restrict__ states,
                   T* __restrict__ entering, const int* __restrict__ bslot,
                   float* __restrict__ final, ssm_i64 L, int H, int P, int G, int N, ssm_i64 nc) {
    static_assert(NW == 64 || NW == 128, "NW: 64 or 128");
    // 4 warps per 64 columns n: warp w owns rows 16 (w % 4) .. and columns 64 (w / 4) ..
    constexpr int NT = 8, LDB = NW + 8, THREADS = NW / 64 * SSD_MMA_THREADS;
    constexpr int WR = SSD_MMA_WALK_ROWS;
    constexpr int WB = NW == 64 ? SSD_MMA_WALK_BUFS : SSD_MMA_WALK_BUFS_WIDE;
    static_assert(WR % 16 == 0 && WR <= SSD_MMA_ROWS && WB >= 3, "stage rows, buffers");
    alignas(16) __shared__ unsigned short xs[WB][WR * SSD_MMA_LD];  // x[s][p]
    alignas(16) __shared__ unsigned short bs[WB][WR * LDB];         // B[s][n]
    __shared__ float ws[WB][WR];  // w_s
    __shared__ float ds[WB];      // d_c, for a chunk's first stage
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, t = lane & 3;
    const unsigned p_tiles = (P + 63) / 64, n_tiles = (N + NW - 1) / NW;
    const unsigned q = blockIdx.x / n_tiles, bh = q / p_tiles;  // 32-bit quotients
    const int n0 = (int)(blockIdx.x - q * n_tiles) * NW, p0 = (int)(q - bh * p_tiles) * 64;
    const ssm_i64 b = bh / (unsigned)H;
    const int h = (int)(bh - (unsigned)b * (unsigned)H);
    const int gB = ssd_mma_group(h, H, G);
    const bool vec = ssd_mma_vec(P, N, X, Bm, X, Bm);
    const ssm_i64 PN = (ssm_i64)P * N, row = b * L, HP = (ssm_i64)H * P, GN = (ssm_i64)G * N;
    const bool pair = (N & 1) == 0;  // entries n, n + 1 (n even) as one 8- or 4-byte access
    const int wp = 16 * (warp & 3), wn = 64 * (warp >> 2);  // the warp's piece of the tile
    const int pa = p0 + wp + g, na = n0 + wn + 2 * t;  // this thread's entries (below)

    float S[NT][4];
    ssd_mma_state_init(S, h0 ? h0 + bh * PN : nullptr, pa, na, P, N);
    auto keep = [&](ssm_i64 jb) {  // the state at boundary jb
        ssd_mma_state_keep(S, states, bslot, final, b, jb, nc, H, h, pa, na, P, N, pair);
    };

    // Copies of a stage into buffer k. With vec, thread tid copies 8 columns cc of rows
    // rr + RS i of both tiles, from source pointers that step down the rows with the walk.
    constexpr int RS = THREADS / 8;  // rows a pass of the block covers
    static_assert(WR % RS == 0, "whole passes");
    const int rr = tid >> 3, cc = (tid & 7) * 8;
    const T* x_src = X + (row * H + h) * P + p0 + cc + rr * HP;   // at step 0
    const T* b_src = Bm + (row * G + gB) * N + n0 + cc + rr * GN;
    const bool x_cols = cc < P - p0;
    auto copy_stage = [&](const ssd_mma_walker& u, int k) {
        const int ns = u.rows(WR);
        if (vec) {
#pragma unroll
            for (int i = 0; i < WR / RS; ++i) {
                const bool live = rr + RS * i < ns;
                const bool xl = live && x_cols;  // (a copy that is not live reads nothing)
                ssd_mma_cp16(xs[k] + (rr + RS * i) * SSD_MMA_LD + cc,
                             xl ? x_src + RS * i * HP : X, xl);
#pragma unroll
                for (int nb = 0; nb < NW; nb += 64) {
                    const bool bl = live && nb + cc < N - n0;
                    ssd_mma_cp16(bs[k] + (rr + RS * i) * LDB + nb + cc,
                                 bl ? b_src + RS * i * GN + nb : Bm, bl);
                }
            }
        } else if (tid < SSD_MMA_THREADS) {  // (the staging helpers take 128 threads)
            ssd_mma_stage_async<T, WR, 64, SSD_MMA_LD>(
                xs[k], X + ((row + u.s0) * H + h) * P + p0, HP, ns, P - p0, vec, tid);
            ssd_mma_stage_async<T, WR, NW, LDB>(
                bs[k], Bm + ((row + u.s0) * G + gB) * N + n0, GN, ns, N - n0, vec, tid);
        }
        x_src += ns * HP;
        b_src += ns * GN;
    };
    // A stage's weight inputs, loaded into registers by threads tid < WR (step s0 + tid),
    // turned into ws (and d_c into ds, by thread 0) a stage later. The chunk's own values
    // (its end's chunk sum and label, the label before it) are loaded when the walk enters it.
    // (Spread over every warp's first lanes, so that the barrier does not wait for warp 0,
    // they took longer: 0.245 against 0.237 ms, benchmarks/SSD.md.)
    float r_cum_e = 0.0f, r_cum_s = 0.0f, r_dt = 0.0f;
    int r_seq_e = 0, r_seq_s = 0, r_seq_p = 0;
    bool r_live = false;
    auto load_chunk = [&](const ssd_mma_walker& u) {
        if (tid >= WR) return;
        const ssm_i64 E = u.t1 - 1;
        r_cum_e = cum[(row + E) * H + h];
        r_seq_e = ssd_mma_seq(seq, row + E);
        r_seq_p = ssd_mma_seq(seq, row + (u.s0 > 0 ? u.s0 - 1 : 0));
    };
    auto load_steps = [&](const ssd_mma_walker& u) {
        if (tid >= WR) return;
        const int ns = u.rows(WR);
        r_live = tid < ns;
        const ssm_i64 s = u.s0 + (r_live ? tid : ns - 1);
        r_cum_s = cum[(row + s) * H + h];
        r_dt = dte[(row + s) * H + h];
        r_seq_s = ssd_mma_seq(seq, row + s);
    };
    auto put_weights = [&](int k) {
        if (tid >= WR) return;
        ws[k][tid] = r_live && r_seq_s == r_seq_e ? ssd_mma_exp(r_cum_e - r_cum_s) * r_dt : 0.0f;
        if (tid == 0) ds[k] = r_seq_e == r_seq_p ? ssd_mma_exp(r_cum_e) : 0.0f;
    };

    ssd_mma_walker next(starts, nc);  // the next stage to copy
    auto issue = [&](int k) {  // its copies into buffer k, its weights' inputs into registers
        if (next.c >= nc) return;
        copy_stage(next, k);
        if (next.first) load_chunk(next);
        load_steps(next);
        next.advance(WR, starts, nc);
    };
    // Prologue: stages 0 .. WB - 2 in flight, the weights of 0 .. WB - 3 in place, those of
    // WB - 2 in registers.
#pragma unroll
    for (int k = 0; k < WB - 1; ++k) {
        issue(k);
        ssm_cp_commit();  // (empty past the last stage: the groups keep their count)
        if (k < WB - 2) put_weights(k);
    }
    keep(0);

    // One barrier per stage: after it, this stage's copies and weights are the block's, and
    // the buffer of the stage before (multiplied by every warp) takes the next copies.
    int k = 0;  // the buffer of the stage being multiplied
    for (ssd_mma_walker cur(starts, nc); cur.c < nc; cur.advance(WR, starts, nc), k = (k + 1) % WB) {
        const int ns = cur.rows(WR);
        ssm_cp_wait<WB - 2>();  // this thread's copies of this stage have landed
        __syncthreads();
        put_weights((k + WB - 2) % WB);  // (its stage is multiplied after another barrier)
        issue((k + WB - 1) % WB);
        ssm_cp_commit();
        if (cur.first) {  // the state entering the chunk, in 16 bits; then d_c S
            ssd_mma_state_enter(S, entering, b, cur.c, nc, H, h, pa, na, P, N, pair);
            const float d = ds[k];
#pragma unroll
            for (int j = 0; j < NT; ++j)
#pragma unroll
                for (int i = 0; i < 4; ++i) S[j][i] *= d;  // the chunk's own terms add onto it
        }
        const ssd_mma_saddr x_lane = ssd_mma_lane_b<SSD_MMA_LD>(xs[k], lane);
        const ssd_mma_saddr b_lane = ssd_mma_lane_a<LDB>(bs[k], lane);
#pragma unroll
        for (int k0 = 0; k0 < WR; k0 += 16) {
            if (k0 < ns) {  // uniform over the block
                unsigned a[4], al[4];
                ssd_mma_load_at<SSD_MMA_LD>(a, x_lane, wp, k0);
                ssd_mma_weigh_a<T, false>(a, al, ws[k], k0, lane);
#pragma unroll
                for (int j = 0; j < NT; j += 2) {
                    unsigned bf[4];
                    ssd_mma_load_bt2<LDB>(bf, b_lane, wn + 8 * j, k0);
                    ssd_mma_run2<T>(S[j], S[j + 1], a, bf);
                }
            }
        }
        if (cur.last(WR)) keep(cur.c + 1);
    }
    ssm_cp_wait<0>();  // (nothing is left in flight: the last groups were empty)
}

// --------------------------------------------------------------------------------------
// The whole forward in one walk (ssd_mma_fwd): ssd_mma_state_walk, ssd_mma_cb and
// ssd_mma_chunk_out in one kernel, for problems without restarts (seq null) whose rows
// of x, B, C, z and out start 16-byte aligned, P and N multiples of 8 and N <= NW. A
// block of 4 warps owns one (batch row, head) and 64 columns p of it, keeps the state S
// (64 p x NW n, float32) in registers, warp w rows p 16 w .. + 15, and walks the row in
// tiles of up to 64 steps that never cross a chunk's end. With cum_b the chunk sum before
// the tile (0 at a chunk's start, else cum_{r0 - 1}) and e the tile's last step, per tile:
//   y_t = exp(cum_t - cum_b) C_t S^T + sum_{r0 <= s <= t} exp(cum_t - cum_s) dt'_s (C_t . B_s) x_s,
//         then + D x_t and * silu(z_t);
//   S   = exp(cum_e - cum_b) S + sum_s exp(cum_e - cum_s) dt'_s x_s B_s^T.
// So a chunk's later tiles see its earlier steps through S (rounded to T as the product's
// operand, as the two-kernel path rounds the state entering a chunk), and C B^T is made per
// tile, in the block, from the staged B and C: nothing passes between kernels, and x, B and
// C are read once per (row, head). The chunks only say where the state is kept: at every
// boundary j (float32, states[b, j]; with `entering`, also the state entering each chunk in
// T, the backward's operand) or, with states null, final[bslot[b, j]].
// Each warp holds y transposed (16 p x 64 t accumulators), so that S's accumulators,
// rounded to T, are the A fragments of y^T = S C^T, and x^T's fragments (loaded once per
// tile) serve the diagonal term, the state's update (weighted) and the epilogue's D x (they
// have the accumulators' layout). Per tile (shared memory for 3 blocks per SM: B and the
// chunk sums in two stages, x, C and the weighted block W in one; z is not staged):
//   B1  (tile k landed) B and the chunk sums of tile k + 1 go in flight, and z's rows of
//       tile k + 1 into L2; x^T's fragments; the 10 16 x 16 blocks of C B^T on and below
//       the diagonal (K = n), 2 or 3 per warp, masked, weighted and rounded to T into
//       W[t][s]; the row decays exp(cum_t - cum_b), column weights exp(cum_e - cum_s) dt'_s,
//       the tile's decay; y^T = S C^T;
//   B2  C and x of tile k + 1 go in flight; y^T's columns times their row decays;
//       y^T += x^T W^T; + D x, * silu(z) in registers (z read where y is stored), two
//       columns of a step stored at a time; S = d S + (w x)^T B; (chunk end) S kept.
// Grid: (batch * H * ceil(P / 64)) blocks of 128 threads; dynamic shared memory
// ssd_mma_fwd_layout<NW>::BYTES. h0 (batch, H, P, N) or null; states (batch, nc + 1, H,
// P, N) or null; entering (batch, nc, H, P, N) or null; bslot (batch, nc + 1); final
// (slots, H, P, N); with KEEP, ypre (batch, L, H, P) receives the output before the gate (the
// backward with z starts from it; a separate instance, so that the others carry no code for
// it), else it is null; 64-bit offsets.
// WALK: the VJP's forward where ssd_mma_bwd (the backward as one walk) runs. Its outputs are
// the plain form's, bit for bit (ssd runs the plain form: ssd and ssd_vjp return the same);
// it also writes y^T before D and the gate into yblob (not null), per tile as its
// accumulators lie (ssd_mma_blob_at), with S's rounding residuals (S = hi + lo) in S C^T on
// a chunk's later tiles: the walk's dcum pairs then cancel. Why: benchmarks/SSD.md, "The
// 16-bit backward as one walk".
// --------------------------------------------------------------------------------------
// A T pair's rounding residuals: (v0 - round_T(v0), v1 - round_T(v1)) rounded to T (with the
// rounded pair, v0 and v1 to 2^-16 relative in bfloat16).
template <typename T>
__device__ __forceinline__ unsigned ssd_mma_pack_lo(float v0, float v1) {
    const unsigned hi = ssd_mma_pack<T>(v0, v1);
    return ssd_mma_pack<T>(v0 - ssd_mma_half<T>(hi, 0), v1 - ssd_mma_half<T>(hi, 1));
}

// The tiles of 64 steps in a row of equal chunks (no restarts): full chunks' and the last's.
__device__ __forceinline__ ssm_i64 ssd_mma_row_tiles(const ssm_i64* starts, ssm_i64 nc) {
    return (nc - 1) * ((starts[1] - starts[0] + 63) / 64) + (starts[nc] - starts[nc - 1] + 63) / 64;
}

// The float offset of a lane's 4 accumulators of y^T tile j = 0 in the WALK forward's yblob:
// per block and tile (tile = block * row tiles + the tile's index in the row), per warp, 8
// tiles j of 32 lanes x 4 floats (4096 floats per block and tile, one 16-byte store a lane).
__device__ __forceinline__ ssm_i64 ssd_mma_blob_at(ssm_i64 tile, int warp, int lane) {
    return ((tile * 4 + warp) * 8) * 128 + 4 * lane;
}

// --------------------------------------------------------------------------------------
// Where a block of the one-kernel forwards (ssd_mma_fwd, ssd_tf32_fwd) works: batch row b,
// head h (bh = b H + h), columns p0 .. p0 + 63, and its B and C groups; a block per (row,
// head, 64 columns p), the grid's index decoded by 32-bit divisions.
struct ssd_mma_walk_block {
    ssm_i64 b;
    unsigned bh;
    int h, p0, gB, gC;
    __device__ __forceinline__ ssd_mma_walk_block(int P, int H, int GB, int GC) {
        const unsigned p_tiles = (P + 63) / 64;
        bh = blockIdx.x / p_tiles;
        p0 = (int)(blockIdx.x - bh * p_tiles) * 64;
        b = bh / (unsigned)H;
        h = (int)(bh - (unsigned)b * (unsigned)H);
        gB = ssd_mma_group(h, H, GB);
        gC = ssd_mma_group(h, H, GC);
    }
};

// A tile's decays for the one-kernel forwards (threads tid < TS of the block): row_f[t] =
// exp(cum_t - cum_b), col_w[s] = exp(cum_e - cum_s) dt'_s (both 0 past the tile's ns steps)
// and tile_d[0] = exp(cum_e - cum_b), e the tile's last step; cv holds cum_s, dv dt'_s.
template <int TS>
__device__ __forceinline__ void ssd_mma_tile_decays(float* row_f, float* col_w, float* tile_d,
                                                    const float* cv, const float* dv, int ns,
                                                    float cum_b, int tid) {
    constexpr float L2E = ssm_math<float>::kLog2e;
    if (tid < TS) {
        const float ce = cv[ns - 1];
        row_f[tid] = tid < ns ? ssm_math<float>::decay((cv[tid] - cum_b) * L2E) : 0.0f;
        col_w[tid] = tid < ns ? ssm_math<float>::decay((ce - cv[tid]) * L2E) * dv[tid] : 0.0f;
        if (tid == 0) tile_d[0] = ssm_math<float>::decay((ce - cum_b) * L2E);
    }
}

#ifndef SSD_MMA_FWD_BLOCKS
#define SSD_MMA_FWD_BLOCKS 3  // blocks per SM (the register bound: 168 at 3)
#endif
// 1: the 16-bit backward walk (ssd_mma_bwd) prefetches the forward's state at a chunk's start
// into L2 during the chunk's first tile, for <G, state> after it (read from DRAM there, it
// stalled the walk: 12% of its stall samples; forward+backward 2.43 -> 2.40 ms at the peer
// row. The same in ssd_tf32_bwd made float32's 0.6% slower: not there.)
#ifndef SSD_MMA_BWD_STATE_PREFETCH
#define SSD_MMA_BWD_STATE_PREFETCH 1
#endif
#ifndef SSD_MMA_WALK_FWD_BLOCKS
// The WALK form's: at 3 ptxas spills about 86 bytes at NW = 128; 2 blocks per SM, without
// spills, were much slower (0.950 against 0.685 ms for its first form, benchmarks/SSD.md)
#define SSD_MMA_WALK_FWD_BLOCKS 3
#endif

template <int NW>
struct ssd_mma_fwd_layout {  // byte offsets into the dynamic shared memory
    static constexpr int LDB = NW + 8;
    static constexpr int XB = 64 * SSD_MMA_LD * 2;  // x[s][p], W[t][s]
    static constexpr int BB = 64 * LDB * 2;         // B[s][n] or C[t][n]
    static constexpr int VB = 132 * 4;              // cum_s[64], cum_b, (pad), dt'_s[64]
    static constexpr int BS = 0, VS = 2 * BB, CS = VS + 2 * VB, XS = CS + BB, WS = XS + XB;
    static constexpr int FS = WS + XB;    // row decays[64], column weights[64], tile decay
    static constexpr int BYTES = FS + 132 * 4;
    static_assert(VS % 16 == 0 && CS % 16 == 0 && XS % 16 == 0 && BYTES % 16 == 0, "aligned");
};

// The 16 x 16 blocks (tb, sb), sb <= tb, of a 64 x 64 tile: block i of 10, in rows.
__device__ __forceinline__ void ssd_mma_lower_block(int i, int& tb, int& sb) {
    tb = i < 1 ? 0 : i < 3 ? 1 : i < 6 ? 2 : 3;
    sb = i - tb * (tb + 1) / 2;
}

// Copies (cp.async, 16 bytes a thread and row) of the rows of a tile of up to 64 steps (ns
// live, zeros past them and past column N) of a [step][n] operand into shared memory (row
// stride LDB, NW columns): thread (rr, cc) = (tid / 8, 8 (tid % 8)) copies columns cc + 64 k
// of rows rr + 16 i; src is its first row's address (column cc), stride the steps' distance,
// base any valid address (what a copy that is not live names).
template <typename T, int NW, int LDB>
__device__ __forceinline__ void ssd_mma_copy_rows(unsigned short* dst, const T* src, const T* base,
                                                  ssm_i64 stride, int ns, int N, int rr, int cc) {
    constexpr int RS = SSD_MMA_THREADS / 8;
#pragma unroll
    for (int i = 0; i < 64 / RS; ++i) {
        const int r = rr + RS * i;
#pragma unroll
        for (int nb = 0; nb < NW; nb += 64) {
            const bool l = r < ns && nb + cc < N;  // (a copy that is not live reads nothing)
            ssd_mma_cp16(dst + r * LDB + nb + cc, l ? src + RS * i * stride + nb : base, l);
        }
    }
}

// A tile's step values into v (132 floats): cum_s at [0, 64) and dt'_s at [68, 132) (past
// its ns steps, the last step's again), and cum_b, the chunk sum before it, at [64] unless it
// is the chunk's first tile. at0 = (row + s0) H + h, the first step's index into cum and dte.
__device__ __forceinline__ void ssd_mma_copy_vals(float* v, const float* cum, const float* dte,
                                                  ssm_i64 at0, int ns, bool first, int H,
                                                  int tid) {
    if (tid < 64) {
        const ssm_i64 i = at0 + (ssm_i64)(tid < ns ? tid : ns - 1) * H;
        ssm_cp_async<4>(v + tid, cum + i);
        ssm_cp_async<4>(v + 68 + tid, dte + i);
    } else if (tid == 64 && !first) {
        ssm_cp_async<4>(v + 64, cum + at0 - H);
    }
}

// A tile's masked block W[t][s] (s <= t < ns, 64 x 64) into ws (T, row stride SSD_MMA_LD),
// from C (its lane address ca_lane as A, [t][n]) and B ([s][n], row stride NW + 8) staged:
// C B^T's 10 16 x 16 blocks on and below the diagonal (K = n), blocks warp, warp + 4,
// warp + 8 of each warp, weighted by exp(cum_t - cum_s) (cv: the tile's chunk sums) times
// dt'_s (dv) and rounded to T. ssd_mma_fwd and ssd_mma_bwd make it alike, so that the
// backward's W is the forward's, bit for bit.
template <typename T, int NW>
__device__ __forceinline__ void ssd_mma_tile_w(unsigned short* ws, ssd_mma_saddr ca_lane,
                                               const unsigned short* bs, const float* cv,
                                               const float* dv, int ns, int warp, int lane) {
    constexpr int LD = SSD_MMA_LD, LDB = NW + 8;
    constexpr float L2E = ssm_math<float>::kLog2e;
    const int g = lane >> 2, t4 = lane & 3;
    const ssd_mma_saddr b_lane = ssd_mma_lane_b<LDB>(bs, lane);
    float cb[3][2][4];
#pragma unroll
    for (int m = 0; m < 3; ++m) ssm_mma_zero(cb[m]);
    // (fully unrolled: ptxas then spills some of the forward's loop invariants at NW = 128,
    // stored before it and reloaded once a tile; unrolled 2, nothing spills and the forward
    // takes 6% longer, benchmarks/SSD.md)
#pragma unroll
    for (int k0 = 0; k0 < NW; k0 += 16) {
#pragma unroll
        for (int m = 0; m < 3; ++m) {
            int tb, sb;
            ssd_mma_lower_block(warp + 4 * m, tb, sb);
            if (warp + 4 * m < 10) {
                unsigned a[4], bf[4];
                ssd_mma_load_a<LDB>(a, ca_lane, 16 * tb, k0);
                ssd_mma_load_b2<LDB>(bf, b_lane, 16 * sb, k0);
                ssd_mma_run2<T>(cb[m][0], cb[m][1], a, bf);
            }
        }
    }
#pragma unroll
    for (int m = 0; m < 3; ++m) {
        int tb, sb;
        ssd_mma_lower_block(warp + 4 * m, tb, sb);
        if (warp + 4 * m < 10) {
            const int ta = 16 * tb + g, tb8 = ta + 8;
            const float la = cv[ta] * L2E, lb = cv[tb8] * L2E;
#pragma unroll
            for (int jj = 0; jj < 2; ++jj) {
                const int s = 16 * sb + 8 * jj + 2 * t4;
                float w[4];
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const int si = s + (i & 1), t = i >= 2 ? tb8 : ta;
                    const float e = (i >= 2 ? lb : la) - cv[si] * L2E;
                    const bool live = (sb < tb || si <= t) && t < ns;
                    w[i] = live ? ssm_math<float>::decay(e) * dv[si] * cb[m][jj][i] : 0.0f;
                }
                *reinterpret_cast<unsigned*>(ws + ta * LD + s) = ssd_mma_pack<T>(w[0], w[1]);
                *reinterpret_cast<unsigned*>(ws + tb8 * LD + s) = ssd_mma_pack<T>(w[2], w[3]);
            }
        }
    }
}

template <typename T, int NW, bool KEEP, bool WALK>
__global__ void __launch_bounds__(SSD_MMA_THREADS, WALK ? SSD_MMA_WALK_FWD_BLOCKS : SSD_MMA_FWD_BLOCKS)
ssd_mma_fwd(const T* __restrict__ X, const T* __restrict__ Bm, const T* __restrict__ Cm,
            const float* __restrict__ D, const T* __restrict__ z,
            const float* __restrict__ dte, const float* __restrict__ cum,
            const ssm_i64* __restrict__ starts, const float* __restrict__ h0,
            float* __restrict__ states, T* __restrict__ entering, const int* __restrict__ bslot,
            float* __restrict__ final, T* __restrict__ out, T* __restrict__ ypre,
            float* __restrict__ yblob, ssm_i64 L, int H, int P, int GB, int GC, int N,
            ssm_i64 nc) {
    static_assert(NW == 64 || NW == 128, "NW: 64 or 128");
    using LY = ssd_mma_fwd_layout<NW>;
    constexpr int THREADS = SSD_MMA_THREADS, NS = NW / 8, LD = SSD_MMA_LD, LDB = LY::LDB;
    extern __shared__ ssm_v16 ssd_mma_dyn[];
    unsigned char* const sm = reinterpret_cast<unsigned char*>(ssd_mma_dyn);
    auto bs_at = [&](int k) { return reinterpret_cast<unsigned short*>(sm + LY::BS + k * LY::BB); };
    auto vals_at = [&](int k) {  // [0, 64): cum_s; [64]: cum_b; [68, 132): dt'_s
        return reinterpret_cast<float*>(sm + LY::VS + k * LY::VB);
    };
    unsigned short* const cs = reinterpret_cast<unsigned short*>(sm + LY::CS);
    unsigned short* const xs = reinterpret_cast<unsigned short*>(sm + LY::XS);
    unsigned short* const ws = reinterpret_cast<unsigned short*>(sm + LY::WS);
    float* const row_f = reinterpret_cast<float*>(sm + LY::FS);  // exp(cum_t - cum_b)
    float* const col_w = row_f + 64;                              // exp(cum_e - cum_s) dt'_s
    float* const tile_d = row_f + 128;                            // exp(cum_e - cum_b)

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, t4 = lane & 3;
    const int wp = 16 * warp;  // the warp's rows p
    const ssd_mma_walk_block blk(P, H, GB, GC);
    const unsigned bh = blk.bh;
    const ssm_i64 b = blk.b;
    const int p0 = blk.p0, h = blk.h, gB = blk.gB, gC = blk.gC;
    const ssm_i64 PN = (ssm_i64)P * N, row = b * L, HP = (ssm_i64)H * P;
    const ssm_i64 GBN = (ssm_i64)GB * N, GCN = (ssm_i64)GC * N;
    const int pa = p0 + wp + g, na = 2 * t4;  // this thread's state entries

    float S[NS][4];
    ssd_mma_state_init(S, h0 ? h0 + bh * PN : nullptr, pa, na, P, N);
    auto keep = [&](ssm_i64 jb) {  // the state at boundary jb (N even)
        ssd_mma_state_keep(S, states, bslot, final, b, jb, nc, H, h, pa, na, P, N, true);
    };

    // Copies of the rows s0 + rr + 16 i of a tile (ns steps): thread tid copies their 8
    // columns cc (the addresses made afresh per tile: kept, they cost registers).
    constexpr int RS = THREADS / 8;
    const int rr = tid >> 3, cc = (tid & 7) * 8;
    const bool x_cols = cc < P - p0;
    auto copy_b = [&](const ssd_mma_walker& u, int k) {  // B and the chunk sums into stage k
        const int ns = u.rows(64);
        ssd_mma_copy_rows<T, NW, LDB>(bs_at(k), Bm + ((row + u.s0 + rr) * GB + gB) * N + cc, Bm,
                                      GBN, ns, N, rr, cc);
        ssd_mma_copy_vals(vals_at(k), cum, dte, (row + u.s0) * H + h, ns, u.first, H, tid);
    };
    auto copy_xc = [&](ssm_i64 s0, int ns) {  // x and C of the next tile
        const T* xsrc = X + ((row + s0 + rr) * H + h) * P + p0 + cc;
        const T* csrc = Cm + ((row + s0 + rr) * GC + gC) * N + cc;
#pragma unroll
        for (int i = 0; i < 64 / RS; ++i) {
            const int r = rr + RS * i;
            const bool xl = r < ns && x_cols;
            ssd_mma_cp16(xs + r * LD + cc, xl ? xsrc + RS * i * HP : X, xl);
#pragma unroll
            for (int nb = 0; nb < NW; nb += 64) {
                const bool l = r < ns && nb + cc < N;
                ssd_mma_cp16(cs + r * LDB + nb + cc, l ? csrc + RS * i * GCN + nb : Cm, l);
            }
        }
    };
    auto prefetch_z = [&](ssm_i64 s0, int ns) {  // a tile's rows of z, into L2
        ssm_prefetch_rows(z + ((row + s0) * H + h) * P + p0, HP, ns, P - p0 < 64 ? P - p0 : 64, tid,
                          THREADS);
    };

    ssd_mma_walker next(starts, nc);  // the next tile whose B is copied
    copy_b(next, 0);
    copy_xc(next.s0, next.rows(64));
    if (z) prefetch_z(next.s0, next.rows(64));
    next.advance(64, starts, nc);
    ssm_cp_commit();
    keep(0);

    const ssd_mma_saddr x_lane = ssd_mma_lane_b<LD>(xs, lane);
    const ssd_mma_saddr w_lane = ssd_mma_lane_b<LD>(ws, lane);
    const ssd_mma_saddr ca_lane = ssd_mma_lane_a<LDB>(cs, lane);  // C as A ([t][n])
    const ssd_mma_saddr cb_lane = ssd_mma_lane_b<LDB>(cs, lane);  // C as B ([t][n] = [n][k])
    int k = 0;  // the stage of the tile being computed
    ssm_i64 tile = (ssm_i64)blockIdx.x * ssd_mma_row_tiles(starts, nc);  // (WALK: its blob)
    for (ssd_mma_walker cur(starts, nc); cur.c < nc;
         cur.advance(64, starts, nc), k ^= 1, ++tile) {
        const int ns = cur.rows(64);
        ssm_cp_wait<0>();
        __syncthreads();  // B1: tile k is the block's; the last tile is done with every buffer
        const bool more = next.c < nc;
        const ssm_i64 s_next = next.s0;  // (x and C follow after B2)
        const int ns_next = more ? next.rows(64) : 0;
        if (more) {
            copy_b(next, k ^ 1);
            if (z) prefetch_z(s_next, ns_next);  // (read by the next tile's epilogue)
            next.advance(64, starts, nc);
        }
        ssm_cp_commit();
        if (cur.first && entering)  // the state entering the chunk, in T
            ssd_mma_state_enter(S, entering, b, cur.c, nc, H, h, pa, na, P, N, true);
        const unsigned short* bs = bs_at(k);
        const float* cv = vals_at(k);
        const float* dv = cv + 68;
        const float cum_b = cur.first ? 0.0f : cv[64];

        ssd_mma_tile_w<T, NW>(ws, ca_lane, bs, cv, dv, ns, warp, lane);
        ssd_mma_tile_decays<64>(row_f, col_w, tile_d, cv, dv, ns, cum_b, tid);
        // WALK, on a chunk's later tiles: S's rounding residuals times C^T first, stored in
        // yblob as the accumulators lie and added in (row_f weighted) after the diagonal
        // term. So y itself is the plain form's, bit for bit (ssd and ssd_vjp return the same
        // outputs), and y's accumulators are not live beside the residuals' (no spills).
        // (This loop and the next one differ only in pack_lo / pack; as one helper taking S by
        // reference, ptxas spilled 28 / 36 bytes in the plain form, where it spills 8 / 8.)
        float acc[8][4];
        const bool s_lo = WALK && !cur.first;
        float* const yb = WALK ? yblob + ssd_mma_blob_at(tile, warp, lane) : nullptr;
        if (s_lo) {
            ssm_mma_zero(acc);
#pragma unroll  // (fully: S is indexed by ks)
            for (int ks = 0; ks < NS / 2; ++ks) {
                const unsigned al[4] = {ssd_mma_pack_lo<T>(S[2 * ks][0], S[2 * ks][1]),
                                        ssd_mma_pack_lo<T>(S[2 * ks][2], S[2 * ks][3]),
                                        ssd_mma_pack_lo<T>(S[2 * ks + 1][0], S[2 * ks + 1][1]),
                                        ssd_mma_pack_lo<T>(S[2 * ks + 1][2], S[2 * ks + 1][3])};
#pragma unroll
                for (int j = 0; j < 8; j += 2) {
                    unsigned bf[4];
                    ssd_mma_load_b2<LDB>(bf, cb_lane, 8 * j, 16 * ks);
                    ssd_mma_run2<T>(acc[j], acc[j + 1], al, bf);
                }
            }
#pragma unroll
            for (int j = 0; j < 8; ++j)
                *reinterpret_cast<ssm_f4*>(yb + 128 * j) = ssm_f4{{acc[j][0], acc[j][1], acc[j][2], acc[j][3]}};
        }
        // y^T = S C^T: S's accumulators rounded to T are the A fragments (tiles 2 ks,
        // 2 ks + 1 make K = n 16 ks ..), C as staged the B fragments.
        ssm_mma_zero(acc);
#pragma unroll  // (fully: S is indexed by ks)
        for (int ks = 0; ks < NS / 2; ++ks) {
            const unsigned a[4] = {ssd_mma_pack<T>(S[2 * ks][0], S[2 * ks][1]),
                                   ssd_mma_pack<T>(S[2 * ks][2], S[2 * ks][3]),
                                   ssd_mma_pack<T>(S[2 * ks + 1][0], S[2 * ks + 1][1]),
                                   ssd_mma_pack<T>(S[2 * ks + 1][2], S[2 * ks + 1][3])};
#pragma unroll
            for (int j = 0; j < 8; j += 2) {
                unsigned bf[4];
                ssd_mma_load_b2<LDB>(bf, cb_lane, 8 * j, 16 * ks);
                ssd_mma_run2<T>(acc[j], acc[j + 1], a, bf);
            }
        }
        // x^T's fragments, K = s 16 ks .., before xs is free
        unsigned xa[4][4];
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) ssd_mma_load_at<LD>(xa[ks], x_lane, wp, 16 * ks);
        __syncthreads();  // B2: ws, row_f, col_w, tile_d are the block's; xs and cs are free
        if (more) copy_xc(s_next, ns_next);
        ssm_cp_commit();
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const float f0 = row_f[8 * j + 2 * t4], f1 = row_f[8 * j + 2 * t4 + 1];
            acc[j][0] *= f0;
            acc[j][1] *= f1;
            acc[j][2] *= f0;
            acc[j][3] *= f1;
        }
        // the diagonal term: y^T's column pairs jp >= ks (s <= t)
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) {
#pragma unroll
            for (int jp = ks; jp < 4; ++jp) {
                unsigned bf[4];
                ssd_mma_load_b2<LD>(bf, w_lane, 16 * jp, 16 * ks);
                ssd_mma_run2<T>(acc[2 * jp], acc[2 * jp + 1], xa[ks], bf);
            }
        }
        if constexpr (WALK) {  // y^T before D and the gate, with the residuals' term
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                ssm_f4 r{{0.0f, 0.0f, 0.0f, 0.0f}};
                if (s_lo) r = *reinterpret_cast<const ssm_f4*>(yb + 128 * j);  // (this lane's own store)
                const float f0 = row_f[8 * j + 2 * t4], f1 = row_f[8 * j + 2 * t4 + 1];
                *reinterpret_cast<ssm_f4*>(yb + 128 * j) =
                    ssm_f4{{fmaf(f0, r.v[0], acc[j][0]), fmaf(f1, r.v[1], acc[j][1]),
                            fmaf(f0, r.v[2], acc[j][2]), fmaf(f1, r.v[3], acc[j][3])}};
            }
        }

        // The epilogue in registers (before the state's update: y^T's registers are free
        // for it): y^T's entry (p, t) of tile j, i is x^T's in xa[j / 2][2 (j % 2) + (i >=
        // 2)], half i % 2. z is read from global memory (L2: prefetched a tile ahead), two
        // columns of a step at a time where they are stored: a shared buffer for it would
        // leave room for 2 blocks per SM, not 3.
        {
            const ssm_i64 o0 = ((row + cur.s0) * H + h) * P;
            T* const orow = out + o0;
            // D of this thread's columns p = pa, pa + 8 (0 past P and without D; loaded
            // per tile, from L1: kept, they cost registers)
            const float d_a = D && pa < P ? D[(ssm_i64)h * P + pa] : 0.0f;
            const float d_b = D && pa + 8 < P ? D[(ssm_i64)h * P + pa + 8] : 0.0f;
            // lanes g and g ^ 1 trade one value, so that an even g stores columns p, p + 1 of
            // step t0 and an odd g those of step t0 + 1, 4 bytes at a time (P is even)
            const bool odd = g & 1;
#pragma unroll
            for (int ks = 0; ks < 4; ++ks) {
                // z at this ks's stores (issued together, ahead of their use; 0 where none)
                unsigned zp[2][2] = {{0u, 0u}, {0u, 0u}};
                if (z) {
#pragma unroll
                    for (int jj = 0; jj < 2; ++jj)
#pragma unroll
                        for (int hf = 0; hf < 2; ++hf) {
                            const int t = 8 * (2 * ks + jj) + 2 * t4 + (odd ? 1 : 0);
                            const int p = pa + 8 * hf - (odd ? 1 : 0);
                            if (t < ns && p < P)
                                zp[jj][hf] = *reinterpret_cast<const unsigned*>(
                                    z + o0 + (ssm_i64)t * HP + p);
                        }
                }
#pragma unroll
                for (int j = 2 * ks; j < 2 * ks + 2; ++j) {
#pragma unroll
                    for (int hf = 0; hf < 2; ++hf) {  // rows p = pa + 8 hf, steps t0, t0 + 1
                        const int reg = 2 * (j & 1) + hf;
                        float v[2];
#pragma unroll
                        for (int q = 0; q < 2; ++q)
                            v[q] = acc[j][2 * hf + q] +
                                   (hf ? d_b : d_a) * ssd_mma_half<T>(xa[ks][reg], q);
                        const float got = __shfl_xor_sync(0xffffffffu, odd ? v[0] : v[1], 4);
                        float two[2] = {odd ? got : v[0], odd ? v[1] : got};
                        const int t = 8 * j + 2 * t4 + (odd ? 1 : 0);
                        const int p = pa + 8 * hf - (odd ? 1 : 0);
                        const bool live = t < ns && p < P;
                        if (KEEP && live)  // the output before the gate (the VJP's, with z)
                            ssd_mma_set2(ypre + o0 + (ssm_i64)t * HP + p, true, true, two);
                        if (z) {
#pragma unroll
                            for (int q = 0; q < 2; ++q) {
                                const float zv = ssd_mma_half<T>(zp[j & 1][hf], q);
                                two[q] *= zv * ssm_math<float>::sigmoid_fast(zv);
                            }
                        }
                        if (live) ssd_mma_set2(orow + (ssm_i64)t * HP + p, true, true, two);
                    }
                }
            }
        }

        // S = d S + (w x)^T B
        {
            const float d = tile_d[0];
#pragma unroll
            for (int j = 0; j < NS; ++j)
#pragma unroll
                for (int i = 0; i < 4; ++i) S[j][i] *= d;
        }
        {
            const ssd_mma_saddr b_lane = ssd_mma_lane_a<LDB>(bs, lane);
#pragma unroll
            for (int ks = 0; ks < 4; ++ks) {
                unsigned aw[4] = {xa[ks][0], xa[ks][1], xa[ks][2], xa[ks][3]}, al[4];
                ssd_mma_weigh_a<T, false>(aw, al, col_w, 16 * ks, lane);
#pragma unroll
                for (int j = 0; j < NS; j += 2) {
                    unsigned bf[4];
                    ssd_mma_load_bt2<LDB>(bf, b_lane, 8 * j, 16 * ks);
                    ssd_mma_run2<T>(S[j], S[j + 1], aw, bf);
                }
            }
        }
        if (cur.last(64)) keep(cur.c + 1);
    }
    ssm_cp_wait<0>();  // (nothing is left in flight: the last groups were empty)
}

// --------------------------------------------------------------------------------------
// ssd_tf32_fwd: the whole forward in one kernel, as ssd_mma_fwd, for float32 x, B and C
// (every product 3 x TF32, ssm_tf32.cuh: float32's accuracy). One walk per (row, head, 64
// columns p), the state in registers, in tiles of SSD_TF32_ROWS = 32 steps that never cross
// a chunk's end. Per tile, with cum_b the chunk sum before it (0 at a chunk's start) and e
// its last step:
//   y_t = exp(cum_t - cum_b) C_t S^T + sum_{s <= t in the tile} exp(cum_t - cum_s) dt'_s
//         (C_t . B_s) x_s, then + D x_t and * silu(z_t);
//   S   = exp(cum_e - cum_b) S + sum_s exp(cum_e - cum_s) dt'_s x_s B_s^T.
// C_t . B_s is read from ssd.cu's ssd_chunk_cb (float, once per class of heads; cb of
// batch, nc, classes, pairs, 64 x 64): the 32 x 32 halves of its diagonal blocks.
// Warp w owns rows p = 16 w .. 16 w + 15 of S (all NW columns n) and of y^T (p x t). The
// operands are staged by cp.async as float32, as they lie in memory, and split into TF32 hi
// and lo where a fragment is read. k slots pair as in ssm_tf32.cuh (slot t <-> 2t, t + 4
// <-> 2t + 1), so S's accumulators are the A fragments of y^T = S C^T, and x's fragments
// (x[s][p], x[s][p + 8], x[s + 1][p], x[s + 1][p + 8] for s = 8 ks + 2t) serve the diagonal
// term, the epilogue's D x (y^T's accumulator layout) and, weighted, the state's update.
// Shared row strides put a fragment's 32 reads in 32 banks (8-byte pairs: two phases).
// KEEP_Y: also the outputs before D and the gate (y_t's two sums, float32) into ycore, for
// the backward (which would otherwise recompute them).
// Needs no restarts (seq_idx), N <= NW, P and N multiples of 4 and 16-byte aligned rows.
// Grid: batch * H * ceil(P / 64) blocks of SSD_MMA_THREADS, ssd_tf32_fwd_layout<NW>::BYTES
// of dynamic shared memory (3 blocks per SM on the H200).
// --------------------------------------------------------------------------------------
#define SSD_TF32_ROWS 32  // steps per tile
#ifndef SSD_TF32_FWD_BLOCKS
#define SSD_TF32_FWD_BLOCKS 3  // blocks per SM (the register bound: 168 at 3)
#endif

template <int NW>
struct ssd_tf32_fwd_layout {  // float offsets into the dynamic shared memory
    static constexpr int TS = SSD_TF32_ROWS;
    static constexpr int LDB = NW + 4;   // B[s][n]: rows s, s + 2 fall 8 banks apart
    static constexpr int LDC = NW + 8;   // C[t][n]: rows t, t + 1 fall 8 banks apart
    static constexpr int LDX = 64 + 4;   // x[s][p], as B
    static constexpr int LDW = TS + 8;   // W[t][s], as C
    static constexpr int LDQ = TS + 4;   // C B^T's block [t][s]: 16-byte reads, rows t 4 apart
    static constexpr int VN = 2 * TS + 8;  // values: cum_s [0, TS), cum_b [TS], dt'_s [TS + 4, ..)
    static constexpr int BF = TS * LDB, QF = TS * LDQ;
    static constexpr int B0 = 0, Q0 = B0 + 2 * BF, V0 = Q0 + 2 * QF;  // two stages each
    static constexpr int C0 = V0 + 2 * VN, X0 = C0 + TS * LDC, W0 = X0 + TS * LDX;
    static constexpr int F0 = W0 + TS * LDW;  // row factors [TS], column weights [TS], decay
    static constexpr int BYTES = (F0 + 2 * TS + 4) * 4;
    static_assert(BF % 4 == 0 && QF % 4 == 0 && V0 % 4 == 0 && C0 % 4 == 0 && X0 % 4 == 0 &&
                  W0 % 4 == 0 && F0 % 4 == 0, "16-byte aligned rows and stages");
};

template <int NW, bool KEEP_Y>
__global__ void __launch_bounds__(SSD_MMA_THREADS, SSD_TF32_FWD_BLOCKS)
ssd_tf32_fwd(const float* __restrict__ X, const float* __restrict__ Bm,
             const float* __restrict__ Cm, const float* __restrict__ cb,
             const float* __restrict__ D, const float* __restrict__ z,
             const float* __restrict__ dte, const float* __restrict__ cum,
             const ssm_i64* __restrict__ starts, const float* __restrict__ h0,
             float* __restrict__ states, const int* __restrict__ bslot,
             float* __restrict__ final, float* __restrict__ out, float* __restrict__ ycore,
             ssm_i64 L, int H, int P,
             int GB, int GC, int N, ssm_i64 nc, int tiles_per_chunk, int classes) {
    static_assert(NW == 64 || NW == 128, "NW: 64 or 128");
    using LY = ssd_tf32_fwd_layout<NW>;
    constexpr int THREADS = SSD_MMA_THREADS, TS = LY::TS, NS = NW / 8, KT = TS / 8;
    constexpr int LDB = LY::LDB, LDC = LY::LDC, LDX = LY::LDX, LDW = LY::LDW, LDQ = LY::LDQ;
    constexpr float L2E = ssm_math<float>::kLog2e;
    extern __shared__ ssm_v16 ssd_mma_dyn[];
    float* const sm = reinterpret_cast<float*>(ssd_mma_dyn);
    float* const cs = sm + LY::C0;
    float* const xs = sm + LY::X0;
    float* const ws = sm + LY::W0;
    float* const row_f = sm + LY::F0;     // exp(cum_t - cum_b), 0 past the tile
    float* const col_w = row_f + TS;      // exp(cum_e - cum_s) dt'_s, 0 past the tile
    float* const tile_d = row_f + 2 * TS;  // exp(cum_e - cum_b)

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, t4 = lane & 3;
    const int wp = 16 * warp;  // the warp's rows p
    const ssd_mma_walk_block blk(P, H, GB, GC);
    const unsigned bh = blk.bh;
    const ssm_i64 b = blk.b;
    const int p0 = blk.p0, h = blk.h, gB = blk.gB, gC = blk.gC;
    const int cls = h / (H / classes), pairs = tiles_per_chunk * (tiles_per_chunk + 1) / 2;
    const ssm_i64 PN = (ssm_i64)P * N, row = b * L, HP = (ssm_i64)H * P;
    const ssm_i64 GBN = (ssm_i64)GB * N, GCN = (ssm_i64)GC * N;
    const int pa = p0 + wp + g, na = 2 * t4;  // this thread's state entries

    float S[NS][4];
    ssd_mma_state_init(S, h0 ? h0 + bh * PN : nullptr, pa, na, P, N);
    auto keep = [&](ssm_i64 jb) {  // the state at boundary jb (N even)
        ssd_mma_state_keep(S, states, bslot, final, b, jb, nc, H, h, pa, na, P, N, true);
    };

    // Copies of 16-byte pieces: a row of NW floats is PR pieces, RP rows per pass.
    constexpr int PR = NW / 4, RP = THREADS / PR;
    const int nr = tid / PR, nc4 = 4 * (tid % PR);  // this thread's first row, its columns n
    const bool n_live = nc4 < N;
    auto copy_rows = [&](float* dst, int ld, const float* src, ssm_i64 stride, int ns) {
#pragma unroll
        for (int i = 0; i < TS / RP; ++i) {
            const int r = nr + RP * i;
            const bool l = r < ns && n_live;  // (a copy that is not live reads nothing)
            ssm_cp_async16_zfill(ssm_smem_addr(dst + r * ld + nc4), l ? src + RP * i * stride : src, l);
        }
    };
    auto copy_b = [&](const ssd_mma_walker& u, int k) {  // B, C B^T's block, values: stage k
        const int ns = u.rows(TS);
        copy_rows(sm + LY::B0 + k * LY::BF, LDB, Bm + ((row + u.s0 + nr) * GB + gB) * N + nc4,
                  GBN, ns);
        // the tile's 32 x 32 block on the diagonal of chunk u.c's 64 x 64 block pair (RT, RT)
        const int off = (int)(u.s0 - starts[u.c]), rt = off >> 6, so = off & 63;
        const float* q = cb + ((((b * nc + u.c) * classes + cls) * pairs + rt * (rt + 1) / 2 + rt)
                               << 12) + so * 65;
        float* qd = sm + LY::Q0 + k * LY::QF;
#pragma unroll
        for (int i = 0; i < TS * TS / 4 / THREADS; ++i) {
            const int e = tid + THREADS * i, r = e >> 3, c = 4 * (e & 7);
            const bool l = r < ns;
            ssm_cp_async16_zfill(ssm_smem_addr(qd + r * LDQ + c), l ? q + r * 64 + c : cb, l);
        }
        float* v = sm + LY::V0 + k * LY::VN;
        if (tid < TS) {
            const ssm_i64 i = (row + u.s0 + (tid < ns ? tid : ns - 1)) * H + h;
            ssm_cp_async<4>(v + tid, cum + i);
            ssm_cp_async<4>(v + TS + 4 + tid, dte + i);
        } else if (tid == TS && !u.first) {
            ssm_cp_async<4>(v + TS, cum + (row + u.s0 - 1) * H + h);
        }
    };
    auto copy_xc = [&](ssm_i64 s0, int ns) {  // x and C of a tile
        constexpr int XR = THREADS / 16;  // x: 16 pieces a row
        const int xr = tid >> 4, xc = 4 * (tid & 15);
        const bool x_live = xc < P - p0;
        const float* xsrc = X + ((row + s0 + xr) * H + h) * P + p0 + xc;
#pragma unroll
        for (int i = 0; i < TS / XR; ++i) {
            const int r = xr + XR * i;
            const bool l = r < ns && x_live;
            ssm_cp_async16_zfill(ssm_smem_addr(xs + r * LDX + xc), l ? xsrc + XR * i * HP : X, l);
        }
        copy_rows(cs, LDC, Cm + ((row + s0 + nr) * GC + gC) * N + nc4, GCN, ns);
    };
    auto prefetch_z = [&](ssm_i64 s0, int ns) {  // a tile's rows of z, into L2
        ssm_prefetch_rows(z + ((row + s0) * H + h) * P + p0, HP, ns, P - p0 < 64 ? P - p0 : 64, tid,
                          THREADS);
    };

    ssd_mma_walker next(starts, nc);  // the next tile whose B is copied
    copy_b(next, 0);
    copy_xc(next.s0, next.rows(TS));
    if (z) prefetch_z(next.s0, next.rows(TS));
    next.advance(TS, starts, nc);
    ssm_cp_commit();
    keep(0);

    // this lane's fragment reads, as offsets from fixed bases (the loops' constant parts
    // then fold into the loads' immediate offsets)
    const float* const c_frag = cs + g * LDC + 2 * t4;      // C[8 jt + g][8 j + 2 t4 ..]
    const float* const w_frag = ws + g * LDW + 2 * t4;      // W[8 jt + g][8 ks + 2 t4 ..]
    const float* const x_frag = xs + 2 * t4 * LDX + wp + g;  // x[8 ks + 2 t4 ..][p]
    const int b_frag = 2 * t4 * LDB + g;                     // B[8 ks + 2 t4 ..][8 j + g]
    int k = 0;  // the stage of the tile being computed
    for (ssd_mma_walker cur(starts, nc); cur.c < nc; cur.advance(TS, starts, nc), k ^= 1) {
        const int ns = cur.rows(TS);
        ssm_cp_wait<0>();
        __syncthreads();  // B1: stage k, x and C are the block's; the last tile is done with all
        const bool more = next.c < nc;
        const ssm_i64 s_next = next.s0;  // (x and C follow after B2)
        const int ns_next = more ? next.rows(TS) : 0;
        if (more) {
            copy_b(next, k ^ 1);
            if (z) prefetch_z(s_next, ns_next);  // (read by the next tile's epilogue)
            next.advance(TS, starts, nc);
        }
        ssm_cp_commit();
        const float* bs = sm + LY::B0 + k * LY::BF;
        const float* qs = sm + LY::Q0 + k * LY::QF;
        const float* cv = sm + LY::V0 + k * LY::VN;
        const float* dv = cv + TS + 4;
        const float cum_b = cur.first ? 0.0f : cv[TS];

        // W[t][s] = [s <= t < ns] exp(cum_t - cum_s) dt'_s (C_t . B_s): thread tid makes the
        // 8 entries s = 8 (tid % 4) .. of row t = tid / 4
        {
            const int t = tid >> 2, s0 = 8 * (tid & 3);
            const float ct = cv[t];
#pragma unroll
            for (int j = 0; j < 8; j += 4) {
                const ssm_f4 q = *reinterpret_cast<const ssm_f4*>(qs + t * LDQ + s0 + j);
                ssm_f4 w;
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const int s = s0 + j + i;
                    w.v[i] = s <= t && t < ns
                                 ? ssm_math<float>::decay((ct - cv[s]) * L2E) * dv[s] * q.v[i]
                                 : 0.0f;
                }
                *reinterpret_cast<ssm_f4*>(ws + t * LDW + s0 + j) = w;
            }
        }
        ssd_mma_tile_decays<TS>(row_f, col_w, tile_d, cv, dv, ns, cum_b, tid);

        // y^T = S C^T (K = n): S's accumulators, split, are the A fragments; C's rows t the B
        float acc[KT][4];  // y^T's tiles of 8 steps t
        ssm_mma_zero(acc);
#pragma unroll  // (fully: S is indexed by j)
        for (int j = 0; j < NS; ++j) {
            const ssm_tc_a a = ssm_tc_frag_acc(S[j]);
#pragma unroll
            for (int jt = 0; jt < KT; ++jt) {
                const ssd_mma_f2 c2 =
                    *reinterpret_cast<const ssd_mma_f2*>(c_frag + 8 * jt * LDC + 8 * j);
                ssm_tc_b bf;
                ssm_tf32_split(c2.v[0], bf.hi0, bf.lo0);
                ssm_tf32_split(c2.v[1], bf.hi1, bf.lo1);
                ssm_mma3(acc[jt], a, bf);
            }
        }
        // x's fragments, K = s, before xs is free
        float xr[KT][4];
#pragma unroll
        for (int ks = 0; ks < KT; ++ks) {
            const float* xp = x_frag + 8 * ks * LDX;
            xr[ks][0] = xp[0];
            xr[ks][1] = xp[8];
            xr[ks][2] = xp[LDX];
            xr[ks][3] = xp[LDX + 8];
        }
        __syncthreads();  // B2: ws, row_f, col_w, tile_d are the block's; xs and cs are free
        if (more) copy_xc(s_next, ns_next);
        ssm_cp_commit();
#pragma unroll
        for (int jt = 0; jt < KT; ++jt) {
            const float f0 = row_f[8 * jt + 2 * t4], f1 = row_f[8 * jt + 2 * t4 + 1];
            acc[jt][0] *= f0;
            acc[jt][1] *= f1;
            acc[jt][2] *= f0;
            acc[jt][3] *= f1;
        }
        // the diagonal term: y^T's tiles jt >= ks (s <= t)
#pragma unroll
        for (int ks = 0; ks < KT; ++ks) {
            ssm_tc_a a;
#pragma unroll
            for (int i = 0; i < 4; ++i) ssm_tf32_split(xr[ks][i], a.hi[i], a.lo[i]);
#pragma unroll
            for (int jt = ks; jt < KT; ++jt) {
                const ssd_mma_f2 w2 =
                    *reinterpret_cast<const ssd_mma_f2*>(w_frag + 8 * jt * LDW + 8 * ks);
                ssm_tc_b bf;
                ssm_tf32_split(w2.v[0], bf.hi0, bf.lo0);
                ssm_tf32_split(w2.v[1], bf.hi1, bf.lo1);
                ssm_mma3(acc[jt], a, bf);
            }
        }

        // The epilogue: y^T's entry e of tile jt is (p = pa + 8 (e / 2), t = 8 jt + 2 t4 +
        // e % 2), whose x is xr[jt][2 (e % 2) + e / 2]. Each store of a warp covers 8
        // consecutive p of 4 steps: whole 32-byte sectors. Rows t walk from this lane's
        // first entry (t = 2 t4, p = pa), 8 HP apart per tile jt.
        {
            const ssm_i64 o0 = ((row + cur.s0 + 2 * t4) * H + h) * P + pa;
            float* o_t = out + o0;
            float* y_t = ycore + o0;    // (not written without KEEP_Y)
            const float* z_t = z + o0;  // (not read without z)
            const float d_a = D && pa < P ? D[(ssm_i64)h * P + pa] : 0.0f;
            const float d_b = D && pa + 8 < P ? D[(ssm_i64)h * P + pa + 8] : 0.0f;
            const bool live_a = pa < P, live_b = pa + 8 < P;
            const int t_left = ns - 2 * t4;  // entries t < ns: 8 jt + e % 2 < t_left
#pragma unroll
            for (int jt = 0; jt < KT; ++jt, o_t += 8 * HP, y_t += 8 * HP, z_t += 8 * HP) {
                float zv[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // (loaded together, ahead of use)
                bool live[4];
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    live[e] = 8 * jt + (e & 1) < t_left && (e >> 1 ? live_b : live_a);
                if (z) {
#pragma unroll
                    for (int e = 0; e < 4; ++e)
                        if (live[e]) zv[e] = z_t[(e & 1) * HP + 8 * (e >> 1)];
                }
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    if (KEEP_Y && live[e]) y_t[(e & 1) * HP + 8 * (e >> 1)] = acc[jt][e];
                    float v = acc[jt][e] + (e >> 1 ? d_b : d_a) * xr[jt][2 * (e & 1) + (e >> 1)];
                    if (z) v *= zv[e] * ssm_math<float>::sigmoid_fast(zv[e]);
                    if (live[e]) o_t[(e & 1) * HP + 8 * (e >> 1)] = v;
                }
            }
        }

        // S = d S + (w x)^T B
        {
            const float d = tile_d[0];
#pragma unroll
            for (int j = 0; j < NS; ++j)
#pragma unroll
                for (int i = 0; i < 4; ++i) S[j][i] *= d;
        }
#pragma unroll
        for (int ks = 0; ks < KT; ++ks) {
            const float w0 = col_w[8 * ks + 2 * t4], w1 = col_w[8 * ks + 2 * t4 + 1];
            ssm_tc_a a;
            ssm_tf32_split(xr[ks][0] * w0, a.hi[0], a.lo[0]);
            ssm_tf32_split(xr[ks][1] * w0, a.hi[1], a.lo[1]);
            ssm_tf32_split(xr[ks][2] * w1, a.hi[2], a.lo[2]);
            ssm_tf32_split(xr[ks][3] * w1, a.hi[3], a.lo[3]);
            const float* bp = bs + b_frag + 8 * ks * LDB;
#pragma unroll
            for (int j = 0; j < NS; ++j) {
                ssm_tc_b bf;
                ssm_tf32_split(bp[8 * j], bf.hi0, bf.lo0);
                ssm_tf32_split(bp[8 * j + LDB], bf.hi1, bf.lo1);
                ssm_mma3(S[j], a, bf);
            }
        }
        if (cur.last(TS)) keep(cur.c + 1);
    }
    ssm_cp_wait<0>();  // (nothing is left in flight: the last groups were empty)
}

// --------------------------------------------------------------------------------------
// ssd_tf32_bwd: the float32 backward's adjoint walk in one kernel (3 x TF32): ssd_tf32_fwd's
// walk run backwards in time, with B and C, x and dY trading places. One walk per (row,
// head, 64 columns p), the adjoint state G (the gradient of the state after the tile, p x n)
// in registers, over the forward's tiles (SSD_TF32_ROWS steps that never cross a chunk's
// end) from the last to the first. Per tile, with cum_b the chunk sum before it and e its
// last step:
//   (G B)_s = exp(cum_e - cum_s) G B_s + sum_{t >= s in the tile} exp(cum_t - cum_s)
//             (C_t . B_s) dY_t,
//   G       = exp(cum_e - cum_b) G + sum_t exp(cum_t - cum_b) dY_t C_t^T,
// and the per-step pass of the chunked backward's GB (ssd_chunk_mm_tc's ROWS) as the
// epilogue, for P <= 64 (a block holds whole rows):
//   dx = dt'_s (G B)_s + D dY_s, xgb[s] = x_s . (G B)_s, dcum[s] = dY_s . ycore_s - dt'_s xgb[s],
//   dD_part[b, h, p] = sum over the row of dY x (null without D).
// At each chunk's end (boundary c + 1), before its tiles: G += dfinal[bslot[b, c + 1]] (a
// sequence's final state there; -1: none), then dHx[b, c, h] = G (batch, nc, H, P, N) and
// end_part[b, c, h, 4 (p0 / 64) + warp] = this warp's part of <G, states[b, c + 1, h]>
// (states: the forward's boundary states, (batch, nc + 1, H, P, N)); at the start,
// dinit[b, h] = G (+ dfinal[bslot[b, 0]]). These replace the adjoint chunk states, their
// walk (ssd_adjoint_passing) and GB.
// Needs no restarts, N <= NW, P <= 64, P and N multiples of 4 and 16-byte aligned rows.
// Grid: batch * H blocks of SSD_MMA_THREADS, ssd_tf32_bwd_layout<NW>::BYTES of dynamic
// shared memory.
// --------------------------------------------------------------------------------------
#ifndef SSD_TF32_BWD_PREFETCH  // 1: each tile's x and ycore rows prefetched into L2 a tile ahead
#define SSD_TF32_BWD_PREFETCH 1
#endif

template <int NW>
struct ssd_tf32_bwd_layout : ssd_tf32_fwd_layout<NW> {
    // the warps' row sums of a tile: x . (G B) [4][TS], then dY . ycore - dt' x . (G B) [4][TS]
    static constexpr int R0 = ssd_tf32_fwd_layout<NW>::BYTES / 4;
    static constexpr int BYTES = (R0 + 8 * SSD_TF32_ROWS) * 4;
};

// Where a backward walk stands: the tile of steps s0 .. of chunk c (steps t0 .. t1 - 1),
// the chunk's tiles TS apart from t0; from the last chunk's last tile to the first's first.
struct ssd_mma_rwalker {
    ssm_i64 c, t0, t1, s0;
    __device__ __forceinline__ ssd_mma_rwalker(const ssm_i64* starts, ssm_i64 nc, int TS)
        : c(nc - 1), t0(starts[nc - 1]), t1(starts[nc]) {
        s0 = t0 + (t1 - t0 - 1) / TS * TS;
    }
    __device__ __forceinline__ int rows(int TS) const { return (int)(t1 - s0 < TS ? t1 - s0 : TS); }
    __device__ __forceinline__ bool first() const { return s0 == t0; }  // the chunk's first tile
    __device__ __forceinline__ bool last(int TS) const { return s0 + TS >= t1; }  // its last
    __device__ __forceinline__ void advance(int TS, const ssm_i64* starts) {
        if (s0 > t0) {
            s0 -= TS;
        } else if (--c >= 0) {
            t1 = t0;
            t0 = starts[c];
            s0 = t0 + (t1 - t0 - 1) / TS * TS;
        }
    }
};

template <int NW>
__global__ void __launch_bounds__(SSD_MMA_THREADS, SSD_TF32_FWD_BLOCKS)
ssd_tf32_bwd(const float* __restrict__ dY, const float* __restrict__ Bm,
             const float* __restrict__ Cm, const float* __restrict__ cb,
             const float* __restrict__ X, const float* __restrict__ ycore,
             const float* __restrict__ D, const float* __restrict__ dte,
             const float* __restrict__ cum, const ssm_i64* __restrict__ starts,
             const float* __restrict__ states, const int* __restrict__ bslot,
             const float* __restrict__ dfinal, float* __restrict__ dx, float* __restrict__ xgb,
             float* __restrict__ dcum, float* __restrict__ dD_part, float* __restrict__ dHx,
             float* __restrict__ dinit, float* __restrict__ end_part, ssm_i64 L, int H, int P,
             int GB, int GC, int N, ssm_i64 nc, int tiles_per_chunk, int classes) {
    static_assert(NW == 64 || NW == 128, "NW: 64 or 128");
    using LY = ssd_tf32_bwd_layout<NW>;
    constexpr int THREADS = SSD_MMA_THREADS, TS = LY::TS, NS = NW / 8, KT = TS / 8;
    constexpr int LDB = LY::LDB, LDC = LY::LDC, LDX = LY::LDX, LDW = LY::LDW, LDQ = LY::LDQ;
    constexpr float L2E = ssm_math<float>::kLog2e;
    extern __shared__ ssm_v16 ssd_mma_dyn[];
    float* const sm = reinterpret_cast<float*>(ssd_mma_dyn);
    float* const bs_ = sm + LY::C0;        // B[s][n] (the forward's C place)
    float* const ys = sm + LY::X0;         // dY[t][p] (the forward's x place)
    float* const ws = sm + LY::W0;         // W[s][t]
    float* const row_f = sm + LY::F0;      // exp(cum_e - cum_s), 0 past the tile
    float* const col_w = row_f + TS;       // exp(cum_t - cum_b), 0 past the tile
    float* const tile_d = row_f + 2 * TS;  // exp(cum_e - cum_b)
    float* const red = sm + LY::R0;        // the warps' row sums

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, t4 = lane & 3;
    const int wp = 16 * warp;
    const ssd_mma_walk_block blk(P, H, GB, GC);
    const unsigned bh = blk.bh;
    const ssm_i64 b = blk.b;
    const int p0 = blk.p0, h = blk.h, gB = blk.gB, gC = blk.gC;
    const int cls = h / (H / classes), pairs = tiles_per_chunk * (tiles_per_chunk + 1) / 2;
    const ssm_i64 PN = (ssm_i64)P * N, row = b * L, HP = (ssm_i64)H * P;
    const ssm_i64 GBN = (ssm_i64)GB * N, GCN = (ssm_i64)GC * N;
    const int pa = p0 + wp + g, na = 2 * t4;

    float S[NS][4];  // the adjoint state G
    ssm_mma_zero(S);
    auto add_final = [&](ssm_i64 jb) {  // G += dfinal of the sequence ending at boundary jb
        ssd_mma_add_final(S, bslot, dfinal, b, jb, nc, H, h, pa, na, P, N);
    };

    auto store = [&](float* dst) {  // G to the P x N matrix at dst (N even: 8-byte pairs)
        ssd_mma_tile_pairs<NS>(pa, na, P, N, [&](int j, int i, int o, bool two) {
            *reinterpret_cast<ssd_mma_f2*>(dst + o) = ssd_mma_f2{{S[j][i], two ? S[j][i + 1] : 0.0f}};
        });
    };
    const int parts = 4 * ((P + 63) / 64);  // end_part's warps per (b, c, h)

    constexpr int PR = NW / 4, RP = THREADS / PR;
    const int nr = tid / PR, nc4 = 4 * (tid % PR);
    const bool n_live = nc4 < N;
    auto copy_rows = [&](float* dst, int ld, const float* src, ssm_i64 stride, int ns) {
#pragma unroll
        for (int i = 0; i < TS / RP; ++i) {
            const int r = nr + RP * i;
            const bool l = r < ns && n_live;
            ssm_cp_async16_zfill(ssm_smem_addr(dst + r * ld + nc4), l ? src + RP * i * stride : src, l);
        }
    };
    auto copy_c = [&](const ssd_mma_rwalker& u, int k) {  // C, C B^T's block, values: stage k
        const int ns = u.rows(TS);
        copy_rows(sm + LY::B0 + k * LY::BF, LDB, Cm + ((row + u.s0 + nr) * GC + gC) * N + nc4,
                  GCN, ns);
        const int off = (int)(u.s0 - starts[u.c]), rt = off >> 6, so = off & 63;
        const float* q = cb + ((((b * nc + u.c) * classes + cls) * pairs + rt * (rt + 1) / 2 + rt)
                               << 12) + so * 65;
        float* qd = sm + LY::Q0 + k * LY::QF;
#pragma unroll
        for (int i = 0; i < TS * TS / 4 / THREADS; ++i) {
            const int e = tid + THREADS * i, r = e >> 3, c = 4 * (e & 7);
            const bool l = r < ns;
            ssm_cp_async16_zfill(ssm_smem_addr(qd + r * LDQ + c), l ? q + r * 64 + c : cb, l);
        }
        float* v = sm + LY::V0 + k * LY::VN;
        if (tid < TS) {
            const ssm_i64 i = (row + u.s0 + (tid < ns ? tid : ns - 1)) * H + h;
            ssm_cp_async<4>(v + tid, cum + i);
            ssm_cp_async<4>(v + TS + 4 + tid, dte + i);
        } else if (tid == TS && !u.first()) {
            ssm_cp_async<4>(v + TS, cum + (row + u.s0 - 1) * H + h);
        }
    };
    auto copy_yb = [&](ssm_i64 s0, int ns) {  // dY and B of a tile
        constexpr int XR = THREADS / 16;
        const int xr = tid >> 4, xc = 4 * (tid & 15);
        const bool x_live = xc < P - p0;
        const float* ysrc = dY + ((row + s0 + xr) * H + h) * P + p0 + xc;
#pragma unroll
        for (int i = 0; i < TS / XR; ++i) {
            const int r = xr + XR * i;
            const bool l = r < ns && x_live;
            ssm_cp_async16_zfill(ssm_smem_addr(ys + r * LDX + xc), l ? ysrc + XR * i * HP : dY, l);
        }
        copy_rows(bs_, LDC, Bm + ((row + s0 + nr) * GB + gB) * N + nc4, GBN, ns);
    };
    auto prefetch_xy = [&](ssm_i64 s0, int ns) {  // a tile's rows of x and ycore, into L2
        const ssm_i64 at = ((row + s0) * H + h) * P + p0;
        const int len = P - p0 < 64 ? P - p0 : 64;
        ssm_prefetch_rows(X + at, HP, ns, len, tid, THREADS);
        ssm_prefetch_rows(ycore + at, HP, ns, len, tid, THREADS);
    };
    // the row sums of the tile at s0 (ns steps), from the warps' parts in red
    auto finish_rows = [&](ssm_i64 s0, int ns) {
        if (tid < ns) {
            float sx = 0.0f, sd = 0.0f;
#pragma unroll
            for (int w = 0; w < THREADS / 32; ++w) {
                sx += red[w * TS + tid];
                sd += red[(4 + w) * TS + tid];
            }
            const ssm_i64 i = (row + s0 + tid) * H + h;
            xgb[i] = sx;
            dcum[i] = sd;
        }
    };

    // G is the adjoint leaving chunk c (at boundary c + 1): add that boundary's dfinal, keep
    // it as dHx[c], and this warp's part of <G, states[c + 1]>
    auto boundary = [&](ssm_i64 c) {
        add_final(c + 1);
        store(dHx + ((b * nc + c) * H + h) * PN);
        if (!end_part) return;
        const float v = ssd_mma_warp_dot(S, states + ((b * (nc + 1) + c + 1) * H + h) * PN,
                                         pa, na, P, N);
        if (lane == 0) end_part[((b * nc + c) * H + h) * parts + 4 * (p0 >> 6) + warp] = v;
    };

    ssd_mma_rwalker next(starts, nc, TS);
    copy_c(next, 0);
    copy_yb(next.s0, next.rows(TS));
    if (SSD_TF32_BWD_PREFETCH) prefetch_xy(next.s0, next.rows(TS));
    next.advance(TS, starts);
    ssm_cp_commit();

    const float* const c_frag = bs_ + g * LDC + 2 * t4;     // B[8 js + g][8 j + 2 t4 ..]
    const float* const w_frag = ws + g * LDW + 2 * t4;      // W[8 js + g][8 kt + 2 t4 ..]
    const float* const y_frag = ys + 2 * t4 * LDX + wp + g;  // dY[8 kt + 2 t4 ..][p]
    const int b_frag = 2 * t4 * LDB + g;                     // C[8 kt + 2 t4 ..][8 j + g]
    const float d_a = D && pa < P ? D[(ssm_i64)h * P + pa] : 0.0f;
    const float d_b = D && pa + 8 < P ? D[(ssm_i64)h * P + pa + 8] : 0.0f;
    const bool live_a = pa < P, live_b = pa + 8 < P;
    float dd[2] = {0.0f, 0.0f};  // dY x of rows pa, pa + 8 over this lane's steps
    ssm_i64 prev_s0 = 0;
    int prev_ns = 0;  // the last tile's rows, whose sums are finished after the next B1
    int k = 0;
    boundary(nc - 1);
    for (ssd_mma_rwalker cur(starts, nc, TS); cur.c >= 0; cur.advance(TS, starts), k ^= 1) {
        const int ns = cur.rows(TS);
        ssm_cp_wait<0>();
        __syncthreads();  // B1: stage k, dY and B are the block's; the last tile is done
        if (prev_ns) finish_rows(prev_s0, prev_ns);
        const bool more = next.c >= 0;
        const ssm_i64 s_next = next.s0;
        const int ns_next = more ? next.rows(TS) : 0;
        if (more) {
            copy_c(next, k ^ 1);
            if (SSD_TF32_BWD_PREFETCH) prefetch_xy(s_next, ns_next);  // (the next epilogue's)
            next.advance(TS, starts);
        }
        ssm_cp_commit();
        const float* cs_ = sm + LY::B0 + k * LY::BF;
        const float* qs = sm + LY::Q0 + k * LY::QF;
        const float* cv = sm + LY::V0 + k * LY::VN;
        const float* dv = cv + TS + 4;
        const float cum_b = cur.first() ? 0.0f : cv[TS];

        // W[s][t] = [s <= t < ns] exp(cum_t - cum_s) (C_t . B_s): thread tid makes the 8
        // entries t = 8 (tid % 4) .. of row s = tid / 4
        {
            const int s = tid >> 2, t0 = 8 * (tid & 3);
            const float c_s = cv[s];
#pragma unroll
            for (int j = 0; j < 8; j += 4) {
                ssm_f4 w;
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const int t = t0 + j + i;
                    w.v[i] = s <= t && t < ns
                                 ? ssm_math<float>::decay((cv[t] - c_s) * L2E) * qs[t * LDQ + s]
                                 : 0.0f;
                }
                *reinterpret_cast<ssm_f4*>(ws + s * LDW + t0 + j) = w;
            }
        }
        if (tid < TS) {
            const float ce = cv[ns - 1];
            row_f[tid] = tid < ns ? ssm_math<float>::decay((ce - cv[tid]) * L2E) : 0.0f;
            col_w[tid] = tid < ns ? ssm_math<float>::decay((cv[tid] - cum_b) * L2E) : 0.0f;
            if (tid == 0) tile_d[0] = ssm_math<float>::decay((ce - cum_b) * L2E);
        }

        // (G B)^T = G B^T (K = n): G's accumulators, split, are the A fragments
        float acc[KT][4];
        ssm_mma_zero(acc);
#pragma unroll
        for (int j = 0; j < NS; ++j) {
            const ssm_tc_a a = ssm_tc_frag_acc(S[j]);
#pragma unroll
            for (int js = 0; js < KT; ++js) {
                const ssd_mma_f2 c2 =
                    *reinterpret_cast<const ssd_mma_f2*>(c_frag + 8 * js * LDC + 8 * j);
                ssm_tc_b bf;
                ssm_tf32_split(c2.v[0], bf.hi0, bf.lo0);
                ssm_tf32_split(c2.v[1], bf.hi1, bf.lo1);
                ssm_mma3(acc[js], a, bf);
            }
        }
        float yr[KT][4];  // dY's fragments, K = t
#pragma unroll
        for (int kt = 0; kt < KT; ++kt) {
            const float* yp = y_frag + 8 * kt * LDX;
            yr[kt][0] = yp[0];
            yr[kt][1] = yp[8];
            yr[kt][2] = yp[LDX];
            yr[kt][3] = yp[LDX + 8];
        }
        __syncthreads();  // B2: ws, row_f, col_w, tile_d are the block's; ys and bs_ are free
        if (more) copy_yb(s_next, ns_next);
        ssm_cp_commit();
#pragma unroll
        for (int js = 0; js < KT; ++js) {
            const float f0 = row_f[8 * js + 2 * t4], f1 = row_f[8 * js + 2 * t4 + 1];
            acc[js][0] *= f0;
            acc[js][1] *= f1;
            acc[js][2] *= f0;
            acc[js][3] *= f1;
        }
        // the diagonal term: tiles js <= kt (s <= t)
#pragma unroll
        for (int kt = 0; kt < KT; ++kt) {
            ssm_tc_a a;
#pragma unroll
            for (int i = 0; i < 4; ++i) ssm_tf32_split(yr[kt][i], a.hi[i], a.lo[i]);
#pragma unroll
            for (int js = 0; js <= kt; ++js) {
                const ssd_mma_f2 w2 =
                    *reinterpret_cast<const ssd_mma_f2*>(w_frag + 8 * js * LDW + 8 * kt);
                ssm_tc_b bf;
                ssm_tf32_split(w2.v[0], bf.hi0, bf.lo0);
                ssm_tf32_split(w2.v[1], bf.hi1, bf.lo1);
                ssm_mma3(acc[js], a, bf);
            }
        }

        // The epilogue: entry e of tile js is (p = pa + 8 (e / 2), s = 8 js + 2 t4 + e % 2),
        // whose dY is yr[js][2 (e % 2) + e / 2] (as ssd_tf32_fwd's x).
        {
            const ssm_i64 o0 = ((row + cur.s0 + 2 * t4) * H + h) * P + pa;
            const int t_left = ns - 2 * t4;
#pragma unroll
            for (int js = 0; js < KT; ++js) {
                const ssm_i64 oj = o0 + 8 * js * HP;
                bool live[4];
                float xv[4], yv[4];
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    live[e] = 8 * js + (e & 1) < t_left && (e >> 1 ? live_b : live_a);
                    const ssm_i64 at = oj + (e & 1) * HP + 8 * (e >> 1);
                    xv[e] = live[e] ? X[at] : 0.0f;
                    yv[e] = live[e] ? ycore[at] : 0.0f;
                }
                float sx[2] = {0.0f, 0.0f}, sd[2] = {0.0f, 0.0f};
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int c = e & 1;
                    const float gv = acc[js][e], dyv = yr[js][2 * c + (e >> 1)];
                    const float dt = dv[8 * js + 2 * t4 + c];
                    if (live[e])
                        dx[oj + c * HP + 8 * (e >> 1)] = dt * gv + (e >> 1 ? d_b : d_a) * dyv;
                    const float xg = xv[e] * gv;
                    sx[c] += xg;
                    sd[c] += dyv * yv[e] - dt * xg;
                    dd[e >> 1] += dyv * xv[e];
                }
#pragma unroll
                for (int c = 0; c < 2; ++c) {
#pragma unroll
                    for (int m = 4; m <= 16; m <<= 1) {
                        sx[c] += __shfl_xor_sync(0xffffffffu, sx[c], m);
                        sd[c] += __shfl_xor_sync(0xffffffffu, sd[c], m);
                    }
                    if (g == 0) {
                        red[warp * TS + 8 * js + 2 * t4 + c] = sx[c];
                        red[(4 + warp) * TS + 8 * js + 2 * t4 + c] = sd[c];
                    }
                }
            }
        }
        prev_s0 = cur.s0;
        prev_ns = ns;

        // G = d G + (w dY)^T C
        {
            const float d = tile_d[0];
#pragma unroll
            for (int j = 0; j < NS; ++j)
#pragma unroll
                for (int i = 0; i < 4; ++i) S[j][i] *= d;
        }
#pragma unroll
        for (int kt = 0; kt < KT; ++kt) {
            const float w0 = col_w[8 * kt + 2 * t4], w1 = col_w[8 * kt + 2 * t4 + 1];
            ssm_tc_a a;
            ssm_tf32_split(yr[kt][0] * w0, a.hi[0], a.lo[0]);
            ssm_tf32_split(yr[kt][1] * w0, a.hi[1], a.lo[1]);
            ssm_tf32_split(yr[kt][2] * w1, a.hi[2], a.lo[2]);
            ssm_tf32_split(yr[kt][3] * w1, a.hi[3], a.lo[3]);
            const float* cp = cs_ + b_frag + 8 * kt * LDB;
#pragma unroll
            for (int j = 0; j < NS; ++j) {
                ssm_tc_b bf;
                ssm_tf32_split(cp[8 * j], bf.hi0, bf.lo0);
                ssm_tf32_split(cp[8 * j + LDB], bf.hi1, bf.lo1);
                ssm_mma3(S[j], a, bf);
            }
        }
        if (cur.first() && cur.c > 0) boundary(cur.c - 1);
    }
    ssm_cp_wait<0>();
    __syncthreads();  // the last tile's row sums
    finish_rows(prev_s0, prev_ns);
    if (dD_part) {  // dY x over this row, for rows pa and pa + 8 (the lanes t4 share them)
#pragma unroll
        for (int i = 0; i < 2; ++i) {
#pragma unroll
            for (int m = 1; m <= 2; m <<= 1) dd[i] += __shfl_xor_sync(0xffffffffu, dd[i], m);
            if (t4 == 0 && (i ? live_b : live_a)) dD_part[(ssm_i64)bh * P + pa + 8 * i] = dd[i];
        }
    }
    add_final(0);
    if (dinit) store(dinit + bh * PN);
}

// --------------------------------------------------------------------------------------
// ssd_mma_bwd: the 16-bit backward as one walk backwards in time, the reverse of
// ssd_mma_fwd's WALK form (as ssd_tf32_bwd is of ssd_tf32_fwd): one block per (row, head),
// P <= 64, the adjoint state G (p x n, float32: the gradient of the state after the tile) in
// registers as S is in the forward, warp w rows p 16 w .. + 15, over the forward's tiles
// (64 steps that never cross a chunk's end) from the last to the first. Per tile, with
// cum_b the chunk sum before it, e its last step, and W the forward's masked block (made by
// ssd_mma_tile_w as the forward makes it, so the same rounded values):
//   st_s    = B_s . G (K = n; G as hi + lo 16-bit parts),
//   dg_s    = sum_{t >= s} W[t][s] dY_t (W holds dt'_s: the forward's rounded block),
//   (G B)_s = exp(cum_e - cum_s) st_s + dg_s / dt'_s,
//   G       = exp(cum_e - cum_b) G + sum_t exp(cum_t - cum_b) dY_t C_t^T (dY weighted, hi + lo);
// and the per-step outputs, the pairs of dcum made from the forward's own rounded operands
// (rb(w x): the state update's operand, rounded to T as the forward rounded it):
//   dx_s = dt'_s (G B)_s + D dY_s,  xgb[s] = x_s . (G B)_s,
//   dcum[s] = dY_s . ycore_s - x_s . dg_s - rb(exp(cum_e - cum_s) dt'_s x_s) . st_s,
//   dD_part[b, h, p] = sum over the row of dY x (null without D),
// ycore the WALK forward's float32 outputs before D and the gate (yblob, ssd_mma_blob_at:
// read as the accumulators lie). At each chunk's end (boundary c + 1), before its tiles:
// G += dfinal[bslot[b, c + 1]] (-1: none), then dHx[b, c, h] = G rounded to T (batch, nc,
// H, P, N) and end_part[b, c, h, warp] = this warp's part of <G, states[b, c + 1, h]>
// (float32 boundary states, (batch, nc + 1, H, P, N)); at the start, dinit[b, h] = G (+
// dfinal[bslot[b, 0]]). These replace the adjoint chunk states, their passing, GB and dC's
// dcum half. Why the forward rounds as it does: benchmarks/SSD.md, "The 16-bit backward as
// one walk".
// Per tile (shared memory for 2 blocks per SM: C and the step values in two stages, a tile
// ahead; B, x and dY in one):
//   B1  (tile k landed) the last tile's row sums finished; C and the values of tile k + 1 in
//       flight; W; the decays; st^T = G B^T; dY^T's and x^T's fragments;
//   B2  B, x and dY of tile k + 1 in flight; dg^T = dY^T W; the epilogue (dx stored, the
//       warps' row sums to red); G = d G + (row_f dY)^T C; (chunk start) the boundary.
// Needs no restarts, P <= 64, P and N multiples of 8 and N <= NW, 16-byte aligned rows.
// Grid: batch * H blocks of SSD_MMA_THREADS, ssd_mma_bwd_layout<NW>::BYTES of dynamic shared
// memory.
// --------------------------------------------------------------------------------------
#ifndef SSD_MMA_BWD_BLOCKS
#define SSD_MMA_BWD_BLOCKS 2  // blocks per SM (shared memory: 81.8 KiB each at NW = 128)
#endif

template <int NW>
struct ssd_mma_bwd_layout {  // byte offsets into the dynamic shared memory
    static constexpr int LDB = NW + 8;
    static constexpr int XB = 64 * SSD_MMA_LD * 2;  // dY[t][p], x[s][p], W[t][s]
    static constexpr int BB = 64 * LDB * 2;         // C[t][n] (two stages), B[s][n]
    static constexpr int VB = 132 * 4;              // cum_s[64], cum_b, (pad), dt'_s[64]
    static constexpr int CS = 0, VS = 2 * BB, BS = VS + 2 * VB, YS = BS + BB, XS = YS + XB;
    static constexpr int WS = XS + XB, FS = WS + XB;  // row_e, col_w, inv_dt, row_f [64], tile_d
    static constexpr int RS = FS + 260 * 4;           // the warps' row sums [2][4][64]
    static constexpr int YV = RS + 2 * 4 * 64 * 4;    // the tile's ycore, as yblob holds it
    static constexpr int BYTES = YV + 4 * 8 * 128 * 4;
    static_assert(BS % 16 == 0 && YS % 16 == 0 && XS % 16 == 0 && WS % 16 == 0 &&
                  RS % 16 == 0 && YV % 16 == 0, "16-byte aligned rows");
};

template <typename T, int NW>
__global__ void __launch_bounds__(SSD_MMA_THREADS, SSD_MMA_BWD_BLOCKS)
ssd_mma_bwd(const T* __restrict__ dY, const T* __restrict__ Bm, const T* __restrict__ Cm,
            const T* __restrict__ X, const float* __restrict__ yblob,
            const float* __restrict__ D, const float* __restrict__ dte,
            const float* __restrict__ cum, const ssm_i64* __restrict__ starts,
            const float* __restrict__ states, const int* __restrict__ bslot,
            const float* __restrict__ dfinal, T* __restrict__ dx, float* __restrict__ xgb,
            float* __restrict__ dcum, float* __restrict__ dD_part, T* __restrict__ dHx,
            float* __restrict__ dinit, float* __restrict__ end_part, ssm_i64 L, int H, int P,
            int GB, int GC, int N, ssm_i64 nc) {
    static_assert(NW == 64 || NW == 128, "NW: 64 or 128");
    using LY = ssd_mma_bwd_layout<NW>;
    constexpr int THREADS = SSD_MMA_THREADS, NS = NW / 8, LD = SSD_MMA_LD, LDB = LY::LDB;
    constexpr float L2E = ssm_math<float>::kLog2e;
    extern __shared__ ssm_v16 ssd_mma_dyn[];
    unsigned char* const sm = reinterpret_cast<unsigned char*>(ssd_mma_dyn);
    auto cs_at = [&](int k) { return reinterpret_cast<unsigned short*>(sm + LY::CS + k * LY::BB); };
    auto vals_at = [&](int k) {  // [0, 64): cum_s; [64]: cum_b; [68, 132): dt'_s
        return reinterpret_cast<float*>(sm + LY::VS + k * LY::VB);
    };
    unsigned short* const bs = reinterpret_cast<unsigned short*>(sm + LY::BS);
    unsigned short* const ys = reinterpret_cast<unsigned short*>(sm + LY::YS);
    unsigned short* const xs = reinterpret_cast<unsigned short*>(sm + LY::XS);
    unsigned short* const ws = reinterpret_cast<unsigned short*>(sm + LY::WS);
    float* const row_e = reinterpret_cast<float*>(sm + LY::FS);  // exp(cum_e - cum_s)
    float* const col_w = row_e + 64;                              // the same times dt'_s
    float* const inv_dt = row_e + 128;                            // 1 / dt'_s (0 for 0)
    float* const row_f = row_e + 192;                             // exp(cum_t - cum_b)
    float* const tile_d = row_e + 256;                            // exp(cum_e - cum_b)
    float* const red = reinterpret_cast<float*>(sm + LY::RS);     // [x . GB | dcum][warp][s]

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, t4 = lane & 3;
    const int wp = 16 * warp;  // the warp's rows p
    const ssd_mma_walk_block blk(P, H, GB, GC);  // (p0 = 0: P <= 64)
    const unsigned bh = blk.bh;
    const ssm_i64 b = blk.b;
    const int h = blk.h, gB = blk.gB, gC = blk.gC;
    const ssm_i64 PN = (ssm_i64)P * N, row = b * L, HP = (ssm_i64)H * P;
    const ssm_i64 GBN = (ssm_i64)GB * N, GCN = (ssm_i64)GC * N;
    const int pa = wp + g, na = 2 * t4;  // this thread's entries of G
    // this lane's 8 x 4 ycore values of the tile (yblob's, copied at B1 by the lane itself)
    float* const yv = reinterpret_cast<float*>(sm + LY::YV) + (warp * 8 * 128 + 4 * lane);

    float G[NS][4];
    ssm_mma_zero(G);
    auto add_final = [&](ssm_i64 jb) {  // G += dfinal of the sequence ending at boundary jb
        ssd_mma_add_final(G, bslot, dfinal, b, jb, nc, H, h, pa, na, P, N);
    };
    // G is the adjoint leaving chunk c (at boundary c + 1): add that boundary's dfinal, keep
    // it in T as dHx[c], and this warp's part of <G, states[c + 1]>
    auto boundary = [&](ssm_i64 c) {
        add_final(c + 1);
        ssd_mma_state_enter(G, dHx, b, c, nc, H, h, pa, na, P, N, true);
        if (!end_part) return;
        const float v = ssd_mma_warp_dot(G, states + ((b * (nc + 1) + c + 1) * H + h) * PN,
                                         pa, na, P, N);
        if (lane == 0) end_part[((b * nc + c) * H + h) * 4 + warp] = v;
    };

    // Copies of the rows s0 + rr + 16 i of a tile (ns steps): thread tid copies their 8
    // columns cc.
    constexpr int RS = THREADS / 8;
    const int rr = tid >> 3, cc = (tid & 7) * 8;
    const bool p_cols = cc < P;
    auto copy_c = [&](const ssd_mma_rwalker& u, int k) {  // C and the step values, stage k
        const int ns = u.rows(64);
        ssd_mma_copy_rows<T, NW, LDB>(cs_at(k), Cm + ((row + u.s0 + rr) * GC + gC) * N + cc, Cm,
                                      GCN, ns, N, rr, cc);
        ssd_mma_copy_vals(vals_at(k), cum, dte, (row + u.s0) * H + h, ns, u.first(), H, tid);
    };
    auto copy_bxy = [&](ssm_i64 s0, int ns) {  // B, x and dY of a tile
        const T* bsrc = Bm + ((row + s0 + rr) * GB + gB) * N + cc;
        const ssm_i64 at = ((row + s0 + rr) * H + h) * P + cc;
        // (B's rows in the same loop: copied by ssd_mma_copy_rows after it, ptxas spilled 28
        // bytes at NW = 128)
#pragma unroll
        for (int i = 0; i < 64 / RS; ++i) {
            const int r = rr + RS * i;
            const bool pl = r < ns && p_cols;
            ssd_mma_cp16(xs + r * LD + cc, pl ? X + at + RS * i * HP : X, pl);
            ssd_mma_cp16(ys + r * LD + cc, pl ? dY + at + RS * i * HP : dY, pl);
#pragma unroll
            for (int nb = 0; nb < NW; nb += 64) {
                const bool l = r < ns && nb + cc < N;
                ssd_mma_cp16(bs + r * LDB + nb + cc, l ? bsrc + RS * i * GBN + nb : Bm, l);
            }
        }
    };
    // the row sums of the tile at s0 (ns steps), from the warps' parts in red
    auto finish_rows = [&](ssm_i64 s0, int ns) {
        if (tid < ns) {
            float sx = 0.0f, sd = 0.0f;
#pragma unroll
            for (int w = 0; w < THREADS / 32; ++w) {
                sx += red[w * 64 + tid];
                sd += red[(4 + w) * 64 + tid];
            }
            const ssm_i64 i = (row + s0 + tid) * H + h;
            xgb[i] = sx;
            dcum[i] = sd;
        }
    };

    ssd_mma_rwalker next(starts, nc, 64);
    copy_c(next, 0);
    copy_bxy(next.s0, next.rows(64));
    next.advance(64, starts);
    ssm_cp_commit();

    const ssd_mma_saddr y_lane = ssd_mma_lane_b<LD>(ys, lane);    // dY^T as A ([t][p])
    const ssd_mma_saddr x_lane = ssd_mma_lane_b<LD>(xs, lane);    // x^T as A ([s][p])
    const ssd_mma_saddr w_lane = ssd_mma_lane_a<LD>(ws, lane);    // W as B ([t][s] = [k][n])
    const ssd_mma_saddr b_lane = ssd_mma_lane_b<LDB>(bs, lane);   // B as B ([s][n] = [n][k])
    const float d_a = D && pa < P ? D[(ssm_i64)h * P + pa] : 0.0f;
    const float d_b = D && pa + 8 < P ? D[(ssm_i64)h * P + pa + 8] : 0.0f;
    const bool odd = g & 1;
    float dd[2] = {0.0f, 0.0f};  // dY x of rows pa, pa + 8 over this lane's steps
    ssm_i64 prev_s0 = 0;
    int prev_ns = 0;  // the last tile's rows, whose sums are finished after the next B1
    const ssm_i64 row_tiles = ssd_mma_row_tiles(starts, nc);
    ssm_i64 tile = (ssm_i64)blockIdx.x * row_tiles + row_tiles - 1;  // its yblob tile
    int k = 0;
    boundary(nc - 1);
    for (ssd_mma_rwalker cur(starts, nc, 64); cur.c >= 0;
         cur.advance(64, starts), k ^= 1, --tile) {
        const int ns = cur.rows(64);
        ssm_cp_wait<0>();
        __syncthreads();  // B1: stage k, B, x and dY are the block's; the last tile is done
        if (prev_ns) finish_rows(prev_s0, prev_ns);
        const bool more = next.c >= 0;
        const ssm_i64 s_next = next.s0;
        const int ns_next = more ? next.rows(64) : 0;
        if (more) {
            copy_c(next, k ^ 1);
            next.advance(64, starts);
        }
        if (SSD_MMA_BWD_STATE_PREFETCH && end_part && cur.first() && cur.c > 0) {
            // <G, states[c]> after this tile: into L2 now
            const float* st = states + ((b * (nc + 1) + cur.c) * H + h) * PN;
            for (ssm_i64 o = (ssm_i64)tid * 32; o < PN; o += THREADS * 32) ssm_prefetch_l2(st + o);
        }
        {  // this tile's ycore, read in the epilogue (loaded there, it stalled every warp)
            const float* src = yblob + ssd_mma_blob_at(tile, warp, lane);
#pragma unroll
            for (int j = 0; j < 8; ++j) ssm_cp_async<16>(yv + 128 * j, src + 128 * j);
        }
        ssm_cp_commit();
        const float* cv = vals_at(k);
        const float* dv = cv + 68;
        const float cum_b = cur.first() ? 0.0f : cv[64];
        const ssd_mma_saddr c_lane = ssd_mma_lane_a<LDB, false>(cs_at(k), lane);  // C [t][n]
        ssd_mma_tile_w<T, NW>(ws, c_lane, bs, cv, dv, ns, warp, lane);
        if (tid < 64) {  // (col_w as ssd_mma_tile_decays makes the forward's)
            const float ce = cv[ns - 1];
            const bool l = tid < ns;
            row_e[tid] = l ? ssm_math<float>::decay((ce - cv[tid]) * L2E) : 0.0f;
            col_w[tid] = l ? ssm_math<float>::decay((ce - cv[tid]) * L2E) * dv[tid] : 0.0f;
            inv_dt[tid] = l && dv[tid] > 0.0f ? 1.0f / dv[tid] : 0.0f;  // (W's column is 0 there)
            row_f[tid] = l ? ssm_math<float>::decay((cv[tid] - cum_b) * L2E) : 0.0f;
            if (tid == 0) tile_d[0] = ssm_math<float>::decay((ce - cum_b) * L2E);
        }
        // st^T = G B^T (K = n): G's accumulators as hi + lo A fragments (tiles 2 ks, 2 ks + 1
        // make K = n 16 ks ..), B as staged the B fragments
        float acc[8][4];
        ssm_mma_zero(acc);
#pragma unroll
        for (int ks = 0; ks < NS / 2; ++ks) {
            const unsigned a[4] = {ssd_mma_pack<T>(G[2 * ks][0], G[2 * ks][1]),
                                   ssd_mma_pack<T>(G[2 * ks][2], G[2 * ks][3]),
                                   ssd_mma_pack<T>(G[2 * ks + 1][0], G[2 * ks + 1][1]),
                                   ssd_mma_pack<T>(G[2 * ks + 1][2], G[2 * ks + 1][3])};
            const unsigned al[4] = {ssd_mma_pack_lo<T>(G[2 * ks][0], G[2 * ks][1]),
                                    ssd_mma_pack_lo<T>(G[2 * ks][2], G[2 * ks][3]),
                                    ssd_mma_pack_lo<T>(G[2 * ks + 1][0], G[2 * ks + 1][1]),
                                    ssd_mma_pack_lo<T>(G[2 * ks + 1][2], G[2 * ks + 1][3])};
#pragma unroll
            for (int j = 0; j < 8; j += 2) {
                unsigned bf[4];
                ssd_mma_load_b2<LDB>(bf, b_lane, 8 * j, 16 * ks);
                ssd_mma_run2<T>(acc[j], acc[j + 1], a, bf);
                ssd_mma_run2<T>(acc[j], acc[j + 1], al, bf);
            }
        }
        // dY^T's and x^T's fragments, K = t (s) 16 kt .., before ys and xs are free
        unsigned ya[4][4], xa[4][4];
#pragma unroll
        for (int kt = 0; kt < 4; ++kt) {
            ssd_mma_load_at<LD>(ya[kt], y_lane, wp, 16 * kt);
            ssd_mma_load_at<LD>(xa[kt], x_lane, wp, 16 * kt);
        }
        __syncthreads();  // B2: ws and the decays are the block's; bs, xs and ys are free
        if (more) copy_bxy(s_next, ns_next);
        ssm_cp_commit();

        // dg^T = dY^T W (dt'_s inside W): column pairs jp <= kt (s <= t)
        float dg[8][4];
        ssm_mma_zero(dg);
#pragma unroll
        for (int kt = 0; kt < 4; ++kt) {
#pragma unroll
            for (int jp = 0; jp <= kt; ++jp) {
                unsigned bf[4];
                ssd_mma_load_bt2<LD>(bf, w_lane, 16 * jp, 16 * kt);
                ssd_mma_run2<T>(dg[2 * jp], dg[2 * jp + 1], ya[kt], bf);
            }
        }

        // The epilogue: entry i of tile j is (p = pa + 8 (i >= 2), s = 8 j + 2 t4 + i % 2),
        // whose dY, x and rb(col_w x) are half i % 2 of register 2 (j % 2) + (i >= 2) of
        // their fragments j / 2 (the accumulators' layout, as in ssd_mma_fwd).
        ssm_cp_wait<1>();  // this lane's ycore copies (B, x and dY of the next tile may fly)
        {
            const ssm_i64 o0 = ((row + cur.s0) * H + h) * P;
#pragma unroll
            for (int ks = 0; ks < 4; ++ks) {
                float sx[4], sd[4];  // this lane's parts of the steps' sums: [2 (j % 2) + q]
                unsigned xw[4] = {xa[ks][0], xa[ks][1], xa[ks][2], xa[ks][3]}, unused[4];
                ssd_mma_weigh_a<T, false>(xw, unused, col_w, 16 * ks, lane);  // rb(col_w x)
#pragma unroll
                for (int j = 2 * ks; j < 2 * ks + 2; ++j) {
                    const ssm_f4 yc = *reinterpret_cast<const ssm_f4*>(yv + 128 * j);
                    float dxv[4];
                    const int jo = 2 * (j & 1);
                    sx[jo] = sx[jo + 1] = sd[jo] = sd[jo + 1] = 0.0f;
#pragma unroll
                    for (int i = 0; i < 4; ++i) {
                        const int reg = 2 * (j & 1) + (i >> 1), q = i & 1;
                        const int s = 8 * j + 2 * t4 + q;
                        const float dyv = ssd_mma_half<T>(ya[ks][reg], q);
                        const float xv = ssd_mma_half<T>(xa[ks][reg], q);
                        const float gb = row_e[s] * acc[j][i] + inv_dt[s] * dg[j][i];
                        dxv[i] = col_w[s] * acc[j][i] + dg[j][i] + (i >> 1 ? d_b : d_a) * dyv;
                        sx[jo + q] += xv * gb;
                        sd[jo + q] += dyv * yc.v[i] - xv * dg[j][i] -
                                      ssd_mma_half<T>(xw[reg], q) * acc[j][i];
                        dd[i >> 1] += dyv * xv;
                    }
                    // dx: lanes g and g ^ 1 trade one value, so that an even g stores rows
                    // p, p + 1 of step t0 and an odd g those of step t0 + 1 (P is even)
#pragma unroll
                    for (int hf = 0; hf < 2; ++hf) {
                        const float v0 = dxv[2 * hf], v1 = dxv[2 * hf + 1];
                        const float got = __shfl_xor_sync(0xffffffffu, odd ? v0 : v1, 4);
                        const float two[2] = {odd ? got : v0, odd ? v1 : got};
                        const int t = 8 * j + 2 * t4 + (odd ? 1 : 0);
                        const int p = pa + 8 * hf - (odd ? 1 : 0);
                        if (t < ns && p < P)
                            ssd_mma_set2(dx + o0 + (ssm_i64)t * HP + p, true, true, two);
                    }
                }
                // the sums over the warp's rows p (lanes g), of value v: step 8 j + 2 t4 + q
                // of j = 2 ks + v / 2, q = v % 2 (reduced and scattered by halves instead,
                // with fewer shuffles, they took longer: 1.228 against 1.197 ms)
#pragma unroll
                for (int v = 0; v < 4; ++v) {
#pragma unroll
                    for (int m = 4; m <= 16; m <<= 1) {
                        sx[v] += __shfl_xor_sync(0xffffffffu, sx[v], m);
                        sd[v] += __shfl_xor_sync(0xffffffffu, sd[v], m);
                    }
                    if (g == 0) {
                        const int s = 8 * (2 * ks + (v >> 1)) + 2 * t4 + (v & 1);
                        red[warp * 64 + s] = sx[v];
                        red[(4 + warp) * 64 + s] = sd[v];
                    }
                }
            }
        }
        prev_s0 = cur.s0;
        prev_ns = ns;

        // G = d G + (row_f dY)^T C: the weighted dY^T as hi + lo A fragments, C ([t][n]) as
        // the B fragments
        {
            const float d = tile_d[0];
#pragma unroll
            for (int j = 0; j < NS; ++j)
#pragma unroll
                for (int i = 0; i < 4; ++i) G[j][i] *= d;
        }
#pragma unroll
        for (int kt = 0; kt < 4; ++kt) {
            unsigned hi[4] = {ya[kt][0], ya[kt][1], ya[kt][2], ya[kt][3]}, lo[4];
            ssd_mma_weigh_a<T, true>(hi, lo, row_f, 16 * kt, lane);
#pragma unroll
            for (int j = 0; j < NS; j += 2) {
                unsigned bf[4];
                ssd_mma_load_bt2<LDB>(bf, c_lane, 8 * j, 16 * kt);
                ssd_mma_run2<T>(G[j], G[j + 1], hi, bf);
                ssd_mma_run2<T>(G[j], G[j + 1], lo, bf);
            }
        }
        if (cur.first() && cur.c > 0) boundary(cur.c - 1);
    }
    ssm_cp_wait<0>();
    __syncthreads();  // the last tile's row sums
    finish_rows(prev_s0, prev_ns);
    if (dD_part) {  // dY x over this row, for rows pa and pa + 8 (the lanes t4 share them)
#pragma unroll
        for (int i = 0; i < 2; ++i) {
#pragma unroll
            for (int m = 1; m <= 2; m <<= 1) dd[i] += __shfl_xor_sync(0xffffffffu, dd[i], m);
            if (t4 == 0 && pa + 8 * i < P) dD_part[(ssm_i64)bh * P + pa + 8 * i] = dd[i];
        }
    }
    add_final(0);
    if (dinit) {
        float* dst = dinit + bh * PN;
        ssd_mma_tile_pairs<NS>(pa, na, P, N, [&](int j, int i, int o, bool two) {
            *reinterpret_cast<ssd_mma_f2*>(dst + o) = ssd_mma_f2{{G[j][i], two ? G[j][i + 1] : 0.0f}};
        });
    }
}

// --------------------------------------------------------------------------------------
// C B^T of every chunk, once per class of heads that share their B and C groups (all the
// heads when G = 1), for ssd_mma_chunk_out: the blocks of the lower triangle, 64 x 64 each
// (rows r of tile RT, columns s of tile QT <= RT), K = N in slices of KW. The block is
// written in the order ssd_mma_chunk_out's warps hold it (ssd_mma_cb_at): warp w's rows
// 16 w .. 16 w + 15 as its D tiles j < 8, one float4 {d0, d1, d2, d3} per lane and tile,
// so that each warp reads its fragments back with coalesced 16-byte loads.
// Grid: (batch * nc * classes * pairs), pairs = T (T + 1) / 2 with T tiles per chunk; pair
// p = RT (RT + 1) / 2 + QT. Head h is in class h / (H / classes); cb (batch, nc, classes, pairs,
// 4096) float.
// --------------------------------------------------------------------------------------
__device__ __forceinline__ ssm_i64 ssd_mma_cb_at(ssm_i64 block, int warp, int j, int lane) {
    return block * (SSD_MMA_ROWS * SSD_MMA_ROWS) + ((warp * 8 + j) * 32 + lane) * 4;
}

// This warp's fragments of block `block` of a buffer in ssd_mma_cb's order.
__device__ __forceinline__ void ssd_mma_cb_load(float (&gacc)[8][4], const float* cb,
                                                ssm_i64 block, int warp, int lane) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        const ssm_f4 v = *reinterpret_cast<const ssm_f4*>(cb + ssd_mma_cb_at(block, warp, j, lane));
#pragma unroll
        for (int i = 0; i < 4; ++i) gacc[j][i] = v.v[i];
    }
}

template <typename T, int KW>
__global__ void __launch_bounds__(SSD_MMA_THREADS)
ssd_mma_cb(const T* __restrict__ Cm, const T* __restrict__ Bm, const ssm_i64* __restrict__ starts,
           float* __restrict__ cb, float* __restrict__ cbt, ssm_i64 L, int GB, int GC, int N,
           ssm_i64 nc, int classes, int pairs) {
    static_assert(KW % 64 == 0, "KW: a multiple of 64");
    constexpr int LDK = KW + 8;
    alignas(16) __shared__ unsigned short cs[SSD_MMA_ROWS * LDK];  // C[r][n]
    alignas(16) __shared__ unsigned short bs[SSD_MMA_ROWS * LDK];  // B[s][n]
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const ssm_i64 block = blockIdx.x;  // = ((b * nc + c) * classes + k) * pairs + pair
    // in 32-bit divisions: every quotient of blockIdx.x fits
    const unsigned eu = blockIdx.x / (unsigned)pairs;  // = (b * nc + c) * classes + k
    const int k = (int)(eu % (unsigned)classes);
    const unsigned bcu = eu / (unsigned)classes, bu = bcu / (unsigned)nc;
    const ssm_i64 b = bu, c = bcu - bu * (unsigned)nc;
    const int pair = (int)(blockIdx.x - eu * (unsigned)pairs);
    int rt = 0;
    while ((rt + 1) * (rt + 2) / 2 <= pair) ++rt;
    const int qt = pair - rt * (rt + 1) / 2;
    const ssm_i64 t0 = starts[c], t1 = starts[c + 1];
    const ssm_i64 r0 = t0 + (ssm_i64)rt * SSD_MMA_ROWS, q0 = t0 + (ssm_i64)qt * SSD_MMA_ROWS;
    if (r0 >= t1) return;  // past a short chunk's end: ssd_mma_chunk_out skips it too
    const int nr = (int)(t1 - r0 < SSD_MMA_ROWS ? t1 - r0 : SSD_MMA_ROWS);
    const int nq = (int)(t1 - q0 < SSD_MMA_ROWS ? t1 - q0 : SSD_MMA_ROWS);
    const int gb = k / (classes / GB), gc = k / (classes / GC);
    const bool vec = ssd_mma_vec(8, N, Cm, Bm, Cm, Bm);

    float acc[8][4];
    ssm_mma_zero(acc);
    for (int n0 = 0; n0 < N; n0 += KW) {
        __syncthreads();  // the previous slice's reads are done
        ssd_mma_stage<T, SSD_MMA_ROWS, KW, LDK>(
            cs, Cm + ((b * L + r0) * GC + gc) * N + n0, (ssm_i64)GC * N, nr, N - n0, vec, nullptr,
            tid);
        ssd_mma_stage<T, SSD_MMA_ROWS, KW, LDK>(
            bs, Bm + ((b * L + q0) * GB + gb) * N + n0, (ssm_i64)GB * N, nq, N - n0, vec, nullptr,
            tid);
        __syncthreads();
        ssd_mma_slice<T, 8, KW, LDK>(acc, cs, bs, n0, N, warp, lane);
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        ssm_f4 v;
#pragma unroll
        for (int i = 0; i < 4; ++i) v.v[i] = acc[j][i];
        *reinterpret_cast<ssm_f4*>(cb + ssd_mma_cb_at(block, warp, j, lane)) = v;
    }
    if (!cbt) return;
    // The transposed block (rows s, columns r: B_s . C_r), for the backward's upper products,
    // in the same fragment order: through shared memory (cs, free after the last slice).
    constexpr int LDF = SSD_MMA_ROWS + 4;
    static_assert(SSD_MMA_ROWS * LDF * 4 <= SSD_MMA_ROWS * LDK * 2, "cs holds the block");
    float* const fs = reinterpret_cast<float*>(cs);
    const int g = lane >> 2, t = lane & 3;
    __syncthreads();  // every warp's reads of cs are done
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i)
            fs[(16 * warp + g + (i >= 2 ? 8 : 0)) * LDF + 8 * j + 2 * t + (i & 1)] = acc[j][i];
    __syncthreads();
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        ssm_f4 v;
#pragma unroll
        for (int i = 0; i < 4; ++i)
            v.v[i] = fs[(8 * j + 2 * t + (i & 1)) * LDF + 16 * warp + g + (i >= 2 ? 8 : 0)];
        *reinterpret_cast<ssm_f4*>(cbt + ssd_mma_cb_at(block, warp, j, lane)) = v;
    }
}

// --------------------------------------------------------------------------------------
// Outputs on tensor cores. A block computes 64 rows (steps) of one chunk of one head, all
// P <= PW columns; warp w rows 16w .. 16w + 15 with PW / 8 D tiles (PW / 2 floats per
// thread).
//   1. y = C states[c]^T (K = N in slices of KW: cs = C rows, ms = state rows p; the
//      entering states come rounded to T from ssd_state_passing), each row then scaled by
//      [seq_t == seq_prev] exp(cum_t);
//   2. per tile of 64 steps s up to the rows' last: the block of C B^T from ssd_mma_cb
//      (read in the warps' fragment order), masked and weighted in registers, rounded to
//      T; y += G x (K = s, x staged as it lies, xt[s][p], and transposed by ldmatrix);
//   3. + D x, * silu(z), store.
// C B^T is the same for every head of a class (all of them when G = 1), so it is made once
// per chunk by ssd_mma_cb instead of once per head here.
// Every operand is staged by cp.async (ssd_mma_stage_async); the x tiles of step 2 go
// through two buffers (xt, and cs once step 1 is done) when cs holds one (PW <= KW): the
// next tile is in flight while this one is multiplied. The first x tile comes with step 1.
// A block walks tiles_per_block consecutive row tiles of its chunk (one at PW = 32), which
// share its set-up and, without z and with N <= KW, the entering state staged in ms.
// Grid: (batch * H * nc * ceil(tiles_per_chunk / tiles_per_block)); 64-bit offsets.
// --------------------------------------------------------------------------------------
// 4 blocks (16 warps) per SM for PW <= 64: 128 registers, no spills (ptxas, sm_90).
#ifndef SSD_MMA_OUT_BLOCKS
#define SSD_MMA_OUT_BLOCKS 4  // blocks per SM for PW <= 64 (the register bound: 128 at 4)
#endif
template <typename T, int PW, int KW>
__global__ void __launch_bounds__(SSD_MMA_THREADS, PW <= 64 ? SSD_MMA_OUT_BLOCKS : 2)
ssd_mma_chunk_out(const T* __restrict__ Cm, const float* __restrict__ cb, const T* __restrict__ X,
                  const T* __restrict__ states, const float* __restrict__ D,
                  const T* __restrict__ z, const float* __restrict__ dte,
                  const float* __restrict__ cum, const int* __restrict__ seq,
                  const ssm_i64* __restrict__ starts, T* __restrict__ out, ssm_i64 L, int H,
                  int P, int GC, int N, ssm_i64 nc, int tiles_per_chunk, int classes,
                  int tiles_per_block) {
    static_assert(PW % 16 == 0 && PW <= 128, "PW: a multiple of 16, at most 128");
    static_assert(KW % 64 == 0, "KW: a multiple of 64");
    constexpr int NT = PW / 8;  // D tiles of 16 x 8 per warp
    constexpr int LDK = KW + 8, LDX = PW + 8, LDZ = PW + 8;
    static_assert(SSD_MMA_ROWS * LDZ <= PW * LDK, "ms holds the gate's rows in step 3");
    constexpr bool DOUBLE = LDX <= LDK;  // cs holds an x tile: two buffers in step 2
    alignas(16) __shared__ unsigned short cs[SSD_MMA_ROWS * LDK];  // C[t][n]
    alignas(16) __shared__ unsigned short ms[PW * LDK];            // state[p][n], then z[t][p]
    alignas(16) __shared__ unsigned short xt[SSD_MMA_ROWS * LDX];  // x[s][p] (and cs: DOUBLE)
    // cum_r, cum_q: the chunk sums times log2(e), so that a decay is one exp2
    __shared__ float cum_r[SSD_MMA_ROWS], cum_q[SSD_MMA_ROWS], dt_q[SSD_MMA_ROWS];
    __shared__ int seq_r[SSD_MMA_ROWS], seq_q[SSD_MMA_ROWS];
    // col_w[s] = exp2(cum_r[0] - cum_q[s]) dt'_s: a whole tile's column weights (below)
    __shared__ float col_w[SSD_MMA_ROWS];
    __shared__ float d_s[PW];  // the head's D (zeros past P, and without D)

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, t = lane & 3;
    // The block's (b, h, c, group of tiles) in 32 bits: every quotient of blockIdx.x fits.
    // PW = 32 takes one tile per block (the host launches it so): with the tile loop ptxas
    // spilled at its 128 registers.
    const int tpb = PW < 64 ? 1 : tiles_per_block;
    const unsigned groups = (unsigned)((tiles_per_chunk + tpb - 1) / tpb);
    const unsigned per_head = (unsigned)nc * groups;
    const unsigned bh = blockIdx.x / per_head, ctg = blockIdx.x - bh * per_head;
    const unsigned cu = ctg / groups;
    const int tile_begin = (int)(ctg - cu * groups) * tpb;
    const int tile_end = PW < 64 ? tile_begin + 1
                         : tile_begin + tpb < tiles_per_chunk ? tile_begin + tpb : tiles_per_chunk;
    const ssm_i64 c = cu, b = bh / (unsigned)H;
    const int h = (int)(bh - (unsigned)b * (unsigned)H);
    const ssm_i64 t0 = starts[c], t1 = starts[c + 1];
    const int gc = ssd_mma_group(h, H, GC);
    const int pairs = tiles_per_chunk * (tiles_per_chunk + 1) / 2;
    const int seq_prev = ssd_mma_seq(seq, b * L + (t0 > 0 ? t0 - 1 : 0));
    const bool vec = ssd_mma_vec(P, N, Cm, Cm, X, states);
    for (int p = tid; p < PW; p += SSD_MMA_THREADS) d_s[p] = D && p < P ? D[(ssm_i64)h * P + p] : 0.0f;

#pragma unroll 1
    for (int tile = tile_begin; tile < tile_end; ++tile) {
    const ssm_i64 r0 = t0 + (ssm_i64)tile * SSD_MMA_ROWS;
    if (r0 >= t1) break;
    const int nr = (int)(t1 - r0 < SSD_MMA_ROWS ? t1 - r0 : SSD_MMA_ROWS);
    const ssm_i64 cb_blocks = ((b * nc + c) * classes + ssd_mma_group(h, H, classes)) * pairs +
                              tile * (tile + 1) / 2;  // + the column tile
    // The rows' chunk sums and labels: loaded with step 1's first copies in flight, so that
    // both wait together. (D, for step 3, here: moved there too, it made ptxas spill.)
    auto load_rows = [&] {
        if (tid < SSD_MMA_ROWS) {
            const ssm_i64 r = r0 + (tid < nr ? tid : nr - 1);
            cum_r[tid] = cum[(b * L + r) * H + h] * ssm_math<float>::kLog2e;
            seq_r[tid] = ssd_mma_seq(seq, b * L + r);
        }
    };

    const ssm_i64 q_end = r0 + nr;  // step 2's steps: t0 .. q_end - 1
    auto steps_from = [&](ssm_i64 q0) {
        return (int)(q_end - q0 < SSD_MMA_ROWS ? q_end - q0 : SSD_MMA_ROWS);
    };
    auto stage_x = [&](unsigned short* dst, ssm_i64 q0) {
        ssd_mma_stage_async<T, SSD_MMA_ROWS, PW, LDX>(dst, X + ((b * L + q0) * H + h) * P,
                                                      (ssm_i64)H * P, steps_from(q0), P, vec, tid);
    };

    float acc[NT][4];
    ssm_mma_zero(acc);

    // 1. The entering state's contribution. The state stays staged in ms from tile to tile
    // when it is one slice and the gate's rows do not take ms over in step 3.
    const T* S = states + ((b * nc + c) * H + h) * ((ssm_i64)P * N);
    const bool keep_state = !z && N <= KW;
    for (int n0 = 0; n0 < N; n0 += KW) {
        __syncthreads();  // (and the previous tile's reads are done)
        ssd_mma_stage_async<T, SSD_MMA_ROWS, KW, LDK>(
            cs, Cm + ((b * L + r0) * GC + gc) * N + n0, (ssm_i64)GC * N, nr, N - n0, vec, tid);
        if (!keep_state || tile == tile_begin)
            ssd_mma_stage_async<T, PW, KW, LDK>(ms, S + n0, N, P, N - n0, vec, tid);
        if (n0 == 0) {
            stage_x(xt, t0);
            load_rows();
        }
        ssm_cp_commit();
        ssm_cp_wait<0>();
        __syncthreads();
        ssd_mma_slice<T, NT, KW, LDK>(acc, cs, ms, n0, N, warp, lane);
    }
    {
        const int ra = 16 * warp + g, rb = ra + 8;
        const float sa = seq_r[ra] == seq_prev ? ssm_math<float>::decay(cum_r[ra]) : 0.0f;
        const float sb = seq_r[rb] == seq_prev ? ssm_math<float>::decay(cum_r[rb]) : 0.0f;
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            acc[j][0] *= sa;
            acc[j][1] *= sa;
            acc[j][2] *= sb;
            acc[j][3] *= sb;
        }
    }

    // 2. The diagonal block, one tile of 64 steps s at a time (pass `it`).
    const unsigned short* xrow = xt;  // the last pass's x tile: the rows' own, for step 3
    int it = 0;
    for (ssm_i64 q0 = t0; q0 < q_end; q0 += SSD_MMA_ROWS, ++it) {
        const int nq = steps_from(q0);
        unsigned short* const xcur = DOUBLE && (it & 1) ? cs : xt;
        // This warp's fragments of the block, first: their round trip (L2) overlaps the
        // barrier, the staging and the chunk sums' loads.
        float gacc[8][4];
        ssd_mma_cb_load(gacc, cb, cb_blocks + (q0 - t0) / SSD_MMA_ROWS, warp, lane);
        __syncthreads();  // the previous pass's reads (x buffers, cum_q, dt_q, seq_q) are done
        if (DOUBLE) {  // the next pass's tile into the other buffer
            if (q0 + SSD_MMA_ROWS < q_end) stage_x(it & 1 ? xt : cs, q0 + SSD_MMA_ROWS);
        } else if (it > 0) {
            stage_x(xt, q0);
        }
        if (z && it == 0)  // the gate's rows, for step 3 (ms is free after step 1)
            ssd_mma_stage_async<T, SSD_MMA_ROWS, PW, LDZ>(
                ms, z + ((b * L + r0) * H + h) * P, (ssm_i64)H * P, nr, P,
                vec && ((unsigned long long)z & 15) == 0, tid);
        ssm_cp_commit();
        // A tile wholly before the rows (q0 < r0) without restarts has every entry live, and
        // its weights exp2(cum_r - cum_q) dt'_q factor as exp2(cum_r - cum_r[0]) col_w[s]:
        // one exponential per row and per column instead of one per entry. Both exponents
        // are <= 0 when the chunk sums do not increase (dt' A <= 0); a tile where either
        // exceeds 64 (a product that could overflow a factor) takes the entrywise weights.
        const bool whole = !seq && q0 < r0;  // uniform over the block
        bool far = false;
        if (tid < SSD_MMA_ROWS) {
            const ssm_i64 q = q0 + (tid < nq ? tid : nq - 1);
            const ssm_i64 i = (b * L + q) * H + h;
            const float cq = cum[i] * ssm_math<float>::kLog2e, dq_t = dte[i];
            cum_q[tid] = cq;
            dt_q[tid] = dq_t;
            seq_q[tid] = ssd_mma_seq(seq, b * L + q);
            if (whole) {
                const float e = cum_r[0] - cq;
                col_w[tid] = ssm_math<float>::decay(e) * dq_t;
                far = e > 64.0f || cum_r[tid] - cum_r[0] > 64.0f;
            }
        }
        if (DOUBLE)
            ssm_cp_wait<1>();  // this pass's tile has landed; the next may be in flight
        else
            ssm_cp_wait<0>();
        const bool dense = __syncthreads_or(far) == 0 && whole;
        // Mask and weight: entry (r, s) of this warp lives in gacc[s / 8][...].
        // Every tile but the diagonal one (q0 = r0) is a whole tile of steps before the
        // rows: only the diagonal tile needs s <= r, and only restarts need the labels
        // (rows past nr are not stored; a whole tile has nq = 64).
        const int ra = 16 * warp + g, rb = ra + 8;
        const int dq = (int)(r0 - q0);  // a multiple of 64, >= 0
        const float la = cum_r[ra], lb = cum_r[rb];
        unsigned afr[4][4];  // the masked block as A fragments, K = s in steps of 16
        if (dense) {
            ssd_mma_weighed(gacc, ssm_math<float>::decay(la - cum_r[0]),
                            ssm_math<float>::decay(lb - cum_r[0]), col_w, t,
                            [&](int j, float v0, float v1, float v2, float v3) {
                                afr[j >> 1][(j & 1) * 2 + 0] = ssd_mma_pack<T>(v0, v1);
                                afr[j >> 1][(j & 1) * 2 + 1] = ssd_mma_pack<T>(v2, v3);
                            });
        } else {
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                float v[4];
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const int s = 8 * j + 2 * t + (i & 1);
                    const float w =
                        ssm_math<float>::decay((i >= 2 ? lb : la) - cum_q[s]) * dt_q[s];
                    const int r = i >= 2 ? rb : ra;
                    const bool live = s <= r + dq && (!seq || seq_q[s] == seq_r[r]);
                    v[i] = live ? w * gacc[j][i] : 0.0f;
                }
                afr[j >> 1][(j & 1) * 2 + 0] = ssd_mma_pack<T>(v[0], v[1]);
                afr[j >> 1][(j & 1) * 2 + 1] = ssd_mma_pack<T>(v[2], v[3]);
            }
        }
        // afr[ks] = {tile 2ks rows g, tile 2ks rows g+8, tile 2ks+1 rows g, rows g+8} is
        // the A fragment a0..a3 of K = s in 16 ks .. 16 ks + 15.
        const ssd_mma_saddr x_lane = ssd_mma_lane_a<LDX>(xcur, lane);
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) {
            const unsigned a[4] = {afr[ks][0], afr[ks][1], afr[ks][2], afr[ks][3]};
            // On the chunk's diagonal tile, warp w's rows see steps < 16 (w + 1) only.
            if (q0 == r0 && ks > warp) break;
#pragma unroll
            for (int j = 0; j < NT; j += 2) {
                unsigned bf[4];
                ssd_mma_load_bt2<LDX>(bf, x_lane, 8 * j, 16 * ks);
                ssd_mma_run2<T>(acc[j], acc[j + 1], a, bf);
            }
        }
        xrow = xcur;
    }
    ssm_cp_wait<0>();  // the gate's rows, when their group was the last
    __syncthreads();

    // 3. Skip connection, gate, store: a thread's two adjacent columns p, p + 1 at a time
    // (one 32-bit store when P is even and out 4-byte aligned). x comes from the last x
    // tile of step 2 (q0 = r0: the rows' own), and z from ms.
    const bool pair32 = (P & 1) == 0 && ((unsigned long long)out & 3) == 0;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int r = 16 * warp + g + 8 * half;
        if (r >= nr) continue;
        T* const orow = out + ((b * L + r0 + r) * H + h) * P;
        const unsigned short* const xr = xrow + r * LDX;
        const unsigned short* const zr = ms + r * LDZ;
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            const int p = 8 * j + 2 * t;
            if (p < P) {
                const bool two = p + 1 < P;
                float v[2] = {acc[j][2 * half], acc[j][2 * half + 1]};
                if (D) {
#pragma unroll
                    for (int k = 0; k < 2; ++k) {
                        T xv;
                        xv.bits = xr[p + k];  // zero past P
                        v[k] += d_s[p + k] * ssm_load(xv);
                    }
                }
                if (z) {
                    const unsigned zw = ssd_mma_pair(zr + p);  // zero past P
#pragma unroll
                    for (int k = 0; k < 2; ++k) {
                        const float zv = ssd_mma_half<T>(zw, k);
                        v[k] *= zv * ssm_math<float>::sigmoid_fast(zv);
                    }
                }
                ssd_mma_set2(orow + p, pair32, two, v);
            }
        }
    }
    }  // tile
}

// --------------------------------------------------------------------------------------
// The backward's chunk products on tensor cores: ssd_chunk_mm of ssd.cu (same roles, same
// result up to the 16-bit rounding of its operands) for 16-bit U, W, Vv, float32 M and out:
//
//   out[r, v] = scale_r * sum_k M[v, k] U_r[k]                          (boundary term)
//             + sum_q w_rq (U_r . W_q) Vv_q[v]                           (diagonal block)
//
//   UPPER = false (q <= r): w_rq = [seq_q == seq_r] exp(cum_r - cum_q),
//           M = the state entering the chunk, scale_r = [seq_r == seq_prev] exp(cum_r);
//   UPPER = true  (q >= r): w_rq = [seq_q == seq_r] exp(cum_q - cum_r),
//           M = the adjoint leaving the chunk, scale_r = [seq_r == seq_E] exp(cum_E - cum_r);
//   DTW = 1: w_rq also times dt'_q; DTW = 2: w_rq and scale_r also times dt'_r (the whole
//           row r times dt'_r); DTW = 0: neither.
// M (v, k) is M[v * K + k], or M[k * V + v] when MT; chunk c of it at
// Mm + ((b * m_chunks + c) * H + h) * K * V. Instances (as in ssd.cu): the recomputed output
// without D and gate (U = C, W = B, Vv = x, M = states, DTW = 1), dt'_s (G B)_s (U = B,
// W = C, Vv = dY, M = dHx, UPPER, DTW = 2), dB_s / dt'_s (U = x, W = dY, Vv = C,
// M = dHx^T, UPPER) and dC_t (U = dY, W = x, Vv = B, M = states^T, DTW = 1).
// The block entry (r, q) of the first and the entry (q, r) of the second are then the same
// float32 value exp(cum_t - cum_s) dt'_s (C_t . B_s), rounded alike: the terms of
// dY_t . y_t and dt'_s x_s . (G B)_s that cancel in the backward's chunk-sum cotangent
// cancel up to float32 sums (the 16-bit roundings of the block would not cancel).
// Structure of ssd_mma_chunk_out: a block owns 64 rows r of a chunk and all V <= VW
// columns, warp w rows 16w .. 16w + 15; K is staged in slices of KW (U stays resident when
// K <= KW); the masked block goes from the U W^T product to the product with Vv in
// registers, rounded to T.
// with_diag = 0 leaves the terms q = r out of the block (w_rr = 0): the backward adds them
// in float32, where the two that cancel in the chunk sums' cotangent (dY_t . y_t and
// dt'_t x_t . (G B)_t) cancel exactly instead of through different 16-bit roundings.
// bnd (or null; DTW = 2 only): bnd[b, r, h] = sum_v (row r's boundary term)[v] Xd[b, r, h, v]; with
// Xd = x in the (G B) instance, the part of dt'_s x_s . (G B)_s that the backward must
// match, step by step, in its chunk-end term <dHx, states> (see ssmkit/_gpu/ssd.py).
// HSUM, sums over heads (dB, dC: the gradient of a group's B or C is the sum of its heads'):
// output group o of XO has heads o H / XO .. (o + 1) H / XO - 1,
// cut into head_splits runs of consecutive heads; a block loops over one run and writes
// the sum of its heads' products (in head order: deterministic) to the partial
// out + hs * part_stride, laid out (batch, L, XO, V). The caller sums the head_splits
// partials (without HSUM: XO = H, head_splits = 1, one head per block, out (batch, L, H,
// V)). DTW = 0 only: dt_out = 1 multiplies each head's row r by dt'_r; rowdot (or null)
// receives per head rowdot[b, r, h] = sum_v (row r before that scaling)[v] Xr_r[v], with
// Xr_r = Xr[b, r, h / (H / XR)] (x_s . (G B)_s = B_s . (dB_s / dt'_s) in the dB instance,
// with Xr = B).
// FUSE = 1 (the ycore instance) or 2 (GB): nothing is stored to out; the epilogue does the
// per-step element-wise work on the block's rows instead (ssd_mma_rows_epilogue; dy, z, X,
// D, cbd in, dY16, dz, dx, dcum, dD_part out; cbm required). FUSE = 0: those are unused.
// FUSE = 2 takes rowdot (or null) for x_s . (G B)_s instead (see the epilogue's xgb).
// Grid: (batch * XO * head_splits * nc * tiles_per_chunk); 64-bit offsets.
// --------------------------------------------------------------------------------------

// The backward's per-step element-wise work (ssd_mma_bwd_rows, the same arithmetic) done in
// the epilogue of the product that makes its float32 rows, so that those rows never go to
// memory. The block holds rows ra = 16 warp + g and rb = ra + 8 of its 64 (live below nr),
// every column p < P (lane t: p = 8 j + 2 t and p + 1), of head h; row0 = (b L + r0) H + h.
// e_r = dte_r (C_r . B_r), D_p and (GB) dcum_r come from shared arrays the block filled at
// its start (e_s, d_s, dc_s; d_s zero past P or without D); dY = dy silu'(z) (dy without z).
//   FUSE = 1 (ycore, acc = yo): with z, dY16 = dY rounded to T and
//     dz = dy y_pre sigmoid(z) (1 + z (1 - sigmoid(z))), y_pre = (yo + e x) + D x;
//     dcum[row] = sum_p round_T(dY)_p yo_p (the first half of dcum).
//   FUSE = 2 (GB, acc = go): dx = (go + e dY) + D dY rounded to T,
//     dcum[row] -= sum_p x_p go_p, and the block's per-column sums of dY x, in warp order,
//     to dD_part (when not null; red: the block's 4 x 8 NT floats of shared scratch, free
//     once every warp is past its reads of the staged rows); with xgb (not null),
//     xgb[row] = x_r . (G B)_r = (sum_p x_p go_p + e_r sum_p x_p dY_p) / dt'_r, the diagonal
//     term included (0 where dt'_r = 0: the host takes this path with softplus only, where
//     dt'_r = 0 comes with a zero derivative; dt_s holds the rows' dt').
// STAGED: the rows' dy, x, z come from shared tiles (rows of LDS values, zero past nr and
// P; the caller copied them while the product ran), else from global memory, every load
// issued before the first is used (one round trip per block, not one per column pair).
template <typename T, int FUSE, int NT, bool STAGED, int LDS>
__device__ __forceinline__ void ssd_mma_rows_epilogue(
        const float (&acc)[NT][4], const T* __restrict__ dy, const T* __restrict__ z,
        const T* __restrict__ X, const float* e_s, const float* d_s, const float* dc_s,
        T* __restrict__ dY16, T* __restrict__ dz, T* __restrict__ dx, float* __restrict__ dcum,
        float* __restrict__ dD_part, const unsigned short* dys, const unsigned short* xs,
        const unsigned short* zs, float* red, const float* dt_s, float* __restrict__ xgb,
        ssm_i64 row0, int H, int h, int P, int nr, int warp, int lane) {
    const int g = lane >> 2, t = lane & 3;
    const bool pair = (P & 1) == 0 &&
                      (((unsigned long long)dy | (unsigned long long)X |
                        (unsigned long long)(z ? z : dy) |
                        (unsigned long long)(FUSE == 1 ? (dz ? dz : dy) : dx) |
                        (unsigned long long)(FUSE == 1 ? (dY16 ? dY16 : dy) : dx)) & 3) == 0;
    const bool need_x = FUSE == 2 || z;
    float dd[NT][2];
#pragma unroll
    for (int j = 0; j < NT; ++j) dd[j][0] = dd[j][1] = 0.0f;
    // One row at a time (the loop kept rolled: the body is long, and twice of it cost the
    // instruction cache more than the row's loads cost in latency).
#pragma unroll 1
    for (int half = 0; half < 2; ++half) {
        const int r = 16 * warp + g + 8 * half;
        const bool live = r < nr;
        const ssm_i64 row = row0 + (ssm_i64)(live ? r : 0) * H;
        // 1. Loads: the row's dy, x, z pairs (every one issued before the first is used).
        unsigned w_dy[NT], w_x[NT], w_z[NT];
        float a[NT][2];
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            const int p = 8 * j + 2 * t;
            const bool in = live && p < P, two = p + 1 < P;
            const ssm_i64 i = row * P + p;
            if constexpr (STAGED) {
                w_dy[j] = ssd_mma_pair(dys + r * LDS + p);  // zero past nr and P
                w_x[j] = need_x ? ssd_mma_pair(xs + r * LDS + p) : 0u;
                w_z[j] = z ? ssd_mma_pair(zs + r * LDS + p) : 0u;
            } else {
                w_dy[j] = in ? ssd_mma_get2(dy + i, pair, two) : 0u;
                w_x[j] = in && need_x ? ssd_mma_get2(X + i, pair, two) : 0u;
                w_z[j] = in && z ? ssd_mma_get2(z + i, pair, two) : 0u;
            }
            a[j][0] = half ? acc[j][2] : acc[j][0];  // zero past P
            a[j][1] = half ? acc[j][3] : acc[j][1];
        }
        const float e = e_s[r];
        // 2. The arithmetic of ssd_mma_bwd_rows, and the stores.
        float sum = 0.0f, xdy = 0.0f;
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            const int p = 8 * j + 2 * t;
            if (!live || p >= P) continue;
            const bool two = p + 1 < P;
            const ssm_i64 i = row * P + p;
            float o[2], o_dz[2];
#pragma unroll
            for (int k = 0; k < 2; ++k) {
                const float dyv = ssd_mma_half<T>(w_dy[j], k);
                const float xv = ssd_mma_half<T>(w_x[j], k);
                const float Dv = d_s[p + k];
                float dYv = dyv;
                if (z) {
                    const float zv = ssd_mma_half<T>(w_z[j], k);
                    const float sg = ssm_math<float>::sigmoid(zv);
                    if (FUSE == 1) {
                        const float y_pre = (a[j][k] + e * xv) + Dv * xv;
                        o_dz[k] = dyv * y_pre * sg * (1.0f + zv * (1.0f - sg));
                    }
                    dYv = dyv * zv * sg;
                }
                if (FUSE == 1) {
                    T d16;
                    ssm_store(&d16, dYv);
                    o[k] = dYv;
                    sum += ssm_load(d16) * a[j][k];
                } else {
                    o[k] = (a[j][k] + e * dYv) + Dv * dYv;
                    sum += xv * a[j][k];
                    xdy += xv * dYv;
                    dd[j][k] += dYv * xv;
                }
            }
            if (FUSE == 1 && z) {
                ssd_mma_set2(dY16 + i, pair, two, o);
                ssd_mma_set2(dz + i, pair, two, o_dz);
            } else if (FUSE == 2) {
                ssd_mma_set2(dx + i, pair, two, o);
            }
        }
        // the 4 lanes t of a row hold its columns
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        if (t == 0 && live) dcum[row] = FUSE == 1 ? sum : dc_s[r] - sum;
        if (FUSE == 2 && xgb) {  // uniform: xGB = x_r . (G B)_r, its diagonal term added
            xdy += __shfl_xor_sync(0xffffffffu, xdy, 1);
            xdy += __shfl_xor_sync(0xffffffffu, xdy, 2);
            const float dt = dt_s[r];
            if (t == 0 && live) xgb[row] = dt > 0.0f ? (sum + e * xdy) / dt : 0.0f;
        }
    }
    if (FUSE == 2 && dD_part) {  // uniform: the columns' sums over the 8 lanes g, then the warps
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int k = 0; k < 2; ++k) {
                float v = dd[j][k];
                v += __shfl_xor_sync(0xffffffffu, v, 4);
                v += __shfl_xor_sync(0xffffffffu, v, 8);
                v += __shfl_xor_sync(0xffffffffu, v, 16);
                dd[j][k] = v;
            }
        __syncthreads();  // every warp is past its reads of the tiles red may share
        if (g == 0)
#pragma unroll
            for (int j = 0; j < NT; ++j)
#pragma unroll
                for (int k = 0; k < 2; ++k) red[warp * 8 * NT + 8 * j + 2 * t + k] = dd[j][k];
        __syncthreads();
        for (int p = threadIdx.x; p < P; p += SSD_MMA_THREADS) {
            float v = 0.0f;
#pragma unroll
            for (int w = 0; w < SSD_MMA_THREADS / 32; ++w) v += red[w * 8 * NT + p];
            dD_part[(ssm_i64)h * P + p] = v;
        }
    }
}

// Blocks per SM: 3 for VW <= 64 (at 4, 128 registers, NVRTC 12 spilled: with HSUM, and for
// VW = 32 once M came in 16 bits), 2 for VW = 128.
template <typename T, bool UPPER, int DTW, bool MT, bool HSUM, int VW, int KW, int FUSE>
__global__ void __launch_bounds__(SSD_MMA_THREADS,
                                  VW <= 64 ? 3 : 2)
ssd_mma_chunk_mm(const T* __restrict__ U, const T* __restrict__ W, const T* __restrict__ Vv,
                 const T* __restrict__ Mm, const float* __restrict__ dte,
                 const float* __restrict__ cum, const int* __restrict__ seq,
                 const ssm_i64* __restrict__ starts, float* __restrict__ out,
                 const T* __restrict__ Xd, float* __restrict__ bnd,
                 const T* __restrict__ Xr, float* __restrict__ rowdot, ssm_i64 L, int H,
                 int XU, int XW, int XV, int K, int V, ssm_i64 nc, ssm_i64 m_chunks,
                 int tiles_per_chunk, int with_diag, int XO, int head_splits,
                 ssm_i64 part_stride, int XR, int dt_out, const float* __restrict__ cbm,
                 const T* __restrict__ dy, const T* __restrict__ z, const T* __restrict__ X,
                 const float* __restrict__ D, const float* __restrict__ cbd,
                 T* __restrict__ dY16, T* __restrict__ dz, T* __restrict__ dx,
                 float* __restrict__ dcum, float* __restrict__ dD_part, int classes) {
    static_assert(VW % 16 == 0 && VW <= 128, "VW: a multiple of 16, at most 128");
    static_assert(FUSE == 0 || (!HSUM && !MT && DTW == (FUSE == 1 ? 1 : 2) && UPPER == (FUSE == 2)),
                  "FUSE: 1 with the ycore instance, 2 with the GB instance");
    static_assert(KW % 64 == 0, "KW: a multiple of 64");
    static_assert(DTW >= 0 && DTW <= 2, "DTW: 0, 1 or 2");
    constexpr int NT = VW / 8;  // D tiles of 16 x 8 per warp
    constexpr int LDK = KW + 8, LDV = VW + 8;
    constexpr int MS_ROWS = VW > SSD_MMA_ROWS ? VW : SSD_MMA_ROWS;
    // MT: M's slice staged as it lies, [k][v] (KW rows of VW + 8)
    constexpr int LDM = VW + 8, MS = MS_ROWS * LDK > KW * LDM ? MS_ROWS * LDK : KW * LDM;
    alignas(16) __shared__ unsigned short us[SSD_MMA_ROWS * LDK];  // U[r][k]
    alignas(16) __shared__ unsigned short ms[MS];                  // M[v][k] (MT: [k][v]) | W[q][k]
    alignas(16) __shared__ unsigned short vt[SSD_MMA_ROWS * LDV];  // Vv[q][v]
    // cum_r, cum_q (and cum_E): the chunk sums times log2(e), one exp2 per decay
    __shared__ float cum_r[SSD_MMA_ROWS], cum_q[SSD_MMA_ROWS], dt_q[SSD_MMA_ROWS];
    __shared__ float dt_r[SSD_MMA_ROWS];
    __shared__ int seq_r[SSD_MMA_ROWS], seq_q[SSD_MMA_ROWS];
    __shared__ float col_w[SSD_MMA_ROWS], row_f[SSD_MMA_ROWS];  // a whole tile's factors (below)
    // FUSE: the rows' e_r = dt'_r (C_r . B_r), D (zero past V) and GB's first half of dcum
    __shared__ float e_s[FUSE ? SSD_MMA_ROWS : 1], d_s[FUSE ? VW : 1];
    __shared__ float dc_s[FUSE == 2 ? SSD_MMA_ROWS : 1];

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, t = lane & 3;
    // in 32-bit divisions: every quotient of blockIdx.x fits (64-bit ones cost some 70
    // instructions each)
    const unsigned per_set = (unsigned)nc * (unsigned)tiles_per_chunk;
    const unsigned set = blockIdx.x / per_set;  // = (b * XO + o) * head_splits + hs
    const unsigned ctile = blockIdx.x - set * per_set;
    const unsigned cu = ctile / (unsigned)tiles_per_chunk;
    const ssm_i64 c = cu;
    const int tile = (int)(ctile - cu * (unsigned)tiles_per_chunk);
    const int hs = HSUM ? (int)(set % (unsigned)head_splits) : 0;
    const unsigned bo = HSUM ? set / (unsigned)head_splits : set;
    const unsigned bu = bo / (unsigned)XO;
    const ssm_i64 b = bu;
    const int o = (int)(bo - bu * (unsigned)XO);
    const ssm_i64 t0 = starts[c], t1 = starts[c + 1];
    const ssm_i64 r0 = t0 + (ssm_i64)tile * SSD_MMA_ROWS;
    if (r0 >= t1) return;
    const int nr = (int)(t1 - r0 < SSD_MMA_ROWS ? t1 - r0 : SSD_MMA_ROWS);
    // The heads this block sums (HSUM): run hs of output group o's H / XO heads; else
    // the one head o (XO = H, head_splits = 1).
    int h_begin = o, h_end = o + 1;
    if (HSUM) {
        const int h_per_o = H / XO, h_per_split = (h_per_o + head_splits - 1) / head_splits;
        h_begin = o * h_per_o + hs * h_per_split;
        h_end = h_begin + h_per_split < (o + 1) * h_per_o ? h_begin + h_per_split
                                                          : (o + 1) * h_per_o;
    }
    const ssm_i64 E = t1 - 1;
    const int seq_bound = UPPER ? ssd_mma_seq(seq, b * L + E)
                                : ssd_mma_seq(seq, b * L + (t0 > 0 ? t0 - 1 : 0));
    const bool vec = ssd_mma_vec(K, V, U, W, Vv, Mm);
    const bool u_resident = K <= KW;  // one slice: us is staged once, in step 1
    // U W^T read from ssd_mma_cb's blocks (cbm): only the C B^T products (ycore and GB, the
    // instances without MT), so that dB and dC carry no code for it.
    // FUSE: always (the host passes the blocks), which leaves us and ms free in step 2.
    const bool use_cb = FUSE != 0 || (!MT && cbm);
    // FUSE with VW <= 64: the epilogue's rows of dy, x, z are copied into us (dy) and ms
    // (x, then z) with step 2's first tile; at VW = 128 they do not fit and are read from
    // global memory in the epilogue.
    constexpr bool STAGED = FUSE != 0 && VW <= 64;
    static_assert(!STAGED || (SSD_MMA_ROWS * LDV <= SSD_MMA_ROWS * LDK &&
                              2 * SSD_MMA_ROWS * LDV <= MS), "the staged rows fit us and ms");
    const int off = with_diag ? 0 : 1;  // 1: q = r is left out of the block
    float* const part = HSUM ? out + hs * part_stride : out;

    // One head's products, stored (the first head of a run) or added. Called once without
    // HSUM: a loop around the body there would cost ptxas registers (spills at 128).
    auto head = [&](const int h) {
        const int hu = ssd_mma_group(h, H, XU), hw = ssd_mma_group(h, H, XW),
                  hv = ssd_mma_group(h, H, XV);
        const float cum_E = cum[(b * L + E) * H + h] * ssm_math<float>::kLog2e;
        // The rows' chunk sums, dt' and labels (FUSE: e_r, D, dcum too), into the row
        // arrays: called with step 1's first copies in flight (behind its first barrier,
        // which ends the previous head's reads of them).
        auto load_rows = [&] {
            if (tid < SSD_MMA_ROWS) {
                const ssm_i64 r = r0 + (tid < nr ? tid : nr - 1);
                cum_r[tid] = cum[(b * L + r) * H + h] * ssm_math<float>::kLog2e;
                dt_r[tid] = DTW == 2 ? dte[(b * L + r) * H + h] : 1.0f;
                seq_r[tid] = ssd_mma_seq(seq, b * L + r);
                if constexpr (FUSE != 0) {
                    e_s[tid] = dte[(b * L + r) * H + h] * cbd[(b * L + r) * H + h];
                    if constexpr (FUSE == 2) dc_s[tid] = dcum[(b * L + r) * H + h];
                }
            }
            if constexpr (FUSE != 0) {
                for (int v = tid; v < VW; v += SSD_MMA_THREADS)
                    d_s[v] = D && v < V ? D[(ssm_i64)h * V + v] : 0.0f;
            }
        };

        float acc[NT][4];
        ssm_mma_zero(acc);

        // Stage U[r0 .. r0 + 63][k0 .. k0 + KW - 1] into us (zero outside).
        auto stage_u = [&](int k0) {
            ssd_mma_stage_async<T, SSD_MMA_ROWS, KW, LDK, false>(
                us, U + ((b * L + r0) * XU + hu) * K + k0, (ssm_i64)XU * K, nr, K - k0, vec, tid);
        };

        // 1. The boundary term.
        const T* M = Mm + ((b * m_chunks + c) * H + h) * ((ssm_i64)K * V);
        for (int k0 = 0; k0 < K; k0 += KW) {
            __syncthreads();
            stage_u(k0);
            if (MT)
                ssd_mma_stage_async<T, KW, VW, LDM, false>(ms, M + (ssm_i64)k0 * V, V, K - k0, V,
                                                           vec, tid);
            else
                ssd_mma_stage_async<T, VW, KW, LDK, false>(ms, M + k0, K, V, K - k0, vec, tid);
            if (DTW == 2 && bnd && k0 == 0)  // the rows of Xd for bnd, into vt (free until step 2)
                ssd_mma_stage_async<T, SSD_MMA_ROWS, VW, LDV, false>(
                    vt, Xd + ((b * L + r0) * H + h) * V, (ssm_i64)H * V, nr, V,
                    vec && ((unsigned long long)Xd & 15) == 0, tid);
            if (k0 == 0) load_rows();
            ssd_mma_cp_land();
            __syncthreads();
            ssd_mma_slice<T, NT, KW, LDK, !HSUM, MT, LDM>(acc, us, ms, k0, K, warp, lane);
        }
        {
            const int ra = 16 * warp + g, rb = ra + 8;
            const float sa = seq_r[ra] != seq_bound ? 0.0f
                             : ssm_math<float>::decay(UPPER ? cum_E - cum_r[ra] : cum_r[ra]) * dt_r[ra];
            const float sb = seq_r[rb] != seq_bound ? 0.0f
                             : ssm_math<float>::decay(UPPER ? cum_E - cum_r[rb] : cum_r[rb]) * dt_r[rb];
#pragma unroll
            for (int j = 0; j < NT; ++j) {
                acc[j][0] *= sa;
                acc[j][1] *= sa;
                acc[j][2] *= sb;
                acc[j][3] *= sb;
            }
            if (DTW == 2 && bnd) {  // uniform: bnd[r] = row r's boundary term dotted with Xd_r
                // (Xd's rows staged in vt: zeros past nr and V)
                float da = 0.0f, db = 0.0f;
#pragma unroll
                for (int j = 0; j < NT; ++j)
#pragma unroll
                    for (int i = 0; i < 2; ++i) {
                        const int v = 8 * j + 2 * t + i;
                        T xa, xb;
                        xa.bits = vt[ra * LDV + v];
                        xb.bits = vt[rb * LDV + v];
                        da += acc[j][i] * ssm_load(xa);
                        db += acc[j][2 + i] * ssm_load(xb);
                    }
                // the 4 lanes t of a row hold its columns: sum them
                da += __shfl_xor_sync(0xffffffffu, da, 1);
                da += __shfl_xor_sync(0xffffffffu, da, 2);
                db += __shfl_xor_sync(0xffffffffu, db, 1);
                db += __shfl_xor_sync(0xffffffffu, db, 2);
                if (t == 0) {
                    if (ra < nr) bnd[(b * L + r0 + ra) * H + h] = da;
                    if (rb < nr) bnd[(b * L + r0 + rb) * H + h] = db;
                }
            }
        }

        // 2. The diagonal block, one tile of 64 steps q at a time over the rows' reach.
        const ssm_i64 q_begin = UPPER ? r0 : t0;
        const ssm_i64 q_end = UPPER ? t1 : r0 + nr;
        for (ssm_i64 q0 = q_begin; q0 < q_end; q0 += SSD_MMA_ROWS) {
            const int nq = (int)(q_end - q0 < SSD_MMA_ROWS ? q_end - q0 : SSD_MMA_ROWS);
            float gacc[8][4];
            if (use_cb) {  // uniform: U W^T = C B^T from ssd_mma_cb (UPPER: its transpose)
                const int qt = (int)((q0 - t0) / SSD_MMA_ROWS);
                const int cb_pairs = tiles_per_chunk * (tiles_per_chunk + 1) / 2;
                const ssm_i64 blk =
                    ((b * nc + c) * classes + ssd_mma_group(h, H, classes)) * cb_pairs +
                    (UPPER ? qt * (qt + 1) / 2 + tile : tile * (tile + 1) / 2 + qt);
                ssd_mma_cb_load(gacc, cbm, blk, warp, lane);
            } else {
                ssm_mma_zero(gacc);
            }
            // A whole tile of steps wholly on the far side of the rows (both tiles full),
            // without restarts, has every entry live, and its weights factor through the
            // chunk sum at the later tile's first step (ref): exp2(cum_r - cum_q) is
            // exp2(cum_r - ref) exp2(ref - cum_q) (lower), both exponents <= 0 when the sums
            // do not increase; a tile where one exceeds 64 takes the entrywise weights. The
            // factors, dt' and their products are the same floats in the lower instance and
            // its transposed upper one (entry (t, s) of the one is entry (s, t) of the other).
            const bool whole = !seq && (UPPER ? q0 >= r0 + SSD_MMA_ROWS && nq == SSD_MMA_ROWS
                                              : q0 + SSD_MMA_ROWS <= r0 && nr == SSD_MMA_ROWS);
            bool far = false;
            int far_any = 0;
            for (int k0 = 0; k0 < (use_cb ? 1 : K); k0 += KW) {
                __syncthreads();  // the previous reads of ms (and of vt, cum_q, ...) are done
                if (k0 == 0) {
                    ssd_mma_stage_async<T, SSD_MMA_ROWS, VW, LDV, false>(
                        vt, Vv + ((b * L + q0) * XV + hv) * V, (ssm_i64)XV * V, nq, V, vec, tid);
                    if constexpr (STAGED) {
                        if (q0 == q_begin) {  // the epilogue's rows, in flight with this tile
                            const ssm_i64 at = ((b * L + r0) * H + h) * V;
                            auto rows_in = [&](unsigned short* dst, const T* src) {
                                ssd_mma_stage_async<T, SSD_MMA_ROWS, VW, LDV, false>(
                                    dst, src + at, (ssm_i64)H * V, nr, V,
                                    vec && ((unsigned long long)src & 15) == 0, tid);
                            };
                            rows_in(us, dy);
                            if (FUSE == 2 || z) rows_in(ms, X);
                            if (z) rows_in(ms + SSD_MMA_ROWS * LDV, z);
                        }
                    }
                    // the steps' chunk sums and weights, with the copies in flight
                    if (tid < SSD_MMA_ROWS) {
                        const ssm_i64 q = q0 + (tid < nq ? tid : nq - 1);
                        const ssm_i64 i = (b * L + q) * H + h;
                        const float cq = cum[i] * ssm_math<float>::kLog2e;
                        const float dq_t = DTW == 1 ? dte[i] : 1.0f;
                        cum_q[tid] = cq;
                        dt_q[tid] = dq_t;
                        seq_q[tid] = ssd_mma_seq(seq, b * L + q);
                        if (whole) {
                            const float ref =
                                UPPER ? cum[(b * L + q0) * H + h] * ssm_math<float>::kLog2e
                                      : cum_r[0];
                            const float ec = UPPER ? cq - ref : ref - cq;
                            const float er = UPPER ? ref - cum_r[tid] : cum_r[tid] - ref;
                            col_w[tid] = ssm_math<float>::decay(ec) * dq_t;
                            row_f[tid] = ssm_math<float>::decay(er) * (DTW == 2 ? dt_r[tid] : 1.0f);
                            far = ec > 64.0f || er > 64.0f;
                        }
                    }
                }
                if (!use_cb) {
                    if (!u_resident) stage_u(k0);
                    ssd_mma_stage_async<T, SSD_MMA_ROWS, KW, LDK, false>(
                        ms, W + ((b * L + q0) * XW + hw) * K + k0, (ssm_i64)XW * K, nq, K - k0,
                        vec, tid);
                }
                ssd_mma_cp_land();
                far_any = __syncthreads_or(far);
                if (!use_cb) ssd_mma_slice<T, 8, KW, LDK, !HSUM>(gacc, us, ms, k0, K, warp, lane);
            }
            // Mask and weight: entry (r, s) of this warp lives in gacc[s / 8][...]. A full
            // tile of steps wholly on the far side of the rows, without restarts, has every
            // entry live. Rows past nr are not stored, and steps past nq hold zeros in gacc
            // (their staged rows and C B^T entries are zero; their decays, from clamped chunk
            // sums, finite): neither needs a test.
            const int ra = 16 * warp + g, rb = ra + 8;
            const int dq = (int)(q0 - r0);  // a multiple of 64
            unsigned afr[4][4];  // the masked block as A fragments, K = s in steps of 16
            if (whole && !far_any) {  // uniform
                ssd_mma_weighed(gacc, row_f[ra], row_f[rb], col_w, t,
                                [&](int j, float v0, float v1, float v2, float v3) {
                                    afr[j >> 1][(j & 1) * 2 + 0] = ssd_mma_pack<T>(v0, v1);
                                    afr[j >> 1][(j & 1) * 2 + 1] = ssd_mma_pack<T>(v2, v3);
                                });
            } else {
#pragma unroll
                for (int j = 0; j < 8; ++j) {
                    float v[4];
#pragma unroll
                    for (int i = 0; i < 4; ++i) {
                        const int s = 8 * j + 2 * t + (i & 1);
                        const int r = i >= 2 ? rb : ra;
                        // The same operations, in the same order, as the transposed instance's.
                        const float w =
                            ssm_math<float>::decay(UPPER ? cum_q[s] - cum_r[r] : cum_r[r] - cum_q[s]) *
                            (DTW == 2 ? dt_r[r] : dt_q[s]);
                        const bool live = (UPPER ? s + dq >= r + off : s + dq + off <= r) &&
                                          (!seq || seq_q[s] == seq_r[r]);
                        v[i] = live ? w * gacc[j][i] : 0.0f;
                    }
                    afr[j >> 1][(j & 1) * 2 + 0] = ssd_mma_pack<T>(v[0], v[1]);
                    afr[j >> 1][(j & 1) * 2 + 1] = ssd_mma_pack<T>(v[2], v[3]);
                }
            }
            const ssd_mma_saddr v_lane = ssd_mma_lane_a<LDV, !HSUM>(vt, lane);
#pragma unroll
            for (int ks = 0; ks < 4; ++ks) {
                // On the chunk's diagonal tile, warp w's rows see steps < 16 (w + 1) (lower)
                // or >= 16 w (upper) only: the other fragments are zeros.
                if (q0 == r0 && (UPPER ? ks < warp : ks > warp)) continue;
                const unsigned a[4] = {afr[ks][0], afr[ks][1], afr[ks][2], afr[ks][3]};
#pragma unroll
                for (int j = 0; j < NT; j += 2) {
                    unsigned bf[4];
                    ssd_mma_load_bt2<LDV>(bf, v_lane, 8 * j, 16 * ks);
                    ssd_mma_run2<T>(acc[j], acc[j + 1], a, bf);
                }
            }
        }

        // 3. Row dots, dt' scaling, store (the first head of the set) or add (the next ones):
        // each thread adds to the entries it stored itself, in head order (deterministic).
        // FUSE: the rows' element-wise work instead, nothing stored to out.
        if constexpr (FUSE != 0) {
            ssd_mma_rows_epilogue<T, FUSE, NT, STAGED, LDV>(
                acc, dy, z, X, e_s, d_s, dc_s, dY16, dz, dx, dcum,
                dD_part ? dD_part + (((ssm_i64)bu * per_set + ctile) * H) * V : nullptr,
                us, ms, ms + SSD_MMA_ROWS * LDV, reinterpret_cast<float*>(vt), dt_r,
                FUSE == 2 ? rowdot : nullptr, (b * L + r0) * H + h, H, h, V, nr, warp, lane);
            return;
        }
        {
            const int ra = 16 * warp + g, rb = ra + 8;
            if (DTW == 0 && rowdot) {  // uniform: rowdot[b, r, h] = sum_v out_r[v] Xr_r[v]
                const int hr = ssd_mma_group(h, H, XR);
                const ssm_i64 xa = ((b * L + r0 + ra) * XR + hr) * V;
                const ssm_i64 xb = ((b * L + r0 + rb) * XR + hr) * V;
                float da = 0.0f, db = 0.0f;
#pragma unroll
                for (int j = 0; j < NT; ++j)
#pragma unroll
                    for (int i = 0; i < 2; ++i) {
                        const int v = 8 * j + 2 * t + i;
                        if (v < V) {
                            if (ra < nr) da += acc[j][i] * ssm_load(Xr[xa + v]);
                            if (rb < nr) db += acc[j][2 + i] * ssm_load(Xr[xb + v]);
                        }
                    }
                da += __shfl_xor_sync(0xffffffffu, da, 1);
                da += __shfl_xor_sync(0xffffffffu, da, 2);
                db += __shfl_xor_sync(0xffffffffu, db, 1);
                db += __shfl_xor_sync(0xffffffffu, db, 2);
                if (t == 0) {
                    if (ra < nr) rowdot[(b * L + r0 + ra) * H + h] = da;
                    if (rb < nr) rowdot[(b * L + r0 + rb) * H + h] = db;
                }
            }
            float sa = 1.0f, sb = 1.0f;
            if (DTW == 0 && dt_out) {
                sa = dte[(b * L + r0 + (ra < nr ? ra : nr - 1)) * H + h];
                sb = dte[(b * L + r0 + (rb < nr ? rb : nr - 1)) * H + h];
            }
            const bool first = h == h_begin;
#pragma unroll
            for (int j = 0; j < NT; ++j)
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const int r = i >= 2 ? rb : ra;
                    const int v = 8 * j + 2 * t + (i & 1);
                    if (r < nr && v < V) {
                        float* dst = part + ((b * L + r0 + r) * XO + o) * V + v;
                        const float val = acc[j][i] * (i >= 2 ? sb : sa);
                        *dst = first ? val : *dst + val;
                    }
                }
        }
    };
    if (HSUM) {
        for (int h = h_begin; h < h_end; ++h) head(h);
    } else {
        head(h_begin);
    }
}

// --------------------------------------------------------------------------------------
// What ssd_mma_chunk_dc and ssd_mma_chunk_db share: a block is 64 rows r0 .. of chunk c and
// a run of output group o's heads [h_begin, h_end) (grid as ssd_mma_chunk_mm with HSUM);
// its products run over K = P in slices of 64 (SSD_MMA_SUM_KW) and V = N <= 128 columns.
// --------------------------------------------------------------------------------------
#define SSD_MMA_SUM_VW 128
#define SSD_MMA_SUM_KW 64
#define SSD_MMA_SUM_LDV (SSD_MMA_SUM_VW + 8)  // row stride of the staged Vv rows
struct ssd_mma_run {
    ssm_i64 b, c, t0, t1, r0;
    int tile, o, hs, nr, h_begin, h_end;
};

// The block's rows and heads; false when the rows lie past the chunk's end.
__device__ __forceinline__ bool ssd_mma_run_at(ssd_mma_run& R, const ssm_i64* starts, int H,
                                               int XO, ssm_i64 nc, int tiles_per_chunk,
                                               int head_splits) {
    // in 32-bit divisions: every quotient of blockIdx.x fits
    const unsigned per_set = (unsigned)nc * (unsigned)tiles_per_chunk;
    const unsigned set = blockIdx.x / per_set;  // = (b * XO + o) * head_splits + hs
    const unsigned ctile = blockIdx.x - set * per_set;
    const unsigned cu = ctile / (unsigned)tiles_per_chunk;
    R.c = cu;
    R.tile = (int)(ctile - cu * (unsigned)tiles_per_chunk);
    R.hs = (int)(set % (unsigned)head_splits);
    const unsigned bo = set / (unsigned)head_splits;
    const unsigned bu = bo / (unsigned)XO;
    R.b = bu;
    R.o = (int)(bo - bu * (unsigned)XO);
    R.t0 = starts[R.c];
    R.t1 = starts[R.c + 1];
    R.r0 = R.t0 + (ssm_i64)R.tile * SSD_MMA_ROWS;
    if (R.r0 >= R.t1) return false;
    R.nr = (int)(R.t1 - R.r0 < SSD_MMA_ROWS ? R.t1 - R.r0 : SSD_MMA_ROWS);
    const int h_per_o = H / XO, h_per_split = (h_per_o + head_splits - 1) / head_splits;
    R.h_begin = R.o * h_per_o + R.hs * h_per_split;
    R.h_end = R.h_begin + h_per_split < (R.o + 1) * h_per_o ? R.h_begin + h_per_split
                                                             : (R.o + 1) * h_per_o;
    return true;
}

// acc += A Bt^T over K = P in slices: A the block's nr rows of a (row stride lda) staged
// into us, Bt staged into bs by stage_b(k0) (its slice k0 ..); before_first() runs with the
// first slice's staging (after the barrier that ends the previous reads), once the copies
// are issued: its global loads then wait alongside them, not before them.
// Returns whether any thread's `vote` (which before_first may set) was true.
template <typename T, int NT, bool BT = false, typename StageB, typename First>
__device__ __forceinline__ int ssd_mma_run_product(float (&acc)[NT][4], unsigned short* us,
                                                   const unsigned short* bs, const T* a,
                                                   ssm_i64 lda, int nr, int P, bool vec,
                                                   StageB stage_b, First before_first,
                                                   int tid, int warp, int lane,
                                                   const bool& vote = false) {
    constexpr int KW = SSD_MMA_SUM_KW, LDK = KW + 8;
    int any = 0;
    for (int k0 = 0; k0 < P; k0 += KW) {
        __syncthreads();  // the previous reads of us, bs and the row arrays are done
        ssd_mma_stage_async<T, SSD_MMA_ROWS, KW, LDK, false>(us, a + k0, lda, nr, P - k0, vec, tid);
        stage_b(k0);
        if (k0 == 0) before_first();
        ssd_mma_cp_land();
        any = __syncthreads_or(vote);
        ssd_mma_slice<T, NT, KW, LDK, false, BT, SSD_MMA_SUM_LDV>(acc, us, bs, k0, P, warp, lane);
    }
    return any;
}

// The loop over the run's heads [h_begin, h_end) of either step, with head h + 1's operands
// in flight while head h computes (P <= SSD_MMA_SUM_KW: one slice). stage(h, ua, wa) issues head h's
// rows into ua and wa (first() adds copies to the first head's group); prep(h) writes the
// head's row arrays, after a barrier that ends the previous head's reads of them, and may
// set `vote`; body(h, ua, wa, any) runs the product and its epilogue on the landed
// operands, `any` whether any thread voted. Buffers 0 (us0, ws0) and 1 (us1, ws1) alternate:
// head h + 1's copies start after head h's vote barrier, behind which head h - 1's reads of
// that buffer lie. Two barriers per head, as ssd_mma_run_product.
// The second buffers: us1 (rows x K), then ws1 (step 2: rows x K) or ms1 (step 1: K x V).
#define SSD_MMA_AHEAD_BYTES ((SSD_MMA_ROWS * (SSD_MMA_SUM_KW + 8) + SSD_MMA_SUM_KW * SSD_MMA_SUM_LDV) * 2)
#define SSD_MMA_DB_B_BYTES (SSD_MMA_ROWS * SSD_MMA_SUM_LDV * 2)  // dB's rows of B
#define SSD_MMA_DC_PRE_BYTES (2 * 5 * SSD_MMA_ROWS * 4)  // dC's fetched row values (pre_v, pre_s)
template <typename Stage, typename First, typename Prep, typename Body>
__device__ __forceinline__ void ssd_mma_heads_ahead(int h_begin, int h_end, unsigned short* us0,
                                                    unsigned short* ws0, unsigned short* us1,
                                                    unsigned short* ws1, Stage stage, First first,
                                                    Prep prep, Body body, const bool& vote) {
    __syncthreads();  // the previous reads of the buffers are done
    first();
    stage(h_begin, us0, ws0);
    ssm_cp_commit();
    for (int h = h_begin; h < h_end; ++h) {
        const bool one = ((h - h_begin) & 1) != 0;
        ssm_cp_wait<0>();  // head h's group: the only one in flight
        __syncthreads();   // everyone's have landed; the previous head's epilogue is done
        prep(h);
        const int any = __syncthreads_or(vote);
        if (h + 1 < h_end) {
            stage(h + 1, one ? us0 : us1, one ? ws0 : ws1);
            ssm_cp_commit();
        }
        body(h, one ? us1 : us0, one ? ws1 : ws0, any);
    }
}

// The factored weights of a whole tile (see ssd_mma_chunk_mm), for thread tid < 64 of a
// head-summing product: col_w[tid] = exp2(ec) dt (column tid), row_f[tid] = exp2(er) (row
// tid), ec and er taken from the chunk sums (times log2 e) of step tid of the column tile
// (cq) and of the row tile (cr) and ref, the chunk sum at the later tile's first step.
// Returns whether either exponent exceeds 64 (the tile then takes entrywise weights).
template <bool UPPER>
__device__ __forceinline__ bool ssd_mma_tile_factors(float* col_w, float* row_f, int tid,
                                                     float cq, float cr, float ref, float dt) {
    const float ec = UPPER ? cq - ref : ref - cq;
    const float er = UPPER ? ref - cr : cr - ref;
    col_w[tid] = ssm_math<float>::decay(ec) * dt;
    row_f[tid] = ssm_math<float>::decay(er);
    return ec > 64.0f || er > 64.0f;
}

// acc += round_T(gsum) Vt, the summed masked block (rows r, K = q) times the tile's Vv rows
// staged as vt[q][v] (row stride SSD_MMA_SUM_LDV). On the chunk's diagonal tile warp w's rows see q < 16 (w + 1) (lower)
// or q >= 16 w (upper) only: the other fragments are zeros.
template <typename T, bool UPPER, int NT>
__device__ __forceinline__ void ssd_mma_run_times_v(float (&acc)[NT][4], const float (&gsum)[8][4],
                                                    const unsigned short* vt, bool diagonal_tile,
                                                    int warp, int lane) {
    unsigned afr[4][4];  // the summed block as A fragments, K = q in steps of 16
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        afr[j >> 1][(j & 1) * 2 + 0] = ssd_mma_pack<T>(gsum[j][0], gsum[j][1]);
        afr[j >> 1][(j & 1) * 2 + 1] = ssd_mma_pack<T>(gsum[j][2], gsum[j][3]);
    }
    const ssd_mma_saddr v_lane = ssd_mma_lane_a<SSD_MMA_SUM_LDV>(vt, lane);
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
        if (diagonal_tile && (UPPER ? ks < warp : ks > warp)) continue;
        const unsigned a[4] = {afr[ks][0], afr[ks][1], afr[ks][2], afr[ks][3]};
#pragma unroll
        for (int j = 0; j < NT; j += 2) {
            unsigned bf[4];
            ssd_mma_load_bt2<SSD_MMA_SUM_LDV>(bf, v_lane, 8 * j, 16 * ks);
            ssd_mma_run2<T>(acc[j], acc[j + 1], a, bf);
        }
    }
}

// f(j, i, q, r) for each entry (j, i) of a warp's 16 x 64 block as mma accumulators
// (lane (g, t)): its column q = 8 j + 2 t + (i & 1) and its row r, ra for i < 2, rb after.
template <typename F>
__device__ __forceinline__ void ssd_mma_each_entry(int t, int ra, int rb, F f) {
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i) f(j, i, 8 * j + 2 * t + (i & 1), i >= 2 ? rb : ra);
}

// This lane's part of rows ra, rb of m (NT D tiles of 16 x 8, columns v = 8 j + 2 t and
// + 1) dotted with the same rows of a staged 16-bit tile (row stride SSD_MMA_SUM_LDV, zero
// past its rows and columns); the 4 lanes t of a row hold its columns.
template <typename T, int NT>
__device__ __forceinline__ void ssd_mma_rows_dot(const float (&m)[NT][4], const unsigned short* rows,
                                                 int ra, int rb, int lane, float& da, float& db) {
    const int t = lane & 3;
    const unsigned short* const pa = rows + ra * SSD_MMA_SUM_LDV + 2 * t;
    const unsigned short* const pb = rows + rb * SSD_MMA_SUM_LDV + 2 * t;
    da = 0.0f;
    db = 0.0f;
#pragma unroll
    for (int j = 0; j < NT; ++j) {
        const unsigned wa = ssd_mma_pair(pa + 8 * j), wb = ssd_mma_pair(pb + 8 * j);
        da += m[j][0] * ssd_mma_half<T>(wa, 0) + m[j][1] * ssd_mma_half<T>(wa, 1);
        db += m[j][2] * ssd_mma_half<T>(wb, 0) + m[j][3] * ssd_mma_half<T>(wb, 1);
    }
}

// A summed 64 x 64 block (rows r, columns q, as mma accumulators: warp w rows 16 w ..) into
// blk, row-major, zero past nr rows and nq columns (entries that multiply nothing there
// but could hold a non-finite weight).
__device__ __forceinline__ void ssd_mma_block_store(float* blk, const float (&gsum)[8][4], int nr,
                                                    int nq, int warp, int lane) {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int i = 0; i < 4; i += 2) {
            const int r = 16 * warp + g + (i >= 2 ? 8 : 0), q = 8 * j + 2 * t;
            const bool live = r < nr;
            *reinterpret_cast<ssd_mma_f2*>(blk + r * SSD_MMA_ROWS + q) =
                ssd_mma_f2{{live && q < nq ? gsum[j][i] : 0.0f,
                            live && q + 1 < nq ? gsum[j][i + 1] : 0.0f}};
        }
}

// The run's partial: acc's rows r < nr, columns v < N into part (batch, L, XO, N).
template <int NT>
__device__ __forceinline__ void ssd_mma_run_store(float* part, const float (&acc)[NT][4],
                                                  const ssd_mma_run& R, ssm_i64 L, int XO, int N,
                                                  int warp, int lane) {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int r = 16 * warp + g + (i >= 2 ? 8 : 0);
            const int v = 8 * j + 2 * t + (i & 1);
            if (r < R.nr && v < N)
                part[((R.b * L + R.r0 + r) * XO + R.o) * (ssm_i64)N + v] = acc[j][i];
        }
}

// --------------------------------------------------------------------------------------
// dC on tensor cores, summed over runs of heads that read one B group: ssd_mma_chunk_mm's
// dC product (U = dY, W = x, Vv = B, M = states, HSUM) for V = N <= 128, K = P <= 128,
//
//   out[r, v] = sum_h ( s_r^h sum_k dY_r^h[k] S_c^h[k][v]
//                     + sum_{q <= r} w_rq^h (dY_r^h . x_q^h) B_q[v] ),
//   s_r^h = [seq_r == seq_prev] exp(cum_r^h),  w_rq^h = [seq_q == seq_r] exp(cum_r^h - cum_q^h) dt'_q^h.
//
// B does not depend on the head, so the run's masked blocks w^h (dY^h x^h^T) are summed in
// float32 first (gsum) and multiplied by B once per tile of steps, rounded to T once: one
// product with B per tile instead of one per head, and B staged once. The boundary term
// goes per head through a second accumulator (acc2), scaled by s_r^h and added.
// A block: 64 rows r of one chunk, all N columns, one run of heads; writes its partial
// (no read-modify-write). Grid and out as ssd_mma_chunk_mm with HSUM (XO = C groups).
// KEEP: gs receives each run's summed blocks, 64 x 64 row-major per (row tile, q-tile)
// pair: gs[((((b * XO + o) * head_splits + run) * nc + c) * pairs + pair) * 4096 + r * 64 + q],
// pair = rt (rt + 1) / 2 + qt as ssd_mma_cb's, for ssd_mma_chunk_db<T, true> (without KEEP
// gs is unused).
// DCUM (with KEEP): dcum[b, r, h] receives each row's first half of the chunk sums'
// cotangent, sum_p dY_r[p] (ycore's row r)[p], from ycore's own rounded block entries
// (C B^T's lower blocks from cbl, classes of heads as ssd_mma_cb's) and the boundary rows
// dotted with C (Cm) (see the heads' loop below).
// Registers (NVRTC 12.9, sm_90): 254, 254 (KEEP), 248 (KEEP and DCUM), no spills. The
// heads' row values fetched with their operands (pre_v, pre_s) freed the registers whose
// spills the stores had caused.
// --------------------------------------------------------------------------------------
template <typename T, bool KEEP, bool DCUM>
__global__ void __launch_bounds__(SSD_MMA_THREADS, 2)
ssd_mma_chunk_dc(const T* __restrict__ dY, const T* __restrict__ X, const T* __restrict__ Bm,
                 const T* __restrict__ states, const float* __restrict__ dte,
                 const float* __restrict__ cum, const int* __restrict__ seq,
                 const ssm_i64* __restrict__ starts, float* __restrict__ out, ssm_i64 L, int H,
                 int P, int GB, int XO, int N, ssm_i64 nc, int tiles_per_chunk, int head_splits,
                 ssm_i64 part_stride, float* __restrict__ gs, const T* __restrict__ Cm,
                 const float* __restrict__ cbl, float* __restrict__ dcum, int classes) {
    constexpr int VW = SSD_MMA_SUM_VW, NT = VW / 8, LDK = SSD_MMA_SUM_KW + 8;
    constexpr int VT = SSD_MMA_ROWS * SSD_MMA_SUM_LDV;  // vt's values
    alignas(16) __shared__ unsigned short us[SSD_MMA_ROWS * LDK];  // dY[r][k]
    // step 1: ms = S[k][v] (the entering state, 16 bits); step 2: ws = x[q][k] and vt = B[q][v]
    alignas(16) __shared__ unsigned short buf[SSD_MMA_SUM_KW * SSD_MMA_SUM_LDV > SSD_MMA_ROWS * LDK + VT
                                                  ? SSD_MMA_SUM_KW * SSD_MMA_SUM_LDV
                                                  : SSD_MMA_ROWS * LDK + VT];
    unsigned short* const ms = buf;
    unsigned short* const ws = buf;
    unsigned short* const vt = buf + SSD_MMA_ROWS * LDK;
    // the chunk sums times log2(e), one exp2 per decay
    __shared__ float cum_r[SSD_MMA_ROWS], cum_q[SSD_MMA_ROWS], dt_q[SSD_MMA_ROWS];
    __shared__ int seq_r[SSD_MMA_ROWS], seq_q[SSD_MMA_ROWS];
    __shared__ float col_w[SSD_MMA_ROWS], row_f[SSD_MMA_ROWS];  // a whole tile's factors

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int t = lane & 3;
    ssd_mma_run R;
    if (!ssd_mma_run_at(R, starts, H, XO, nc, tiles_per_chunk, head_splits)) return;
    const ssm_i64 b = R.b, t0 = R.t0, r0 = R.r0;
    const int nr = R.nr;
    const int gb = ssd_mma_group(R.h_begin, H, GB);  // the same for the whole run (checked by the host)
    const int seq_prev = ssd_mma_seq(seq, b * L + (t0 > 0 ? t0 - 1 : 0));
    const bool vec = ssd_mma_vec(P, N, dY, X, Bm, states);
    // Dynamic shared memory: DCUM, C's rows of the block (cs, for the row dots); then, where
    // the launch gave room, the heads' fetched row values (pre_v, pre_s, below) and step
    // 2's second buffers (ssd_mma_heads_ahead).
    constexpr unsigned CS_BYTES = DCUM ? SSD_MMA_DB_B_BYTES : 0;
    extern __shared__ ssm_v16 ssd_mma_dyn[];
    unsigned short* const cs = reinterpret_cast<unsigned short*>(ssd_mma_dyn);
    float (*const pre_v)[3][SSD_MMA_ROWS] =
        reinterpret_cast<float (*)[3][SSD_MMA_ROWS]>(cs + CS_BYTES / 2);
    int (*const pre_s)[2][SSD_MMA_ROWS] = reinterpret_cast<int (*)[2][SSD_MMA_ROWS]>(pre_v + 2);
    unsigned short* const dyn = cs + (CS_BYTES + SSD_MMA_DC_PRE_BYTES) / 2;
    if (ssm_dynamic_smem_bytes() < CS_BYTES) __trap();
    const bool ahead = P <= SSD_MMA_SUM_KW &&
                       ssm_dynamic_smem_bytes() >=
                           CS_BYTES + SSD_MMA_DC_PRE_BYTES + SSD_MMA_AHEAD_BYTES;
    const int ra = 16 * warp + (lane >> 2), rb = ra + 8;
    // DCUM: the rows' dcum (first half) of head h at dc_a[h], dc_b[h]
    float* const dc_a = DCUM ? dcum + (b * L + r0 + (ra < nr ? ra : nr - 1)) * H : nullptr;
    float* const dc_b = DCUM ? dcum + (b * L + r0 + (rb < nr ? rb : nr - 1)) * H : nullptr;
    // The 4 lanes t of a row hold its columns: their sums, on every lane.
    auto row_sum = [](float v) {
        v += __shfl_xor_sync(0xffffffffu, v, 1);
        v += __shfl_xor_sync(0xffffffffu, v, 2);
        return v;
    };

    // This block's rows r0 .. of head h: the chunk sums and restart labels.
    auto stage_rows = [&](int h) {
        if (tid < SSD_MMA_ROWS) {
            const ssm_i64 r = r0 + (tid < nr ? tid : nr - 1);
            cum_r[tid] = cum[(b * L + r) * H + h] * ssm_math<float>::kLog2e;
            seq_r[tid] = ssd_mma_seq(seq, b * L + r);
        }
    };
    // On the heads-ahead path head h's row and step values come with its operands (4-byte
    // cp.async into half (h - h_begin) & 1), so that no head waits on those loads between
    // its two barriers: pre_v[k][0] the rows' chunk sums, [1] the steps', [2] the steps'
    // dt'; pre_s[k][0], [1] their labels. fetch(h, q0, nq) issues them (q0 < 0: the rows'
    // only), landed_rows(h) turns them into the row arrays as stage_rows does.
    auto fetch = [&](int h, ssm_i64 q0, int nq) {
        if (tid >= SSD_MMA_ROWS) return;
        const int k = (h - R.h_begin) & 1;
        const ssm_i64 r = b * L + r0 + (tid < nr ? tid : nr - 1);
        ssm_cp_async<4>(&pre_v[k][0][tid], cum + r * H + h);
        if (seq) ssm_cp_async<4>(&pre_s[k][0][tid], seq + r);
        if (q0 >= 0) {
            const ssm_i64 q = b * L + q0 + (tid < nq ? tid : nq - 1);
            ssm_cp_async<4>(&pre_v[k][1][tid], cum + q * H + h);
            ssm_cp_async<4>(&pre_v[k][2][tid], dte + q * H + h);
            if (seq) ssm_cp_async<4>(&pre_s[k][1][tid], seq + q);
        }
    };
    auto landed_rows = [&](int h) {
        if (tid < SSD_MMA_ROWS) {
            const int k = (h - R.h_begin) & 1;
            cum_r[tid] = pre_v[k][0][tid] * ssm_math<float>::kLog2e;
            seq_r[tid] = seq ? pre_s[k][0][tid] : 0;
        }
    };

    float acc[NT][4];
    ssm_mma_zero(acc);

    // DCUM: C's rows, landing with the first head's operands
    if (DCUM)
        ssd_mma_stage_async<T, SSD_MMA_ROWS, VW, SSD_MMA_SUM_LDV, false>(
            cs, Cm + ((b * L + r0) * XO + R.o) * N, (ssm_i64)XO * N, nr, N,
            vec && ((unsigned long long)Cm & 15) == 0, tid);

    // 1. The boundary terms, head by head.
    // head h's product scaled into acc (DCUM: its rows dotted with C start dcum)
    auto boundary = [&](int h, const float (&acc2)[NT][4]) {
        const float sa = seq_r[ra] == seq_prev ? ssm_math<float>::decay(cum_r[ra]) : 0.0f;
        const float sb = seq_r[rb] == seq_prev ? ssm_math<float>::decay(cum_r[rb]) : 0.0f;
        if (DCUM) {
            float da, db;
            ssd_mma_rows_dot<T, NT>(acc2, cs, ra, rb, lane, da, db);
            da = row_sum(da);
            db = row_sum(db);
            if (t == 0) {
                if (ra < nr) dc_a[h] = sa * da;
                if (rb < nr) dc_b[h] = sb * db;
            }
        }
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            acc[j][0] += sa * acc2[j][0];
            acc[j][1] += sa * acc2[j][1];
            acc[j][2] += sb * acc2[j][2];
            acc[j][3] += sb * acc2[j][3];
        }
    };
    if (ahead) {
        const bool no_vote = false;
        ssd_mma_heads_ahead(
            R.h_begin, R.h_end, us, ms, dyn, dyn + SSD_MMA_ROWS * LDK,
            [&](int h, unsigned short* ua, unsigned short* ma) {
                ssd_mma_stage_async<T, SSD_MMA_ROWS, SSD_MMA_SUM_KW, LDK, false>(
                    ua, dY + ((b * L + r0) * H + h) * P, (ssm_i64)H * P, nr, P, vec, tid);
                ssd_mma_stage_async<T, SSD_MMA_SUM_KW, VW, SSD_MMA_SUM_LDV, false>(
                    ma, states + ((b * nc + R.c) * H + h) * ((ssm_i64)P * N), N, P, N, vec, tid);
                fetch(h, -1, 0);
            },
            [] {}, [&](int h) { landed_rows(h); },
            [&](int h, const unsigned short* ua, const unsigned short* ma, int) {
                float acc2[NT][4];
                ssm_mma_zero(acc2);
                ssd_mma_slice<T, NT, SSD_MMA_SUM_KW, LDK, false, true, SSD_MMA_SUM_LDV>(
                    acc2, ua, ma, 0, P, warp, lane);
                boundary(h, acc2);
            },
            no_vote);
    } else {
        for (int h = R.h_begin; h < R.h_end; ++h) {
            float acc2[NT][4];
            ssm_mma_zero(acc2);
            const T* S = states + ((b * nc + R.c) * H + h) * ((ssm_i64)P * N);
            ssd_mma_run_product<T, NT, true>(
                acc2, us, ms, dY + ((b * L + r0) * H + h) * P, (ssm_i64)H * P, nr, P, vec,
                [&](int k0) {
                    ssd_mma_stage_async<T, SSD_MMA_SUM_KW, VW, SSD_MMA_SUM_LDV, false>(
                        ms, S + (ssm_i64)k0 * N, N, P - k0, N, vec, tid);
                },
                [&] { stage_rows(h); }, tid, warp, lane);
            boundary(h, acc2);
        }
    }

    // 2. The diagonal block, one tile of 64 steps q at a time: the heads' masked blocks
    // summed in float32, then one product with B.
    const ssm_i64 q_end = r0 + nr;
    for (ssm_i64 q0 = t0; q0 < q_end; q0 += SSD_MMA_ROWS) {
        const int nq = (int)(q_end - q0 < SSD_MMA_ROWS ? q_end - q0 : SSD_MMA_ROWS);
        float gsum[8][4];
        ssm_mma_zero(gsum);
        // a whole tile before the rows without restarts: factored weights (ssd_mma_chunk_mm)
        const bool whole = !seq && q0 + SSD_MMA_ROWS <= r0;
        bool far = false;
        // head h's row arrays (and, for a whole tile, its factors; far: any too large)
        auto prep = [&](int h) {
            far = false;
            stage_rows(h);
            if (tid < SSD_MMA_ROWS) {
                const ssm_i64 q = q0 + (tid < nq ? tid : nq - 1);
                const ssm_i64 i = (b * L + q) * H + h;
                const float cq = cum[i] * ssm_math<float>::kLog2e, dq_t = dte[i];
                cum_q[tid] = cq;
                dt_q[tid] = dq_t;
                seq_q[tid] = ssd_mma_seq(seq, b * L + q);
                if (whole) {
                    const ssm_i64 r = r0 + (tid < nr ? tid : nr - 1);
                    far = ssd_mma_tile_factors<false>(
                        col_w, row_f, tid, cq,
                        cum[(b * L + r) * H + h] * ssm_math<float>::kLog2e,
                        cum[(b * L + r0) * H + h] * ssm_math<float>::kLog2e, dq_t);
                }
            }
        };
        // the same from the values fetched with the head's operands (heads-ahead path)
        auto prep_landed = [&](int h) {
            far = false;
            landed_rows(h);
            if (tid < SSD_MMA_ROWS) {
                const int k = (h - R.h_begin) & 1;
                const float cq = pre_v[k][1][tid] * ssm_math<float>::kLog2e, dq_t = pre_v[k][2][tid];
                cum_q[tid] = cq;
                dt_q[tid] = dq_t;
                seq_q[tid] = seq ? pre_s[k][1][tid] : 0;
                if (whole)
                    far = ssd_mma_tile_factors<false>(
                        col_w, row_f, tid, cq, pre_v[k][0][tid] * ssm_math<float>::kLog2e,
                        pre_v[k][0][0] * ssm_math<float>::kLog2e, dq_t);
            }
        };
        // DCUM: ssd_mma_cb's block of C B^T for these rows and steps (in the warps' fragment
        // order) in shared memory where vt lies (vt holds B only after the heads' loop),
        // copied with the first head's operands
        const float* const bcs = reinterpret_cast<const float*>(vt);
        auto copy_bc = [&] {
            if (!DCUM) return;
            const int qt = (int)((q0 - t0) / SSD_MMA_ROWS);
            const float* const src =
                cbl + (((b * nc + R.c) * classes + ssd_mma_group(R.h_begin, H, classes)) *
                           (tiles_per_chunk * (tiles_per_chunk + 1) / 2) +
                       R.tile * (R.tile + 1) / 2 + qt) * (ssm_i64)(SSD_MMA_ROWS * SSD_MMA_ROWS);
#pragma unroll 1
            for (int k = tid; k < SSD_MMA_ROWS * SSD_MMA_ROWS / 4; k += SSD_MMA_THREADS)
                ssd_mma_cp16(reinterpret_cast<unsigned short*>(const_cast<float*>(bcs) + 4 * k),
                             src + 4 * k, true);
        };
        static_assert(SSD_MMA_ROWS * SSD_MMA_ROWS * 4 <= VT * 2, "vt holds the C B^T block");
        // head h's masked block into gsum; DCUM: its rows' dots with the recomputed output's
        // block, sum_{q < r} round_T(w_rq (C_r . B_q)) (dY_r . x_q), added to dcum. Those
        // entries are ycore's (ssd_mma_chunk_mm, with_diag = 0), the same operations in the
        // same order, so that dcum's pairs of terms cancel as with ycore's rows.
        auto finish = [&](int h, const float (&gacc)[8][4], int any_far) {
            float da = 0.0f, db = 0.0f;
            auto ydot = [&](int j, int i, float w) {  // w: the entry's weight, times C B^T
                T mr;
                mr.bits = ssd_mma_bits<T>(w * bcs[((warp * 8 + j) * 32 + lane) * 4 + i]);
                if (i >= 2) db += ssm_load(mr) * gacc[j][i];
                else da += ssm_load(mr) * gacc[j][i];
            };
            const int dq = (int)(q0 - r0);
            if (whole && !any_far) {  // uniform
                // ssd_mma_weighed's operations; ycore takes them where nr = 64 (else entrywise)
#pragma unroll
                for (int j = 0; j < 8; ++j) {
                    const int s = 8 * j + 2 * t;
                    const float fa = row_f[ra], fb = row_f[rb], w0 = col_w[s], w1 = col_w[s + 1];
                    const float f[4] = {fa * w0, fa * w1, fb * w0, fb * w1};
#pragma unroll
                    for (int i = 0; i < 4; ++i) {
                        gsum[j][i] += f[i] * gacc[j][i];
                        if (DCUM && nr == SSD_MMA_ROWS) ydot(j, i, f[i]);
                    }
                }
            }
            if (!(whole && !any_far) || (DCUM && nr < SSD_MMA_ROWS)) {
                // mask and weight as ssd_mma_chunk_mm's lower products (with the diagonal; rows
                // past nr and steps past nq need no test there either)
                ssd_mma_each_entry(t, ra, rb, [&](int j, int i, int sq, int r) {
                    const bool same = !seq || seq_q[sq] == seq_r[r];
                    const float w = ssm_math<float>::decay(cum_r[r] - cum_q[sq]) * dt_q[sq];
                    if (!(whole && !any_far) && same && sq + dq <= r) gsum[j][i] += w * gacc[j][i];
                    if (DCUM && same && sq + dq < r) ydot(j, i, w);
                });
            }
            if (DCUM) {
                da = row_sum(da);
                db = row_sum(db);
                if (t == 0) {
                    if (ra < nr) dc_a[h] += da;
                    if (rb < nr) dc_b[h] += db;
                }
            }
        };
        if (ahead) {
            ssd_mma_heads_ahead(
                R.h_begin, R.h_end, us, ws, dyn, dyn + SSD_MMA_ROWS * LDK,
                [&](int h, unsigned short* ua, unsigned short* wa) {
                    ssd_mma_stage_async<T, SSD_MMA_ROWS, SSD_MMA_SUM_KW, LDK, false>(
                        ua, dY + ((b * L + r0) * H + h) * P, (ssm_i64)H * P, nr, P, vec, tid);
                    ssd_mma_stage_async<T, SSD_MMA_ROWS, SSD_MMA_SUM_KW, LDK, false>(
                        wa, X + ((b * L + q0) * H + h) * P, (ssm_i64)H * P, nq, P, vec, tid);
                    fetch(h, q0, nq);
                },
                copy_bc, prep_landed,
                [&](int h, const unsigned short* ua, const unsigned short* wa, int any_far) {
                    float gacc[8][4];
                    ssm_mma_zero(gacc);
                    ssd_mma_slice<T, 8, SSD_MMA_SUM_KW, LDK, false, false, SSD_MMA_SUM_LDV>(
                        gacc, ua, wa, 0, P, warp, lane);
                    finish(h, gacc, any_far);
                },
                far);
        } else {
            for (int h = R.h_begin; h < R.h_end; ++h) {
                float gacc[8][4];
                ssm_mma_zero(gacc);
                const int any_far = ssd_mma_run_product<T>(
                    gacc, us, ws, dY + ((b * L + r0) * H + h) * P, (ssm_i64)H * P, nr, P, vec,
                    [&](int k0) {
                        ssd_mma_stage_async<T, SSD_MMA_ROWS, SSD_MMA_SUM_KW, LDK, false>(
                            ws, X + ((b * L + q0) * H + h) * P + k0, (ssm_i64)H * P, nq,
                            P - k0, vec, tid);
                        if (k0 == 0 && h == R.h_begin) copy_bc();
                    },
                    [&] { prep(h); }, tid, warp, lane, far);
                finish(h, gacc, any_far);
            }
        }
        if (KEEP) {  // the run's summed block, for ssd_mma_chunk_db<T, true>
            // blockIdx.x = (set nc + c) T + tile (ssd_mma_run_at), so that the pair's index
            // comes from it alone (no register held through the kernel for it)
            const unsigned tpc = (unsigned)tiles_per_chunk, sc = blockIdx.x / tpc;
            const unsigned tile = blockIdx.x - sc * tpc;
            ssd_mma_block_store(gs + ((ssm_i64)sc * (tpc * (tpc + 1) / 2) + tile * (tile + 1) / 2 +
                                      (unsigned)((q0 - t0) / SSD_MMA_ROWS)) *
                                         (SSD_MMA_ROWS * SSD_MMA_ROWS),
                                gsum, nr, nq, warp, lane);
        }
        __syncthreads();  // the row arrays' last reads (the mask) are behind every warp
        ssd_mma_stage_async<T, SSD_MMA_ROWS, VW, SSD_MMA_SUM_LDV, false>(
            vt, Bm + ((b * L + q0) * GB + gb) * N, (ssm_i64)GB * N, nq, N, vec, tid);
        ssd_mma_cp_land();
        __syncthreads();
        ssd_mma_run_times_v<T, false>(acc, gsum, vt, q0 == r0, warp, lane);
    }

    // 3. Store this run's partial.
    ssd_mma_run_store(out + R.hs * part_stride, acc, R, L, XO, N, warp, lane);
}

// --------------------------------------------------------------------------------------
// dB on tensor cores, summed over runs of heads that read one C group: ssd_mma_chunk_mm's
// dB product (U = x, W = dY, Vv = C, M = dHx^T, HSUM, dt_out, rowdot) for N, P <= 128.
// Per head h, with s_r^h = [seq_r == seq_E] exp(cum_E^h - cum_r^h) and
// w_rq^h = [seq_q == seq_r] exp(cum_q^h - cum_r^h) for q >= r:
//   o^h[r, v] = s_r^h sum_k x_r^h[k] dHx^h[k][v] + sum_{q >= r} w_rq^h (x_r^h . dY_q^h) C_q[v],
//   rowdot[b, r, h] = o^h[r] . B_r,     out[r, v] = sum_h dt'_r^h o^h[r, v].
// As in ssd_mma_chunk_dc, the run's masked blocks (times dt'_r^h) are summed in float32 and
// multiplied by C once per tile of steps. The row dot of the diagonal part is taken without
// C: sum_q round_T(w_rq^h (x_r^h . dY_q^h)) (B_r . C_q), with B_r . C_q from ssd_mma_cb's
// transposed blocks (cbt), in the fragment positions of the masked block; the block's
// threads add it to rowdot (their own rows, in tile order). Grid and out as
// ssd_mma_chunk_mm with HSUM (XO = B groups); the heads of a run read one C group.
// SHARED: the run's summed masked blocks come from ssd_mma_chunk_dc's gs instead (the same
// entries: dB's (r, q) is dC's (q, r), exp(cum_q - cum_r) dt'_r (x_r . dY_q)), launched with
// the same groups (GB = GC) and runs; the heads' blocks are not made here, and rowdot is
// not written (GB's epilogue gives x_s . (G B)_s, see ssd_mma_rows_epilogue).
// --------------------------------------------------------------------------------------
template <typename T, bool SHARED>
__global__ void __launch_bounds__(SSD_MMA_THREADS, 2)
ssd_mma_chunk_db(const T* __restrict__ X, const T* __restrict__ dY, const T* __restrict__ Cm,
                 const T* __restrict__ dHx, const T* __restrict__ Bm,
                 const float* __restrict__ dte, const float* __restrict__ cum,
                 const int* __restrict__ seq, const ssm_i64* __restrict__ starts,
                 const float* __restrict__ cbt, float* __restrict__ out,
                 float* __restrict__ rowdot, ssm_i64 L, int H, int P, int XO, int GC, int N,
                 ssm_i64 nc, int tiles_per_chunk, int head_splits, ssm_i64 part_stride,
                 int classes, const float* __restrict__ gs) {
    constexpr int VW = SSD_MMA_SUM_VW, NT = VW / 8, LDK = SSD_MMA_SUM_KW + 8;
    constexpr int VT = SSD_MMA_ROWS * SSD_MMA_SUM_LDV;  // vt's values
    alignas(16) __shared__ unsigned short us[SSD_MMA_ROWS * LDK];  // x[r][k]
    // step 1: ms = dHx[k][v] (16 bits); step 2: ws = dY[q][k] and vt = C[q][v]
    alignas(16) __shared__ unsigned short buf[SSD_MMA_SUM_KW * SSD_MMA_SUM_LDV > SSD_MMA_ROWS * LDK + VT
                                                  ? SSD_MMA_SUM_KW * SSD_MMA_SUM_LDV
                                                  : SSD_MMA_ROWS * LDK + VT];
    unsigned short* const ms = buf;
    unsigned short* const ws = buf;
    unsigned short* const vt = buf + SSD_MMA_ROWS * LDK;
    // the chunk sums times log2(e), one exp2 per decay
    __shared__ float cum_r[SSD_MMA_ROWS], cum_q[SSD_MMA_ROWS], dt_r[SSD_MMA_ROWS];
    __shared__ int seq_r[SSD_MMA_ROWS], seq_q[SSD_MMA_ROWS];
    __shared__ float col_w[SSD_MMA_ROWS], row_f[SSD_MMA_ROWS];  // a whole tile's factors

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int t = lane & 3;
    ssd_mma_run R;
    if (!ssd_mma_run_at(R, starts, H, XO, nc, tiles_per_chunk, head_splits)) return;
    const ssm_i64 b = R.b, c = R.c, t0 = R.t0, t1 = R.t1, E = t1 - 1, r0 = R.r0;
    const int nr = R.nr, o = R.o;
    const int gc = ssd_mma_group(R.h_begin, H, GC);  // the same for the whole run (checked by the host)
    const int cls = ssd_mma_group(R.h_begin, H, classes);
    const int cb_pairs = tiles_per_chunk * (tiles_per_chunk + 1) / 2;
    const int seq_end = ssd_mma_seq(seq, b * L + E);
    const bool vec = ssd_mma_vec(P, N, X, dY, Cm, dHx);
    // Dynamic shared memory: B's rows of the block (bs, for the row dots; not with SHARED),
    // then step 2's second buffers (ssd_mma_heads_ahead) where the launch gave room for them.
    constexpr unsigned BS_BYTES = SHARED ? 0 : SSD_MMA_DB_B_BYTES;
    extern __shared__ ssm_v16 ssd_mma_dyn[];
    unsigned short* const bs = reinterpret_cast<unsigned short*>(ssd_mma_dyn);
    unsigned short* const dyn = bs + BS_BYTES / 2;
    if (ssm_dynamic_smem_bytes() < BS_BYTES) __trap();
    const bool ahead = P <= SSD_MMA_SUM_KW &&
                       ssm_dynamic_smem_bytes() >= BS_BYTES + SSD_MMA_AHEAD_BYTES;
    const int ra = 16 * warp + (lane >> 2), rb = ra + 8;
    const ssm_i64 row_a = b * L + r0 + (ra < nr ? ra : nr - 1);
    const ssm_i64 row_b = b * L + r0 + (rb < nr ? rb : nr - 1);

    auto stage_rows = [&](int h) {
        if (tid < SSD_MMA_ROWS) {
            const ssm_i64 i = (b * L + r0 + (tid < nr ? tid : nr - 1)) * H + h;
            cum_r[tid] = cum[i] * ssm_math<float>::kLog2e;
            dt_r[tid] = dte[i];
            seq_r[tid] = ssd_mma_seq(seq, b * L + r0 + (tid < nr ? tid : nr - 1));
        }
    };
    // The 4 lanes t of a row hold its columns: their sums, on every lane.
    auto row_sum = [](float v) {
        v += __shfl_xor_sync(0xffffffffu, v, 1);
        v += __shfl_xor_sync(0xffffffffu, v, 2);
        return v;
    };
    // B_r . (a row of this thread's columns v) for rows ra, rb: the row dots with B (B of
    // the run's group o, staged in bs once for all the run's heads; zero past N and nr).
    auto dot_b = [&](const float (&m)[NT][4], float& da, float& db) {
        da = 0.0f;
        db = 0.0f;
        const unsigned short* const pa = bs + ra * SSD_MMA_SUM_LDV + 2 * t;
        const unsigned short* const pb = bs + rb * SSD_MMA_SUM_LDV + 2 * t;
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            const unsigned wa = ssd_mma_pair(pa + 8 * j), wb = ssd_mma_pair(pb + 8 * j);
            T a0, a1, b0, b1;
            a0.bits = (unsigned short)(wa & 0xffffu);
            a1.bits = (unsigned short)(wa >> 16);
            b0.bits = (unsigned short)(wb & 0xffffu);
            b1.bits = (unsigned short)(wb >> 16);
            da += m[j][0] * ssm_load(a0) + m[j][1] * ssm_load(a1);
            db += m[j][2] * ssm_load(b0) + m[j][3] * ssm_load(b1);
        }
    };
    float* const rd_a = SHARED ? nullptr : rowdot + row_a * H;  // + h
    float* const rd_b = SHARED ? nullptr : rowdot + row_b * H;

    float acc[NT][4];
    ssm_mma_zero(acc);

    // B's rows, landing with the first head's operands
    if (!SHARED)
        ssd_mma_stage_async<T, SSD_MMA_ROWS, VW, SSD_MMA_SUM_LDV, false>(
            bs, Bm + ((b * L + r0) * XO + o) * N, (ssm_i64)XO * N, nr, N,
            vec && ((unsigned long long)Bm & 15) == 0, tid);

    // 1. The boundary terms, head by head: their row dots with B start rowdot.
    // head h's product scaled, its row dots, and its share of acc
    auto boundary = [&](int h, float (&acc2)[NT][4]) {
        const float cum_E = cum[(b * L + E) * H + h] * ssm_math<float>::kLog2e;
        const float sa = seq_r[ra] == seq_end ? ssm_math<float>::decay(cum_E - cum_r[ra]) : 0.0f;
        const float sb = seq_r[rb] == seq_end ? ssm_math<float>::decay(cum_E - cum_r[rb]) : 0.0f;
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            acc2[j][0] *= sa;
            acc2[j][1] *= sa;
            acc2[j][2] *= sb;
            acc2[j][3] *= sb;
        }
        if (!SHARED) {
            float da, db;
            dot_b(acc2, da, db);
            da = row_sum(da);
            db = row_sum(db);
            if (t == 0) {
                if (ra < nr) rd_a[h] = da;
                if (rb < nr) rd_b[h] = db;
            }
        }
        const float ta = dt_r[ra], tb = dt_r[rb];
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            acc[j][0] += ta * acc2[j][0];
            acc[j][1] += ta * acc2[j][1];
            acc[j][2] += tb * acc2[j][2];
            acc[j][3] += tb * acc2[j][3];
        }
    };
    if (ahead) {
        const bool no_vote = false;
        ssd_mma_heads_ahead(
            R.h_begin, R.h_end, us, ms, dyn, dyn + SSD_MMA_ROWS * LDK,
            [&](int h, unsigned short* ua, unsigned short* ma) {
                ssd_mma_stage_async<T, SSD_MMA_ROWS, SSD_MMA_SUM_KW, LDK, false>(
                    ua, X + ((b * L + r0) * H + h) * P, (ssm_i64)H * P, nr, P, vec, tid);
                ssd_mma_stage_async<T, SSD_MMA_SUM_KW, VW, SSD_MMA_SUM_LDV, false>(
                    ma, dHx + ((b * nc + c) * H + h) * ((ssm_i64)P * N), N, P, N, vec, tid);
            },
            [] {}, [&](int h) { stage_rows(h); },
            [&](int h, const unsigned short* ua, const unsigned short* ma, int) {
                float acc2[NT][4];
                ssm_mma_zero(acc2);
                ssd_mma_slice<T, NT, SSD_MMA_SUM_KW, LDK, false, true, SSD_MMA_SUM_LDV>(
                    acc2, ua, ma, 0, P, warp, lane);
                boundary(h, acc2);
            },
            no_vote);
    } else {
        for (int h = R.h_begin; h < R.h_end; ++h) {
            float acc2[NT][4];
            ssm_mma_zero(acc2);
            const T* M = dHx + ((b * nc + c) * H + h) * ((ssm_i64)P * N);
            ssd_mma_run_product<T, NT, true>(
                acc2, us, ms, X + ((b * L + r0) * H + h) * P, (ssm_i64)H * P, nr, P, vec,
                [&](int k0) {
                    ssd_mma_stage_async<T, SSD_MMA_SUM_KW, VW, SSD_MMA_SUM_LDV, false>(
                        ms, M + (ssm_i64)k0 * N, N, P - k0, N, vec, tid);
                },
                [&] { stage_rows(h); }, tid, warp, lane);
            boundary(h, acc2);
        }
    }

    // 2. The diagonal block, one tile of 64 steps q >= r at a time: the heads' masked blocks
    // (times dt'_r) summed in float32, then one product with C.
    for (ssm_i64 q0 = r0; q0 < t1; q0 += SSD_MMA_ROWS) {
        const int nq = (int)(t1 - q0 < SSD_MMA_ROWS ? t1 - q0 : SSD_MMA_ROWS);
        const int qt = (int)((q0 - t0) / SSD_MMA_ROWS);
        if constexpr (SHARED) {
            // The run's summed block from ssd_mma_chunk_dc (rows q, columns r there), read
            // transposed, loads issued before the barrier; then one product with C.
            const float* const blk =
                gs + ((((b * XO + o) * head_splits + R.hs) * nc + c) * cb_pairs +
                      qt * (qt + 1) / 2 + R.tile) * (ssm_i64)(SSD_MMA_ROWS * SSD_MMA_ROWS);
            float gsum[8][4];
#pragma unroll
            for (int j = 0; j < 8; ++j)
#pragma unroll
                for (int i = 0; i < 4; ++i)
                    gsum[j][i] = blk[(8 * j + 2 * t + (i & 1)) * SSD_MMA_ROWS + (i >= 2 ? rb : ra)];
            __syncthreads();  // the previous tile's reads of vt are done
            ssd_mma_stage_async<T, SSD_MMA_ROWS, VW, SSD_MMA_SUM_LDV, false>(
                vt, Cm + ((b * L + q0) * GC + gc) * N, (ssm_i64)GC * N, nq, N, vec, tid);
            ssd_mma_cp_land();
            __syncthreads();
            ssd_mma_run_times_v<T, true>(acc, gsum, vt, q0 == r0, warp, lane);
            continue;
        }
        // B_r . C_q (ssd_mma_cb's transposed block, in the warps' fragment order) in shared
        // memory, where vt lies: vt holds C only after the heads' loop. Copied with the first
        // head's operands.
        const float* const bcs = reinterpret_cast<const float*>(vt);
        const float* const bc_src =
            cbt + (((b * nc + c) * classes + cls) * cb_pairs + qt * (qt + 1) / 2 + R.tile) *
                      (ssm_i64)(SSD_MMA_ROWS * SSD_MMA_ROWS);
        static_assert(SSD_MMA_ROWS * SSD_MMA_ROWS * 4 <= VT * 2, "vt holds the B C^T block");
        float gsum[8][4];
        ssm_mma_zero(gsum);
        // a whole tile after the rows without restarts: factored weights (ssd_mma_chunk_mm)
        const bool whole = !seq && q0 >= r0 + SSD_MMA_ROWS && nq == SSD_MMA_ROWS;
        bool far = false;
        // B_r . C_q's block into bcs, with the first head's operands
        auto copy_bc = [&] {
#pragma unroll 1
            for (int k = tid; k < SSD_MMA_ROWS * SSD_MMA_ROWS / 4; k += SSD_MMA_THREADS)
                ssd_mma_cp16(reinterpret_cast<unsigned short*>(const_cast<float*>(bcs) + 4 * k),
                             bc_src + 4 * k, true);
        };
        // head h's row arrays (and, for a whole tile, its factors; far: any too large)
        auto prep = [&](int h) {
            far = false;
            stage_rows(h);
            if (tid < SSD_MMA_ROWS) {
                const ssm_i64 q = q0 + (tid < nq ? tid : nq - 1);
                const float cq = cum[(b * L + q) * H + h] * ssm_math<float>::kLog2e;
                cum_q[tid] = cq;
                seq_q[tid] = ssd_mma_seq(seq, b * L + q);
                if (whole)
                    far = ssd_mma_tile_factors<true>(
                        col_w, row_f, tid, cq,
                        cum[(b * L + r0 + tid) * H + h] * ssm_math<float>::kLog2e,
                        cum[(b * L + q0) * H + h] * ssm_math<float>::kLog2e, 1.0f);
            }
        };
        // head h's masked block into gsum and its row dots into rowdot (rd_prev: the row
        // dots so far, read before the product so that their latency hides behind it)
        auto finish = [&](int h, const float (&gacc)[8][4], int any_far, float rd_prev_a,
                          float rd_prev_b) {
            // mask and weight as ssd_mma_chunk_mm's upper products (with the diagonal); the
            // row dot of the rounded entries with B_r . C_q
            // (rows past nr and steps past nq need no test: as in ssd_mma_chunk_mm)
            float da = 0.0f, db = 0.0f;
            const float ta = dt_r[ra], tb = dt_r[rb];
            // entry (j, i) of the block: its rounding into the row dot, t' m into gsum
            auto add = [&](int j, int i, float m) {
                T mr;
                mr.bits = ssd_mma_bits<T>(m);  // as the per-head product rounded it
                const float bcv = bcs[((warp * 8 + j) * 32 + lane) * 4 + i];
                if (i >= 2) db += ssm_load(mr) * bcv;
                else da += ssm_load(mr) * bcv;
                gsum[j][i] += (i >= 2 ? tb : ta) * m;
            };
            if (whole && !any_far) {  // uniform
                ssd_mma_weighed(gacc, row_f[ra], row_f[rb], col_w, t,
                                [&](int j, float v0, float v1, float v2, float v3) {
                                    add(j, 0, v0);
                                    add(j, 1, v1);
                                    add(j, 2, v2);
                                    add(j, 3, v3);
                                });
            } else {
                const int dq = (int)(q0 - r0);
                ssd_mma_each_entry(t, ra, rb, [&](int j, int i, int sq, int r) {
                    const bool live = sq + dq >= r && (!seq || seq_q[sq] == seq_r[r]);
                    if (live) add(j, i, ssm_math<float>::decay(cum_q[sq] - cum_r[r]) * gacc[j][i]);
                });
            }
            da = row_sum(da);
            db = row_sum(db);
            if (t == 0) {
                if (ra < nr) rd_a[h] = rd_prev_a + da;
                if (rb < nr) rd_b[h] = rd_prev_b + db;
            }
        };
        if (ahead) {
            ssd_mma_heads_ahead(
                R.h_begin, R.h_end, us, ws, dyn, dyn + SSD_MMA_ROWS * LDK,
                [&](int h, unsigned short* ua, unsigned short* wa) {
                    ssd_mma_stage_async<T, SSD_MMA_ROWS, SSD_MMA_SUM_KW, LDK, false>(
                        ua, X + ((b * L + r0) * H + h) * P, (ssm_i64)H * P, nr, P, vec, tid);
                    ssd_mma_stage_async<T, SSD_MMA_ROWS, SSD_MMA_SUM_KW, LDK, false>(
                        wa, dY + ((b * L + q0) * H + h) * P, (ssm_i64)H * P, nq, P, vec, tid);
                },
                copy_bc, prep,
                [&](int h, const unsigned short* ua, const unsigned short* wa, int any_far) {
                    const float rd_prev_a = t == 0 && ra < nr ? rd_a[h] : 0.0f;
                    const float rd_prev_b = t == 0 && rb < nr ? rd_b[h] : 0.0f;
                    float gacc[8][4];
                    ssm_mma_zero(gacc);
                    ssd_mma_slice<T, 8, SSD_MMA_SUM_KW, LDK, false, false, SSD_MMA_SUM_LDV>(
                        gacc, ua, wa, 0, P, warp, lane);
                    finish(h, gacc, any_far, rd_prev_a, rd_prev_b);
                },
                far);
        } else {
            for (int h = R.h_begin; h < R.h_end; ++h) {
                float gacc[8][4];
                ssm_mma_zero(gacc);
                const float rd_prev_a = t == 0 && ra < nr ? rd_a[h] : 0.0f;
                const float rd_prev_b = t == 0 && rb < nr ? rd_b[h] : 0.0f;
                const int any_far = ssd_mma_run_product<T>(
                    gacc, us, ws, X + ((b * L + r0) * H + h) * P, (ssm_i64)H * P, nr, P, vec,
                    [&](int k0) {
                        ssd_mma_stage_async<T, SSD_MMA_ROWS, SSD_MMA_SUM_KW, LDK, false>(
                            ws, dY + ((b * L + q0) * H + h) * P + k0, (ssm_i64)H * P, nq,
                            P - k0, vec, tid);
                        if (k0 == 0 && h == R.h_begin) copy_bc();
                    },
                    [&] { prep(h); }, tid, warp, lane, far);
                finish(h, gacc, any_far, rd_prev_a, rd_prev_b);
            }
        }
        __syncthreads();  // the row arrays' last reads (the mask) are behind every warp
        ssd_mma_stage_async<T, SSD_MMA_ROWS, VW, SSD_MMA_SUM_LDV, false>(
            vt, Cm + ((b * L + q0) * GC + gc) * N, (ssm_i64)GC * N, nq, N, vec, tid);
        ssd_mma_cp_land();
        __syncthreads();
        ssd_mma_run_times_v<T, true>(acc, gsum, vt, q0 == r0, warp, lane);
    }

    // 3. Store this run's partial.
    ssd_mma_run_store(out + R.hs * part_stride, acc, R, L, XO, N, warp, lane);
}

// --------------------------------------------------------------------------------------
// The backward's per-step element-wise work on the tensor-core path, fused: one warp per
// row (b, t, h) of P <= 128 values (lane p, p + 32, ...), dY_t = dy_t * silu'(z_t) recomputed
// from dy and z in both passes (never stored in float32). With e_t = dt'_t (C_t . B_t) (cb),
// yo = the recomputed output without D, gate and diagonal term (ssd_mma_chunk_mm "ycore",
// with_diag = 0), go = dt'_s (G B)_s without its diagonal term ("GB"):
//   FINAL = false (before the products; only needed with z): dY16 = dY rounded to T,
//     dz = dy y_pre sigmoid(z) (1 + z (1 - sigmoid(z))), y_pre = yo + e x + D x;
//   FINAL = true: dx = go + e dY + D dY (rounded to T),
//     dcum[b, t, h] = sum_p round_T(dY)_p yo_p - sum_p x_p go_p (the chunk sums' cotangent
//     without its boundary term), and per block the partial sums of dY x over its steps,
//     dD_part[blockIdx.x, h, p] (summed over the blocks by the caller: deterministic).
// The arithmetic follows the CuPy expressions it replaces, operation for operation.
// Grid: (ceil(batch * L / steps_per_block), H); a block's 4 warps take its steps in turn.
// --------------------------------------------------------------------------------------
#define SSD_MMA_ROW_VALUES 4  // values per lane: P <= 128

template <typename T, bool FINAL>
__global__ void __launch_bounds__(SSD_MMA_THREADS, 6)
ssd_mma_bwd_rows(const T* __restrict__ dy, const T* __restrict__ z, const T* __restrict__ X,
                 const float* __restrict__ yo, const float* __restrict__ go,
                 const float* __restrict__ D, const float* __restrict__ dte,
                 const float* __restrict__ cb, T* __restrict__ dY16, T* __restrict__ dz,
                 T* __restrict__ dx, float* __restrict__ dcum, float* __restrict__ dD_part,
                 ssm_i64 steps, int H, int P, int steps_per_block) {
    __shared__ float dd_sh[SSD_MMA_THREADS / 32][32 * SSD_MMA_ROW_VALUES];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int h = blockIdx.y;
    ssm_i64 s0, s1;
    float Dv[SSD_MMA_ROW_VALUES], dd[SSD_MMA_ROW_VALUES];
    ssm_row_block_start(s0, s1, Dv, dd, D, h, P, steps, steps_per_block);
    // Two rows per pass, every load of both issued before either is used (a row's loads
    // alone leave too few bytes in flight per warp).
    constexpr int RPP = 2, WARPS = SSD_MMA_THREADS / 32;
    for (ssm_i64 s_pass = s0 + warp; s_pass < s1; s_pass += RPP * WARPS) {
        float xs[RPP][SSD_MMA_ROW_VALUES], dys[RPP][SSD_MMA_ROW_VALUES];
        float yos[RPP][SSD_MMA_ROW_VALUES], gos[RPP][SSD_MMA_ROW_VALUES];
        float zs[RPP][SSD_MMA_ROW_VALUES], es[RPP];
#pragma unroll
        for (int u = 0; u < RPP; ++u) {
            const ssm_i64 s = s_pass + u * WARPS;
            const bool row_live = s < s1;
            const ssm_i64 row = (row_live ? s : s0) * H + h, base = row * P;
            es[u] = row_live ? dte[row] * cb[row] : 0.0f;
#pragma unroll
            for (int k = 0; k < SSD_MMA_ROW_VALUES; ++k) {
                const int p = lane + 32 * k;
                const bool live = row_live && p < P;
                const ssm_i64 i = base + p;
                xs[u][k] = live ? ssm_load(X[i]) : 0.0f;
                dys[u][k] = live ? ssm_load(dy[i]) : 0.0f;
                yos[u][k] = live && (FINAL || z) ? yo[i] : 0.0f;
                gos[u][k] = live && FINAL ? go[i] : 0.0f;
                zs[u][k] = live && z ? ssm_load(z[i]) : 0.0f;
            }
        }
#pragma unroll
        for (int u = 0; u < RPP; ++u) {
        const ssm_i64 s = s_pass + u * WARPS;
        if (s >= s1) break;  // uniform over the warp
        const ssm_i64 row = s * H + h, base = row * P;
        const float e = es[u];
        float sum_y = 0.0f, sum_x = 0.0f;
#pragma unroll
        for (int k = 0; k < SSD_MMA_ROW_VALUES; ++k) {
            const int p = lane + 32 * k;
            if (p < P) {
                const ssm_i64 i = base + p;
                const float xv = xs[u][k], dyv = dys[u][k];
                float dYv = dyv;
                const float yov = yos[u][k];
                if (z) {
                    const float zv = zs[u][k];
                    const float sg = ssm_math<float>::sigmoid(zv);
                    if (!FINAL) {
                        const float y_pre = (yov + e * xv) + Dv[k] * xv;
                        ssm_store(dz + i, dyv * y_pre * sg * (1.0f + zv * (1.0f - sg)));
                    }
                    dYv = dyv * zv * sg;
                }
                T d16;
                ssm_store(&d16, dYv);
                if (!FINAL) {
                    dY16[i] = d16;
                } else {
                    const float gov = gos[u][k];
                    ssm_store(dx + i, (gov + e * dYv) + Dv[k] * dYv);
                    sum_y += ssm_load(d16) * yov;
                    sum_x += xv * gov;
                    dd[k] += dYv * xv;
                }
            }
        }
        if (FINAL) {
#pragma unroll
            for (int m = 16; m >= 1; m >>= 1) {
                sum_y += __shfl_xor_sync(0xffffffffu, sum_y, m);
                sum_x += __shfl_xor_sync(0xffffffffu, sum_x, m);
            }
            if (lane == 0) dcum[row] = sum_y - sum_x;
        }
        }
    }
    if (FINAL && dD_part)  // uniform: the warps' sums in warp order
        ssm_warp_partials_sum(dd_sh, dd, dD_part + ((ssm_i64)blockIdx.x * H + h) * P, P);
}
