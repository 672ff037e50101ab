// Host emulation of the few CUDA features ssmkit's kernels use: one block at a
// time, its CUDA threads run as fibers (cooperative user-space contexts) on the
// calling OS thread, switched at __syncthreads and at the warp barriers of
// shuffles and mma.sync. Test tool only. Shared by every kernel family's prelude
// (each build passes -I tests/emulation).
#pragma once
#include <math.h>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <memory>
#include <atomic>
#include <deque>
#include <string>
#include <sys/mman.h>
#include <unistd.h>
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#include <sanitizer/asan_interface.h>
#endif
#if !defined(__x86_64__)
#error "the emulation's fiber switch (emu_common.h) is written for x86-64"
#endif

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)

struct emu_dim3 { unsigned x = 1, y = 1, z = 1; };
emu_dim3 threadIdx;  // the running fiber's (the scheduler sets it at each switch)
emu_dim3 blockIdx, blockDim, gridDim;
unsigned emu_dyn_smem = 0;
unsigned char* emu_smem_ptr = nullptr;
std::atomic<long> emu_shfl_count{0};

[[noreturn]] inline void emu_fail(const char* what) { fprintf(stderr, "EMU FAILURE: %s (block %u thread %u)\n", what, blockIdx.x, threadIdx.x); fflush(stderr); abort(); }

// ---- Fibers: a block's CUDA threads, run in turn on one OS thread ----
//
// Each CUDA thread is a fiber with its own stack. A fiber runs until it waits at a barrier
// (or ends), then the scheduler resumes the next one that can run, round robin; a barrier
// completes when its last thread arrives, which releases every fiber waiting at it.

struct EmuCpCopy { unsigned char* dst; unsigned char data[16]; int n; };  // a cp.async in flight

// A barrier of `expected` threads (the block's, or a warp's for shuffles and mma.sync).
struct EmuBarrier {
    unsigned expected = 0, arrived = 0;
    unsigned long gen = 0;  // completions so far
    int warp = -1;          // the warp it belongs to (-1: the block's), for the deadlock report
    void arrive_and_wait();
};

struct EmuFiber {
    void* sp = nullptr;              // its stack pointer while suspended (emu_ctx_switch)
    unsigned char* stack = nullptr;  // its stack's lowest usable byte (a guard page below)
    EmuBarrier* wait = nullptr;      // the barrier it waits at, and that barrier's generation
    unsigned long wait_gen = 0;      // then: it may run again once the generation moves on
    bool done = false;
    void* asan_fake = nullptr;       // AddressSanitizer's fake stack while suspended
    std::vector<EmuCpCopy> cp_open;                // cp.async: issued, not yet committed
    std::deque<std::vector<EmuCpCopy>> cp_groups;  // committed, oldest first
};

struct EmuSched {
    std::vector<EmuFiber> fibers;  // the block's threads, by threadIdx.x
    unsigned cur = 0;              // the running one
    void* main_sp = nullptr;       // the launch's own context, resumed when every fiber is done
    void (*fn)(void*) = nullptr;   // the kernel call every fiber runs, and its argument
    void* arg = nullptr;
    void* main_asan_fake = nullptr;
    const void* main_bottom = nullptr;  // the launch's stack, for AddressSanitizer
    size_t main_size = 0;
};
inline EmuSched emu_sched;
inline EmuFiber& emu_self() { return emu_sched.fibers[emu_sched.cur]; }

// A fiber's stack (mmap'd, reused by every block and launch, pages touched only as used):
// the kernels' register arrays and the emulated mma fragments live there. The deepest
// measured was about 8 KiB (the SSD backward under AddressSanitizer's red zones).
constexpr size_t EMU_FIBER_STACK = size_t(256) << 10;

