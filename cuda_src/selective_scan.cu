// selective_scan.cu: Mamba-1 selective scan, forward and backward, for ssmkit.
//
// For every batch row b and channel d, with h = initial state (or 0):
//   dt_t = softplus?(delta_t + delta_bias[d])
//   h_t[n] = exp(dt_t A[d,n]) h_{t-1}[n] + dt_t B_t[n] u_t
//   y_t = (sum_n C_t[n] h_t[n] + D[d] u_t) * silu(z_t)
//
// Work split (both kernels). A block owns one batch row b and CH consecutive
// channels d0..d0+CH-1 that lie in one group of B and one group of C, so the
// per-step B_t, C_t tiles in shared memory serve all its channels. Thread
// tid = c*NSPLIT + s works on channel d0+c and keeps NPT states
// n = s*NPT .. s*NPT+NPT-1 in registers (states n >= N are padding: A = B =
// C = 0, so they stay 0 and add nothing). The NSPLIT lanes of a channel are
// consecutive lanes of one warp; sums over n are warp shuffles among them.
// Time is walked in tiles of TL steps staged in shared memory.
//
// Template parameters: IO (u, delta, z, y storage: ssm_half, ssm_bf16, float,
// double), BC (B and C storage: IO or CT), CT (compute type: float, or double
// for double), NPT, NSPLIT (powers of two, NPT a multiple of 4), BV / CV
// (B / C given per step as (batch, G, N, L) rather than (dim, N)).
// Run-time flags (SSM_*) say which optional inputs are present.
//
// Every global offset is computed in 64-bit (ssm_i64).

#include "ssm_common.cuh"

// Launch bounds. The host never launches more threads than these (see
// ssmkit/_gpu/selective_scan.py). The backward asks for 3 blocks of 128
// threads per SM in float (at most 168 registers: 12 warps per SM) and 2 in
// double. 128 threads rather than 64: twice the channels per block halves its
// per-step dB and dC partials (6.4 -> 3.2 GB at N = 128, batch 8, dim 1536,
// L 2048): forward + backward 22.5 -> 17.6 ms there, 7.9 -> 6.6 ms at N = 64.
#define SSM_FWD_MAX_THREADS 256

// L2 prefetch of the next tile (the forward kernels that stage straight from
// global memory, ssm_scan_fwd_direct / _sum_direct; the cp.async ones copy the
// next tile instead; see the tile loop): only with 4
// states per thread (N <= 16), where staging latency dominates; with more
// states the scan's arithmetic hides the loads anyway and the extra address
// registers cost spills at N = 128. The backward does not prefetch: at its
// register cap (launch bounds) the addresses spill (24-32 bytes with NVRTC).
// Off with -DSSM_FWD_PREFETCH=0 (ssmkit: SSMKIT_FWD_PREFETCH=0 in the environment).
#ifndef SSM_FWD_PREFETCH
#define SSM_FWD_PREFETCH 1
#endif
template <int NPT> __host__ __device__ constexpr bool ssm_use_prefetch() {
    return SSM_FWD_PREFETCH != 0 && NPT == 4;
}
#define SSM_BWD_MAX_THREADS 128
// Rows a backward thread stages at once (all their loads issued before the first use).
#ifndef SSM_BWD_STAGE_ROWS
#define SSM_BWD_STAGE_ROWS 4
#endif
template <typename CT> struct ssm_bwd_min_blocks { static constexpr int value = sizeof(CT) == 8 ? 2 : 3; };

enum : int {
    SSM_HAS_D = 1,
    SSM_HAS_Z = 2,
    SSM_HAS_BIAS = 4,
    SSM_SOFTPLUS = 8,
    SSM_HAS_H0 = 16,       // forward: initial state given; backward: return its gradient
    SSM_SAVE_CKPT = 32,    // forward: write the state entering each chunk
    SSM_HAS_DFINAL = 64,   // backward: a cotangent of the final state is given
    SSM_CKPT_INSIDE = 128, // ring forward: tiles run across chunk boundaries (chunk and TL
                           // multiples of 16 steps)
    SSM_ACCUMULATE = 256,  // ring backward, float IO: du, ddelta, dz added to the outputs'
                           // values (a slice of the states adding its part)
};

// Backward sub-tile: steps whose states are recomputed into registers at once.
// TS * NPT values of h (and as many decays) live in registers during the
// adjoint walk: 16 floats at NPT 4, 32 at NPT 8 and above (8 doubles) keep the
// walk within the register budget of the launch bounds (a few words of local
// memory at most). Each sub-tile ends in two block barriers, so longer is
// better where it fits: 4-step sub-tiles at NPT 8 took N = 64 from 9.0 to 7.9
// ms forward + backward (benchmarks/NOTES.md); at NPT 4 they spill 40 bytes.
// ssmkit/_gpu/selective_scan.py mirrors this rule (_bwd_substeps).
template <typename CT, int NPT>
__host__ __device__ constexpr int ssm_bwd_substeps() {
    return (sizeof(CT) == 8 ? 8 : NPT >= 8 ? 32 : 16) / NPT >= 1 ? (sizeof(CT) == 8 ? 8 : NPT >= 8 ? 32 : 16) / NPT : 1;
}

// Shared-memory layouts, in elements of CT; every section starts at a multiple
// of 4 elements (16-byte aligned). ssmkit/_gpu/selective_scan.py mirrors these
// formulas to size the launch; each kernel checks them against the size it got.
//   TLS = TL | 1: row stride of the per-(channel, step) arrays; odd, so the
//         lanes of a warp (different channels, same step) hit different banks.
//   BS  = NPAD + 4: row stride of the per-step B/C tiles, kept a multiple of 4
//         for 16-byte vector access. Quad q of a row (states 4q .. 4q + 3) lies
//         at quad ssm_bc_quad(q): within each 8 quads (128 bytes), swizzled by
//         the next bits of q, so that the 8 lanes of a quarter warp reading 8 or
//         16 states each hit different banks (in order, lanes s and s + 4 were
//         128 bytes apart and every vector load of B or C took two wavefronts).
//         The backward's per-channel dB/dC rows (redB, redC) are swizzled alike.
__host__ __device__ constexpr int ssm_bc_quad(int q) { return q ^ ((q >> 3) & 7); }

// A lane's NPT states 4 at a time from a swizzled row (quads s NPT / 4 ..), and back.
template <int NPT, typename T>
__device__ __forceinline__ void ssm_ld_row_swz(T (&r)[NPT], const T* row, int s) {
#pragma unroll
    for (int i = 0; i < NPT / 4; ++i) ssm_ld4(&r[4 * i], row + 4 * ssm_bc_quad(s * (NPT / 4) + i));
}
template <int NPT, typename T>
__device__ __forceinline__ void ssm_st_row_swz(T* row, int s, const T (&r)[NPT]) {
#pragma unroll
    for (int i = 0; i < NPT / 4; ++i) ssm_st4(row + 4 * ssm_bc_quad(s * (NPT / 4) + i), &r[4 * i]);
}
struct ssm_fwd_layout {
    int TLS, BS, o_dtu, o_y, o_B, o_C, total;
    __device__ ssm_fwd_layout(int CH, int TL, int NPAD, bool bv, bool cv) {
        TLS = TL | 1;
        BS = NPAD + 4;
        o_dtu = 0;
        o_y = o_dtu + ssm_round_up(2 * CH * TLS, 4);
        o_B = o_y + ssm_round_up(CH * TLS, 4);
        o_C = o_B + (bv ? ssm_round_up(TL * BS, 4) : 0);
        total = o_C + (cv ? ssm_round_up(TL * BS, 4) : 0);
    }
};

struct ssm_bwd_layout {
    int TLS, BS, o_dtu, o_u, o_dy, o_dz, o_ds, o_B, o_C, o_sub, o_redB, o_redC,
        o_accB, o_accC, total;
    __device__ ssm_bwd_layout(int CH, int TL, int NPAD, int NPT, int TS, bool bv, bool cv) {
        TLS = TL | 1;
        BS = NPAD + 4;
        const int row = ssm_round_up(CH * TLS, 4);
        o_dtu = 0;
        o_u = o_dtu + ssm_round_up(2 * CH * TLS, 4);
        o_dy = o_u + row;
        o_dz = o_dy + row;
        o_ds = o_dz + row;
        o_B = o_ds + row;
        o_C = o_B + (bv ? ssm_round_up(TL * BS, 4) : 0);
        o_sub = o_C + (cv ? ssm_round_up(TL * BS, 4) : 0);
        o_redB = o_sub + (TL / TS) * (CH * (NPAD / NPT)) * NPT;
        o_redC = o_redB + (bv ? TS * CH * NPAD : 0);
        o_accB = o_redC + (cv ? TS * CH * NPAD : 0);
        o_accC = o_accB + (bv ? ssm_round_up(NPAD * TLS, 4) : 0);
        total = o_accC + (cv ? ssm_round_up(NPAD * TLS, 4) : 0);
    }
};

// Xs[t][n] (row stride BS, quads swizzled: ssm_bc_quad) = load(n, t) for t < tl and n < N,
// zeros up to tlp and 4 NQ: rows of W lanes walk consecutive steps, four states per store.
// G row groups at a time, every load issued before the first store (the backward takes 2:
// 2-8% faster there; the forward's N = 128 kernel was 31% slower with 2).
template <typename CT, int G = 1, typename F>
__device__ __forceinline__ void ssm_stage_bc_with(CT* __restrict__ Xs, int N, int NQ, int BS, int tl,
                                                  int tlp, int r0, int rstep, int col0, int W,
                                                  const F& load) {
    for (int q = r0; q < NQ; q += G * rstep) {
        for (int t = col0; t < tlp; t += W) {
            CT x[G][4];
#pragma unroll
            for (int j = 0; j < G; ++j) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int n = 4 * (q + j * rstep) + e;
                    x[j][e] = (t < tl && n < N) ? (CT)load(n, t) : CT(0);
                }
            }
#pragma unroll
            for (int j = 0; j < G; ++j)
                if (q + j * rstep < NQ) ssm_st4(Xs + t * BS + 4 * ssm_bc_quad(q + j * rstep), x[j]);
        }
    }
}

// ssm_stage_bc's tile in pieces of 4 rows n x 4 steps: one vector load of 4 consecutive
// steps per row (16 bytes for float), then one 16-byte store of 4 states per step. For
// 4- and 8-byte BC whose rows are 16-byte aligned at the tile's first step. Where NQ is a
// multiple of 8, a warp takes 8 state quads x 4 step quads: each of its loads reads 8 rows
// of 64 contiguous bytes, each store writes 4 steps of 128 contiguous bytes; otherwise
// consecutive threads take consecutive state quads.
template <typename BC, typename CT>
__device__ __forceinline__ void ssm_stage_bc_quads(CT* __restrict__ Xs, const BC* __restrict__ Xg,
                                                   ssm_i64 L, int N, int NQ, int BS, int tl,
                                                   int tlp, int tid, int nthr) {
    static_assert(sizeof(BC) >= 4, "4 steps of a 16-bit row are 8 bytes: ssm_stage_bc_with");
    const int nqt = (tlp + 3) >> 2;  // step quads
    const bool patches = NQ % 8 == 0;
    const int pieces = patches ? NQ * ((nqt + 3) & ~3) : NQ * nqt;
    for (int i = tid; i < pieces; i += nthr) {
        int q, tq;
        if (patches) {
            const int w = i >> 5, wt = w / (NQ / 8);
            q = 8 * (w - wt * (NQ / 8)) + (i & 7);
            tq = 4 * wt + ((i & 31) >> 3);
            if (tq >= nqt) continue;
        } else {
            tq = i / NQ;
            q = i - tq * NQ;
        }
        const int t = 4 * tq;
        CT x[4][4];  // x[e][j]: state 4 q + e, step t + j
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            BC v[4] = {BC(0), BC(0), BC(0), BC(0)};
            if (4 * q + e < N && t < tl) ssm_ld4(v, Xg + (ssm_i64)(4 * q + e) * L + t);
#pragma unroll
            for (int j = 0; j < 4; ++j) x[e][j] = t + j < tl ? (CT)ssm_load(v[j]) : CT(0);
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const CT col[4] = {x[0][j], x[1][j], x[2][j], x[3][j]};
            if (t + j < tlp) ssm_st4(Xs + (t + j) * BS + 4 * ssm_bc_quad(q), col);
        }
    }
}

// Copy one tile of a per-step B or C, (N, L) rows starting at step t0 (Xg
// already points at [b, g, 0, t0]), into Xs[t][n] (time-major, row stride BS),
// converting to CT. Rows n >= N and steps t >= tl are zero-filled up to NPAD
// and tlp. Each thread moves 4 states of one step: the global loads coalesce
// along t, the shared store is one 16-byte access. With QUADS (the backward),
// where the rows are 16-byte aligned at t0 (float or double, L a multiple of
// 4), by ssm_stage_bc_quads instead: the N = 128 backward spent 18% of its
// instructions staging element by element, 9% so. (The forward stays element
// by element: with quads its N = 64 kernel took 4% longer, benchmarks/NOTES.md.)
template <int G = 1, bool QUADS = false, typename BC, typename CT>
__device__ __forceinline__ void ssm_stage_bc(CT* __restrict__ Xs, const BC* __restrict__ Xg,
                                             ssm_i64 L, int N, int NQ, int BS, int tl, int tlp,
                                             int r0, int rstep, int col0, int W) {
    if constexpr (QUADS && sizeof(BC) >= 4) {
        if ((L & 3) == 0 && ((unsigned long long)Xg & 15) == 0) {  // (block-uniform)
            ssm_stage_bc_quads(Xs, Xg, L, N, NQ, BS, tl, tlp, r0 * W + col0, rstep * W);
            return;
        }
    }
    ssm_stage_bc_with<CT, G>(Xs, N, NQ, BS, tl, tlp, r0, rstep, col0, W,
                          [&](int n, int t) { return ssm_load(Xg[(ssm_i64)n * L + t]); });
}

// A tile's per-step sums over the block's channels, acc[n * TLS + t] (n < N, t < tl), to
// rows dst + n * L (the backward's dB/dC partials): 4 steps by one 16-byte store where
// the rows are 16-byte aligned at the tile's first step (float, L a multiple of 4), else
// one by one (rows of W lanes walk consecutive steps, as the staging).
template <typename CT>
__device__ __forceinline__ void ssm_write_tile_rows(CT* __restrict__ dst, const CT* __restrict__ acc,
                                                    int TLS, ssm_i64 L, int N, int tl, int r0,
                                                    int rstep, int col0, int W) {
    if (sizeof(CT) == 4 && (L & 3) == 0 && ((unsigned long long)dst & 15) == 0) {
        const int quads = (tl + 3) >> 2, nthr = rstep * W;
        int sh = 0;  // 2^sh lanes per row: its quads rounded up to a power of two
        while ((1 << sh) < quads) ++sh;
        for (int i = r0 * W + col0; i < (N << sh); i += nthr) {
            const int n = i >> sh, t = 4 * (i & ((1 << sh) - 1));
            if (t >= tl) continue;
            const CT* const a = acc + n * TLS + t;
            CT* const d = dst + (ssm_i64)n * L + t;
            if (t + 4 <= tl) {
                const CT v[4] = {a[0], a[1], a[2], a[3]};
                ssm_st4(d, v);
            } else {
                for (int j = 0; t + j < tl; ++j) d[j] = a[j];
            }
        }
        return;
    }
    for (int n = r0; n < N; n += rstep)
        for (int t = col0; t < tl; t += W) dst[(ssm_i64)n * L + t] = acc[n * TLS + t];
}

// ===========================================================================
// Asynchronous tile copies (forward, cp.async). While one tile is scanned, the
// next tile's inputs are copied from global memory into a second shared
// buffer as they are stored (u, delta, z, B, C: no conversion), so the
// staging that follows reads shared memory instead of waiting on DRAM.
// sm_80 and later; before that the same calls are plain copies (synchronous,
// still correct). SSM_NO_CP_ASYNC forces the plain copies (ssm_common.cuh).
// ===========================================================================

// One element: cp.async for 4- and 8-byte types; 2-byte types (which cp.async
// cannot move alone) by a plain load and store.
template <typename T>
__device__ __forceinline__ void ssm_cp_elem(T* dst, const T* src) {
    if constexpr (sizeof(T) == 4 || sizeof(T) == 8) ssm_cp_async<(int)sizeof(T)>(dst, src);
    else *dst = *src;
}

// Position of a row's first element inside its 16-byte line, in elements.
template <typename T>
__device__ __forceinline__ int ssm_raw_shift(const T* p) {
    return (int)(((unsigned long long)p / sizeof(T)) % (16 / sizeof(T)));
}

// Copy rows [0, nrows) of len elements each (row r at src + r * stride) into
// shared rows of R bytes (dst 16-byte aligned, R a multiple of 16): element j
// of row r goes to element ssm_raw_shift(row r) + j of shared row r, so a
// row's 16-byte pieces land on 16-byte aligned shared addresses whatever the
// row's alignment. Pieces wholly inside the row go by one 16-byte cp.async;
// the (at most two) pieces at its ends element by element. Only the row's own
// elements are read. Spread over the nthr threads of the block.
template <typename T>
__device__ __forceinline__ void ssm_copy_rows_async(unsigned char* dst, int R, const T* src, ssm_i64 stride,
                                                    int nrows, int len, int tid, int nthr) {
    constexpr int V = 16 / (int)sizeof(T);
    if (len <= 0) return;
    const int nv = (len + 2 * (V - 1)) / V;  // pieces per row, at most
#pragma unroll 1
    for (int i = tid; i < nrows * nv; i += nthr) {
        const int r = i / nv;
        const int q = i - r * nv;
        const T* const row = src + (ssm_i64)r * stride;
        const int j0 = q * V - ssm_raw_shift(row);  // first element of piece q
        T* const d = reinterpret_cast<T*>(dst + r * R) + q * V;
        if (j0 >= 0 && j0 + V <= len) {
            ssm_cp_async<16>(d, row + j0);
        } else if (j0 < len) {
#pragma unroll 1
            for (int e = 0; e < V; ++e) {
                const int j = j0 + e;
                if (j >= 0 && j < len) ssm_cp_elem(d + e, row + j);
            }
        }
    }
}

// The second-buffer layout of the cp.async forward. A buffer is `rows` rows
// of R bytes (room for TL elements of the wider of IO and BC, plus the
// shift): the tile's rows of u, delta, z (CH each, from rows 0, CH, 2 CH) and
// of B, C (NPAD each where given per step, from row 3 CH; only rows n < N
// are written), as ssm_copy_rows_async leaves them. Two buffers follow
// ssm_fwd_layout's sections. ssmkit/_gpu/selective_scan.py mirrors this.
template <typename IO, typename BC, int NPAD, bool BV, bool CV>
struct ssm_fwd_raw {
    static constexpr int E = sizeof(IO) > sizeof(BC) ? (int)sizeof(IO) : (int)sizeof(BC);
    int R, CH;
    __device__ ssm_fwd_raw(int CH_, int TL) : R(ssm_round_up(TL * E, 16) + 16), CH(CH_) {}
    __device__ int rows() const { return 3 * CH + NPAD * ((BV ? 1 : 0) + (CV ? 1 : 0)); }
    __device__ int bytes() const { return rows() * R; }  // one buffer
    // First row of each section in buffer `which`, as a byte offset.
    __device__ int u(int which) const { return which * bytes(); }
    __device__ int delta(int which) const { return which * bytes() + CH * R; }
    __device__ int z(int which) const { return which * bytes() + 2 * CH * R; }
    __device__ int B(int which) const { return which * bytes() + 3 * CH * R; }
    __device__ int C(int which) const { return which * bytes() + (3 * CH + (BV ? NPAD : 0)) * R; }
};

// ssm_stage_bc from a raw tile in shared memory (rows of ssm_copy_rows_async,
// R bytes apart; Xg: the global tile the rows came from, row stride L, for their
// shifts) instead of from global memory.
template <typename BC, typename CT>
__device__ __forceinline__ void ssm_stage_bc_raw(CT* __restrict__ Xs, const unsigned char* __restrict__ Xr,
                                                 int R, const BC* Xg, ssm_i64 L, int N, int NQ, int BS, int tl,
                                                 int tlp, int r0, int rstep, int col0, int W) {
    ssm_stage_bc_with<CT>(Xs, N, NQ, BS, tl, tlp, r0, rstep, col0, W, [&](int n, int t) {
        return ssm_load(reinterpret_cast<const BC*>(Xr + n * R)[ssm_raw_shift(Xg + (ssm_i64)n * L) + t]);
    });
}

