// Fault-safe memory access and recovery points (safe_access.S).
#pragma once

#include <cstddef>
#include <cstdint>

extern "C" {
// Copies n bytes; 0, or -EFAULT if either side faults (the copy may be partial then).
int ukp_safe_copy(void *dst, const void *src, size_t n);
// Reads 8 bytes at fs:offset (seg 0) or gs:offset (seg 1); 0 or -EFAULT.
int ukp_safe_load_seg64(uint64_t offset, int seg, uint64_t *out);

// Callee-saved state of a recovery point; field order is used by safe_access.S.
struct ukp_recovery {
    uint64_t rbx, rbp, r12, r13, r14, r15;
    uint64_t rsp; // stack pointer after ukp_recovery_save returns
    uint64_t rip; // its return address
};
__attribute__((returns_twice)) int ukp_recovery_save(struct ukp_recovery *r);
}

namespace ukp::arch {

// If `rip` is one of the fault-safe access instructions, the address to resume at
// (the fixup, which returns -EFAULT); else 0.
uint64_t fixup_for(uint64_t rip);

} // namespace ukp::arch
