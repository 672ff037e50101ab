// ssd.cu: Mamba-2's SSD scan in chunks, forward and backward (launched by ssmkit._gpu.ssd).
//
// Per (batch row b, head h), with dt' the effective step (computed before these
// kernels) and a_t = dt'_t A[h]. The steps are cut into chunks at `starts`
// (every chunk_size steps, and at every end of a packed sequence, so that each
// final state is a state at a chunk boundary). Inside a chunk, cum_t is the sum
// of a over the chunk's steps up to t: a short cumulative sum in log space that
// never grows with L, so exp(cum_t - cum_s) is a difference of two small sums.
//
// Forward:
//   ssd_chunk_cumsum   cum (and, reversed, the backward's suffix sums);
//   ssd_chunk_state    the state a chunk builds by its last step E from its own
//                      inputs, S_c = sum_s exp(cum_E - cum_s) dt'_s x_s B_s^T;
//   ssd_state_passing  states[c + 1] = exp(cum_E) states[c] + S_c, one thread per
//                      state entry walking the chunks (states[0] = initial state);
//   ssd_chunk_mm       the outputs: the chunk-local diagonal block
//                      sum_{s<=t} exp(cum_t - cum_s) dt'_s (C_t.B_s) x_s plus the
//                      output correction exp(cum_t) states[c] C_t, then D and gate.
// Backward (dY the output cotangent times silu(z)):
//   ssd_chunk_state    (adjoint form) K_c = sum_t exp(cum_t) dY_t C_t^T;
//   ssd_adjoint_passing the adjoint of the state leaving each chunk, walking the
//                      chunks backwards, with the final states' cotangents injected
//                      at their boundaries; what is left at the start is
//                      d initial_state;
//   ssd_chunk_mm       the same chunk-local products, transposed: (G B)_s (for dx and
//                      ddt), dB_s and dC_t, each a masked Q x Q block times a tile
//                      plus a correction from a boundary state or adjoint.
// The backward recomputes everything from the chunk-boundary states.
//
// Restarts (seq_idx): a term from step s reaches step t only when seq[s] == seq[t];
// the entering state reaches t only when seq[t] == seq[t0 - 1] (seq[0] for the first
// chunk, whose entering state is the initial state). exp is evaluated only where the
// mask lets a term through (its argument is then <= 0 for A <= 0).
//
// Layouts (C order): per step (batch, L, X, K) with X heads or groups (head h uses
// row h / (H / X)); dt', cum (batch, L, H); seq (batch, L) int32 or null; D (H, V) or
// null; states (batch, n_chunks + 1, H, P, N); adjoints (batch, n_chunks, H, P, N).
// Offsets are 64-bit.
#include "ssm_common.cuh"
#include "ssm_tf32.cuh"

#define SSD_THREADS 256
#define SSD_MAXD 256  // largest head dimension P and state size N

template <typename CT>
__device__ __forceinline__ CT ssd_exp(CT x) {  // exp(x), through the hardware exp2 in float
    return ssm_math<CT>::decay(x * ssm_math<CT>::kLog2e);
}

__device__ __forceinline__ int ssd_seq(const int* seq, ssm_i64 i) { return seq ? seq[i] : 0; }

// The state's decay across chunk c of row b, head h (state passing, its adjoint, the
// backward's boundary term): exp(cum at the chunk's last step), or 0 where a sequence starts
// inside the chunk (seq at its last step differs from seq before its first).
template <typename CT>
__device__ __forceinline__ CT ssd_chunk_decay(const CT* cum, const int* seq,
                                              const ssm_i64* starts, ssm_i64 b, ssm_i64 c,
                                              ssm_i64 L, int H, int h) {
    const ssm_i64 t0 = starts[c], E = starts[c + 1] - 1;
    const bool same = ssd_seq(seq, b * L + E) == ssd_seq(seq, b * L + (t0 > 0 ? t0 - 1 : 0));
    return same ? ssd_exp<CT>(cum[(b * L + E) * H + h]) : CT(0);
}

// --------------------------------------------------------------------------------------
// The per-chunk passes over (batch, L, H) arrays (ssd_chunk_cumsum, ssd_bwd_dt, ssd_chunk_dt)
// take a block of SSD_CHUNK_THREADS per (b, chunk, 32 heads): lane = head (a warp's loads
// and stores are rows of 32 consecutive heads), warp w = the w-th of SSD_RUNS runs of the
// chunk's steps. Each warp sums its run; after a barrier each adds the runs before it (after
// it, for suffix sums) and walks its run again (the second time mostly from L1). Sums over a
// chunk are those of its steps in order, grouped by runs. (A thread per (b, chunk, head)
// walking the whole chunk left an H200 with about one warp per SM at the peer shape of
// benchmarks/SSD.md: 0.04-0.09 ms per pass for 5-21 MB. Blocks of 256 threads, 8 runs of 32
// steps, still took 21.5 us for ssd_chunk_dt there, Nsight Compute: 192 blocks, 12 warps
// per SM, each walking 64 steps one dependent group of loads after another.)
// Grid: (batch * nc, ceil(H / 32)).
// The steps of a run go in groups of SSD_CUMSUM_ILP whose loads are issued before the sums.
// --------------------------------------------------------------------------------------
#define SSD_CUMSUM_ILP 8
// Chunks whose loads the adjoint walk issues together (ssd_adjoint_passing; a macro for A/B
// runs through SSMKIT_CUDA_DEFINES).
#ifndef SSD_ADJ_AHEAD
#define SSD_ADJ_AHEAD 4
#endif
#define SSD_BWD_DT_ILP 4  // ssd_bwd_dt loads 4 arrays: 8 steps at a time spilled at 1024 threads
#ifndef SSD_CHUNK_THREADS
#define SSD_CHUNK_THREADS 1024
#endif
#define SSD_RUNS (SSD_CHUNK_THREADS / 32)

// Where this thread of a per-chunk pass works: row b, chunk c, head h (live: h < H), its
// run's steps lo .. hi - 1 of the chunk, and the offset of the chunk's first step of head h.
struct ssd_chunk_run {
    ssm_i64 b, c, lo, hi, off;
    int h, lane, warp;
    bool live;
};
__device__ __forceinline__ ssd_chunk_run ssd_chunk_run_here(ssm_i64 L, int H, ssm_i64 nc,
                                                           const ssm_i64* starts) {
    ssd_chunk_run r;
    r.lane = threadIdx.x & 31;
    r.warp = threadIdx.x >> 5;
    r.b = blockIdx.x / nc;
    r.c = blockIdx.x - r.b * nc;
    r.h = blockIdx.y * 32 + r.lane;
    r.live = r.h < H;
    const ssm_i64 t0 = starts[r.c], n = starts[r.c + 1] - t0;
    const ssm_i64 per = (n + SSD_RUNS - 1) / SSD_RUNS;
    r.lo = r.warp * per < n ? r.warp * per : n;
    r.hi = r.lo + per < n ? r.lo + per : n;
    r.off = (r.b * L + t0) * H + (r.live ? r.h : 0);
    return r;
}

// f(j, p[j H]) for the steps j of run r in order (backwards with `reverse`), the loads of
// SSD_CUMSUM_ILP steps issued before their values are used (zeros when r is not live).
template <typename CT, typename F>
__device__ __forceinline__ void ssd_walk_run(const CT* p, int H, const ssd_chunk_run& r,
                                             bool reverse, F f) {
    const ssm_i64 n = r.hi - r.lo;
    for (ssm_i64 k0 = 0; k0 < n; k0 += SSD_CUMSUM_ILP) {
        CT v[SSD_CUMSUM_ILP];
#pragma unroll
        for (int k = 0; k < SSD_CUMSUM_ILP; ++k) {
            const ssm_i64 j = reverse ? r.hi - 1 - (k0 + k) : r.lo + k0 + k;
            v[k] = r.live && k0 + k < n ? p[j * H] : CT(0);
        }
#pragma unroll
        for (int k = 0; k < SSD_CUMSUM_ILP; ++k)
            if (k0 + k < n) f(reverse ? r.hi - 1 - (k0 + k) : r.lo + k0 + k, v[k]);
    }
}

// The sum of the other runs' values run_sum[w][lane] before run `warp` (after it, added from
// the last, with `reverse`).
template <typename CT>
__device__ __forceinline__ CT ssd_runs_before(const CT (&run_sum)[SSD_RUNS][32], int warp,
                                              int lane, bool reverse) {
    CT s = 0;
    if (reverse) {
        for (int w = SSD_RUNS - 1; w > warp; --w) s += run_sum[w][lane];
    } else {
        for (int w = 0; w < warp; ++w) s += run_sum[w][lane];
    }
    return s;
}

// Sums of a[b, t, h] over each chunk: inclusive prefix (reverse = 0) or suffix (reverse = 1).
template <typename CT>
__global__ void __launch_bounds__(SSD_CHUNK_THREADS)
ssd_chunk_cumsum(const CT* __restrict__ a, CT* __restrict__ out, const ssm_i64* __restrict__ starts,
                 ssm_i64 L, int H, ssm_i64 nc, int reverse) {
    __shared__ CT run_sum[SSD_RUNS][32];
    const ssd_chunk_run r = ssd_chunk_run_here(L, H, nc, starts);
    CT s = 0;
    ssd_walk_run(a + r.off, H, r, reverse, [&](ssm_i64, CT v) { s += v; });
    run_sum[r.warp][r.lane] = s;
    __syncthreads();
    s = ssd_runs_before(run_sum, r.warp, r.lane, reverse);
    if (!r.live) return;
    ssd_walk_run(a + r.off, H, r, reverse, [&](ssm_i64 j, CT v) {
        s += v;
        out[r.off + j * H] = s;
    });
}

// --------------------------------------------------------------------------------------
// The backward's last pass over (batch, L, H), in one kernel: sdcum = the suffix sums of
// dcum inside each chunk (ssd_chunk_cumsum's runs, reverse) plus the chunk's boundary term
// e (below), which belongs to its last step; then per step
//   ddt = (xGB + A[h] sdcum) * factor   (factor = d dt' / d dt),
// and per (b, chunk, h) the partial sums over the chunk's steps of dte * sdcum (dA) and of
// ddt (d dt_bias), for the host to add up in a fixed order (ssd_sum_parts):
// part[b * nc + c][0 (dA) or 1 (d dt_bias)][h], each the sum of the runs' sums in run order.
// The boundary term of chunk c (head h), from the adjoint walk and the products:
//   e = w * sum_k end_part[((b * nc + c) * H + h) * end_parts + k]  (end_part null: 0)
//       + sum of bnd[b, s, h] over the chunk's steps s                (bnd null: 0),
// w = [seq at the chunk's last step == seq before its first] exp(cum at its last step)
// where cum is given, else 1. (Summed here, not by the host: no (batch, nc, H) temporaries
// and no scattered add into dcum, a dozen small CuPy launches fewer per backward.)
// --------------------------------------------------------------------------------------
template <typename CT>
__global__ void __launch_bounds__(SSD_CHUNK_THREADS)
ssd_bwd_dt(const CT* __restrict__ dcum, const CT* __restrict__ xGB, const CT* __restrict__ A,
           const CT* __restrict__ dte, const CT* __restrict__ factor,
           const ssm_i64* __restrict__ starts, CT* __restrict__ ddt, CT* __restrict__ part,
           const CT* __restrict__ cum, const int* __restrict__ seq,
           const CT* __restrict__ end_part, const CT* __restrict__ bnd, ssm_i64 L, int H,
           ssm_i64 nc, int end_parts) {
    __shared__ CT run_sum[SSD_RUNS][32], run_dA[SSD_RUNS][32], run_ddt[SSD_RUNS][32];
    __shared__ CT run_bnd[SSD_RUNS][32], run_end[SSD_RUNS][32];
    const ssd_chunk_run r = ssd_chunk_run_here(L, H, nc, starts);
    const CT a = r.live ? A[r.h] : CT(0);
    CT s = 0, sb = 0, se = 0;
    ssd_walk_run(dcum + r.off, H, r, true, [&](ssm_i64, CT v) { s += v; });
    if (bnd) ssd_walk_run(bnd + r.off, H, r, true, [&](ssm_i64, CT v) { sb += v; });
    if (end_part && r.live) {  // warp w: parts w, w + SSD_RUNS, ..
        const CT* e = end_part + ((r.b * nc + r.c) * H + r.h) * end_parts;
        for (int k = r.warp; k < end_parts; k += SSD_RUNS) se += e[k];
    }
    run_sum[r.warp][r.lane] = s;
    run_bnd[r.warp][r.lane] = sb;
    run_end[r.warp][r.lane] = se;
    __syncthreads();
    CT eb = 0, ee = 0;  // the boundary term's two parts, in run order
    for (int w = 0; w < SSD_RUNS; ++w) {
        eb += run_bnd[w][r.lane];
        ee += run_end[w][r.lane];
    }
    if (cum && r.live) ee *= ssd_chunk_decay(cum, seq, starts, r.b, r.c, L, H, r.h);
    s = ssd_runs_before(run_sum, r.warp, r.lane, true) + (ee + eb);
    CT sum_dA = 0, sum_ddt = 0;
    const ssm_i64 n = r.hi - r.lo;
    for (ssm_i64 k0 = 0; k0 < n; k0 += SSD_BWD_DT_ILP) {  // backwards, 4 loads per step
        CT vd[SSD_BWD_DT_ILP], vx[SSD_BWD_DT_ILP], ve[SSD_BWD_DT_ILP], vf[SSD_BWD_DT_ILP];
#pragma unroll
        for (int k = 0; k < SSD_BWD_DT_ILP; ++k) {
            const ssm_i64 at = r.off + (r.hi - 1 - (k0 + k)) * H;
            const bool in = r.live && k0 + k < n;
            vd[k] = in ? dcum[at] : CT(0);
            vx[k] = in ? xGB[at] : CT(0);
            ve[k] = in ? dte[at] : CT(0);
            vf[k] = in ? factor[at] : CT(0);
        }
#pragma unroll
        for (int k = 0; k < SSD_BWD_DT_ILP; ++k) {
            if (r.live && k0 + k < n) {
                s += vd[k];
                const CT g = (vx[k] + a * s) * vf[k];
                ddt[r.off + (r.hi - 1 - (k0 + k)) * H] = g;
                sum_dA += ve[k] * s;
                sum_ddt += g;
            }
        }
    }
    run_dA[r.warp][r.lane] = sum_dA;
    run_ddt[r.warp][r.lane] = sum_ddt;
    __syncthreads();
    if (r.warp == 0 && r.live) {
        CT ta = 0, tb = 0;
        for (int w = 0; w < SSD_RUNS; ++w) {
            ta += run_dA[w][r.lane];
            tb += run_ddt[w][r.lane];
        }
        const ssm_i64 i = (r.b * nc + r.c) * 2 * H + r.h;
        part[i] = ta;
        part[i + H] = tb;
    }
}