// emu_ctx_switch(&save, to): save the callee-saved registers (rbx, rbp, r12-r15), MXCSR and
// the x87 control word on this stack, store the stack pointer in save, then load `to` and
// restore the same from it. Under the x86-64 System V ABI every other register is
// caller-saved, so the call itself is a complete switch (no signal mask: no syscall).
extern "C" __attribute__((visibility("hidden"))) void emu_ctx_switch(void** save, void* to);
asm(R"(
    .pushsection .text
    .globl emu_ctx_switch
    .hidden emu_ctx_switch
    .type emu_ctx_switch, @function
emu_ctx_switch:
    endbr64
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size emu_ctx_switch, .-emu_ctx_switch
    .popsection
)");

// AddressSanitizer must be told of each switch (it checks accesses against the current
// stack's bounds and keeps per-stack fake frames); no-ops without it.
#if defined(__SANITIZE_ADDRESS__)
inline void emu_asan_start(void** fake, const void* bottom, size_t size) { __sanitizer_start_switch_fiber(fake, bottom, size); }
inline void emu_asan_finish(void* fake, const void** bottom, size_t* size) { __sanitizer_finish_switch_fiber(fake, bottom, size); }
#else
inline void emu_asan_start(void**, const void*, size_t) {}
inline void emu_asan_finish(void*, const void**, size_t*) {}
#endif

// Every unfinished fiber waits at a barrier that cannot complete (a shuffle, __syncwarp,
// ldmatrix or mma.sync reached by only some lanes of a warp, a __syncthreads some threads
// skip or exit before): the hardware's result is undefined, the emulation stops here.
[[noreturn]] inline void emu_deadlock();

// Leave the running fiber (waiting at a barrier, or done) for the next one that can run,
// round robin after it; back to the launch once every fiber is done.
__attribute__((noinline)) inline void emu_switch_next() {
    EmuSched& S = emu_sched;
    const unsigned n = (unsigned)S.fibers.size();
    EmuFiber& self = S.fibers[S.cur];
    unsigned next = n;  // none found
    bool left = false;
    for (unsigned k = 0, i = S.cur; k < n; ++k) {
        if (++i == n) i = 0;
        const EmuFiber& f = S.fibers[i];
        if (f.done) continue;
        left = true;
        if (!f.wait || f.wait_gen != f.wait->gen) { next = i; break; }
    }
    if (next == S.cur) return;  // (only itself could run: its barrier has completed)
    if (next == n && left) emu_deadlock();
    void* to = next == n ? S.main_sp : S.fibers[next].sp;
    const void* bottom = next == n ? S.main_bottom : S.fibers[next].stack;
    emu_asan_start(self.done ? nullptr : &self.asan_fake, bottom, next == n ? S.main_size : EMU_FIBER_STACK);
    if (next < n) { S.cur = next; threadIdx.x = next; }
    emu_ctx_switch(&self.sp, to);
    // Resumed: whoever switched here set S.cur and threadIdx to this fiber.
    emu_asan_finish(self.asan_fake, nullptr, nullptr);
}

// A barrier of `expected` threads: arriving suspends the fiber until the last one arrives.
inline void EmuBarrier::arrive_and_wait() {
    if (++arrived == expected) { arrived = 0; ++gen; return; }
    EmuFiber& self = emu_self();
    self.wait = this;
    self.wait_gen = gen;
    emu_switch_next();
    self.wait = nullptr;
}
EmuBarrier* emu_block_barrier = nullptr;

struct EmuWarp { EmuBarrier bar; double slot[32]; unsigned mask; };
EmuWarp* emu_warps = nullptr;

