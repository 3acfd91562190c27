// decode(): Zydis decoding plus the classification relocate() works from.
#include "arch/x86_64/insn.hpp"

#include <cerrno>
#include <cstring>
#include <initializer_list>

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
    // Decoded in place: an Insn is a kilobyte, its copy a good part of a decode. Zydis sets
    // all of zi and ops when it succeeds.
    Insn &in = *out;
    const size_t n = avail < sizeof(in.bytes) ? avail : sizeof(in.bytes);
    if (!ZYAN_SUCCESS(ZydisDecoderDecodeFull(&decoder, code, n, &in.zi, in.ops))) return -EILSEQ;

    in.addr = addr;
    in.len = in.zi.length;
    std::memset(in.bytes, 0, sizeof in.bytes);
    std::memcpy(in.bytes, code, in.len);
    in.target = 0;
    in.rip_relative = false;
    in.rip_target = 0;

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
    return 0;
}

SweepDecoder::SweepDecoder() {
    ZydisDecoderInit(&decoder_, ZYDIS_MACHINE_MODE_LONG_64, ZYDIS_STACK_WIDTH_64);
    ZydisDecoderEnableMode(&decoder_, ZYDIS_DECODER_MODE_MINIMAL, ZYAN_TRUE);
}

int SweepDecoder::decode(uint64_t addr, const uint8_t *code, size_t avail, SweepInsn *out) const {
    if (code == nullptr || out == nullptr || avail == 0) return -EILSEQ;
    if (quick(addr, code, avail, out)) return 0;
    return by_zydis(addr, code, avail, out);
}

int SweepDecoder::by_zydis(uint64_t addr, const uint8_t *code, size_t avail, SweepInsn *out) const {
    if (code == nullptr || out == nullptr || avail == 0) return -EILSEQ;
    ZydisDecodedInstruction zi;
    const size_t n = avail < ZYDIS_MAX_INSTRUCTION_LENGTH ? avail : ZYDIS_MAX_INSTRUCTION_LENGTH;
    if (!ZYAN_SUCCESS(ZydisDecoderDecodeInstruction(&decoder_, nullptr, code, n, &zi))) return -EILSEQ;
    SweepInsn in;
    in.len = zi.length;
    const uint64_t end = addr + zi.length;
    for (const auto &imm : zi.raw.imm) {
        if (imm.size == 0 || !imm.is_relative) continue;
        in.relative = true;
        in.target = end + static_cast<uint64_t>(imm.value.s);
        in.flow = relative_flow(zi);
    }
    in.jmp = zi.mnemonic == ZYDIS_MNEMONIC_JMP && !in.relative;
    // [rip + disp32]: ModRM mod 00, r/m 101, with 64-bit addressing (a 0x67 prefix makes it
    // eip-relative, which decode() does not count as rip_relative).
    if (zi.mnemonic == ZYDIS_MNEMONIC_LEA && (zi.attributes & ZYDIS_ATTRIB_HAS_MODRM) && zi.raw.modrm.mod == 0 &&
        zi.raw.modrm.rm == 5 && zi.address_width == 64)
        in.lea_target = end + static_cast<uint64_t>(zi.raw.disp.value);
    *out = in;
    return 0;
}

