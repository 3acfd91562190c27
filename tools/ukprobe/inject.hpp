// Loading the agent into a running process with ptrace (`ukprobe attach`).
#pragma once

#include <string>
#include <vector>

namespace ukprobe {

struct InjectResult {
    int tid = 0;                 // the thread that ran the calls
    double pause_ms = 0;         // that thread's stop: from PTRACE_INTERRUPT to PTRACE_DETACH
    double stopped_ms = 0;       // of which stopped (from its stop to PTRACE_DETACH)
    double calls_ms = 0;         // of which running mmap, mprotect and pthread_create in it
    double ready_ms = 0;         // from PTRACE_INTERRUPT until the loader thread was done
    bool was_in_syscall = false; // it was blocked in a system call (restarted after)
    int interrupts = 0;          // threads interrupted to find it, it included
    int steps = 0;               // instructions it was stepped through out of the C library
};

// Loads `agent` (an absolute path) into process `pid` with dlopen(RTLD_NOW) and calls its
// ukp_control_start(), both on a new thread of the process (the loader), which removes
// its own code pages when done. The thread interrupted to create the loader is stopped
// only for mmap, mprotect and pthread_create; its registers, vector state and the
// stack bytes used are restored exactly. Throws
// std::runtime_error with the cause (a refusal names the policy and what to do).
InjectResult inject_agent(int pid, const std::string &agent);

// A thread of the process that blocked signals the agent lives on.
struct UnblockedThread {
    int tid = 0;
    uint64_t signals = 0; // the bits (1 << (sig - 1)) it blocked among them
    std::string error;    // empty if they were taken out of its mask
};

// Takes SIGTRAP, SIGSEGV, SIGBUS, SIGFPE and SIGILL out of the mask of every thread of
// `pid` that blocks them (read from /proc/PID/task/TID/status; only those threads are
// stopped, by PTRACE_SEIZE and PTRACE_INTERRUPT, for PTRACE_GETSIGMASK/SETSIGMASK). On a
// thread that blocks SIGTRAP a breakpoint hit is fatal: the kernel resets the action to
// the default and kills the process. The agent keeps them out of masks set after it is
// loaded where it can (docs/reference.md); threads that blocked them before an attach
// are these.
std::vector<UnblockedThread> unblock_agent_signals(int pid);

} // namespace ukprobe
