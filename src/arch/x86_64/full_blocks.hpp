// glibc's full blocks: the places where its own code blocks (almost) every signal with a
// raw rt_sigprocmask system call, past any interposed sigprocmask.
//
// glibc 2.36 does so in pthread_create (around clone: the new thread starts with that
// mask and runs __ctype_init under it before it restores the parent's), at a thread's
// exit (everything after the block: getpagesize, madvise, the freeing of cached stacks,
// __nptl_death_event), in pthread_kill (its getpid) and around the child of posix_spawn.
// The set is either a constant in memory whose address a rip-relative `lea` hands to the
// kernel, or an immediate stored into a sigset_t just before:
//
//     lea  SIGALL(%rip), %rsi            movabs $0xfffffffeffffffff, %rax
//     xor  %edi, %edi                    mov    %rax, 0x8f0(%rbx)
//     mov  $0xe, %eax                    lea    0x8f0(%rbx), %rsi
//     syscall                            mov    $0xe, %eax ; syscall
//
// Pure analysis, as reach.hpp: code and data come through callbacks.
#pragma once

#include "arch/x86_64/reach.hpp"

#include <cstdint>
#include <vector>

namespace ukp::arch {

struct FullBlock {
    enum class Kind : uint8_t {
        kSetInMemory, // lea SET(%rip), %rsi: patch_at is the lea's disp32
        kImmediate,   // movabs $IMM, %reg stored to the set: patch_at is the imm64
    };
    Kind kind = Kind::kSetInMemory;
    uint64_t syscall_at = 0; // the syscall instruction
    uint64_t patch_at = 0;   // the field to change (disp32 or imm64)
    uint64_t set = 0;        // kSetInMemory: the set's address; kImmediate: the immediate
};

// The full blocks among the instructions of `code`: an rt_sigprocmask with SIG_BLOCK or
// SIG_SETMASK whose set has every bit of `required` and at most 8 of 64 bits clear, all
// of it set up between the syscall and the previous branch or call.
std::vector<FullBlock> find_full_blocks(const Reach &code, uint64_t required, const ReadFn &read_code,
                                        const ReadFn &read_data);

// Where the lea of a kSetInMemory block can be led by changing the high byte of its disp32
// alone (one byte: a thread running the lea meanwhile takes the old target or the new,
// never a mix): the old target plus a non-zero multiple of 16 MiB that keeps the disp32
// in range, nearest first, with the byte to write at patch_at + 3.
struct Retarget {
    uint64_t target = 0;
    uint8_t high_byte = 0;
};
std::vector<Retarget> one_byte_retargets(const FullBlock &block);

} // namespace ukp::arch
