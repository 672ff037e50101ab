// state_update.cu: the recurrent step of a selective SSM (decoding), one or T tokens.
//
// For every row b, channel (h, p) and token t:
//     dt' = softplus?(dt + dt_bias)
//     s[n] = exp(dt' A[h, p, n]) s[n] + dt' x B[g, n]
//     y    = sum_n C[g, n] s[n] + D x, then y silu(z)
// with the state s read once, kept in registers across the T tokens, and
// written once. The step is bound by memory (the state, read and written), so
// the kernel is built to move the state at full bandwidth with few
// instructions per byte:
//
// * Work split. A block owns one row b, one head h (whose channels all use one
//   group of B and C: the host reads Mamba-1 as G heads of dim / G channels)
//   and rows_per_block consecutive channels, which it walks in passes. TN
//   lanes (a power of two <= 32) cover the N states of a channel: lane ln
//   holds, for each of CH chunks, V consecutive states at n = (c * TN + ln) *
//   V, V * sizeof(state) = 16 bytes, so each access is one 16-byte vector and
//   the TN lanes of a chunk read a contiguous run. In a pass a thread holds PPT
//   channels, p = q0 + i * TP + pr (TP = threads / TN), so a warp's accesses
//   at each i are contiguous too.
// * Order of the loads: each pass issues its PPT * CH state vectors first,
//   then the channels' x, z, D (dt, dt_bias, A as needed), then (first pass)
//   B, C and the head's dt; nothing waits on a load before all are issued.
//   B, C and the per-head dt' and decay stay in registers for every pass.
// * Staging ring (vector form, when the launch gives dynamic shared memory):
//   the state vectors of pass k + SU_STAGES - 1 are copied into shared memory
//   with cp.async while pass k is computed, so a block keeps up to SU_STAGES
//   passes of state in flight without holding registers for them. Each thread
//   reads back only the vectors it copied itself (its own slot, laid out so a
//   warp's 16-byte accesses are conflict-free), so no barrier is needed.
// * AMODE says how A varies (see the enum): per head (Mamba-2's parameters
//   broadcast with zero strides: one softplus and one exp per head and
//   token), per channel (one exp per channel), or per state.
// * y = sum over the TN lanes of a channel: a butterfly of shuffles. Lane i
//   of a channel then finishes row i (D, the gate, the store), so the PPT rows
//   cost one evaluation of the gate, not PPT.
// * Every array is read through its own element strides (64-bit), so
//   zero-stride broadcasts are read as they are and the state is updated
//   where it lives.
// * Options that cost a uniform branch outside the per-state work (D, z,
//   dt_bias, softplus, the index of each row) are run-time arguments: fewer
//   instantiations, which compile faster at first use.
//
// Template parameters: ST, IT storage types of the state and of x/dt/z/B/C/y
// (float, double, ssm_half, ssm_bf16); CH chunks of V states per lane (1, 2,
// 4, 8); PPT channels per thread and pass (1, 2, 4); AMODE; kVec: the state,
// B, C (and A when read per state) are contiguous along N with 16-byte aligned
// rows and V divides N, so every access is a whole vector with no per-element
// addressing (else the general form: any strides, partial vectors). Arithmetic
// in ssm_compute_of<ST> (double for a double state, float otherwise); A, D and
// dt_bias arrive in that type.

#include "ssm_common.cuh"

// Passes of state a block's staging ring holds (the pass being computed and the ones after).
#define SU_STAGES 3

// A 16-byte store marked evict-first in L2 (st.global.cs): the new state is not read again
// by this step, and the rows still to be read keep L2.
__device__ __forceinline__ void su_store_stream(ssm_v16* p, const ssm_v16& v) {
    asm volatile("st.global.cs.v4.u32 [%0], {%1, %2, %3, %4};"
                 : : "l"(p), "r"(v.w[0]), "r"(v.w[1]), "r"(v.w[2]), "r"(v.w[3]) : "memory");
}

__device__ __forceinline__ unsigned int su_float_bits(float f) {
    unsigned int u;
    asm("mov.b32 %0, %1;" : "=r"(u) : "f"(f));
    return u;
}
__device__ __forceinline__ double su_bits_to_double(unsigned int lo, unsigned int hi) {
    double d;
    asm("mov.b64 %0, {%1, %2};" : "=d"(d) : "r"(lo), "r"(hi));
    return d;
}
__device__ __forceinline__ void su_double_bits(double d, unsigned int& lo, unsigned int& hi) {
    asm("mov.b64 {%0, %1}, %2;" : "=r"(lo), "=r"(hi) : "d"(d));
}

// Unpack / pack the V = 16 / sizeof(ST) values of one vector, in the compute type CT.
template <typename ST> struct su_vec;

template <> struct su_vec<float> {
    static constexpr int V = 4;
    template <typename CT>
    static __device__ __forceinline__ void unpack(const ssm_v16& v, CT* r) {
#pragma unroll
        for (int i = 0; i < 4; ++i) r[i] = ssm_bits_to_float(v.w[i]);
    }
    template <typename CT>
    static __device__ __forceinline__ void pack(ssm_v16& v, const CT* r) {
#pragma unroll
        for (int i = 0; i < 4; ++i) v.w[i] = su_float_bits((float)r[i]);
    }
};

template <> struct su_vec<double> {
    static constexpr int V = 2;
    template <typename CT>
    static __device__ __forceinline__ void unpack(const ssm_v16& v, CT* r) {
        r[0] = su_bits_to_double(v.w[0], v.w[1]);
        r[1] = su_bits_to_double(v.w[2], v.w[3]);
    }
    template <typename CT>
    static __device__ __forceinline__ void pack(ssm_v16& v, const CT* r) {
        su_double_bits((double)r[0], v.w[0], v.w[1]);
        su_double_bits((double)r[1], v.w[2], v.w[3]);
    }
};

// The two 16-bit types: 8 values, two per word, the lower address in the low half.
template <typename H16> struct su_vec16bit {
    static constexpr int V = 8;
    template <typename CT>
    static __device__ __forceinline__ void unpack(const ssm_v16& v, CT* r) {
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            H16 h;
            h.bits = (unsigned short)((v.w[i / 2] >> (16 * (i % 2))) & 0xffffu);
            r[i] = ssm_load(h);
        }
    }
    template <typename CT>
    static __device__ __forceinline__ void pack(ssm_v16& v, const CT* r) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
            // one conversion rounds both (sm_80+): the first operand goes to the upper half
            if constexpr (ssm_same<H16, ssm_bf16>::value)
                asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(v.w[i]) : "f"((float)r[2 * i + 1]), "f"((float)r[2 * i]));
            else
                asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(v.w[i]) : "f"((float)r[2 * i + 1]), "f"((float)r[2 * i]));
#else
            H16 lo, hi;
            ssm_store(&lo, (float)r[2 * i]);
            ssm_store(&hi, (float)r[2 * i + 1]);
            v.w[i] = (unsigned int)lo.bits | ((unsigned int)hi.bits << 16);
