// Detours of optimized probes: where the 5-byte `jmp rel32` that replaces a probed
// region (the DCR) leads.
//
//     lea -128(%rsp),%rsp          step over the program's red zone (flags untouched)
//     push context(%rip)           the probe point, for the dispatcher
//     call ukp_optprobe_trampoline saves pt_regs, calls ukp_optprobe_dispatch, resumes
//                                  with the registers as the handlers left them: returns
//                                  here when they left sp and ip alone, else goes to regs->ip
//     lea 136(%rsp),%rsp           back over the context and the red zone
//   copy:
//     <the DCR's instructions, relocated>
//     jmp addr + dcr_len
//   context: .quad <context>
//            .quad ukp_optprobe_trampoline, when out of rel32 reach (call *literal(%rip))
//
// A point whose one probe is a kretprobe is entered by a second, shorter detour instead
// (emit_kret_detour): the same first three instructions calling ukp_kret_entry_trampoline,
// then `lea 136(%rsp),%rsp ; jmp *-8(%rsp)`, to where the trampoline chose: the first
// detour's copy, or the return stub of the instance it took (trampoline.hpp), which calls
// that copy so that the function's own `ret` is predicted.
//
// The dispatcher resumes at `copy` (or wherever a handler sent the thread). The copy is
// also what the breakpoint path runs once a detour exists, and where a thread found inside
// the DCR is moved to: each DCR instruction's copy starts at a known offset.
//
// Pure code generation, tested on byte buffers.
#pragma once

#include "arch/x86_64/insn.hpp"

#include <cstddef>
#include <cstdint>

extern "C" {
// trampolines.S: called with the context pushed below the red zone.
void ukp_optprobe_trampoline();
// The same for a kretprobe's point (emit_kret_detour): does the kretprobe's entry with a
// few registers saved, and leaves anything else to ukp_optprobe_trampoline.
void ukp_kret_entry_trampoline();
// Inside it: where a fault in a pre_handler its fast case called resumes, with rsp at the
// frame the fast case recorded (ThreadState::fast_frame).
void ukp_optprobe_fast_recovery();
}

namespace ukp::arch {

// At most this many instructions in a DCR (each is >= 1 byte; 5 bytes are covered).
inline constexpr size_t kMaxDcrInsns = 5;

// Where the parts of an emitted detour are, as offsets from its start.
struct DetourLayout {
    uint16_t size = 0;                       // bytes emitted
    uint16_t copy = 0;                       // the region copy
    uint8_t count = 0;                       // instructions in the DCR
    uint8_t dcr_len = 0;                     // bytes the DCR covers at the probe address
    uint8_t orig_offset[kMaxDcrInsns] = {};  // each instruction's offset in the DCR
    uint16_t copy_offset[kMaxDcrInsns] = {}; // where its copy starts in the region copy
    FaultUndos undo[kMaxDcrInsns];           // faults past the first instruction of each copy
};

// Emits the detour for the DCR `dcr[0..n)` (consecutive instructions, dcr[0].addr the
// probe address) into out[0, cap), to run at address `dest`; `context` is the word the
// trampoline hands to the dispatcher. Returns 0 and fills *layout, or
//   -EINVAL    n is 0 or above kMaxDcrInsns, or the instructions are not consecutive
//   -ENOSPC    cap too small
//   -EOPNOTSUPP an instruction cannot be relocated
int emit_detour(uint64_t dest, uint64_t context, const Insn *dcr, size_t n, uint8_t *out, size_t cap,
                DetourLayout *layout);

// Emits into out[0, cap), to run at `dest`, the detour of a point whose one probe is a
// kretprobe: it calls ukp_kret_entry_trampoline with `context`, then jumps to the address
// the trampoline left 8 bytes below the program's stack pointer. Returns the bytes
// emitted, or -ENOSPC; *back (if given): the offset of the call's return site, where
// the trampolines return to.
int emit_kret_detour(uint64_t dest, uint64_t context, uint8_t *out, size_t cap, size_t *back = nullptr);

// The address in the detour at `dest` where execution that reached `orig` (the start of a
// DCR instruction, probe address included) goes on; 0 if orig starts no DCR instruction.
uint64_t detour_copy_of(const DetourLayout &layout, uint64_t dest, uint64_t probe_addr, uint64_t orig);

// The original address of the DCR instruction whose copy starts at `copy_addr`; 0 if none.
uint64_t detour_orig_of(const DetourLayout &layout, uint64_t dest, uint64_t probe_addr, uint64_t copy_addr);

// A fault at `ip` past the first instruction of a DCR instruction's copy in the region copy
// (the access of a far [rip] form, after the copy saved a scratch register below the red zone):
// what puts the program's rsp and registers back (undo_copy_fault), or null when nothing needs
// to. *orig receives the original address of that DCR instruction when ip is where its copy
// starts or an undo applies (the program's registers are then those at it), else 0.
const FaultUndo *detour_fault_undo(const DetourLayout &layout, uint64_t dest, uint64_t probe_addr, uint64_t ip,
                                   uint64_t *orig);

// The 5 bytes of `jmp rel32` at `from` to `to`; false if out of rel32 reach.
bool encode_jmp_rel32(uint64_t from, uint64_t to, uint8_t out[5]);

} // namespace ukp::arch
