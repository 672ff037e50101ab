// Host emulation of the few CUDA features ssmkit's kernels use: one block at a
// time, one std::thread per CUDA thread, std::barrier for __syncthreads and for
// warp shuffles. Test tool only. Shared by every kernel family's prelude (each
// build passes -I tests/emulation).
#pragma once
#include <math.h>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <barrier>
#include <vector>
#include <memory>
#include <atomic>
#include <deque>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)

struct emu_dim3 { unsigned x = 1, y = 1, z = 1; };
thread_local emu_dim3 threadIdx;
emu_dim3 blockIdx, blockDim, gridDim;
unsigned emu_dyn_smem = 0;
unsigned char* emu_smem_ptr = nullptr;
std::barrier<>* emu_block_barrier = nullptr;
std::atomic<long> emu_shfl_count{0};

struct EmuWarp { std::barrier<>* bar; double slot[32]; unsigned mask; };
EmuWarp* emu_warps = nullptr;

[[noreturn]] inline void emu_fail(const char* what) { fprintf(stderr, "EMU FAILURE: %s (block %u thread %u)\n", what, blockIdx.x, threadIdx.x); fflush(stderr); abort(); }
inline void __syncthreads() { emu_block_barrier->arrive_and_wait(); }
std::atomic<int> emu_or_flag{0};
// A barrier that also returns whether any thread's predicate was non-zero.
inline int __syncthreads_or(int p) {
    emu_block_barrier->arrive_and_wait();  // the previous call's reads are done
    if (p) emu_or_flag.store(1);
    emu_block_barrier->arrive_and_wait();  // every vote is in
    const int r = emu_or_flag.load();
    emu_block_barrier->arrive_and_wait();  // every thread has read it
    if (threadIdx.x == 0) emu_or_flag.store(0);
    return r;
}
inline void __syncwarp(unsigned = 0xffffffffu) { emu_warps[threadIdx.x / 32].bar->arrive_and_wait(); }
[[noreturn]] inline void __trap() { emu_fail("__trap"); }

template <typename T> inline T __shfl_xor_sync(unsigned mask, T v, int m) {
    const unsigned tid = threadIdx.x, w = tid / 32, lane = tid % 32;
    EmuWarp& W = emu_warps[w];
    if (mask != W.mask) emu_fail("shuffle mask does not match the warp's lanes");
    if (!((mask >> (lane ^ (unsigned)m)) & 1u)) emu_fail("shuffle partner not in mask");
    W.slot[lane] = (double)v;
    W.bar->arrive_and_wait();
    const double r = W.slot[lane ^ (unsigned)m];
    W.bar->arrive_and_wait();
    emu_shfl_count++;
    return (T)r;
}

inline float emu_h2f(unsigned short b) { _Float16 h; memcpy(&h, &b, 2); return (float)h; }
inline unsigned short emu_f2h(float f) { _Float16 h = (_Float16)f; unsigned short b; memcpy(&b, &h, 2); return b; }
inline unsigned short emu_f2bf(float f) {
    unsigned u; memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40);  // NaN stays NaN
    u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
    return (unsigned short)(u >> 16);
}
inline float __fdividef(float a, float b) { return a / b; }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned)x); }
inline float emu_rcp_ftz(float x) { float r = 1.0f / x; return (fabsf(r) < 1.17549435e-38f) ? 0.0f : r; }
inline float emu_lg2_ftz(float x) { return x < 1.17549435e-38f && x >= 0.0f ? -INFINITY : log2f(x); }
inline float emu_ex2_ftz(float x) { float r = exp2f(x); return (fabsf(r) < 1.17549435e-38f) ? 0.0f : r; }

template <typename V, typename P> inline V* emu_al(P* p) {
    if (((unsigned long)p) % alignof(V) != 0) emu_fail("misaligned vector access");
    return reinterpret_cast<V*>(p);
}

// A prefetch hint: read one byte so AddressSanitizer sees out-of-bounds addresses.
inline void emu_prefetch(const void* p) { volatile char c = *(const char*)p; (void)c; }

