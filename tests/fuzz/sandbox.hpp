// Runs a few bytes of machine code in a forked, seccomp-confined child on a given CPU
// state and memory, and reports how it ended: the signal that stopped it (an int3 placed
// where control may go, or a fault), the registers and the memory at that moment.
// Used by relocate_fuzz to run an instruction and its relocated copy side by side.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ukp::fuzz {

constexpr size_t kPageSize = 4096;
constexpr int kMaxPages = 16;

// The registers the child starts with. Layout known to sandbox_enter.S.
struct CpuState {
    uint8_t xmm[16][16]; // xmm0..15 (the rest of the vector/x87 state starts in init state)
    uint64_t rflags;
    uint64_t gpr[16]; // rax rcx rdx rbx rsp rbp rsi rdi r8..r15 (hardware numbering)
    uint64_t rip;
};
static_assert(offsetof(CpuState, rflags) == 256 && offsetof(CpuState, gpr) == 264 && offsetof(CpuState, rip) == 392);

// One page mapped at a fixed address in the child.
struct PageSpec {
    uint64_t addr;
    const uint8_t *content; // kPageSize bytes
    bool exec;              // code: PROT_READ | PROT_EXEC (not writable); else PROT_READ | PROT_WRITE
    bool snapshot;          // reported back in RunResult::mem
};

struct RunSpec {
    PageSpec pages[kMaxPages];
    int npages = 0;
    CpuState cpu{};
};

struct RunResult {
    enum Kind : int {
        kNoReport, // the child ended without reaching the handler (see wait_status)
        kSignal,   // the handler ran: sig, code, addr, regs below
        kTimeout,  // SIGALRM: still running after the time limit
        kSetupFailed,
    };
    int kind = kNoReport;
    int wait_status = 0;
    int sig = 0, code = 0;
    uint64_t addr = 0;       // si_addr
    uint64_t gregs[23] = {}; // mcontext gregs (REG_*)
    uint8_t xmm[16][16] = {};
    uint32_t mxcsr = 0;
    int nsnap = 0;
    uint8_t mem[kMaxPages][kPageSize]; // snapshot pages in RunSpec order
};

// Forks, maps spec's pages, confines the child (seccomp: only exit; a timer), loads
// spec.cpu and jumps to spec.cpu.rip. Fills *out; false if fork/wait failed.
bool run_in_child(const RunSpec &spec, RunResult *out);

} // namespace ukp::fuzz
