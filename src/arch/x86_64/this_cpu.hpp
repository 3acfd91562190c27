// The CPU the calling thread runs on, as sched_getcpu() gives it, for code on the
// probe-hit path that must be proven to leave the vector state alone (vector_use.hpp):
// sched_getcpu is a call into the C library through the PLT, which that proof cannot
// follow. Read here as glibc reads it, from the thread's rseq area (the kernel keeps
// cpu_id current); where glibc registered none (glibc.pthread.rseq=0, or another
// library's rseq came first), from sched_getcpu itself, with the state saved around it.
#pragma once

#include "arch/x86_64/trampoline.hpp"

#include <sched.h>
#include <sys/rseq.h>

namespace ukp::arch {

inline int this_cpu() noexcept {
    if (__rseq_size != 0) {
        const auto *rs = reinterpret_cast<const volatile struct rseq *>(
            static_cast<char *>(__builtin_thread_pointer()) + __rseq_offset);
        const auto cpu = static_cast<int32_t>(rs->cpu_id);
        if (cpu >= 0) return cpu;
    }
    int cpu = -1;
    saving_vectors([&] { cpu = sched_getcpu(); });
    return cpu;
}

} // namespace ukp::arch
