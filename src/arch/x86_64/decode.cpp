// decode(): Zydis decoding plus the classification relocate() works from.
#include "arch/x86_64/insn.hpp"

#include <cerrno>
#include <cstring>

namespace ukp::arch {
namespace {

// jcc rel8/rel32: the condition lives in the low nibble of the opcode (7x / 0F 8x).
bool is_jcc(ZydisMnemonic m) {
    switch (m) {
    case ZYDIS_MNEMONIC_JO:
    case ZYDIS_MNEMONIC_JNO:
    case ZYDIS_MNEMONIC_JB:
    case ZYDIS_MNEMONIC_JNB:
    case ZYDIS_MNEMONIC_JZ:
    case ZYDIS_MNEMONIC_JNZ:
    case ZYDIS_MNEMONIC_JBE:
    case ZYDIS_MNEMONIC_JNBE:
    case ZYDIS_MNEMONIC_JS:
    case ZYDIS_MNEMONIC_JNS:
    case ZYDIS_MNEMONIC_JP:
    case ZYDIS_MNEMONIC_JNP:
    case ZYDIS_MNEMONIC_JL:
    case ZYDIS_MNEMONIC_JNL:
    case ZYDIS_MNEMONIC_JLE:
    case ZYDIS_MNEMONIC_JNLE:
        return true;
    default:
        return false;
    }
}

// The rel8-only conditional branches that test rcx/ecx.
bool is_loop_or_jrcxz(ZydisMnemonic m) {
    switch (m) {
    case ZYDIS_MNEMONIC_LOOP:
    case ZYDIS_MNEMONIC_LOOPE:
    case ZYDIS_MNEMONIC_LOOPNE:
    case ZYDIS_MNEMONIC_JRCXZ:
    case ZYDIS_MNEMONIC_JECXZ:
        return true;
    default:
        return false;
    }
}

bool is_ip_register(ZydisRegister r) {
    return r == ZYDIS_REGISTER_RIP || r == ZYDIS_REGISTER_EIP || r == ZYDIS_REGISTER_IP;
}

// Index of the relative immediate operand (branch displacement), or -1.
int relative_operand(const Insn &in) {
    for (int i = 0; i < in.zi.operand_count; ++i) {
        if (in.ops[i].type == ZYDIS_OPERAND_TYPE_IMMEDIATE && in.ops[i].imm.is_relative) {
            return i;
        }
    }
    return -1;
}

// Reads or writes the instruction pointer as an operand (hidden ones included).
bool touches_ip(const Insn &in) {
    for (int i = 0; i < in.zi.operand_count; ++i) {
        if (in.ops[i].type == ZYDIS_OPERAND_TYPE_REGISTER && is_ip_register(in.ops[i].reg.value)) {
            return true;
        }
    }
    return false;
}

bool has_prefix(const ZydisDecodedInstruction &zi, uint8_t byte) {
    for (ZyanU8 i = 0; i < zi.raw.prefix_count; ++i)
        if (zi.raw.prefixes[i].value == byte) return true;
    return false;
}

Flow classify(const Insn &in, int rel) {
    const ZydisDecodedInstruction &zi = in.zi;
    // Far transfers reload cs: nothing we can emulate from user space. An operand-size
    // prefix (0x66) on a near branch is ignored by Intel's CPUs in 64-bit mode and honoured
    // by AMD's (a 16-bit target, a 2-byte return address, a rel16 that changes the
    // instruction's length): what a copy would do depends on the CPU.
    const bool far = zi.meta.branch_type == ZYDIS_BRANCH_TYPE_FAR;
    const bool cpu_dependent = far || has_prefix(zi, 0x66);
    switch (zi.mnemonic) {
    case ZYDIS_MNEMONIC_JMP:
        if (cpu_dependent) return Flow::kUnsupported;
        return rel >= 0 ? Flow::kJump : Flow::kIndirectJump;
    case ZYDIS_MNEMONIC_CALL:
        if (cpu_dependent) return Flow::kUnsupported;
        return rel >= 0 ? Flow::kCall : Flow::kIndirectCall;
    case ZYDIS_MNEMONIC_RET:
        return cpu_dependent ? Flow::kUnsupported : Flow::kRet;
    case ZYDIS_MNEMONIC_SYSCALL:
        return Flow::kSyscall;
    case ZYDIS_MNEMONIC_INT:
        // int $3 (cd 03) raises the same SIGTRAP as int3: a copy would pass for a probe hit.
        if (zi.raw.imm[0].value.u == 3) return Flow::kUnsupported;
        // int n returns to the next instruction, which in a copy is the copy's exit.
        return Flow::kSequential;
    default:
        break;
    }
    if ((is_jcc(zi.mnemonic) || is_loop_or_jrcxz(zi.mnemonic)) && rel >= 0) {
        return cpu_dependent ? Flow::kUnsupported : Flow::kCondJump;
    }
    // Anything else with a relative operand (xbegin) or that reads/writes rip
    // (int3, int1, sysenter, iret, sysret, uiret, ...) only works at its own address.
    if (rel >= 0 || touches_ip(in)) return Flow::kUnsupported;
    return Flow::kSequential;
}

// classify()'s answer for an instruction with a relative immediate, from what a minimal
// decode gives (no operands): such a branch is never a far one.
Flow relative_flow(const ZydisDecodedInstruction &zi) {
    if (has_prefix(zi, 0x66)) return Flow::kUnsupported;
    if (zi.mnemonic == ZYDIS_MNEMONIC_JMP) return Flow::kJump;
    if (zi.mnemonic == ZYDIS_MNEMONIC_CALL) return Flow::kCall;
    if (is_jcc(zi.mnemonic) || is_loop_or_jrcxz(zi.mnemonic)) return Flow::kCondJump;
    return Flow::kUnsupported; // xbegin
}

} // namespace

int decode(uint64_t addr, const uint8_t *code, size_t avail, Insn *out) {
    if (code == nullptr || out == nullptr || avail == 0) return -EILSEQ;
    ZydisDecoder decoder;
    if (!ZYAN_SUCCESS(ZydisDecoderInit(&decoder, ZYDIS_MACHINE_MODE_LONG_64, ZYDIS_STACK_WIDTH_64))) {
        return -EILSEQ;
    }
    Insn in;
    const size_t n = avail < sizeof(in.bytes) ? avail : sizeof(in.bytes);
    if (!ZYAN_SUCCESS(ZydisDecoderDecodeFull(&decoder, code, n, &in.zi, in.ops))) return -EILSEQ;

    in.addr = addr;
    in.len = in.zi.length;
    std::memcpy(in.bytes, code, in.len);

    const int rel = relative_operand(in);
    if (rel >= 0) {
        // Relative to the end of the instruction; wraps like the CPU does.
        in.target = addr + in.len + static_cast<uint64_t>(in.ops[rel].imm.value.s);
    }
    bool eip_relative = false;
    for (int i = 0; i < in.zi.operand_count; ++i) {
        const ZydisDecodedOperand &op = in.ops[i];
        if (op.type != ZYDIS_OPERAND_TYPE_MEMORY) continue;
        if (op.mem.base == ZYDIS_REGISTER_RIP) {
            in.rip_relative = true;
            in.rip_target = addr + in.len + static_cast<uint64_t>(op.mem.disp.value);
        } else if (op.mem.base == ZYDIS_REGISTER_EIP) {
            // 67-prefixed [eip + disp]: truncated to 32 bits; rare enough to refuse.
            eip_relative = true;
        }
    }
    in.flow = eip_relative ? Flow::kUnsupported : classify(in, rel);
    *out = in;
    return 0;
}

SweepDecoder::SweepDecoder() {
    ZydisDecoderInit(&decoder_, ZYDIS_MACHINE_MODE_LONG_64, ZYDIS_STACK_WIDTH_64);
    ZydisDecoderEnableMode(&decoder_, ZYDIS_DECODER_MODE_MINIMAL, ZYAN_TRUE);
}

int SweepDecoder::decode(uint64_t addr, const uint8_t *code, size_t avail, SweepInsn *out) const {
    if (code == nullptr || out == nullptr || avail == 0) return -EILSEQ;
    ZydisDecodedInstruction zi;
    const size_t n = avail < ZYDIS_MAX_INSTRUCTION_LENGTH ? avail : ZYDIS_MAX_INSTRUCTION_LENGTH;
    if (!ZYAN_SUCCESS(ZydisDecoderDecodeInstruction(&decoder_, nullptr, code, n, &zi))) return -EILSEQ;
    SweepInsn in;
    in.len = zi.length;
    in.mnemonic = zi.mnemonic;
    const uint64_t end = addr + zi.length;
    for (const auto &imm : zi.raw.imm) {
        if (imm.size == 0 || !imm.is_relative) continue;
        in.relative = true;
        in.target = end + static_cast<uint64_t>(imm.value.s);
        in.flow = relative_flow(zi);
    }
    // [rip + disp32]: ModRM mod 00, r/m 101, with 64-bit addressing (a 0x67 prefix makes it
    // eip-relative, which decode() does not count as rip_relative).
    if (zi.mnemonic == ZYDIS_MNEMONIC_LEA && (zi.attributes & ZYDIS_ATTRIB_HAS_MODRM) && zi.raw.modrm.mod == 0 &&
        zi.raw.modrm.rm == 5 && zi.address_width == 64)
        in.lea_target = end + static_cast<uint64_t>(zi.raw.disp.value);
    *out = in;
    return 0;
}

} // namespace ukp::arch