// --------------------------------------------------------------------------------------
// The layout pass in one kernel: per step, dt' = clip(softplus?(dt + dt_bias)) and its
// derivative d dt' / d dt (factor, or null), as ssmkit._ssd.effective_dt computes them, and
// per chunk cum = the inclusive prefix sums of dt' A[h] (in runs, as ssd_chunk_cumsum).
// clip = 0: lo and hi are not used.
// --------------------------------------------------------------------------------------
// dt' (d) and d dt' / d dt (g) of one raw step dt + dt_bias, as ssmkit._ssd.effective_dt.
template <typename CT>
__device__ __forceinline__ void ssd_effective_dt(CT raw, int softplus, int clip, CT lo, CT hi,
                                                 CT& d, CT& g) {
    d = raw;
    g = 1;
    if (softplus && raw <= CT(20)) ssm_math<CT>::softplus_grad(raw, d, g);  // (one exp)
    if (clip) {
        if (!(d >= lo && d <= hi)) g = 0;
        d = d < lo ? lo : (d > hi ? hi : d);
    }
}

template <typename CT>
__global__ void __launch_bounds__(SSD_CHUNK_THREADS)
ssd_chunk_dt(const CT* __restrict__ dt, const CT* __restrict__ dt_bias,
             const CT* __restrict__ A, const ssm_i64* __restrict__ starts, CT* __restrict__ dte,
             CT* __restrict__ factor, CT* __restrict__ cum, ssm_i64 L, int H, ssm_i64 nc,
             int softplus, int clip, CT lo, CT hi) {
    __shared__ CT run_sum[SSD_RUNS][32];
    const ssd_chunk_run r = ssd_chunk_run_here(L, H, nc, starts);
    const CT bias = r.live && dt_bias ? dt_bias[r.h] : CT(0);
    const CT a = r.live ? A[r.h] : CT(0);
    // dt' and its derivative once per step, written in the first walk; the second walk
    // reads dt' back (written by this thread) for the sums. (With dt' computed in both
    // walks the kernel took 19-21 us at the peer shape of benchmarks/SSD.md: its
    // transcendental functions, not its bytes, set its time.)
    CT s = 0;
    ssd_walk_run(dt + r.off, H, r, false, [&](ssm_i64 j, CT v) {
        CT d, g;
        ssd_effective_dt(dt_bias ? v + bias : v, softplus, clip, lo, hi, d, g);
        s += d * a;
        if (!r.live) return;
        const ssm_i64 o = r.off + j * H;
        dte[o] = d;
        if (factor) factor[o] = g;
    });
    run_sum[r.warp][r.lane] = s;
    __syncthreads();
    s = ssd_runs_before(run_sum, r.warp, r.lane, false);
    if (!r.live) return;
    ssd_walk_run(dte + r.off, H, r, false, [&](ssm_i64 j, CT d) {
        s += d * a;
        cum[r.off + j * H] = s;
    });
}

// --------------------------------------------------------------------------------------
// C_t . B_t for every step and head, cb[(b * L + t) * H + h] = sum_n B[b, t, gB, n] C[b, t,
// gC, n] with gB = h / (H / GB), gC = h / (H / GC): the diagonal of each head's C B^T block,
// which the tensor-core backward adds in float32 (rows = batch * L). A warp per row: for each
// class of heads that read the same groups (runs of H / classes heads, classes a multiple of
// GB and GC; one class when G = 1), the lanes sum the products of their pieces of the two
// rows (16 bytes at a time), a butterfly adds the lanes' sums, and the lanes write the value
// for the class's heads. (A thread per (step, head) recomputed each dot H / classes times.)
// Grid: ceil(rows / 8) blocks of 256 threads.
// --------------------------------------------------------------------------------------
template <typename TB, typename CT>
__global__ void __launch_bounds__(SSD_THREADS)
ssd_diag_cb(const TB* __restrict__ B, const TB* __restrict__ C, CT* __restrict__ cb,
            ssm_i64 rows, int H, int GB, int GC, int N, int classes) {
    const int lane = threadIdx.x & 31;
    const ssm_i64 row = (ssm_i64)blockIdx.x * (SSD_THREADS / 32) + (threadIdx.x >> 5);
    if (row >= rows) return;  // (a whole warp: the butterfly below stays within live warps)
    constexpr int V = 16 / (int)sizeof(TB);  // values per 16-byte load
    const int per_class = H / classes;
    for (int k = 0; k < classes; ++k) {
        const TB* const bp = B + (row * GB + k / (classes / GB)) * N;
        const TB* const cq = C + (row * GC + k / (classes / GC)) * N;
        CT s = CT(0);
        if ((((unsigned long long)bp | (unsigned long long)cq) & 15) == 0 && N % V == 0) {
            for (int n = V * lane; n < N; n += 32 * V) {
                const uint4 wb = *reinterpret_cast<const uint4*>(bp + n);
                const uint4 wc = *reinterpret_cast<const uint4*>(cq + n);
                const TB* const vb = reinterpret_cast<const TB*>(&wb);
                const TB* const vc = reinterpret_cast<const TB*>(&wc);
#pragma unroll
                for (int q = 0; q < V; ++q) s += (CT)ssm_load(vb[q]) * (CT)ssm_load(vc[q]);
            }
        } else {
            for (int n = lane; n < N; n += 32) s += (CT)ssm_load(bp[n]) * (CT)ssm_load(cq[n]);
        }
#pragma unroll
        for (int m = 16; m > 0; m >>= 1) s += __shfl_xor_sync(0xffffffffu, s, m);
        for (int h = k * per_class + lane; h < (k + 1) * per_class; h += 32) cb[row * H + h] = s;
    }
}

// --------------------------------------------------------------------------------------
// The sum of `parts` partial arrays of n values each, laid out one after another:
// out[i] = part[0][i] + part[1][i] + ... in that order (deterministic), stored as OT. The
// head-summing tensor-core products (dB, dC) leave one partial per run of heads; their sums
// go straight to the 16-bit input dtype.
// Grid: any; a grid-stride loop over i.
// --------------------------------------------------------------------------------------
template <typename CT, typename OT>
__global__ void __launch_bounds__(SSD_THREADS)
ssd_sum_parts(const CT* __restrict__ part, OT* __restrict__ out, ssm_i64 n, int parts) {
    const ssm_i64 step = (ssm_i64)gridDim.x * SSD_THREADS;
    for (ssm_i64 i = (ssm_i64)blockIdx.x * SSD_THREADS + threadIdx.x; i < n; i += step) {
        CT v = part[i];
        for (int k = 1; k < parts; ++k) v += part[(ssm_i64)k * n + i];
        ssm_store(out + i, v);  // (OT 16-bit: rounded to nearest even, as a cast would)
    }
}

// --------------------------------------------------------------------------------------
// State passing, forward: states[b, 0] = h0 (or 0), states[b, c+1] = d_c states[b, c] + S_c
// with d_c = exp(cum_E) when no sequence starts inside chunk c, else 0. entering (or null)
// receives states[b, c] for c < nc rounded to 16 bits (entering_bf16: bfloat16, else
// float16), laid out (batch, nc, H, P, N): the tensor-core output kernel's operand. With
// states null, only the final states are written: final[k] = states[b, j] for the boundaries
// with k = bslot[b, j] >= 0 (bslot: (batch, nc + 1); final: (slots, H, P, N)).
// Grid: (batch * H, ceil(P*N / 256)); one thread per state entry.
// --------------------------------------------------------------------------------------
template <typename CT>
__global__ void __launch_bounds__(SSD_THREADS)
ssd_state_passing(const CT* __restrict__ chunk_states, const CT* __restrict__ cum,
                  const int* __restrict__ seq, const ssm_i64* __restrict__ starts,
                  const CT* __restrict__ h0, CT* __restrict__ states,
                  ssm_i64 L, int H, ssm_i64 PN, ssm_i64 nc, void* __restrict__ entering,
                  int entering_bf16, const int* __restrict__ bslot, CT* __restrict__ final) {
    const ssm_i64 o = (ssm_i64)blockIdx.y * SSD_THREADS + threadIdx.x;
    if (o >= PN) return;
    const ssm_i64 bh = blockIdx.x;
    const ssm_i64 b = bh / H;
    const int h = (int)(bh - b * H);
    auto keep = [&](ssm_i64 j, CT v) {  // the state at boundary j
        if (states) {
            states[((b * (nc + 1) + j) * H + h) * PN + o] = v;
        } else {
            const int k = bslot[b * (nc + 1) + j];
            if (k >= 0) final[((ssm_i64)k * H + h) * PN + o] = v;
        }
    };
    CT hv = h0 ? h0[bh * PN + o] : CT(0);
    keep(0, hv);
    for (ssm_i64 c = 0; c < nc; ++c) {
        if (entering) {
            const ssm_i64 i = ((b * nc + c) * H + h) * PN + o;
            if (entering_bf16)
                ssm_store(static_cast<ssm_bf16*>(entering) + i, (float)hv);
            else
                ssm_store(static_cast<ssm_half*>(entering) + i, (float)hv);
        }
        const CT d = ssd_chunk_decay(cum, seq, starts, b, c, L, H, h);
        hv = d * hv + chunk_states[((b * nc + c) * H + h) * PN + o];
        keep(c + 1, hv);
    }
}

// --------------------------------------------------------------------------------------
// State passing, backward. g = adjoint of the state at a boundary. Walking the chunks
// backwards: g += dfinal of the sequence ending at the boundary (bslot >= 0);
// dHx[c] = g (the adjoint of the state leaving chunk c); g = d_c g + K_c. At the start,
// g is the adjoint of the initial state. dHx16 (or null) receives dHx rounded to 16 bits
// (dhx_bf16: bfloat16, else float16), the tensor-core backward's operand. dot_with (or null):
// the boundary states (batch, nc + 1, H, P, N); then dot_part[b, c, h, 8 blockIdx.y + warp]
// receives this warp's part of <dHx[c], states[c + dot_shift]>, for the host to add up (the
// chunk-end term of the backward's chunk-sum cotangent) without a (batch, nc, H, P, N)
// temporary and without block barriers.
// Grid: (batch * H, ceil(P*N / 256)). bslot: (batch, nc + 1) int32 or null.
// --------------------------------------------------------------------------------------
template <typename CT>
__global__ void __launch_bounds__(SSD_THREADS, 4)  // (62 registers, not 106)
ssd_adjoint_passing(const CT* __restrict__ chunk_adj, const CT* __restrict__ cum,
                    const int* __restrict__ seq, const ssm_i64* __restrict__ starts,
                    const int* __restrict__ bslot, const CT* __restrict__ dfinal,
                    CT* __restrict__ dHx, CT* __restrict__ dinit,
                    ssm_i64 L, int H, ssm_i64 PN, ssm_i64 nc, void* __restrict__ dHx16,
                    int dhx_bf16, const CT* __restrict__ dot_with, int dot_shift,
                    CT* __restrict__ dot_part) {
    // The walk is a chain of loads: each chunk's decay and slot (uniform over the block) are
    // staged in shared memory SSD_THREADS chunks at a time, and the per-entry loads of K and
    // dot_with are issued AHEAD chunks at once, so that enough bytes are in flight.
    constexpr int AHEAD = SSD_ADJ_AHEAD;
    __shared__ CT decay[SSD_THREADS];
    __shared__ int slot[SSD_THREADS];  // bslot at the boundary a chunk leaves by (-1: none)
    const ssm_i64 o = (ssm_i64)blockIdx.y * SSD_THREADS + threadIdx.x;
    const bool live = o < PN;  // (every thread stages and joins its warp's sums)
    const bool finals = bslot && dfinal;
    const ssm_i64 bh = blockIdx.x;
    const ssm_i64 b = bh / H;
    const int h = (int)(bh - b * H);
    const ssm_i64 stride = (ssm_i64)H * PN;  // from one chunk to the next
    const ssm_i64 at = (b * nc * H + h) * PN + o;  // chunk 0's entry of K, dHx (dHx16)
    const ssm_i64 dot_at = ((b * (nc + 1) + dot_shift) * H + h) * PN + o;
    const int parts = gridDim.y * (SSD_THREADS / 32);  // warps per (b, c, h) in dot_part
    const ssm_i64 part_at = (b * nc * H + h) * parts + blockIdx.y * (SSD_THREADS / 32) +
                            (threadIdx.x >> 5);
    CT g = 0;
    for (ssm_i64 top = nc - 1; top >= 0; top -= SSD_THREADS) {
        // this run's chunks: top, top - 1, .., top - run + 1
        const int run = (int)(top + 1 < SSD_THREADS ? top + 1 : SSD_THREADS);
        __syncthreads();  // the previous run's reads of decay and slot are done
        if (threadIdx.x < run) {
            const ssm_i64 c = top - threadIdx.x;
            decay[threadIdx.x] = ssd_chunk_decay(cum, seq, starts, b, c, L, H, h);
            slot[threadIdx.x] = finals ? bslot[b * (nc + 1) + c + 1] : -1;
        }
        __syncthreads();
        for (int j0 = 0; j0 < run; j0 += AHEAD) {
            CT kv[AHEAD], sv[AHEAD];
#pragma unroll
            for (int a = 0; a < AHEAD; ++a) {
                const ssm_i64 c = top - j0 - a;
                const bool ok = live && j0 + a < run;
                kv[a] = ok ? chunk_adj[at + c * stride] : CT(0);
                sv[a] = ok && dot_with ? dot_with[dot_at + c * stride] : CT(0);
            }
#pragma unroll
            for (int a = 0; a < AHEAD; ++a) {
                if (j0 + a >= run) continue;  // (uniform over the block)
                const ssm_i64 c = top - j0 - a;
                const int k = slot[j0 + a];
                if (live && k >= 0) g += dfinal[((ssm_i64)k * H + h) * PN + o];
                const ssm_i64 i = at + c * stride;
                if (live) {
                    if (dHx) dHx[i] = g;  // (null: only the 16-bit copy is wanted)
                    if (dHx16) {
                        if (dhx_bf16)
                            ssm_store(static_cast<ssm_bf16*>(dHx16) + i, (float)g);
                        else
                            ssm_store(static_cast<ssm_half*>(dHx16) + i, (float)g);
                    }
                }
                if (dot_with) {  // uniform: this warp's part of <dHx[c], states[c + dot_shift]>
                    CT v = g * sv[a];  // (0 where not live)
#pragma unroll
                    for (int m = 16; m > 0; m >>= 1) v += __shfl_xor_sync(0xffffffffu, v, m);
                    if ((threadIdx.x & 31) == 0) dot_part[part_at + c * H * parts] = v;
                }
                g = decay[j0 + a] * g + kv[a];
            }
        }
    }
    if (!live) return;
    if (finals) {
        const int k = bslot[b * (nc + 1)];
        if (k >= 0) g += dfinal[((ssm_i64)k * H + h) * PN + o];
    }
    dinit[bh * PN + o] = g;
}

