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
// ssmkit/_gpu/selective_scan.py). The backward asks for 6 blocks of 64 threads
// per SM in float (at most 168 registers: 12 warps per SM, enough to keep a
// typical Mamba-1 backward grid in one wave) and 4 in double.
#define SSM_FWD_MAX_THREADS 256
#define SSM_BWD_MAX_THREADS 64
template <typename CT> struct ssm_bwd_min_blocks { static constexpr int value = sizeof(CT) == 8 ? 4 : 6; };

enum : int {
    SSM_HAS_D = 1,
    SSM_HAS_Z = 2,
    SSM_HAS_BIAS = 4,
    SSM_SOFTPLUS = 8,
    SSM_HAS_H0 = 16,       // forward: initial state given; backward: return its gradient
    SSM_SAVE_CKPT = 32,    // forward: write the state entering each chunk
    SSM_HAS_DFINAL = 64,   // backward: a cotangent of the final state is given
};

// Backward sub-tile: steps whose states are recomputed into registers at once.
// TS * NPT values of h (and as many decays) live in registers during the
// adjoint walk; 16 floats (8 doubles) per thread keep the walk within the
// register budget of the launch bounds (no local memory in the step loops).
// ssmkit/_gpu/selective_scan.py mirrors this rule (_bwd_substeps).
template <typename CT, int NPT>
__host__ __device__ constexpr int ssm_bwd_substeps() {
    return (sizeof(CT) == 8 ? 8 : 16) / NPT >= 1 ? (sizeof(CT) == 8 ? 8 : 16) / NPT : 1;
}

// Shared-memory layouts, in elements of CT; every section starts at a multiple
// of 4 elements (16-byte aligned). ssmkit/_gpu/selective_scan.py mirrors these
// formulas to size the launch; each kernel checks them against the size it got.
//   TLS = TL | 1: row stride of the per-(channel, step) arrays; odd, so the
//         lanes of a warp (different channels, same step) hit different banks.
//   BS  = NPAD + 4: row stride of the per-step B/C tiles, kept a multiple of 4
//         for 16-byte vector access.
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

// Copy one tile of a per-step B or C, (N, L) rows starting at step t0 (Xg
// already points at [b, g, 0, t0]), into Xs[t][n] (time-major, row stride BS),
// converting to CT. Rows n >= N and steps t >= tl are zero-filled up to NPAD
// and tlp. Each thread moves 4 states of one step: the global loads coalesce
// along t, the shared store is one 16-byte access.
template <typename BC, typename CT>
__device__ __forceinline__ void ssm_stage_bc(CT* __restrict__ Xs, const BC* __restrict__ Xg,
                                             ssm_i64 L, int N, int NQ, int BS, int tl, int tlp,
                                             int r0, int rstep, int col0, int W) {
    for (int q = r0; q < NQ; q += rstep) {
        for (int t = col0; t < tlp; t += W) {
            CT x[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int n = 4 * q + e;
                x[e] = (t < tl && n < N) ? ssm_load(Xg[(ssm_i64)n * L + t]) : CT(0);
            }
            ssm_st4(Xs + t * BS + 4 * q, x);
        }
    }
}

