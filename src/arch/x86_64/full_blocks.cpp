// find_full_blocks(), one_byte_retargets(): full_blocks.hpp.
#include "arch/x86_64/full_blocks.hpp"

#include "arch/x86_64/insn.hpp"

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <csignal>
#include <sys/syscall.h>

namespace ukp::arch {

namespace {

constexpr size_t kWindow = 12;       // instructions kept since the last branch or call
constexpr int kMaxClearBits = 8;     // a "full" set leaves at most this many signals out
constexpr int64_t kSpan = 1ll << 24; // what a change of a disp32's high byte moves by

ZydisRegister widest(ZydisRegister r) { return ZydisRegisterGetLargestEnclosing(ZYDIS_MACHINE_MODE_LONG_64, r); }

bool writes(const Insn &in, ZydisRegister reg) {
    for (int i = 0; i < in.zi.operand_count; ++i) {
        const ZydisDecodedOperand &op = in.ops[i];
        if (op.type == ZYDIS_OPERAND_TYPE_REGISTER && (op.actions & ZYDIS_OPERAND_ACTION_MASK_WRITE) &&
            widest(op.reg.value) == reg)
            return true;
    }
    return false;
}

// The value `in` puts in reg when it is `mov $imm, reg` (or `xor reg, reg`).
bool constant_into(const Insn &in, ZydisRegister reg, uint64_t *value) {
    if (in.zi.operand_count_visible != 2 || in.ops[0].type != ZYDIS_OPERAND_TYPE_REGISTER ||
        widest(in.ops[0].reg.value) != reg)
        return false;
    if (in.zi.mnemonic == ZYDIS_MNEMONIC_MOV && in.ops[1].type == ZYDIS_OPERAND_TYPE_IMMEDIATE) {
        *value = in.ops[1].imm.value.u;
        return true;
    }
    if (in.zi.mnemonic == ZYDIS_MNEMONIC_XOR && in.ops[1].type == ZYDIS_OPERAND_TYPE_REGISTER &&
        in.ops[1].reg.value == in.ops[0].reg.value) {
        *value = 0;
        return true;
    }
    return false;
}

// The index of the last instruction of window[0, end) that writes reg, or -1.
int last_writer(const std::vector<Insn> &window, size_t end, ZydisRegister reg) {
    for (size_t i = end; i-- > 0;)
        if (writes(window[i], reg)) return static_cast<int>(i);
    return -1;
}

bool full(uint64_t set, uint64_t required) {
    return (set & required) == required && 64 - std::popcount(set) <= kMaxClearBits;
}

// The set of the rt_sigprocmask at the end of window (its syscall excluded), if full.
bool match(const std::vector<Insn> &window, uint64_t required, const ReadFn &read_data, FullBlock *out) {
    const size_t end = window.size() - 1;
    uint64_t nr = 0, how = 0;
    const int nr_at = last_writer(window, end, ZYDIS_REGISTER_RAX);
    const int how_at = last_writer(window, end, ZYDIS_REGISTER_RDI);
    const int set_at = last_writer(window, end, ZYDIS_REGISTER_RSI);
    if (nr_at < 0 || how_at < 0 || set_at < 0 || !constant_into(window[nr_at], ZYDIS_REGISTER_RAX, &nr) ||
        nr != SYS_rt_sigprocmask || !constant_into(window[how_at], ZYDIS_REGISTER_RDI, &how) ||
        (how != SIG_BLOCK && how != SIG_SETMASK))
        return false;
    const Insn &lea = window[set_at];
    if (lea.zi.mnemonic != ZYDIS_MNEMONIC_LEA || lea.ops[1].type != ZYDIS_OPERAND_TYPE_MEMORY) return false;
    out->syscall_at = window[end].addr;
    if (lea.rip_relative) {
        uint64_t set = 0;
        if (lea.zi.raw.disp.size != 32 || !read_data(lea.rip_target, &set, sizeof set) || !full(set, required))
            return false;
        out->kind = FullBlock::Kind::kSetInMemory;
        out->patch_at = lea.addr + lea.zi.raw.disp.offset;
        out->set = lea.rip_target;
        return true;
    }
    // lea OFF(%base), %rsi: the set was stored there from a register holding an immediate,
    // with the base unchanged since.
    const ZydisDecodedOperandMem &where = lea.ops[1].mem;
    if (where.index != ZYDIS_REGISTER_NONE || where.base == ZYDIS_REGISTER_NONE) return false;
    const ZydisRegister base = widest(where.base);
    for (int i = set_at; i-- > 0;) {
        const Insn &in = window[i];
        if (writes(in, base)) return false;
        if (in.zi.mnemonic != ZYDIS_MNEMONIC_MOV || in.ops[0].type != ZYDIS_OPERAND_TYPE_MEMORY ||
            in.ops[0].size != 64 || in.ops[1].type != ZYDIS_OPERAND_TYPE_REGISTER)
            continue;
        const ZydisDecodedOperandMem &to = in.ops[0].mem;
        if (widest(to.base) != base || to.index != ZYDIS_REGISTER_NONE || to.disp.value != where.disp.value) continue;
        const ZydisRegister from = widest(in.ops[1].reg.value);
        const int imm_at = last_writer(window, static_cast<size_t>(i), from);
        uint64_t set = 0;
        if (imm_at < 0 || !constant_into(window[imm_at], from, &set) || window[imm_at].zi.raw.imm[0].size != 64 ||
            !full(set, required))
            return false;
        out->kind = FullBlock::Kind::kImmediate;
        out->patch_at = window[imm_at].addr + window[imm_at].zi.raw.imm[0].offset;
        out->set = set;
        return true;
    }
    return false;
}

} // namespace

std::vector<FullBlock> find_full_blocks(const Reach &code, uint64_t required, const ReadFn &read_code,
                                        const ReadFn &read_data) {
    std::vector<FullBlock> out;
    std::vector<Insn> window;
    for (const CodeRange &range : code.code) {
        window.clear();
        for (uint64_t pc = range.lo; pc < range.hi;) {
            uint8_t buf[15];
            size_t n = std::min<uint64_t>(sizeof buf, range.hi - pc);
            while (n > 0 && !read_code(pc, buf, n)) --n;
            Insn in;
            if (n == 0 || decode(pc, buf, n, &in) != 0) break;
            pc += in.len;
            if (window.size() == kWindow) window.erase(window.begin());
            window.push_back(in);
            FullBlock block;
            if (in.flow == Flow::kSyscall && match(window, required, read_data, &block)) out.push_back(block);
            if (in.flow != Flow::kSequential) window.clear(); // a branch, call or system call
        }
    }
    return out;
}

std::vector<Retarget> one_byte_retargets(const FullBlock &block) {
    std::vector<Retarget> out;
    if (block.kind != FullBlock::Kind::kSetInMemory) return out;
    // A rip-relative lea ends with its disp32.
    const auto disp = static_cast<int64_t>(block.set - (block.patch_at + 4));
    for (int64_t k = 1; k < 256; ++k) {
        for (const int64_t step : {k, -k}) {
            const int64_t moved = disp + step * kSpan;
            if (moved < INT32_MIN || moved > INT32_MAX) continue;
            out.push_back({block.set + static_cast<uint64_t>(step * kSpan),
                           static_cast<uint8_t>(static_cast<uint64_t>(moved) >> 24)});
        }
    }
    return out;
}

} // namespace ukp::arch