// --------------------------------------------------------------------------------------
// The chunk-local products, one tile of R rows r of one chunk, all V columns:
//
//   out[r, v] = scale_r * sum_k M[v, k] U_r[k]                         (boundary term)
//             + sum_q w_rq (U_r . W_q) Vv_q[v]                          (diagonal block)
//             (+ D[h, v] Vv_r[v], then * silu(z_r[v]) when D, z given)
//
//   UPPER = false (q <= r): w_rq = [seq_q == seq_r] exp(cum_r - cum_q) (dt'_q when DTQ),
//           M = the state entering the chunk, scale_r = [seq_r == seq_prev] exp(cum_r);
//   UPPER = true  (q >= r): w_rq = [seq_q == seq_r] exp(cum_q - cum_r),
//           M = the adjoint leaving the chunk, scale_r = [seq_r == seq_E] exp(cum_E - cum_r).
//
// U, W: (batch, L, XU | XW, K); Vv: (batch, L, XV, V). M is a P x N matrix: (v, k) is
// M[v * K + k], or M[k * V + v] when MT. Its chunk c is at Mm + ((b * m_chunks + c) * H + h) * K * V.
// Instances: the forward output (U = C, W = B, Vv = x, M = states, DTQ), (G B)_s (U = B,
// W = C, Vv = dY, M = dHx, UPPER), dB_s (U = x, W = dY, Vv = C, M = dHx^T, UPPER) and
// dC_t (U = dY, W = x, Vv = B, M = states^T, DTQ).
//
// Register tiles, as in a matrix-product kernel: thread (ty, tx) = (tid / 16, tid % 16)
// owns MR consecutive rows ty MR .. and, of the R x R block of q-tile weights, the MR
// consecutive columns tx MR ..; of the output, the MR columns tx MR + 16 MR m .. (m < VM,
// 16 MR VM >= V). MR is one 16-byte vector (4 floats, 2 doubles), so each step of a
// product reads two or three vectors from shared memory for MR x MR or MR x MR VM sums.
// The operands are staged k-major (us[k][r], ws[k][q]) and the weighted block q-major
// (blk[q][r]), so those vectors lie along the rows.
// Grid: (batch * H * nc * tiles_per_chunk).
// --------------------------------------------------------------------------------------
template <typename CT> struct ssd_mm_tile {
    static constexpr int MR = 16 / (int)sizeof(CT);  // rows (and columns) per thread
    static constexpr int R = 16 * MR;                // rows per tile, q per q-tile: 64 / 32
    static constexpr int S = 64 / (int)sizeof(CT);   // k or q per shared stage: 16 / 8
};
template <typename CT> struct alignas(16) ssd_vec16 { CT v[16 / sizeof(CT)]; };

// One shared-memory stage of the products, moved in two steps: load() brings this thread's
// share into registers, store() writes it to shared memory. The kernel loads stage k + 1
// before it computes stage k, so those loads are in flight meanwhile.
//   ssd_mm_rows: rows row0 .. row0 + n - 1 of a (batch * L, X, K) array at index hx, columns
//                k0 .. k0 + S - 1, to dst[kk][r] (zero past n or K); threads read along k.
//   ssd_mm_cols: rows q0 .. q0 + n - 1 of a (batch * L, X, row_len) array at index hx,
//                columns 0 .. VP - 1, to dst[qq][v]; or, with the M form, M's (k0 + kk, v)
//                for kk < S to dst[kk][v].
template <int R, int S, typename CT> struct ssd_mm_rows {
    static constexpr int PER = R * S / SSD_THREADS;  // a thread's values: rows RSTEP apart
    static constexpr int RSTEP = SSD_THREADS / S;
    CT v[PER];
    template <typename T>
    __device__ __forceinline__ void load(const T* __restrict__ src, ssm_i64 row0, int n, int X,
                                         int hx, int K, int k0) {
        const int r = threadIdx.x / S, kk = threadIdx.x % S;
        const ssm_i64 step = (ssm_i64)RSTEP * X * K;  // one address and one step, not PER
        const T* p = src + ((row0 + r) * X + hx) * (ssm_i64)K + k0 + kk;
        const bool in_k = k0 + kk < K;
#pragma unroll
        for (int j = 0; j < PER; ++j) v[j] = (r + j * RSTEP < n && in_k) ? (CT)ssm_load(p[j * step]) : CT(0);
    }
    template <int RP> __device__ __forceinline__ void store(CT (*dst)[RP]) const {
#pragma unroll
        for (int p = 0; p < PER; ++p) {
            const int i = threadIdx.x + p * SSD_THREADS, r = i / S, kk = i - r * S;
            dst[kk][r] = v[p];
        }
    }
};
template <int VP, int S, typename CT> struct ssd_mm_cols {
    static constexpr int PER = VP * S / SSD_THREADS;
    static_assert(VP <= SSD_THREADS && SSD_THREADS % S == 0, "a thread's values are rows apart");
    CT v[PER];
    template <typename T>  // rows of row_len values; columns past ncols give zero
    __device__ __forceinline__ void load(const T* __restrict__ src, ssm_i64 q0, int n, int X,
                                         int hx, int row_len, int ncols) {
        constexpr int QSTEP = SSD_THREADS / VP;  // rows between a thread's values
        const int qq = threadIdx.x / VP, c = threadIdx.x % VP;
        const ssm_i64 step = (ssm_i64)QSTEP * X * row_len;
        const T* p = src + ((q0 + qq) * X + hx) * row_len + c;
#pragma unroll
        for (int j = 0; j < PER; ++j)
            v[j] = (qq + j * QSTEP < n && c < ncols) ? (CT)ssm_load(p[j * step]) : CT(0);
    }
    template <bool MT>  // M's rows are along k unless MT: consecutive threads read along them
    __device__ __forceinline__ void load_m(const CT* __restrict__ M, int K, int V, int k0) {
        constexpr int STEP = MT ? SSD_THREADS / VP : SSD_THREADS / S;  // in kk (MT) or c
        const int kk = MT ? threadIdx.x / VP : threadIdx.x % S;
        const int c = MT ? threadIdx.x % VP : threadIdx.x / S;
        const CT* p = MT ? M + (ssm_i64)(k0 + kk) * V + c : M + (ssm_i64)c * K + k0 + kk;
        const ssm_i64 step = MT ? (ssm_i64)STEP * V : (ssm_i64)STEP * K;
#pragma unroll
        for (int j = 0; j < PER; ++j) {
            const bool live = MT ? (c < V && k0 + kk + j * STEP < K) : (c + j * STEP < V && k0 + kk < K);
            v[j] = live ? p[j * step] : CT(0);
        }
    }
    template <bool MT, int VS> __device__ __forceinline__ void store(CT (*dst)[VS]) const {
#pragma unroll
        for (int p = 0; p < PER; ++p) {
            const int i = threadIdx.x + p * SSD_THREADS;
            const int kk = MT ? i / VP : i % S, c = MT ? i % VP : i / S;
            dst[kk][c] = v[p];
        }
    }
};

// acc[i][m MR + j] += sum over the S rows kk of a[kk][ty MR + i] (times w[kk] when given)
// * x[kk][tx MR + 16 MR m + j]: one 16-byte vector of a and VM of x per row kk.
template <int VM, typename CT, int RP, int VS>
__device__ __forceinline__ void ssd_mm_accumulate(
    CT (&acc)[ssd_mm_tile<CT>::MR][ssd_mm_tile<CT>::MR * VM], const CT (*a)[RP],
    const CT (*x)[VS], const CT* w = nullptr) {
    constexpr int MR = ssd_mm_tile<CT>::MR, S = ssd_mm_tile<CT>::S;
    typedef ssd_vec16<CT> vec;
    const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
#pragma unroll 4
    for (int kk = 0; kk < S; ++kk) {
        vec av = *reinterpret_cast<const vec*>(&a[kk][ty * MR]);
        if (w) {
            const CT wk = w[kk];
#pragma unroll
            for (int i = 0; i < MR; ++i) av.v[i] = wk * av.v[i];
        }
#pragma unroll
        for (int m = 0; m < VM; ++m) {
            const vec xv = *reinterpret_cast<const vec*>(&x[kk][tx * MR + 16 * MR * m]);
#pragma unroll
            for (int i = 0; i < MR; ++i)
#pragma unroll
                for (int j = 0; j < MR; ++j) acc[i][m * MR + j] += av.v[i] * xv.v[j];
        }
    }
}

// sacc[i][j] = U_{ru + ty MR + i} . W_{rw + tx MR + j}, the sum over k < K in k order (rows
// past nu, nw give zero), through the shared stages us, ws; stage k + 1's loads are in flight
// while stage k is summed. U, W: (batch * L, XU | XW, K) at index hu, hw.
template <typename TU, typename TW, typename CT, int RP>
__device__ __forceinline__ void ssd_mm_block_sum(CT (&sacc)[ssd_mm_tile<CT>::MR][ssd_mm_tile<CT>::MR],
                                                 CT (*us)[RP], CT (*ws)[RP],
                                                 const TU* __restrict__ U, ssm_i64 ru, int nu,
                                                 int XU, int hu, const TW* __restrict__ W,
                                                 ssm_i64 rw, int nw, int XW, int hw, int K) {
    constexpr int MR = ssd_mm_tile<CT>::MR, R = ssd_mm_tile<CT>::R, S = ssd_mm_tile<CT>::S;
    typedef ssd_vec16<CT> vec;
    const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
#pragma unroll
    for (int i = 0; i < MR; ++i)
#pragma unroll
        for (int j = 0; j < MR; ++j) sacc[i][j] = 0;
    ssd_mm_rows<R, S, CT> ur, wr;
    ur.load(U, ru, nu, XU, hu, K, 0);
    wr.load(W, rw, nw, XW, hw, K, 0);
    for (int k0 = 0; k0 < K; k0 += S) {
        __syncthreads();
        ur.store(us);
        wr.store(ws);
        __syncthreads();
        if (k0 + S < K) {
            ur.load(U, ru, nu, XU, hu, K, k0 + S);
            wr.load(W, rw, nw, XW, hw, K, k0 + S);
        }
#pragma unroll 4
        for (int kk = 0; kk < S; ++kk) {
            const vec av = *reinterpret_cast<const vec*>(&us[kk][ty * MR]);
            const vec wv = *reinterpret_cast<const vec*>(&ws[kk][tx * MR]);
#pragma unroll
            for (int i = 0; i < MR; ++i)
#pragma unroll
                for (int j = 0; j < MR; ++j) sacc[i][j] += av.v[i] * wv.v[j];
        }
    }
}