namespace {

// What follows the opcode of an instruction quick() knows.
enum Form : uint8_t {
    kUnknown = 0, // left to Zydis
    kNone,        // nothing
    kModrm,       // a ModRM operand
    kModrmImm8,   // a ModRM operand and an 8-bit immediate
    kModrmImmZ,   // a ModRM operand and a 16- or 32-bit immediate (the operand size)
    kImm8,
    kImm16,
    kImmZ,
    kMovImm,       // b8+r: a 16-, 32- or 64-bit immediate (the operand size)
    kRel8,         // jmp, jcc rel8
    kRel32,        // jmp, jcc, call rel32
    kLea,          // lea: a ModRM operand in memory
    kGroup0,       // 8f, c6, c7, fe, 0f 1f: only /0 (and fe /1) are taken; c6, c7 with an immediate
    kGroupF6,      // test /0 /1 with an immediate, not neg mul div ... without
    kGroupFF,      // inc dec call jmp push (/0 /1 /2 /4 /6)
    kRepOk = 0x80, // also taken after f2 or f3 (which change nothing in them)
};

struct Tables {
    uint8_t one[256] = {}; // by the first opcode byte
    uint8_t two[256] = {}; // by the byte after 0f
    constexpr Tables() {
        for (int base = 0; base < 0x40; base += 8) {
            // add or adc sbb and sub xor cmp: the four ModRM forms, al/eax with an immediate
            for (int i = 0; i < 4; ++i) one[base + i] = kModrm;
            one[base + 4] = kImm8;
            one[base + 5] = kImmZ;
        }
        for (int i = 0x50; i <= 0x5f; ++i) one[i] = kNone; // push, pop
        one[0x63] = kModrm;                                // movsxd
        one[0x68] = kImmZ;
        one[0x69] = kModrmImmZ;
        one[0x6a] = kImm8;
        one[0x6b] = kModrmImm8;
        for (int i = 0x70; i <= 0x7f; ++i) one[i] = kRel8;
        one[0x80] = kModrmImm8;
        one[0x81] = kModrmImmZ;
        one[0x83] = kModrmImm8;
        for (int i = 0x84; i <= 0x8b; ++i) one[i] = kModrm; // test xchg mov
        one[0x8d] = kLea;
        one[0x8f] = kGroup0;
        one[0x90] = kNone | kRepOk;                                     // nop, pause
        for (int i = 0x91; i <= 0x99; ++i) one[i] = kNone;              // xchg, cwde, cdq
        for (int i : {0xa4, 0xa5, 0xaa, 0xab}) one[i] = kNone | kRepOk; // movs, stos
        one[0xa8] = kImm8;
        one[0xa9] = kImmZ;
        for (int i = 0xb0; i <= 0xb7; ++i) one[i] = kImm8;
        for (int i = 0xb8; i <= 0xbf; ++i) one[i] = kMovImm;
        one[0xc0] = kModrmImm8;
        one[0xc1] = kModrmImm8;
        one[0xc2] = kImm16;
        one[0xc3] = kNone | kRepOk;
        one[0xc6] = kGroup0;
        one[0xc7] = kGroup0;
        one[0xc9] = kNone;                                  // leave
        one[0xcc] = kNone;                                  // int3
        for (int i = 0xd0; i <= 0xd3; ++i) one[i] = kModrm; // shifts
        one[0xe8] = kRel32;
        one[0xe9] = kRel32;
        one[0xeb] = kRel8;
        one[0xf6] = kGroupF6;
        one[0xf7] = kGroupF6;
        one[0xfe] = kGroup0;
        one[0xff] = kGroupFF;

        two[0x05] = kNone;                                  // syscall
        two[0x0b] = kNone;                                  // ud2
        two[0x1f] = kGroup0;                                // nop r/m
        for (int i = 0x40; i <= 0x4f; ++i) two[i] = kModrm; // cmovcc
        for (int i = 0x80; i <= 0x8f; ++i) two[i] = kRel32; // jcc
        for (int i = 0x90; i <= 0x9f; ++i) two[i] = kModrm; // setcc
        two[0xa2] = kNone;                                  // cpuid
        for (int i :
             {0xa3, 0xa5, 0xab, 0xad, 0xaf, 0xb0, 0xb1, 0xb3, 0xb6, 0xb7, 0xbb, 0xbc, 0xbd, 0xbe, 0xbf, 0xc0, 0xc1})
            two[i] = kModrm;    // bt bts btr btc, shld shrd by cl, imul, cmpxchg, movzx movsx, bsf bsr, xadd
        two[0xa4] = kModrmImm8; // shld
        two[0xac] = kModrmImm8; // shrd
        for (int i = 0xc8; i <= 0xcf; ++i) two[i] = kNone; // bswap
    }
};
constexpr Tables kTables;

int64_t read_signed(const uint8_t *p, size_t n) {
    switch (n) {
    case 1:
        return static_cast<int8_t>(p[0]);
    case 2: {
        int16_t v;
        std::memcpy(&v, p, 2);
        return v;
    }
    default: {
        int32_t v;
        std::memcpy(&v, p, 4);
        return v;
    }
    }
}

} // namespace

