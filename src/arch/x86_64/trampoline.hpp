// Exits from out-of-line copies into the agent's trampolines.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

extern "C" {
// trampolines.S: saves a pt_regs, calls ukp_post_dispatch(point, regs), resumes.
void ukp_post_trampoline();
extern char ukp_post_trampoline_end[]; // where its code ends
// trampolines.S: where a kretprobe instance's stub goes when its function returns.
void ukp_kretprobe_trampoline();
// trampolines.S: fn(arg) run with %rsp at stack_top (16-byte aligned).
void ukp_call_on_stack(void (*fn)(void *), void *arg, void *stack_top);
// trampolines.S: returns fn(a, b). The jump path's dispatcher makes every indirect call
// through it (see hit.cpp's outside_gpr).
int ukp_call_handler(void *fn, void *a, void *b);
// trampolines.S: fn(arg) with the vector state saved around it.
void ukp_call_saving_vectors(void (*fn)(void *), void *arg);
// Set (hit.cpp) when the optprobe and the kretprobe trampolines may call their
// dispatchers without saving that state; read by the trampolines.
extern uint8_t ukp_gpr_dispatch;
extern uint8_t ukp_gpr_ret_dispatch;
}

namespace ukp::arch {

// Calls the closure its argument points to: how a lambda goes through the call helpers.
template <typename Closure>
void closure_thunk(void *c) {
    (*static_cast<Closure *>(c))();
}

// Runs f() with the vector state saved around it, through ukp_call_saving_vectors: how
// lean code (vector_use.hpp) makes its rare calls into code that is not lean (the C
// library), without the scan that proves it lean following into them.
template <typename F>
void saving_vectors(F &&f) {
    ukp_call_saving_vectors(closure_thunk<std::remove_reference_t<F>>, &f);
}

// Emits, for code placed at `dest`:  lea -128(%rsp),%rsp ; push <context> ;
// jmp ukp_post_trampoline — the tail of a copy whose post_handlers run in user mode.
// Returns the bytes emitted or -ENOSPC.
int emit_post_exit(uint64_t dest, uint64_t context, uint8_t *out, size_t cap);

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
void emit_ret_stub(uint64_t literal, uint8_t *out);

} // namespace ukp::arch