// ===========================================================================
// Time segments. When batch * dim / CH blocks cannot fill the GPU, the host
// splits time into nseg segments of seg_len steps (a multiple of the chunk,
// so checkpoints stay per global chunk; the last segment may be shorter) and
// block index blk = (seg' * batch + b) * (dim / CH) + tile, seg = seg0 + seg'.
// The recurrence is linear in the state, so per (b, d, n) a segment maps its
// entering state H to exp(A * sum_t dt_t) * H + local, local being the state
// it reaches from 0. Forward:
//   (1) ssm_scan_fwd_sum: local and sum dt of segments 0 .. nseg-2 (no C, y, z);
//   (2) ssm_seg_carry: state entering each segment, sequential over segments;
//   (3) ssm_scan_fwd: every segment from its entering state (seg_h).
// The backward does the same in reverse time with the adjoint g, which does
// not depend on h: ssm_scan_bwd_sum gives each segment's outgoing adjoint
// from a zero seed, the carry runs from the last segment to the first, and
// ssm_scan_bwd runs every segment from its seed. With nseg == 1 (seg_len >=
// L) the summary and carry kernels are not launched and seg_h / seg_g are null.
// ===========================================================================

// Which part of the problem a block of the scan kernels owns (see "Time
// segments"): block blockIdx.x = (seg' * batch + b) * (dim / CH) + tile, for
// segment seg = seg0 + seg', batch row b and channels d0 = tile * CH ...
struct ssm_block_place {
    int seg, b, d0;
    __device__ __forceinline__ ssm_block_place(int batch, int dim, int CH, int seg0) {
        const int ntile = dim / CH, rows = batch * ntile;  // rows: blocks per segment
        seg = seg0 + (int)(blockIdx.x / rows);
        const int rt = blockIdx.x - (seg - seg0) * rows;
        b = rt / ntile;
        d0 = (rt - b * ntile) * CH;
    }
};

// The forward kernels' per-thread start: A2 = A log2(e) for this thread's
// states n = s NPT + k (0 for n >= N), and h, the state entering the
// segment: the carried one when time is split, else h0 (or 0); the summary
// pass (SUM) always starts from 0.
template <typename CT, int NPT, bool SUM>
__device__ __forceinline__ void ssm_fwd_start(CT (&A2)[NPT], CT (&h)[NPT], const CT* __restrict__ A,
                                              const CT* __restrict__ seg_h, const CT* __restrict__ h0,
                                              bool has_h0, int batch, int dim, int N, int nseg, int seg,
                                              int b, int d, int s) {
#pragma unroll
    for (int k = 0; k < NPT; ++k) {
        const int n = s * NPT + k;
        const bool ok = n < N;
        A2[k] = ok ? A[(ssm_i64)d * N + n] * ssm_math<CT>::kLog2e : CT(0);
        h[k] = CT(0);
        if (!SUM && ok) {
            if (nseg > 1) h[k] = seg_h[(((ssm_i64)seg * batch + b) * dim + d) * N + n];
            else if (has_h0) h[k] = h0[((ssm_i64)b * dim + d) * N + n];
        }
    }
}

// The forward kernels' end: SUM, the segment's end state to seg_h[seg, b, d]
// and its sum of dt to seg_dt[seg, b, d]; else, in the last segment, the
// final state to hfinal[b, d].
template <typename CT, int NPT, bool SUM>
__device__ __forceinline__ void ssm_fwd_end(const CT (&h)[NPT], CT sdt, CT* __restrict__ hfinal,
                                            CT* __restrict__ seg_h, CT* __restrict__ seg_dt, int batch,
                                            int dim, int N, int nseg, int seg, int b, int d, int s) {
    const ssm_i64 bd = (ssm_i64)b * dim + d;
    CT* dst = nullptr;
    if constexpr (SUM) {
        const ssm_i64 sbd = (ssm_i64)seg * batch * dim + bd;
        dst = seg_h + sbd * N;
        if (s == 0) seg_dt[sbd] = sdt;
    } else if (seg == nseg - 1) {
        dst = hfinal + bd * N;
    }
    if (dst != nullptr) {
#pragma unroll
        for (int k = 0; k < NPT; ++k)
            if (s * NPT + k < N) dst[s * NPT + k] = h[k];
    }
}

// ===========================================================================
// Forward: y, the final state and (optionally) the state entering each chunk.
// SUM (ssm_scan_fwd_sum): run from a zero state, write only the segment's end
// state to seg_h[seg, b, d, :] and its sum of dt to seg_dt[seg, b, d].
// Otherwise (ssm_scan_fwd): seg_h, if not null, holds the state entering each
// segment (nseg, batch, dim, N); the last segment writes hfinal.
// ASYNC: the next tile's inputs are copied by cp.async into a second shared
// buffer (ssm_fwd_raw: two after ssm_fwd_layout's sections) while
// this tile is scanned, and staging (softplus, dt*u, B/C to time-major)
// reads them from there; else staging loads straight from global memory
// (with an L2 prefetch of the next tile at N <= 16). Same arithmetic, same
// results bit for bit.
// ===========================================================================
template <typename IO, typename BC, typename CT, int NPT, int NSPLIT, bool BV, bool CV, bool SUM,
          bool ASYNC>
__device__ __forceinline__ void
ssm_fwd_body(const IO* __restrict__ u, const IO* __restrict__ delta, const IO* __restrict__ z,
             const CT* __restrict__ A, const BC* __restrict__ B, const BC* __restrict__ C,
             const CT* __restrict__ D, const CT* __restrict__ dbias, const CT* __restrict__ h0,
             IO* __restrict__ y, CT* __restrict__ hfinal, CT* __restrict__ ckpt,
             CT* __restrict__ seg_h, CT* __restrict__ seg_dt,
             int batch, int dim, int N, ssm_i64 L, int GB, int GC, ssm_i64 chunk,
             int TL, int CH, int flags, ssm_i64 seg_len, int nseg, int seg0,
             const unsigned char* __restrict__ restart) {
    static_assert(ssm_same<CT, typename ssm_compute_of<IO>::type>::value, "CT must be IO's compute type");
    static_assert(ssm_same<BC, IO>::value || ssm_same<BC, CT>::value, "BC must be IO or CT");
    if (restart != nullptr) __trap();  // (packed sequences restart in the ring kernels only)
    static_assert(NPT % 4 == 0 && (NSPLIT & (NSPLIT - 1)) == 0 && NSPLIT <= 32, "bad config");
    typedef ssm_math<CT> M;
    constexpr int NPAD = NPT * NSPLIT;
    constexpr int NQ = NPAD / 4;

    const int nthr = CH * NSPLIT;  // == blockDim.x
    const int tid = threadIdx.x;
    const int c = tid / NSPLIT;
    const int s = tid % NSPLIT;
    const ssm_block_place place(batch, dim, CH, seg0);
    const int seg = place.seg, b = place.b, d0 = place.d0;
    const int d = d0 + c;
    const unsigned wmask = ssm_warp_mask(nthr);
    const ssm_i64 t_begin = (ssm_i64)seg * seg_len;

    const ssm_fwd_layout lay(CH, TL, NPAD, BV, CV && !SUM);
    const ssm_fwd_raw<IO, BC, NPAD, BV, CV> raw(CH, TL);
    const unsigned smem_need = (unsigned)lay.total * sizeof(CT) + (ASYNC ? 2u * raw.bytes() : 0u);
    // A launch planned by rules other than these kernels' would read or write
    // out of bounds: stop it loudly instead (all conditions are block-uniform).
    if (smem_need > ssm_dynamic_smem_bytes() || (int)blockDim.x != nthr ||
        TL % NSPLIT != 0 || dim % CH != 0 || (BV && (GB <= 0 || dim % GB != 0 || (dim / GB) % CH != 0)) ||
        (CV && (GC <= 0 || dim % GC != 0 || (dim / GC) % CH != 0)) ||
        seg < 0 || seg >= nseg || seg_len % chunk != 0 || t_begin >= L ||
        (nseg > 1 && seg_h == nullptr) || (SUM && seg_dt == nullptr))
        __trap();
    extern __shared__ ssm_f4 ssm_smem[];  // 16-byte aligned
    CT* const sm = reinterpret_cast<CT*>(ssm_smem);
    ssm_pair<CT>* const dtu = reinterpret_cast<ssm_pair<CT>*>(sm + lay.o_dtu);
    CT* const ys = sm + lay.o_y;
    CT* const Bs = sm + lay.o_B;
    CT* const Cs = sm + lay.o_C;
    unsigned char* const raw0 = reinterpret_cast<unsigned char*>(sm + lay.total);  // ASYNC only
    const int TLS = lay.TLS, BS = lay.BS;

    const bool has_D = flags & SSM_HAS_D;
    const bool has_z = flags & SSM_HAS_Z;
    const bool has_bias = flags & SSM_HAS_BIAS;
    const bool softplus = flags & SSM_SOFTPLUS;
    const bool has_h0 = flags & SSM_HAS_H0;
    const bool save_ckpt = flags & SSM_SAVE_CKPT;

    // Staging layout: rows of W consecutive lanes walk consecutive steps.
    const int W = ssm_stage_width(nthr, TL);
    const int r0 = tid / W, rstep = nthr / W, col0 = tid % W;

    // Per-thread constants and state.
    CT A2[NPT], h[NPT], Bc[NPT], Cc[NPT];
    ssm_fwd_start<CT, NPT, SUM>(A2, h, A, seg_h, h0, has_h0, batch, dim, N, nseg, seg, b, d, s);
#pragma unroll
    for (int k = 0; k < NPT; ++k) {
        const int n = s * NPT + k;
        const bool ok = n < N;
        if constexpr (!BV) Bc[k] = ok ? ssm_load(B[(ssm_i64)d * N + n]) : CT(0);
        if constexpr (!CV && !SUM) Cc[k] = ok ? ssm_load(C[(ssm_i64)d * N + n]) : CT(0);
    }
    CT sdt = 0;  // SUM: sum of dt over the segment (every lane of a channel keeps it)

    // One pass over time in tiles of at most TL steps; a tile never crosses a
    // chunk boundary, so the state entering each chunk is in registers at the
    // start of its first tile. (Few loop-carried values: fewer registers.)
    // End of this block's segment, recomputed from a fresh %ctaid where it
    // is needed rather than held in registers through the scan.
    const auto seg_end = [&]() -> ssm_i64 {
        const ssm_i64 e = (ssm_i64)(seg0 + ssm_fresh_ctaid() / (batch * (dim / CH)) + 1) * seg_len;
        return e < L ? e : L;
    };

    // ASYNC: copy the tile of `steps` steps from ts into raw buffer `which`
    // (one commit group per tile; an empty one past the segment's end). The
    // block's row and channels are recomputed from a fresh %ctaid (and the
    // thread from a fresh %tid) rather than kept in registers through the scan.
    const auto copy_tile = [&](int which, ssm_i64 ts, int steps) {
        const int tid3 = ssm_fresh_tid();
        const int rt3 = ssm_fresh_ctaid() % (batch * (dim / CH));
        const int b3 = rt3 / (dim / CH);
        const int d3 = (rt3 - b3 * (dim / CH)) * CH;
        const ssm_i64 row0 = ((ssm_i64)b3 * dim + d3) * L + ts;
        ssm_copy_rows_async(raw0 + raw.u(which), raw.R, u + row0, L, CH, steps, tid3, nthr);
        ssm_copy_rows_async(raw0 + raw.delta(which), raw.R, delta + row0, L, CH, steps, tid3, nthr);
        if (!SUM && has_z) ssm_copy_rows_async(raw0 + raw.z(which), raw.R, z + row0, L, CH, steps, tid3, nthr);
        if constexpr (BV)
            ssm_copy_rows_async(raw0 + raw.B(which), raw.R, B + ((ssm_i64)b3 * GB + d3 / (dim / GB)) * N * L + ts,
                                L, N, steps, tid3, nthr);
        if constexpr (CV && !SUM)
            ssm_copy_rows_async(raw0 + raw.C(which), raw.R, C + ((ssm_i64)b3 * GC + d3 / (dim / GC)) * N * L + ts,
                                L, N, steps, tid3, nthr);
        ssm_cp_commit();
    };
    int buf = 0;  // ASYNC: raw buffer holding the current tile
    if constexpr (ASYNC) {
        const ssm_i64 te = seg_end();
        const ssm_i64 e = (t_begin + chunk) < te ? (t_begin + chunk) : te;  // first chunk's end
        copy_tile(0, t_begin, (int)((e - t_begin) < TL ? (e - t_begin) : TL));
    }

    // Segments start on chunk boundaries (seg_len % chunk == 0).
    ssm_i64 chunk_end = t_begin;       // end of the current chunk
    ssm_i64 ci = t_begin / chunk - 1;  // current chunk
    for (ssm_i64 t0 = t_begin; t0 < seg_end();) {
        if (t0 == chunk_end) {  // a chunk starts here
            ++ci;
            const ssm_i64 te = seg_end();
            chunk_end = (t0 + chunk) < te ? (t0 + chunk) : te;
            if (!SUM && save_ckpt) {
                CT* const dst = ckpt + ((ci * batch + b) * (ssm_i64)dim + d) * N;
#pragma unroll
                for (int k = 0; k < NPT; ++k) {
                    const int n = s * NPT + k;
                    if (n < N) dst[n] = h[k];
                }
            }
        }
        {
            const int tl = (int)((chunk_end - t0) < TL ? (chunk_end - t0) : TL);
            const int tlp = ssm_round_up(tl, NSPLIT);  // padded steps: dt = 0, identity

            if constexpr (ASYNC) {
                ssm_cp_wait_all();  // this thread's copies of this tile have landed,
                __syncthreads();    // everyone's have; the previous tile's readers are done
                // The next tile: up to TL steps, never across a chunk's or the
                // segment's end (as this loop cuts them); none past the end.
                const ssm_i64 tn = t0 + tl;
                ssm_i64 en = chunk_end;
                if (tn == chunk_end) {
                    const ssm_i64 te = seg_end();
                    en = (tn + chunk) < te ? (tn + chunk) : te;
                }
                copy_tile(buf ^ 1, tn, (int)((en - tn) < TL ? (en - tn) : TL));
            } else {
                __syncthreads();  // the previous tile's readers are done with smem
            }
            for (int r = r0; r < CH; r += rstep) {
                const int dd = d0 + r;
                const ssm_i64 rb = ((ssm_i64)b * dim + dd) * L + t0;
                const CT bias = has_bias ? dbias[dd] : CT(0);
                const CT Dd = has_D ? D[dd] : CT(0);
                // This row's steps: in the raw buffer, or in global memory.
                const IO* ur = u + rb;
                const IO* dr = delta + rb;
                if constexpr (ASYNC) {
                    ur = reinterpret_cast<const IO*>(raw0 + raw.u(buf) + r * raw.R) + ssm_raw_shift(u + rb);
                    dr = reinterpret_cast<const IO*>(raw0 + raw.delta(buf) + r * raw.R) + ssm_raw_shift(delta + rb);
                }
                for (int t = col0; t < tlp; t += W) {
                    CT dt = 0, du = 0, yd = 0;
                    if (t < tl) {
                        const CT uu = ssm_load(ur[t]);
                        dt = ssm_load(dr[t]) + bias;
                        if (softplus) dt = M::softplus(dt);
                        du = dt * uu;
                        yd = Dd * uu;  // the D skip; the scan adds sum_n C h
                    }
                    ssm_pair<CT> p;
                    p.dt = dt;
                    p.du = du;
                    dtu[r * TLS + t] = p;
                    if constexpr (!SUM) ys[r * TLS + t] = yd;
                }
            }
            if constexpr (BV) {
                const BC* const Bg = B + ((ssm_i64)b * GB + d0 / (dim / GB)) * N * L + t0;
                if constexpr (ASYNC)
                    ssm_stage_bc_raw(Bs, raw0 + raw.B(buf), raw.R, Bg, L, N, NQ,
                                     BS, tl, tlp, r0, rstep, col0, W);
                else
                    ssm_stage_bc(Bs, Bg, L, N, NQ, BS, tl, tlp, r0, rstep, col0, W);
            }
            if constexpr (CV && !SUM) {
                const BC* const Cg = C + ((ssm_i64)b * GC + d0 / (dim / GC)) * N * L + t0;
                if constexpr (ASYNC)
                    ssm_stage_bc_raw(Cs, raw0 + raw.C(buf), raw.R, Cg, L, N, NQ,
                                     BS, tl, tlp, r0, rstep, col0, W);
                else
                    ssm_stage_bc(Cs, Cg, L, N, NQ, BS, tl, tlp, r0, rstep, col0, W);
            }
            __syncthreads();

            // While this tile is scanned, pull the next tile's inputs (and this
            // tile's z, read by the output stage) into L2: staging them then
            // waits on L2 instead of DRAM. All addresses lie in [t0, t_end).
            if constexpr (!ASYNC && ssm_use_prefetch<NPT>()) {
                const ssm_i64 rb0 = ((ssm_i64)b * dim + d0) * L;
                const ssm_i64 t0n = t0 + tl;
                const ssm_i64 te = seg_end();
                const int tln = (int)((te - t0n) < TL ? (te - t0n) : TL);  // <= 0: last tile
                ssm_prefetch_rows(u + rb0 + t0n, L, CH, tln, tid, nthr);
                ssm_prefetch_rows(delta + rb0 + t0n, L, CH, tln, tid, nthr);
                if constexpr (BV)
                    ssm_prefetch_rows(B + ((ssm_i64)b * GB + d0 / (dim / GB)) * N * L + t0n, L, N, tln,
                                      tid, nthr);
                if constexpr (CV && !SUM)
                    ssm_prefetch_rows(C + ((ssm_i64)b * GC + d0 / (dim / GC)) * N * L + t0n, L, N, tln,
                                      tid, nthr);
                if (!SUM && has_z) ssm_prefetch_rows(z + rb0 + t0, L, CH, tl, tid, nthr);
            }

            const ssm_pair<CT>* const drow = dtu + c * TLS;
            if constexpr (SUM) {
                // State only: no C, no reduction, no output.
#pragma unroll 4
                for (int t = 0; t < tlp; ++t) {
                    const ssm_pair<CT> p = drow[t];
                    CT bv[NPT];
                    if constexpr (BV) ssm_ld_row_swz<NPT>(bv, Bs + t * BS, s);
#pragma unroll
                    for (int k = 0; k < NPT; ++k) {
                        const CT bk = BV ? bv[k] : Bc[k];
                        h[k] = M::decay(p.dt * A2[k]) * h[k] + bk * p.du;
                    }
                    sdt += p.dt;
                }
            } else {
                // Scan NSPLIT steps at a time: each lane gets its partial
                // sum_n C h for those steps, then one reduce-scatter leaves lane s
                // with the full sum of step g0 + s.
                for (int g0 = 0; g0 < tlp; g0 += NSPLIT) {
                    CT v[NSPLIT];
#pragma unroll
                    for (int j = 0; j < NSPLIT; ++j) {
                        const int t = g0 + j;
                        const ssm_pair<CT> p = drow[t];
                        CT bv[NPT], cv[NPT];
                        if constexpr (BV) ssm_ld_row_swz<NPT>(bv, Bs + t * BS, s);
                        if constexpr (CV) ssm_ld_row_swz<NPT>(cv, Cs + t * BS, s);
                        CT acc = 0;
#pragma unroll
                        for (int k = 0; k < NPT; ++k) {
                            const CT bk = BV ? bv[k] : Bc[k];
                            const CT ck = CV ? cv[k] : Cc[k];
                            const CT a = M::decay(p.dt * A2[k]);
                            h[k] = a * h[k] + bk * p.du;
                            acc += ck * h[k];
                        }
                        v[j] = acc;
                    }
                    int off = 0;
                    bool own = true;
                    ssm_reduce_scatter<NSPLIT, NSPLIT / 2>::run(v, s, wmask, off, own);
                    ys[c * TLS + g0 + off] += v[0];  // off == s: one writer per step
                }
                __syncthreads();

                for (int r = r0; r < CH; r += rstep) {
                    const ssm_i64 rb = ((ssm_i64)b * dim + d0 + r) * L + t0;
                    const IO* zr = z + rb;  // this row's z: global, or the raw buffer
                    if constexpr (ASYNC)
                        if (has_z)
                            zr = reinterpret_cast<const IO*>(raw0 + raw.z(buf) + r * raw.R) + ssm_raw_shift(z + rb);
                    for (int t = col0; t < tl; t += W) {
                        CT yv = ys[r * TLS + t];
                        if (has_z) {
                            const CT zz = ssm_load(zr[t]);
                            yv *= zz * M::sigmoid(zz);
                        }
                        ssm_store(y + rb + t, yv);
                    }
                }
            }
            t0 += tl;
            buf ^= 1;
        }
    }
    {
        const int tid2 = ssm_fresh_tid(), blk2 = ssm_fresh_ctaid();
        const int rows2 = batch * (dim / CH);
        const int sg2 = blk2 / rows2, rt2 = blk2 - sg2 * rows2;
        const int b2 = rt2 / (dim / CH);
        const int d2 = (rt2 - b2 * (dim / CH)) * CH + tid2 / NSPLIT;
        ssm_fwd_end<CT, NPT, SUM>(h, sdt, hfinal, seg_h, seg_dt, batch, dim, N, nseg, seg0 + sg2, b2, d2,
                                  tid2 % NSPLIT);
    }
}

