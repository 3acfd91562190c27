// The CPU the calling thread runs on, as sched_getcpu() gives it, for code on the
// hit path that must be lean (vector_use.hpp): sched_getcpu is a call into the C
// library through the PLT, which the scan cannot follow. Read here as glibc reads it,
// from the thread's rseq area (the kernel keeps cpu_id current); where glibc registered
// none (glibc.pthread.rseq=0, or another library's rseq came first), from sched_getcpu
// itself, with the state saved around it.
#pragma once

#include "platform/vector_state.hpp"

#include <sched.h>
#include <sys/rseq.h>

namespace ukp::platform {

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

// Whether a debugger single-steps the thread (gdb's `stepi`, software watchpoints): the
// trap flag is set. The vDSO's clock_gettime then never returns under kvm-clock (its
// retry loop takes longer than a clock update when each instruction is a trap), so the
// hit path leaves the clock alone while it is.
inline bool single_stepped() noexcept {
    uint64_t flags;
    asm volatile("pushfq\n"
                 "popq %0"
                 : "=r"(flags));
    return (flags & 0x100) != 0;
}

// Adds 1 to the counter of the CPU the thread runs on: the 8-byte counter at
// shards + cpu * kStride for cpu < kShards - 1, a plain add in an rseq critical section
// instead of a locked add (several times dearer). The kernel sends the thread to the abort
// handler if it is preempted, migrated or signalled between reading cpu_id and the add,
// so the plain add lands on a line no other CPU writes. Everything else is a locked add
// on the last counter, the shared one: CPUs from kShards - 1 on, a thread without an rseq
// area, and an aborted section, which is not tried again (retrying would never end
// under a debugger's single steps, each of which aborts the section). The critical
// section descriptor goes in the thread's rseq area for the sequence only; what was
// there (a program's own, were a probe inside its critical section) is put back.
template <unsigned kShards, unsigned kStride>
inline void count_on_this_cpu(void *shards) noexcept {
    static_assert(kShards >= 2 && (kStride & (kStride - 1)) == 0 && kStride >= 8);
    constexpr unsigned long kShared = (kShards - 1) * kStride;
    if (__rseq_size == 0) {
        __atomic_fetch_add(reinterpret_cast<uint64_t *>(static_cast<char *>(shards) + kShared), 1, __ATOMIC_RELAXED);
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
        "lea 77b(%%rip), %[tmp]\n"
        "mov %[tmp], 8(%[rs])\n"
        "1:\n"
        "movslq 4(%[rs]), %[tmp]\n" // rseq->cpu_id; negative when unregistered
        "cmp %[last], %[tmp]\n"
        "jae 5f\n"
        "shl %[shift], %[tmp]\n"
        "addq $1, (%[base], %[tmp])\n"
        "2:\n"
        "mov %[old], 8(%[rs])\n"
        "jmp 6f\n"
        // The abort handler, after the signature glibc registered (RSEQ_SIG), inside a
        // ud1 as the kernel's selftests lay it out. The add was not done.
        ".pushsection __rseq_failure, \"ax\"\n"
        ".byte 0x0f, 0xb9, 0x3d\n"
        ".long 0x53053053\n"
        "4:\n"
        "jmp 5f\n"
        ".popsection\n"
        "5:\n"
        "mov %[old], 8(%[rs])\n"
        "lock addq $1, %c[shared](%[base])\n"
        "6:\n"
        : [old] "=&r"(old), [tmp] "=&r"(tmp)
        : [rs] "r"(rs), [base] "r"(shards), [last] "i"(kShards - 1), [shift] "i"(__builtin_ctz(kStride)),
          [shared] "i"(kShared)
        : "memory", "cc");
}

} // namespace ukp::platform