// cp.async and its groups (each family's prelude checks a copy's form, then issues it here):
// the source bytes are read at issue (so AddressSanitizer checks the source range then), and
// the destination holds 0xff bytes (a float/double NaN, a 16-bit NaN) until the issuing
// thread's cp.async.wait_group retires the copy's group, when the bytes land. So a read of a
// destination before the wait (a missing or too shallow wait, a wait after the barrier
// instead of before it, a read of the buffer being filled) sees NaN and fails the comparison
// with the reference, instead of seeing the right bytes by luck as a synchronous copy would.
struct EmuCpCopy { unsigned char* dst; unsigned char data[16]; int n; };
thread_local std::vector<EmuCpCopy> emu_cp_open;                // issued, not yet committed
thread_local std::deque<std::vector<EmuCpCopy>> emu_cp_groups;  // committed, oldest first

// One copy of n <= 16 bytes; zeros when src is null (a source size of 0).
inline void emu_cp_issue(void* dst, const void* src, int n) {
    EmuCpCopy c;
    c.dst = (unsigned char*)dst;
    c.n = n;
    if (src) memcpy(c.data, src, n); else memset(c.data, 0, n);
    memset(dst, 0xff, n);
    emu_cp_open.push_back(c);
}
inline void emu_cp_commit() {
    emu_cp_groups.push_back(std::move(emu_cp_open));
    emu_cp_open.clear();
}
// cp.async.wait_group pending: every committed group but the newest `pending` lands (copies
// not yet committed stay in flight). A destination that no longer holds the 0xff bytes of
// its issue was stored to while the copy was in flight: on a GPU the copy may land before or
// after that store (a race), so it fails here.
inline void emu_cp_wait(int pending) {
    while ((int)emu_cp_groups.size() > pending) {
        for (auto& c : emu_cp_groups.front()) {
            for (int i = 0; i < c.n; ++i)
                if (c.dst[i] != 0xff) emu_fail("cp.async: a store into the destination of a copy in flight");
            memcpy(c.dst, c.data, c.n);
        }
        emu_cp_groups.pop_front();
    }
}
// cp.async.{ca,cg}.shared.global [dst], [src], n (ssm_cp_async: the 4-, 8- and 16-byte
// forms, into the dynamic shared memory), checked and issued as above.
std::atomic<long> emu_cp_count{0};
inline void emu_cp_async(void* dst, const void* src, int n, bool bypass_l1) {
    if (!(n == 4 || n == 8 || n == 16) || (bypass_l1 && n != 16)) emu_fail("cp.async: bad size");
    if (((unsigned long)dst) % n || ((unsigned long)src) % n) emu_fail("cp.async: misaligned address");
    unsigned char* d = (unsigned char*)dst;
    if (d < emu_smem_ptr || d + n > emu_smem_ptr + emu_dyn_smem) emu_fail("cp.async: destination outside shared memory");
    emu_cp_issue(dst, src, n);
    emu_cp_count++;
}
// cp.async.cg.shared.global [dst], [src], 16, src-size (0 or 16) (ssm_cp_async16_zfill):
// checked and issued as above (a source size of 0 writes zeros).
inline void emu_cp16(void* dst, const void* src, bool live) {
    if (((unsigned long)dst) % 16 || (live && ((unsigned long)src) % 16))
        emu_fail("cp.async: misaligned address");
    emu_cp_issue(dst, live ? src : nullptr, 16);
}

// Shared-window addresses (__cvta_generic_to_shared, ssm_smem_addr) as 32-bit offsets from an
// anchor in the same library's static data, where the kernels' static __shared__ arrays
// are, so that they fit in 32 bits; emu_smem_at turns one back into a pointer.
inline unsigned char emu_smem_anchor[16];
inline unsigned emu_cvta_shared(const void* p) {
    return (unsigned)(int)((const unsigned char*)p - emu_smem_anchor);
}
inline unsigned long long __cvta_generic_to_shared(const void* p) { return emu_cvta_shared(p); }
inline unsigned char* emu_smem_at(unsigned a) { return emu_smem_anchor + (int)a; }

// A thread must not leave copies in flight when it exits.
inline void emu_cp_exit_check() {
    bool busy = !emu_cp_open.empty();
    for (auto& g : emu_cp_groups) busy = busy || !g.empty();
    if (busy) emu_fail("cp.async copies still in flight at thread exit");
    emu_cp_groups.clear();
}
