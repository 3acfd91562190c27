// The entry points of trampolines.S, the core's assembly (docs/architecture.md, "A probe
// hit").
#pragma once

#include <cstdint>

extern "C" {
// Saves a pt_regs, calls ukp_post_dispatch(point, regs), resumes.
void ukp_post_trampoline();
extern char ukp_post_trampoline_end[]; // where its code ends
// Where a kretprobe instance's stub goes when its function returns.
void ukp_kretprobe_trampoline();
// fn(arg) run with %rsp at stack_top (16-byte aligned).
void ukp_call_on_stack(void (*fn)(void *), void *arg, void *stack_top);
// Returns fn(a, b). The jump path's dispatcher makes every indirect call through it (see
// hit.cpp's outside_gpr).
int ukp_call_handler(void *fn, void *a, void *b);
// Set (hit.cpp) when the optprobe and the kretprobe trampolines may call their
// dispatchers without saving the vector state; read by the trampolines.
extern uint8_t ukp_lean_jump_path;
extern uint8_t ukp_lean_return_path;
}
