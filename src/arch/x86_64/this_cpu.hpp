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

// Adds 1 to the shard of the CPU the thread runs on: the 8-byte counter at
// shards + (cpu % kShards) * kStride. An rseq critical section instead of a locked add
// (about 2.4 ns here): the kernel restarts it at its abort handler if the thread is
// preempted, migrated or signalled between reading cpu_id and the add, so the add is a
// plain one on a line no other CPU writes. The critical section descriptor goes in the
// thread's rseq area for the sequence only; what was there (a program's own, were a
// probe inside its critical section) is put back. Without an rseq area, a locked add.
template <unsigned kShards, unsigned kStride>
inline void count_on_this_cpu(void *shards) noexcept {
    static_assert((kShards & (kShards - 1)) == 0 && (kStride & (kStride - 1)) == 0 && kStride >= 8);
    if (__rseq_size == 0) {
        __atomic_fetch_add(static_cast<uint64_t *>(shards), 1, __ATOMIC_RELAXED);
        return;
    }
    auto *rs = static_cast<char *>(__builtin_thread_pointer()) + __rseq_offset;
    uint64_t old = 0, tmp = 0;
    asm volatile(
        // struct rseq_cs: version, flags, start_ip, post_commit_offset, abort_ip
        ".pushsection __rseq_cs, \"aw\"\n"
        ".balign 32\n"
        "77:\n"
        ".long 0, 0\n"
        ".quad 1f, 2f - 1f, 4f\n"
        ".popsection\n"
        "mov 8(%[rs]), %[old]\n" // rseq->rseq_cs
        "3:\n"
        "lea 77b(%%rip), %[tmp]\n"
        "mov %[tmp], 8(%[rs])\n"
        "1:\n"
        "movslq 4(%[rs]), %[tmp]\n" // rseq->cpu_id
        "test %[tmp], %[tmp]\n"
        "js 5f\n"
        "and %[mask], %[tmp]\n"
        "shl %[shift], %[tmp]\n"
        "addq $1, (%[base], %[tmp])\n"
        "2:\n"
        "mov %[old], 8(%[rs])\n"
        "jmp 6f\n"
        "5:\n" // this thread has no rseq area (its registration failed)
        "mov %[old], 8(%[rs])\n"
        "lock addq $1, (%[base])\n"
        "jmp 6f\n"
        // The abort handler, after the signature glibc registered (RSEQ_SIG), inside a
        // ud1 as the kernel's selftests lay it out
        ".pushsection __rseq_failure, \"ax\"\n"
        ".byte 0x0f, 0xb9, 0x3d\n"
        ".long 0x53053053\n"
        "4:\n"
        "jmp 3b\n"
        ".popsection\n"
        "6:\n"
        : [old] "=&r"(old), [tmp] "=&r"(tmp)
        : [rs] "r"(rs), [base] "r"(shards), [mask] "i"(kShards - 1), [shift] "i"(__builtin_ctz(kStride))
        : "memory", "cc");
}

} // namespace ukp::arch