// One block of the chunk products (ssd_chunk_mm, ssd_chunk_mm_tc): where it works and the
// per-row and per-q-tile values both kernels weight with. Tile tile_id of the grid is row b,
// head h, chunk c (steps t0 .. t1 - 1), its tile's rows r0 .. r0 + nr - 1 (none when r0 >= t1),
// read from head groups hu, hw, hv of U, W, Vv. The shared arrays (R entries each) hold the
// rows' chunk sums and sequence ids, and the current q-tile's with its dt'.
template <typename CT, bool UPPER, bool DTQ, int R> struct ssd_mm_block {
    ssm_i64 b, c, t0, t1, r0, L;
    int h, tile, nr, hu, hw, hv, H, seq_bound;
    CT cum_E;
    const CT* cum;
    const CT* dte;
    const int* seq;
    CT *cum_r, *cum_q, *dt_q;
    int *seq_r, *seq_q;

    __device__ __forceinline__ ssd_mm_block(ssm_i64 L_, int H_, const CT* cum_, const CT* dte_,
                                            const int* seq_, CT* cum_r_, CT* cum_q_, CT* dt_q_,
                                            int* seq_r_, int* seq_q_)
        : L(L_), H(H_), cum(cum_), dte(dte_), seq(seq_), cum_r(cum_r_), cum_q(cum_q_),
          dt_q(dt_q_), seq_r(seq_r_), seq_q(seq_q_) {}
    // False when the tile lies past its chunk's end (the block has nothing to do).
    __device__ __forceinline__ bool at(ssm_i64 tile_id, int tiles_per_chunk, ssm_i64 nc,
                                       const ssm_i64* starts, int XU, int XW, int XV) {
        const ssm_i64 per_head = nc * tiles_per_chunk;
        const ssm_i64 bh = tile_id / per_head, ct = tile_id - bh * per_head;
        c = ct / tiles_per_chunk;
        tile = (int)(ct - c * tiles_per_chunk);
        b = bh / H;
        h = (int)(bh - b * H);
        t0 = starts[c];
        t1 = starts[c + 1];
        r0 = t0 + (ssm_i64)tile * R;
        if (r0 >= t1) return false;
        nr = (int)(t1 - r0 < R ? t1 - r0 : R);
        const ssm_i64 E = t1 - 1;
        seq_bound = UPPER ? ssd_seq(seq, b * L + E) : ssd_seq(seq, b * L + (t0 > 0 ? t0 - 1 : 0));
        set_head(h, XU, XW, XV);
        return true;
    }
    // Moves the block to head h_ (same rows and chunk): its groups and cum_E.
    __device__ __forceinline__ void set_head(int h_, int XU, int XW, int XV) {
        h = h_;
        hu = h / (H / XU);
        hw = h / (H / XW);
        hv = h / (H / XV);
        cum_E = cum[(b * L + t1 - 1) * H + h];
    }
    // cum_r, seq_r (the last row repeated past nr); the caller's barrier publishes them.
    __device__ __forceinline__ void load_rows() const {
        if (threadIdx.x < R) {
            const ssm_i64 r = r0 + ((int)threadIdx.x < nr ? threadIdx.x : nr - 1);
            cum_r[threadIdx.x] = cum[(b * L + r) * H + h];
            seq_r[threadIdx.x] = ssd_seq(seq, b * L + r);
        }
    }
    // The boundary term's factor of row r.
    __device__ __forceinline__ CT row_scale(int r) const {
        return seq_r[r] != seq_bound ? CT(0)
               : UPPER ? ssd_exp<CT>(cum_E - cum_r[r]) : ssd_exp<CT>(cum_r[r]);
    }
    // The q-tiles of the diagonal block: q0 = q_begin(), q_begin() + R, .. < q_end().
    __device__ __forceinline__ ssm_i64 q_begin() const { return UPPER ? r0 : t0; }
    __device__ __forceinline__ ssm_i64 q_end() const { return UPPER ? t1 : r0 + nr; }
    // cum_q, dt_q, seq_q of q-tile q0 (nq steps); the caller's barriers fence them.
    __device__ __forceinline__ void load_q(ssm_i64 q0, int nq) const {
        if (threadIdx.x < R) {
            const ssm_i64 q = q0 + ((int)threadIdx.x < nq ? threadIdx.x : nq - 1);
            const ssm_i64 i = (b * L + q) * H + h;
            cum_q[threadIdx.x] = cum[i];
            dt_q[threadIdx.x] = dte[i];
            seq_q[threadIdx.x] = ssd_seq(seq, b * L + q);
        }
    }
    // The factored weights of q-tile q0 off the diagonal, without restarts: every entry is
    // live (entries past nr or nq are zero products), and exp(cum_r - cum_q) (lower; UPPER
    // transposed) factors through the chunk sum at the later tile's first step, ref, as
    // exp(cum_r - ref) exp(ref - cum_q), both exponents <= 0 when the sums do not increase.
    // Thread i < R sets f_r[i] and f_q[i] (times dt'_q with DTQ) from the row and q-tile
    // values it loaded itself, and returns whether an exponent exceeds 64 (the tile then
    // takes the entrywise weights).
    __device__ __forceinline__ bool factor(ssm_i64 q0, CT* f_r, CT* f_q) const {
        const int i = threadIdx.x;
        const CT ref = cum[(b * L + (UPPER ? q0 : r0)) * H + h];
        const CT er = UPPER ? ref - cum_r[i] : cum_r[i] - ref;
        const CT eq = UPPER ? cum_q[i] - ref : ref - cum_q[i];
        f_r[i] = ssd_exp<CT>(er);
        f_q[i] = DTQ ? ssd_exp<CT>(eq) * dt_q[i] : ssd_exp<CT>(eq);
        return er > CT(64) || eq > CT(64);
    }
    // ssd_chunk_cb's R x R block of q-tile q0: C B^T's block (rt, qt) as stored (entry (r, q)
    // at r R + q), read transposed for UPPER (entry (r, q) at q R + r).
    __device__ __forceinline__ const CT* cb_block(const CT* cb, ssm_i64 q0, ssm_i64 nc,
                                                  int classes, int tiles_per_chunk) const {
        const int rt = tile, qt = (int)((q0 - t0) / R);
        const int lo = UPPER ? rt : qt, hi = UPPER ? qt : rt;
        return cb + ((((b * nc + c) * classes + h / (H / classes)) *
                      (tiles_per_chunk * (tiles_per_chunk + 1) / 2)) + hi * (hi + 1) / 2 + lo) *
                        (R * R);
    }
    // The weighted block's entry (r, qi) of q-tile q0 from U_r . W_q = s: zero where masked.
    __device__ __forceinline__ CT weight(CT s, int r, int qi, ssm_i64 q0, int nq) const {
        const int ahead = qi - r - (int)(r0 - q0);  // step q - step r (tiles of one chunk)
        const bool live = r < nr && qi < nq && (UPPER ? ahead >= 0 : ahead <= 0) &&
                          seq_q[qi] == seq_r[r];
        if (!live) return CT(0);
        CT wv = ssd_exp<CT>(UPPER ? cum_q[qi] - cum_r[r] : cum_r[r] - cum_q[qi]) * s;
        if (DTQ) wv *= dt_q[qi];
        return wv;
    }
    // Writes output entry (r, v) (r < nr, v < V), with the skip connection and gate if given.
    template <typename TV, typename TO>
    __device__ __forceinline__ void write(CT val, int r, int v, int XV, int V, const CT* D,
                                          const TV* Vv, const TV* z, TO* out) const {
        const ssm_i64 idx = in_index(r, v, XV, V);
        if (D) val += D[(ssm_i64)h * V + v] * (CT)ssm_load(Vv[idx]);
        if (z) {
            const CT zv = (CT)ssm_load(z[idx]);
            val *= zv * ssm_math<CT>::sigmoid(zv);
        }
        ssm_store(out + out_index(r, v, V), val);
    }
    // Where output entry (r, v) reads x and z (head group hv, XV groups), and where it goes.
    __device__ __forceinline__ ssm_i64 in_index(int r, int v, int XV, int V) const {
        return ((b * L + r0 + r) * XV + hv) * V + v;
    }
    __device__ __forceinline__ ssm_i64 out_index(int r, int v, int V) const {
        return ((b * L + r0 + r) * H + h) * V + v;
    }
    // As write, for G entries at once (entry i = at(i, r, v), written where r < nr and
    // v < V), with the loads of x, D and z of all G issued before any is used, so that their
    // latencies overlap, and the gate's sigmoid from sigmoid_fast. Entry by entry each z load
    // was a round trip of its own (the float32 forward with z 0.4 ms slower at the peer row);
    // only the gated kernels use it, as it costs the others registers (benchmarks/SSD.md).
    template <int G, typename TV, typename TO, typename F>
    __device__ __forceinline__ void write_group(F at, int XV, int V, const CT* D, const TV* Vv,
                                                const TV* z, TO* out) const {
        CT val[G], xd[G], zv[G];
        int rr[G], vv[G];
#pragma unroll
        for (int i = 0; i < G; ++i) {
            val[i] = at(i, rr[i], vv[i]);
            const bool live = rr[i] < nr && vv[i] < V;
            const ssm_i64 idx = live ? in_index(rr[i], vv[i], XV, V) : 0;
            xd[i] = D && live ? D[(ssm_i64)h * V + vv[i]] * (CT)ssm_load(Vv[idx]) : CT(0);
            zv[i] = z && live ? (CT)ssm_load(z[idx]) : CT(0);
        }
#pragma unroll
        for (int i = 0; i < G; ++i) {
            CT y = val[i] + xd[i];
            if (z) y *= zv[i] * ssm_math<CT>::sigmoid_fast(zv[i]);
            if (rr[i] < nr && vv[i] < V) ssm_store(out + out_index(rr[i], vv[i], V), y);
        }
    }
};

template <typename TU, typename TW, typename TV, typename TO, typename CT, bool UPPER, bool MT,
          bool DTQ, int VM>
#ifndef SSD_MM_MIN_BLOCKS  // blocks per SM the registers must allow (VM 4: V > 128, rare)
#define SSD_MM_MIN_BLOCKS 2
#endif
__global__ void __launch_bounds__(SSD_THREADS, VM >= 4 ? 1 : SSD_MM_MIN_BLOCKS)
ssd_chunk_mm(const TU* __restrict__ U, const TW* __restrict__ W, const TV* __restrict__ Vv,
             const CT* __restrict__ Mm, const CT* __restrict__ D, const TV* __restrict__ z,
             const CT* __restrict__ dte, const CT* __restrict__ cum, const int* __restrict__ seq,
             const ssm_i64* __restrict__ starts, TO* __restrict__ out,
             ssm_i64 L, int H, int XU, int XW, int XV, int K, int V, ssm_i64 nc,
             ssm_i64 m_chunks, int tiles_per_chunk, const CT* __restrict__ cb, int classes) {
    constexpr int MR = ssd_mm_tile<CT>::MR, R = ssd_mm_tile<CT>::R, S = ssd_mm_tile<CT>::S;
    constexpr int RP = R + MR;            // padded rows: fewer bank conflicts when staging
    constexpr int VP = 16 * MR * VM;      // the columns the threads cover (>= V)
    constexpr int VS = VP + MR;
    typedef ssd_vec16<CT> vec;
    __shared__ vec us_v[S * RP / MR], ws_v[S * RP / MR], blk_v[R * RP / MR], vs_v[S * VS / MR];
    CT(*us)[RP] = reinterpret_cast<CT(*)[RP]>(us_v);    // U rows, us[k][r]
    CT(*ws)[RP] = reinterpret_cast<CT(*)[RP]>(ws_v);    // W rows, ws[k][q]
    CT(*blk)[RP] = reinterpret_cast<CT(*)[RP]>(blk_v);  // the weighted block, blk[q][r]
    CT(*vs)[VS] = reinterpret_cast<CT(*)[VS]>(vs_v);    // Vv rows vs[q][v] (phase 1: M, vs[k][v])
    __shared__ CT cum_r[R], cum_q[R], dt_q[R];
    __shared__ int seq_r[R], seq_q[R];
    static_assert(VP <= SSD_MAXD && 16 * 16 == SSD_THREADS, "tile sizes");

    const int tid = threadIdx.x, ty = tid / 16, tx = tid % 16;
    ssd_mm_block<CT, UPPER, DTQ, R> w(L, H, cum, dte, seq, cum_r, cum_q, dt_q, seq_r, seq_q);
    if (!w.at(blockIdx.x, tiles_per_chunk, nc, starts, XU, XW, XV)) return;
    const ssm_i64 b = w.b, c = w.c, r0 = w.r0;
    const int h = w.h, nr = w.nr, hu = w.hu, hw = w.hw, hv = w.hv;
    const ssm_i64 KV = (ssm_i64)K * V;
    w.load_rows();

    CT acc[MR][MR * VM];
#pragma unroll
    for (int i = 0; i < MR; ++i)
#pragma unroll
        for (int m = 0; m < MR * VM; ++m) acc[i][m] = 0;

    // Phase 1: the boundary term.
    const CT* M = Mm + ((b * m_chunks + c) * H + h) * KV;
    ssd_mm_rows<R, S, CT> ur;
    ssd_mm_cols<VP, S, CT> vr;
    ur.load(U, b * L + r0, nr, XU, hu, K, 0);
    vr.template load_m<MT>(M, K, V, 0);
    for (int k0 = 0; k0 < K; k0 += S) {
        __syncthreads();
        ur.store(us);
        vr.template store<MT>(vs);
        __syncthreads();
        if (k0 + S < K) {
            ur.load(U, b * L + r0, nr, XU, hu, K, k0 + S);
            vr.template load_m<MT>(M, K, V, k0 + S);
        }
        ssd_mm_accumulate<VM>(acc, us, vs);
    }
#pragma unroll
    for (int i = 0; i < MR; ++i) {
        const CT s = w.row_scale(ty * MR + i);
#pragma unroll
        for (int m = 0; m < MR * VM; ++m) acc[i][m] *= s;
    }

    // Phase 2: the diagonal block, q-tiles over the rows' reach.
    const ssm_i64 q_end = w.q_end();
    for (ssm_i64 q0 = w.q_begin(); q0 < q_end; q0 += R) {
        const int nq = (int)(q_end - q0 < R ? q_end - q0 : R);
        __syncthreads();
        w.load_q(q0, nq);
        // The block's entries U_r . W_q, rows ty MR + i, columns tx MR + j.
        CT sacc[MR][MR];
        // C B^T made by ssd_chunk_cb. Only the kinds without MT (y, ycore, GB) have U, W = C, B
        // or B, C: dB, dC compile without.
        if (!MT && cb) {
            const CT* blkp = w.cb_block(cb, q0, nc, classes, tiles_per_chunk);
#pragma unroll
            for (int a = 0; a < MR; ++a) {
                const vec v = *reinterpret_cast<const vec*>(
                    blkp + (UPPER ? tx * MR + a : ty * MR + a) * R + (UPPER ? ty : tx) * MR);
#pragma unroll
                for (int e = 0; e < MR; ++e) (UPPER ? sacc[e][a] : sacc[a][e]) = v.v[e];
            }
            __syncthreads();  // cum_q, dt_q, seq_q (the other branch's stages sync them)
        } else {
            ssd_mm_block_sum(sacc, us, ws, U, b * L + r0, nr, XU, hu, W, b * L + q0, nq, XW, hw, K);
        }
        vr.load(Vv, b * L + q0, nq, XV, hv, V, V);  // in flight while the weights are computed
        // Weighted and masked, into blk[q][r] (every entry written: zero where masked).
#pragma unroll
        for (int j = 0; j < MR; ++j) {
            const int qi = tx * MR + j;
            vec col;
#pragma unroll
            for (int i = 0; i < MR; ++i) col.v[i] = w.weight(sacc[i][j], ty * MR + i, qi, q0, nq);
            *reinterpret_cast<vec*>(&blk[qi][ty * MR]) = col;
        }
        for (int s0 = 0; s0 < nq; s0 += S) {
            __syncthreads();
            vr.template store<true>(vs);
            __syncthreads();
            if (s0 + S < nq) vr.load(Vv, b * L + q0 + s0 + S, nq - s0 - S, XV, hv, V, V);
            ssd_mm_accumulate<VM>(acc, blk + s0, vs);
        }
    }

    // Epilogue: skip connection and gate (the forward output only).
#pragma unroll
    for (int i = 0; i < MR; ++i) {
        const int r = ty * MR + i;
#pragma unroll
        for (int m = 0; m < MR * VM; ++m) {
            const int v = tx * MR + 16 * MR * (m / MR) + m % MR;
            if (r < nr && v < V) w.write(acc[i][m], r, v, XV, V, D, Vv, z, out);
        }
    }
}

