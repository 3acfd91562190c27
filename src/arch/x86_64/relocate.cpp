// relocate() / emit_jmp(): rewriting one decoded instruction to run at another address.
//
// Output layout: the code, then (if any) a pool of 64-bit literals the code reads with
// [rip + disp32] (absolute jump targets, return addresses). With Exit::kNone and a
// fallthrough path, a short jmp over the pool keeps "execution runs into whatever is
// emitted after the copy" true.
#include "arch/x86_64/insn.hpp"

#include <cerrno>
#include <climits>
#include <cstring>

namespace ukp::arch {
namespace {

// General-purpose registers by their hardware number (low 3 bits in the opcode/ModRM,
// bit 3 in REX.B).
enum Gpr : uint8_t {
    kRax = 0,
    kRcx = 1,
    kRdx = 2,
    kRbx = 3,
    kRsp = 4,
    kRbp = 5,
    kRsi = 6,
    kRdi = 7,
    kR8 = 8,
    kR9 = 9,
    kR10 = 10,
    kR11 = 11,
    kR12 = 12,
    kR13 = 13,
    kR14 = 14,
    kR15 = 15,
};

constexpr uint8_t kRexW = 0x48;
constexpr uint8_t kRexB = 0x41;
constexpr uint8_t kOperandSize16 = 0x66;
constexpr uint8_t kRedZone = 128;

bool fits_i32(int64_t v) { return v >= INT32_MIN && v <= INT32_MAX; }

// Displacement a rel32/disp32 field needs so that code ending at `end` reaches `to`.
int64_t distance(uint64_t end, uint64_t to) { return static_cast<int64_t>(to - end); }

void store_le32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

// Assembles one relocated instruction at run-time address `dest`: code first, then the
// literal pool.
class Assembler {
public:
    explicit Assembler(uint64_t dest) : dest_(dest) {}

    size_t offset() const { return len_; }
    // Run-time address of the next byte emitted.
    uint64_t pc() const { return dest_ + len_; }
    // Whether an instruction of `insn_len` bytes emitted next can reach `to` with rel32/disp32.
    bool reaches(uint64_t to, size_t insn_len) const { return fits_i32(distance(pc() + insn_len, to)); }

    void put_u8(uint8_t b) {
        if (len_ < sizeof(code_)) code_[len_] = b;
        ++len_;
    }
    void put_bytes(const uint8_t *p, size_t n) {
        for (size_t i = 0; i < n; ++i) put_u8(p[i]);
    }
    void put_u16(uint16_t v) {
        for (int i = 0; i < 2; ++i) put_u8(static_cast<uint8_t>(v >> (8 * i)));
    }
    void put_u32(uint32_t v) {
        for (int i = 0; i < 4; ++i) put_u8(static_cast<uint8_t>(v >> (8 * i)));
    }
    void put_u64(uint64_t v) {
        for (int i = 0; i < 8; ++i) put_u8(static_cast<uint8_t>(v >> (8 * i)));
    }
    // Overwrites an already emitted byte (forward branch displacements).
    void patch_u8(size_t at, uint8_t b) {
        if (at < sizeof(code_)) code_[at] = b;
    }
    void patch_u32(size_t at, uint32_t v) {
        if (at + 4 <= sizeof(code_)) store_le32(code_ + at, v);
    }

    // A disp32 field pointing at a pool literal holding `value`; `tail` is the number of
    // instruction bytes after the field (rip is the end of the instruction).
    void put_literal_disp32(uint64_t value, size_t tail = 0) {
        int slot = -1;
        for (int i = 0; i < pool_len_; ++i) {
            if (pool_[i] == value) slot = i; // same value: share the literal
        }
        if (slot < 0 && pool_len_ < kMaxLiterals) {
            slot = pool_len_++;
            pool_[slot] = value;
        }
        if (slot < 0 || refs_len_ == kMaxLiterals) {
            overflow_ = true;
            return;
        }
        refs_[refs_len_++] = LiteralRef{len_, len_ + 4 + tail, slot};
        put_u32(0);
    }

