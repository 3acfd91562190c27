// Decoding and relocating single x86-64 instructions (Zydis underneath).
//
// Pure code generation: nothing here touches the process, so everything is tested
// on byte buffers (tests/unit/relocator_test.cpp).
#pragma once

#include <Zydis/Zydis.h>

#include <cstddef>
#include <cstdint>

namespace ukp::arch {

// How control leaves an instruction.
enum class Flow : uint8_t {
    kSequential,   // falls through to addr + len
    kJump,         // jmp rel8/rel32 to target
    kCondJump,     // jcc rel8/rel32, loop/loope/loopne, jrcxz/jecxz: target or fallthrough
    kCall,         // call rel32 to target
    kIndirectJump, // jmp r/m64
    kIndirectCall, // call r/m64
    kRet,          // ret, ret imm16
    kSyscall,      // syscall: sets rcx to addr + len, so a copy must fix rcx afterwards
    kUnsupported,  // cannot run anywhere but at its own address (int3, far transfers, ...)
};

struct Insn {
    uint64_t addr = 0;      // where the instruction lives
    uint8_t len = 0;        // its length in bytes
    uint8_t bytes[15] = {}; // its bytes
    Flow flow = Flow::kSequential;
    uint64_t target = 0;       // kJump, kCondJump, kCall: the absolute branch target
    bool rip_relative = false; // has a [rip + disp32] memory operand (or lea of one)
    uint64_t rip_target = 0;   // the absolute address that operand designates
    ZydisDecodedInstruction zi{};
    ZydisDecodedOperand ops[ZYDIS_MAX_OPERAND_COUNT]{};
};

// Decodes the instruction at `code` (of which `avail` bytes are readable), which lives
// at `addr`. Returns 0, or -EILSEQ if the bytes are not a valid 64-bit instruction (then
// *out may be half written).
int decode(uint64_t addr, const uint8_t *code, size_t avail, Insn *out);

// What a sweep over a whole object needs of an instruction: its length, a relative
// branch's target, and the address a `lea` of [rip + disp] forms. For every instruction,
// len and target equal decode()'s, and lea_target is decode()'s rip_target when it is a
// lea with rip_relative (else 0) (region_test checks libc's and libstdc++'s). relative
// and flow tell a relative branch as decode() does, and jmp a jmp without one (through a
// register or memory, or a far one: only decode() tells which).
struct SweepInsn {
    uint8_t len = 0;
    bool relative = false;         // has a relative immediate: target and flow are set
    bool jmp = false;              // a jmp that is not relative
    Flow flow = Flow::kSequential; // a relative one's: decode()'s (jmp, jcc, call, loop; xbegin unsupported)
    uint64_t target = 0;           // a relative branch's target (jmp, jcc, call, loop, xbegin), else 0
    uint64_t lea_target = 0;       // lea reg, [rip + disp]: rip + disp, else 0
};

// The sweeps over whole functions and objects (ObjectRefs and analyze_function, which at
// the first event over all of libc decode each of its 330,000 instructions twice).
// Zydis's minimal mode (no operands) takes about 60 ns an instruction on the machines
// here, and was two thirds of such a definition. decode() first tries quick(), which
// knows the most frequent instructions of the legacy opcode maps (90 % of libc's) and
// reads them in a few nanoseconds, and leaves everything else to Zydis: VEX and EVEX,
// the SSE opcodes whose meaning a mandatory prefix changes, lock, 0x67, repeated
// prefixes, branch hints, any group member it does not list. region_test compares the
// two at every combination of the prefixes, opcodes, ModRM and SIB forms quick() takes.
class SweepDecoder {
public:
    SweepDecoder();
    // 0, or -EILSEQ as decode().
    int decode(uint64_t addr, const uint8_t *code, size_t avail, SweepInsn *out) const;
    // The same by Zydis alone.
    int by_zydis(uint64_t addr, const uint8_t *code, size_t avail, SweepInsn *out) const;
    // True with *out set when the bytes are an instruction quick() knows; false leaves
    // them to Zydis (they may be valid or not).
    static bool quick(uint64_t addr, const uint8_t *code, size_t avail, SweepInsn *out);

private:
    ZydisDecoder decoder_{};
};

// What the emitted copy does when the instruction falls through (or, for a
// conditional branch, is not taken).
enum class Exit : uint8_t {
    kNone,     // nothing: execution runs into whatever is emitted after the copy
    kJumpBack, // jump to insn.addr + insn.len
    kTrap,     // an int3; *trap_offset tells where it is
};

// A copy that is more than the instruction (a push of the return address before `jmp
// *mem`, a scratch register saved below the red zone before a far [rip] access) has
// changed rsp and maybe a register by the time the memory access faults. For each such
// access: its offset in the copy, the bytes to add to rsp, and the register whose value
// the program had is then at (%rsp) (-1: none). The first instruction never needs one.
struct FaultUndo {
    uint8_t offset = 0;
    uint8_t sp_delta = 0;
    int8_t saved_reg = -1; // a Zydis GPR id (0 rax ... 15 r15)
};
inline constexpr int kMaxFaultUndos = 2;
struct FaultUndos {
    uint8_t count = 0;
    FaultUndo at[kMaxFaultUndos];
    // The undo for a fault at `offset` in the copy, or null (none needed or known).
    const FaultUndo *find(size_t offset) const {
        for (uint8_t i = 0; i < count; ++i)
            if (at[i].offset == offset) return &at[i];
        return nullptr;
    }
};

// Emits into out[0, cap) code that, placed at address `dest`, has exactly the effect
// of the instruction `insn` executed at insn.addr, then leaves as `exit` says. Branch
// targets, return addresses pushed by calls, rcx after syscall and RIP-relative operands
// all refer to the original addresses, at any distance between insn.addr and dest
// (rel32 forms when in reach, absolute forms otherwise). Uses no register, flag or stack
// byte the original does not (the 128-byte red zone below rsp is preserved).
//
// Returns the number of bytes emitted, or
//   -EINVAL    exit == kTrap for an instruction that is not kSequential/kSyscall
//   -ENOSPC    cap too small
//   -EOPNOTSUPP flow == kUnsupported, or a far RIP-relative form that cannot be rewritten
// *trap_offset (if not null) receives the offset of the int3 for Exit::kTrap, else -1.
// *undo (if not null) receives what to undo when an instruction of the copy other than
// its first faults (see FaultUndos).
int relocate(const Insn &insn, uint64_t dest, uint8_t *out, size_t cap, Exit exit, int *trap_offset = nullptr,
             FaultUndos *undo = nullptr);

// The largest relocate() output for one instruction, for sizing buffers.
inline constexpr size_t kMaxRelocatedSize = 64;

// Emits an absolute jump to `target` (14 bytes: jmp *0(%rip); .quad target) or, when
// in reach from `dest`, a 5-byte jmp rel32. Returns the bytes emitted or -ENOSPC.
int emit_jmp(uint64_t dest, uint64_t target, uint8_t *out, size_t cap);

} // namespace ukp::arch
