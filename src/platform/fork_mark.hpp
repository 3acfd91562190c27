// Whether this process is one the agent set up: the process that loaded it, or a child of
// fork() whose handlers ran (pthread_atfork). A child made without them, by `_Fork()`,
// `syscall(SYS_fork)` or clone() without CLONE_VM, shares the agent's shared memory with
// its parent (the trace ring, kprobe_profile's counters) but not its handlers: what it
// wrote there, the parent's buffers at the same time as the parent, corrupted them (a
// parent's writer then spun in a buffer whose tail had passed its head). The tracer leaves
// such a child's hits alone.
//
// The mark is a page of its own that the kernel hands a child zeroed (MADV_WIPEONFORK,
// Linux 4.14): telling needs no system call, one load on the hit path. Where the kernel
// refuses the advice the mark stays set in every child, as before.
#pragma once

#include <atomic>
#include <cstdint>

namespace ukp::platform {

struct alignas(4096) ForkMark {
    std::atomic<uint8_t> known;   // 1 here, 0 in a child whose fork() ran no handler
    std::atomic<uint8_t> renewed; // such a child: its fork() gates were made anew (core/fork.cpp)
    uint8_t rest[4094];
};
extern ForkMark g_fork_mark;

inline bool process_known() { return g_fork_mark.known.load(std::memory_order_relaxed) != 0; }

// Whether the kernel took the advice: a child forked without the handlers finds the mark
// clear. For tests and diagnostics.
bool fork_mark_wiped_in_children();

} // namespace ukp::platform
