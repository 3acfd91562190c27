// pt_regs and signal contexts; emulation of branches on pt_regs.
#pragma once

#include <ukprobes/kprobes.h>

#include "arch/x86_64/insn.hpp"
#include "platform/safe_access.hpp"

#include <ucontext.h>

namespace ukp::arch {

// The signal context's registers as a kernel-layout pt_regs (orig_ax = -1).
void regs_from_context(const ucontext_t *uc, pt_regs *regs);
// Writes every register of regs back into the signal context, so that sigreturn
// resumes with them. cs and ss are left as they are.
void regs_to_context(const pt_regs *regs, ucontext_t *uc);

// The x86 trap number of a fault (14 page fault, 13 general protection, ...).
int trap_number(const ucontext_t *uc);
// The instruction pointer and stack pointer of a signal context.
uint64_t context_ip(const ucontext_t *uc);
void set_context_ip(ucontext_t *uc, uint64_t ip);

// A fault inside an out-of-line copy or a region copy at an access described by `u`: puts
// rsp and the saved register back as the program had them before the original instruction
// (rip is the caller's to set).
void undo_copy_fault(const FaultUndo &u, ucontext_t *uc);

// Makes sigreturn from this context resume where `r` was saved, with
// ukp_recovery_save() returning `value`.
void resume_at_recovery(ucontext_t *uc, const ukp_recovery &r, int value);

// What emulate_branch() needs of an instruction: kept per probe point instead of the
// whole decoded instruction (which is 1.2 KB with its operands).
struct BranchInsn {
    uint64_t addr = 0;
    uint64_t target = 0;  // kJump, kCondJump, kCall
    int64_t disp = 0;     // indirect memory operand's displacement
    uint16_t ret_pop = 0; // ret imm16
    uint8_t len = 0;
    uint8_t address_width = 64; // 32 with a 0x67 prefix (loop/jrcxz count, effective address)
    uint8_t scale = 0;
    bool operand_is_memory = false;
    Flow flow = Flow::kSequential;
    ZydisMnemonic mnemonic = ZYDIS_MNEMONIC_INVALID;
    ZydisRegister reg = ZYDIS_REGISTER_NONE; // `jmp *%reg`, or else the memory operand's:
    ZydisRegister base = ZYDIS_REGISTER_NONE;
    ZydisRegister index = ZYDIS_REGISTER_NONE;
    ZydisRegister segment = ZYDIS_REGISTER_NONE;
};
BranchInsn summarize(const Insn &insn);

// Performs a branch instruction (any flow but kSequential/kSyscall/kUnsupported) on
// regs: updates ip, sp, rcx and the stack as the CPU would, using fault-safe accesses.
// Returns 0, or -EFAULT with regs and memory unchanged if a stack or operand access
// would fault. regs->ip is ignored on entry (insn.addr is where the branch is).
// *fault_addr receives the address whose access faulted.
int emulate_branch(const BranchInsn &insn, pt_regs *regs, uint64_t *fault_addr);

} // namespace ukp::arch
