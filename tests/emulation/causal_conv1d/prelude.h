// causal_conv1d additions to the shared host emulation (emu_common.h).
#include "emu_common.h"
#include <algorithm>
using std::max;
using std::min;

#define __shared__ static
template <typename T> inline T emu_shfl_move(T v, int src_off, bool down) {
    const unsigned tid = threadIdx.x, w = tid / 32, lane = tid % 32;
    EmuWarp& Wp = emu_warps[w];
    if (Wp.mask != 0xffffffffu) emu_fail("partial warp shuffle");
    Wp.slot[lane] = (double)v;
    Wp.bar.arrive_and_wait();
    int src = down ? (int)lane + src_off : (int)lane - src_off;
    const double r = (src >= 0 && src < 32) ? Wp.slot[src] : Wp.slot[lane];
    Wp.bar.arrive_and_wait();
    return (T)r;
}
template <typename T> inline T __shfl_up_sync(unsigned, T v, int d) { return emu_shfl_move(v, d, false); }
template <typename T> inline T __shfl_down_sync(unsigned, T v, int d) { return emu_shfl_move(v, d, true); }
inline unsigned emu_pack2(unsigned short lo, unsigned short hi) { return (unsigned)lo | ((unsigned)hi << 16); }
// a reciprocal good to about 2^-20 only, as a hardware approximation might be: the Newton steps must fix it
inline double emu_rcp64(double d) { double r = 1.0 / d; return r * (1.0 + 0x1p-20); }

// The tensor-core backward (cc1d_bwd_mma): mma.sync as in the SSD emulation, indexed
// shuffles, __syncwarp and movmatrix.
#include "../ssd/prelude_mma.h"
template <typename T> inline T __shfl_sync(unsigned mask, T v, int src) {
    const unsigned tid = threadIdx.x, w = tid / 32, lane = tid % 32;
    EmuWarp& Wp = emu_warps[w];
    if (mask != Wp.mask) emu_fail("shuffle mask does not match the warp's lanes");
    if (src < 0 || src > 31) emu_fail("shuffle source lane out of range");
    Wp.slot[lane] = (double)v;
    Wp.bar.arrive_and_wait();
    const double r = Wp.slot[src];
    Wp.bar.arrive_and_wait();
    return (T)r;
}
// movmatrix.sync.aligned.m8n8.trans.b16: lane (g, t) gets elements (2t, g) and (2t + 1, g) of
// the matrix whose row r, columns 2u, 2u + 1 are lane 4r + u's word.
inline unsigned emu_movmatrix_trans(unsigned a) {
    const unsigned tid = threadIdx.x, w = tid / 32, lane = tid % 32;
    EmuWarp& Wp = emu_warps[w];
    Wp.slot[lane] = (double)a;
    Wp.bar.arrive_and_wait();
    auto elem = [&](int r, int c) {
        const unsigned word = (unsigned)Wp.slot[r * 4 + c / 2];
        return (c & 1) ? word >> 16 : word & 0xffffu;
    };
    const int g = lane >> 2, t = lane & 3;
    const unsigned d = elem(2 * t, g) | (elem(2 * t + 1, g) << 16);
    Wp.bar.arrive_and_wait();
    return d;
}