bool SweepDecoder::quick(uint64_t addr, const uint8_t *code, size_t avail, SweepInsn *out) {
    size_t i = 0;
    bool p66 = false, seg = false;
    uint8_t rep = 0;
    // Legacy prefixes, each at most once; lock and 0x67 are left to Zydis.
    for (; i < avail; ++i) {
        const uint8_t b = code[i];
        if (b == 0x66) {
            if (p66) return false;
            p66 = true;
        } else if (b == 0x2e || b == 0x3e || b == 0x26 || b == 0x36 || b == 0x64 || b == 0x65) {
            if (seg) return false;
            seg = true;
        } else if (b == 0xf2 || b == 0xf3) {
            if (rep != 0) return false;
            rep = b;
        } else {
            break;
        }
    }
    if (rep != 0 && (p66 || seg)) return false;
    if (i + 4 <= avail && rep == 0xf3 && code[i] == 0x0f && code[i + 1] == 0x1e && code[i + 2] == 0xfa) {
        *out = SweepInsn{};
        out->len = static_cast<uint8_t>(i + 3); // endbr64
        return true;
    }
    bool rex_w = false;
    if (i < avail && (code[i] & 0xf0) == 0x40) rex_w = (code[i++] & 0x08) != 0;
    if (i >= avail) return false;
    uint8_t op = code[i++];
    uint8_t form;
    bool two_byte = false;
    if (op == 0x0f) {
        if (i >= avail) return false;
        op = code[i++];
        form = kTables.two[op];
        two_byte = true;
    } else {
        form = kTables.one[op];
    }
    if (rep != 0 && !(form & kRepOk)) return false;
    form &= static_cast<uint8_t>(~kRepOk);
    if (form == kUnknown) return false;
    const size_t imm_z = rex_w || !p66 ? 4 : 2;

    SweepInsn in;
    size_t imm = 0;
    bool has_modrm = false;
    switch (form) {
    case kNone:
        break;
    case kModrm:
    case kLea:
    case kGroup0:
    case kGroupF6:
    case kGroupFF:
        has_modrm = true;
        break;
    case kModrmImm8:
        has_modrm = true;
        imm = 1;
        break;
    case kModrmImmZ:
        has_modrm = true;
        imm = imm_z;
        break;
    case kImm8:
        imm = 1;
        break;
    case kImm16:
        imm = 2;
        break;
    case kImmZ:
        imm = imm_z;
        break;
    case kMovImm:
        imm = rex_w ? 8 : imm_z;
        break;
    case kRel8:
    case kRel32:
        // 0x66 makes a rel16 of some (on AMD's CPUs), a hint prefix is not for here.
        if (p66 || seg) return false;
        imm = form == kRel8 ? 1 : 4;
        in.relative = true;
        in.flow = !two_byte && op == 0xe8                   ? Flow::kCall
                  : !two_byte && (op == 0xe9 || op == 0xeb) ? Flow::kJump
                                                            : Flow::kCondJump;
        break;
    default:
        return false;
    }
    if (!two_byte && (op == 0xc2 || op == 0xc3) && p66) return false; // a 16-bit return
    size_t disp = 0;
    bool rip = false;
    if (has_modrm) {
        if (i >= avail) return false;
        const uint8_t modrm = code[i++];
        const uint8_t mod = modrm >> 6, reg = (modrm >> 3) & 7, rm = modrm & 7;
        switch (form) {
        case kLea:
            if (mod == 3) return false;
            break;
        case kGroup0:
            // fe: inc, dec; 8f: pop; c6, c7: mov with an immediate; 0f 1f: nop.
            if (reg > (!two_byte && op == 0xfe ? 1 : 0)) return false;
            if (!two_byte && op == 0xc6) imm = 1;
            if (!two_byte && op == 0xc7) imm = imm_z;
            break;
        case kGroupF6:
            if (reg <= 1) imm = op == 0xf6 ? 1 : imm_z; // test
            break;
        case kGroupFF:
            if (reg == 3 || reg == 5 || reg == 7) return false; // far call, far jmp, nothing
            in.jmp = reg == 4;
            break;
        default:
            break;
        }
        if (mod != 3) {
            if (rm == 4) {
                if (i >= avail) return false;
                const uint8_t sib = code[i++];
                if (mod == 0 && (sib & 7) == 5) disp = 4;
            }
            if (mod == 0 && rm == 5) {
                rip = true;
                disp = 4;
            } else if (mod == 1) {
                disp = 1;
            } else if (mod == 2) {
                disp = 4;
            }
        }
    }
    if (i + disp + imm > avail || i + disp + imm > ZYDIS_MAX_INSTRUCTION_LENGTH) return false;
    const uint64_t end = addr + i + disp + imm;
    if (rip && !two_byte && op == 0x8d) in.lea_target = end + static_cast<uint64_t>(read_signed(code + i, 4));
    if (in.relative) in.target = end + static_cast<uint64_t>(read_signed(code + i + disp, imm));
    in.len = static_cast<uint8_t>(i + disp + imm);
    *out = in;
    return true;
}

} // namespace ukp::arch