[[noreturn]] inline void emu_deadlock() {
    std::string msg = "deadlock: every unfinished thread waits at a barrier that cannot complete (a shuffle, "
                      "__syncwarp, ldmatrix or mma.sync reached by only some lanes of a warp, or a "
                      "__syncthreads not reached by every thread):";
    const EmuBarrier* seen[64];
    int nseen = 0;
    for (const EmuFiber& f : emu_sched.fibers) {
        if (f.done || !f.wait) continue;
        bool dup = false;
        for (int i = 0; i < nseen; ++i) dup = dup || seen[i] == f.wait;
        if (dup || nseen == 64) continue;
        seen[nseen++] = f.wait;
        char line[96];
        if (f.wait->warp < 0) snprintf(line, sizeof line, " __syncthreads %u of %u arrived;", f.wait->arrived, f.wait->expected);
        else snprintf(line, sizeof line, " warp %d's barrier %u of %u arrived;", f.wait->warp, f.wait->arrived, f.wait->expected);
        msg += line;
    }
    unsigned done = 0;
    for (const EmuFiber& f : emu_sched.fibers) done += f.done;
    msg += " " + std::to_string(done) + " threads finished";
    emu_fail(msg.c_str());
}

inline void __syncthreads() { emu_block_barrier->arrive_and_wait(); }
int emu_or_flag = 0;
// A barrier that also returns whether any thread's predicate was non-zero.
inline int __syncthreads_or(int p) {
    emu_block_barrier->arrive_and_wait();  // the previous call's reads are done
    if (p) emu_or_flag = 1;
    emu_block_barrier->arrive_and_wait();  // every vote is in
    const int r = emu_or_flag;
    emu_block_barrier->arrive_and_wait();  // every thread has read it
    if (threadIdx.x == 0) emu_or_flag = 0;
    return r;
}
inline void __syncwarp(unsigned = 0xffffffffu) { emu_warps[threadIdx.x / 32].bar.arrive_and_wait(); }
[[noreturn]] inline void __trap() { emu_fail("__trap"); }