#define SSM_FWD_PARAMS                                                                                \
    const IO* __restrict__ u, const IO* __restrict__ delta, const IO* __restrict__ z,                 \
        const CT* __restrict__ A, const BC* __restrict__ B, const BC* __restrict__ C,                 \
        const CT* __restrict__ D, const CT* __restrict__ dbias, const CT* __restrict__ h0,            \
        IO* __restrict__ y, CT* __restrict__ hfinal, CT* __restrict__ ckpt, CT* __restrict__ seg_h,   \
        CT* __restrict__ seg_dt, int batch, int dim, int N, ssm_i64 L, int GB, int GC, ssm_i64 chunk, \
        int TL, int CH, int flags, ssm_i64 seg_len, int nseg, int seg0,                                \
        const unsigned char* __restrict__ restart
#define SSM_FWD_ARGS                                                                                  \
    u, delta, z, A, B, C, D, dbias, h0, y, hfinal, ckpt, seg_h, seg_dt, batch, dim, N, L, GB, GC,     \
        chunk, TL, CH, flags, seg_len, nseg, seg0, restart

// Resident blocks of SSM_FWD_MAX_THREADS threads that the cp.async forward
// kernels ask ptxas to allow, which caps their registers near what the
// direct-staging kernels use: in float 64 at NPT = 4, 80 at NPT = 8, 128 at
// NPT = 16; in double 128 at NPT = 4 (the same blocks per SM as the direct
// kernels' 80-96). Without the cap ptxas spends the copy loop's extra
// addresses, and a wider schedule of the scan's shared loads, on up to 127
// registers at NPT = 8 and 255 at NPT = 16. (The summary pass spills 8-16
// bytes at 64 for NPT = 8 and at 80 for NPT = 16, where the direct one fits,
// so it gets the scan kernel's cap; in double at NPT = 8 both kernels already
// hold one block per SM.)
template <typename CT, int NPT> struct ssm_fwd_min_blocks {
    static constexpr int value = sizeof(CT) == 8 ? (NPT == 4 ? 2 : 1) : NPT == 4 ? 4 : NPT == 8 ? 3 : 2;
};

// The forward with cp.async tile copies (shared memory: ssm_fwd_layout plus
// two ssm_fwd_raw buffers).
template <typename IO, typename BC, typename CT, int NPT, int NSPLIT, bool BV, bool CV>
__global__ void __launch_bounds__(SSM_FWD_MAX_THREADS, ssm_fwd_min_blocks<CT, NPT>::value)
ssm_scan_fwd(SSM_FWD_PARAMS) {
    ssm_fwd_body<IO, BC, CT, NPT, NSPLIT, BV, CV, false, true>(SSM_FWD_ARGS);
}

// Summary pass of a split forward (see "Time segments"); same parameters,
// y/hfinal/ckpt/z/C/D unused. With cp.async tile copies, as ssm_scan_fwd.
template <typename IO, typename BC, typename CT, int NPT, int NSPLIT, bool BV, bool CV>
__global__ void __launch_bounds__(SSM_FWD_MAX_THREADS, ssm_fwd_min_blocks<CT, NPT>::value)
ssm_scan_fwd_sum(SSM_FWD_PARAMS) {
    ssm_fwd_body<IO, BC, CT, NPT, NSPLIT, BV, CV, true, true>(SSM_FWD_ARGS);
}

// The same two kernels staging straight from global memory (shared memory:
// ssm_fwd_layout only): the earlier design, kept for A/B timing and as the
// choice where it measures faster (TUNING["fwd_async"] in
// ssmkit/_gpu/selective_scan.py).
template <typename IO, typename BC, typename CT, int NPT, int NSPLIT, bool BV, bool CV>
__global__ void __launch_bounds__(SSM_FWD_MAX_THREADS) ssm_scan_fwd_direct(SSM_FWD_PARAMS) {
    ssm_fwd_body<IO, BC, CT, NPT, NSPLIT, BV, CV, false, false>(SSM_FWD_ARGS);
}
template <typename IO, typename BC, typename CT, int NPT, int NSPLIT, bool BV, bool CV>
__global__ void __launch_bounds__(SSM_FWD_MAX_THREADS) ssm_scan_fwd_sum_direct(SSM_FWD_PARAMS) {
    ssm_fwd_body<IO, BC, CT, NPT, NSPLIT, BV, CV, true, false>(SSM_FWD_ARGS);
}

// ===========================================================================
// Forward through a ring of tiles (ssm_scan_fwd_ring, ssm_scan_fwd_sum_ring).
// The same work and parameters as ssm_scan_fwd / ssm_scan_fwd_sum, for the
// common Mamba-1 case only: float compute (IO float, half or bfloat16), B and C
// given per step, N <= 128 (NPT 4 on up to 32 lanes a channel, or 8 on up to 16: the host's
// TUNING["fwd_ring_npt8_min_n"]), L < 2^31, every row and tile 16-byte aligned
// (the host checks: base pointers 16-byte aligned; L, the chunk and TL multiples
// of ssm_ring_quantum). Where the other kernels spend most of their instructions
// (about 22 per state and step at N = 16, bfloat16) in block-wide staging and
// output passes of one element per thread with 64-bit offsets, and in
// converting B and C in every thread, these
//   - copy each next tile's rows of u, delta and z as stored, with 16-byte
//     cp.async, into the second of two stages while this tile is scanned, and
//     its B and C into the layout the scan reads, in float (groups of 4 steps:
//     [step / 4][n][4]; 16-bit B and C are copied as stored and widened there by
//     the same threads at the tile's end), so each lane reads 4 steps of a state
//     with one 16-byte access at an address known at compile time from the
//     group's: one __syncthreads per tile;
//   - leave all else to each warp for its own 32 / NSPLIT channels, so that one
//     warp's staging or output overlaps another's scan: dt = softplus(delta +
//     bias) and dt u into the warp's rows, the scan 16 steps at a time (then 4
//     to a tile's end) with one reduce-scatter of the output sums per block into
//     the warp's y rows, then y = (sum + D u) silu(z) written 16 bytes per lane,
//     coalesced;
//   - take softplus and the sigmoid from the hardware approximations
//     (ssm_math<float>::softplus_fast, sigmoid_fast).
// Same recurrence in the same order per state as the other forward kernels;
// sums over states, softplus and silu may differ in the last bits.
// ===========================================================================

// Granule of every tile start and length, in steps: 16 bytes of IO and of BC,
// and a scan group of 4 steps. ssmkit/_gpu/selective_scan.py mirrors it
// (_ring_quantum).
template <typename IO, typename BC> __host__ __device__ constexpr int ssm_ring_quantum() {
    constexpr int a = 16 / (int)sizeof(IO), b = 16 / (int)sizeof(BC);
    return a > b ? (a > 4 ? a : 4) : (b > 4 ? b : 4);
}

// The ring kernels' B and C stages: per group of 4 steps, state n's 4 values at slot
// ssm_ring_slot(n) of ssm_ring_gpitch(NPAD) slots of 16 bytes. A gap of one slot after
// every 8 states puts the quads of a channel's 4 lanes (states 4 s .. 4 s + 3, s < 4) in
// different banks: without it lanes s and s + 2 were 128 bytes apart, so every 16-byte
// load of B or C in the scans took two shared-memory wavefronts per quarter warp.
// ssmkit/_gpu/selective_scan.py mirrors it (_ring_gpitch).
__host__ __device__ constexpr int ssm_ring_slot(int n) { return n + (n >> 3); }
__host__ __device__ constexpr int ssm_ring_gpitch(int NPAD) { return NPAD + NPAD / 8; }
// Float index of state n's 4 values of group g (steps 4 g .. 4 g + 3) in a B or C stage.
__host__ __device__ constexpr int ssm_ring_bc_at(int NPAD, int g, int n) {
    return (g * ssm_ring_gpitch(NPAD) + ssm_ring_slot(n)) * 4;
}

// Bytes from one 16-bit B or C row of a tile to the next in the ring kernels' `raw`
// buffers: 16 more than the row, so that the 8 rows a quarter warp copies and widens at
// a time (ssm_for_bc_octets) start in different banks. ssmkit/_gpu/selective_scan.py mirrors
// it (_RAW_PAD).
__host__ __device__ constexpr int ssm_ring_raw_pitch(int TL) { return TL * 2 + 16; }

// What a ring kernel computes (its KIND): the forward (y, states), the forward's
// summary pass (each segment's end state from zero), or the backward's summary pass
// (each segment's outgoing adjoint from zero, walking time backwards). The rows
// each one stages per tile: SSM_RING_FWD u, delta, z and B, C; SSM_RING_SUM u,
// delta and B; SSM_RING_BSUM dout (in u's place), delta, z and C (in B's place).
enum { SSM_RING_FWD = 0, SSM_RING_SUM = 1, SSM_RING_BSUM = 2 };
__host__ __device__ constexpr int ssm_ring_nio(int kind) { return kind == SSM_RING_SUM ? 2 : 3; }
__host__ __device__ constexpr int ssm_ring_nbc(int kind) { return kind == SSM_RING_FWD ? 2 : 1; }

// Shared memory of the ring kernels, in bytes (ssmkit/_gpu/selective_scan.py
// mirrors it: _ring_smem_bytes). Two stages, each: CH rows of u, of delta and
// (not SSM_RING_SUM) of z, a row holding TL elements and 16 bytes more (so consecutive
// rows start four banks apart); then B and (SSM_RING_FWD) C in float, as TL / 4
// groups of ssm_ring_gpitch(NPAD) x 4 (rows n >= N zero). Then per channel a row of TL
// {dt, dt u} pairs (pitch 2 TL + 4 floats; float 2 TL: the channel's bias) and
// (SSM_RING_FWD) a row of TL partial outputs (pitch TL + 4 floats; float TL: its D);
// last, for 16-bit B and C, their rows as
// stored (N of B, then N of C; pitch ssm_ring_raw_pitch(TL)), one tile at a time.
struct ssm_ring_layout {
    int pio, o_dt, o_z, o_B, o_C, stage, o_dtu, o_ys, o_raw, total;
    __host__ __device__ ssm_ring_layout(int CH, int TL, int N, int NPAD, int io_size, int bc_size, int kind) {
        const int bcs = ssm_ring_gpitch(NPAD) * TL * 4;  // bytes of one of B, C in a stage
        pio = TL * io_size + 16;
        o_dt = CH * pio;
        o_z = 2 * CH * pio;
        o_B = ssm_ring_nio(kind) * CH * pio;
        o_C = o_B + bcs;
        stage = o_B + ssm_ring_nbc(kind) * bcs;
        o_dtu = 2 * stage;
        o_ys = o_dtu + CH * (2 * TL + 4) * 4;
        o_raw = o_ys + (kind == SSM_RING_FWD ? CH * (TL + 4) * 4 : 0);
        total = o_raw + (bc_size == 2 ? ssm_ring_nbc(kind) * N * ssm_ring_raw_pitch(TL) : 0);
    }
};

// 16 bytes (ssm_v16, as the cp.async fallback moves them) in one 128-bit access.
__device__ __forceinline__ ssm_v16 ssm_ld16(const void* p) { return *reinterpret_cast<const ssm_v16*>(p); }
__device__ __forceinline__ void ssm_st16(void* p, const ssm_v16& q) { *reinterpret_cast<ssm_v16*>(p) = q; }
// 16 bytes of 4 floats added to the 4 floats at p (p 16-byte aligned).
__device__ __forceinline__ void ssm_add16f(void* p, const ssm_v16& q) {
    ssm_v16 a = ssm_ld16(p);
    float* const fa = reinterpret_cast<float*>(&a);
    const float* const fq = reinterpret_cast<const float*>(&q);
#pragma unroll
    for (int k = 0; k < 4; ++k) fa[k] += fq[k];
    ssm_st16(p, a);
}

// Widen the 16 / sizeof(T) values of T in q to float.
__device__ __forceinline__ void ssm_widen16(float (&r)[4], const float*, const ssm_v16& q) {
#pragma unroll
    for (int i = 0; i < 4; ++i) r[i] = ssm_bits_to_float(q.w[i]);
}
__device__ __forceinline__ void ssm_widen16(float (&r)[8], const ssm_bf16*, const ssm_v16& q) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        r[2 * i] = ssm_bits_to_float(q.w[i] << 16);
        r[2 * i + 1] = ssm_bits_to_float(q.w[i] & 0xffff0000u);
    }
}
__device__ __forceinline__ void ssm_widen16(float (&r)[8], const ssm_half*, const ssm_v16& q) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        ssm_half a, b;
        a.bits = (unsigned short)(q.w[i] & 0xffffu);
        b.bits = (unsigned short)(q.w[i] >> 16);
        r[2 * i] = ssm_load(a);
        r[2 * i + 1] = ssm_load(b);
    }
}

// Narrow 16 / sizeof(T) floats to T and store them with one 16-byte access.
__device__ __forceinline__ void ssm_narrow16(float* p, const float (&v)[4]) { ssm_st4(p, v); }
template <typename T>
__device__ __forceinline__ void ssm_narrow16(T* p, const float (&v)[8]) {
    T tmp[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) ssm_store(&tmp[i], v[i]);
    ssm_v16 q;
#pragma unroll
    for (int i = 0; i < 4; ++i) q.w[i] = (unsigned)tmp[2 * i].bits | ((unsigned)tmp[2 * i + 1].bits << 16);
    ssm_st16(p, q);
}

// The tiles of a segment [t, end), in order: up to TL steps each, never across
// a multiple of `bound` steps from the segment's start (a chunk's end, or with
// SSM_CKPT_INSIDE only the segment's). Tracked without 64-bit divisions (calls in
// SASS, around which ptxas spilled). ssm_ring_rtiles: last to first.
struct ssm_ring_tiles {
    ssm_i64 t, end, bound, bound_end;
    int TL, tl;  // tl: steps of the tile at t (0 past the end)
    __device__ __forceinline__ ssm_ring_tiles(ssm_i64 t_begin, ssm_i64 t_end, ssm_i64 bound_, int TL_)
        : t(t_begin), end(t_end), bound(bound_), TL(TL_) {
        bound_end = (t_begin + bound) < end ? (t_begin + bound) : end;
        tl = len();
    }
    __device__ __forceinline__ int len() const {
        return t < end ? (int)((bound_end - t) < TL ? (bound_end - t) : TL) : 0;
    }
    __device__ __forceinline__ void next() {
        t += tl;
        if (t == bound_end) bound_end = (t + bound) < end ? (t + bound) : end;
        tl = len();
    }
};

// The tiles of a segment [begin, end) last to first: [end - TL, end), [end - 2 TL,
// end - TL), ..., the first one shorter if TL does not divide the segment (so every
// tile starts on the granule when begin, end and TL are on it). tl = 0 past the start.
struct ssm_ring_rtiles {
    ssm_i64 t, begin;
    int TL, tl;
    __device__ __forceinline__ ssm_ring_rtiles(ssm_i64 t_begin, ssm_i64 t_end, int TL_)
        : t(t_end), begin(t_begin), TL(TL_) { next(); }
    __device__ __forceinline__ void next() {
        tl = (t - begin) < TL ? (int)(t - begin) : TL;
        t -= tl;
    }
};

// Pieces tid, tid + nthr, ... of rows of ppr pieces each, as (row, piece)
// pairs, walked without divisions after the first: ssm_pieces w(...);
// while (w.r < rows) { ...; w.next(); }
struct ssm_pieces {
    int r, k, rstep, kstep, ppr;
    __device__ __forceinline__ ssm_pieces(int ppr_, int tid, int nthr) : ppr(ppr_) {
        rstep = nthr / ppr;
        kstep = nthr - rstep * ppr;
        r = tid / ppr;
        k = tid - r * ppr;
    }
    __device__ __forceinline__ void next() {
        r += rstep;
        k += kstep;
        if (k >= ppr) { k -= ppr; ++r; }
    }
};

// The ring forward kernels' walks over a tile's 16-byte pieces, one per kind of row: a
// thread's pieces of the CH rows of u, delta (and z), and of the N rows of B (and C: the
// same pieces of its rows). They depend on the full tile (TL) only, so they are built once
// per kernel and every tile copies them (the divisions happen once); a shorter tile skips
// the pieces past its end.
//   io: rows of TL sizeof(IO) / 16 pieces, piece tid + j nthr, row-major.
//   bc: float B and C as io; 16-bit, octets of rows: walk row o, piece e of rows of 8 ppr
//       pieces is piece e / 8 of row 8 o + e % 8. The 8 lanes of a quarter warp move the
//       same piece of 8 consecutive rows, so their widened 16-byte stores fill 8
//       consecutive slots of the [step / 4][n][4] stage (consecutive pieces of one row are 2
//       groups, 288 bytes at N = 16, apart: 4-way conflicts), their rows of `raw` start in
//       different banks, and a warp still reads 64 contiguous bytes of each of its 8 global
//       rows. (Float B and C, copied straight into the stage with few conflicts, stay row by
//       row, and so do the ring backward's pieces: octets measured slower there, NOTES.md
//       version 15.)
struct ssm_ring_walks {
    ssm_pieces io, bc;
    template <typename IO, typename BC>
    __device__ __forceinline__ static ssm_ring_walks make(int TL, int tid, int nthr) {
        const int oct = sizeof(BC) == 2 ? 8 : 1;
        return {ssm_pieces(TL * (int)sizeof(IO) / 16, tid, nthr), ssm_pieces(oct * TL * (int)sizeof(BC) / 16, tid, nthr)};
    }
};

// Packed sequences in the ring kernels (`restart`: a byte per batch row and step, nonzero
// where a sequence starts after the row's first step; nullptr: none). The decay into such a
// step is zero. The kernels stage each step's dt for its exponent apart from dt u, so the
// staging puts SSM_RESTART_DT there: exp2(SSM_RESTART_DT A log2(e)) is 0 for every A <=
// -2^-120 (the host sends no other A), and a segment's sum of dt that takes it makes the
// carry's decay across the segment 0 as well. Finite, so that the backward's dA term
// g a h dt (a = 0) stays 0. The backward's du, which needs the true dt, recomputes it there.
#define SSM_RESTART_DT 3.402823466e38f

// SSM_RING_RESTARTS=0 (an A/B switch, by SSMKIT_CUDA_DEFINES) compiles the ring kernels
// without the restarts' code: the plain path as it was before them, to time against. The
// host must then send no packed sequences to run in place.
#ifndef SSM_RING_RESTARTS
#define SSM_RING_RESTARTS 1
#endif

