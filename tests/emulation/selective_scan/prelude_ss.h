// Additions to emu_common.h for cuda_src/selective_scan.cu: cp.async's forms (the copies and
// their groups are emu_common.h's). Alignment and shared-memory bounds are checked at
// issue.
#include "emu_common.h"

std::atomic<long> emu_cp_count{0};

// cp.async.{ca,cg}.shared.global [dst], [src], n (the 4-, 8- and 16-byte forms), checked and
// issued as emu_common.h's copies.
inline void emu_cp_async(void* dst, const void* src, int n, bool bypass_l1) {
    if (!(n == 4 || n == 8 || n == 16) || (bypass_l1 && n != 16)) emu_fail("cp.async: bad size");
    if (((unsigned long)dst) % n || ((unsigned long)src) % n) emu_fail("cp.async: misaligned address");
    unsigned char* d = (unsigned char*)dst;
    if (d < emu_smem_ptr || d + n > emu_smem_ptr + emu_dyn_smem) emu_fail("cp.async: destination outside shared memory");
    emu_cp_issue(dst, src, n);
    emu_cp_count++;
}