#endif
        }
    }
};
template <> struct su_vec<ssm_half> : su_vec16bit<ssm_half> {};
template <> struct su_vec<ssm_bf16> : su_vec16bit<ssm_bf16> {};

// A stored value widened to the compute type (ssm_load returns float for 16-bit types).
template <typename CT, typename T>
__device__ __forceinline__ CT su_ld(const T* p) {
    return (CT)ssm_load(*p);
}

// V consecutive values of type T at an address aligned to min(16, V * sizeof(T)) bytes,
// read with vector loads, widened to CT.
template <typename T, int V> struct su_pack {
    static constexpr int kBytes = (int)sizeof(T) * V;
    struct alignas(kBytes >= 16 ? 16 : kBytes) type { T v[V]; };
};
template <typename CT, int V, typename T>
__device__ __forceinline__ void su_load_vec(const T* p, CT* out) {
    const typename su_pack<T, V>::type t = *reinterpret_cast<const typename su_pack<T, V>::type*>(p);
#pragma unroll
    for (int k = 0; k < V; ++k) out[k] = (CT)ssm_load(t.v[k]);
}

// How A (and dt) vary, a template parameter:
//   SU_A_FULL: A[h, p, n] per state: one exp per state;
//   SU_A_ROW:  A constant along N: one exp per channel;
//   SU_A_HEAD: A, dt and dt_bias constant along P and A along N (Mamba-2's per-head
//              parameters broadcast with zero strides): dt', the softplus and the
//              decay once per head and token.
enum { SU_A_FULL = 0, SU_A_ROW = 1, SU_A_HEAD = 2 };

// The parameters of every state_update kernel (the host packs one argument list for all):
// the arrays, then element strides: state (slot, h, p, n); x, dt, z, y (b, t, h, p); A (h, p,
// n); B, C (b, t, g, n); D, dt_bias (h, p); then the sizes and flags.
#define SU_KERNEL_PARAMS                                                                      \
    ST* __restrict__ state, const ssm_i64* __restrict__ rows, const IT* __restrict__ x,      \
        const IT* __restrict__ dt, const IT* __restrict__ z,                                 \
        const typename ssm_compute_of<ST>::type* __restrict__ A, const IT* __restrict__ Bm,  \
        const IT* __restrict__ Cm, const typename ssm_compute_of<ST>::type* __restrict__ D,  \
        const typename ssm_compute_of<ST>::type* __restrict__ dt_bias, IT* __restrict__ y,   \
        ssm_i64 ss0, ssm_i64 ss1, ssm_i64 ss2, ssm_i64 ss3, ssm_i64 xs0, ssm_i64 xs1,        \
        ssm_i64 xs2, ssm_i64 xs3, ssm_i64 ds0, ssm_i64 ds1, ssm_i64 ds2, ssm_i64 ds3,        \
        ssm_i64 zs0, ssm_i64 zs1, ssm_i64 zs2, ssm_i64 zs3, ssm_i64 ys0, ssm_i64 ys1,        \
        ssm_i64 ys2, ssm_i64 ys3, ssm_i64 as0, ssm_i64 as1, ssm_i64 as2, ssm_i64 bs0,        \
        ssm_i64 bs1, ssm_i64 bs2, ssm_i64 bs3, ssm_i64 cs0, ssm_i64 cs1, ssm_i64 cs2,        \
        ssm_i64 cs3, ssm_i64 Ds0, ssm_i64 Ds1, ssm_i64 bias0, ssm_i64 bias1, int b0, int T,  \
        int P, int N, int heads_per_group, int log2_tn, int rows_per_block, int softplus

// Registers per thread are capped at 128 (two blocks of 256 threads per SM at least): the
// step is bound by memory and needs many loads in flight per SM. Wide states (double,
// several chunks per lane) may take all 255 instead of spilling. A 16-bit state with one
// chunk and at most two channels per thread (the planner's default for N <= 256) and A
// not per state fits in 80 (three blocks of 256): more warps per SM to hide the memory
// latency. Two chunks, or A per state, spill under that cap (ptxas -v, sm_90).
#ifndef SU_MIN_BLOCKS_16BIT
#define SU_MIN_BLOCKS_16BIT 3
#endif
template <typename ST, int CH, int PPT, int AMODE> struct su_min_blocks {
    static constexpr int value =
        (sizeof(ST) == 8 || CH * PPT > 4) ? 1
        : (sizeof(ST) == 2 && CH == 1 && PPT <= 2 && AMODE != SU_A_FULL) ? SU_MIN_BLOCKS_16BIT : 2;
};

