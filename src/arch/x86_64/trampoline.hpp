// Exits from out-of-line copies into the agent's trampolines.
#pragma once

#include <cstddef>
#include <cstdint>

extern "C" {
// post_trampoline.S: saves a pt_regs, calls ukp_post_dispatch(point, regs), resumes.
void ukp_post_trampoline();
}

namespace ukp::arch {

// Emits, for code placed at `dest`:  lea -128(%rsp),%rsp ; push <context> ;
// jmp ukp_post_trampoline — the tail of a copy whose post_handlers run in user mode.
// Returns the bytes emitted or -ENOSPC.
int emit_post_exit(uint64_t dest, uint64_t context, uint8_t *out, size_t cap);

} // namespace ukp::arch
