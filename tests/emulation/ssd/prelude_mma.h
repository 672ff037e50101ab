// Additions for the SSD tensor-core kernels: static __shared__ arrays, mma.sync emulation.
#include "emu_common.h"
#define __shared__ static
#include <cstdint>

// One warp's operands of one mma.sync, gathered from its 32 lanes.
struct EmuMmaX { unsigned a[32][4]; unsigned b[32][2]; const unsigned short* rows[32]; };
EmuMmaX* emu_mmax = nullptr;
std::atomic<long> emu_mma_count{0};

template <bool BF> inline float emu_16_to_f(unsigned short u) {
    if (BF) { unsigned w = ((unsigned)u) << 16; float f; memcpy(&f, &w, 4); return f; }
    return emu_h2f(u);
}

// The two halves of an emulated mma.sync around the operands' decoding: emu_mma_gather stores
// this lane's registers with its warp's and waits for all 32 lanes (the warp's gathered
// registers); emu_mma_finish waits until every lane has decoded them (they may then be
// overwritten), then adds A B (16 x K times K x 8, in double) to this lane's accumulators:
// d0, d1 = D[g][2t..2t+1], d2, d3 = D[g+8][2t..2t+1].
inline EmuMmaX& emu_mma_gather(const unsigned (&a)[4], unsigned b0, unsigned b1) {
    const unsigned tid = threadIdx.x, w = tid / 32, lane = tid % 32;
    EmuWarp& W = emu_warps[w];
    if (W.mask != 0xffffffffu) emu_fail("mma.sync in a partial warp");
    EmuMmaX& X = emu_mmax[w];
    for (int i = 0; i < 4; ++i) X.a[lane][i] = a[i];
    X.b[lane][0] = b0; X.b[lane][1] = b1;
    W.bar.arrive_and_wait();
    return X;
}
template <int K>
inline void emu_mma_finish(float (&d)[4], const float (&A)[16][K], const float (&B)[K][8]) {
    const unsigned tid = threadIdx.x, lane = tid % 32;
    emu_warps[tid / 32].bar.arrive_and_wait();
    const int g = lane >> 2, t = lane & 3;
    for (int i = 0; i < 4; ++i) {
        const int r = g + (i >= 2 ? 8 : 0), c = 2 * t + (i & 1);
        double s = 0;
        for (int k = 0; k < K; ++k) s += (double)A[r][k] * (double)B[k][c];
        d[i] = (float)((double)d[i] + s);
    }
    emu_mma_count++;
}

// mma.sync.aligned.m16n8k16.row.col.f32.{bf16|f16}: D = A B + D with the PTX ISA fragments
// (g = lane >> 2, t = lane & 3): a0 = A[g][2t..2t+1], a1 = A[g+8][2t..], a2 = A[g][2t+8..],
// a3 = A[g+8][2t+8..]; b0 = B[2t..2t+1][g], b1 = B[2t+8..2t+9][g]; d0,d1 = D[g][2t..2t+1],
// d2,d3 = D[g+8][2t..2t+1]; the low half of a register is the lower index.
template <bool BF>
inline void emu_mma(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    const EmuMmaX& X = emu_mma_gather(a, b0, b1);
    float A[16][16], B[16][8];
    for (int l = 0; l < 32; ++l) {
        const int g = l >> 2, t = l & 3;
        const int rows[4] = {g, g + 8, g, g + 8}, cols[4] = {2 * t, 2 * t, 2 * t + 8, 2 * t + 8};
        for (int i = 0; i < 4; ++i) {
            A[rows[i]][cols[i]] = emu_16_to_f<BF>(X.a[l][i] & 0xffffu);
            A[rows[i]][cols[i] + 1] = emu_16_to_f<BF>(X.a[l][i] >> 16);
        }
        for (int i = 0; i < 2; ++i) {
            const int k = 2 * t + 8 * i;
            B[k][g] = emu_16_to_f<BF>(X.b[l][i] & 0xffffu);
            B[k + 1][g] = emu_16_to_f<BF>(X.b[l][i] >> 16);
        }
    }
    emu_mma_finish<16>(d, A, B);
}

struct alignas(8) float2 { float x, y; };
inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }

// mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32: D = A B + D with the PTX ISA fragments
// (g = lane >> 2, t = lane & 3): a0 = A[g][t], a1 = A[g + 8][t], a2 = A[g][t + 4],
// a3 = A[g + 8][t + 4]; b0 = B[t][g], b1 = B[t + 4][g]; d as for m16n8k16. Operands must be
// TF32 values (low 13 bits zero), as ssm_tf32_split makes them.
inline void emu_mma_tf32(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    const EmuMmaX& X = emu_mma_gather(a, b0, b1);
    float A[16][8], B[8][8];
    for (int l = 0; l < 32; ++l) {
        const int g = l >> 2, t = l & 3;
        for (int i = 0; i < 4; ++i) {
            if (X.a[l][i] & 0x1fffu) emu_fail("mma tf32 operand with low bits set");
            A[g + 8 * (i & 1)][t + 4 * (i >> 1)] = __uint_as_float(X.a[l][i]);
        }
        for (int i = 0; i < 2; ++i) {
            if (X.b[l][i] & 0x1fffu) emu_fail("mma tf32 operand with low bits set");
            B[t + 4 * i][g] = __uint_as_float(X.b[l][i]);
        }
    }
    emu_mma_finish<8>(d, A, B);
}

// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: lane l names row l % 8 of matrix l / 8
// (16-byte aligned); lane (g = l / 4, t = l % 4) receives in r[i] matrix i's row g, columns
// 2t, 2t + 1 (.trans: column g, rows 2t, 2t + 1), the lower index in the low half.
template <bool TRANS>
inline void emu_ldsm(unsigned (&r)[4], const unsigned short* p) {
    const unsigned tid = threadIdx.x, w = tid / 32, lane = tid % 32;
    EmuWarp& W = emu_warps[w];
    if (W.mask != 0xffffffffu) emu_fail("ldmatrix in a partial warp");
    if (((unsigned long)p) % 16 != 0) emu_fail("ldmatrix row not 16-byte aligned");
    EmuMmaX& X = emu_mmax[w];
    X.rows[lane] = p;
    W.bar.arrive_and_wait();
    const int g = lane >> 2, t = lane & 3;
    for (int i = 0; i < 4; ++i) {
        const unsigned lo = TRANS ? X.rows[8 * i + 2 * t][g] : X.rows[8 * i + g][2 * t];
        const unsigned hi = TRANS ? X.rows[8 * i + 2 * t + 1][g] : X.rows[8 * i + g][2 * t + 1];
        r[i] = lo | (hi << 16);
    }
    W.bar.arrive_and_wait();  // every lane has read the row addresses before any reuses them
}

