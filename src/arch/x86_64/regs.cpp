#include "arch/x86_64/regs.hpp"

#include <cerrno>

namespace ukp::arch {

namespace {

constexpr uint64_t kFlagCF = 1u << 0, kFlagPF = 1u << 2, kFlagZF = 1u << 6, kFlagSF = 1u << 7, kFlagOF = 1u << 11;

// The pt_regs field holding a 64-bit general-purpose register, or null.
unsigned long *gpr(pt_regs *r, ZydisRegister reg) {
    switch (ZydisRegisterGetLargestEnclosing(ZYDIS_MACHINE_MODE_LONG_64, reg)) {
    case ZYDIS_REGISTER_RAX:
        return &r->ax;
    case ZYDIS_REGISTER_RCX:
        return &r->cx;
    case ZYDIS_REGISTER_RDX:
        return &r->dx;
    case ZYDIS_REGISTER_RBX:
        return &r->bx;
    case ZYDIS_REGISTER_RSP:
        return &r->sp;
    case ZYDIS_REGISTER_RBP:
        return &r->bp;
    case ZYDIS_REGISTER_RSI:
        return &r->si;
    case ZYDIS_REGISTER_RDI:
        return &r->di;
    case ZYDIS_REGISTER_R8:
        return &r->r8;
    case ZYDIS_REGISTER_R9:
        return &r->r9;
    case ZYDIS_REGISTER_R10:
        return &r->r10;
    case ZYDIS_REGISTER_R11:
        return &r->r11;
    case ZYDIS_REGISTER_R12:
        return &r->r12;
    case ZYDIS_REGISTER_R13:
        return &r->r13;
    case ZYDIS_REGISTER_R14:
        return &r->r14;
    case ZYDIS_REGISTER_R15:
        return &r->r15;
    default:
        return nullptr;
    }
}

bool condition_holds(ZydisMnemonic m, uint64_t f) {
    const bool cf = f & kFlagCF, pf = f & kFlagPF, zf = f & kFlagZF, sf = f & kFlagSF, of = f & kFlagOF;
    switch (m) {
    case ZYDIS_MNEMONIC_JO:
        return of;
    case ZYDIS_MNEMONIC_JNO:
        return !of;
    case ZYDIS_MNEMONIC_JB:
        return cf;
    case ZYDIS_MNEMONIC_JNB:
        return !cf;
    case ZYDIS_MNEMONIC_JZ:
        return zf;
    case ZYDIS_MNEMONIC_JNZ:
        return !zf;
    case ZYDIS_MNEMONIC_JBE:
        return cf || zf;
    case ZYDIS_MNEMONIC_JNBE:
        return !cf && !zf;
    case ZYDIS_MNEMONIC_JS:
        return sf;
    case ZYDIS_MNEMONIC_JNS:
        return !sf;
    case ZYDIS_MNEMONIC_JP:
        return pf;
    case ZYDIS_MNEMONIC_JNP:
        return !pf;
    case ZYDIS_MNEMONIC_JL:
        return sf != of;
    case ZYDIS_MNEMONIC_JNL:
        return sf == of;
    case ZYDIS_MNEMONIC_JLE:
        return zf || sf != of;
    case ZYDIS_MNEMONIC_JNLE:
        return !zf && sf == of;
    default:
        return false;
    }
}

// Decrements rcx (or ecx with a 0x67 prefix) for loop*, and says whether the branch is taken.
bool count_register_branch(const BranchInsn &insn, pt_regs *r) {
    const bool addr32 = insn.address_width == 32;
    const uint64_t mask = addr32 ? 0xffffffffull : ~0ull;
    const bool zf = r->flags & kFlagZF;
    switch (insn.mnemonic) {
    case ZYDIS_MNEMONIC_JRCXZ:
        return (r->cx & mask) == 0;
    case ZYDIS_MNEMONIC_JECXZ:
        return (r->cx & 0xffffffffull) == 0;
    default:
        break;
    }
    const uint64_t count = (r->cx - 1) & mask;
    // A 32-bit write zero-extends, as the CPU does for loop with a 0x67 prefix.
    r->cx = count;
    switch (insn.mnemonic) {
    case ZYDIS_MNEMONIC_LOOP:
        return count != 0;
    case ZYDIS_MNEMONIC_LOOPE:
        return count != 0 && zf;
    case ZYDIS_MNEMONIC_LOOPNE:
        return count != 0 && !zf;
    default:
        return false;
    }
}

// The value of the r/m operand of an indirect call or jump.
int read_branch_operand(const BranchInsn &insn, const pt_regs *regs, uint64_t *out, uint64_t *fault_addr) {
    pt_regs copy = *regs;
    if (!insn.operand_is_memory) {
        unsigned long *reg = gpr(&copy, insn.reg);
        if (reg == nullptr) return -EFAULT;
        *out = *reg;
        return 0;
    }
    uint64_t ea = static_cast<uint64_t>(insn.disp);
    if (insn.base == ZYDIS_REGISTER_RIP) {
        ea += insn.addr + insn.len;
    } else if (insn.base != ZYDIS_REGISTER_NONE) {
        unsigned long *base = gpr(&copy, insn.base);
        if (base == nullptr) return -EFAULT;
        ea += *base;
    }
    if (insn.index != ZYDIS_REGISTER_NONE) {
        unsigned long *index = gpr(&copy, insn.index);
        if (index == nullptr) return -EFAULT;
        ea += *index * insn.scale;
    }
    if (insn.address_width == 32) ea &= 0xffffffffull;
    *fault_addr = ea;
    if (insn.segment == ZYDIS_REGISTER_FS) return ukp_safe_load_seg64(ea, 0, out);
    if (insn.segment == ZYDIS_REGISTER_GS) return ukp_safe_load_seg64(ea, 1, out);
    return ukp_safe_copy(out, reinterpret_cast<const void *>(ea), sizeof *out);
}

int push_return_address(const BranchInsn &insn, pt_regs *regs, uint64_t *fault_addr) {
    const uint64_t ret = insn.addr + insn.len;
    const uint64_t sp = regs->sp - 8;
    *fault_addr = sp;
    if (ukp_safe_copy(reinterpret_cast<void *>(sp), &ret, sizeof ret) != 0) return -EFAULT;
    regs->sp = sp;
    return 0;
}

} // namespace

void regs_from_context(const ucontext_t *uc, pt_regs *r) {
    const greg_t *g = uc->uc_mcontext.gregs;
    r->r15 = g[REG_R15];
    r->r14 = g[REG_R14];
    r->r13 = g[REG_R13];
    r->r12 = g[REG_R12];
    r->bp = g[REG_RBP];
    r->bx = g[REG_RBX];
    r->r11 = g[REG_R11];
    r->r10 = g[REG_R10];
    r->r9 = g[REG_R9];
    r->r8 = g[REG_R8];
    r->ax = g[REG_RAX];
    r->cx = g[REG_RCX];
    r->dx = g[REG_RDX];
    r->si = g[REG_RSI];
    r->di = g[REG_RDI];
    r->orig_ax = ~0ul;
    r->ip = g[REG_RIP];
    // CSGSFS packs cs (bits 0-15), gs, fs, ss (bits 48-63).
    r->cs = static_cast<uint64_t>(g[REG_CSGSFS]) & 0xffff;
    r->flags = g[REG_EFL];
    r->sp = g[REG_RSP];
    r->ss = (static_cast<uint64_t>(g[REG_CSGSFS]) >> 48) & 0xffff;
}

void regs_to_context(const pt_regs *r, ucontext_t *uc) {
    greg_t *g = uc->uc_mcontext.gregs;
    g[REG_R15] = static_cast<greg_t>(r->r15);
    g[REG_R14] = static_cast<greg_t>(r->r14);
    g[REG_R13] = static_cast<greg_t>(r->r13);
    g[REG_R12] = static_cast<greg_t>(r->r12);
    g[REG_RBP] = static_cast<greg_t>(r->bp);
    g[REG_RBX] = static_cast<greg_t>(r->bx);
    g[REG_R11] = static_cast<greg_t>(r->r11);
    g[REG_R10] = static_cast<greg_t>(r->r10);
    g[REG_R9] = static_cast<greg_t>(r->r9);
    g[REG_R8] = static_cast<greg_t>(r->r8);
    g[REG_RAX] = static_cast<greg_t>(r->ax);
    g[REG_RCX] = static_cast<greg_t>(r->cx);
    g[REG_RDX] = static_cast<greg_t>(r->dx);
    g[REG_RSI] = static_cast<greg_t>(r->si);
    g[REG_RDI] = static_cast<greg_t>(r->di);
    g[REG_RIP] = static_cast<greg_t>(r->ip);
    g[REG_EFL] = static_cast<greg_t>(r->flags);
    g[REG_RSP] = static_cast<greg_t>(r->sp);
}

int trap_number(const ucontext_t *uc) { return static_cast<int>(uc->uc_mcontext.gregs[REG_TRAPNO]); }

uint64_t context_ip(const ucontext_t *uc) { return static_cast<uint64_t>(uc->uc_mcontext.gregs[REG_RIP]); }

void set_context_ip(ucontext_t *uc, uint64_t ip) { uc->uc_mcontext.gregs[REG_RIP] = static_cast<greg_t>(ip); }

void undo_copy_fault(const FaultUndo &u, ucontext_t *uc) {
    // Zydis GPR ids (the encoding order) to the signal context's entries.
    static constexpr int kSlot[16] = {REG_RAX, REG_RCX, REG_RDX, REG_RBX, REG_RSP, REG_RBP, REG_RSI, REG_RDI,
                                      REG_R8,  REG_R9,  REG_R10, REG_R11, REG_R12, REG_R13, REG_R14, REG_R15};
    greg_t *g = uc->uc_mcontext.gregs;
    if (u.saved_reg >= 0 && u.saved_reg < 16 && u.saved_reg != 4)
        g[kSlot[u.saved_reg]] = *reinterpret_cast<const greg_t *>(g[REG_RSP]); // our own push: mapped
    g[REG_RSP] += u.sp_delta;
}

void resume_at_recovery(ucontext_t *uc, const ukp_recovery &rec, int value) {
    greg_t *g = uc->uc_mcontext.gregs;
    g[REG_RBX] = static_cast<greg_t>(rec.rbx);
    g[REG_RBP] = static_cast<greg_t>(rec.rbp);
    g[REG_R12] = static_cast<greg_t>(rec.r12);
    g[REG_R13] = static_cast<greg_t>(rec.r13);
    g[REG_R14] = static_cast<greg_t>(rec.r14);
    g[REG_R15] = static_cast<greg_t>(rec.r15);
    g[REG_RSP] = static_cast<greg_t>(rec.rsp);
    g[REG_RIP] = static_cast<greg_t>(rec.rip);
    g[REG_RAX] = value;
    g[REG_EFL] &= ~static_cast<greg_t>(1u << 10); // DF clear, as the ABI promises at a return
}

BranchInsn summarize(const Insn &insn) {
    BranchInsn b;
    b.addr = insn.addr;
    b.len = insn.len;
    b.flow = insn.flow;
    b.target = insn.target;
    b.mnemonic = insn.zi.mnemonic;
    b.address_width = static_cast<uint8_t>(insn.zi.address_width);
    const ZydisDecodedOperand &op = insn.ops[0];
    if (insn.flow == Flow::kRet && insn.zi.operand_count_visible > 0 && op.type == ZYDIS_OPERAND_TYPE_IMMEDIATE)
        b.ret_pop = static_cast<uint16_t>(op.imm.value.u);
    if (insn.flow == Flow::kIndirectJump || insn.flow == Flow::kIndirectCall) {
        b.operand_is_memory = op.type == ZYDIS_OPERAND_TYPE_MEMORY;
        if (b.operand_is_memory) {
            b.base = op.mem.base;
            b.index = op.mem.index;
            b.scale = op.mem.scale;
            b.disp = op.mem.disp.value;
            b.segment = op.mem.segment;
        } else {
            b.reg = op.reg.value;
        }
    }
    return b;
}

int emulate_branch(const BranchInsn &insn, pt_regs *regs, uint64_t *fault_addr) {
    const uint64_t next = insn.addr + insn.len;
    switch (insn.flow) {
    case Flow::kJump:
        regs->ip = insn.target;
        return 0;
    case Flow::kCondJump: {
        bool taken;
        switch (insn.mnemonic) {
        case ZYDIS_MNEMONIC_LOOP:
        case ZYDIS_MNEMONIC_LOOPE:
        case ZYDIS_MNEMONIC_LOOPNE:
        case ZYDIS_MNEMONIC_JRCXZ:
        case ZYDIS_MNEMONIC_JECXZ:
            taken = count_register_branch(insn, regs);
            break;
        default:
            taken = condition_holds(insn.mnemonic, regs->flags);
            break;
        }
        regs->ip = taken ? insn.target : next;
        return 0;
    }
    case Flow::kCall:
        if (push_return_address(insn, regs, fault_addr) != 0) return -EFAULT;
        regs->ip = insn.target;
        return 0;
    case Flow::kIndirectJump:
    case Flow::kIndirectCall: {
        uint64_t target;
        // The operand is read before the push, as the CPU computes it from the old rsp.
        if (read_branch_operand(insn, regs, &target, fault_addr) != 0) return -EFAULT;
        if (insn.flow == Flow::kIndirectCall && push_return_address(insn, regs, fault_addr) != 0) return -EFAULT;
        regs->ip = target;
        return 0;
    }
    case Flow::kRet: {
        uint64_t target;
        *fault_addr = regs->sp;
        if (ukp_safe_copy(&target, reinterpret_cast<const void *>(regs->sp), sizeof target) != 0) return -EFAULT;
        regs->sp += 8 + insn.ret_pop;
        regs->ip = target;
        return 0;
    }
    default:
        return -EINVAL;
    }
}

} // namespace ukp::arch