    // e9 rel32
    void put_jmp_rel32(uint64_t target) {
        put_u8(0xe9);
        put_u32(static_cast<uint32_t>(distance(pc() + 4, target)));
    }
    // ff 25 disp32: jmp *lit(%rip), lit = target
    void put_jmp_via_literal(uint64_t target) {
        put_u8(0xff);
        put_u8(0x25);
        put_literal_disp32(target);
    }
    // The shortest of the two above that gets to `target` from here.
    void put_jmp_address(uint64_t target) {
        if (reaches(target, 5)) {
            put_jmp_rel32(target);
        } else {
            put_jmp_via_literal(target);
        }
    }
    // jcc to `target`: 0f 8x rel32 in reach, else the inverted jcc rel8 over an absolute jmp.
    void put_jcc_address(uint8_t cc, uint64_t target) {
        if (reaches(target, 6)) {
            put_u8(0x0f);
            put_u8(static_cast<uint8_t>(0x80 | cc));
            put_u32(static_cast<uint32_t>(distance(pc() + 4, target)));
            return;
        }
        put_u8(static_cast<uint8_t>(0x70 | (cc ^ 1))); // odd/even cc pairs are negations
        const size_t rel8_at = offset();
        put_u8(0);
        put_jmp_via_literal(target);
        patch_u8(rel8_at, static_cast<uint8_t>(offset() - (rel8_at + 1)));
    }
    // ff 35 disp32: push QWORD PTR [rip + lit], lit = value (push imm32 would sign-extend).
    void put_push_literal(uint64_t value) {
        put_u8(0xff);
        put_u8(0x35);
        put_literal_disp32(value);
    }
    // 48 8d 64 24 80: lea -128(%rsp),%rsp -- steps over the red zone without touching flags.
    void put_lea_rsp_below_red_zone() {
        const uint8_t b[] = {kRexW, 0x8d, 0x64, 0x24, 0x80};
        put_bytes(b, sizeof(b));
    }
    // 48 8d a4 24 80 00 00 00: lea 128(%rsp),%rsp
    void put_lea_rsp_above_red_zone() {
        const uint8_t b[] = {kRexW, 0x8d, 0xa4, 0x24, kRedZone, 0, 0, 0};
        put_bytes(b, sizeof(b));
    }
    void put_push_reg(Gpr r) {
        if (r >= kR8) put_u8(kRexB);
        put_u8(static_cast<uint8_t>(0x50 | (r & 7)));
    }
    void put_pop_reg(Gpr r) {
        if (r >= kR8) put_u8(kRexB);
        put_u8(static_cast<uint8_t>(0x58 | (r & 7)));
    }
    // REX.W b8+r imm64: movabs $imm,%r64
    void put_movabs_reg_imm64(Gpr r, uint64_t imm) {
        put_u8(static_cast<uint8_t>(kRexW | (r >> 3)));
        put_u8(static_cast<uint8_t>(0xb8 | (r & 7)));
        put_u64(imm);
    }
    // b8+r imm32: mov $imm,%r32 (zero-extends into the upper half, as a 32-bit lea does)
    void put_mov_reg32_imm32(Gpr r, uint32_t imm) {
        if (r >= kR8) put_u8(kRexB);
        put_u8(static_cast<uint8_t>(0xb8 | (r & 7)));
        put_u32(imm);
    }
    // 66 b8+r imm16: mov $imm,%r16 (leaves bits 16..63 alone, as a 16-bit lea does)
    void put_mov_reg16_imm16(Gpr r, uint16_t imm) {
        put_u8(kOperandSize16);
        if (r >= kR8) put_u8(kRexB);
        put_u8(static_cast<uint8_t>(0xb8 | (r & 7)));
        put_u16(imm);
    }
    // 48 8b 00: mov (%rax),%rax, with an optional fs/gs override byte first.
    void put_mov_rax_from_rax_ptr(uint8_t segment_prefix) {
        if (segment_prefix != 0) put_u8(segment_prefix);
        const uint8_t b[] = {kRexW, 0x8b, 0x00};
        put_bytes(b, sizeof(b));
    }
    // 48 87 04 24: xchg %rax,(%rsp)
    void put_xchg_rax_rsp_ptr() {
        const uint8_t b[] = {kRexW, 0x87, 0x04, 0x24};
        put_bytes(b, sizeof(b));
    }
    // c2 imm16: ret $imm
    void put_ret_imm16(uint16_t imm) {
        put_u8(0xc2);
        put_u16(imm);
    }
    void put_int3() { put_u8(0xcc); }