// ===========================================================================
// Forward: y, the final state and (optionally) the state entering each chunk.
// ===========================================================================
template <typename IO, typename BC, typename CT, int NPT, int NSPLIT, bool BV, bool CV>
__global__ void __launch_bounds__(SSM_FWD_MAX_THREADS)
ssm_scan_fwd(const IO* __restrict__ u, const IO* __restrict__ delta, const IO* __restrict__ z,
             const CT* __restrict__ A, const BC* __restrict__ B, const BC* __restrict__ C,
             const CT* __restrict__ D, const CT* __restrict__ dbias, const CT* __restrict__ h0,
             IO* __restrict__ y, CT* __restrict__ hfinal, CT* __restrict__ ckpt,
             int batch, int dim, int N, ssm_i64 L, int GB, int GC, ssm_i64 chunk,
             int TL, int CH, int flags) {
    static_assert(ssm_same<CT, typename ssm_compute_of<IO>::type>::value, "CT must be IO's compute type");
    static_assert(ssm_same<BC, IO>::value || ssm_same<BC, CT>::value, "BC must be IO or CT");
    static_assert(NPT % 4 == 0 && (NSPLIT & (NSPLIT - 1)) == 0 && NSPLIT <= 32, "bad config");
    typedef ssm_math<CT> M;
    constexpr int NPAD = NPT * NSPLIT;
    constexpr int NQ = NPAD / 4;

    const int nthr = CH * NSPLIT;  // == blockDim.x
    const int tid = threadIdx.x;
    const int c = tid / NSPLIT;
    const int s = tid % NSPLIT;
    const int ntile = dim / CH;
    const int b = blockIdx.x / ntile;
    const int d0 = (blockIdx.x - b * ntile) * CH;
    const int d = d0 + c;
    const unsigned wmask = ssm_warp_mask(nthr);

    const ssm_fwd_layout lay(CH, TL, NPAD, BV, CV);
    // A launch planned by rules other than these kernels' would read or write
    // out of bounds: stop it loudly instead (all conditions are block-uniform).
    if ((unsigned)lay.total * sizeof(CT) > ssm_dynamic_smem_bytes() || (int)blockDim.x != nthr ||
        TL % NSPLIT != 0 || dim % CH != 0 || (BV && (GB <= 0 || dim % GB != 0 || (dim / GB) % CH != 0)) ||
        (CV && (GC <= 0 || dim % GC != 0 || (dim / GC) % CH != 0)))
        __trap();
    extern __shared__ ssm_f4 ssm_smem[];  // 16-byte aligned
    CT* const sm = reinterpret_cast<CT*>(ssm_smem);
    ssm_pair<CT>* const dtu = reinterpret_cast<ssm_pair<CT>*>(sm + lay.o_dtu);
    CT* const ys = sm + lay.o_y;
    CT* const Bs = sm + lay.o_B;
    CT* const Cs = sm + lay.o_C;
    const int TLS = lay.TLS, BS = lay.BS;

    const bool has_D = flags & SSM_HAS_D;
    const bool has_z = flags & SSM_HAS_Z;
    const bool has_bias = flags & SSM_HAS_BIAS;
    const bool softplus = flags & SSM_SOFTPLUS;
    const bool has_h0 = flags & SSM_HAS_H0;
    const bool save_ckpt = flags & SSM_SAVE_CKPT;

    // Staging layout: rows of W consecutive lanes walk consecutive steps.
    const int W = nthr < 32 ? nthr : 32;
    const int r0 = tid / W, rstep = nthr / W, col0 = tid % W;

    // Per-thread constants and state.
    CT A2[NPT], h[NPT], Bc[NPT], Cc[NPT];
#pragma unroll
    for (int k = 0; k < NPT; ++k) {
        const int n = s * NPT + k;
        const bool ok = n < N;
        A2[k] = ok ? A[(ssm_i64)d * N + n] * M::kLog2e : CT(0);
        h[k] = (ok && has_h0) ? h0[((ssm_i64)b * dim + d) * N + n] : CT(0);
        if constexpr (!BV) Bc[k] = ok ? ssm_load(B[(ssm_i64)d * N + n]) : CT(0);
        if constexpr (!CV) Cc[k] = ok ? ssm_load(C[(ssm_i64)d * N + n]) : CT(0);
    }

    // One pass over time in tiles of at most TL steps; a tile never crosses a
    // chunk boundary, so the state entering each chunk is in registers at the
    // start of its first tile. (Few loop-carried values: fewer registers.)
    ssm_i64 chunk_end = 0;  // end of the current chunk
    ssm_i64 ci = -1;        // current chunk
    for (ssm_i64 t0 = 0; t0 < L;) {
        if (t0 == chunk_end) {  // a chunk starts here
            ++ci;
            chunk_end = (t0 + chunk) < L ? (t0 + chunk) : L;
            if (save_ckpt) {
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

            __syncthreads();  // the previous tile's readers are done with smem
            for (int r = r0; r < CH; r += rstep) {
                const int dd = d0 + r;
                const ssm_i64 rb = ((ssm_i64)b * dim + dd) * L + t0;
                const CT bias = has_bias ? dbias[dd] : CT(0);
                const CT Dd = has_D ? D[dd] : CT(0);
                for (int t = col0; t < tlp; t += W) {
                    CT dt = 0, du = 0, yd = 0;
                    if (t < tl) {
                        const CT uu = ssm_load(u[rb + t]);
                        dt = ssm_load(delta[rb + t]) + bias;
                        if (softplus) dt = M::softplus(dt);
                        du = dt * uu;
                        yd = Dd * uu;  // the D skip; the scan adds sum_n C h
                    }
                    ssm_pair<CT> p;
                    p.dt = dt;
                    p.du = du;
                    dtu[r * TLS + t] = p;
                    ys[r * TLS + t] = yd;
                }
            }
            if constexpr (BV)
                ssm_stage_bc(Bs, B + ((ssm_i64)b * GB + d0 / (dim / GB)) * N * L + t0, L, N, NQ, BS,
                             tl, tlp, r0, rstep, col0, W);
            if constexpr (CV)
                ssm_stage_bc(Cs, C + ((ssm_i64)b * GC + d0 / (dim / GC)) * N * L + t0, L, N, NQ, BS,
                             tl, tlp, r0, rstep, col0, W);
            __syncthreads();

            // Scan NSPLIT steps at a time: each lane gets its partial
            // sum_n C h for those steps, then one reduce-scatter leaves lane s
            // with the full sum of step g0 + s.
            const ssm_pair<CT>* const drow = dtu + c * TLS;
            for (int g0 = 0; g0 < tlp; g0 += NSPLIT) {
                CT v[NSPLIT];
#pragma unroll
                for (int j = 0; j < NSPLIT; ++j) {
                    const int t = g0 + j;
                    const ssm_pair<CT> p = drow[t];
                    CT bv[NPT], cv[NPT];
                    if constexpr (BV) ssm_ld_row<NPT>(bv, Bs + t * BS + s * NPT);
                    if constexpr (CV) ssm_ld_row<NPT>(cv, Cs + t * BS + s * NPT);
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
                for (int t = col0; t < tl; t += W) {
                    CT yv = ys[r * TLS + t];
                    if (has_z) {
                        const CT zz = ssm_load(z[rb + t]);
                        yv *= zz * M::sigmoid(zz);
                    }
                    ssm_store(y + rb + t, yv);
                }
            }
            t0 += tl;
        }
    }
    {
        const int tid2 = ssm_fresh_tid(), blk2 = ssm_fresh_ctaid();
        const int b2 = blk2 / ntile, s2 = tid2 % NSPLIT;
        const int d2 = (blk2 - b2 * ntile) * CH + tid2 / NSPLIT;
        CT* const dst = hfinal + ((ssm_i64)b2 * dim + d2) * N;
#pragma unroll
        for (int k = 0; k < NPT; ++k) {
            const int n = s2 * NPT + k;
            if (n < N) dst[n] = h[k];
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
// Outputs: du_out, ddelta_out, dz_out (batch, dim, L) IO; dA_part (batch, dim,
// N); dB_out / dC_out: (batch, dim/CH, N, L) when per step, else (batch, dim,
// N); dD_part, dbias_part (batch, dim); dh0 (batch, dim, N) (if SSM_HAS_H0).
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
             int TL, int CH, int flags) {
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
    const int b = blockIdx.x / ntile;
    const int tile = blockIdx.x - b * ntile;
    const int d0 = tile * CH;
    const int d = d0 + c;
    const unsigned wmask = ssm_warp_mask(nthr);

    const ssm_bwd_layout lay(CH, TL, NPAD, NPT, TS, BV, CV);
    if ((unsigned)lay.total * sizeof(CT) > ssm_dynamic_smem_bytes() || (int)blockDim.x != nthr ||
        TL % TS != 0 || dim % CH != 0 || (BV && (GB <= 0 || dim % GB != 0 || (dim / GB) % CH != 0)) ||
        (CV && (GC <= 0 || dim % GC != 0 || (dim / GC) % CH != 0)))
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

    const int W = nthr < 32 ? nthr : 32;
    const int r0 = tid / W, rstep = nthr / W, col0 = tid % W;

    CT A2[NPT], g[NPT], dA[NPT], Bc[NPT], Cc[NPT], dBc[NPT], dCc[NPT];
#pragma unroll
    for (int k = 0; k < NPT; ++k) {
        const int n = s * NPT + k;
        const bool ok = n < N;
        A2[k] = ok ? A[(ssm_i64)d * N + n] * M::kLog2e : CT(0);
        g[k] = (ok && has_dfinal) ? dfinal[((ssm_i64)b * dim + d) * N + n] : CT(0);
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
    // the adjoint needs), zero past tl.
    auto stage = [&](ssm_i64 t0, int tl, int tlp, bool full) {
        for (int r = r0; r < CH; r += rstep) {
            const int dd = d0 + r;
            const ssm_i64 rb = ((ssm_i64)b * dim + dd) * L + t0;
            const CT bias = has_bias ? dbias[dd] : CT(0);
            for (int t = col0; t < tlp; t += W) {
                CT dt = 0, du = 0, uu = 0, dy = 0, dzf = 0, dsp = 1;
                if (t < tl) {
                    uu = ssm_load(u[rb + t]);
                    const CT raw = ssm_load(delta[rb + t]) + bias;
                    dt = raw;
                    if (softplus && raw <= CT(20)) M::softplus_grad(raw, dt, dsp);  // else dt = raw, dsp = 1
                    du = dt * uu;
                    if (full) {
                        const CT go = ssm_load(dout[rb + t]);
                        if (has_z) {
                            const CT zz = ssm_load(z[rb + t]);
                            const CT sz = M::sigmoid(zz);
                            dy = go * zz * sz;
                            dzf = go * sz * (CT(1) + zz * (CT(1) - sz));
                        } else {
                            dy = go;
                        }
                    }
                }
                const int i = r * TLS + t;
                ssm_pair<CT> p;
                p.dt = dt;
                p.du = du;
                dtu[i] = p;
                if (full) {
                    us[i] = uu;
                    dys[i] = dy;
                    dzs[i] = dzf;
                    dss[i] = dsp;
                }
            }
        }
        if constexpr (BV) ssm_stage_bc(Bs, Bg + t0, L, N, NQ, BS, tl, tlp, r0, rstep, col0, W);
        if (full) {
            if constexpr (CV) ssm_stage_bc(Cs, Cg + t0, L, N, NQ, BS, tl, tlp, r0, rstep, col0, W);
        }
    };

    // h <- state after steps [t_begin, t_end) of the staged tile.
    const ssm_pair<CT>* const drow = dtu + c * TLS;
    auto advance = [&](CT (&hh)[NPT], int t_begin, int t_end) {
#pragma unroll 2
        for (int t = t_begin; t < t_end; ++t) {
            const ssm_pair<CT> p = drow[t];
            CT bv[NPT];
            if constexpr (BV) ssm_ld_row<NPT>(bv, Bs + t * BS + s * NPT);
#pragma unroll
            for (int k = 0; k < NPT; ++k) {
                const CT bk = BV ? bv[k] : Bc[k];
                hh[k] = M::decay(p.dt * A2[k]) * hh[k] + bk * p.du;
            }
        }
    };

    const ssm_i64 nchunks = (L + chunk - 1) / chunk;
    for (ssm_i64 ci = nchunks - 1; ci >= 0; --ci) {
        const ssm_i64 cs0 = ci * chunk;
        const ssm_i64 clen = (L - cs0) < chunk ? (L - cs0) : chunk;
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
                    if constexpr (BV) ssm_ld_row<NPT>(bv, Bs + (j0 + j) * BS + s * NPT);
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
                    if constexpr (BV) ssm_ld_row<NPT>(bv, Bs + t * BS + s * NPT);
                    if constexpr (CV) ssm_ld_row<NPT>(cv, Cs + t * BS + s * NPT);
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
                    if constexpr (BV) ssm_st_row<NPT>(redB + (j * CH + c) * NPAD + s * NPT, dBv);
                    if constexpr (CV) ssm_st_row<NPT>(redC + (j * CH + c) * NPAD + s * NPT, dCv);
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
                            ssm_ld4(x, red + (j * CH + cc) * NPAD + 4 * q);
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
            if constexpr (BV) {
                for (int n = r0; n < N; n += rstep) {
                    CT* const dst = dB_out + (((ssm_i64)b * ntile + tile) * N + n) * L + t0;
                    for (int t = col0; t < tl; t += W) dst[t] = accB[n * TLS + t];
                }
            }
            if constexpr (CV) {
                for (int n = r0; n < N; n += rstep) {
                    CT* const dst = dC_out + (((ssm_i64)b * ntile + tile) * N + n) * L + t0;
                    for (int t = col0; t < tl; t += W) dst[t] = accC[n * TLS + t];
                }
            }
        }
    }

    {
        const int tid2 = ssm_fresh_tid(), blk2 = ssm_fresh_ctaid();
        const int b2 = blk2 / ntile, s2 = tid2 % NSPLIT;
        const int d2 = (blk2 - b2 * ntile) * CH + tid2 / NSPLIT;
        const ssm_i64 sbase = ((ssm_i64)b2 * dim + d2) * N;
#pragma unroll
        for (int k = 0; k < NPT; ++k) {
            const int n = s2 * NPT + k;
            if (n < N) {
                dA_part[sbase + n] = dA[k];
                if constexpr (!BV) dB_out[sbase + n] = dBc[k];
                if constexpr (!CV) dC_out[sbase + n] = dCc[k];
                if (want_dh0) dh0[sbase + n] = g[k];
            }
        }
    }
    accD = ssm_group_allreduce<NSPLIT / 2>(accD, wmask);
    accBias = ssm_group_allreduce<NSPLIT / 2>(accBias, wmask);
    if (s == 0) {
        dD_part[(ssm_i64)b * dim + d] = accD;
        dbias_part[(ssm_i64)b * dim + d] = accBias;
    }
}