// --------------------------------------------------------------------------------------
// ssd_chunk_mm_tc: ssd_chunk_mm's float products on tensor cores, on sm_80 and later
// (ssmkit._gpu.ssd chooses it; SSMKIT_SSD_TF32=0 keeps ssd_chunk_mm). Same arguments and the
// same sums, in another order.
//
// 3 x TF32: every operand value x is split once, when it is staged, into two TF32 values
// (ssm_tf32_split: hi rounded, lo = x - hi cut), and a b is summed as a_lo b_hi + a_hi b_lo +
// a_hi b_hi by mma.sync.m16n8k8 into float32 (the dropped a_lo b_lo is below float32's
// rounding), so the products keep nearly float32's accuracy (operands to about 22 bits).
//
// A block owns R = 64 rows, as ssd_chunk_mm (so ssd_chunk_cb's blocks fit), and 8 NT of the V
// columns (64 or 128; blocks ceil(V / 8 NT) apart in the grid take the others), 4 warps of 16
// rows. A warp holds its rows' outputs and, per q-tile, its rows of the weighted block in
// accumulator registers, which it multiplies by Vv from there: lane (g, t) holds columns 2t
// and 2t + 1 of each 8, and those serve as k slots t and t + 4 of the next product when its
// B fragments take k = 2t, 2t + 1 too (ssm_tc_frag_acc, ssd_tc_frag_b). Every product here
// uses that k order.
// Shared stages hold SSD_TC_KS = 16 values of k (or q) per row, split: a row is 8 units of 16
// bytes (hi and lo of the pair k = 2p, 2p + 1: hi_2p, hi_2p+1, lo_2p, lo_2p+1, so that a B
// fragment's hi and lo halves are register pairs as loaded), unit p of row r stored at
// p ^ rot(r % 8), so that the fragment reads (a quarter warp: 2 rows x 4 units) and the
// transposed stores (8 rows, one unit each) touch 8 different units of the 32 banks.
// With one TF32 pass (SSM_TF32_PASSES 1) there is no lo: a unit holds the hi of two pairs,
// p (x, y) and p + 4 (z, w), so a row is 4 units (half the bytes, half the stores), the
// fragments of both k8 blocks are the two halves of the same loads, and unit p of row r lies
// at p ^ ((r / 2) % 4) (a quarter warp's fragment reads are 2 whole rows; its transposed
// stores, 8 rows at one unit, touch 8 different units).
// Grid: (batch * H * nc * tiles_per_chunk * ceil(V / 8 NT)), SSD_TC_THREADS threads.
// --------------------------------------------------------------------------------------
#define SSD_TC_THREADS 128
#ifndef SSD_TC_KS  // k (or q) per shared stage: 16 or 32
#define SSD_TC_KS 16
#endif
// pairs of k per 16-byte unit, and units per stage row
#define SSD_TC_UP (SSM_TF32_PASSES == 1 ? 2 : 1)
#define SSD_TC_UNITS (SSD_TC_KS / 2 / SSD_TC_UP)
static_assert(SSD_TC_UNITS == 4 || SSD_TC_UNITS % 8 == 0, "ssd_tc_unit: rows of 4 or 8 k units");

// (the 3 x TF32 primitives ssm_tf32_split, ssm_mma_tf32 and ssm_mma3: ssm_tf32.cuh)

// Where unit p of row r of a stage lies: p ^ rot(r % 8), rot = 0 4 1 5 2 6 3 7 (rows of 4
// units: p ^ ((r / 2) % 4)).
__device__ __forceinline__ int ssd_tc_unit(int r, int p) {
    if (SSD_TC_UNITS == 4) return p ^ ((r >> 1) & 3);
    return p ^ (((r >> 1) & 3) | ((r & 1) << 2));
}

// The fragments of k8 block j (k = 8 j .. 8 j + 7 of the stage) for lane (g, t): A from rows
// row0 + g and row0 + g + 8, B (the n-tile of rows n0 ..) from row n0 + g; k slot t is
// k = 8 j + 2t and slot t + 4 is k = 8 j + 2t + 1.
// (Pair 4 j + t lies in unit (4 j) % SSD_TC_UNITS + t, in its half (4 j) / SSD_TC_UNITS: the
// half is known where j is unrolled.)
__device__ __forceinline__ ssm_tc_a ssd_tc_frag_a(const uint4 (*st)[SSD_TC_UNITS], int row0, int j) {
    const int lane = threadIdx.x & 31, g = lane >> 2, p = (4 * j) % SSD_TC_UNITS + (lane & 3);
    const uint4 x = st[row0 + g][ssd_tc_unit(row0 + g, p)];
    const uint4 y = st[row0 + g + 8][ssd_tc_unit(row0 + g + 8, p)];
    if (SSD_TC_UP == 1) return {{x.x, y.x, x.y, y.y}, {x.z, y.z, x.w, y.w}};
    if ((4 * j) / SSD_TC_UNITS == 0) return {{x.x, y.x, x.y, y.y}, {0u, 0u, 0u, 0u}};
    return {{x.z, y.z, x.w, y.w}, {0u, 0u, 0u, 0u}};
}
__device__ __forceinline__ ssm_tc_b ssd_tc_frag_b(const uint4 (*st)[SSD_TC_UNITS], int n0, int j) {
    const int lane = threadIdx.x & 31, g = lane >> 2, p = (4 * j) % SSD_TC_UNITS + (lane & 3);
    const uint4 x = st[n0 + g][ssd_tc_unit(n0 + g, p)];
    if (SSD_TC_UP == 1) return {x.x, x.y, x.z, x.w};
    if ((4 * j) / SSD_TC_UNITS == 0) return {x.x, x.y, 0u, 0u};
    return {x.z, x.w, 0u, 0u};
}

// acc[nt] += the stage's product of rows arow0 .. arow0 + 15 of `as` and the NT n-tiles of
// `bs` (sums over the stage's SSD_TC_KS values of k).
template <int NT>
__device__ __forceinline__ void ssd_tc_stage_mma(float (&acc)[NT][4], const uint4 (*as)[SSD_TC_UNITS],
                                                 int arow0, const uint4 (*bs)[SSD_TC_UNITS]) {
#pragma unroll
    for (int j = 0; j < SSD_TC_KS / 8; ++j) {
        const ssm_tc_a a = ssd_tc_frag_a(as, arow0, j);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) ssm_mma3(acc[nt], a, ssd_tc_frag_b(bs, 8 * nt, j));
    }
}

// One stage of ROWS rows, moved in two steps as ssd_mm_rows: load() brings this thread's
// values into registers, store() splits them into the stage. Value (o, k) of the stage,
// o < ROWS and k < SSD_TC_KS, is src[o * stride + k0 + k], or with COLS (src read across its
// rows) src[(k0 + k) * stride + o]; zero where o >= n_out or k0 + k >= n_k. A thread moves
// units p: the pairs k = 2p, 2p + 1 (and, with one TF32 pass, k = 2p + KS / 2, 2p + 1 + KS / 2),
// its j-th unit O_STEP rows (or, with COLS, K_STEP values of k) after its first; with COLS
// consecutive threads take consecutive o (coalesced reads). A stage wholly inside the bounds
// is loaded without tests.
template <int ROWS, bool COLS> struct ssd_tc_stage {
    static constexpr int U = SSD_TC_UNITS, UP = SSD_TC_UP, HALF = SSD_TC_KS / 2;
    static constexpr int PER = ROWS * U / SSD_TC_THREADS;
    static constexpr int O_STEP = SSD_TC_THREADS / U;
    static constexpr int K_STEP = 2 * (SSD_TC_THREADS / ROWS);
    static_assert(PER * SSD_TC_THREADS == ROWS * U, "whole units per thread");
    static_assert(!COLS || SSD_TC_THREADS % ROWS == 0, "a thread's o is fixed");
    float v[PER][2 * UP];  // v[j][2 h + e]: value k = 2p + e + h HALF of the j-th unit
    __device__ __forceinline__ static void where(int j, int& o, int& p) {
        const int i = threadIdx.x + j * SSD_TC_THREADS;
        o = COLS ? i % ROWS : i / U;
        p = COLS ? i / ROWS : i % U;
    }
    template <typename T>
    __device__ __forceinline__ void load(const T* __restrict__ src, ssm_i64 stride, int n_out,
                                         int n_k, int k0) {
        int o, p;
        where(0, o, p);
        const int k = k0 + 2 * p;
        const T* __restrict__ s = src + (COLS ? (ssm_i64)k * stride + o : (ssm_i64)o * stride + k);
        const ssm_i64 step = (ssm_i64)(COLS ? K_STEP : O_STEP) * stride;  // to the next unit
        const ssm_i64 next = COLS ? stride : 1;                          // to k + 1
        if constexpr (UP == 1) {  // (the form the 3 x TF32 kernels were tuned with)
            if (n_out >= ROWS && k0 + SSD_TC_KS <= n_k) {
#pragma unroll
                for (int j = 0; j < PER; ++j) {
                    v[j][0] = (float)ssm_load(s[j * step]);
                    v[j][1] = (float)ssm_load(s[j * step + next]);
                }
            } else {
#pragma unroll
                for (int j = 0; j < PER; ++j) {
                    const int oj = COLS ? o : o + j * O_STEP, kj = COLS ? k + j * K_STEP : k;
                    const bool live = oj < n_out;
                    v[j][0] = live && kj < n_k ? (float)ssm_load(s[j * step]) : 0.f;
                    v[j][1] = live && kj + 1 < n_k ? (float)ssm_load(s[j * step + next]) : 0.f;
                }
            }
        } else if (n_out >= ROWS && k0 + SSD_TC_KS <= n_k) {
#pragma unroll
            for (int j = 0; j < PER; ++j)
#pragma unroll
                for (int e = 0; e < 2 * UP; ++e)
                    v[j][e] = (float)ssm_load(s[j * step + ((e >> 1) * HALF + (e & 1)) * next]);
        } else {
#pragma unroll
            for (int j = 0; j < PER; ++j) {
                const int oj = COLS ? o : o + j * O_STEP, kj = COLS ? k + j * K_STEP : k;
                const bool live = oj < n_out;
#pragma unroll
                for (int e = 0; e < 2 * UP; ++e) {
                    const int de = (e >> 1) * HALF + (e & 1);
                    v[j][e] = live && kj + de < n_k ? (float)ssm_load(s[j * step + de * next]) : 0.f;
                }
            }
        }
    }
    // With w, value (o, k) is stored times w[k] (the stage's weights, in shared memory); with
    // w_row, times w_row[o].
    __device__ __forceinline__ void store(uint4 (*st)[SSD_TC_UNITS], const float* w = nullptr,
                                          const float* w_row = nullptr) const {
#pragma unroll
        for (int j = 0; j < PER; ++j) {
            int o, p;
            where(j, o, p);
            const float f = w_row ? w_row[o] : 1.f;
            uint4 u;
            if constexpr (UP == 1) {
                ssm_tf32_split(w ? w[2 * p] * v[j][0] : f * v[j][0], u.x, u.z);
                ssm_tf32_split(w ? w[2 * p + 1] * v[j][1] : f * v[j][1], u.y, u.w);
            } else {  // hi of k = 2p, 2p + 1, 2p + HALF, 2p + 1 + HALF (lo is zero)
                unsigned hi[4], lo;
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int kk = 2 * p + (e >> 1) * HALF + (e & 1);
                    ssm_tf32_split(w ? w[kk] * v[j][e] : f * v[j][e], hi[e], lo);
                }
                u.x = hi[0], u.y = hi[1], u.z = hi[2], u.w = hi[3];
            }
            st[o][ssd_tc_unit(o, p)] = u;
        }
    }
};

// Stage weights for ssd_tc_sum: none.
struct ssd_tc_unweighted {
    __device__ __forceinline__ const float* operator()(int) const { return nullptr; }
};

// acc += A B^T over k < n_k: A's rows arow0 .. arow0 + 15 (stage `as`) and B's NT n-tiles
// (stage `bs`), stage after stage. la, lb hold a stage in registers; load_a(k0), load_b(k0)
// fill them, and stage k + 1's loads are in flight while stage k is summed. weights(k0), run
// before the stage's first barrier, gives the weights A's values are stored times (see
// ssd_tc_stage::store; it may write them to shared memory then), or null: one per k, or
// with ROW_WEIGHTS one per row of A.
template <int NT, bool ROW_WEIGHTS = false, class LA, class LB, class FA, class FB,
          class FW = ssd_tc_unweighted>
__device__ __forceinline__ void ssd_tc_sum(float (&acc)[NT][4], uint4 (*as)[SSD_TC_UNITS],
                                           uint4 (*bs)[SSD_TC_UNITS], int arow0, LA& la,
                                           LB& lb, FA load_a, FB load_b, int n_k,
                                           FW weights = FW()) {
    load_a(0);
    load_b(0);
    for (int k0 = 0; k0 < n_k; k0 += SSD_TC_KS) {
        const float* w = weights(k0);
        __syncthreads();
        if (ROW_WEIGHTS)
            la.store(as, nullptr, w);
        else
            la.store(as, w);
        lb.store(bs);
        __syncthreads();
        if (k0 + SSD_TC_KS < n_k) {
            load_a(k0 + SSD_TC_KS);
            load_b(k0 + SSD_TC_KS);
        }
        ssd_tc_stage_mma<NT>(acc, as, arow0, bs);
    }
}

// The warp's rows of an R x R block of ssd_chunk_cb's layout (entry (r, q) at r R + q; UPPER:
// the transposed block's, entry (r, q) at q R + r), as mma accumulators of 16 rows from wr.
template <bool UPPER, int R>
__device__ __forceinline__ void ssd_tc_block_frags(float (&sacc)[R / 8][4], const float* blkp,
                                                   int wr) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int jj = 0; jj < R / 8; ++jj)