    // The next instruction may fault; if it does, the program's state is recovered by
    // adding sp_delta to rsp and taking `saved_reg` back from (%rsp) (FaultUndos).
    void may_fault(unsigned sp_delta, int saved_reg = -1) {
        if (undo_.count == kMaxFaultUndos || len_ > 0xff) {
            overflow_ = true;
            return;
        }
        undo_.at[undo_.count++] =
            FaultUndo{static_cast<uint8_t>(len_), static_cast<uint8_t>(sp_delta), static_cast<int8_t>(saved_reg)};
    }
    const FaultUndos &undos() const { return undo_; }

    // Lays out code + pool into out[0, cap). `skip_pool`: end the code with a jmp over
    // the pool so that falling through lands at the end of the output.
    int finish(uint8_t *out, size_t cap, bool skip_pool) {
        if (skip_pool && pool_len_ > 0) {
            put_u8(0xeb);
            put_u8(static_cast<uint8_t>(8 * pool_len_));
        }
        const size_t pool_at = len_;
        const size_t total = len_ + 8 * static_cast<size_t>(pool_len_);
        // Every form is designed to fit; exceeding the bound would be a relocator bug.
        if (overflow_ || total > kMaxRelocatedSize) return -EOPNOTSUPP;
        if (out == nullptr || total > cap) return -ENOSPC;
        for (int i = 0; i < refs_len_; ++i) {
            const LiteralRef &ref = refs_[i];
            const size_t lit = pool_at + 8 * static_cast<size_t>(ref.slot);
            patch_u32(ref.field, static_cast<uint32_t>(lit - ref.insn_end));
        }
        for (int i = 0; i < pool_len_; ++i) put_u64(pool_[i]);
        std::memcpy(out, code_, total);
        return static_cast<int>(total);
    }

private:
    static constexpr int kMaxLiterals = 4;
    // A disp32 field to fix up once the pool's position is known.
    struct LiteralRef {
        size_t field;    // offset of the disp32 field
        size_t insn_end; // offset of the end of its instruction (what rip will be)
        int slot;        // index into pool_
    };

