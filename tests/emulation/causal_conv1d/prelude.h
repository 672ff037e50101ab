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
    Wp.bar->arrive_and_wait();
    int src = down ? (int)lane + src_off : (int)lane - src_off;
    const double r = (src >= 0 && src < 32) ? Wp.slot[src] : Wp.slot[lane];
    Wp.bar->arrive_and_wait();
    return (T)r;
}
template <typename T> inline T __shfl_up_sync(unsigned, T v, int d) { return emu_shfl_move(v, d, false); }
template <typename T> inline T __shfl_down_sync(unsigned, T v, int d) { return emu_shfl_move(v, d, true); }
inline float emu_rcp_ftz(float x) { float r = 1.0f / x; return (fabsf(r) < 1.17549435e-38f) ? 0.0f : r; }
inline unsigned emu_pack2(unsigned short lo, unsigned short hi) { return (unsigned)lo | ((unsigned)hi << 16); }
// a reciprocal good to about 2^-20 only, as a hardware approximation might be: the Newton steps must fix it
inline double emu_rcp64(double d) { double r = 1.0 / d; return r * (1.0 + 0x1p-20); }