#pragma unroll
        for (int i = 0; i < 2; ++i) {  // rows r, columns q and q + 1
            const int r = wr + g + 8 * i, q = 8 * jj + 2 * t;
            if (UPPER) {
                sacc[jj][2 * i] = blkp[q * R + r];
                sacc[jj][2 * i + 1] = blkp[(q + 1) * R + r];
            } else {
                const float2 v = *reinterpret_cast<const float2*>(blkp + r * R + q);
                sacc[jj][2 * i] = v.x;
                sacc[jj][2 * i + 1] = v.y;
            }
        }
}

// acc += the warp's rows of a weighted R x R block (sacc, as mma accumulators) times nq <= R
// rows of Vv from Vq (nv <= 8 NT columns, rows v_stride apart), staged SSD_TC_KS rows at a
// time as [v][q] in bs (a stage of at least 8 NT rows; its barriers fence the caller's
// previous reads of bs).
template <int NT, int R, typename TV>
__device__ __forceinline__ void ssd_tc_times_v(float (&acc)[NT][4], const float (&sacc)[R / 8][4],
                                               uint4 (*bs)[SSD_TC_UNITS], const TV* Vq,
                                               ssm_i64 v_stride, int nv, int nq) {
    constexpr int KS = SSD_TC_KS;
    ssd_tc_stage<8 * NT, true> vl;
    vl.load(Vq, v_stride, nv, nq, 0);
#pragma unroll
    for (int s = 0; s < R / KS; ++s) {
        if (s * KS >= nq) break;
        __syncthreads();
        vl.store(bs);
        __syncthreads();
        if ((s + 1) * KS < nq) vl.load(Vq, v_stride, nv, nq, (s + 1) * KS);
#pragma unroll
        for (int j = 0; j < KS / 8; ++j) {
            const ssm_tc_a a = ssm_tc_frag_acc(sacc[s * (KS / 8) + j]);
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) ssm_mma3(acc[nt], a, ssd_tc_frag_b(bs, 8 * nt, j));
        }
    }
}

// ssd_chunk_mm_tc's ROWS epilogue (see there): acc holds GB of the warp's rows wr + g,
// wr + g + 8 at columns 8 nt + 2t, + 1 (the block's V columns from 0). The row sums over the
// 4 lanes of a row by shuffles; dY x over the block's rows by shuffles over g, then the warps
// in order through `sh` (4 x 8 NT floats, free after the products: the caller's stage).
template <int NT, class BLOCK>
__device__ __forceinline__ void ssd_tc_rows_epilogue(const float (&acc)[NT][4], const BLOCK& w,
                                                     int wr, int V, int XV, const float* D,
                                                     const float* dY, const float* X,
                                                     const float* yc, float* dx, float* xgb,
                                                     float* dcum, float* dD_part, float* sh) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, warp = threadIdx.x >> 5;
    float dd[NT][2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {  // rows r = wr + g + 8 i
        const int r = wr + g + 8 * i;
        const bool live = r < w.nr;
        const ssm_i64 row = (w.b * w.L + w.r0 + r) * w.H + w.h;
        const float e = live ? w.dte[row] : 0.0f;
        float sx = 0.0f, sy = 0.0f;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                const int v = 8 * nt + 2 * t + c;
                float dyv = 0.0f, xv = 0.0f;
                if (live && v < V) {
                    const ssm_i64 at = w.in_index(r, v, XV, V);
                    const float gv = acc[nt][2 * i + c];
                    dyv = dY[at];
                    xv = X[at];
                    sx += xv * gv;
                    sy += dyv * yc[at];
                    dx[w.out_index(r, v, V)] = e * gv + (D ? D[(ssm_i64)w.h * V + v] * dyv : 0.0f);
                }
                dd[nt][c] = i == 0 ? dyv * xv : dd[nt][c] + dyv * xv;
            }
#pragma unroll
        for (int m = 1; m <= 2; m <<= 1) {
            sx += __shfl_xor_sync(0xffffffffu, sx, m);
            sy += __shfl_xor_sync(0xffffffffu, sy, m);
        }
        if (live && t == 0) {
            xgb[row] = sx;
            dcum[row] = sy - e * sx;
        }
    }
    // dY x over the warp's 16 rows (lanes g), then over the warps in order
    if (!dD_part) return;  // (uniform: no D)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
#pragma unroll
            for (int m = 4; m <= 16; m <<= 1) dd[nt][c] += __shfl_xor_sync(0xffffffffu, dd[nt][c], m);
            if (g == 0) sh[warp * 8 * NT + 8 * nt + 2 * t + c] = dd[nt][c];
        }
    __syncthreads();
    for (int v = threadIdx.x; v < V; v += SSD_TC_THREADS) {
        float sum = 0.0f;
#pragma unroll
        for (int k = 0; k < SSD_TC_THREADS / 32; ++k) sum += sh[k * 8 * NT + v];
        dD_part[v] = sum;
    }
}

#ifndef SSD_TC_MIN_BLOCKS  // blocks per SM the registers must allow
#define SSD_TC_MIN_BLOCKS 3
#endif
// GATE: an instance for the forward output with z (write_group's epilogue).
// ROWS (GB of float32 x only, V <= 8 NT: a block holds whole rows): the epilogue is the
// backward's per-step pass (ssd_bwd_rows) on the block's rows, GB never written:
//   out = dx = dt'_r GB + D dY (D: H x V, or null),
//   xgb[row] = x_r . GB_r, dcum[row] = dY_r . ycore_r - dt'_r xgb[row] (rows (batch L) x H),
//   dD_part[tile, v] = sum over the block's rows of dY x (tile = blockIdx.x, zeroed by the
//   caller: blocks past their chunk's end write nothing; null: not wanted), with dY = Vv,
//   x = Xr, ycore = yc in Vv's layout.
template <typename TU, typename TW, typename TV, typename TO, bool UPPER, bool MT, bool DTQ,
          int NT, bool GATE = false, bool ROWS = false>
__global__ void __launch_bounds__(SSD_TC_THREADS, NT > 8 ? 2 : SSD_TC_MIN_BLOCKS)
ssd_chunk_mm_tc(const TU* __restrict__ U, const TW* __restrict__ W, const TV* __restrict__ Vv,
                const float* __restrict__ Mm, const float* __restrict__ D,
                const TV* __restrict__ z, const float* __restrict__ dte,
                const float* __restrict__ cum, const int* __restrict__ seq,
                const ssm_i64* __restrict__ starts, TO* __restrict__ out, ssm_i64 L, int H,
                int XU, int XW, int XV, int K, int V, ssm_i64 nc, ssm_i64 m_chunks,
                int tiles_per_chunk, const float* __restrict__ cb, const float* __restrict__ Xr,
                const float* __restrict__ yc, float* __restrict__ xgb, float* __restrict__ dcum,
                float* __restrict__ dD_part, int classes) {
    constexpr int R = ssd_mm_tile<float>::R, KS = SSD_TC_KS;
    constexpr int VR = 8 * NT;           // the block's columns of V: NT n-tiles of 8
    constexpr int BR = VR > R ? VR : R;  // rows of the second stage: M, W or Vv^T
    static_assert(R == 16 * (SSD_TC_THREADS / 32), "a warp per 16 rows");
    __shared__ uint4 us[R][SSD_TC_UNITS], bs[BR][SSD_TC_UNITS];  // U rows; M, W rows or Vv^T
    __shared__ float cum_r[R], cum_q[R], dt_q[R];
    __shared__ int seq_r[R], seq_q[R];

    const int tid = threadIdx.x, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int wr = 16 * (tid >> 5);  // the warp's first row
    const int v_blocks = (V + VR - 1) / VR;
    const int v0 = (int)(blockIdx.x % v_blocks) * VR, nv = V - v0 < VR ? V - v0 : VR;
    ssd_mm_block<float, UPPER, DTQ, R> w(L, H, cum, dte, seq, cum_r, cum_q, dt_q, seq_r, seq_q);
    if (!w.at((ssm_i64)blockIdx.x / v_blocks, tiles_per_chunk, nc, starts, XU, XW, XV)) return;
    const ssm_i64 b = w.b, c = w.c, r0 = w.r0;
    const int h = w.h, nr = w.nr, hu = w.hu, hw = w.hw, hv = w.hv;
    const ssm_i64 KV = (ssm_i64)K * V;
    w.load_rows();

    float acc[NT][4];
    ssm_mma_zero(acc);

    // Phase 1: the boundary term, U rows times M (as [v][k]: M's rows, or its columns with MT).
    const TU* Ur = U + ((b * L + r0) * XU + hu) * (ssm_i64)K;
    const ssm_i64 u_stride = (ssm_i64)XU * K;
    const float* M = Mm + ((b * m_chunks + c) * H + h) * KV + (MT ? v0 : (ssm_i64)v0 * K);
    {
        ssd_tc_stage<R, false> ul;
        ssd_tc_stage<VR, MT> ml;
        ssd_tc_sum(acc, us, bs, wr, ul, ml, [&](int k0) { ul.load(Ur, u_stride, nr, K, k0); },
                   [&](int k0) { ml.load(M, MT ? V : K, nv, K, k0); }, K);
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const float s = w.row_scale(wr + g + 8 * i);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            acc[nt][2 * i] *= s;
            acc[nt][2 * i + 1] *= s;
        }
    }

    // Phase 2: the diagonal block, q-tiles over the rows' reach.
    const ssm_i64 q_end = w.q_end();
    for (ssm_i64 q0 = w.q_begin(); q0 < q_end; q0 += R) {
        const int nq = (int)(q_end - q0 < R ? q_end - q0 : R);
        __syncthreads();
        w.load_q(q0, nq);
        // The block's entries U_r . W_q for the warp's rows, as mma accumulators.
        float sacc[R / 8][4];
        if (!MT && cb) {  // C B^T made by ssd_chunk_cb (see ssd_chunk_mm)
            ssd_tc_block_frags<UPPER, R>(sacc, w.cb_block(cb, q0, nc, classes, tiles_per_chunk), wr);
            __syncthreads();  // cum_q, dt_q, seq_q
        } else {
            ssm_mma_zero(sacc);
            const TW* Wq = W + ((b * L + q0) * XW + hw) * (ssm_i64)K;
            const ssm_i64 w_stride = (ssm_i64)XW * K;
            ssd_tc_stage<R, false> ul, wl;
            ssd_tc_sum(sacc, us, bs, wr, ul, wl, [&](int k0) { ul.load(Ur, u_stride, nr, K, k0); },
                       [&](int k0) { wl.load(Wq, w_stride, nq, K, k0); }, K);
        }
        // Weighted and masked in place (zero where masked).
#pragma unroll
        for (int jj = 0; jj < R / 8; ++jj)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int r = wr + g + 8 * (e >> 1), qi = 8 * jj + 2 * t + (e & 1);
                sacc[jj][e] = w.weight(sacc[jj][e], r, qi, q0, nq);
            }
        // Times Vv's rows q.
        ssd_tc_times_v<NT, R>(acc, sacc, bs, Vv + ((b * L + q0) * XV + hv) * (ssm_i64)V + v0,
                              (ssm_i64)XV * V, nv, nq);
    }

    // Epilogue: skip connection and gate (the forward output only).
    if constexpr (ROWS) {
        static_assert(!GATE && UPPER && ssm_same<TV, float>::value && ssm_same<TO, float>::value,
                      "the per-step pass follows GB of float32 x");
        if (v_blocks != 1) __trap();  // (the host takes the plain GB past 8 NT columns)
        ssd_tc_rows_epilogue<NT>(acc, w, wr, V, XV, D, Vv, Xr, yc, out, xgb, dcum,
                                 dD_part ? dD_part + (ssm_i64)blockIdx.x * V : nullptr,
                                 reinterpret_cast<float*>(us));
    } else if constexpr (GATE) {
        static_assert(NT % 2 == 0, "n-tile pairs");
#pragma unroll
        for (int nt = 0; nt < NT; nt += 2)  // (two n-tiles' 8 entries at a time)
            w.template write_group<8>([&](int i, int& r, int& v) {
                const int e = i & 3;
                r = wr + g + 8 * (e >> 1);
                v = v0 + 8 * (nt + (i >> 2)) + 2 * t + (e & 1);
                return acc[nt + (i >> 2)][e];
            }, XV, V, D, Vv, z, out);
    } else {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int r = wr + g + 8 * (e >> 1), v = v0 + 8 * nt + 2 * t + (e & 1);
                if (r < nr && v < V) w.write(acc[nt][e], r, v, XV, V, D, Vv, z, out);
            }
    }
}

// --------------------------------------------------------------------------------------
// dB and dC summed over heads, in float on tensor cores (3 x TF32, as ssd_chunk_mm_tc).
// dC_t sums over the heads h of C's group the diagonal block
// sum_{s<=t} exp(cum_t - cum_s) dt'_s (dY_t^h . x_s^h) B_s and the boundary term
// exp(cum_t) dY_t^h states_h; dB_s sums, over B's group, the same weighted entries (t, s)
// times C_t, and dt'_s exp(cum_E - cum_s) x_s^h dHx_h. Within a class of heads (the heads that
// read one B group and one C group, ssmkit._gpu.ssd.head_classes) both products with B (or
// C) are linear in the weighted block, so the heads' weighted blocks are summed first, once
// for dB and dC together, and each product is made once per class, not once per head:
//   ssd_chunk_hblocks_tc  the R x R blocks of sum_h [s <= t] exp(cum_t - cum_s) dt'_s
//                         dY_t^h . x_s^h over runs of a class's heads, in ssd_chunk_cb's
//                         layout (dC reads them as C B^T's, dB transposed as GB does): one
//                         partial per run, summed by ssd_sum_parts;
//   ssd_chunk_hsum_tc     the boundary terms of a run of the class's heads, plus (the first
//                         run) the summed blocks times Vv: one partial per run, summed by
//                         ssd_sum_parts; the host sums the classes of each group.
// U, Vv, M as ssd_chunk_mm_tc's dB (UPPER, ROWF: rows times dt'_r) and dC kinds.
// --------------------------------------------------------------------------------------

