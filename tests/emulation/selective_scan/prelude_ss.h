// Additions to emu_common.h for cuda_src/selective_scan.cu: cp.async.
//
// cp.async.{ca,cg}.shared.global [dst], [src], n: the source bytes are read at
// issue (so AddressSanitizer checks the source range then), and the
// destination is filled with 0xff bytes (a float/double NaN, a 16-bit NaN)
// until the issuing thread's cp.async.wait_group retires the copy's group,
// when the bytes land. So a read of a destination before the wait (a
// missing wait, a wait after the barrier instead of before it, a read of the
// buffer being filled) sees NaN and fails the comparison with the reference,
// instead of seeing the right bytes by luck as a synchronous copy would.
// Alignment and shared-memory bounds are checked at issue.
#include "emu_common.h"
#include <deque>

struct EmuCpCopy { unsigned char* dst; unsigned char data[16]; int n; };
thread_local std::vector<EmuCpCopy> emu_cp_open;                // issued, not yet committed
thread_local std::deque<std::vector<EmuCpCopy>> emu_cp_groups;  // committed, oldest first
std::atomic<long> emu_cp_count{0};

inline void emu_cp_async(void* dst, const void* src, int n, bool bypass_l1) {
    if (!(n == 4 || n == 8 || n == 16) || (bypass_l1 && n != 16)) emu_fail("cp.async: bad size");
    if (((unsigned long)dst) % n || ((unsigned long)src) % n) emu_fail("cp.async: misaligned address");
    unsigned char* d = (unsigned char*)dst;
    if (d < emu_smem_ptr || d + n > emu_smem_ptr + emu_dyn_smem) emu_fail("cp.async: destination outside shared memory");
    EmuCpCopy c;
    c.dst = d;
    c.n = n;
    memcpy(c.data, src, n);
    memset(d, 0xff, n);
    emu_cp_open.push_back(c);
    emu_cp_count++;
}
inline void emu_cp_commit() {
    emu_cp_groups.push_back(std::move(emu_cp_open));
    emu_cp_open.clear();
}
// cp.async.wait_group 0: every committed group lands (copies not yet committed stay in flight).
inline void emu_cp_wait_all() {
    for (auto& g : emu_cp_groups)
        for (auto& c : g) memcpy(c.dst, c.data, c.n);
    emu_cp_groups.clear();
}
// A thread must not leave copies in flight when it exits.
inline void emu_cp_exit_check() {
    bool busy = !emu_cp_open.empty();
    for (auto& g : emu_cp_groups) busy = busy || !g.empty();
    if (busy) emu_fail("cp.async copies still in flight at thread exit");
    emu_cp_groups.clear();
}
