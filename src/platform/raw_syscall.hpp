// System calls made straight, not through the C library's wrappers: the agent's own calls
// must not hit a probe a user placed on getpid, gettid, prctl, mmap or syscall itself.
#pragma once

namespace ukp::platform {

// The kernel's return: a negative errno on failure.
inline long raw_syscall(long nr, long a1 = 0, long a2 = 0, long a3 = 0, long a4 = 0, long a5 = 0,
                        long a6 = 0) noexcept {
    long ret;
    register long r10 asm("r10") = a4;
    register long r8 asm("r8") = a5;
    register long r9 asm("r9") = a6;
    asm volatile("syscall"
                 : "=a"(ret)
                 : "a"(nr), "D"(a1), "S"(a2), "d"(a3), "r"(r10), "r"(r8), "r"(r9)
                 : "rcx", "r11", "memory");
    return ret;
}

} // namespace ukp::platform