// {dt, x} pairs of V steps (pr[2 j] the dt of step j) with SSM_RESTART_DT at the restarts
// among them; flags: the restart bytes of those steps (V = 4 or 8, V-byte aligned).
template <int V>
__device__ __forceinline__ void ssm_restart_dts(float (&pr)[2 * V], const unsigned char* flags) {
    static_assert(V == 4 || V == 8, "4 or 8 steps");
    unsigned long long bits;
    if constexpr (V == 4) bits = *reinterpret_cast<const unsigned*>(flags);
    else bits = *reinterpret_cast<const unsigned long long*>(flags);
#pragma unroll
    for (int j = 0; j < V; ++j)
        if ((bits >> (8 * j)) & 0xffu) pr[2 * j] = SSM_RESTART_DT;
}

// f(n, k) for this thread's pieces (walk w, as ssm_ring_walks::bc) of a tile's N rows of B or
// C, pbc pieces a row.
template <typename BC, typename F>
__device__ __forceinline__ void ssm_ring_for_bc(ssm_pieces w, int N, int pbc, F&& f) {
    if constexpr (sizeof(BC) == 2) {
#pragma unroll 1
        for (; 8 * w.r < N; w.next()) {
            const int n = 8 * w.r + (w.k & 7), k = w.k >> 3;
            if (n < N && k < pbc) f(n, k);
        }
    } else {
#pragma unroll 1
        for (; w.r < N; w.next())
            if (w.k < pbc) f(w.r, w.k);
    }
}

// The ring kernels' copy of 16-byte piece k of row r of a tile's B (r < N) or C
// (r - N), from step t of its global row: float, straight into its [step / 4][n][4]
// place in stage st (B at byte o_B, C at o_C); 16-bit, as stored into row r of `raw`
// (pitch ssm_ring_raw_pitch(TL)) for the widening below.
template <typename BC>
__device__ __forceinline__ void ssm_ring_copy_bc_piece(unsigned char* st, unsigned char* raw, int o_B, int o_C,
                                                       const BC* Bg, const BC* Cg, ssm_i64 L, ssm_i64 t, int N,
                                                       int NPAD, int TL, int r, int k) {
    const BC* const row = (r < N ? Bg + (ssm_i64)r * L : Cg + (ssm_i64)(r - N) * L) + t;
    unsigned char* dst;
    if constexpr (sizeof(BC) == 4)
        dst = st + (r < N ? o_B : o_C) + ssm_ring_bc_at(NPAD, k, r < N ? r : r - N) * 4;
    else
        dst = raw + r * ssm_ring_raw_pitch(TL) + 16 * k;
    ssm_cp_async<16>(dst, reinterpret_cast<const unsigned char*>(row) + 16 * k);
}

// 16-bit B and C: widen piece k of row r of `raw` (copied there by this thread, after
// its ssm_cp_wait_all) to float, into its [step / 4][n][4] places in stage st.
template <typename BC>
__device__ __forceinline__ void ssm_ring_widen_piece(unsigned char* st, const unsigned char* raw, int o_B, int o_C,
                                                     int N, int NPAD, int TL, int r, int k) {
    float f[8];
    ssm_widen16(f, (const BC*)nullptr, ssm_ld16(raw + r * ssm_ring_raw_pitch(TL) + 16 * k));
    float* const dst = reinterpret_cast<float*>(st + (r < N ? o_B : o_C)) + ssm_ring_bc_at(NPAD, 2 * k, r < N ? r : r - N);
    ssm_st4(dst, f);
    ssm_st4(dst + ssm_ring_gpitch(NPAD) * 4, f + 4);  // the next group
}

// Issue the cp.async copies of the tile [t, t + tl) (none when tl <= 0) and
// commit them as one group: into stage st, the rows of u, delta and (KIND not
// SSM_RING_SUM, has_z) z (row r of each at row0 + r L in global memory); B and
// (SSM_RING_FWD) C in float straight into their [step / 4][n][4] places, or,
// 16-bit, as stored into the rows of `raw` (pitch ssm_ring_raw_pitch(TL); B's N rows,
// then C's), for ssm_ring_widen to place. 16-byte pieces throughout.
template <typename IO, typename BC, int KIND>
__device__ __forceinline__ void ssm_ring_copy(unsigned char* st, unsigned char* raw, const ssm_ring_layout& lay,
                                              const ssm_ring_walks& walks, const IO* u, const IO* delta,
                                              const IO* z, const BC* Bg, const BC* Cg, ssm_i64 row0, ssm_i64 L,
                                              int CH, int N, int NPAD, int TL, ssm_i64 t, int tl, bool has_z) {
    if (tl > 0) {
        // u, delta and z: one walk, the three rows' pieces at the same offsets, which
        // advance by additions (go: bytes into the rows, so: into the stage)
        const int pio = tl * (int)sizeof(IO) / 16;
        const unsigned char* const gu = reinterpret_cast<const unsigned char*>(u + row0 + t);
        const unsigned char* const gd = reinterpret_cast<const unsigned char*>(delta + row0 + t);
        const unsigned char* const gz = reinterpret_cast<const unsigned char*>(z + row0 + t);
        const bool with_z = ssm_ring_nio(KIND) > 2 && has_z;
        ssm_pieces w = walks.io;
        const ssm_i64 Lb = L * (ssm_i64)sizeof(IO);
        const ssm_i64 gstep = w.rstep * Lb + 16 * w.kstep, gwrap = Lb - 16 * w.ppr;
        const int sstep = w.rstep * lay.pio + 16 * w.kstep, swrap = lay.pio - 16 * w.ppr;
        ssm_i64 go = w.r * Lb + 16 * w.k;
        int so = w.r * lay.pio + 16 * w.k;
#pragma unroll 1
        while (w.r < CH) {
            if (w.k < pio) {
                ssm_cp_async<16>(st + so, gu + go);
                ssm_cp_async<16>(st + lay.o_dt + so, gd + go);
                if (with_z) ssm_cp_async<16>(st + lay.o_z + so, gz + go);
            }
            w.r += w.rstep;  // (ssm_pieces::next, the offsets along)
            w.k += w.kstep;
            go += gstep;
            so += sstep;
            if (w.k >= w.ppr) {
                w.k -= w.ppr;
                ++w.r;
                go += gwrap;
                so += swrap;
            }
        }
        // B and C: piece k of row n of each (the pair's addresses together: calling
        // ssm_ring_copy_bc_piece, the ring backward's, twice took ~20 more instructions)
        const BC* const gB = Bg + t;
        const BC* const gC = Cg + t;
        ssm_ring_for_bc<BC>(walks.bc, N, tl * (int)sizeof(BC) / 16, [&](int n, int k) {
            const ssm_i64 e = (ssm_i64)n * L + k * (16 / (int)sizeof(BC));
            unsigned char* dst = sizeof(BC) == 4 ? st + lay.o_B + ssm_ring_bc_at(NPAD, k, n) * 4
                                                 : raw + n * ssm_ring_raw_pitch(TL) + 16 * k;
            ssm_cp_async<16>(dst, gB + e);
            if (ssm_ring_nbc(KIND) > 1) {
                dst += sizeof(BC) == 4 ? lay.o_C - lay.o_B : N * ssm_ring_raw_pitch(TL);
                ssm_cp_async<16>(dst, gC + e);
            }
        });
    }
    ssm_cp_commit();
}

// 16-bit B and C: widen the pieces this thread copied into `raw` (after its
// ssm_cp_wait_all) to float, into their [step / 4][n][4] places in stage st.
template <typename BC, int KIND>
__device__ __forceinline__ void ssm_ring_widen(unsigned char* st, const unsigned char* raw,
                                               const ssm_ring_layout& lay, const ssm_ring_walks& walks, int N,
                                               int NPAD, int TL, int tl) {
    if constexpr (sizeof(BC) == 2) {
        ssm_ring_for_bc<BC>(walks.bc, N, tl * 2 / 16, [&](int n, int k) {
            ssm_ring_widen_piece<BC>(st, raw, lay.o_B, lay.o_C, N, NPAD, TL, n, k);
            if (ssm_ring_nbc(KIND) > 1) ssm_ring_widen_piece<BC>(st, raw, lay.o_B, lay.o_C, N, NPAD, TL, N + n, k);
        });
    }
}

// One block of the ring scan: NG groups of 4 steps of one channel, this
// lane's NPT states (h, A2 = A log2 e); then the block's output sums reduce-
// scattered over the channel's NSPLIT lanes into its y row (not SUM), or dt
// added to sdt (SUM). drow: {dt, dt u} pairs; Bq, Cq: this lane's states of
// the first group ([g][slot][4], ssm_ring_gpitch(NPT NSPLIT) slots per group); all four pointers
// are moved past the block.
template <int NG, int NPT, int NSPLIT, bool SUM>
__device__ __forceinline__ void ssm_ring_block(const float*& drow, const float*& Bq, const float*& Cq,
                                               float*& yrow, float (&h)[NPT], const float (&A2)[NPT], float& sdt,
                                               int s, unsigned wmask) {
    typedef ssm_math<float> M;
    constexpr int S = 4 * NG, NPG = ssm_ring_gpitch(NPT * NSPLIT);
    float acc[S];
#pragma unroll
    for (int j = 0; j < S; ++j) acc[j] = 0.0f;
#pragma unroll
    for (int q = 0; q < NG; ++q) {
        float pr[8];
        ssm_ld4(pr, drow + 8 * q);
        ssm_ld4(pr + 4, drow + 8 * q + 4);
#pragma unroll
        for (int k = 0; k < NPT; ++k) {
            float bv[4], cv[4];
            ssm_ld4(bv, Bq + (q * NPG + k) * 4);
            if constexpr (!SUM) ssm_ld4(cv, Cq + (q * NPG + k) * 4);
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                h[k] = M::decay(pr[2 * j] * A2[k]) * h[k] + bv[j] * pr[2 * j + 1];
                if constexpr (!SUM) acc[4 * q + j] += cv[j] * h[k];
            }
        }
        if constexpr (SUM) sdt += (pr[0] + pr[2]) + (pr[4] + pr[6]);
    }
    drow += 2 * S;
    Bq += NPG * S;
    Cq += NPG * S;
    if constexpr (!SUM) {
        int off = 0;
        bool own = true;
        ssm_reduce_scatter<S, NSPLIT / 2>::run(acc, s, wmask, off, own);
        constexpr int R = ssm_rs_len(S, NSPLIT / 2);
        if (own) {
            if constexpr (R % 4 == 0) {
#pragma unroll
                for (int j = 0; j < R; j += 4) ssm_st4(yrow + off + j, acc + j);
            } else {
#pragma unroll
                for (int j = 0; j < R; ++j) yrow[off + j] = acc[j];
            }
        }
        yrow += S;
    }
}

// One block of the backward summary's scan (SSM_RING_BSUM), time reversed: the NG
// groups of 4 steps at drow ({dt, dy} pairs) and Cq (this lane's states of C, laid out
// as Bq above), last step first: g <- (g + C dy) exp(dt A) for this lane's NPT states
// (the order and arithmetic of ssm_scan_bwd_sum); dt added to sdt.
template <int NG, int NPT, int NSPLIT>
__device__ __forceinline__ void ssm_ring_block_rev(const float* drow, const float* Cq, float (&g)[NPT],
                                                   const float (&A2)[NPT], float& sdt) {
    typedef ssm_math<float> M;
    constexpr int NPG = ssm_ring_gpitch(NPT * NSPLIT);
#pragma unroll
    for (int q = NG - 1; q >= 0; --q) {
        float pr[8];
        ssm_ld4(pr, drow + 8 * q);
        ssm_ld4(pr + 4, drow + 8 * q + 4);
#pragma unroll
        for (int k = 0; k < NPT; ++k) {
            float cv[4];
            ssm_ld4(cv, Cq + (q * NPG + k) * 4);
#pragma unroll
            for (int j = 3; j >= 0; --j) g[k] = (g[k] + cv[j] * pr[2 * j + 1]) * M::decay(pr[2 * j] * A2[k]);
        }
        sdt += (pr[6] + pr[4]) + (pr[2] + pr[0]);
    }
}

// At step t of the scan, if t starts the next chunk (ck_next), this lane's NPT states
// of the state entering it go to dst (then moved to the next chunk's).
template <int NPT>
__device__ __forceinline__ void ssm_ring_ckpt(float*& dst, ssm_i64 dst_step, const float (&h)[NPT], int t,
                                              int& ck_next, int chunk, int nk) {
    if (t == ck_next) {
#pragma unroll
        for (int k = 0; k < NPT; ++k)
            if (k < nk) dst[k] = h[k];
        ck_next += chunk;
        dst += dst_step;
    }
}

