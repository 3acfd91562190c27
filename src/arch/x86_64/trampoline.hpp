// The code emitted for the exits from out-of-line copies into the agent's trampolines
// (core/trampolines.S, whose addresses the callers give).
#pragma once

#include <cstddef>
#include <cstdint>

namespace ukp::arch {

// Emits, for code placed at `dest`:  lea -128(%rsp),%rsp ; push <context> ;
// jmp ukp_post_trampoline — the tail of a copy whose post_handlers run in user mode.
// Returns the bytes emitted or -ENOSPC.
int emit_post_exit(uint64_t dest, uint64_t context, uint64_t trampoline, uint8_t *out, size_t cap);

// A kretprobe instance's return stub, kRetStubSize bytes at `dest`:
//     lea 8(%rsp),%rsp ; call *-24(%rsp) ;
//     push literal(%rip) ; jmp *trampoline(%rip) ; int3 ... ;
//     .quad literal (at +48) ; .quad ukp_kretprobe_trampoline (at +56)
// Two ways in. A hijacked return address is dest + kRetStubEntry, the return site of the
// call, so that the byte before it, where unwinders look up a return address's frame, is
// part of the stub. A kretprobe's own detour (detour.hpp) instead jumps to dest +
// kRetStubCall with the return address still in place and the region copy's address 16
// bytes below it: the stub drops the return address (the instance has it) and calls the
// region copy, which pushes the entry in its place; the probed function's `ret` then goes
// where the CPU's return stack predicts. From dest + kRetStubPushed on, the literal is on
// the stack (the CFI's frame is 8 bytes larger), and so is the return address before
// dest + kRetStubCalling.
inline constexpr size_t kRetStubSize = 64;
inline constexpr size_t kRetStubCall = 0;
inline constexpr size_t kRetStubCalling = 5;
inline constexpr size_t kRetStubEntry = 9;
inline constexpr size_t kRetStubPushed = 15;
void emit_ret_stub(uint64_t literal, uint64_t trampoline, uint8_t *out);

} // namespace ukp::arch