template <typename ST, typename IT, int CH, int PPT, int AMODE, bool kVec>
__global__ void __launch_bounds__(256, (su_min_blocks<ST, CH, PPT, AMODE>::value))
ssm_state_update(
    SU_KERNEL_PARAMS) {
    typedef typename ssm_compute_of<ST>::type CT;
    typedef ssm_math<CT> M;
    constexpr int V = su_vec<ST>::V;

    const int tn = 1 << log2_tn;
    const int ln = threadIdx.x & (tn - 1);  // lane within the channel's TN lanes
    const int pr = threadIdx.x >> log2_tn;  // channel slot within a pass
    const int tp = blockDim.x >> log2_tn;   // channels per pass (of each of the PPT rows)
    const int h = blockIdx.y;
    const int b = b0 + blockIdx.z;
    const int g = h / heads_per_group;
    const int p_begin = blockIdx.x * rows_per_block;
    const int p_end = min(P, p_begin + rows_per_block);

    // Bases of this block's rows (64-bit); channel and state offsets are added below.
    const IT* const xb = x + b * xs0 + h * xs2;
    const IT* const db = dt + b * ds0 + h * ds2;
    const IT* const zb = z + b * zs0 + h * zs2;
    IT* const yb = y + b * ys0 + h * ys2;
    const IT* const bb = Bm + b * bs0 + (ssm_i64)g * bs2;
    const IT* const cb = Cm + b * cs0 + (ssm_i64)g * cs2;
    const CT* const ab = A + h * as0;

    const ssm_i64 slot = rows != nullptr ? rows[b] : (ssm_i64)b;
    if (slot < 0) {  // padding: y = 0, no state touched (the whole block)
        for (int p = p_begin + (int)threadIdx.x; p < p_end; p += blockDim.x)
            for (int t = 0; t < T; ++t) ssm_store(yb + t * ys1 + p * ys3, (CT)0);
        return;
    }
    ST* const sb = state + slot * ss0 + h * ss1;

    // The staging ring (vector form only): slot r of pass-vector j of thread x at
    // ring[(r * PPT * CH + j) * blockDim.x + x]. The host gives min(passes, SU_STAGES) slots.
    extern __shared__ ssm_v16 su_ring[];
    const bool staged = kVec && ssm_dynamic_smem_bytes() > 0;
    const int pass_rows = tp * PPT;
    const ssm_i64 row_step = (ssm_i64)tp * ss2;  // from row i of a pass to row i + 1
    // Copy the state vectors of the pass starting at channel q into ring slot r (rows past
    // the end copy nothing: their values are never stored nor summed into a stored row).
    auto stage_pass = [&](int q, int r) {
        if (q < p_end) {
            const ST* const srow0 = sb + (ssm_i64)(q + pr) * ss2;
            ssm_v16* const slot0 = su_ring + r * PPT * CH * (int)blockDim.x + threadIdx.x;
#pragma unroll
            for (int i = 0; i < PPT; ++i) {
                if (q + i * tp + pr >= p_end) break;
#pragma unroll
                for (int c = 0; c < CH; ++c) {
                    const int n0 = (c * tn + ln) * V;
                    if (n0 < N)
                        ssm_cp_async<16>(slot0 + (i * CH + c) * (int)blockDim.x, srow0 + i * row_step + n0);
                }
            }
        }
        ssm_cp_commit();  // one group per pass, empty past the end: the wait count stays fixed
    };
    if (staged) {
#pragma unroll
        for (int k = 0; k < SU_STAGES - 1; ++k) stage_pass(p_begin + k * pass_rows, k);
    }

    {
        // B and C of token t for this lane's states (zeros past N).
        CT bv[CH][V], cv[CH][V];
        auto load_bc = [&](int t) {
#pragma unroll
            for (int c = 0; c < CH; ++c) {
                const int n0 = (c * tn + ln) * V;
                if constexpr (kVec) {  // lanes past N (TN * V > N) hold zeros
                    if (n0 < N) {
                        su_load_vec<CT, V>(bb + t * bs1 + n0, bv[c]);
                        su_load_vec<CT, V>(cb + t * cs1 + n0, cv[c]);
                    } else {
#pragma unroll
                        for (int k = 0; k < V; ++k) bv[c][k] = cv[c][k] = CT(0);
                    }
                } else {
#pragma unroll
                    for (int k = 0; k < V; ++k) {
                        const bool in = n0 + k < N;
                        bv[c][k] = in ? su_ld<CT>(bb + t * bs1 + (ssm_i64)(n0 + k) * bs3) : CT(0);
                        cv[c][k] = in ? su_ld<CT>(cb + t * cs1 + (ssm_i64)(n0 + k) * cs3) : CT(0);
                    }
                }
            }
        };
        // SU_A_HEAD: dt + dt_bias of the token whose B, C are loaded; dt' and the decay are
        // computed from it at first use, after the state loads are on their way.
        CT d_raw_head = CT(0), d_head = CT(0), decay_head = CT(1);
        bool head_ready = false;
        int bc_token = -1;  // the token whose B and C are in registers (none yet)
        if (T > 0) {
            // The first token's B, C (and the head's dt) go out with the first state loads,
            // before anything waits: the ring's wait below would otherwise hold them back by a
            // whole memory round trip at the start of every block.
            load_bc(0);
            if constexpr (AMODE == SU_A_HEAD) {
                d_raw_head = su_ld<CT>(db);
                if (dt_bias != nullptr) d_raw_head += dt_bias[h * bias0];
            }
            bc_token = 0;
        }

        int ring_slot = 0;  // the slot of this pass (staged)
        for (int q0 = p_begin; q0 < p_end; q0 += pass_rows) {
            // ---- this pass's channels: the state (all vector loads together, or staged
            // passes ahead), then the per-channel inputs; nothing waits on a load before
            // all of them are issued ----
            CT s[PPT][CH][V];
            CT xv[PPT], zv[PPT], dsk[PPT], dv[PPT], bias[PPT], arow[PPT];
            CT af[AMODE == SU_A_FULL ? PPT : 1][AMODE == SU_A_FULL ? CH : 1][AMODE == SU_A_FULL ? V : 1];
            if (staged) {
                // the pass SU_STAGES - 1 ahead goes into the slot the previous pass freed
                stage_pass(q0 + (SU_STAGES - 1) * pass_rows,
                           ring_slot == 0 ? SU_STAGES - 1 : ring_slot - 1);
            }
            if (!staged) {
#pragma unroll
            for (int i = 0; i < PPT; ++i) {
                const int pc = min(q0 + i * tp + pr, p_end - 1);  // past the end: a live row, unstored
                const ST* srow = sb + (ssm_i64)pc * ss2;
#pragma unroll
                for (int c = 0; c < CH; ++c) {
                    const int n0 = (c * tn + ln) * V;
                    if constexpr (kVec) {
                        if (n0 < N) {
                            const ssm_v16 v = *reinterpret_cast<const ssm_v16*>(srow + n0);
                            su_vec<ST>::unpack(v, s[i][c]);
                        } else {
#pragma unroll
                            for (int k = 0; k < V; ++k) s[i][c][k] = CT(0);
                        }
                    } else {
#pragma unroll
                        for (int k = 0; k < V; ++k)
                            s[i][c][k] = n0 + k < N ? su_ld<CT>(srow + (ssm_i64)(n0 + k) * ss3) : CT(0);
                    }
                }
            }
            }
#pragma unroll
            for (int i = 0; i < PPT; ++i) {
                const int pc = min(q0 + i * tp + pr, p_end - 1);
                xv[i] = su_ld<CT>(xb + pc * xs3);
                zv[i] = z != nullptr ? su_ld<CT>(zb + pc * zs3) : CT(0);
                dsk[i] = D != nullptr ? D[h * Ds0 + pc * Ds1] : CT(0);
                if constexpr (AMODE != SU_A_HEAD) {
                    dv[i] = su_ld<CT>(db + pc * ds3);
                    bias[i] = dt_bias != nullptr ? dt_bias[h * bias0 + pc * bias1] : CT(0);
                }
                if constexpr (AMODE == SU_A_ROW) arow[i] = ab[pc * as1] * M::kLog2e;
                if constexpr (AMODE == SU_A_FULL) {  // A of every state (read with B and C's layout rule)
                    const CT* ar = ab + pc * as1;
#pragma unroll
                    for (int c = 0; c < CH; ++c) {
                        const int n0 = (c * tn + ln) * V;
                        if constexpr (kVec) {
                            if (n0 < N) {
                                su_load_vec<CT, V>(ar + n0, af[i][c]);
                            } else {
#pragma unroll
                                for (int k = 0; k < V; ++k) af[i][c][k] = CT(0);
                            }
                        } else {
#pragma unroll
                            for (int k = 0; k < V; ++k)
                                af[i][c][k] = n0 + k < N ? ar[(ssm_i64)(n0 + k) * as2] : CT(0);
                        }
                    }
                }
            }

            if (staged) {  // this pass's state, copied SU_STAGES - 1 passes ago
                ssm_cp_wait<SU_STAGES - 1>();
#pragma unroll
                for (int i = 0; i < PPT; ++i) {
#pragma unroll
                    for (int c = 0; c < CH; ++c) {
                        const int n0 = (c * tn + ln) * V;
                        if (n0 < N) {
                            su_vec<ST>::unpack(
                                su_ring[(ring_slot * PPT * CH + i * CH + c) * blockDim.x + threadIdx.x],
                                s[i][c]);
                        } else {
#pragma unroll
                            for (int k = 0; k < V; ++k) s[i][c][k] = CT(0);
                        }
                    }
                }
                ring_slot = ring_slot + 1 == SU_STAGES ? 0 : ring_slot + 1;
            }

            for (int t = 0; t < T; ++t) {
                if (bc_token != t) {  // several tokens: this one's B and C
                    load_bc(t);
                    if constexpr (AMODE == SU_A_HEAD) {
                        d_raw_head = su_ld<CT>(db + t * ds1);
                        if (dt_bias != nullptr) d_raw_head += dt_bias[h * bias0];
                        head_ready = false;
                    }
                    bc_token = t;
                }
                if constexpr (AMODE == SU_A_HEAD) {
                    if (!head_ready) {
                        d_head = softplus ? M::softplus(d_raw_head) : d_raw_head;
                        decay_head = M::decay(d_head * ab[0] * M::kLog2e);
                        head_ready = true;
                    }
                }
                CT acc[PPT];
#pragma unroll
                for (int i = 0; i < PPT; ++i) {
                    CT d, decay = CT(1);
                    if constexpr (AMODE == SU_A_HEAD) {
                        d = d_head;
                        decay = decay_head;
                    } else {
                        d = dv[i] + bias[i];
                        if (softplus) d = M::softplus(d);
                        if constexpr (AMODE == SU_A_ROW) decay = M::decay(d * arow[i]);
                    }
                    const CT dx = d * xv[i];
                    CT sum = CT(0);
#pragma unroll
                    for (int c = 0; c < CH; ++c) {
#pragma unroll
                        for (int k = 0; k < V; ++k) {
                            CT a = decay;
                            if constexpr (AMODE == SU_A_FULL) a = M::decay(d * af[i][c][k] * M::kLog2e);
                            s[i][c][k] = s[i][c][k] * a + dx * bv[c][k];
                            sum += s[i][c][k] * cv[c][k];
                        }
                    }
                    acc[i] = sum;
                }
                // Sum over the TN lanes of each channel (all 32 lanes of the warp take part;
                // unrolled, each level behind a branch that is uniform over the launch).
#pragma unroll
                for (int m = 16; m >= 1; m >>= 1) {
                    if (m < tn) {
#pragma unroll
                        for (int i = 0; i < PPT; ++i) acc[i] += ssm_shfl_xor(0xffffffffu, acc[i], m);
                    }
                }
                // Every lane now holds the PPT sums. Finishing a row (D, the gate, the store) is
                // the same work for one lane as for the warp, so with TN >= PPT lane i of the
                // channel finishes row i, all rows in one go; else lane 0 finishes them in turn.
                auto finish = [&](int i, CT sum, CT xo, CT zo, CT dk) {
                    const int p = q0 + i * tp + pr;
                    if (p < p_end) {
                        CT out = sum + dk * xo;
                        if (z != nullptr) out *= zo * M::sigmoid(zo);
                        ssm_store(yb + t * ys1 + p * ys3, out);
                    }
                };
                if (tn >= PPT) {
                    CT sum = acc[0], xo = xv[0], zo = zv[0], dk = dsk[0];
#pragma unroll
                    for (int i = 1; i < PPT; ++i)
                        if (ln == i) { sum = acc[i]; xo = xv[i]; zo = zv[i]; dk = dsk[i]; }
                    if (ln < PPT) finish(ln, sum, xo, zo, dk);
                } else if (ln == 0) {
#pragma unroll
                    for (int i = 0; i < PPT; ++i) finish(i, acc[i], xv[i], zv[i], dsk[i]);
                }
                if (t + 1 < T) {  // the next token's per-channel inputs
#pragma unroll
                    for (int i = 0; i < PPT; ++i) {
                        const int pc = min(q0 + i * tp + pr, p_end - 1);
                        xv[i] = su_ld<CT>(xb + (t + 1) * xs1 + pc * xs3);
                        zv[i] = z != nullptr ? su_ld<CT>(zb + (t + 1) * zs1 + pc * zs3) : CT(0);
                        if constexpr (AMODE != SU_A_HEAD) dv[i] = su_ld<CT>(db + (t + 1) * ds1 + pc * ds3);
                    }
                }
            }

            // ---- write this pass's state back ----
            ST* const srow0 = sb + (ssm_i64)(q0 + pr) * ss2;
#pragma unroll
            for (int i = 0; i < PPT; ++i) {
                if (q0 + i * tp + pr >= p_end) break;  // rows of a pass rise with i
                ST* const srow = srow0 + i * row_step;
#pragma unroll
                for (int c = 0; c < CH; ++c) {
                    const int n0 = (c * tn + ln) * V;
                    if (n0 >= N) continue;
                    if constexpr (kVec) {
                        ssm_v16 v;
                        su_vec<ST>::pack(v, s[i][c]);
                        *reinterpret_cast<ssm_v16*>(srow + n0) = v;
                    } else {
#pragma unroll
                        for (int k = 0; k < V; ++k)
                            if (n0 + k < N) ssm_store(srow + (ssm_i64)(n0 + k) * ss3, s[i][c][k]);
                    }
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// The vector form in one pass (ssm_state_update_vec): the state contiguous along N with
// 16-byte aligned rows, and B, C (and A when read per state) read V values at a time, V
// dividing N. A block owns one row b, one head h and TP * PPT channels (TP = threads / TN)
// and makes one pass over them, as a copy kernel would: each thread issues every load of
// the first token (its PPT * CH state vectors, B, C, and the channels' inputs) before
// anything waits on one, computes its channels side by side (their chains of dependent
// FMAs and shuffles overlap), and stores. No loop over channels and no staging: few
// instructions and one memory round trip per block. Measured faster than the kernel above
// for float32 states, slower for 16-bit ones (whose many values per byte need the staging
// ring to keep enough bytes in flight); the host picks (TUNING in state_update.py). The
// arguments are those of ssm_state_update (rows_per_block unused: TP * PPT channels).

// Blocks of 256 threads per SM the register bound leaves room for, from an estimate of the
// registers a thread needs (fitted to ptxas -v on sm_90, no spills): its 16-byte vectors
// and their widened values, B and C, and about 24 + 4 PPT for addresses and per-channel
// inputs (8 more to unpack 16-bit states).
template <typename ST, int CH, int PPT, int AMODE> struct su_vec_min_blocks {
    static constexpr int V = su_vec<ST>::V;
    static constexpr int regs = 4 * CH * PPT + PPT * CH * V * (AMODE == SU_A_FULL ? 2 : 1) +
                                2 * CH * V + 24 + 4 * PPT + (V == 8 ? 8 : 0);
    static constexpr int value = sizeof(ST) == 8 ? 1 : regs <= 56 ? 4 : regs <= 80 ? 3 : regs <= 120 ? 2 : 1;
};

template <typename ST, typename IT, int CH, int PPT, int AMODE>
__global__ void __launch_bounds__(256, (su_vec_min_blocks<ST, CH, PPT, AMODE>::value))
ssm_state_update_vec(
    SU_KERNEL_PARAMS) {
    typedef typename ssm_compute_of<ST>::type CT;
    typedef ssm_math<CT> M;
    constexpr int V = su_vec<ST>::V;
    (void)ss3; (void)as2; (void)bs3; (void)cs3; (void)rows_per_block;

    const int tn = 1 << log2_tn;
    const int ln = threadIdx.x & (tn - 1);
    const int tp = blockDim.x >> log2_tn;
    const int h = blockIdx.y;
    const int b = b0 + blockIdx.z;
    const int g = h / heads_per_group;
    // channel of this thread's row i: p0 + i * tp (a warp's accesses are contiguous)
    const int p0 = blockIdx.x * tp * PPT + (threadIdx.x >> log2_tn);

    const IT* const xb = x + b * xs0 + h * xs2;
    const IT* const db = dt + b * ds0 + h * ds2;
    const IT* const zb = z + b * zs0 + h * zs2;
    IT* const yb = y + b * ys0 + h * ys2;
    const IT* const bb = Bm + b * bs0 + (ssm_i64)g * bs2;
    const IT* const cb = Cm + b * cs0 + (ssm_i64)g * cs2;
    const CT* const ab = A + h * as0;

    const ssm_i64 slot = rows != nullptr ? rows[b] : (ssm_i64)b;
    if (slot < 0) {  // padding: y = 0, no state touched
        if (ln == 0) {
#pragma unroll
            for (int i = 0; i < PPT; ++i) {
                const int p = p0 + i * tp;
                if (p < P)
                    for (int t = 0; t < T; ++t) ssm_store(yb + t * ys1 + p * ys3, (CT)0);
            }
        }
        return;
    }
    ST* const sb = state + slot * ss0 + h * ss1;

    // ---- the loads of the first token, none waited on before all are issued ----
    ssm_v16 raw[PPT][CH];
#pragma unroll
    for (int i = 0; i < PPT; ++i) {
        const int p = p0 + i * tp;
#pragma unroll
        for (int c = 0; c < CH; ++c) {
            const int n0 = (c * tn + ln) * V;
            raw[i][c] = ssm_v16{{0u, 0u, 0u, 0u}};
            if (p < P && n0 < N) raw[i][c] = *reinterpret_cast<const ssm_v16*>(sb + p * ss2 + n0);
        }
    }
    CT bv[CH][V], cv[CH][V];
    auto load_bc = [&](int t) {
#pragma unroll
        for (int c = 0; c < CH; ++c) {
            const int n0 = (c * tn + ln) * V;
            if (n0 < N) {
                su_load_vec<CT, V>(bb + t * bs1 + n0, bv[c]);
                su_load_vec<CT, V>(cb + t * cs1 + n0, cv[c]);
            } else {
#pragma unroll
                for (int k = 0; k < V; ++k) bv[c][k] = cv[c][k] = CT(0);
            }
        }
    };
    // per channel: x, z, dt (SU_A_HEAD: the head's, in slot 0) of the token, D, dt_bias, A
    CT xv[PPT], zv[PPT], dv[PPT], dk[PPT], bias[PPT], arow[PPT];
    auto load_token = [&](int t) {
#pragma unroll
        for (int i = 0; i < PPT; ++i) {
            const int pc = min(p0 + i * tp, P - 1);  // past the end: a live row, unstored
            xv[i] = su_ld<CT>(xb + t * xs1 + pc * xs3);
            zv[i] = z != nullptr ? su_ld<CT>(zb + t * zs1 + pc * zs3) : CT(0);
            dv[i] = AMODE != SU_A_HEAD || i == 0 ? su_ld<CT>(db + t * ds1 + pc * ds3) : CT(0);
        }
    };
    if (T > 0) {
        load_bc(0);
        load_token(0);
    }
    CT af[AMODE == SU_A_FULL ? PPT : 1][AMODE == SU_A_FULL ? CH : 1][AMODE == SU_A_FULL ? V : 1];
#pragma unroll
    for (int i = 0; i < PPT; ++i) {
        const int pc = min(p0 + i * tp, P - 1);
        dk[i] = D != nullptr ? D[h * Ds0 + pc * Ds1] : CT(0);
        bias[i] = dt_bias != nullptr ? dt_bias[h * bias0 + (AMODE == SU_A_HEAD ? 0 : pc * bias1)] : CT(0);
        arow[i] = AMODE == SU_A_ROW ? ab[pc * as1] * M::kLog2e : CT(0);
        if constexpr (AMODE == SU_A_FULL) {
#pragma unroll
            for (int c = 0; c < CH; ++c) {
                const int n0 = (c * tn + ln) * V;
                if (n0 < N) {
                    su_load_vec<CT, V>(ab + pc * as1 + n0, af[i][c]);
                } else {
#pragma unroll
                    for (int k = 0; k < V; ++k) af[i][c][k] = CT(0);
                }
            }
        }
    }
    const CT a_head = AMODE == SU_A_HEAD ? ab[0] * M::kLog2e : CT(0);

    // ---- the tokens ----
    CT s[PPT][CH][V];
#pragma unroll
    for (int i = 0; i < PPT; ++i)
#pragma unroll
        for (int c = 0; c < CH; ++c) su_vec<ST>::unpack(raw[i][c], s[i][c]);
    for (int t = 0; t < T; ++t) {
        CT d_head = CT(0), decay_head = CT(1);
        if constexpr (AMODE == SU_A_HEAD) {
            d_head = softplus ? M::softplus(dv[0] + bias[0]) : dv[0] + bias[0];
            decay_head = M::decay(d_head * a_head);
        }
        CT acc[PPT];
#pragma unroll
        for (int i = 0; i < PPT; ++i) {
            CT d = d_head, decay = decay_head;
            if constexpr (AMODE != SU_A_HEAD) {
                d = softplus ? M::softplus(dv[i] + bias[i]) : dv[i] + bias[i];
                if constexpr (AMODE == SU_A_ROW) decay = M::decay(d * arow[i]);
            }
            const CT dx = d * xv[i];
            CT sum = CT(0);
#pragma unroll
            for (int c = 0; c < CH; ++c) {
#pragma unroll
                for (int k = 0; k < V; ++k) {
                    CT a = decay;
                    if constexpr (AMODE == SU_A_FULL) a = M::decay(d * af[i][c][k] * M::kLog2e);
                    s[i][c][k] = s[i][c][k] * a + dx * bv[c][k];
                    sum += s[i][c][k] * cv[c][k];
                }
            }
            acc[i] = sum;
        }
#pragma unroll
        for (int m = 16; m >= 1; m >>= 1) {
            if (m < tn) {
#pragma unroll
                for (int i = 0; i < PPT; ++i) acc[i] += ssm_shfl_xor(0xffffffffu, acc[i], m);
            }
        }
        // Every lane of a channel holds its sums: lane i finishes row i, all rows in one
        // evaluation of the gate (lane 0 finishes them in turn when TN < PPT).
        auto finish = [&](int i, CT sum, CT xo, CT zo, CT d1) {
            const int p = p0 + i * tp;
            if (p < P) {
                CT out = sum + d1 * xo;
                if (z != nullptr) out *= zo * M::sigmoid(zo);
                ssm_store(yb + t * ys1 + p * ys3, out);
            }
        };
        if (tn >= PPT) {
            CT sum = acc[0], xo = xv[0], zo = zv[0], d1 = dk[0];
#pragma unroll
            for (int i = 1; i < PPT; ++i)
                if (ln == i) { sum = acc[i]; xo = xv[i]; zo = zv[i]; d1 = dk[i]; }
            if (ln < PPT) finish(ln, sum, xo, zo, d1);
        } else if (ln == 0) {
#pragma unroll
            for (int i = 0; i < PPT; ++i) finish(i, acc[i], xv[i], zv[i], dk[i]);
        }
        if (t + 1 < T) {  // several tokens: the next one's inputs
            load_bc(t + 1);
            load_token(t + 1);
        }
    }

    // ---- the state back ----
#pragma unroll
    for (int i = 0; i < PPT; ++i) {
        const int p = p0 + i * tp;
        if (p >= P) break;  // rows rise with i
#pragma unroll
        for (int c = 0; c < CH; ++c) {
            const int n0 = (c * tn + ln) * V;
            if (n0 >= N) continue;
            ssm_v16 v;
            su_vec<ST>::pack(v, s[i][c]);
            *reinterpret_cast<ssm_v16*>(sb + p * ss2 + n0) = v;
        }
    }
}

// ---------------------------------------------------------------------------------------
// The tile form (ssm_state_update_tile): Mamba-2's per-head parameters (SU_A_HEAD) and a
// state whose channels are contiguous rows of N values (16-byte aligned), so the state of
// a block's channels is one run of bytes. One thread copies that run into shared memory
// with a single bulk asynchronous copy (sm_90's cp.async.bulk, completing on an mbarrier;
// a plain block-wide copy before sm_90): the bytes a block has in flight no longer cost
// registers or instructions, so a block's whole tile (16-32 KiB) is on its way at once and
// the SM's other blocks compute while it arrives. The threads then walk the tile in passes
// from shared memory (TN lanes per channel, PPT channels per thread and pass, as in
// ssm_state_update) and store the new state straight to global memory after the last
// token (before it, back into the tile: several tokens read the state once). The channels'
// x, z and D are staged in shared memory per token, so a pass waits on nothing global. Same arguments as ssm_state_update; rows_per_block channels per
// block; dynamic shared memory: the tile (rows_per_block * N states) then 3 *
// rows_per_block values of the compute type.

// Blocks of 256 threads per SM the register bound leaves room for, from an estimate of the
// registers a thread needs (its state values, B and C, about 24 more; fitted to ptxas -v on
// sm_90): the fewer registers, the more blocks and tiles in flight per SM. Left to itself
// ptxas either spilled or took 80 and more (bfloat16, N = 128: 56 under this bound).
template <typename ST, int CH, int PPT> struct su_tile_min_blocks {
    static constexpr int V = su_vec<ST>::V;
    static constexpr int regs = (CH * PPT * V + 2 * CH * V) * (sizeof(ST) == 8 ? 2 : 1) + 24;
    static constexpr int value = regs <= 64 ? 4 : regs <= 112 ? 2 : 1;
};

// The tile kernel's passes over a token: rows r = q0 + i * tp + pr of the tile (q0 steps
// by tp * PPT), lane ln holding the CH vectors j = c * TN + ln of each. The new state goes to
// global memory after the last token, else back to the tile; each channel's sum over N to
// sy. CHECKED: rows past nrows and vectors past nv are skipped (else there are none, and a
// row is CH * TN vectors).
template <typename ST, int CH, int PPT, int TN, bool CHECKED, typename CT>
__device__ __forceinline__ void su_tile_passes(
    ssm_v16* __restrict__ tile, ssm_v16* __restrict__ sg, const CT* __restrict__ sx,
    CT* __restrict__ sy, const CT (&bv)[CH][su_vec<ST>::V], const CT (&cv)[CH][su_vec<ST>::V],
    CT d, CT decay, bool last, int nrows, int nv, int tp, int pr, int ln) {
    constexpr int V = su_vec<ST>::V;
    const int stride = CHECKED ? nv : CH * TN;  // vectors per row
    const int pass_rows = tp * PPT;
    for (int q0 = 0; q0 < nrows; q0 += pass_rows) {
        CT s[PPT][CH][V];
#pragma unroll
        for (int i = 0; i < PPT; ++i) {
            const int r = q0 + i * tp + pr;
#pragma unroll
            for (int c = 0; c < CH; ++c) {
                const int j = c * TN + ln;
                if (!CHECKED || (r < nrows && j < nv)) {
                    su_vec<ST>::unpack(tile[r * stride + j], s[i][c]);
                } else {
#pragma unroll
                    for (int k = 0; k < V; ++k) s[i][c][k] = CT(0);
                }
            }
        }
        CT acc[PPT];
#pragma unroll
        for (int i = 0; i < PPT; ++i) {
            const int r = CHECKED ? min(q0 + i * tp + pr, nrows - 1) : q0 + i * tp + pr;
            const CT dx = d * sx[r];
            CT sum = CT(0);
#pragma unroll
            for (int c = 0; c < CH; ++c) {
#pragma unroll
                for (int k = 0; k < V; ++k) {
                    s[i][c][k] = s[i][c][k] * decay + dx * bv[c][k];
                    sum += s[i][c][k] * cv[c][k];
                }
            }
            acc[i] = sum;
        }
#pragma unroll
        for (int i = 0; i < PPT; ++i) {
            const int r = q0 + i * tp + pr;
#pragma unroll
            for (int c = 0; c < CH; ++c) {
                const int j = c * TN + ln;
                if (!CHECKED || (r < nrows && j < nv)) {
                    ssm_v16 v;
                    su_vec<ST>::pack(v, s[i][c]);
                    if (last) sg[r * stride + j] = v;
                    else tile[r * stride + j] = v;
                }
            }
        }
#pragma unroll
        for (int m = TN / 2; m >= 1; m >>= 1) {
#pragma unroll
            for (int i = 0; i < PPT; ++i) acc[i] += ssm_shfl_xor(0xffffffffu, acc[i], m);
        }
        // lane i of a channel writes row i's sum (lane 0 all of them when TN < PPT)
#pragma unroll
        for (int i = 0; i < PPT; ++i) {
            const int r = q0 + i * tp + pr;
            if ((TN >= PPT ? ln == i : ln == 0) && (!CHECKED || r < nrows)) sy[r] = acc[i];
        }
    }
}

// TN (lanes per channel) is a template parameter here: the butterfly has no branches and a
// whole tile's addresses are compile-time strides.
template <typename ST, typename IT, int CH, int PPT, int TN>
__global__ void __launch_bounds__(256, (su_tile_min_blocks<ST, CH, PPT>::value))
ssm_state_update_tile(
    SU_KERNEL_PARAMS) {
    typedef typename ssm_compute_of<ST>::type CT;
    typedef ssm_math<CT> M;
    constexpr int V = su_vec<ST>::V;
    static_assert(TN >= 1 && TN <= 32 && (TN & (TN - 1)) == 0, "TN: a power of two up to 32");
    (void)ss2; (void)ss3; (void)ds2; (void)ds3; (void)as1; (void)as2; (void)bs3; (void)cs3;
    (void)bias1; (void)log2_tn;

    const int ln = threadIdx.x % TN;
    const int pr = threadIdx.x / TN;
    const int tp = blockDim.x / TN;
    const int h = blockIdx.y;
    const int b = b0 + blockIdx.z;
    const int g = h / heads_per_group;
    const int p_begin = blockIdx.x * rows_per_block;
    const int nrows = min(P - p_begin, rows_per_block);
    const int nv = N / V;  // vectors per channel

    const IT* const xb = x + b * xs0 + h * xs2 + p_begin * xs3;
    const IT* const db = dt + b * ds0 + h * ds2;
    const IT* const zb = z + b * zs0 + h * zs2 + p_begin * zs3;
    IT* const yb = y + b * ys0 + h * ys2 + p_begin * ys3;
    const IT* const bb = Bm + b * bs0 + (ssm_i64)g * bs2;
    const IT* const cb = Cm + b * cs0 + (ssm_i64)g * cs2;

    const ssm_i64 slot = rows != nullptr ? rows[b] : (ssm_i64)b;
    if (slot < 0) {  // padding: y = 0, no state touched
        for (int r = threadIdx.x; r < nrows; r += blockDim.x)
            for (int t = 0; t < T; ++t) ssm_store(yb + t * ys1 + r * ys3, (CT)0);
        return;
    }
    if (T == 0) return;
    ssm_v16* const sg = reinterpret_cast<ssm_v16*>(state + slot * ss0 + h * ss1 + (ssm_i64)p_begin * N);

    extern __shared__ ssm_v16 su_tile[];
    __shared__ unsigned long long su_bar;
    const unsigned int tile_bytes = (unsigned int)(nrows * nv) * 16u;
    const int pass_rows = tp * PPT;
    // after the tile (rows_per_block channels): x, z, D and the sums over N of the block's
    // channels
    CT* const sx = reinterpret_cast<CT*>(su_tile + rows_per_block * nv);
    CT* const sz = sx + rows_per_block;
    CT* const sd = sz + rows_per_block;
    CT* const sy = sd + rows_per_block;
    // Whole passes and whole lanes (every block of the peer shapes): no bound tests at all.
    const bool whole = nrows % pass_rows == 0 && nv == CH * TN;

    CT bv[CH][V], cv[CH][V];
    const CT a_head = A[h * as0] * M::kLog2e;
    const CT bias = dt_bias != nullptr ? dt_bias[h * bias0] : CT(0);
    for (int t = 0; t < T; ++t) {
        // ---- this token's B, C, dt' and decay (registers) and x, z (shared memory) ----
#pragma unroll
        for (int c = 0; c < CH; ++c) {
            const int n0 = (c * TN + ln) * V;
            if (n0 < N) {
                su_load_vec<CT, V>(bb + t * bs1 + n0, bv[c]);
                su_load_vec<CT, V>(cb + t * cs1 + n0, cv[c]);
            } else {
#pragma unroll
                for (int k = 0; k < V; ++k) bv[c][k] = cv[c][k] = CT(0);
            }
        }
        const CT d_raw = su_ld<CT>(db + t * ds1) + bias;
        if (t == 0 && threadIdx.x == 0) {
            // the tile's copy goes out after this thread's small loads (measured 0.051
            // against 0.060 ms the other way round, bfloat16 peer shape)
            ssm_bulk_bar_init(&su_bar);
            ssm_bulk_expect(&su_bar, tile_bytes);
            ssm_bulk_copy(su_tile, sg, tile_bytes, &su_bar);
        }
        if (t > 0) __syncthreads();  // the last token's passes and outputs have read x, z
        for (int r = threadIdx.x; r < nrows; r += blockDim.x) {
            sx[r] = su_ld<CT>(xb + t * xs1 + r * xs3);
            if (z != nullptr) sz[r] = su_ld<CT>(zb + t * zs1 + r * zs3);
            if (t == 0) sd[r] = D != nullptr ? D[h * Ds0 + (p_begin + r) * Ds1] : CT(0);
        }
        const CT d = softplus ? M::softplus(d_raw) : d_raw;
        const CT decay = M::decay(d * a_head);
        __syncthreads();
        if (t == 0) ssm_bulk_wait(&su_bar, su_tile, sg, tile_bytes);
        const bool last = t + 1 == T;

        // ---- passes over the tile ----
        if (whole)
            su_tile_passes<ST, CH, PPT, TN, false>(su_tile, sg, sx, sy, bv, cv, d, decay, last,
                                                   nrows, nv, tp, pr, ln);
        else
            su_tile_passes<ST, CH, PPT, TN, true>(su_tile, sg, sx, sy, bv, cv, d, decay, last,
                                                  nrows, nv, tp, pr, ln);
        __syncthreads();  // every channel's sum is in sy
        // ---- the outputs, a thread per channel: D, the gate, the store ----
        for (int r = threadIdx.x; r < nrows; r += blockDim.x) {
            CT out = sy[r] + sd[r] * sx[r];
            if (z != nullptr) out *= sz[r] * M::sigmoid(sz[r]);
            ssm_store(yb + t * ys1 + r * ys3, out);
        }
    }
}

// ---------------------------------------------------------------------------------------
// The warp form (ssm_state_update_warp): one token, Mamba-2's per-head parameters (SU_A_HEAD)
// and contiguous channel rows whose 16-byte vectors number TN = 4 .. 32 (N * sizeof(ST) =
// 64 .. 512 bytes). A warp owns a run of SU_WARP_CHUNKS chunks of 512 bytes, each 32 / TN
// whole channels; lane l holds vector l % TN of channel l / TN of each chunk. At its start
// the warp copies its whole run (2 KiB) into shared memory with cp.async, each lane its own
// 16 bytes per chunk, one group per chunk, then computes chunk k as soon as its group has
// landed. Each lane reads back only the bytes it copied, so the wait orders everything.
// B, C (the lane's V values), dt', the decay and the run's x, z, D (a value per lane: x for
// the channel's lanes by a shuffle, y computed by that lane; D copied with chunk 0) stay in
// registers. The new state goes out with evict-first stores.
//
// Why (bench_state_update.py, benchmarks/su_warp_ring.py; STATE_UPDATE.md): the tile kernel
// kept each block's tile in flight but spent half its blocks' lives on their setup and
// passes, at 0.82-0.86 of copy for the bfloat16 peer step (0.048-0.050 ms). The prototype's
// warps with 2 KiB each (40 per SM, no block-wide barrier) took 0.046 ms, 0.044 with the
// evict-first stores (which gave the tile kernel 1.5%); this kernel 0.045.
//
// Grid: (blocks per head, H, rows), SU_WARP_THREADS threads; a block owns
// rows_per_block = warps x (chunks x 32 / TN) consecutive channels of one row and head.
#ifndef SU_WARP_CHUNKS
#define SU_WARP_CHUNKS 4  // WARP_CHUNKS in ssmkit/_gpu/state_update.py
#endif
#ifndef SU_WARP_THREADS
#define SU_WARP_THREADS 256  // WARP_THREADS there
#endif
template <typename ST, typename IT, int TN>
__global__ void __launch_bounds__(SU_WARP_THREADS)
ssm_state_update_warp(
    SU_KERNEL_PARAMS) {
    typedef typename ssm_compute_of<ST>::type CT;
    typedef ssm_math<CT> M;
    constexpr int V = su_vec<ST>::V;
    constexpr int NCH = SU_WARP_CHUNKS;
    constexpr int CPC = 32 / TN;       // channels per chunk
    constexpr int CPW = NCH * CPC;     // channels per warp
    constexpr unsigned FULL = 0xffffffffu;
    static_assert(TN >= 4 && TN <= 32 && (TN & (TN - 1)) == 0, "TN: 4, 8, 16 or 32");
    static_assert(CPW <= 32, "a lane holds one channel's x, z and D");
    (void)ss3; (void)xs1; (void)ds1; (void)ds3; (void)zs1; (void)ys1; (void)as1; (void)as2;
    (void)bs1; (void)bs3; (void)cs1; (void)cs3; (void)bias1; (void)log2_tn; (void)T; (void)N;
    __shared__ ssm_v16 su_run[SU_WARP_THREADS / 32][NCH][32];
    __shared__ CT su_dch[SU_WARP_THREADS / 32][32];

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int ln = lane % TN, q = lane / TN;
    const int h = blockIdx.y;
    const int b = b0 + blockIdx.z;
    const int p_run = blockIdx.x * rows_per_block + warp * CPW;  // the warp's first channel
    if (p_run >= P) return;  // (whole warps)
    IT* const yb = y + b * ys0 + h * ys2;
    const ssm_i64 slot = rows != nullptr ? rows[b] : (ssm_i64)b;
    if (slot < 0) {  // padding: y = 0, no state touched
        if (lane < CPW && p_run + lane < P) ssm_store(yb + (p_run + lane) * ys3, (CT)0);
        return;
    }

    const int pl = p_run + lane;  // the channel whose x, z, D this lane holds
    const bool mine = lane < CPW && pl < P;
    // the small loads first (B and C: the lane's V values; dt, A, dt_bias; the run's x, z),
    // then the run's copies, then the arithmetic: 0.0451 against 0.0479 ms with the copies
    // first (ptxas then spread the softplus's arithmetic among them), benchmarks/su_warp_ring.py
    const int g = h / heads_per_group;
    CT bv[V], cv[V];
    su_load_vec<CT, V>(Bm + b * bs0 + (ssm_i64)g * bs2 + ln * V, bv);
    su_load_vec<CT, V>(Cm + b * cs0 + (ssm_i64)g * cs2 + ln * V, cv);
    const CT bias = dt_bias != nullptr ? dt_bias[h * bias0] : CT(0);
    const CT d_raw = su_ld<CT>(dt + b * ds0 + h * ds2) + bias;
    const CT a_h = A[h * as0];
    const CT x_l = mine ? su_ld<CT>(x + b * xs0 + h * xs2 + pl * xs3) : CT(0);
    const CT z_l = mine && z != nullptr ? su_ld<CT>(z + b * zs0 + h * zs2 + pl * zs3) : CT(0);
    // the run's copies: chunk k of channel p_run + k CPC + q, the lane's vector ln; with
    // chunk 0, the run's D (a load of its own would be scheduled after the first wait)
    ssm_v16* const sg = reinterpret_cast<ssm_v16*>(state + slot * ss0 + h * ss1 +
                                                     (ssm_i64)p_run * ss2) + lane;
    if (D != nullptr && mine)
        ssm_cp_async<sizeof(CT)>(&su_dch[warp][lane], D + h * Ds0 + pl * Ds1);
#pragma unroll
    for (int k = 0; k < NCH; ++k) {
        if (p_run + k * CPC + q < P) ssm_cp_async<16>(&su_run[warp][k][lane], sg + 32 * k);
        ssm_cp_commit();
    }

    const CT d = softplus ? M::softplus(d_raw) : d_raw;
    const CT decay = M::decay(d * (a_h * M::kLog2e));
    IT* const y_l = yb + pl * ys3;
    CT d_l = CT(0);
#pragma unroll
    for (int k = 0; k < NCH; ++k) {
        ssm_cp_commit();  // (an empty group: waiting for all but the newest NCH lands chunk k)
        ssm_cp_wait<NCH>();
        if (k == 0 && D != nullptr && mine) d_l = su_dch[warp][lane];  // (its own copy)
        const int c = k * CPC + q;  // the lane's channel in the run
        const bool live = p_run + c < P;
        const CT xc = __shfl_sync(FULL, x_l, c);
        CT s[V];
        su_vec<ST>::unpack(su_run[warp][k][lane], s);
        const CT dx = d * xc;
        CT acc = CT(0);
#pragma unroll
        for (int j = 0; j < V; ++j) {
            s[j] = s[j] * decay + dx * bv[j];
            acc += s[j] * cv[j];
        }
        if (live) {
            ssm_v16 v;
            su_vec<ST>::pack(v, s);
            su_store_stream(sg + 32 * k, v);
        }
#pragma unroll
        for (int m = TN / 2; m >= 1; m >>= 1) acc += ssm_shfl_xor(FULL, acc, m);
        // y of the chunk's channels, each by the lane that holds its x, z, D (lane c)
        const CT acc_l = __shfl_sync(FULL, acc, (lane % CPC) * TN);
        if (mine && lane / CPC == k) {
            CT out = acc_l + d_l * x_l;
            if (z != nullptr) out *= z_l * M::sigmoid(z_l);
            ssm_store(y_l, out);
        }
    }
}