// The ring kernels' states n >= N of B and C stay zero in both stages (the copies
// write n < N only): zeroed once, for B and, with nbc = 2, C.
__device__ __forceinline__ void ssm_ring_zero_pad(unsigned char* sm, int stage, int o_B, int o_C, int nbc, int TL,
                                                  int N, int NPAD, int tid, int nthr) {
    if (N < NPAD) {
        const int per = nbc * (TL / 4) * (NPAD - N);  // float4 slots per stage
        for (int i = tid; i < 2 * per; i += nthr) {
            const int st = i / per, r = i - st * per;
            const int which = r / ((TL / 4) * (NPAD - N)), r2 = r - which * ((TL / 4) * (NPAD - N));
            const int g = r2 / (NPAD - N), n = N + r2 % (NPAD - N);
            const float zero[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            ssm_st4(reinterpret_cast<float*>(sm + st * stage + (which ? o_C : o_B)) + ssm_ring_bc_at(NPAD, g, n), zero);
        }
    }
}

// Tiles of [t_begin, t_end) in the order a ring kernel walks them (REV: last to first,
// ignoring chunks, which only the forward's checkpoints follow).
template <bool REV>
__device__ __forceinline__ auto ssm_ring_walk(ssm_i64 t_begin, ssm_i64 t_end, ssm_i64 bound, int TL) {
    if constexpr (REV) return ssm_ring_rtiles(t_begin, t_end, TL);
    else return ssm_ring_tiles(t_begin, t_end, bound, TL);
}

template <typename IO, typename BC, int NPT, int NSPLIT, int KIND, typename CT = float>
__device__ __forceinline__ void ssm_fwd_ring_body(SSM_FWD_PARAMS) {
    constexpr bool SUM = KIND != SSM_RING_FWD;  // a summary pass: no y, C only as BSUM's B
    constexpr bool REV = KIND == SSM_RING_BSUM;
    static_assert(ssm_same<CT, float>::value && ssm_same<CT, typename ssm_compute_of<IO>::type>::value,
                  "float compute only");
    static_assert(ssm_same<BC, IO>::value || ssm_same<BC, float>::value, "BC must be IO or float");
    // 4 states per lane, NSPLIT lanes per channel: N <= 32 (the backward's summary), N <= 128
    // (the forward and its summary: one channel per warp at NSPLIT 32); or 8 states per lane
    // on up to 16 lanes (the forward and its summary, N <= 128; the backward's summary, N <= 32)
    static_assert((NPT == 4 && (NSPLIT == 1 || NSPLIT == 2 || NSPLIT == 4 || NSPLIT == 8 ||
                                (KIND != SSM_RING_BSUM && (NSPLIT == 16 || NSPLIT == 32)))) ||
                      (NPT == 8 && (NSPLIT == 1 || NSPLIT == 2 || NSPLIT == 4 ||
                                    (KIND != SSM_RING_BSUM && (NSPLIT == 8 || NSPLIT == 16)))),
                  "4 or 8 states per thread: N <= 32, or the forward with N <= 128");
    typedef ssm_math<float> M;
    constexpr int NPAD = NPT * NSPLIT;
    constexpr int Q = ssm_ring_quantum<IO, BC>();
    constexpr int CPW = 32 / NSPLIT;       // channels per warp
    constexpr int VIO = 16 / sizeof(IO);   // steps per 16-byte piece of IO

    const int nthr = CH * NSPLIT;  // == blockDim.x
    const int tid = threadIdx.x;
    const int c = tid / NSPLIT, s = tid % NSPLIT;
    const int lane = tid & 31;
    const int cw0 = (tid >> 5) * CPW;                                      // the warp's first channel,
    const int cwn = (CH - cw0) < CPW ? (CH - cw0) : CPW;                   // its channels
    const int wl = (nthr - (tid & ~31)) < 32 ? (nthr - (tid & ~31)) : 32;  // and lanes
    const ssm_block_place place(batch, dim, CH, seg0);
    const int seg = place.seg, b = place.b, d0 = place.d0;
    const int d = d0 + c;
    const unsigned wmask = ssm_warp_mask(nthr);
    const ssm_i64 t_begin = (ssm_i64)seg * seg_len;
    // (a summary's segment may start past L: the backward's, in sub-segments of a short last
    // segment; it is empty, its summary the identity)
    const ssm_i64 t_end = (t_begin + seg_len) < L ? (t_begin + seg_len) : (L > t_begin ? L : t_begin);

    const ssm_ring_layout lay(CH, TL, N, NPAD, sizeof(IO), sizeof(BC), KIND);
    // (Steps in 32 bits below: a 64-bit division or remainder is a call in SASS.)
    if (lay.total > (int)ssm_dynamic_smem_bytes() || (int)blockDim.x != nthr || TL % Q != 0 ||
        L > 0x7fffffffLL || (int)L % Q != 0 || (int)chunk % Q != 0 || dim % CH != 0 || N > NPAD ||
        GB <= 0 || dim % GB != 0 || (dim / GB) % CH != 0 || GC <= 0 || dim % GC != 0 ||
        (dim / GC) % CH != 0 || seg < 0 || seg >= nseg || (int)seg_len % (int)chunk != 0 ||
        (!SUM && t_begin >= L) || (nseg > 1 && seg_h == nullptr) || (SUM && seg_dt == nullptr))
        __trap();
    extern __shared__ ssm_f4 ssm_smem[];  // 16-byte aligned
    unsigned char* const sm = reinterpret_cast<unsigned char*>(ssm_smem);
    float* const dtu = reinterpret_cast<float*>(sm + lay.o_dtu);  // row c: pitch 2 TL + 4
    float* const ys = reinterpret_cast<float*>(sm + lay.o_ys);    // row c: pitch TL + 4

    const bool has_D = flags & SSM_HAS_D;
    const bool has_z = flags & SSM_HAS_Z;
    const bool has_bias = flags & SSM_HAS_BIAS;
    const bool softplus = flags & SSM_SOFTPLUS;
    const bool save_ckpt = flags & SSM_SAVE_CKPT;
    // The scan writes the state entering each chunk before the 16-step block (or 4-step
    // group) that starts it. Tiles end at the chunks' ends; with SSM_CKPT_INSIDE (chunks
    // shorter than a tile) they ignore them, and chunks and tiles are whole blocks.
    // (Segments start on chunk boundaries; L < 2^31: the division is in 32 bits.)
    const bool inside = flags & SSM_CKPT_INSIDE;
    if (inside && ((int)chunk % 16 != 0 || TL % 16 != 0)) __trap();
    const bool ck = !SUM && save_ckpt;
    int ck_next = (int)t_begin;  // the next chunk's first step, and where its state goes
    const ssm_i64 ci0 = (unsigned)t_begin / (unsigned)chunk;
    float* ck_dst = ck ? ckpt + ((ci0 * batch + b) * dim + d) * N + s * NPT : nullptr;
    const int ck_n = N - s * NPT;  // states of this lane (< NPT in the last lane of a small N)

    ssm_ring_zero_pad(sm, lay.stage, lay.o_B, lay.o_C, ssm_ring_nbc(KIND), TL, N, NPAD, tid, nthr);

    float A2[NPT], h[NPT];
    ssm_fwd_start<float, NPT, SUM>(A2, h, A, seg_h, h0, flags & SSM_HAS_H0, batch, dim, N, nseg, seg, b, d, s);
    float sdt = 0.0f;  // SUM: sum of dt over the segment (every lane of a channel)

    const ssm_i64 row0 = ((ssm_i64)b * dim + d0) * L;  // u, delta, z, y: row of channel d0
    const BC* const Cg = C + ((ssm_i64)b * GC + d0 / (dim / GC)) * N * L;
    // (BSUM stages C where the others stage B, and reads no B)
    const BC* const Bg = REV ? Cg : B + ((ssm_i64)b * GB + d0 / (dim / GB)) * N * L;
    unsigned char* const raw = sm + lay.o_raw;  // 16-bit B and C on their way
    auto cur = ssm_ring_walk<REV>(t_begin, t_end, inside ? seg_len : chunk, TL);
    const ssm_ring_walks walks = ssm_ring_walks::make<IO, BC>(TL, tid, nthr);
    // The warp's pieces of VIO steps, lane by lane: staging, consecutive lanes on
    // consecutive channels (walk rows: pieces of a row; its pieces: the channels);
    // output, consecutive lanes along a channel's row (rows: channels). Full tiles' walks.
    const ssm_pieces stage_walk(cwn, lane, wl), out_walk(TL / VIO, lane, wl);
    // Each channel's bias in the padding after its {dt, dt u} row, and (not SUM) its D after
    // its output row: the staging and output loops read them there (visible after the first
    // tile's barrier), not from global memory for every piece of every tile.
    if (tid < CH) {
        dtu[tid * (2 * TL + 4) + 2 * TL] = has_bias ? dbias[d0 + tid] : 0.0f;
        if constexpr (!SUM) ys[tid * (TL + 4) + TL] = has_D ? D[d0 + tid] : 0.0f;
    }
    ssm_ring_copy<IO, BC, KIND>(sm, raw, lay, walks, u, delta, z, Bg, Cg, row0, L, CH, N, NPAD, TL, cur.t, cur.tl,
                                has_z);
    ssm_cp_wait_all();
    ssm_ring_widen<BC, KIND>(sm, raw, lay, walks, N, NPAD, TL, cur.tl);

    int stage = 0;
#pragma unroll 1
    while (cur.tl > 0) {
        const ssm_i64 t0 = cur.t;
        const int tl = cur.tl;
        auto nxt = cur;
        nxt.next();
        const ssm_i64 tn = nxt.t;
        const int tln = nxt.tl;
        ssm_cp_wait_all();  // this thread's copies of this tile have landed,
        __syncthreads();    // everyone's have, and B, C are stored; the other stage is free
        ssm_ring_copy<IO, BC, KIND>(sm + (stage ^ 1) * lay.stage, raw, lay, walks, u, delta, z, Bg, Cg, row0, L,
                                    CH, N, NPAD, TL, tn, tln, has_z);
        const unsigned char* const st = sm + stage * lay.stage;

        // dt and dt u (BSUM: dt and dy = dout silu(z)) of the warp's channels, VIO steps
        // per lane at a time; consecutive lanes on consecutive channels, so that a quarter
        // warp's stores (and loads) fall on rows four banks apart, not on pieces of one row
        // 32 or 64 bytes apart.
        {
            const int ppr = tl / VIO;
#pragma unroll 1
            for (ssm_pieces w = stage_walk; w.r < ppr; w.next()) {
                const int t = w.r * VIO, cc = cw0 + w.k;
                float uu[VIO], dd[VIO];
                ssm_widen16(uu, (const IO*)nullptr, ssm_ld16(st + cc * lay.pio + t * sizeof(IO)));
                ssm_widen16(dd, (const IO*)nullptr, ssm_ld16(st + lay.o_dt + cc * lay.pio + t * sizeof(IO)));
                const float bias = dtu[cc * (2 * TL + 4) + 2 * TL];
                if (REV && has_z) {
                    float zz[VIO];
                    ssm_widen16(zz, (const IO*)nullptr, ssm_ld16(st + lay.o_z + cc * lay.pio + t * sizeof(IO)));
#pragma unroll
                    for (int j = 0; j < VIO; ++j) uu[j] *= zz[j] * M::sigmoid_fast(zz[j]);
                }
                float pr[2 * VIO];
#pragma unroll
                for (int j = 0; j < VIO; ++j) {
                    float dt = dd[j] + bias;
                    if (softplus) dt = M::softplus_fast(dt);
                    pr[2 * j] = dt;
                    pr[2 * j + 1] = REV ? uu[j] : dt * uu[j];
                }
                if (SSM_RING_RESTARTS && restart != nullptr) ssm_restart_dts<VIO>(pr, restart + (ssm_i64)b * L + t0 + t);
                float* const dst = dtu + cc * (2 * TL + 4) + 2 * t;
#pragma unroll
                for (int j = 0; j < 2 * VIO; j += 4) ssm_st4(dst + j, pr + j);
            }
        }
        __syncwarp(wmask);

        // The scan, in blocks of NG groups of 4 steps (B and C of group g, state n
        // at [g][n][4]): 16 steps at a time, then groups of 4 to the tile's end.
        // The block's output sums are reduce-scattered once, so the shuffles'
        // latency is paid once per 16 steps and overlaps the next block's exps.
        if constexpr (REV) {
            // Last step first: the groups past the tile's last whole block, then its blocks.
            const float* const drow = dtu + c * (2 * TL + 4);
            const float* const Cq = reinterpret_cast<const float*>(st + lay.o_B) + ssm_ring_bc_at(NPAD, 0, s * NPT);
            constexpr int NPG = ssm_ring_gpitch(NPAD);
            int g0 = tl;
#pragma unroll 1
            while (g0 % 16 != 0) {
                g0 -= 4;
                ssm_ring_block_rev<1, NPT, NSPLIT>(drow + 2 * g0, Cq + g0 * NPG, h, A2, sdt);
            }
#pragma unroll 1
            while (g0 > 0) {
                g0 -= 16;
                ssm_ring_block_rev<4, NPT, NSPLIT>(drow + 2 * g0, Cq + g0 * NPG, h, A2, sdt);
            }
        } else {
            const float* drow = dtu + c * (2 * TL + 4);
            const float* Bq = reinterpret_cast<const float*>(st + lay.o_B) + ssm_ring_bc_at(NPAD, 0, s * NPT);
            const float* Cq = reinterpret_cast<const float*>(st + lay.o_C) + ssm_ring_bc_at(NPAD, 0, s * NPT);
            float* yrow = ys + c * (TL + 4);
            int g0 = 0;
#pragma unroll 1
            for (; g0 + 16 <= tl; g0 += 16) {
                if (ck) ssm_ring_ckpt(ck_dst, (ssm_i64)batch * dim * N, h, (int)t0 + g0, ck_next, (int)chunk, ck_n);
                ssm_ring_block<4, NPT, NSPLIT, SUM>(drow, Bq, Cq, yrow, h, A2, sdt, s, wmask);
            }
            // (a chunk may start at the tail's first group only: at a tile's start, or a
            // whole number of blocks into it)
            if (ck && g0 < tl) ssm_ring_ckpt(ck_dst, (ssm_i64)batch * dim * N, h, (int)t0 + g0, ck_next, (int)chunk, ck_n);
#pragma unroll 1
            for (; g0 < tl; g0 += 4) ssm_ring_block<1, NPT, NSPLIT, SUM>(drow, Bq, Cq, yrow, h, A2, sdt, s, wmask);
        }

        if constexpr (!SUM) {
            __syncwarp(wmask);
            // y = (sum + D u) silu(z), VIO steps per lane at a time.
            const int ppr = tl / VIO;
#pragma unroll 1
            for (ssm_pieces w = out_walk; w.r < cwn; w.next()) {
                if (w.k >= ppr) continue;
                const int t = w.k * VIO, cc = cw0 + w.r;
                float yv[VIO], uu[VIO];
#pragma unroll
                for (int j = 0; j < VIO; j += 4) ssm_ld4(yv + j, ys + cc * (TL + 4) + t + j);
                ssm_widen16(uu, (const IO*)nullptr, ssm_ld16(st + cc * lay.pio + t * sizeof(IO)));
                const float Dd = ys[cc * (TL + 4) + TL];
#pragma unroll
                for (int j = 0; j < VIO; ++j) yv[j] += Dd * uu[j];
                if (has_z) {
                    float zz[VIO];
                    ssm_widen16(zz, (const IO*)nullptr, ssm_ld16(st + lay.o_z + cc * lay.pio + t * sizeof(IO)));
#pragma unroll
                    for (int j = 0; j < VIO; ++j) yv[j] *= zz[j] * M::sigmoid_fast(zz[j]);
                }
                ssm_narrow16(y + row0 + (ssm_i64)cc * L + t0 + t, yv);
            }
        }
        // 16-bit B and C of the next tile widened into the other stage (whose last
        // readers, the previous tile's scan, passed this tile's barrier).
        if constexpr (sizeof(BC) == 2) {
            ssm_cp_wait_all();
            ssm_ring_widen<BC, KIND>(sm + (stage ^ 1) * lay.stage, raw, lay, walks, N, NPAD, TL, tln);
        }
        cur = nxt;
        stage ^= 1;
    }
    ssm_cp_wait_all();  // the empty last group
    ssm_fwd_end<float, NPT, SUM>(h, sdt, hfinal, seg_h, seg_dt, batch, dim, N, nseg, seg, b, d, s);
}

template <typename IO, typename BC, int NPT, int NSPLIT, typename CT = float>
__global__ void __launch_bounds__(SSM_FWD_MAX_THREADS) ssm_scan_fwd_ring(SSM_FWD_PARAMS) {
    ssm_fwd_ring_body<IO, BC, NPT, NSPLIT, SSM_RING_FWD>(SSM_FWD_ARGS);
}

// The same in blocks of up to SSM_RING_FWD_WIDE_THREADS threads, for large N: one block of 16
// warps per SM shares each B and C tile among the channels of two blocks of 8 (at N 128 the
// tiles' copies are most of the ring forward's L2 traffic). Its own kernel, so that the
// launch bound does not change how ptxas builds the 256-thread one. 128 registers either way
// at 4 states per lane; at 8 (about 150 registers) blocks of up to 384 threads, 12 warps.
#define SSM_RING_FWD_WIDE_THREADS 512
#define SSM_RING_FWD_WIDE_THREADS_NPT8 384
template <int NPT> struct ssm_ring_wide_threads {
    static constexpr int value = NPT == 8 ? SSM_RING_FWD_WIDE_THREADS_NPT8 : SSM_RING_FWD_WIDE_THREADS;
};
template <typename IO, typename BC, int NPT, int NSPLIT, typename CT = float>
__global__ void __launch_bounds__(ssm_ring_wide_threads<NPT>::value) ssm_scan_fwd_ring_wide(SSM_FWD_PARAMS) {
    ssm_fwd_ring_body<IO, BC, NPT, NSPLIT, SSM_RING_FWD>(SSM_FWD_ARGS);
}

// Resident blocks of SSM_FWD_MAX_THREADS asked of ptxas for the ring summary kernels (0: none
// asked). Left to itself ptxas gave them 79-94 registers, spilling in the 16-bit backward's;
// asked for 2 (up to 128, the planner's estimate, and their shared memory allows 2 blocks
// of 256 threads anyway) they ran 2% faster at 2x1536x32768 N 16 (NOTES.md, version 17).
#ifndef SSM_RING_SUM_MIN_BLOCKS
#define SSM_RING_SUM_MIN_BLOCKS 2
#endif
#if SSM_RING_SUM_MIN_BLOCKS > 0
#define SSM_RING_SUM_BOUNDS __launch_bounds__(SSM_FWD_MAX_THREADS, SSM_RING_SUM_MIN_BLOCKS)
#else
#define SSM_RING_SUM_BOUNDS __launch_bounds__(SSM_FWD_MAX_THREADS)
#endif

// Summary pass of a split forward through the ring (see "Time segments"):
// same parameters; z, C, D, h0, y, hfinal, ckpt unused.
template <typename IO, typename BC, int NPT, int NSPLIT, typename CT = float>
__global__ void SSM_RING_SUM_BOUNDS ssm_scan_fwd_sum_ring(SSM_FWD_PARAMS) {
    ssm_fwd_ring_body<IO, BC, NPT, NSPLIT, SSM_RING_SUM>(SSM_FWD_ARGS);
}

// Summary pass of a split backward through the ring (ssm_scan_bwd_sum's work, staged as
// the ring forward stages): per segment, its steps last to first from a zero adjoint,
// g <- (g + C_t dy_t) exp(dt_t A) with dy = dout silu(z) (dout alone without z); the
// adjoint leaving the segment's start to seg_h[seg, b, d] and its sum of dt to
// seg_dt[seg, b, d]. Parameters as ssm_scan_fwd_ring's, but u holds dout; B, D, h0, y,
// hfinal and ckpt are unused.
template <typename IO, typename BC, int NPT, int NSPLIT, typename CT = float>
__global__ void SSM_RING_SUM_BOUNDS ssm_scan_bwd_sum_ring(SSM_FWD_PARAMS) {
    ssm_fwd_ring_body<IO, BC, NPT, NSPLIT, SSM_RING_BSUM>(SSM_FWD_ARGS);
}

// Packed sequences restarting in place in the ring kernels report their rows' final states;
// the other sequences' come from here. Sequence j (batch row rows[j], steps first[j] ..
// last[j]) ends in the state after step last[j], recomputed from the checkpoint entering the
// chunk that holds that step (from zero at the sequence's first step where that is later;
// at step 0, the checkpoint: the initial state), one thread per (sequence, channel, state):
// at most a chunk of steps each, no more exponentials than one summary pass. The state goes
// to out[slot[j], d, n]. ckpt: (n_chunks, batch, dim, N) as the forward wrote it; B per step
// (batch, GB, N, L).
template <typename IO, typename BC>
__global__ void __launch_bounds__(256)
ssm_sequence_states(const IO* __restrict__ u, const IO* __restrict__ delta, const float* __restrict__ A,
                    const BC* __restrict__ B, const float* __restrict__ dbias,
                    const float* __restrict__ ckpt, const ssm_i64* __restrict__ rows,
                    const ssm_i64* __restrict__ first, const ssm_i64* __restrict__ last,
                    const ssm_i64* __restrict__ slot, float* __restrict__ out, int nseq, int batch,
                    int dim, int N, ssm_i64 L, int GB, ssm_i64 chunk, int flags) {
    typedef ssm_math<float> M;
    const bool softplus = flags & SSM_SOFTPLUS;
    const ssm_i64 total = (ssm_i64)nseq * dim * N;
    for (ssm_i64 i = (ssm_i64)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (ssm_i64)gridDim.x * blockDim.x) {
        const int n = (int)(i % N);
        const ssm_i64 jd = i / N;
        const int d = (int)(jd % dim);
        const ssm_i64 j = jd / dim;
        const ssm_i64 b = rows[j], s = first[j], e = last[j];
        const ssm_i64 c0 = (e / chunk) * chunk;  // the chunk holding the last step
        ssm_i64 t = s;
        float h = 0.0f;  // (a restart: zero before step s)
        if (c0 > s || s == 0) {
            t = c0;
            h = ckpt[(((c0 / chunk) * batch + b) * dim + d) * N + n];
        }
        const float a2 = A[(ssm_i64)d * N + n] * M::kLog2e;
        const float bias = (flags & SSM_HAS_BIAS) ? dbias[d] : 0.0f;
        const ssm_i64 row = ((ssm_i64)b * dim + d) * L;
        const BC* const Bn = B + (((ssm_i64)b * GB + d / (dim / GB)) * N + n) * L;
        for (; t <= e; ++t) {
            float dt = ssm_load(delta[row + t]) + bias;
            if (softplus) dt = M::softplus_fast(dt);
            h = M::decay(dt * a2) * h + ssm_load(Bn[t]) * (dt * ssm_load(u[row + t]));
        }
        out[(slot[j] * dim + d) * N + n] = h;
    }
}

// Carry across segments, one thread per (b, d, n), sequential over segments:
// seeds[first] = init (or 0); seeds[next] = exp(A sumdt[s]) seeds[s] + local[s].
// Forward (reverse == 0): first = 0, next = s + 1; backward: first = nseg - 1,
// next = s - 1. local, seeds: (nseg, batch, dim, N); sumdt: (nseg, batch, dim).
template <typename CT>
__global__ void __launch_bounds__(256)
ssm_seg_carry(const CT* __restrict__ A, const CT* __restrict__ init, const CT* __restrict__ local,
              const CT* __restrict__ sumdt, CT* __restrict__ seeds, int batch, int dim, int N,
              int nseg, int reverse) {
    typedef ssm_math<CT> M;
    const ssm_i64 bd_n = (ssm_i64)batch * dim;
    const ssm_i64 total = bd_n * N;
    for (ssm_i64 i = (ssm_i64)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (ssm_i64)gridDim.x * blockDim.x) {
        const ssm_i64 bd = i / N;
        const int n = (int)(i - bd * N);
        const int d = (int)(bd % dim);
        const CT a2 = A[(ssm_i64)d * N + n] * M::kLog2e;
        CT H = init != nullptr ? init[i] : CT(0);
        for (int j = 0; j < nseg; ++j) {
            const int sg = reverse ? nseg - 1 - j : j;
            seeds[(ssm_i64)sg * total + i] = H;
            if (j + 1 < nseg)
                H = M::decay(a2 * sumdt[(ssm_i64)sg * bd_n + bd]) * H + local[(ssm_i64)sg * total + i];
        }
    }
}

// ===========================================================================
// The backward's per-step dB or dC partials, one per block of channels (its
// channel tile), summed over each group's tiles: part (rows, tpg, NL) ->
// out (rows, NL), rows = batch * G, NL = N * L; the tpg partials of an element
// are added in tile order (deterministic). Each thread walks elements with the
// grid's stride; its first is found by one division, the others by steps.
// ===========================================================================
template <typename CT>
__global__ void __launch_bounds__(256)
ssm_sum_tiles(const CT* __restrict__ part, CT* __restrict__ out, int rows, int tpg, ssm_i64 NL) {
    const ssm_i64 i0 = (ssm_i64)blockIdx.x * blockDim.x + threadIdx.x;
    const ssm_i64 stride = (ssm_i64)gridDim.x * blockDim.x;
    const ssm_i64 step_r = stride / NL, step_e = stride - step_r * NL;
    ssm_i64 r = i0 / NL, e = i0 - r * NL;
    while (r < rows) {
        const CT* src = part + r * tpg * NL + e;
        CT v = 0;
#pragma unroll 8
        for (int k = 0; k < tpg; ++k) v += src[(ssm_i64)k * NL];
        out[r * NL + e] = v;
        r += step_r;
        e += step_e;
        if (e >= NL) {
            e -= NL;
            ++r;
        }
    }
}

// ===========================================================================
// Backward. Chunks are walked last to first. For each chunk:
//  pass A: from its checkpoint, run the recurrence forward over the chunk and
//          save the state entering each TL-step tile to `scratch` (each thread
//          writes and later reads only its own slots);
//  then, tiles last to first: stage the tile; from the tile's saved state run
//          forward again, keeping the state entering each TS-step sub-tile in
//          shared memory (thread-private slots); then sub-tiles last to first:
//          recompute the TS states and decays into registers and run the
//          adjoint recurrence back through them.
// Per step, sums over n (y_pre, sum g B, sum g a h A) are reduce-scattered over
// the channel's lanes and the owning lane finishes du, ddelta, dz. Per-step
// dB/dC are summed over the block's channels in shared memory (fixed order)
// and written as one partial per block; the host adds partials of one group.
// dA, dD, ddelta_bias and the (dim, N) forms of dB/dC are per-(b, d) partials
// that the host sums over the batch. No atomics: the result is deterministic.
//
// Outputs: du_out, ddelta_out, dz_out (batch, dim, L) IO; dA_part (nseg,
// batch, dim, N); dB_out / dC_out: (batch, dim/CH, N, L) when per step (the
// segments write disjoint steps), else (nseg, batch, dim, N); dD_part,
// dbias_part (nseg, batch, dim); dh0 (batch, dim, N) (if SSM_HAS_H0; written
// by segment 0). seg_g: null, or the adjoint seed of each segment (nseg,
// batch, dim, N) from ssm_seg_carry (replaces dfinal).
// scratch: gridDim.x * ceil(min(chunk, L) / TL) * blockDim.x * NPT elements.
// ===========================================================================
template <typename IO, typename BC, typename CT, int NPT, int NSPLIT, bool BV, bool CV>
__global__ void __launch_bounds__(SSM_BWD_MAX_THREADS, ssm_bwd_min_blocks<CT>::value)
ssm_scan_bwd(const IO* __restrict__ u, const IO* __restrict__ delta, const IO* __restrict__ z,
             const IO* __restrict__ dout,
             const CT* __restrict__ A, const BC* __restrict__ B, const BC* __restrict__ C,
             const CT* __restrict__ D, const CT* __restrict__ dbias,
             const CT* __restrict__ ckpt, const CT* __restrict__ dfinal,
             IO* __restrict__ du_out, IO* __restrict__ ddelta_out, IO* __restrict__ dz_out,
             CT* __restrict__ dA_part, CT* __restrict__ dB_out, CT* __restrict__ dC_out,
             CT* __restrict__ dD_part, CT* __restrict__ dbias_part, CT* __restrict__ dh0,
             CT* __restrict__ scratch,
             int batch, int dim, int N, ssm_i64 L, int GB, int GC, ssm_i64 chunk,
             int TL, int CH, int flags, const CT* __restrict__ seg_g, ssm_i64 seg_len, int nseg,
             int seg0) {
    static_assert(ssm_same<CT, typename ssm_compute_of<IO>::type>::value, "CT must be IO's compute type");
    static_assert(ssm_same<BC, IO>::value || ssm_same<BC, CT>::value, "BC must be IO or CT");
    static_assert(NPT % 4 == 0 && (NSPLIT & (NSPLIT - 1)) == 0 && NSPLIT <= 32, "bad config");
    typedef ssm_math<CT> M;
    constexpr int NPAD = NPT * NSPLIT;
    constexpr int NQ = NPAD / 4;
    constexpr int TS = ssm_bwd_substeps<CT, NPT>();
    constexpr int V = 3 * TS;                      // (y_pre, sum g B, sum g a h A2) per step
    constexpr int R = ssm_rs_len(V, NSPLIT / 2);   // values per lane after reduce-scatter
    static_assert(R % 3 == 0, "reduce-scatter must keep whole steps");

    const int nthr = CH * NSPLIT;  // == blockDim.x
    const int tid = threadIdx.x;
    const int c = tid / NSPLIT;
    const int s = tid % NSPLIT;
    const int ntile = dim / CH;
    const int rows = batch * ntile;  // blocks per segment
    const int seg = seg0 + (int)(blockIdx.x / rows);
    const int rt = blockIdx.x - (seg - seg0) * rows;
    const int b = rt / ntile;
    const int tile = rt - b * ntile;
    const int d0 = tile * CH;
    const int d = d0 + c;
    const unsigned wmask = ssm_warp_mask(nthr);
    const ssm_i64 t_begin = (ssm_i64)seg * seg_len;
    const ssm_i64 t_end = (L - t_begin) < seg_len ? L : t_begin + seg_len;

    const ssm_bwd_layout lay(CH, TL, NPAD, NPT, TS, BV, CV);
    if ((unsigned)lay.total * sizeof(CT) > ssm_dynamic_smem_bytes() || (int)blockDim.x != nthr ||
        TL % TS != 0 || dim % CH != 0 || (BV && (GB <= 0 || dim % GB != 0 || (dim / GB) % CH != 0)) ||
        (CV && (GC <= 0 || dim % GC != 0 || (dim / GC) % CH != 0)) ||
        seg < 0 || seg >= nseg || seg_len % chunk != 0 || t_begin >= L || (nseg > 1 && seg_g == nullptr))
        __trap();
    extern __shared__ ssm_f4 ssm_smem[];  // 16-byte aligned
    CT* const sm = reinterpret_cast<CT*>(ssm_smem);
    ssm_pair<CT>* const dtu = reinterpret_cast<ssm_pair<CT>*>(sm + lay.o_dtu);
    CT* const us = sm + lay.o_u;     // u; then du
    CT* const dys = sm + lay.o_dy;   // dy = dout * silu(z) (or dout)
    CT* const dzs = sm + lay.o_dz;   // dout * s (1 + z (1 - s)); then dz
    CT* const dss = sm + lay.o_ds;   // d softplus / d dt_raw (or 1); then ddelta
    CT* const Bs = sm + lay.o_B;
    CT* const Cs = sm + lay.o_C;
    CT* const sub = sm + lay.o_sub;
    CT* const redB = sm + lay.o_redB;
    CT* const redC = sm + lay.o_redC;
    CT* const accB = sm + lay.o_accB;
    CT* const accC = sm + lay.o_accC;
    const int TLS = lay.TLS, BS = lay.BS;

    const bool has_D = flags & SSM_HAS_D;
    const bool has_z = flags & SSM_HAS_Z;
    const bool has_bias = flags & SSM_HAS_BIAS;
    const bool softplus = flags & SSM_SOFTPLUS;
    const bool want_dh0 = flags & SSM_HAS_H0;
    const bool has_dfinal = flags & SSM_HAS_DFINAL;

    const int W = ssm_stage_width(nthr, TL);
    const int r0 = tid / W, rstep = nthr / W, col0 = tid % W;

    CT A2[NPT], g[NPT], dA[NPT], Bc[NPT], Cc[NPT], dBc[NPT], dCc[NPT];
#pragma unroll
    for (int k = 0; k < NPT; ++k) {
        const int n = s * NPT + k;
        const bool ok = n < N;
        A2[k] = ok ? A[(ssm_i64)d * N + n] * M::kLog2e : CT(0);
        // Adjoint entering the segment from its end: the carried seed when
        // time is split, else dfinal (or 0).
        g[k] = !ok ? CT(0)
             : nseg > 1 ? seg_g[(((ssm_i64)seg * batch + b) * dim + d) * N + n]
             : has_dfinal ? dfinal[((ssm_i64)b * dim + d) * N + n] : CT(0);
        dA[k] = 0;
        dBc[k] = 0;
        dCc[k] = 0;
        if constexpr (!BV) Bc[k] = ok ? ssm_load(B[(ssm_i64)d * N + n]) : CT(0);
        if constexpr (!CV) Cc[k] = ok ? ssm_load(C[(ssm_i64)d * N + n]) : CT(0);
    }
    const CT Dd = has_D ? D[d] : CT(0);
    CT accD = 0, accBias = 0;  // this lane's share of sum_t dy u and sum_t ddelta

    const BC* Bg = B;
    const BC* Cg = C;
    if constexpr (BV) Bg = B + ((ssm_i64)b * GB + d0 / (dim / GB)) * N * L;
    if constexpr (CV) Cg = C + ((ssm_i64)b * GC + d0 / (dim / GC)) * N * L;

    const ssm_i64 cmax = chunk < L ? chunk : L;
    const ssm_i64 tpc = (cmax + TL - 1) / TL;  // scratch slots per block
    CT* const my_scratch = scratch + (ssm_i64)blockIdx.x * tpc * nthr * NPT + (ssm_i64)tid * NPT;
    const ssm_i64 slot = (ssm_i64)nthr * NPT;

    // Stage dt and dt*u of tile [t0, t0 + tlp) (and, when `full`, the rest
    // the adjoint needs), zero past tl. A thread takes SSM_BWD_STAGE_ROWS rows at
    // a time and issues all their loads before it uses one: the loads' latency
    // is paid once per group, not once per row.
    auto stage = [&](ssm_i64 t0, int tl, int tlp, bool full) {
        constexpr int K = SSM_BWD_STAGE_ROWS;
        for (int rg = r0; rg < CH; rg += K * rstep) {
            for (int t = col0; t < tlp; t += W) {
                CT uu[K], raw[K], go[K], zz[K];
                const ssm_i64 at0 = ((ssm_i64)b * dim + d0 + rg) * L + t0 + t;
#pragma unroll
                for (int k = 0; k < K; ++k) {
                    const int r = rg + k * rstep;
                    const bool ok = r < CH && t < tl;
                    const ssm_i64 at = at0 + (ssm_i64)(k * rstep) * L;
                    uu[k] = ok ? ssm_load(u[at]) : CT(0);
                    raw[k] = ok ? ssm_load(delta[at]) + (has_bias ? dbias[d0 + r] : CT(0)) : CT(0);
                    go[k] = ok && full ? ssm_load(dout[at]) : CT(0);
                    zz[k] = ok && full && has_z ? ssm_load(z[at]) : CT(0);
                }
#pragma unroll
                for (int k = 0; k < K; ++k) {
                    const int r = rg + k * rstep;
                    if (r >= CH) break;
                    CT dt = 0, du = 0, dy = 0, dzf = 0, dsp = 1;
                    if (t < tl) {
                        dt = raw[k];
                        if (softplus && raw[k] <= CT(20)) M::softplus_grad_fast(raw[k], dt, dsp);  // else dt = raw, dsp = 1
                        du = dt * uu[k];
                        if (full) {
                            if (has_z) {
                                const CT sz = M::sigmoid_fast(zz[k]);
                                dy = go[k] * zz[k] * sz;
                                dzf = go[k] * sz * (CT(1) + zz[k] * (CT(1) - sz));
                            } else {
                                dy = go[k];
                            }
                        }
                    }
                    const int i = r * TLS + t;
                    ssm_pair<CT> p;
                    p.dt = dt;
                    p.du = du;
                    dtu[i] = p;
                    if (full) {
                        us[i] = uu[k];
                        dys[i] = dy;
                        dzs[i] = dzf;
                        dss[i] = dsp;
                    }
                }
            }
        }
        if constexpr (BV) ssm_stage_bc<2, true>(Bs, Bg + t0, L, N, NQ, BS, tl, tlp, r0, rstep, col0, W);
        if (full) {
            if constexpr (CV) ssm_stage_bc<2, true>(Cs, Cg + t0, L, N, NQ, BS, tl, tlp, r0, rstep, col0, W);
        }
    };

    // h <- state after steps [t_begin, t_end) of the staged tile.
    const ssm_pair<CT>* const drow = dtu + c * TLS;
    auto advance = [&](CT (&hh)[NPT], int t_begin, int t_end) {
#pragma unroll 2
        for (int t = t_begin; t < t_end; ++t) {
            const ssm_pair<CT> p = drow[t];
            CT bv[NPT];
            if constexpr (BV) ssm_ld_row_swz<NPT>(bv, Bs + t * BS, s);
#pragma unroll
            for (int k = 0; k < NPT; ++k) {
                const CT bk = BV ? bv[k] : Bc[k];
                hh[k] = M::decay(p.dt * A2[k]) * hh[k] + bk * p.du;
            }
        }
    };

    // The segment's chunks, last to first (segments start on chunk boundaries).
    for (ssm_i64 ci = (t_end - 1) / chunk; ci >= t_begin / chunk; --ci) {
        const ssm_i64 cs0 = ci * chunk;
        const ssm_i64 clen = (t_end - cs0) < chunk ? (t_end - cs0) : chunk;
        const int ntl = (int)((clen + TL - 1) / TL);

        // Pass A: tile-start states of this chunk. Tiles before the last are full.
        {
            CT h[NPT];
            const CT* const src = ckpt + ((ci * batch + b) * (ssm_i64)dim + d) * N;
#pragma unroll
            for (int k = 0; k < NPT; ++k) {
                const int n = s * NPT + k;
                h[k] = n < N ? src[n] : CT(0);
            }
            for (int T = 0; T < ntl; ++T) {
                ssm_st_row<NPT>(my_scratch + T * slot, h);
                if (T == ntl - 1) break;
                __syncthreads();
                stage(cs0 + (ssm_i64)T * TL, TL, TL, false);
                __syncthreads();
                advance(h, 0, TL);
            }
        }

        for (int T = ntl - 1; T >= 0; --T) {
            const ssm_i64 t0 = cs0 + (ssm_i64)T * TL;
            const int tl = (int)((clen - (ssm_i64)T * TL) < TL ? (clen - (ssm_i64)T * TL) : TL);
            const int tlp = ssm_round_up(tl, TS);  // padded steps: dt = 0, dy = 0
            const int nsub = tlp / TS;

            __syncthreads();
            stage(t0, tl, tlp, true);
            __syncthreads();

            // Sub-tile start states (thread-private smem slots).
            {
                CT h[NPT];
                ssm_ld_row<NPT>(h, my_scratch + T * slot);
                for (int S = 0; S < nsub; ++S) {
                    ssm_st_row<NPT>(sub + (S * nthr + tid) * NPT, h);
                    if (S + 1 < nsub) advance(h, S * TS, S * TS + TS);
                }
            }

            for (int S = nsub - 1; S >= 0; --S) {
                const int j0 = S * TS;
                // Recompute h_{t-1}, h_t and a_t of the sub-tile's steps.
                CT hs[TS + 1][NPT], as[TS][NPT];
                ssm_ld_row<NPT>(hs[0], sub + (S * nthr + tid) * NPT);
#pragma unroll
                for (int j = 0; j < TS; ++j) {
                    const ssm_pair<CT> p = drow[j0 + j];
                    CT bv[NPT];
                    if constexpr (BV) ssm_ld_row_swz<NPT>(bv, Bs + (j0 + j) * BS, s);
#pragma unroll
                    for (int k = 0; k < NPT; ++k) {
                        const CT bk = BV ? bv[k] : Bc[k];
                        const CT a = M::decay(p.dt * A2[k]);
                        as[j][k] = a;
                        hs[j + 1][k] = a * hs[j][k] + bk * p.du;
                    }
                }

                // Adjoint, last step first; g = dL/dh_t.
                CT vals[V];
#pragma unroll
                for (int j = TS - 1; j >= 0; --j) {
                    const int t = j0 + j;
                    const ssm_pair<CT> p = drow[t];
                    const CT dy = dys[c * TLS + t];
                    CT bv[NPT], cv[NPT], dBv[NPT], dCv[NPT];
                    if constexpr (BV) ssm_ld_row_swz<NPT>(bv, Bs + t * BS, s);
                    if constexpr (CV) ssm_ld_row_swz<NPT>(cv, Cs + t * BS, s);
                    CT yp = 0, gb = 0, sa = 0;
#pragma unroll
                    for (int k = 0; k < NPT; ++k) {
                        const CT bk = BV ? bv[k] : Bc[k];
                        const CT ck = CV ? cv[k] : Cc[k];
                        const CT ht = hs[j + 1][k];
                        yp += ck * ht;
                        if constexpr (CV) dCv[k] = dy * ht; else dCc[k] += dy * ht;
                        g[k] += ck * dy;
                        if constexpr (BV) dBv[k] = g[k] * p.du; else dBc[k] += g[k] * p.du;
                        gb += g[k] * bk;
                        const CT q = g[k] * (as[j][k] * hs[j][k]);  // g a_t h_{t-1}
                        sa += q * A2[k];
                        dA[k] += q * p.dt;
                        g[k] *= as[j][k];
                    }
                    if constexpr (BV) ssm_st_row_swz<NPT>(redB + (j * CH + c) * NPAD, s, dBv);
                    if constexpr (CV) ssm_st_row_swz<NPT>(redC + (j * CH + c) * NPAD, s, dCv);
                    vals[3 * j] = yp;
                    vals[3 * j + 1] = gb;
                    vals[3 * j + 2] = sa;
                }

                // Sums over n; the owning lane finishes its steps.
                int off = 0;
                bool own = true;
                ssm_reduce_scatter<V, NSPLIT / 2>::run(vals, s, wmask, off, own);
                if (own) {
#pragma unroll
                    for (int r = 0; r < R / 3; ++r) {
                        const int t = j0 + off / 3 + r;
                        if (t < tl) {
                            const int i = c * TLS + t;
                            const CT uu = us[i];
                            const CT dyv = dys[i];
                            const CT dt = dtu[i].dt;
                            const CT gb = vals[3 * r + 1];
                            const CT ddt = vals[3 * r + 2] * M::kLn2 + uu * gb;
                            const CT dd = ddt * dss[i];
                            if (has_z) dzs[i] = (vals[3 * r] + Dd * uu) * dzs[i];
                            us[i] = dt * gb + Dd * dyv;
                            dss[i] = dd;
                            accD += dyv * uu;
                            accBias += dd;
                        }
                    }
                }

                // Per-step dB, dC: sum over the block's channels, in channel order.
                if constexpr (BV || CV) {
                    __syncthreads();
                    constexpr int NB = (BV ? 1 : 0) + (CV ? 1 : 0);
                    for (int o = tid; o < NB * TS * NQ; o += nthr) {
                        const int which = o / (TS * NQ);
                        const int rem = o - which * (TS * NQ);
                        const int j = rem / NQ;
                        const int q = rem - j * NQ;
                        if (4 * q >= N) continue;  // padding rows, never written out
                        const bool isB = BV && which == 0;
                        const CT* const red = isB ? redB : redC;
                        CT* const acc = isB ? accB : accC;
                        CT sum[4] = {0, 0, 0, 0};
                        for (int cc = 0; cc < CH; ++cc) {
                            CT x[4];
                            ssm_ld4(x, red + (j * CH + cc) * NPAD + 4 * ssm_bc_quad(q));
#pragma unroll
                            for (int e = 0; e < 4; ++e) sum[e] += x[e];
                        }
#pragma unroll
                        for (int e = 0; e < 4; ++e) acc[(4 * q + e) * TLS + j0 + j] = sum[e];
                    }
                    __syncthreads();
                }
            }

            __syncthreads();
            for (int r = r0; r < CH; r += rstep) {
                const ssm_i64 rb = ((ssm_i64)b * dim + d0 + r) * L + t0;
                for (int t = col0; t < tl; t += W) {
                    const int i = r * TLS + t;
                    ssm_store(du_out + rb + t, us[i]);
                    ssm_store(ddelta_out + rb + t, dss[i]);
                    if (has_z) ssm_store(dz_out + rb + t, dzs[i]);
                }
            }
            if constexpr (BV)
                ssm_write_tile_rows(dB_out + ((ssm_i64)b * ntile + tile) * N * L + t0, accB, TLS, L, N,
                                    tl, r0, rstep, col0, W);
            if constexpr (CV)
                ssm_write_tile_rows(dC_out + ((ssm_i64)b * ntile + tile) * N * L + t0, accC, TLS, L, N,
                                    tl, r0, rstep, col0, W);
        }
    }

    {
        const int tid2 = ssm_fresh_tid(), blk2 = ssm_fresh_ctaid();
        const int rows2 = batch * (dim / CH);
        const int sg2 = blk2 / rows2, rt2 = blk2 - sg2 * rows2;
        const int b2 = rt2 / (dim / CH), s2 = tid2 % NSPLIT;
        const int d2 = (rt2 - b2 * (dim / CH)) * CH + tid2 / NSPLIT;
        const ssm_i64 bd = (ssm_i64)b2 * dim + d2;
        const ssm_i64 sbase = ((ssm_i64)(seg0 + sg2) * batch * dim + bd) * N;
        const bool first = seg0 + sg2 == 0;  // g is now dL/dh0
#pragma unroll
        for (int k = 0; k < NPT; ++k) {
            const int n = s2 * NPT + k;
            if (n < N) {
                dA_part[sbase + n] = dA[k];
                if constexpr (!BV) dB_out[sbase + n] = dBc[k];
                if constexpr (!CV) dC_out[sbase + n] = dCc[k];
                if (want_dh0 && first) dh0[bd * N + n] = g[k];
            }
        }
    }
    accD = ssm_group_allreduce<NSPLIT / 2>(accD, wmask);
    accBias = ssm_group_allreduce<NSPLIT / 2>(accBias, wmask);
    if (s == 0) {
        const ssm_i64 sbd = ((ssm_i64)seg * batch + b) * dim + d;
        dD_part[sbd] = accD;
        dbias_part[sbd] = accBias;
    }
}

// ===========================================================================
// Backward through a ring of tiles (ssm_scan_bwd_ring). It takes the ring
// forward's case (float compute, B and C per step, N <= 16, rows 16-byte
// aligned, L and the chunk multiples of ssm_ring_quantum, L < 2^31) with
// blocks of whole warps (CH a multiple of 32 / NSPLIT); same parameters,
// outputs and time segments as ssm_scan_bwd, and ck_pitch: the floats per
// checkpoint of a channel (>= N; more where the states are a slice of a larger
// problem's, ckpt pointing at the slice's first). Where that kernel spends most of
// its instructions on block-wide staging, two block barriers per 4 steps and
// one element per thread, this one
//   - copies tiles with 16-byte cp.async into two stages as the forward does,
//     in this order per chunk (chunks last to first): tiles 0 .. ntl-2 of the
//     chunk forward ("A" tiles: u, delta, B; each lane saves the state
//     entering each 8-step sub-block to `scratch`), then tiles ntl-1 .. 0 ("R"
//     tiles: u, delta, z, dout, B, C). One __syncthreads per A tile, two per R
//     tile;
//   - leaves the rest of an R tile to each warp for its own 32 / NSPLIT
//     channels: {dt, dt u} and dy into the warp's rows; the state entering
//     each sub-block into thread-private shared slots (from scratch, or for
//     the chunk's last tile walked from its entry state, as pass A left it);
//     then sub-blocks last to first: the sub-block's states and decays
//     recomputed into registers and the adjoint walked back through them.
//     Per step, the lane's dB and dC products are reduce-scattered over the
//     warp's channels (one sum per lane) into the warp's rows of the tile's
//     dB / dC; per sub-block, the sums over states (y_pre, sum g B,
//     sum g a h A2) are reduce-scattered over the channel's lanes and the
//     owning lane finishes du, ddelta and dz of its steps in place of u,
//     delta and z in the stage; the warp writes those rows out, 16 bytes a lane
//     (with SSM_ACCUMULATE, float IO, adds them to the rows there: the host runs
//     N > 16 as slices of at most 16 states, whose parts of du, ddelta and dz add up);
//   - after the R tile's second barrier, sums dB and dC over the warps in warp
//     order into the block's partial (as ssm_scan_bwd: one per channel tile,
//     summed by ssm_sum_tiles; deterministic).
// ===========================================================================

// Steps of a sub-block of the ring backward (its states and decays live in
// registers during the adjoint walk). ssmkit/_gpu/selective_scan.py mirrors it.
#define SSM_BRING_SUB 8
#define SSM_BWD_RING_MAX_THREADS 128
// Resident blocks asked of ptxas (3: at most 168 registers).
#ifndef SSM_BWD_RING_MIN_BLOCKS
#define SSM_BWD_RING_MIN_BLOCKS 3
#endif

// Shared memory of ssm_scan_bwd_ring, in bytes (ssmkit/_gpu/selective_scan.py
// mirrors it: _bwd_ring_smem_bytes). Two stages, each: CH rows of u, delta, z
// and dout as stored (TL elements and 16 bytes more each), then B and C in
// float as TL / 4 groups of ssm_ring_gpitch(NPAD) x 4. Then per channel a row of TL {dt, dt u}
// pairs (pitch 2 TL + 4 floats) and a row of TL dy (pitch TL + 4); the
// sub-block entry states, ceil(TL / 8) x nthr x 4 floats; the warps' dB / dC
// rows, TL x P floats per warp (P = 2 NPAD + 1: dB of the NPAD states, then
// dC; odd, so the warp sum's reads by step hit distinct banks); last, for
// 16-bit B and C, their rows as stored, one tile at a time.
struct ssm_bring_layout {
    int pio, rows, o_B, o_C, stage, o_dtu, o_dy, o_slot, o_acc, P, o_raw, total;
    __host__ __device__ ssm_bring_layout(int CH, int TL, int N, int NPAD, int io_size, int bc_size, int nthr) {
        pio = TL * io_size + 16;
        rows = CH * pio;  // u, delta, z, dout at 0, rows, 2 rows, 3 rows
        o_B = 4 * rows;
        o_C = o_B + ssm_ring_gpitch(NPAD) * TL * 4;
        stage = o_C + ssm_ring_gpitch(NPAD) * TL * 4;
        o_dtu = 2 * stage;
        o_dy = o_dtu + CH * (2 * TL + 4) * 4;
        o_slot = o_dy + CH * (TL + 4) * 4;
        P = 2 * NPAD + 1;
        o_acc = o_slot + ((TL + SSM_BRING_SUB - 1) / SSM_BRING_SUB) * nthr * 16;
        o_raw = o_acc + ssm_round_up((nthr / 32) * TL * P * 4, 16);
        total = o_raw + (bc_size == 2 ? 2 * N * ssm_ring_raw_pitch(TL) : 0);
    }
};

// The tiles of a backward segment [t_begin, t_end), in the ring's order:
// chunks last to first; in each, A tiles 0 .. ntl-2, then R tiles ntl-1 .. 0.
// Steps in 32 bits (the kernel checks L < 2^31).
struct ssm_bring_walk {
    int ci, ci_first, cs0, clen, ntl, T, TL, chunk, t_end;
    bool rev, done;  // rev: an R tile
    __device__ __forceinline__ ssm_bring_walk(int t_begin, int t_end_, int chunk_, int TL_)
        : TL(TL_), chunk(chunk_), t_end(t_end_), done(false) {
        ci_first = t_begin / chunk;
        ci = (t_end - 1) / chunk;
        start_chunk();
    }
    __device__ __forceinline__ void start_chunk() {
        cs0 = ci * chunk;
        clen = (t_end - cs0) < chunk ? (t_end - cs0) : chunk;
        ntl = (clen + TL - 1) >> (31 - __clz(TL));  // (TL is a power of two)
        rev = ntl < 2;
        T = rev ? ntl - 1 : 0;
    }
    __device__ __forceinline__ int t() const { return cs0 + T * TL; }
    __device__ __forceinline__ int tl() const {
        return done ? 0 : ((clen - T * TL) < TL ? (clen - T * TL) : TL);
    }
    // An R tile whose sub-block starts pass A saved to scratch (every R tile but the chunk's last).
    __device__ __forceinline__ bool saved() const { return rev && !done && T < ntl - 1; }
    __device__ __forceinline__ void next() {
        if (!rev) {
            if (T + 2 < ntl) ++T;
            else { rev = true; T = ntl - 1; }
        } else if (T > 0) {
            --T;
        } else if (ci > ci_first) {
            --ci;
            start_chunk();
        } else {
            done = true;
        }
    }
};

// Issue the cp.async copies of tile w (none when done) into stage st and
// commit them as one group: rows of u, delta and, for an R tile, z (has_z) and
// dout; B and, for an R tile, C in float straight into their [step / 4][n][4]
// places, or, 16-bit, as stored into `raw` (B's N rows, then C's; pitch
// ssm_ring_raw_pitch(TL)) for ssm_bring_widen.
// TL is a power of two: u, delta, z and dout pieces are walked over the full tile's rows
// (lg: log2 of the pieces a row of TL steps has), shifts and masks instead of divisions;
// B and C pieces likewise (row by row; ssm_for_bc_octets's order measured no faster here:
// NOTES.md, version 15); a short tile skips the pieces past its end.
template <typename IO, typename BC>
__device__ __forceinline__ void ssm_bring_copy(unsigned char* st, unsigned char* raw, const ssm_bring_layout& lay,
                                               const IO* u, const IO* delta, const IO* z, const IO* dout,
                                               const BC* Bg, const BC* Cg, ssm_i64 row0, ssm_i64 L, int CH,
                                               int N, int NPAD, int TL, const ssm_bring_walk& w, bool has_z,
                                               int tid, int nthr) {
    const int tl = w.tl();
    if (tl > 0) {
        const ssm_i64 t = w.t();
        const int lg = 31 - __clz(TL * (int)sizeof(IO) / 16), pio = tl * (int)sizeof(IO) / 16;
        // one walk: a piece's offsets serve the rows of u, delta and (R tile) z and dout
        const IO* const gu = u + row0 + t;
        const IO* const gd = delta + row0 + t;
        const IO* const gz = z + row0 + t;
        const IO* const go = dout + row0 + t;
        const bool with_z = w.rev && has_z;
#pragma unroll 1
        for (int e = tid; e < CH << lg; e += nthr) {
            const int r = e >> lg, k = e & ((1 << lg) - 1);
            if (k < pio) {
                const ssm_i64 off = (ssm_i64)r * L + k * (16 / (int)sizeof(IO));  // elements
                unsigned char* const dst = st + r * lay.pio + 16 * k;
                ssm_cp_async<16>(dst, gu + off);
                ssm_cp_async<16>(dst + lay.rows, gd + off);
                if (with_z) ssm_cp_async<16>(dst + 2 * lay.rows, gz + off);
                if (w.rev) ssm_cp_async<16>(dst + 3 * lay.rows, go + off);
            }
        }
        const int lgb = 31 - __clz(TL * (int)sizeof(BC) / 16), pbc = tl * (int)sizeof(BC) / 16;
#pragma unroll 1
        for (int e = tid; e < ((w.rev ? 2 : 1) * N) << lgb; e += nthr) {
            const int r = e >> lgb, k = e & ((1 << lgb) - 1);
            if (k < pbc) ssm_ring_copy_bc_piece<BC>(st, raw, lay.o_B, lay.o_C, Bg, Cg, L, t, N, NPAD, TL, r, k);
        }
    }
    ssm_cp_commit();
}

// 16-bit B and C: widen the pieces this thread copied into `raw` for tile w (after its
// ssm_cp_wait_all; the same walk as ssm_bring_copy's) to float, into their places in stage st.
template <typename BC>
__device__ __forceinline__ void ssm_bring_widen(unsigned char* st, const unsigned char* raw,
                                                const ssm_bring_layout& lay, int N, int NPAD, int TL,
                                                const ssm_bring_walk& w, int tid, int nthr) {
    if constexpr (sizeof(BC) == 2) {
        const int lgb = 31 - __clz(TL * 2 / 16), pbc = w.tl() * 2 / 16;
#pragma unroll 1
        for (int e = tid; e < ((w.rev ? 2 : 1) * N) << lgb; e += nthr) {
            const int r = e >> lgb, k = e & ((1 << lgb) - 1);
            if (k < pbc) ssm_ring_widen_piece<BC>(st, raw, lay.o_B, lay.o_C, N, NPAD, TL, r, k);
        }
    }
}

// h <- the state after NG4 groups of 4 steps: {dt, dt u} pairs from drow, B
// of this lane's states from Bq ([g][slot][4], ssm_ring_gpitch(NPAD) slots per group).
template <int NPAD>
__device__ __forceinline__ void ssm_bring_advance(float (&h)[4], const float (&A2)[4], const float* drow,
                                                  const float* Bq, int ng4) {
    typedef ssm_math<float> M;
#pragma unroll 1
    for (int q = 0; q < ng4; ++q) {
        float pr[8];
        ssm_ld4(pr, drow + 8 * q);
        ssm_ld4(pr + 4, drow + 8 * q + 4);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            float bv[4];
            ssm_ld4(bv, Bq + (q * ssm_ring_gpitch(NPAD) + k) * 4);
#pragma unroll
            for (int j = 0; j < 4; ++j) h[k] = M::decay(pr[2 * j] * A2[k]) * h[k] + bv[j] * pr[2 * j + 1];
        }
    }
}