// Run `run` of `runs` of class k's heads (H / classes consecutive heads, runs of
// ceil(H / classes / runs), the last ones shorter or empty): heads h_begin .. h_end - 1.
// ssmkit._gpu.ssd.head_splits picks runs so that none is empty.
__device__ __forceinline__ void ssd_head_run(int H, int classes, int k, int runs, int run,
                                             int& h_begin, int& h_end) {
    const int hpk = H / classes, hpr = (hpk + runs - 1) / runs, end = (k + 1) * hpk;
    h_begin = k * hpk + run * hpr;
    h_end = h_begin + hpr < end ? h_begin + hpr : end;
}

// Grid: (batch * nc * classes * pairs * runs), pairs = T (T + 1) / 2 for T tiles per chunk;
// block (((b * nc + c) * classes + k) * pairs + rt (rt + 1) / 2 + qt) * runs + run sums run
// `run` of class k's heads (ssd_head_run) for row tile rt and q-tile
// qt <= rt, into gs + run gs_stride. dY rows t, x rows s. Blocks past the chunk's end write
// nothing.
template <typename TY, typename TX>
__global__ void __launch_bounds__(SSD_TC_THREADS, SSD_TC_MIN_BLOCKS)
ssd_chunk_hblocks_tc(const TY* __restrict__ dY, const TX* __restrict__ X,
                     const float* __restrict__ dte, const float* __restrict__ cum,
                     const int* __restrict__ seq, const ssm_i64* __restrict__ starts,
                     float* __restrict__ gs, ssm_i64 L, int H, int P, ssm_i64 nc,
                     int tiles_per_chunk, int classes, int runs, ssm_i64 gs_stride) {
    constexpr int R = ssd_mm_tile<float>::R;
    __shared__ uint4 us[R][SSD_TC_UNITS], ws[R][SSD_TC_UNITS];
    __shared__ float cum_r[R], cum_q[R], dt_q[R], f_r[R], f_q[R];
    __shared__ int seq_r[R], seq_q[R];
    const int tid = threadIdx.x, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int wr = 16 * (tid >> 5);
    const int pairs = tiles_per_chunk * (tiles_per_chunk + 1) / 2;
    const ssm_i64 blk = blockIdx.x / runs, bck = blk / pairs;
    const int run = (int)(blockIdx.x - blk * runs);
    const int pair = (int)(blk - bck * pairs);
    const ssm_i64 bc = bck / classes;
    const int k = (int)(bck - bc * classes);
    int rt = 0;
    while ((rt + 1) * (rt + 2) / 2 <= pair) ++rt;
    const int qt = pair - rt * (rt + 1) / 2;
    const int h0 = k * (H / classes);
    int h_begin, h_end;
    ssd_head_run(H, classes, k, runs, run, h_begin, h_end);
    ssd_mm_block<float, false, true, R> w(L, H, cum, dte, seq, cum_r, cum_q, dt_q, seq_r, seq_q);
    const ssm_i64 b = bc / nc, c = bc - b * nc;
    if (!w.at(((b * H + h0) * nc + c) * tiles_per_chunk + rt, tiles_per_chunk, nc, starts, H,
              H, 1))
        return;
    const ssm_i64 q0 = w.t0 + (ssm_i64)qt * R;
    const int nr = w.nr, nq = (int)(w.t1 - q0 < R ? w.t1 - q0 : R);
    const ssm_i64 stride = (ssm_i64)H * P;
    // A q-tile before the rows' tile without restarts takes factored weights (f_r, f_q; see
    // ssd_mm_block::factor), per head unless an exponent exceeds 64.
    const bool whole = !seq && qt != rt;

    float gsum[R / 8][4];
    ssm_mma_zero(gsum);
    for (int h = h_begin; h < h_end; ++h) {
        w.set_head(h, H, H, 1);
        __syncthreads();  // the previous head's reads of the row and q-tile values are done
        w.load_rows();
        w.load_q(q0, nq);
        bool far = false;
        if (whole && tid < R) far = w.factor(q0, f_r, f_q);
        // (whole: uniform; without it no vote, and ssd_tc_sum's first barrier publishes)
        const bool factored = whole && !__syncthreads_or(far);
        float sacc[R / 8][4];
        ssm_mma_zero(sacc);
        const TY* Yr = dY + ((b * L + w.r0) * H + h) * (ssm_i64)P;
        const TX* Xq = X + ((b * L + q0) * H + h) * (ssm_i64)P;
        ssd_tc_stage<R, false> yl, xl;
        ssd_tc_sum(sacc, us, ws, wr, yl, xl, [&](int k0) { yl.load(Yr, stride, nr, P, k0); },
                   [&](int k0) { xl.load(Xq, stride, nq, P, k0); }, P);
#pragma unroll
        for (int jj = 0; jj < R / 8; ++jj)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int r = wr + g + 8 * (e >> 1), qi = 8 * jj + 2 * t + (e & 1);
                gsum[jj][e] += factored ? sacc[jj][e] * f_r[r] * f_q[qi]
                                        : w.weight(sacc[jj][e], r, qi, q0, nq);
            }
    }
    // Entry (r, q) at r R + q, zeros included.
    float* const out = gs + run * gs_stride + blk * (R * R);
#pragma unroll
    for (int jj = 0; jj < R / 8; ++jj)
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const int r = wr + g + 8 * i, q = 8 * jj + 2 * t;
            float2 v;
            v.x = gsum[jj][2 * i];
            v.y = gsum[jj][2 * i + 1];
            *reinterpret_cast<float2*>(out + r * R + q) = v;
        }
}

// Grid: (batch * nc * T * classes * runs * ceil(V / 8 NT)); block
// ((((b * nc + c) * T + rt) * classes + k) * runs + run) * v_blocks + vb, for run `run` of
// class k's heads (ssd_head_run). part: (runs, batch, L, classes, V), part_stride apart;
// every entry of a row in a chunk written by each run.
template <typename TU, typename TV, bool UPPER, bool ROWF, int NT>
__global__ void __launch_bounds__(SSD_TC_THREADS, NT > 8 ? 2 : SSD_TC_MIN_BLOCKS)
ssd_chunk_hsum_tc(const TU* __restrict__ U, const TV* __restrict__ Vv,
                  const float* __restrict__ Mm, const float* __restrict__ gs,
                  const float* __restrict__ dte, const float* __restrict__ cum,
                  const int* __restrict__ seq, const ssm_i64* __restrict__ starts,
                  float* __restrict__ part, ssm_i64 L, int H, int XU, int XV, int K, int V,
                  ssm_i64 nc, ssm_i64 m_chunks, int tiles_per_chunk, int classes, int runs,
                  ssm_i64 part_stride) {
    constexpr int R = ssd_mm_tile<float>::R, KS = SSD_TC_KS;
    constexpr int VR = 8 * NT, BR = VR > R ? VR : R;
    __shared__ uint4 us[R][SSD_TC_UNITS], bs[BR][SSD_TC_UNITS];  // U rows; M's columns or Vv^T
    __shared__ float cum_r[R], cum_q[R], dt_q[R], f_r[R];
    __shared__ int seq_r[R], seq_q[R];
    const int tid = threadIdx.x, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int wr = 16 * (tid >> 5);
    const int v_blocks = (V + VR - 1) / VR;
    const ssm_i64 blk = blockIdx.x / v_blocks;
    const int v0 = (int)(blockIdx.x - blk * v_blocks) * VR, nv = V - v0 < VR ? V - v0 : VR;
    const ssm_i64 bct = blk / ((ssm_i64)classes * runs);
    const int kr = (int)(blk - bct * classes * runs), k = kr / runs, run = kr - k * runs;
    const ssm_i64 bc = bct / tiles_per_chunk;
    const int rt = (int)(bct - bc * tiles_per_chunk);
    const ssm_i64 b = bc / nc, c = bc - b * nc;
    const int h0 = k * (H / classes);
    int h_begin, h_end;
    ssd_head_run(H, classes, k, runs, run, h_begin, h_end);
    ssd_mm_block<float, UPPER, false, R> w(L, H, cum, dte, seq, cum_r, cum_q, dt_q, seq_r, seq_q);
    if (!w.at(((b * H + h0) * nc + c) * tiles_per_chunk + rt, tiles_per_chunk, nc, starts, XU,
              1, XV))
        return;
    const ssm_i64 r0 = w.r0;
    const int nr = w.nr;
    const ssm_i64 KV = (ssm_i64)K * V, u_stride = (ssm_i64)XU * K;

    float acc[NT][4];
    ssm_mma_zero(acc);

    // The boundary terms: each head's U rows, times their factor, times M's columns.
    for (int h = h_begin; h < h_end; ++h) {
        w.set_head(h, XU, 1, XV);
        const TU* Ur = U + ((b * L + r0) * XU + w.hu) * (ssm_i64)K;
        const float* M = Mm + ((b * m_chunks + c) * H + h) * KV + v0;
        ssd_tc_stage<R, false> ul;
        ssd_tc_stage<VR, true> ml;
        ssd_tc_sum<NT, true>(
            acc, us, bs, wr, ul, ml, [&](int k0) { ul.load(Ur, u_stride, nr, K, k0); },
            [&](int k0) { ml.load(M, V, nv, K, k0); }, K,
            [&](int k0) {  // the rows' factors, each from its own thread's row values
                if (k0 == 0 && tid < R) {
                    w.load_rows();
                    const float f = w.row_scale(tid);
                    f_r[tid] = ROWF ? f * dte[(b * L + r0 + (tid < nr ? tid : nr - 1)) * H + h] : f;
                }
                return (const float*)f_r;
            });
    }

    // The summed blocks times Vv (the first run): q-tiles over the rows' reach.
    if (run == 0) {
        w.set_head(h0, XU, 1, XV);
        for (ssm_i64 q0 = w.q_begin(); q0 < w.q_end(); q0 += R) {
            const int nq = (int)(w.q_end() - q0 < R ? w.q_end() - q0 : R);
            float sacc[R / 8][4];
            ssd_tc_block_frags<UPPER, R>(sacc, w.cb_block(gs, q0, nc, classes, tiles_per_chunk), wr);
            ssd_tc_times_v<NT, R>(acc, sacc, bs, Vv + ((b * L + q0) * XV + w.hv) * (ssm_i64)V + v0,
                                  (ssm_i64)XV * V, nv, nq);
        }
    }

    float* const out = part + (ssm_i64)run * part_stride;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int r = wr + g + 8 * (e >> 1), v = v0 + 8 * nt + 2 * t + (e & 1);
            if (r < nr && v < V) out[((b * L + r0 + r) * classes + k) * V + v] = acc[nt][e];
        }
}

// --------------------------------------------------------------------------------------
// ssd_chunk_state_tc: ssd_chunk_state in float on tensor cores (3 x TF32, as
// ssd_chunk_mm_tc; ssmkit._gpu.ssd chooses it with the products). Same arguments and sums.
// A block computes a 64 x 8 NT tile of the P x N result (NT 8 or 16, as ssd_chunk_mm_tc),
// 4 warps of 16 rows p; the steps s are the k of the product, staged SSD_TC_KS at a time as
// X^T (rows p, times w_s as they are split) and Y^T (rows n).
// Grid: (batch * nc, H, ceil(P / 64) * ceil(N / 8 NT)), SSD_TC_THREADS threads.
// --------------------------------------------------------------------------------------
template <typename TX, typename TY, bool ADJ, int NT>
__global__ void __launch_bounds__(SSD_TC_THREADS, NT > 8 ? 2 : SSD_TC_MIN_BLOCKS)
ssd_chunk_state_tc(const TX* __restrict__ X, const TY* __restrict__ Y,
                   const float* __restrict__ dte, const float* __restrict__ cum,
                   const int* __restrict__ seq, const ssm_i64* __restrict__ starts,
                   float* __restrict__ out, ssm_i64 L, int H, int P, int GY, int N, ssm_i64 nc) {
    constexpr int R = ssd_mm_tile<float>::R, KS = SSD_TC_KS, NR = 8 * NT;  // NR columns n
    __shared__ uint4 xs[R][SSD_TC_UNITS], ys[NR][SSD_TC_UNITS];
    __shared__ float w_sh[KS];
    const int tid = threadIdx.x, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int wr = 16 * (tid >> 5);  // the warp's first row p
    const ssm_i64 e = blockIdx.x;    // = b * nc + c
    const int h = blockIdx.y;
    const int p_tiles = (P + R - 1) / R;
    const int p0 = (blockIdx.z % p_tiles) * R, n0 = (blockIdx.z / p_tiles) * NR;
    const ssm_i64 b = e / nc, c = e - b * nc;
    const ssm_i64 t0 = starts[c], t1 = starts[c + 1], E = t1 - 1;
    const int n_s = (int)(t1 - t0), gy = h / (H / GY);
    const float cum_E = cum[(b * L + E) * H + h];
    const int seq_ref = ADJ ? ssd_seq(seq, b * L + (t0 > 0 ? t0 - 1 : 0)) : ssd_seq(seq, b * L + E);
    const TX* Xs = X + ((b * L + t0) * H + h) * (ssm_i64)P + p0;
    const TY* Ys = Y + ((b * L + t0) * GY + gy) * (ssm_i64)N + n0;
    const ssm_i64 x_stride = (ssm_i64)H * P, y_stride = (ssm_i64)GY * N;

    float acc[NT][4];
    ssm_mma_zero(acc);
    ssd_tc_stage<R, true> xl;
    ssd_tc_stage<NR, true> yl;
    float cs = 0.f, ds = 0.f;  // thread tid < KS: cum, dt' and seq of the stage's step tid
    int sq = 0;
    ssd_tc_sum(
        acc, xs, ys, wr, xl, yl,
        [&](int k0) { xl.load(Xs, x_stride, P - p0, n_s, k0); },
        [&](int k0) {  // Y^T and the weights' inputs
            yl.load(Ys, y_stride, N - n0, n_s, k0);
            if (tid < KS && k0 + tid < n_s) {
                const ssm_i64 i = (b * L + t0 + k0 + tid) * H + h;
                cs = cum[i];
                ds = ADJ ? 0.f : dte[i];
                sq = ssd_seq(seq, b * L + t0 + k0 + tid);
            }
        },
        n_s,
        [&](int k0) {  // the last stage's stores read w_sh before the barrier after them
            if (tid < KS)
                w_sh[tid] = k0 + tid < n_s && sq == seq_ref
                                ? (ADJ ? ssd_exp<float>(cs) : ssd_exp<float>(cum_E - cs) * ds)
                                : 0.f;
            return (const float*)w_sh;
        });
    const ssm_i64 PN = (ssm_i64)P * N;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const int p = p0 + wr + g + 8 * (q >> 1), n = n0 + 8 * nt + 2 * t + (q & 1);
            if (p < P && n < N) out[(e * H + h) * PN + (ssm_i64)p * N + n] = acc[nt][q];
        }
}

