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

namespace ukp::platform {

// The index of the first NUL of the n bytes at p, or n; eight bytes at a time.
inline uint64_t find_nul(const char *p, uint64_t n) {
    uint64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        __builtin_memcpy(&w, p + i, 8);
        // A zero byte in w sets the top bit of its byte here; bytes above the first zero
        // may be marked too (the borrow), never one below: the lowest mark is the first.
        const uint64_t zeros = (w - 0x0101010101010101ull) & ~w & 0x8080808080808080ull;
        if (zeros != 0) return i + static_cast<uint64_t>(__builtin_ctzll(zeros)) / 8;
    }
    for (; i < n; ++i)
        if (p[i] == '\0') return i;
    return n;
}

// Copies the NUL-terminated string at src into dst (room for `room` bytes, room >= 1),
// always NUL-terminating dst. Returns the bytes stored including the NUL (the string is
// cut at room - 1 bytes), or -EFAULT when src is unreadable before its end. Reads src a
// page at a time through ukp_safe_copy: a byte past the NUL is only read when it lies in
// a page the string already touched, so no fault is raised that the string itself would
// not raise. No allocation, no system call.
inline int safe_strncpy(char *dst, const char *src, uint32_t room) {
    constexpr uint64_t kPage = 4096;
    uint32_t done = 0;
    while (done + 1 < room) {
        const uint64_t at = reinterpret_cast<uint64_t>(src) + done;
        uint64_t chunk = kPage - (at & (kPage - 1));
        if (chunk > room - 1 - done) chunk = room - 1 - done;
        if (ukp_safe_copy(dst + done, src + done, chunk) != 0) return -14; // -EFAULT
        const uint64_t nul = find_nul(dst + done, chunk);
        if (nul < chunk) return static_cast<int>(done + nul + 1);
        done += static_cast<uint32_t>(chunk);
    }
    dst[done] = '\0';
    return static_cast<int>(done + 1);
}

// If `rip` is one of the fault-safe access instructions, the address to resume at
// (the fixup, which returns -EFAULT); else 0.
uint64_t fixup_for(uint64_t rip);

} // namespace ukp::platform