template <typename IO, typename BC, int NPT, int NSPLIT, typename CT = float>
__global__ void __launch_bounds__(SSM_BWD_RING_MAX_THREADS, SSM_BWD_RING_MIN_BLOCKS)
ssm_scan_bwd_ring(const IO* __restrict__ u, const IO* __restrict__ delta, const IO* __restrict__ z,
                  const IO* __restrict__ dout,
                  const CT* __restrict__ A, const BC* __restrict__ B, const BC* __restrict__ C,
                  const CT* __restrict__ D, const CT* __restrict__ dbias,
                  const CT* __restrict__ ckpt, const CT* __restrict__ dfinal,
                  IO* __restrict__ du_out, IO* __restrict__ ddelta_out, IO* __restrict__ dz_out,
                  CT* __restrict__ dA_part, CT* __restrict__ dB_out, CT* __restrict__ dC_out,
                  CT* __restrict__ dD_part, CT* __restrict__ dbias_part, CT* __restrict__ dh0,
                  CT* __restrict__ scratch,
                  int batch, int dim, int N, ssm_i64 L, int GB, int GC, ssm_i64 chunk,
                  int TL, int CH, int flags, const CT* __restrict__ seg_g, ssm_i64 seg_len, int nseg,
                  int seg0, int ck_pitch, const unsigned char* __restrict__ restart) {
    static_assert(ssm_same<CT, float>::value && ssm_same<CT, typename ssm_compute_of<IO>::type>::value,
                  "float compute only");
    static_assert(ssm_same<BC, IO>::value || ssm_same<BC, float>::value, "BC must be IO or float");
    static_assert(NPT == 4 && (NSPLIT == 1 || NSPLIT == 2 || NSPLIT == 4 || NSPLIT == 8),
                  "N <= 32: 4 states per thread");
    typedef ssm_math<float> M;
    constexpr int NPAD = 4 * NSPLIT;
    constexpr int NPG = ssm_ring_gpitch(NPAD);  // B, C stage slots per group of 4 steps
    constexpr int Q = ssm_ring_quantum<IO, BC>();
    constexpr int CPW = 32 / NSPLIT;      // channels per warp
    constexpr int VIO = 16 / sizeof(IO);  // steps per 16-byte piece of IO
    constexpr int SB = SSM_BRING_SUB;
    static_assert(SB == 4 || SB == 8, "sub-blocks are 1 or 2 groups of 4 steps");

    const int nthr = CH * NSPLIT;  // == blockDim.x, whole warps
    const int tid = threadIdx.x;
    const int c = tid / NSPLIT, s = tid % NSPLIT;
    const int lane = tid & 31, warp = tid >> 5;
    const int cl = lane / NSPLIT;  // channel within the warp
    const int cw0 = warp * CPW;    // the warp's first channel
    const ssm_block_place place(batch, dim, CH, seg0);
    const int seg = place.seg, b = place.b, d0 = place.d0;
    const int d = d0 + c;
    const unsigned wmask = 0xffffffffu;
    const ssm_i64 t_begin = (ssm_i64)seg * seg_len;
    const ssm_i64 t_end = (t_begin + seg_len) < L ? (t_begin + seg_len) : L;
    const int ntile = dim / CH, tile = d0 / CH;

    const ssm_bring_layout lay(CH, TL, N, NPAD, sizeof(IO), sizeof(BC), nthr);
    if (lay.total > (int)ssm_dynamic_smem_bytes() || (int)blockDim.x != nthr || nthr % 32 != 0 ||
        TL % Q != 0 || (TL & (TL - 1)) != 0 || TL % SSM_BRING_SUB != 0 || L > 0x7fffffffLL || (int)L % Q != 0 || (int)chunk % Q != 0 || dim % CH != 0 ||
        N > NPAD || GB <= 0 || dim % GB != 0 || (dim / GB) % CH != 0 || GC <= 0 || dim % GC != 0 ||
        (dim / GC) % CH != 0 || seg < 0 || seg >= nseg || (int)seg_len % (int)chunk != 0 || t_begin >= L ||
        (nseg > 1 && seg_g == nullptr) || ((flags & SSM_ACCUMULATE) && sizeof(IO) != 4) || ck_pitch < N)
        __trap();
    extern __shared__ ssm_f4 ssm_smem[];  // 16-byte aligned
    unsigned char* const sm = reinterpret_cast<unsigned char*>(ssm_smem);
    float* const dtu = reinterpret_cast<float*>(sm + lay.o_dtu);  // row c: pitch 2 TL + 4
    float* const dys = reinterpret_cast<float*>(sm + lay.o_dy);   // row c: pitch TL + 4
    float* const slots = reinterpret_cast<float*>(sm + lay.o_slot) + tid * 4;  // slot k at + k nthr 4
    float* const acc = reinterpret_cast<float*>(sm + lay.o_acc);  // warp w, step t: (w TL + t) P
    float* const accw = acc + warp * TL * lay.P;
    unsigned char* const raw = sm + lay.o_raw;
    const int P = lay.P;

    const bool has_D = flags & SSM_HAS_D;
    const bool has_z = flags & SSM_HAS_Z;
    const bool has_bias = flags & SSM_HAS_BIAS;
    const bool softplus = flags & SSM_SOFTPLUS;
    const bool want_dh0 = flags & SSM_HAS_H0;
    const bool has_dfinal = flags & SSM_HAS_DFINAL;
    const bool accumulate = flags & SSM_ACCUMULATE;

    ssm_ring_zero_pad(sm, lay.stage, lay.o_B, lay.o_C, 2, TL, N, NPAD, tid, nthr);
    // Each channel's bias in the padding after its {dt, dt u} row, for the staging of every
    // tile (the first tile's barrier publishes it).
    if (tid < CH) dtu[tid * (2 * TL + 4) + 2 * TL] = has_bias ? dbias[d0 + tid] : 0.0f;

    float A2[4], g[4], dA[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const int n = s * 4 + k;
        const bool ok = n < N;
        A2[k] = ok ? A[(ssm_i64)d * N + n] * M::kLog2e : 0.0f;
        // Adjoint entering the segment from its end: the carried seed when
        // time is split, else dfinal (or 0).
        g[k] = !ok ? 0.0f
             : nseg > 1 ? seg_g[(((ssm_i64)seg * batch + b) * dim + d) * N + n]
             : has_dfinal ? dfinal[((ssm_i64)b * dim + d) * N + n] : 0.0f;
        dA[k] = 0.0f;
    }
    const float Dd = has_D ? D[d] : 0.0f;
    const float bias_c = has_bias ? dbias[d] : 0.0f;
    float accD = 0.0f, accBias = 0.0f;  // this lane's share of sum_t dy u and sum_t ddelta

    const ssm_i64 row0 = ((ssm_i64)b * dim + d0) * L;  // u, delta, z, dout, du, ...: row of channel d0
    const BC* const Bg = B + ((ssm_i64)b * GB + d0 / (dim / GB)) * N * L;
    const BC* const Cg = C + ((ssm_i64)b * GC + d0 / (dim / GC)) * N * L;
    const int cmax = (int)(chunk < L ? chunk : L);
    // Scratch: the state entering each sub-block of a chunk's A tiles, slot T SPT + k for
    // sub-block k of tile T (pass A writes them, the R tile reads them back), so that an R
    // tile walks its sub-block starts itself only as the chunk's last tile.
    const int spt = TL / SB;                      // sub-blocks per tile
    const int spc = ((cmax + TL - 1) / TL) * spt;  // scratch slots per block
    float* const my_scratch = scratch + ((ssm_i64)blockIdx.x * spc * nthr + tid) * 4;

    ssm_bring_walk cur((int)t_begin, (int)t_end, (int)chunk, TL);
    ssm_bring_copy<IO, BC>(sm, raw, lay, u, delta, z, dout, Bg, Cg, row0, L, CH, N, NPAD, TL, cur, has_z, tid, nthr);
    ssm_cp_wait_all();
    ssm_bring_widen<BC>(sm, raw, lay, N, NPAD, TL, cur, tid, nthr);

    float h[4];  // pass A's running state
    int stage = 0;
#pragma unroll 1
    while (!cur.done) {
        ssm_bring_walk nxt = cur;
        nxt.next();
        const int t0 = cur.t(), tl = cur.tl(), T = cur.T;
        const bool rev = cur.rev;
        if (!rev || cur.ntl == 1) {
            if (T == 0) {  // the chunk's checkpoint
                const float* const src = ckpt + (((ssm_i64)cur.ci * batch + b) * dim + d) * ck_pitch;
#pragma unroll
                for (int k = 0; k < 4; ++k) h[k] = s * 4 + k < N ? src[s * 4 + k] : 0.0f;
            }
        }
        const bool saved = cur.saved();  // its sub-block starts are in scratch
        ssm_cp_wait_all();  // this thread's copies of this tile have landed,
        __syncthreads();    // everyone's have, and B, C are stored; the other stage is free
        ssm_bring_copy<IO, BC>(sm + (stage ^ 1) * lay.stage, raw, lay, u, delta, z, dout, Bg, Cg, row0, L, CH, N,
                               NPAD, TL, nxt, has_z, tid, nthr);
        unsigned char* const st = sm + stage * lay.stage;

        // {dt, dt u} (and for an R tile dy) of the warp's channels, VIO steps per lane at a time.
        const int lgw = 31 - __clz(TL / VIO);  // pieces of VIO steps per row of TL, log2
        {
#pragma unroll 1
            for (int i = lane; i < CPW << lgw; i += 32) {  // (lanes on channels, as the forward's)
                const int r = i & (CPW - 1), t = (i / CPW) * VIO;
                if (t >= tl) continue;
                const int cc = cw0 + r;
                float uu[VIO], dd[VIO];  // (as the forward's staging; a shared helper changed its code)
                ssm_widen16(uu, (const IO*)nullptr, ssm_ld16(st + cc * lay.pio + t * sizeof(IO)));
                ssm_widen16(dd, (const IO*)nullptr, ssm_ld16(st + lay.rows + cc * lay.pio + t * sizeof(IO)));
                const float bias = dtu[cc * (2 * TL + 4) + 2 * TL];
                float pr[2 * VIO];
#pragma unroll
                for (int j = 0; j < VIO; ++j) {
                    float dt = dd[j] + bias;
                    if (softplus) dt = M::softplus_fast(dt);
                    pr[2 * j] = dt;
                    pr[2 * j + 1] = dt * uu[j];
                }
                if (SSM_RING_RESTARTS && restart != nullptr) ssm_restart_dts<VIO>(pr, restart + (ssm_i64)b * L + t0 + t);
                float* const dst = dtu + cc * (2 * TL + 4) + 2 * t;
#pragma unroll
                for (int j = 0; j < 2 * VIO; j += 4) ssm_st4(dst + j, pr + j);
                if (rev) {
                    float go[VIO];
                    ssm_widen16(go, (const IO*)nullptr, ssm_ld16(st + 3 * lay.rows + cc * lay.pio + t * sizeof(IO)));
                    if (has_z) {
                        float zz[VIO];
                        ssm_widen16(zz, (const IO*)nullptr, ssm_ld16(st + 2 * lay.rows + cc * lay.pio + t * sizeof(IO)));
#pragma unroll
                        for (int j = 0; j < VIO; ++j) go[j] *= zz[j] * M::sigmoid_fast(zz[j]);
                    }
#pragma unroll
                    for (int j = 0; j < VIO; j += 4) ssm_st4(dys + cc * (TL + 4) + t + j, go + j);
                }
            }
        }
        __syncwarp(wmask);

        const float* const drow = dtu + c * (2 * TL + 4);
        const float* const dyr = dys + c * (TL + 4);
        const float* const Bq = reinterpret_cast<const float*>(st + lay.o_B) + ssm_ring_bc_at(NPAD, 0, s * 4);
        const float* const Cq = reinterpret_cast<const float*>(st + lay.o_C) + ssm_ring_bc_at(NPAD, 0, s * 4);
        if (!rev) {
            // Pass A (a whole tile): the state entering each sub-block to scratch.
#pragma unroll 1
            for (int k = 0; k < spt; ++k) {
                ssm_st4(my_scratch + ((ssm_i64)T * spt + k) * nthr * 4, h);
                ssm_bring_advance<NPAD>(h, A2, drow + 2 * SB * k, Bq + SB * NPG * k, SB / 4);
            }
        } else {
            // The state entering each sub-block into the slots: from scratch, or (the chunk's
            // last tile, entered with pass A's state h) walked here.
            const int nb = (tl + SB - 1) / SB;
            if (!saved) {  // (a saved tile's came by cp.async during the R tile before it)
                float hh[4] = {h[0], h[1], h[2], h[3]};
#pragma unroll 1
                for (int k = 0; k < nb; ++k) {
                    ssm_st4(slots + k * nthr * 4, hh);
                    if (k + 1 < nb) ssm_bring_advance<NPAD>(hh, A2, drow + 2 * SB * k, Bq + SB * NPG * k, SB / 4);
                }
            }
            IO* const urow = reinterpret_cast<IO*>(st + c * lay.pio);                 // u, then du
            IO* const drow_io = reinterpret_cast<IO*>(st + lay.rows + c * lay.pio);   // delta, then ddelta
            IO* const zrow = reinterpret_cast<IO*>(st + 2 * lay.rows + c * lay.pio);  // z, then dz
            const IO* const gorow = reinterpret_cast<const IO*>(st + 3 * lay.rows + c * lay.pio);

            // The sub-block of steps j0 .. j0 + SB - 1, or its first 4 only (!full, at a
            // tile's end): recompute, adjoint, finish.
            auto sub = [&](int j0, bool full) {
                constexpr int NG = SB / 4, S = SB;
                float hs[S + 1][4], as[S][4];
                ssm_ld4(hs[0], slots + (j0 / SB) * nthr * 4);
                const float* const dr = drow + 2 * j0;
                const float* const Bj = Bq + j0 * NPG;
                const float* const Cj = Cq + j0 * NPG;
#pragma unroll
                for (int q = 0; q < NG; ++q) {
                    if (q > 0 && !full) break;
                    float pr[8];
                    ssm_ld4(pr, dr + 8 * q);
                    ssm_ld4(pr + 4, dr + 8 * q + 4);
#pragma unroll
                    for (int k = 0; k < 4; ++k) {
                        float bv[4];
                        ssm_ld4(bv, Bj + (q * NPG + k) * 4);
#pragma unroll
                        for (int j = 0; j < 4; ++j) {
                            const float a = M::decay(pr[2 * j] * A2[k]);
                            as[4 * q + j][k] = a;
                            hs[4 * q + j + 1][k] = a * hs[4 * q + j][k] + bv[j] * pr[2 * j + 1];
                        }
                    }
                }
                // Adjoint, last step first; g = dL/dh_t.
                float vals[3 * S];
#pragma unroll
                for (int q = NG - 1; q >= 0; --q) {
                    if (q > 0 && !full) {
#pragma unroll
                        for (int i = 12 * q; i < 12 * q + 12; ++i) vals[i] = 0.0f;
                        continue;
                    }
                    float pr[8], dyv[4];
                    ssm_ld4(pr, dr + 8 * q);
                    ssm_ld4(pr + 4, dr + 8 * q + 4);
                    ssm_ld4(dyv, dyr + j0 + 4 * q);
#pragma unroll
                    for (int jj = 3; jj >= 0; --jj) {
                        const int j = 4 * q + jj;
                        const float dt = pr[2 * jj], du = pr[2 * jj + 1], dy = dyv[jj];
                        float v[8];  // dB of the lane's 4 states, then dC
                        float yp = 0.0f, gb = 0.0f, sa = 0.0f;
#pragma unroll
                        for (int k = 0; k < 4; ++k) {
                            const float bk = Bj[(q * NPG + k) * 4 + jj], ck = Cj[(q * NPG + k) * 4 + jj];
                            const float ht = hs[j + 1][k];
                            yp += ck * ht;
                            v[4 + k] = dy * ht;
                            g[k] += ck * dy;
                            v[k] = g[k] * du;
                            gb += g[k] * bk;
                            const float qa = g[k] * (as[j][k] * hs[j][k]);  // g a_t h_{t-1}
                            sa += qa * A2[k];
                            dA[k] += qa * dt;
                            g[k] *= as[j][k];
                        }
                        vals[3 * j] = yp;
                        vals[3 * j + 1] = gb;
                        vals[3 * j + 2] = sa;
                        // dB, dC of this step summed over the warp's channels: RB values per
                        // lane (1 at N <= 16: 8 channels a warp; 2 at N 17-32: 4).
                        int off = 0;
                        bool own = true;
                        ssm_reduce_scatter<8, CPW / 2, NSPLIT>::run(v, cl, wmask, off, own);
                        constexpr int RB = ssm_rs_len(8, CPW / 2);
                        static_assert(RB <= 4, "a lane's sums stay within dB's or dC's quad");
                        if (own) {
#pragma unroll
                            for (int r = 0; r < RB; ++r)
                                accw[(j0 + j) * P + (off >> 2) * NPAD + s * 4 + (off & 3) + r] = v[r];
                        }
                    }
                }
                // Sums over the states; the owning lane finishes its steps.
                int off = 0;
                bool own = true;
                ssm_reduce_scatter<3 * S, NSPLIT / 2>::run(vals, s, wmask, off, own);
                constexpr int R = ssm_rs_len(3 * S, NSPLIT / 2);
                static_assert(R % 3 == 0, "reduce-scatter must keep whole steps");
                if (own) {
#pragma unroll
                    for (int r = 0; r < R / 3; ++r) {
                        if (!full && off / 3 + r >= 4) break;
                        const int t = j0 + off / 3 + r;
                        const float uu = ssm_load(urow[t]);
                        const float x = ssm_load(drow_io[t]) + bias_c;
                        float dt = drow[2 * t];
                        if (SSM_RING_RESTARTS && restart != nullptr && dt == SSM_RESTART_DT) dt = softplus ? M::softplus_fast(x) : x;
                        const float dyv = dyr[t];
                        const float gb = vals[3 * r + 1];
                        const float dsp = softplus && x <= 20.0f ? M::sigmoid_fast(x) : 1.0f;
                        const float dd = (vals[3 * r + 2] * M::kLn2 + uu * gb) * dsp;
                        if (has_z) {
                            const float zz = ssm_load(zrow[t]), go = ssm_load(gorow[t]);
                            const float sz = M::sigmoid_fast(zz);
                            ssm_store(zrow + t, (vals[3 * r] + Dd * uu) * (go * sz * (1.0f + zz * (1.0f - sz))));
                        }
                        ssm_store(urow + t, dt * gb + Dd * dyv);
                        ssm_store(drow_io + t, dd);
                        accD += dyv * uu;
                        accBias += dd;
                    }
                }
            };
            sub(SB * (nb - 1), tl - SB * (nb - 1) == SB);
#pragma unroll 1
            for (int k = nb - 2; k >= 0; --k) sub(SB * k, true);
            if (nxt.saved()) {
                // The next R tile's sub-block starts (a whole tile's), from scratch into this
                // thread's own slots while this tile's outputs and sums go out; the next
                // tile's wait covers them, and only this thread reads them.
                const float* const src = my_scratch + (ssm_i64)nxt.T * spt * nthr * 4;
#pragma unroll 1
                for (int k = 0; k < spt; ++k) ssm_cp_async<16>(slots + k * nthr * 4, src + k * nthr * 4);
                ssm_cp_commit();
            }
            __syncwarp(wmask);

            // The warp's rows of du, ddelta and dz out, 16 bytes a lane (one walk: a
            // piece's offsets serve the three rows).
            {
#pragma unroll 1
                for (int i = lane; i < CPW << lgw; i += 32) {
                    const int t = (i & ((1 << lgw) - 1)) * VIO;
                    if (t >= tl) continue;
                    const int cc = cw0 + (i >> lgw);
                    const ssm_i64 off = row0 + (ssm_i64)cc * L + t0 + t;
                    const unsigned char* const src = st + cc * lay.pio + t * sizeof(IO);
                    if (accumulate) {
                        ssm_add16f(du_out + off, ssm_ld16(src));
                        ssm_add16f(ddelta_out + off, ssm_ld16(src + lay.rows));
                        if (has_z) ssm_add16f(dz_out + off, ssm_ld16(src + 2 * lay.rows));
                        continue;
                    }
                    ssm_st16(du_out + off, ssm_ld16(src));
                    ssm_st16(ddelta_out + off, ssm_ld16(src + lay.rows));
                    if (has_z) ssm_st16(dz_out + off, ssm_ld16(src + 2 * lay.rows));
                }
            }
            __syncthreads();  // every warp's dB, dC rows of the tile are in
            // dB, dC: the sum over the warps, in warp order -> the block's partial.
            {
                constexpr int NW = SSM_BWD_RING_MAX_THREADS / 32;
                const int nw = nthr / 32, lgt = 31 - __clz(TL);
                const ssm_i64 part = ((ssm_i64)b * ntile + tile) * N * L + t0;
                if (nthr % (2 * TL) == 0) {
                    // (the usual case) e = tid + i nthr keeps its step t and its B / C row kind
                    // for every i: only n moves, by nthr / (2 TL) a time
                    const int t = tid & (TL - 1), which = (tid >> lgt) & 1, dn = nthr >> (lgt + 1);
                    const float* src = acc + t * P + which * NPAD + (tid >> (lgt + 1));
                    CT* dst = (which ? dC_out : dB_out) + part + (ssm_i64)(tid >> (lgt + 1)) * L + t;
                    const ssm_i64 dst_step = (ssm_i64)dn * L;
#pragma unroll 1
                    for (int n = tid >> (lgt + 1); n < N; n += dn, src += dn, dst += dst_step) {
                        if (t >= tl) break;
                        float sum = 0.0f;
#pragma unroll
                        for (int wi = 0; wi < NW; ++wi)
                            if (wi < nw) sum += src[wi * TL * P];
                        *dst = sum;
                    }
                } else
#pragma unroll 1
                for (int e = tid; e < (2 * N) << lgt; e += nthr) {
                    // rows in the order B_0, C_0, B_1, C_1, ...: at TL 16 a warp's halves take
                    // B_n and C_n, NPAD floats apart in acc, so their reads fall on disjoint
                    // banks (B_n with B_n+1 overlapped: P floats a step, one bank apart)
                    const int r = e >> lgt, t = e & (TL - 1);
                    if (t >= tl) continue;
                    const int which = r & 1, n = r >> 1;
                    const float* src = acc + t * P + which * NPAD + n;
                    float sum = 0.0f;
#pragma unroll
                    for (int wi = 0; wi < NW; ++wi)
                        if (wi < nw) sum += src[wi * TL * P];
                    (which ? dC_out : dB_out)[part + (ssm_i64)n * L + t] = sum;
                }
            }
        }
        // 16-bit B and C of the next tile widened into the other stage (whose last
        // readers, the previous tile's, passed this tile's barrier).
        if constexpr (sizeof(BC) == 2) {
            ssm_cp_wait_all();
            ssm_bring_widen<BC>(sm + (stage ^ 1) * lay.stage, raw, lay, N, NPAD, TL, nxt, tid, nthr);
        }
        cur = nxt;
        stage ^= 1;
    }
    ssm_cp_wait_all();  // the empty last group

    const ssm_i64 bd = (ssm_i64)b * dim + d;
    const ssm_i64 sbd = (ssm_i64)seg * batch * dim + bd;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const int n = s * 4 + k;
        if (n < N) {
            dA_part[sbd * N + n] = dA[k];
            if (want_dh0 && seg == 0) dh0[bd * N + n] = g[k];  // g is now dL/dh0
        }
    }
    accD = ssm_group_allreduce<NSPLIT / 2>(accD, wmask);
    accBias = ssm_group_allreduce<NSPLIT / 2>(accBias, wmask);
    if (s == 0) {
        dD_part[sbd] = accD;
        dbias_part[sbd] = accBias;
    }
}