// --------------------------------------------------------------------------------------
// C B^T of every chunk, once per class of heads (the heads that read the same B group and
// the same C group; one class when G = 1), for ssd_chunk_mm's q-tile sums when its U, W are
// C, B (or, transposed, B, C): the R x R blocks (rt, qt), qt <= rt, of rows t0 + rt R ..
// and columns t0 + qt R .. of the chunk's C B^T, summed exactly as ssd_chunk_mm sums them,
// at cb[(((b * nc + c) * classes + k) * pairs + rt (rt + 1) / 2 + qt) * R * R + r * R + q].
// Blocks past a chunk's end are not written (ssd_chunk_mm does not read them).
// Grid: (batch * nc * classes * pairs), pairs = T (T + 1) / 2 for T tiles per chunk.
// --------------------------------------------------------------------------------------
template <typename TB, typename CT>
__global__ void __launch_bounds__(SSD_THREADS)
ssd_chunk_cb(const TB* __restrict__ C, const TB* __restrict__ B,
             const ssm_i64* __restrict__ starts, CT* __restrict__ cb, ssm_i64 L, int GB, int GC,
             int N, ssm_i64 nc, int classes, int pairs) {
    constexpr int MR = ssd_mm_tile<CT>::MR, R = ssd_mm_tile<CT>::R, S = ssd_mm_tile<CT>::S;
    constexpr int RP = R + MR;
    typedef ssd_vec16<CT> vec;
    __shared__ vec us_v[S * RP / MR], ws_v[S * RP / MR];
    const ssm_i64 blk = blockIdx.x;
    const int pair = (int)(blk % pairs);
    const ssm_i64 e = blk / pairs;  // = (b * nc + c) * classes + k
    const int k = (int)(e % classes);
    const ssm_i64 c = (e / classes) % nc, b = e / classes / nc;
    int rt = 0;
    while ((rt + 1) * (rt + 2) / 2 <= pair) ++rt;
    const int qt = pair - rt * (rt + 1) / 2;
    const ssm_i64 t0 = starts[c], t1 = starts[c + 1];
    const ssm_i64 r0 = t0 + (ssm_i64)rt * R, q0 = t0 + (ssm_i64)qt * R;
    if (r0 >= t1) return;
    const int nr = (int)(t1 - r0 < R ? t1 - r0 : R), nq = (int)(t1 - q0 < R ? t1 - q0 : R);
    CT sacc[MR][MR];
    ssd_mm_block_sum(sacc, reinterpret_cast<CT(*)[RP]>(us_v), reinterpret_cast<CT(*)[RP]>(ws_v),
                     C, b * L + r0, nr, GC, k / (classes / GC), B, b * L + q0, nq, GB,
                     k / (classes / GB), N);
    CT* out = cb + blk * (R * R);
    const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
#pragma unroll
    for (int i = 0; i < MR; ++i) {
        vec v;
#pragma unroll
        for (int j = 0; j < MR; ++j) v.v[j] = sacc[i][j];
        *reinterpret_cast<vec*>(out + (ty * MR + i) * R + tx * MR) = v;
    }
}

// --------------------------------------------------------------------------------------
// The CUDA-core backward's per-step element-wise work, fused: one warp per row (b, t, h) of
// P values (lane p, p + 32, ...), from the products' outputs GB = (G B)_t (without dt') and
// ycore (the recomputed output without D and gate) and dY (the output cotangent times
// silu'(z)):
//   xGB[row]  = sum_p x_p GB_p                       (for ddt)
//   dcum[row] = sum_p dY_p ycore_p - dt'_t xGB[row]  (the chunk sums' cotangent, without its
//                                                      boundary term)
//   dx_p      = dt'_t GB_p + D[h, p] dY_p
// and per block the partial sums of dY x over its steps, dD_part[blockIdx.x, h, p] (summed
// over the blocks by the caller, in a fixed order). Rows are (batch * L) x H.
// Grid: (ceil(batch * L / steps_per_block), H); a block's warps take its steps in turn.
// --------------------------------------------------------------------------------------
#define SSD_ROW_VALUES (SSD_MAXD / 32)  // values per lane: P <= SSD_MAXD
#define SSD_ROW_THREADS 128

template <typename TX, typename CT>
__global__ void __launch_bounds__(SSD_ROW_THREADS)
ssd_bwd_rows(const TX* __restrict__ X, const CT* __restrict__ GB, const CT* __restrict__ dY,
             const CT* __restrict__ ycore, const CT* __restrict__ dte, const CT* __restrict__ D,
             TX* __restrict__ dx, CT* __restrict__ xGB, CT* __restrict__ dcum,
             CT* __restrict__ dD_part, ssm_i64 steps, int H, int P, int steps_per_block) {
    constexpr int WARPS = SSD_ROW_THREADS / 32;
    __shared__ CT dd_sh[WARPS][32 * SSD_ROW_VALUES];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int h = blockIdx.y;
    const int nv = (P + 31) / 32;  // values this row gives each lane (uniform)
    ssm_i64 s0, s1;
    CT Dv[SSD_ROW_VALUES], dd[SSD_ROW_VALUES];
    ssm_row_block_start(s0, s1, Dv, dd, D, h, P, steps, steps_per_block);
    for (ssm_i64 s = s0 + warp; s < s1; s += WARPS) {
        const ssm_i64 row = s * H + h, base = row * P;
        const CT e = dte[row];
        CT sum_x = 0, sum_y = 0;
#pragma unroll
        for (int k = 0; k < SSD_ROW_VALUES; ++k) {
            const int p = lane + 32 * k;
            if (k < nv && p < P) {
                const ssm_i64 i = base + p;
                const CT xv = (CT)ssm_load(X[i]), gv = GB[i], dyv = dY[i];
                sum_x += xv * gv;
                sum_y += dyv * ycore[i];
                ssm_store(dx + i, e * gv + Dv[k] * dyv);
                dd[k] += dyv * xv;
            }
        }
#pragma unroll
        for (int m = 16; m >= 1; m >>= 1) {
            sum_x += __shfl_xor_sync(0xffffffffu, sum_x, m);
            sum_y += __shfl_xor_sync(0xffffffffu, sum_y, m);
        }
        if (lane == 0) {
            xGB[row] = sum_x;
            dcum[row] = sum_y - e * sum_x;
        }
    }
    if (dD_part)  // the warps' sums in warp order
        ssm_warp_partials_sum(dd_sh, dd, dD_part + ((ssm_i64)blockIdx.x * H + h) * P, P);
}

// --------------------------------------------------------------------------------------
// The gate's backward, element-wise, in one pass over its inputs (the products after it take
// dY): with the output before the gate y_pre = ycore + D x and s = sigmoid(z),
//   dz = dy y_pre s (1 + z (1 - s))   (the input dtype)
//   dY = dy z s                       (dLoss/dy_pre, in TD)
// The CUDA-core and float32 tensor-core backward pass ycore (CT) and D; the 16-bit backward
// passes the forward's y_pre (TX) as ycore and no D, and takes dY in TX.
// Element (r, j) of the (batch * L) x (H * P) arrays; D (H * P, or null: then X is not read).
// Grid: (row blocks, column blocks); block (x, y) walks rows x, x + gridDim.x, ... of columns
// y SSD_THREADS + thread, + gridDim.y SSD_THREADS, ...
// --------------------------------------------------------------------------------------
template <typename TX, typename TY, typename TD, typename CT>
__global__ void __launch_bounds__(SSD_THREADS)
ssd_bwd_gate(const TX* __restrict__ dy, const TX* __restrict__ z, const TX* __restrict__ X,
             const TY* __restrict__ ycore, const CT* __restrict__ D, TX* __restrict__ dz,
             TD* __restrict__ dY, ssm_i64 rows, ssm_i64 HP) {
    for (ssm_i64 j = (ssm_i64)blockIdx.y * SSD_THREADS + threadIdx.x; j < HP;
         j += (ssm_i64)gridDim.y * SSD_THREADS) {
        const CT Dj = D ? D[j] : CT(0);
        for (ssm_i64 r = blockIdx.x; r < rows; r += gridDim.x) {
            const ssm_i64 i = r * HP + j;
            const CT zv = (CT)ssm_load(z[i]), g = (CT)ssm_load(dy[i]);
            const CT s = ssm_math<CT>::sigmoid(zv);
            CT y_pre = (CT)ssm_load(ycore[i]);
            if (D) y_pre += Dj * (CT)ssm_load(X[i]);
            ssm_store(dz + i, g * y_pre * s * (CT(1) + zv * (CT(1) - s)));
            ssm_store(dY + i, g * zv * s);
        }
    }
}

// --------------------------------------------------------------------------------------
// A chunk's rank-Q sum of outer products, out[b, c, h] = sum_s w_s X_s (outer) Y_s (P x N):
//   ADJ = false: X = x, Y = B, w_s = [seq_s == seq_E] exp(cum_E - cum_s) dt'_s (chunk state)
//   ADJ = true:  X = dY, Y = C, w_t = [seq_t == seq_prev] exp(cum_t)        (its adjoint)
// Register tiles as in ssd_chunk_mm, the steps s in the place of k: a block computes an
// R x 2R tile of the P x N result (64 x 128 in float, 32 x 64 in double), staging the steps
// S at a time as xs[s][p] = X_s[p], ys[s][n] = Y_s[n] and w_s (applied to X as its rows are
// read), with the next stage's loads in flight meanwhile.
// Grid: (batch * nc, H, ceil(P / R) * ceil(N / 2R)); out (batch, nc, H, P, N).
// --------------------------------------------------------------------------------------
template <typename TX, typename TY, typename CT, bool ADJ>
__global__ void __launch_bounds__(SSD_THREADS, 2)
ssd_chunk_state(const TX* __restrict__ X, const TY* __restrict__ Y, const CT* __restrict__ dte,
                const CT* __restrict__ cum, const int* __restrict__ seq,
                const ssm_i64* __restrict__ starts, CT* __restrict__ out,
                ssm_i64 L, int H, int P, int GY, int N, ssm_i64 nc) {
    constexpr int MR = ssd_mm_tile<CT>::MR, R = ssd_mm_tile<CT>::R, S = ssd_mm_tile<CT>::S;
    constexpr int NV = 2, NT = 2 * R;  // the tile's N columns: NV groups of 16 MR
    constexpr int RP = R + MR, VS = NT + MR;
    typedef ssd_vec16<CT> vec;
    __shared__ vec xs_v[S * RP / MR], ys_v[S * VS / MR];
    __shared__ CT w_sh[S];
    CT(*xs)[RP] = reinterpret_cast<CT(*)[RP]>(xs_v);
    CT(*ys)[VS] = reinterpret_cast<CT(*)[VS]>(ys_v);
    const int tid = threadIdx.x, ty = tid / 16, tx = tid % 16;
    const ssm_i64 e = blockIdx.x;  // = b * nc + c
    const int h = blockIdx.y;
    const int p_tiles = (P + R - 1) / R;
    const int p0 = (blockIdx.z % p_tiles) * R, n0 = (blockIdx.z / p_tiles) * NT;
    const ssm_i64 b = e / nc, c = e - b * nc;
    const ssm_i64 t0 = starts[c], t1 = starts[c + 1], E = t1 - 1;
    const int g = h / (H / GY);
    const CT cum_E = cum[(b * L + E) * H + h];
    const int seq_ref = ADJ ? ssd_seq(seq, b * L + (t0 > 0 ? t0 - 1 : 0)) : ssd_seq(seq, b * L + E);

    CT acc[MR][MR * NV];
#pragma unroll
    for (int i = 0; i < MR; ++i)
#pragma unroll
        for (int m = 0; m < MR * NV; ++m) acc[i][m] = 0;
    ssd_mm_cols<R, S, CT> xr;
    ssd_mm_cols<NT, S, CT> yr;
    CT cs = 0, ds = 0;  // thread tid < S: cum, dt' and seq of the stage's step tid
    int sq = 0;
    auto load = [&](ssm_i64 s0) {
        const int ns = (int)(t1 - s0 < S ? t1 - s0 : S);
        xr.load(X + p0, b * L + s0, ns, H, h, P, P - p0);
        yr.load(Y + n0, b * L + s0, ns, GY, g, N, N - n0);
        if (tid < ns) {
            const ssm_i64 i = (b * L + s0 + tid) * H + h;
            cs = cum[i];
            ds = ADJ ? CT(0) : dte[i];
            sq = ssd_seq(seq, b * L + s0 + tid);
        }
    };
    load(t0);
    for (ssm_i64 s0 = t0; s0 < t1; s0 += S) {
        __syncthreads();
        xr.template store<true>(xs);
        yr.template store<true>(ys);
        if (tid < S) {
            CT w = 0;
            if (s0 + tid < t1 && sq == seq_ref)
                w = ADJ ? ssd_exp<CT>(cs) : ssd_exp<CT>(cum_E - cs) * ds;
            w_sh[tid] = w;
        }
        __syncthreads();
        if (s0 + S < t1) load(s0 + S);
        ssd_mm_accumulate<NV>(acc, xs, ys, w_sh);
    }
    const ssm_i64 PN = (ssm_i64)P * N;
#pragma unroll
    for (int i = 0; i < MR; ++i) {
        const int p = p0 + ty * MR + i;
#pragma unroll
        for (int m = 0; m < MR * NV; ++m) {
            const int n = n0 + tx * MR + 16 * MR * (m / MR) + m % MR;
            if (p < P && n < N) out[(e * H + h) * PN + (ssm_i64)p * N + n] = acc[i][m];
        }
    }
}