    uint64_t dest_;
    uint8_t code_[2 * kMaxRelocatedSize] = {}; // room to notice overruns instead of writing past
    size_t len_ = 0;
    uint64_t pool_[kMaxLiterals] = {};
    int pool_len_ = 0;
    LiteralRef refs_[kMaxLiterals] = {};
    int refs_len_ = 0;
    FaultUndos undo_;
    bool overflow_ = false;
};

Gpr gpr_of(ZydisRegister r) { return static_cast<Gpr>(ZydisRegisterGetId(r)); }

// The 64-bit register containing `r` (al, ah, ax, eax -> rax), or NONE for non-GPRs.
ZydisRegister gpr64_of(ZydisRegister r) {
    if (r == ZYDIS_REGISTER_NONE) return ZYDIS_REGISTER_NONE;
    const ZydisRegister big = ZydisRegisterGetLargestEnclosing(ZYDIS_MACHINE_MODE_LONG_64, r);
    return ZydisRegisterGetClass(big) == ZYDIS_REGCLASS_GPR64 ? big : ZYDIS_REGISTER_NONE;
}

// Whether any operand, hidden ones included, names the 64-bit register `reg64`
// (as a register operand, or as a memory base or index).
bool mentions_gpr(const Insn &insn, ZydisRegister reg64) {
    for (int i = 0; i < insn.zi.operand_count; ++i) {
        const ZydisDecodedOperand &op = insn.ops[i];
        if (op.type == ZYDIS_OPERAND_TYPE_REGISTER && gpr64_of(op.reg.value) == reg64) return true;
        if (op.type == ZYDIS_OPERAND_TYPE_MEMORY &&
            (gpr64_of(op.mem.base) == reg64 || gpr64_of(op.mem.index) == reg64)) {
            return true;
        }
    }
    return false;
}

// The visible [rip + disp] operand, or -1.
int rip_operand(const Insn &insn) {
    for (int i = 0; i < insn.zi.operand_count_visible; ++i) {
        if (insn.ops[i].type == ZYDIS_OPERAND_TYPE_MEMORY && insn.ops[i].mem.base == ZYDIS_REGISTER_RIP) {
            return i;
        }
    }
    return -1;
}

// Copies the instruction with its disp32 re-aimed at insn.rip_target from here, or
// returns false when out of reach. Prefixes (lock, fs/gs, notrack) come along unchanged.
bool put_copy_rip_adjusted(Assembler &a, const Insn &insn) {
    if (!a.reaches(insn.rip_target, insn.len) || insn.zi.raw.disp.size != 32) return false;
    uint8_t copy[sizeof(insn.bytes)];
    std::memcpy(copy, insn.bytes, insn.len);
    store_le32(copy + insn.zi.raw.disp.offset, static_cast<uint32_t>(distance(a.pc() + insn.len, insn.rip_target)));
    a.put_bytes(copy, insn.len);
    return true;
}

// Re-encodes the instruction with its [rip + disp] operand replaced by [scratch] into
// buf; returns its length, or 0 if the encoder refuses (e.g. ah next to a REX prefix).
size_t encode_with_base(const Insn &insn, int mem_op, ZydisRegister scratch, uint8_t *buf, size_t cap) {
    ZydisEncoderRequest req;
    if (!ZYAN_SUCCESS(
            ZydisEncoderDecodedInstructionToEncoderRequest(&insn.zi, insn.ops, insn.zi.operand_count_visible, &req))) {
        return 0;
    }
    ZydisEncoderOperand &m = req.operands[mem_op];
    if (m.type != ZYDIS_OPERAND_TYPE_MEMORY || m.mem.base != ZYDIS_REGISTER_RIP) return 0;
    m.mem.base = scratch;
    m.mem.displacement = 0;
    ZyanUSize n = cap;
    if (!ZYAN_SUCCESS(ZydisEncoderEncodeInstruction(&req, buf, &n))) return 0;

    // Belt and braces: the result must decode to the same instruction reading [scratch].
    ZydisDecoder decoder;
    ZydisDecodedInstruction zi;
    ZydisDecodedOperand ops[ZYDIS_MAX_OPERAND_COUNT];
    if (!ZYAN_SUCCESS(ZydisDecoderInit(&decoder, ZYDIS_MACHINE_MODE_LONG_64, ZYDIS_STACK_WIDTH_64)) ||
        !ZYAN_SUCCESS(ZydisDecoderDecodeFull(&decoder, buf, n, &zi, ops)) || zi.length != n ||
        zi.mnemonic != insn.zi.mnemonic || zi.operand_count_visible != insn.zi.operand_count_visible ||
        ops[mem_op].type != ZYDIS_OPERAND_TYPE_MEMORY || ops[mem_op].mem.base != scratch ||
        ops[mem_op].mem.index != ZYDIS_REGISTER_NONE || ops[mem_op].mem.disp.value != 0) {
        return 0;
    }
    return n;
}

// Far [rip + disp] in an ordinary instruction:
//   lea -128(%rsp),%rsp; push %s; movabs $EA,%s; <insn with [%s]>; pop %s; lea 128(%rsp),%rsp
int put_via_scratch(Assembler &a, const Insn &insn) {
    // The push/pop would shift anything rsp-relative (push/pop/call operands, [rsp+x]).
    if (mentions_gpr(insn, ZYDIS_REGISTER_RSP)) return -EOPNOTSUPP;
    const int mem_op = rip_operand(insn);
    if (mem_op < 0) return -EOPNOTSUPP;
    // Low registers first: they need no REX, which keeps ah/bh/ch/dh operands encodable.
    static constexpr Gpr kCandidates[] = {kRax, kRcx, kRdx, kRbx, kRsi, kRdi, kR8, kR9,
                                          kR10, kR11, kR12, kR13, kR14, kR15, kRbp};
    for (Gpr s : kCandidates) {
        const ZydisRegister reg = ZydisRegisterEncode(ZYDIS_REGCLASS_GPR64, s);
        if (mentions_gpr(insn, reg)) continue; // the scratch must be invisible to the insn
        uint8_t body[ZYDIS_MAX_INSTRUCTION_LENGTH];
        const size_t n = encode_with_base(insn, mem_op, reg, body, sizeof(body));
        if (n == 0) continue;
        a.put_lea_rsp_below_red_zone(); // the push must not land in the red zone
        a.may_fault(kRedZone);
        a.put_push_reg(s);
        a.put_movabs_reg_imm64(s, insn.rip_target);
        a.may_fault(kRedZone + 8, s);
        a.put_bytes(body, n);
        a.put_pop_reg(s);
        a.put_lea_rsp_above_red_zone();
        return 0;
    }
    return -EOPNOTSUPP;
}

// Far lea X(%rip),%reg: the address is a constant, so load it as one.
int put_lea_as_mov_imm(Assembler &a, const Insn &insn) {
    const ZydisDecodedOperand &dst = insn.ops[0];
    if (dst.type != ZYDIS_OPERAND_TYPE_REGISTER) return -EOPNOTSUPP;
    const Gpr r = gpr_of(dst.reg.value);
    switch (ZydisRegisterGetClass(dst.reg.value)) {
    case ZYDIS_REGCLASS_GPR64:
        a.put_movabs_reg_imm64(r, insn.rip_target);
        return 0;
    case ZYDIS_REGCLASS_GPR32:
        a.put_mov_reg32_imm32(r, static_cast<uint32_t>(insn.rip_target));
        return 0;
    case ZYDIS_REGCLASS_GPR16:
        a.put_mov_reg16_imm16(r, static_cast<uint16_t>(insn.rip_target));
        return 0;
    default:
        return -EOPNOTSUPP;
    }
}

int put_sequential(Assembler &a, const Insn &insn) {
    if (!insn.rip_relative) {
        a.put_bytes(insn.bytes, insn.len);
        return 0;
    }
    if (put_copy_rip_adjusted(a, insn)) return 0;
    if (insn.zi.mnemonic == ZYDIS_MNEMONIC_LEA) return put_lea_as_mov_imm(a, insn);
    return put_via_scratch(a, insn);
}

// loop*/jrcxz exist only as rel8: `<insn> +2; jmp +N; <jmp to target>`.
int put_loop_or_jrcxz(Assembler &a, const Insn &insn) {
    const uint8_t rel8_at = insn.zi.raw.imm[0].offset;
    if (insn.zi.raw.imm[0].size != 8 || rel8_at + 1 != insn.len) return -EOPNOTSUPP;
    a.put_bytes(insn.bytes, rel8_at); // prefixes (67 selects ecx) and opcode
    a.put_u8(2);                      // taken: skip the jmp below
    a.put_u8(0xeb);                   // not taken: jump over the jump to the target
    const size_t skip_at = a.offset();
    a.put_u8(0);
    a.put_jmp_address(insn.target);
    a.patch_u8(skip_at, static_cast<uint8_t>(a.offset() - (skip_at + 1)));
    return 0;
}

int put_cond_jump(Assembler &a, const Insn &insn) {
    switch (insn.zi.mnemonic) {
    case ZYDIS_MNEMONIC_LOOP:
    case ZYDIS_MNEMONIC_LOOPE:
    case ZYDIS_MNEMONIC_LOOPNE:
    case ZYDIS_MNEMONIC_JRCXZ:
    case ZYDIS_MNEMONIC_JECXZ:
        return put_loop_or_jrcxz(a, insn);
    default:
        // 7x rel8 and 0f 8x rel32 both carry the condition in the opcode's low nibble.
        a.put_jcc_address(insn.zi.opcode & 0x0f, insn.target);
        return 0;
    }
}

uint8_t segment_prefix_of(const ZydisDecodedOperand &mem) {
    if (mem.mem.segment == ZYDIS_REGISTER_FS) return 0x64;
    if (mem.mem.segment == ZYDIS_REGISTER_GS) return 0x65;
    return 0;
}

// Far jmp *X(%rip) once the stack is as the branch needs it:
//   lea -128(%rsp),%rsp; push %rax; movabs $EA,%rax; mov (%rax),%rax; xchg %rax,(%rsp); ret $128
// ret pops the target that xchg put in the stack word, then drops the red zone step: rsp
// ends where it was and rax is restored. Nothing is written above rsp-136.
// `pushed`: bytes the copy pushed before this (a call's return address).
void put_jmp_far_rip_ptr(Assembler &a, const Insn &insn, const ZydisDecodedOperand &mem, unsigned pushed = 0) {
    a.put_lea_rsp_below_red_zone();
    a.may_fault(pushed + kRedZone); // the push, on a stack about to overflow
    a.put_push_reg(kRax);
    a.put_movabs_reg_imm64(kRax, insn.rip_target);
    a.may_fault(pushed + kRedZone + 8, kRax); // the jump table entry's read
    a.put_mov_rax_from_rax_ptr(segment_prefix_of(mem));
    a.put_xchg_rax_rsp_ptr();
    a.put_ret_imm16(kRedZone);
}

// The call's r/m64 operand as a `jmp r/m64` (FF /2 -> FF /4), prefixes kept (notrack);
// a [rip + disp] operand is re-aimed from here (the caller checked the reach).
void put_call_bytes_as_jmp(Assembler &a, const Insn &insn) {
    uint8_t copy[sizeof(insn.bytes)];
    std::memcpy(copy, insn.bytes, insn.len);
    uint8_t &modrm = copy[insn.zi.raw.modrm.offset];
    modrm = static_cast<uint8_t>((modrm & ~0x38) | (4 << 3));
    if (insn.rip_relative) {
        store_le32(copy + insn.zi.raw.disp.offset, static_cast<uint32_t>(distance(a.pc() + insn.len, insn.rip_target)));
    }
    a.put_bytes(copy, insn.len);
}

int put_indirect_jump(Assembler &a, const Insn &insn) {
    const ZydisDecodedOperand &op = insn.ops[0];
    if (!insn.rip_relative) {
        a.put_bytes(insn.bytes, insn.len); // reads the same registers/memory anywhere
        return 0;
    }
    if (put_copy_rip_adjusted(a, insn)) return 0;
    put_jmp_far_rip_ptr(a, insn, op);
    return 0;
}

int put_indirect_call(Assembler &a, const Insn &insn) {
    const uint64_t return_address = insn.addr + insn.len;
    const ZydisDecodedOperand &op = insn.ops[0];
    if (op.type == ZYDIS_OPERAND_TYPE_REGISTER) {
        // call *%rsp jumps to the old rsp; after our push it would be 8 lower.
        if (gpr64_of(op.reg.value) == ZYDIS_REGISTER_RSP) return -EOPNOTSUPP;
        a.put_push_literal(return_address);
        put_call_bytes_as_jmp(a, insn);
        return 0;
    }
    if (op.type != ZYDIS_OPERAND_TYPE_MEMORY) return -EOPNOTSUPP;

    // The call reads its target before it pushes; the copy pushes first, so a fault on
    // that read finds rsp 8 lower than the program had it.
    if (insn.rip_relative) {
        a.put_push_literal(return_address);
        if (a.reaches(insn.rip_target, insn.len)) {
            a.may_fault(8);
            put_call_bytes_as_jmp(a, insn);
        } else {
            put_jmp_far_rip_ptr(a, insn, op, 8);
        }
        return 0;
    }

    if (gpr64_of(op.mem.base) != ZYDIS_REGISTER_RSP) {
        a.put_push_literal(return_address);
        a.may_fault(8);
        put_call_bytes_as_jmp(a, insn);
        return 0;
    }
    // [rsp + ...]: the call reads its target before pushing; we push first, so the
    // operand is 8 further from the new rsp, and must not be the stack word we just wrote.
    const int64_t disp = op.mem.disp.value;
    if (op.mem.index == ZYDIS_REGISTER_NONE && disp > -16 && disp < 0) return -EOPNOTSUPP;
    ZydisEncoderRequest req;
    if (!ZYAN_SUCCESS(
            ZydisEncoderDecodedInstructionToEncoderRequest(&insn.zi, insn.ops, insn.zi.operand_count_visible, &req))) {
        return -EOPNOTSUPP;
    }
    req.mnemonic = ZYDIS_MNEMONIC_JMP;
    req.operands[0].mem.displacement = disp + 8;
    uint8_t body[ZYDIS_MAX_INSTRUCTION_LENGTH];
    ZyanUSize n = sizeof(body);
    if (!ZYAN_SUCCESS(ZydisEncoderEncodeInstruction(&req, body, &n))) return -EOPNOTSUPP;
    a.put_push_literal(return_address);
    a.may_fault(8);
    a.put_bytes(body, n);
    return 0;
}

} // namespace

int relocate(const Insn &insn, uint64_t dest, uint8_t *out, size_t cap, Exit exit, int *trap_offset, FaultUndos *undo) {
    if (trap_offset != nullptr) *trap_offset = -1;
    if (undo != nullptr) *undo = FaultUndos{};
    if (insn.len == 0 || insn.len > sizeof(insn.bytes)) return -EINVAL;
    if (insn.flow == Flow::kUnsupported) return -EOPNOTSUPP;

    const bool falls_through =
        insn.flow == Flow::kSequential || insn.flow == Flow::kSyscall || insn.flow == Flow::kCondJump;
    // A trap after the copy is how single-step-like callers learn the copy finished; only
    // straight-line instructions have a single "after".
    if (exit == Exit::kTrap && insn.flow != Flow::kSequential && insn.flow != Flow::kSyscall) {
        return -EINVAL;
    }

    Assembler a(dest);
    const uint64_t next = insn.addr + insn.len;
    int err = 0;
    switch (insn.flow) {
    case Flow::kSequential:
        err = put_sequential(a, insn);
        break;
    case Flow::kSyscall:
        a.put_bytes(insn.bytes, insn.len);
        a.put_movabs_reg_imm64(kRcx, next); // syscall left the copy's address in rcx
        break;
    case Flow::kJump:
        a.put_jmp_address(insn.target);
        break;
    case Flow::kCondJump:
        err = put_cond_jump(a, insn);
        break;
    case Flow::kCall:
        a.put_push_literal(next); // the callee must see the original return address
        a.put_jmp_address(insn.target);
        break;
    case Flow::kIndirectCall:
        err = put_indirect_call(a, insn);
        break;
    case Flow::kIndirectJump:
        err = put_indirect_jump(a, insn);
        break;
    case Flow::kRet:
        a.put_bytes(insn.bytes, insn.len); // pops whatever is there, wherever it runs
        break;
    case Flow::kUnsupported:
        return -EOPNOTSUPP;
    }
    if (err != 0) return err;

    int trap_at = -1;
    if (falls_through) {
        if (exit == Exit::kJumpBack) {
            a.put_jmp_address(next);
        } else if (exit == Exit::kTrap) {
            trap_at = static_cast<int>(a.offset());
            a.put_int3();
        }
    }
    const int n = a.finish(out, cap, falls_through && exit == Exit::kNone);
    if (n >= 0 && trap_offset != nullptr) *trap_offset = trap_at;
    if (n >= 0 && undo != nullptr) *undo = a.undos();
    return n;
}

int emit_jmp(uint64_t dest, uint64_t target, uint8_t *out, size_t cap) {
    const int64_t rel = distance(dest + 5, target);
    if (fits_i32(rel)) {
        if (out == nullptr || cap < 5) return -ENOSPC;
        out[0] = 0xe9;
        store_le32(out + 1, static_cast<uint32_t>(rel));
        return 5;
    }
    // ff 25 00 00 00 00: jmp *0(%rip), reading the quad right behind it.
    if (out == nullptr || cap < 14) return -ENOSPC;
    out[0] = 0xff;
    out[1] = 0x25;
    store_le32(out + 2, 0);
    for (int i = 0; i < 8; ++i) out[6 + i] = static_cast<uint8_t>(target >> (8 * i));
    return 14;
}

} // namespace ukp::arch