// ===========================================================================
// Summary pass of a split backward (see "Time segments"): per segment seg0 +
// blk / (batch * dim / CH), walk its steps last to first from a zero adjoint,
// g <- (g + C_t dy_t) * exp(dt_t A) (dy after the z gate), and write the
// adjoint leaving the segment's start to seg_g[seg, b, d, :] and the sum of
// dt to seg_dt[seg, b, d]. Shared memory: ssm_fwd_layout(CH, TL, NPAD, false,
// CV), its {dt, du} pairs holding {dt, dy}. B and u are not needed.
// ===========================================================================
template <typename IO, typename BC, typename CT, int NPT, int NSPLIT, bool BV, bool CV>
__global__ void __launch_bounds__(SSM_FWD_MAX_THREADS)
ssm_scan_bwd_sum(const IO* __restrict__ delta, const IO* __restrict__ z, const IO* __restrict__ dout,
                 const CT* __restrict__ A, const BC* __restrict__ C, const CT* __restrict__ dbias,
                 CT* __restrict__ seg_g, CT* __restrict__ seg_dt,
                 int batch, int dim, int N, ssm_i64 L, int GB, int GC, ssm_i64 chunk,
                 int TL, int CH, int flags, ssm_i64 seg_len, int nseg, int seg0) {
    static_assert(ssm_same<CT, typename ssm_compute_of<IO>::type>::value, "CT must be IO's compute type");
    static_assert(NPT % 4 == 0 && (NSPLIT & (NSPLIT - 1)) == 0 && NSPLIT <= 32, "bad config");
    typedef ssm_math<CT> M;
    constexpr int NPAD = NPT * NSPLIT;
    constexpr int NQ = NPAD / 4;

    const int nthr = CH * NSPLIT;
    const int tid = threadIdx.x;
    const int c = tid / NSPLIT;
    const int s = tid % NSPLIT;
    const ssm_block_place place(batch, dim, CH, seg0);
    const int seg = place.seg, b = place.b, d0 = place.d0;
    const int d = d0 + c;
    const ssm_i64 t_begin = (ssm_i64)seg * seg_len;
    const ssm_i64 t_end = (L - t_begin) < seg_len ? L : t_begin + seg_len;

    const ssm_fwd_layout lay(CH, TL, NPAD, false, CV);
    if ((unsigned)lay.total * sizeof(CT) > ssm_dynamic_smem_bytes() || (int)blockDim.x != nthr ||
        dim % CH != 0 || (CV && (GC <= 0 || dim % GC != 0 || (dim / GC) % CH != 0)) ||
        seg < 0 || seg >= nseg || t_begin >= L)
        __trap();
    extern __shared__ ssm_f4 ssm_smem[];
    CT* const sm = reinterpret_cast<CT*>(ssm_smem);
    ssm_pair<CT>* const dty = reinterpret_cast<ssm_pair<CT>*>(sm + lay.o_dtu);  // {dt, dy}
    CT* const Cs = sm + lay.o_C;
    const int TLS = lay.TLS, BS = lay.BS;

    const bool has_z = flags & SSM_HAS_Z;
    const bool has_bias = flags & SSM_HAS_BIAS;
    const bool softplus = flags & SSM_SOFTPLUS;
    const int W = ssm_stage_width(nthr, TL);
    const int r0 = tid / W, rstep = nthr / W, col0 = tid % W;

    CT A2[NPT], g[NPT], Cc[NPT];
#pragma unroll
    for (int k = 0; k < NPT; ++k) {
        const int n = s * NPT + k;
        const bool ok = n < N;
        A2[k] = ok ? A[(ssm_i64)d * N + n] * M::kLog2e : CT(0);
        g[k] = 0;
        if constexpr (!CV) Cc[k] = ok ? ssm_load(C[(ssm_i64)d * N + n]) : CT(0);
    }
    CT sdt = 0;
    const BC* Cg = C;
    if constexpr (CV) Cg = C + ((ssm_i64)b * GC + d0 / (dim / GC)) * N * L;

    for (ssm_i64 t1 = t_end; t1 > t_begin;) {
        const int tl = (int)((t1 - t_begin) < TL ? (t1 - t_begin) : TL);
        const ssm_i64 t0 = t1 - tl;
        __syncthreads();  // the previous tile's readers are done with smem
        for (int r = r0; r < CH; r += rstep) {
            const int dd = d0 + r;
            const ssm_i64 rb = ((ssm_i64)b * dim + dd) * L + t0;
            const CT bias = has_bias ? dbias[dd] : CT(0);
            for (int t = col0; t < tl; t += W) {
                CT dt = ssm_load(delta[rb + t]) + bias;
                if (softplus) dt = M::softplus_fast(dt);
                CT dy = ssm_load(dout[rb + t]);
                if (has_z) {
                    const CT zz = ssm_load(z[rb + t]);
                    dy *= zz * M::sigmoid_fast(zz);
                }
                ssm_pair<CT> p;
                p.dt = dt;
                p.du = dy;
                dty[r * TLS + t] = p;
            }
        }
        if constexpr (CV) ssm_stage_bc(Cs, Cg + t0, L, N, NQ, BS, tl, tl, r0, rstep, col0, W);
        __syncthreads();

        const ssm_pair<CT>* const drow = dty + c * TLS;
#pragma unroll 2  // (4 makes ptxas spill in bf16)
        for (int t = tl - 1; t >= 0; --t) {
            const ssm_pair<CT> p = drow[t];
            CT cv[NPT];
            if constexpr (CV) ssm_ld_row_swz<NPT>(cv, Cs + t * BS, s);
#pragma unroll
            for (int k = 0; k < NPT; ++k) {
                const CT ck = CV ? cv[k] : Cc[k];
                g[k] = (g[k] + ck * p.du) * M::decay(p.dt * A2[k]);
            }
            sdt += p.dt;
        }
        t1 = t0;
    }

    const ssm_i64 sbd = ((ssm_i64)seg * batch + b) * dim + d;
#pragma unroll
    for (int k = 0; k < NPT; ++k) {
        const int n = s * NPT + k;
        if (n < N) seg_g[sbd * N + n] = g[k];
    }
    if (s == 0) seg_dt[sbd] = sdt;
}