template <typename T> inline T __shfl_xor_sync(unsigned mask, T v, int m) {
    const unsigned tid = threadIdx.x, w = tid / 32, lane = tid % 32;
    EmuWarp& W = emu_warps[w];
    if (mask != W.mask) emu_fail("shuffle mask does not match the warp's lanes");
    if (!((mask >> (lane ^ (unsigned)m)) & 1u)) emu_fail("shuffle partner not in mask");
    W.slot[lane] = (double)v;
    W.bar.arrive_and_wait();
    const double r = W.slot[lane ^ (unsigned)m];
    W.bar.arrive_and_wait();
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
// The copies are the issuing thread's (EmuFiber's cp_open, cp_groups).

// One copy of n <= 16 bytes; zeros when src is null (a source size of 0).
inline void emu_cp_issue(void* dst, const void* src, int n) {
    EmuCpCopy c;
    c.dst = (unsigned char*)dst;
    c.n = n;
    if (src) memcpy(c.data, src, n); else memset(c.data, 0, n);
    memset(dst, 0xff, n);
    emu_self().cp_open.push_back(c);
}
inline void emu_cp_commit() {
    EmuFiber& f = emu_self();
    f.cp_groups.push_back(std::move(f.cp_open));
    f.cp_open.clear();
}
// cp.async.wait_group pending: every committed group but the newest `pending` lands (copies
// not yet committed stay in flight). A destination that no longer holds the 0xff bytes of
// its issue was stored to while the copy was in flight: on a GPU the copy may land before or
// after that store (a race), so it fails here.
inline void emu_cp_wait(int pending) {
    std::deque<std::vector<EmuCpCopy>>& groups = emu_self().cp_groups;
    while ((int)groups.size() > pending) {
        for (auto& c : groups.front()) {
            for (int i = 0; i < c.n; ++i)
                if (c.dst[i] != 0xff) emu_fail("cp.async: a store into the destination of a copy in flight");
            memcpy(c.dst, c.data, c.n);
        }
        groups.pop_front();
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
    EmuFiber& f = emu_self();
    bool busy = !f.cp_open.empty();
    for (auto& g : f.cp_groups) busy = busy || !g.empty();
    if (busy) emu_fail("cp.async copies still in flight at thread exit");
    f.cp_groups.clear();
}

// ---- Running a block ----

// The fibers' stacks, by thread index: each EMU_FIBER_STACK bytes above a PROT_NONE guard
// page, so that an overflow crashes instead of writing over another stack.
inline std::vector<unsigned char*> emu_stacks;
inline unsigned char* emu_stack(unsigned i) {
    while (emu_stacks.size() <= i) {
        const size_t page = (size_t)sysconf(_SC_PAGESIZE);
        void* p = mmap(nullptr, page + EMU_FIBER_STACK, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
        if (p == MAP_FAILED || mprotect(p, page, PROT_NONE) != 0) emu_fail("no memory for a fiber stack");
        emu_stacks.push_back((unsigned char*)p + page);
    }
    return emu_stacks[i];
}

// Where every fiber starts: the kernel call, the end-of-thread checks, then the next fiber.
[[noreturn]] inline void emu_fiber_main() {
    EmuSched& S = emu_sched;
    // The first fiber is entered from the launch: keep that stack's bounds for the way back.
    if (S.main_size == 0) emu_asan_finish(nullptr, &S.main_bottom, &S.main_size);
    else emu_asan_finish(nullptr, nullptr, nullptr);
    S.fn(S.arg);
    emu_cp_exit_check();
    emu_self().done = true;
    emu_switch_next();  // never returns here: a done fiber is not resumed
    __builtin_unreachable();
}

// A new fiber's stack as emu_ctx_switch leaves a suspended one: MXCSR and the x87 control
// word (the launch's), six callee-saved registers (zero), then emu_fiber_main as the return
// address, above it a null one, so that emu_fiber_main starts with the stack aligned as
// after a call (16-byte aligned plus 8).
inline void* emu_fiber_frame(unsigned char* top) {
    unsigned mxcsr;
    unsigned short fpcw;
    asm volatile("stmxcsr %0" : "=m"(mxcsr));
    asm volatile("fnstcw %0" : "=m"(fpcw));
    unsigned long* sp = (unsigned long*)top;
    *--sp = 0;
    *--sp = (unsigned long)&emu_fiber_main;
    for (int i = 0; i < 6; ++i) *--sp = 0;
    *--sp = mxcsr | ((unsigned long)fpcw << 32);
    return sp;
}

// Run one block of `block` threads, each calling call(), to completion: the block's barrier,
// a barrier per warp (the last one partial when block is not a multiple of 32: its mask has
// only its lanes), one fiber per thread.
template <typename F> inline void emu_run_block(F& call, unsigned block) {
    EmuBarrier bar;
    bar.expected = block;
    emu_block_barrier = &bar;
    const unsigned nw = (block + 31) / 32;
    std::vector<EmuWarp> warps(nw);
    for (unsigned w = 0; w < nw; ++w) {
        const unsigned cnt = block - 32 * w < 32 ? block - 32 * w : 32;
        warps[w].bar.expected = cnt;
        warps[w].bar.warp = (int)w;
        warps[w].mask = cnt == 32 ? 0xffffffffu : ((1u << cnt) - 1u);
    }
    emu_warps = warps.data();
    EmuSched& S = emu_sched;
    S.fibers.clear();
    S.fibers.resize(block);
    for (unsigned t = 0; t < block; ++t) {
        S.fibers[t].stack = emu_stack(t);
        S.fibers[t].sp = emu_fiber_frame(S.fibers[t].stack + EMU_FIBER_STACK);
    }
    S.fn = [](void* f) { (*(F*)f)(); };
    S.arg = &call;
    S.main_size = 0;
    S.cur = 0;
    threadIdx.x = 0;
    emu_asan_start(&S.main_asan_fake, S.fibers[0].stack, EMU_FIBER_STACK);
    emu_ctx_switch(&S.main_sp, S.fibers[0].sp);
    emu_asan_finish(S.main_asan_fake, nullptr, nullptr);
    emu_block_barrier = nullptr;
    emu_warps = nullptr;
}
