// analyze_function(): a function decoded whole, its jump tables and the pointers its indirect
// jumps go through.
#include "arch/x86_64/region.hpp"

#include "arch/x86_64/insn.hpp"

#include <fcntl.h>
#include <gelf.h>
#include <libelf.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <new>
#include <span>

namespace ukp::arch {
namespace {

// How far back (in instructions) the jump table matcher looks for the pieces of a pattern.
constexpr size_t kPatternWindow = 24;
// A bounds check that allows more entries than this is not believed.
constexpr uint64_t kMaxTableEntries = 1u << 16;

ZydisRegister gpr64(ZydisRegister r) {
    if (r == ZYDIS_REGISTER_NONE) return r;
    return ZydisRegisterGetLargestEnclosing(ZYDIS_MACHINE_MODE_LONG_64, r);
}

// Whether `in` writes any part of the 64-bit register r (explicitly or implicitly).
bool writes(const Insn &in, ZydisRegister r) {
    for (int i = 0; i < in.zi.operand_count; ++i) {
        const ZydisDecodedOperand &op = in.ops[i];
        if (op.type == ZYDIS_OPERAND_TYPE_REGISTER && (op.actions & ZYDIS_OPERAND_ACTION_MASK_WRITE) &&
            gpr64(op.reg.value) == r) {
            return true;
        }
    }
    return false;
}

bool is_reg(const ZydisDecodedOperand &op) { return op.type == ZYDIS_OPERAND_TYPE_REGISTER; }

// The last instruction before index `before` in `w` that writes r, or -1 (also when an
// instruction in between transfers control, which ends the straight-line window).
int last_writer(std::span<const Insn> w, int before, ZydisRegister r) {
    for (int i = before - 1; i >= 0; --i) {
        if (writes(w[i], r)) return i;
        if (w[i].flow != Flow::kSequential && w[i].flow != Flow::kCondJump) return -1;
    }
    return -1;
}

bool same_memory(const ZydisDecodedOperand &a, const ZydisDecodedOperand &b) {
    return a.type == ZYDIS_OPERAND_TYPE_MEMORY && b.type == ZYDIS_OPERAND_TYPE_MEMORY && a.mem.base == b.mem.base &&
           a.mem.index == b.mem.index && a.mem.scale == b.mem.scale && a.mem.disp.value == b.mem.disp.value &&
           a.mem.segment == b.mem.segment && a.size == b.size;
}

// For `cmp $n, x` at w[i]: the entry count the following ja/jae/jbe/jb (after any
// flag-preserving moves) admits, or 0.
uint64_t bound_of_cmp(std::span<const Insn> w, size_t i) {
    const Insn &cmp = w[i];
    const uint64_t mask = cmp.zi.operand_width >= 64 ? ~0ull : (1ull << cmp.zi.operand_width) - 1;
    const uint64_t n = cmp.ops[1].imm.value.u & mask;
    if (n >= kMaxTableEntries) return 0;
    for (size_t j = i + 1; j < w.size(); ++j) {
        switch (w[j].zi.mnemonic) {
        case ZYDIS_MNEMONIC_JNBE: // ja default: entries 0..n
        case ZYDIS_MNEMONIC_JBE:  // jbe table: entries 0..n
            return n + 1;
        case ZYDIS_MNEMONIC_JNB: // jae default: entries 0..n-1
        case ZYDIS_MNEMONIC_JB:
            return n;
        case ZYDIS_MNEMONIC_MOV:
        case ZYDIS_MNEMONIC_MOVZX:
        case ZYDIS_MNEMONIC_LEA:
            continue; // leave the flags alone
        default:
            return 0;
        }
    }
    return 0;
}

bool is_cmp_imm(const Insn &in) {
    return in.zi.mnemonic == ZYDIS_MNEMONIC_CMP && in.zi.operand_count_visible == 2 &&
           in.ops[1].type == ZYDIS_OPERAND_TYPE_IMMEDIATE;
}

// The entry count of a table indexed by `index` at w[before], from the bounds check
// before it: `cmp $n, x` then ja/jae/jbe/jb, where x holds the index's value: the index
// register, a register copied into it, or the memory it was loaded from. A byte
// zero-extended into the index bounds it to 256 when no cmp is found. 0 if unknown.
uint64_t table_bound(std::span<const Insn> w, int before, ZydisRegister index) {
    ZydisRegister reg = index; // holds the index value here (or NONE: `mem` does)
    const ZydisDecodedOperand *mem = nullptr;
    uint64_t fallback = 0;
    // `cmp $n, r` seen on another register: good if r is later found copied into `reg`
    // with no write to r in between.
    struct Pending {
        ZydisRegister reg;
        uint64_t n;
    };
    std::vector<Pending> pending;
    for (int i = before - 1; i >= 0; --i) {
        const Insn &in = w[i];
        const ZydisMnemonic m = in.zi.mnemonic;
        if (is_cmp_imm(in)) {
            const ZydisDecodedOperand &x = in.ops[0];
            const bool hit = (reg != ZYDIS_REGISTER_NONE && is_reg(x) && gpr64(x.reg.value) == reg) ||
                             (mem != nullptr && same_memory(x, *mem));
            if (hit) {
                const uint64_t n = bound_of_cmp(w, static_cast<size_t>(i));
                return n != 0 ? n : fallback;
            }
            if (is_reg(x)) {
                if (uint64_t n = bound_of_cmp(w, static_cast<size_t>(i)); n != 0) {
                    pending.push_back({gpr64(x.reg.value), n});
                }
            }
            continue;
        }
        if (in.flow != Flow::kSequential && in.flow != Flow::kCondJump) return fallback;
        const bool copy = (m == ZYDIS_MNEMONIC_MOV || m == ZYDIS_MNEMONIC_MOVZX) && in.zi.operand_count_visible == 2 &&
                          is_reg(in.ops[0]);
        if (reg != ZYDIS_REGISTER_NONE && writes(in, reg) && (m == ZYDIS_MNEMONIC_BSF || m == ZYDIS_MNEMONIC_TZCNT) &&
            in.zi.operand_count_visible == 2 && is_reg(in.ops[1]) && gpr64(in.ops[1].reg.value) == reg) {
            // bsf %r,%r: a bit index below the width, or (source 0) the register left as it
            // was, 0 (AMD documents it; Intel's CPUs do the same). tzcnt: at most the width.
            return in.zi.operand_width + (m == ZYDIS_MNEMONIC_TZCNT ? 1 : 0);
        }
        if (reg != ZYDIS_REGISTER_NONE && writes(in, reg)) {
            if (copy && is_reg(in.ops[1])) {
                const ZydisRegister src = gpr64(in.ops[1].reg.value);
                for (const Pending &p : pending) {
                    if (p.reg == src) return p.n;
                }
                reg = src;
                continue;
            }
            if (copy && in.ops[1].type == ZYDIS_OPERAND_TYPE_MEMORY) {
                if (m == ZYDIS_MNEMONIC_MOVZX && in.ops[1].size == 8) fallback = 256;
                reg = ZYDIS_REGISTER_NONE;
                mem = &in.ops[1];
                continue;
            }
            return fallback;
        }
        if (mem != nullptr && ((mem->mem.base != ZYDIS_REGISTER_NONE && writes(in, gpr64(mem->mem.base))) ||
                               (mem->mem.index != ZYDIS_REGISTER_NONE && writes(in, gpr64(mem->mem.index))))) {
            return fallback;
        }
        std::erase_if(pending, [&](const Pending &p) { return writes(in, p.reg); });
    }
    return fallback;
}

// Reads n bytes at addr from the function's own bytes if they hold them, else via read.
bool read_data(const FunctionMap &f, const ReadFn &read, uint64_t addr, void *out, size_t n) {
    if (addr >= f.start && addr - f.start <= f.code.size() && n <= f.code.size() - (addr - f.start)) {
        std::memcpy(out, f.code.data() + (addr - f.start), n);
        return true;
    }
    return read ? read(addr, out, n) : false;
}

// Recognizes the jump table (if any) that the indirect jmp w.back() dispatches through.
void match_jump_table(std::span<const Insn> w, const FunctionMap &f, const ReadFn &read, IndirectJump &ij) {
    const int last = static_cast<int>(w.size()) - 1;
    const Insn &jmp = w[last];
    const ZydisDecodedOperand &target = jmp.ops[0];
    ZydisRegister index = ZYDIS_REGISTER_NONE;
    int bound_from = last;
    unsigned entry_size = 0;

    if (target.type == ZYDIS_OPERAND_TYPE_MEMORY) {
        if (target.mem.base == ZYDIS_REGISTER_RIP) {
            ij.kind = IndirectJump::Kind::kRipMemory;
            return;
        }
        // jmp *T(,%rI,8)
        if (target.mem.base != ZYDIS_REGISTER_NONE || target.mem.scale != 8 ||
            target.mem.index == ZYDIS_REGISTER_NONE || target.mem.segment != ZYDIS_REGISTER_DS) {
            return;
        }
        ij.kind = IndirectJump::Kind::kTableAbs64;
        ij.table = static_cast<uint64_t>(target.mem.disp.value);
        index = gpr64(target.mem.index);
        entry_size = 8;
    } else if (is_reg(target)) {
        // lea T(%rip),%rB; movslq (%rB,%rI,4),%rM; add %rA,%rZ; jmp *%rZ  ({rA,rZ} = {rB,rM}),
        // or lea (%rA,%rC,1),%rZ instead of the add ({rA,rC} = {rB,rM}; glibc's assembly).
        const ZydisRegister rz = gpr64(target.reg.value);
        const int add = last_writer(w, last, rz);
        if (add < 0 || w[add].zi.operand_width != 64) return;
        ZydisRegister ra, rc;
        const Insn &sum = w[add];
        if (sum.zi.mnemonic == ZYDIS_MNEMONIC_ADD && is_reg(sum.ops[1])) {
            ra = gpr64(sum.ops[1].reg.value);
            rc = rz;
        } else if (sum.zi.mnemonic == ZYDIS_MNEMONIC_LEA && sum.ops[1].type == ZYDIS_OPERAND_TYPE_MEMORY &&
                   sum.ops[1].mem.base != ZYDIS_REGISTER_NONE && sum.ops[1].mem.base != ZYDIS_REGISTER_RIP &&
                   sum.ops[1].mem.index != ZYDIS_REGISTER_NONE && sum.ops[1].mem.scale == 1 &&
                   sum.ops[1].mem.disp.value == 0 && sum.ops[1].mem.segment == ZYDIS_REGISTER_DS) {
            ra = gpr64(sum.ops[1].mem.base);
            rc = gpr64(sum.ops[1].mem.index);
        } else {
            return;
        }
        // Whichever of the two summands a movslq loaded is the entry; the other the base.
        for (const auto &[rm, rb] : {std::pair{rc, ra}, std::pair{ra, rc}}) {
            const int mov = last_writer(w, add, rm);
            if (mov < 0 || w[mov].zi.mnemonic != ZYDIS_MNEMONIC_MOVSXD) continue;
            const ZydisDecodedOperand &src = w[mov].ops[1];
            if (src.type == ZYDIS_OPERAND_TYPE_MEMORY && src.mem.base == ZYDIS_REGISTER_RIP &&
                src.mem.index == ZYDIS_REGISTER_NONE) {
                // A constant index (GCC knew it): movslq T+4k(%rip),%rM; lea T(%rip),%rB: one entry.
                const int lea = last_writer(w, add, rb);
                if (lea < 0 || w[lea].zi.mnemonic != ZYDIS_MNEMONIC_LEA || !w[lea].rip_relative) continue;
                ij.kind = IndirectJump::Kind::kTableRel32;
                ij.table = w[lea].rip_target;
                int32_t e;
                if (!read_data(f, read, w[mov].rip_target, &e, sizeof e)) return;
                ij.entries = 1;
                ij.targets = {ij.table + static_cast<uint64_t>(static_cast<int64_t>(e))};
                ij.resolved = true;
                return;
            }
            if (src.type != ZYDIS_OPERAND_TYPE_MEMORY || gpr64(src.mem.base) != rb || src.mem.scale != 4 ||
                src.mem.disp.value != 0 || src.mem.index == ZYDIS_REGISTER_NONE) {
                continue;
            }
            // The base must still hold the lea's value at the add.
            const int lea = last_writer(w, mov, rb);
            if (lea < 0 && last_writer(w, add, rb) < 0) {
                // The lea is further back: classify_pointers() looks for it on every path.
                ij.kind = IndirectJump::Kind::kTableRel32;
                ij.entries = static_cast<uint32_t>(table_bound(w, mov, gpr64(src.mem.index)));
                ij.base_reg = static_cast<int>(rb);
                ij.base_at = w[add].addr;
                return;
            }
            if (lea < 0 || w[lea].zi.mnemonic != ZYDIS_MNEMONIC_LEA || !w[lea].rip_relative) continue;
            if (last_writer(w, add, rb) != lea) continue;
            ij.kind = IndirectJump::Kind::kTableRel32;
            ij.table = w[lea].rip_target;
            index = gpr64(src.mem.index);
            bound_from = mov;
            entry_size = 4;
            break;
        }
        if (entry_size == 0) return;
    } else {
        return;
    }

    const uint64_t n = table_bound(w, bound_from, index);
    if (n == 0) return; // a table we cannot size: unresolved
    ij.entries = static_cast<uint32_t>(n);
    std::vector<uint8_t> raw(n * entry_size);
    if (!read_data(f, read, ij.table, raw.data(), raw.size())) return;
    ij.targets.reserve(n);
    for (uint64_t i = 0; i < n; ++i) {
        if (entry_size == 4) {
            int32_t e;
            std::memcpy(&e, raw.data() + i * 4, 4);
            ij.targets.push_back(ij.table + static_cast<uint64_t>(static_cast<int64_t>(e)));
        } else {
            uint64_t e;
            std::memcpy(&e, raw.data() + i * 8, 8);
            ij.targets.push_back(e);
        }
    }
    ij.resolved = true;
}

bool callee_saved(ZydisRegister r) {
    switch (r) {
    case ZYDIS_REGISTER_RBX:
    case ZYDIS_REGISTER_RBP:
    case ZYDIS_REGISTER_R12:
    case ZYDIS_REGISTER_R13:
    case ZYDIS_REGISTER_R14:
    case ZYDIS_REGISTER_R15:
        return true;
    default:
        return false;
    }
}

// A memory operand a whole code pointer may be loaded from: anything but the stack, where
// unoptimized code spills values it computed (a computed goto's `&&l + off` at -O0).
// `rbp_frame`: the function sets %rbp from %rsp (else %rbp is a register like any other).
bool pointer_memory(const ZydisDecodedOperand &m, bool rbp_frame) {
    auto stack = [&](ZydisRegister r) {
        r = gpr64(r);
        return r == ZYDIS_REGISTER_RSP || (rbp_frame && r == ZYDIS_REGISTER_RBP);
    };
    return m.type == ZYDIS_OPERAND_TYPE_MEMORY && !stack(m.mem.base) && !stack(m.mem.index) && m.size == 64;
}

// `ror $0x11, r` or `xor %fs:0x30, r`: a step of glibc's x86-64 PTR_DEMANGLE.
bool is_demangle_step(const Insn &in, ZydisRegister r) {
    if (in.zi.operand_count_visible != 2 || !is_reg(in.ops[0]) || gpr64(in.ops[0].reg.value) != r ||
        in.zi.operand_width != 64) {
        return false;
    }
    const ZydisDecodedOperand &src = in.ops[1];
    if (in.zi.mnemonic == ZYDIS_MNEMONIC_ROR) {
        return src.type == ZYDIS_OPERAND_TYPE_IMMEDIATE && src.imm.value.u == 0x11;
    }
    return in.zi.mnemonic == ZYDIS_MNEMONIC_XOR && src.type == ZYDIS_OPERAND_TYPE_MEMORY &&
           src.mem.segment == ZYDIS_REGISTER_FS && src.mem.base == ZYDIS_REGISTER_NONE &&
           src.mem.index == ZYDIS_REGISTER_NONE && src.mem.disp.value == 0x30;
}

// The function's instructions with, for each, the direct branches of the function that
// lead to it: what the backward walk of classify_pointer() needs.
struct Body {
    explicit Body(const FunctionMap &fm) : f(fm), decoded(fm.insns.size()) {}
    size_t size() const { return f.insns.size(); }
    uint64_t addr(size_t i) const { return f.insns[i]; }
    // Instruction i, decoded whole when first asked for. classify_pointers decodes each
    // once to find the branches and the frame; the walks then look again at those on
    // their paths. Keeping all decoded, a kilobyte each, took longer than the decode
    // (the pages of a vector of megabytes, zeroed).
    const Insn &insn(size_t i) const {
        std::unique_ptr<Insn> &in = decoded[i];
        if (in == nullptr) {
            in = std::make_unique<Insn>();
            const uint64_t off = f.insns[i] - f.start;
            // Decoded before (classify_pointers): the same bytes decode again.
            if (decode(f.insns[i], f.code.data() + off, f.size - off, in.get()) != 0) {
                *in = Insn{};
                in->flow = Flow::kUnsupported; // ends any walk
            }
        }
        return *in;
    }
    int index_of(uint64_t a) const {
        auto it = std::lower_bound(f.insns.begin(), f.insns.end(), a);
        return it != f.insns.end() && *it == a ? static_cast<int>(it - f.insns.begin()) : -1;
    }

    const FunctionMap &f;
    mutable std::vector<std::unique_ptr<Insn>> decoded;
    std::vector<std::vector<uint32_t>> preds; // indices of direct jmp/jcc/call sources
    std::vector<bool> table_target;           // also reached from a resolved jump table
    bool rbp_frame = false;                   // some instruction sets %rbp from %rsp
};

bool falls_through(const Insn &in) {
    return in.flow == Flow::kSequential || in.flow == Flow::kCondJump || in.flow == Flow::kCall ||
           in.flow == Flow::kIndirectCall || in.flow == Flow::kSyscall;
}

// For a load from the stack word `slot` at body[load]: the index of the 64-bit register
// store `mov %reg, slot` before it on one straight line (no instruction in between that
// other paths reach), with no change of the stack word's base register and no other
// store in between (a call may run in between: a callee writes no caller's stack word
// whose address did not escape), or -1.
int spilled_from(const Body &b, int load, const ZydisDecodedOperand &slot) {
    const ZydisRegister base = gpr64(slot.mem.base);
    if (slot.mem.index != ZYDIS_REGISTER_NONE || base == ZYDIS_REGISTER_NONE) return -1;
    for (int i = load - 1; i >= 0; --i) {
        if (!b.preds[i + 1].empty() || b.table_target[i + 1]) return -1; // a join
        const Insn &in = b.insn(i);
        if (!falls_through(in)) return -1;
        if (in.flow == Flow::kSequential && in.zi.mnemonic == ZYDIS_MNEMONIC_MOV && in.zi.operand_count_visible == 2 &&
            same_memory(in.ops[0], slot) && is_reg(in.ops[1]) && in.zi.operand_width == 64) {
            return i;
        }
        const bool call = in.flow == Flow::kCall || in.flow == Flow::kIndirectCall;
        if (!call && writes(in, base)) return -1; // a call gives rsp back as it was
        for (int k = 0; k < in.zi.operand_count; ++k) {
            const ZydisDecodedOperand &op = in.ops[k];
            if (op.type == ZYDIS_OPERAND_TYPE_MEMORY && (op.actions & ZYDIS_OPERAND_ACTION_MASK_WRITE) &&
                op.visibility == ZYDIS_OPERAND_VISIBILITY_EXPLICIT) {
                return -1; // some other store: it could be to the stack word
            }
        }
    }
    return -1;
}

// Where the walk of classify_pointer() follows the value: a register, or (reg NONE) the
// stack word at `slot` bytes from %rsp as it is at the start of the instruction.
struct Loc {
    ZydisRegister reg = ZYDIS_REGISTER_NONE;
    int64_t slot = 0;
    bool operator==(const Loc &o) const { return reg == o.reg && slot == o.slot; }
};

bool is_rsp(ZydisRegister r) { return gpr64(r) == ZYDIS_REGISTER_RSP; }

// How `in` moves %rsp (after = before + *delta); false if it writes %rsp some other way.
bool rsp_delta(const Insn &in, int64_t *delta) {
    *delta = 0;
    const ZydisMnemonic m = in.zi.mnemonic;
    if (m == ZYDIS_MNEMONIC_PUSH)
        *delta = -static_cast<int64_t>(in.zi.operand_width / 8);
    else if (m == ZYDIS_MNEMONIC_POP)
        *delta = in.zi.operand_width / 8;
    else if (in.flow == Flow::kCall || in.flow == Flow::kIndirectCall)
        return true; // the callee pops its return address
    else if (!writes(in, ZYDIS_REGISTER_RSP))
        return true;
    else if ((m == ZYDIS_MNEMONIC_SUB || m == ZYDIS_MNEMONIC_ADD) && in.zi.operand_count_visible == 2 &&
             is_reg(in.ops[0]) && is_rsp(in.ops[0].reg.value) && in.ops[1].type == ZYDIS_OPERAND_TYPE_IMMEDIATE) {
        *delta = m == ZYDIS_MNEMONIC_ADD ? in.ops[1].imm.value.s : -in.ops[1].imm.value.s;
    } else if (m == ZYDIS_MNEMONIC_LEA && is_reg(in.ops[0]) && is_rsp(in.ops[0].reg.value) &&
               is_rsp(in.ops[1].mem.base) && in.ops[1].mem.index == ZYDIS_REGISTER_NONE) {
        *delta = in.ops[1].mem.disp.value;
    } else {
        return false;
    }
    return true;
}

// A constant: a PIC object's code has no absolute address to give (a non-PIC object's
// immediates are all in ObjectRefs), so it names no region.
bool is_constant_def(const Insn &in, ZydisRegister r) {
    const ZydisMnemonic m = in.zi.mnemonic;
    if (m == ZYDIS_MNEMONIC_MOV && in.ops[1].type == ZYDIS_OPERAND_TYPE_IMMEDIATE) return true;
    // xor %r32,%r32 (and the 64-bit form): zero.
    return (m == ZYDIS_MNEMONIC_XOR || m == ZYDIS_MNEMONIC_SUB) && in.zi.operand_count_visible == 2 &&
           is_reg(in.ops[0]) && is_reg(in.ops[1]) && in.ops[0].reg.value == in.ops[1].reg.value &&
           gpr64(in.ops[0].reg.value) == r && in.zi.operand_width >= 32;
}

// For the unresolved indirect jmp body[jmp]: whether every value its target register (or
// memory operand) can hold there is a whole code pointer (IndirectJump::whole_pointer).
// Walks back along every path of the function: through copies, glibc's pointer demangling
// and %rsp-relative stack words (push/pop, spills, %rsp adjustments), into each direct
// branch to a join point, until each path meets a load from non-stack memory, a
// rip-relative lea, a constant, or the function's entry (the caller's value: an argument
// register, the return address or a stack argument). Anything else on a path (arithmetic,
// a clobbering call, an unknown %rsp change, a store that may hit the stack word, a join
// reached from a jump table, too long a walk) leaves the jump unresolved. ij.walked
// receives the instructions whose incoming paths the walk relied on: check_region makes
// sure nothing outside the function jumps to them.
// Stores through registers other than %rsp/%rbp are taken not to hit a stack word: a
// pointer to the frame that escaped could only store a value of other code, never a code
// address computed here.
// What one step back along a path found: go on, the path ends in a value that is a whole
// pointer, or the jump stays unresolved.
enum class Walk { kOn, kAccepted, kRejected };

// Where the walk of classify_pointer() starts: the jmp's register or %rsp-relative stack
// word. kAccepted when the operand is itself a whole pointer in memory.
Walk walk_start(const Body &b, int jmp, Loc *start) {
    const ZydisDecodedOperand &target = b.insn(jmp).ops[0];
    if (target.type == ZYDIS_OPERAND_TYPE_MEMORY) {
        if (pointer_memory(target, b.rbp_frame)) return Walk::kAccepted;
        if (!is_rsp(target.mem.base) || target.mem.index != ZYDIS_REGISTER_NONE || target.size != 64)
            return Walk::kRejected;
        start->slot = target.mem.disp.value; // jmp *d(%rsp)
        return Walk::kOn;
    }
    if (!is_reg(target)) return Walk::kRejected;
    start->reg = gpr64(target.reg.value);
    return Walk::kOn;
}

// One instruction back, `in`, for the value of the stack word loc->slot (relative to %rsp
// after `in`): loc becomes where the value was before `in`.
Walk back_through_stack_word(const Body &b, const Insn &in, Loc *loc) {
    const ZydisMnemonic m = in.zi.mnemonic;
    int64_t delta;
    if (!rsp_delta(in, &delta)) return Walk::kRejected;
    const int64_t before = loc->slot + delta; // the stack word, from %rsp before `in`
    if (m == ZYDIS_MNEMONIC_PUSH && before < 0) {
        // push wrote [rsp_before - 8, rsp_before): the stack word, whole or in part.
        if (before != -8 || in.zi.operand_width != 64) return Walk::kRejected;
        const ZydisDecodedOperand &src = in.ops[0];
        if (is_reg(src)) {
            *loc = Loc{gpr64(src.reg.value), 0};
            return Walk::kOn;
        }
        if (src.type == ZYDIS_OPERAND_TYPE_IMMEDIATE || pointer_memory(src, b.rbp_frame)) return Walk::kAccepted;
        return Walk::kRejected;
    }
    if (before < 0) return Walk::kRejected; // below %rsp: anything may have written it
    loc->slot = before;
    for (int k = 0; k < in.zi.operand_count; ++k) {
        const ZydisDecodedOperand &op = in.ops[k];
        if (op.type != ZYDIS_OPERAND_TYPE_MEMORY || !(op.actions & ZYDIS_OPERAND_ACTION_MASK_WRITE)) continue;
        if (in.flow == Flow::kCall || in.flow == Flow::kIndirectCall || m == ZYDIS_MNEMONIC_PUSH) continue;
        const ZydisRegister base = gpr64(op.mem.base);
        if (base == ZYDIS_REGISTER_RSP && op.mem.index == ZYDIS_REGISTER_NONE) {
            const int64_t lo = op.mem.disp.value, hi = lo + op.size / 8;
            if (hi <= loc->slot || lo >= loc->slot + 8) continue; // another stack word
            if (lo != loc->slot || op.size != 64 || m != ZYDIS_MNEMONIC_MOV) return Walk::kRejected;
            if (is_reg(in.ops[1])) {
                *loc = Loc{gpr64(in.ops[1].reg.value), 0};
                return Walk::kOn;
            }
            // A constant was stored.
            return in.ops[1].type == ZYDIS_OPERAND_TYPE_IMMEDIATE ? Walk::kAccepted : Walk::kRejected;
        }
        if (base == ZYDIS_REGISTER_RSP || gpr64(op.mem.index) == ZYDIS_REGISTER_RSP ||
            (b.rbp_frame && (base == ZYDIS_REGISTER_RBP || gpr64(op.mem.index) == ZYDIS_REGISTER_RBP)) ||
            op.visibility != ZYDIS_OPERAND_VISIBILITY_EXPLICIT) {
            return Walk::kRejected; // may be the stack word
        }
    }
    return Walk::kOn;
}

// One instruction back, body[*i], for the value of register loc->reg after it: loc becomes
// where the value was before it. Through an %rbp-based spill, *i moves back to the store
// and *walked receives the instructions stepped over.
Walk back_through_register(const Body &b, int *i, Loc *loc, std::vector<uint64_t> *walked) {
    const Insn &in = b.insn(*i);
    const ZydisMnemonic m = in.zi.mnemonic;
    const ZydisRegister r = loc->reg;
    if (in.flow == Flow::kCall || in.flow == Flow::kIndirectCall || in.flow == Flow::kSyscall) {
        // The callee (or kernel) may change any register but the callee-saved ones.
        const bool clobbered = in.flow == Flow::kSyscall
                                   ? (r == ZYDIS_REGISTER_RAX || r == ZYDIS_REGISTER_RCX || r == ZYDIS_REGISTER_R11)
                                   : !callee_saved(r);
        return clobbered ? Walk::kRejected : Walk::kOn;
    }
    if (!writes(in, r)) return Walk::kOn;
    if (is_demangle_step(in, r)) return Walk::kOn;
    if (m == ZYDIS_MNEMONIC_LEA && in.rip_relative) return Walk::kAccepted; // a materialized address
    if (is_constant_def(in, r)) return Walk::kAccepted;
    if (m == ZYDIS_MNEMONIC_POP && in.zi.operand_width == 64) {
        *loc = Loc{ZYDIS_REGISTER_NONE, 0}; // [rsp] before the pop
        return Walk::kOn;
    }
    if (m != ZYDIS_MNEMONIC_MOV || in.zi.operand_count_visible != 2 || !is_reg(in.ops[0]) ||
        in.zi.operand_width != 64) {
        return Walk::kRejected; // computed, or not a whole 64-bit value
    }
    if (is_reg(in.ops[1])) {
        loc->reg = gpr64(in.ops[1].reg.value);
        return Walk::kOn;
    }
    const ZydisDecodedOperand &src = in.ops[1];
    if (src.type != ZYDIS_OPERAND_TYPE_MEMORY) return Walk::kRejected;
    if (pointer_memory(src, b.rbp_frame)) return Walk::kAccepted; // loaded whole
    if (is_rsp(src.mem.base) && src.mem.index == ZYDIS_REGISTER_NONE) {
        *loc = Loc{ZYDIS_REGISTER_NONE, src.mem.disp.value};
        return Walk::kOn;
    }
    // An %rbp-based stack word: the value stored there on the straight line before.
    const int st = spilled_from(b, *i, src);
    if (st < 0) return Walk::kRejected;
    for (int k = st + 1; k < *i; ++k) walked->push_back(b.addr(k));
    loc->reg = gpr64(b.insn(st).ops[1].reg.value);
    *i = st;
    return Walk::kOn;
}

void classify_pointer(const Body &b, uint64_t fn_start, int jmp, IndirectJump &ij) {
    Loc start;
    if (const Walk w = walk_start(b, jmp, &start); w != Walk::kOn) {
        if (w == Walk::kAccepted) ij.whole_pointer = true;
        return;
    }
    constexpr size_t kMaxSteps = 4096;
    size_t steps = 0;
    // (index, loc): the value at loc at the start of instruction index.
    std::vector<std::pair<int, Loc>> work{{jmp, start}}, seen;
    std::vector<uint64_t> walked;
    while (!work.empty()) {
        auto [i, loc] = work.back();
        work.pop_back();
        for (;;) {
            if (++steps > kMaxSteps) return;
            if (std::find(seen.begin(), seen.end(), std::pair{i, loc}) != seen.end()) break;
            seen.emplace_back(i, loc);
            walked.push_back(b.addr(i));
            if (b.table_target[i]) return;
            for (uint32_t p : b.preds[i]) {
                // A jump or call to i: the value there is the one before the branch (a call
                // pushes: the stack word is 8 bytes further from %rsp before it).
                Loc l = loc;
                if (b.insn(p).flow == Flow::kCall && l.reg == ZYDIS_REGISTER_NONE) {
                    if (l.slot < 8) return; // the return address the call pushed
                    l.slot -= 8;
                }
                work.emplace_back(static_cast<int>(p), l);
            }
            if (i == 0) {
                // The entry: the caller's registers, return address and stack arguments.
                if (loc.reg == ZYDIS_REGISTER_NONE && loc.slot < 0) return;
                break;
            }
            if (!falls_through(b.insn(i - 1))) break; // only the branches above lead here
            --i;
            const Walk w = loc.reg == ZYDIS_REGISTER_NONE ? back_through_stack_word(b, b.insn(i), &loc)
                                                          : back_through_register(b, &i, &loc, &walked);
            if (w == Walk::kRejected) return;
            if (w == Walk::kAccepted) break;
        }
    }
    std::sort(walked.begin(), walked.end());
    walked.erase(std::unique(walked.begin(), walked.end()), walked.end());
    // The entry is where callers arrive: that is the value the walk accepts there.
    if (!walked.empty() && walked.front() == fn_start) walked.erase(walked.begin());
    ij.whole_pointer = true;
    ij.walked = std::move(walked);
}

// The address that every path of the function gives register r0 at body[from] by a
// `lea T(%rip)` (through copies; callee-saved across calls), or 0. *walked receives the
// instructions whose incoming paths that relies on.
uint64_t unique_lea(const Body &b, int from, ZydisRegister r0, std::vector<uint64_t> *walked) {
    constexpr size_t kMaxSteps = 4096;
    size_t steps = 0;
    uint64_t value = 0;
    std::vector<std::pair<int, ZydisRegister>> work{{from, r0}}, seen;
    while (!work.empty()) {
        auto [i, r] = work.back();
        work.pop_back();
        for (;;) {
            if (++steps > kMaxSteps) return 0;
            if (std::find(seen.begin(), seen.end(), std::pair{i, r}) != seen.end()) break;
            seen.emplace_back(i, r);
            walked->push_back(b.addr(i));
            if (b.table_target[i] || i == 0) return 0; // the entry: no lea on this path
            for (uint32_t p : b.preds[i]) work.emplace_back(static_cast<int>(p), r);
            const Insn &in = b.insn(i - 1);
            if (!falls_through(in)) break;
            --i;
            if (in.flow == Flow::kCall || in.flow == Flow::kIndirectCall || in.flow == Flow::kSyscall) {
                if (in.flow == Flow::kSyscall || !callee_saved(r)) return 0;
                continue;
            }
            if (!writes(in, r)) continue;
            if (in.zi.mnemonic == ZYDIS_MNEMONIC_LEA && in.rip_relative && in.zi.operand_width == 64) {
                if (value != 0 && value != in.rip_target) return 0;
                value = in.rip_target;
                break;
            }
            if (in.zi.mnemonic == ZYDIS_MNEMONIC_MOV && in.zi.operand_width == 64 && is_reg(in.ops[1])) {
                r = gpr64(in.ops[1].reg.value);
                continue;
            }
            return 0;
        }
    }
    return value;
}

// Classifies the unresolved indirect jumps of a reliably decoded f (classify_pointer),
// after resolving the tables whose base is set before the pattern (unique_lea).
void classify_pointers(FunctionMap &f, const ReadFn &read) {
    Body b(f);
    b.preds.resize(b.size());
    b.table_target.assign(b.size(), false);
    Insn in; // each instruction in turn
    for (size_t i = 0; i < b.size(); ++i) {
        const uint64_t off = f.insns[i] - f.start;
        if (decode(f.insns[i], f.code.data() + off, f.size - off, &in) != 0) return;
        if (writes(in, ZYDIS_REGISTER_RBP) && !b.rbp_frame) {
            // mov %rsp,%rbp / lea d(%rsp),%rbp, or anything that reads %rsp into %rbp.
            for (int k = 0; k < in.zi.operand_count; ++k) {
                const ZydisDecodedOperand &op = in.ops[k];
                const bool reads_rsp =
                    (is_reg(op) && gpr64(op.reg.value) == ZYDIS_REGISTER_RSP &&
                     (op.actions & ZYDIS_OPERAND_ACTION_MASK_READ)) ||
                    (op.type == ZYDIS_OPERAND_TYPE_MEMORY && gpr64(op.mem.base) == ZYDIS_REGISTER_RSP &&
                     in.zi.mnemonic == ZYDIS_MNEMONIC_LEA);
                if (reads_rsp && op.visibility == ZYDIS_OPERAND_VISIBILITY_EXPLICIT) b.rbp_frame = true;
            }
        }
        if (in.flow != Flow::kJump && in.flow != Flow::kCondJump && in.flow != Flow::kCall) continue;
        if (const int t = b.index_of(in.target); t >= 0) b.preds[t].push_back(static_cast<uint32_t>(i));
    }
    bool more_targets = false;
    for (IndirectJump &ij : f.indirect_jumps) {
        if (ij.resolved || ij.base_at == 0 || ij.entries == 0) continue;
        const int at = b.index_of(ij.base_at);
        std::vector<uint64_t> walked;
        const uint64_t table = at >= 0 ? unique_lea(b, at, static_cast<ZydisRegister>(ij.base_reg), &walked) : 0;
        if (table == 0) continue;
        std::vector<int32_t> raw(ij.entries);
        if (!read_data(f, read, table, raw.data(), raw.size() * sizeof(int32_t))) continue;
        ij.table = table;
        for (int32_t e : raw) ij.targets.push_back(table + static_cast<uint64_t>(static_cast<int64_t>(e)));
        for (uint64_t t : ij.targets) {
            if (f.contains(t)) f.branch_targets.push_back(t);
            f.start_jumped = f.start_jumped || t == f.start;
        }
        std::sort(walked.begin(), walked.end());
        walked.erase(std::unique(walked.begin(), walked.end()), walked.end());
        ij.walked = std::move(walked);
        ij.resolved = ij.via_paths = more_targets = true;
    }
    if (more_targets) {
        std::sort(f.branch_targets.begin(), f.branch_targets.end());
        f.branch_targets.erase(std::unique(f.branch_targets.begin(), f.branch_targets.end()), f.branch_targets.end());
    }
    for (const IndirectJump &ij : f.indirect_jumps) {
        for (uint64_t t : ij.targets) {
            if (const int k = b.index_of(t); k >= 0) b.table_target[k] = true;
        }
    }
    for (IndirectJump &ij : f.indirect_jumps) {
        if (ij.resolved) continue;
        if (const int j = b.index_of(ij.addr); j >= 0) classify_pointer(b, f.start, j, ij);
    }
}

// Decodes the instruction at code + off of [code, code + size), zero-padded at the end so
// that an instruction cut by the end decodes and shows its length (*len > size - off).
template <class Out, class DecodeFn>
int decode_padded(const uint8_t *code, size_t size, size_t off, DecodeFn decode_fn, Out *out) {
    const size_t left = size - off;
    if (left >= ZYDIS_MAX_INSTRUCTION_LENGTH) return decode_fn(code + off, left, out);
    uint8_t tmp[ZYDIS_MAX_INSTRUCTION_LENGTH] = {};
    std::memcpy(tmp, code + off, left);
    return decode_fn(tmp, sizeof tmp, out);
}

FunctionMap analyze(uint64_t start, const uint8_t *code, size_t size, const ReadFn &read) {
    FunctionMap f;
    f.start = start;
    f.size = size;
    f.code.assign(code, code + size);
    // Every instruction is swept by SweepDecoder (no operands: a fraction of a full decode,
    // which was most of the time of a probe over a whole library). It accepts the same bytes
    // with the same length as a full decode, and tells a relative branch's flow and target
    // and an indirect jmp; only such a jmp is decoded whole, with the window of instructions
    // before it that the jump table matcher looks at.
    const SweepDecoder sweep;
    const auto sweep_at = [&](size_t at, SweepInsn *out) {
        const auto one = [&](const uint8_t *p, size_t n, SweepInsn *o) { return sweep.decode(start + at, p, n, o); };
        return decode_padded(code, size, at, one, out);
    };
    const auto full_at = [&](size_t at, Insn *out) {
        const auto one = [&](const uint8_t *p, size_t n, Insn *o) { return decode(start + at, p, n, o); };
        return decode_padded(code, size, at, one, out);
    };
    Insn in; // a jmp's, whole (a kilobyte with its operands: not made anew per instruction)
    size_t off = 0;
    while (off < size && !f.decode_failed) {
        SweepInsn s;
        const int rc = sweep_at(off, &s);
        if (rc == 0 && s.len > size - off) {
            f.ran_past_end = true;
            f.decode_fail_addr = start + off;
            break;
        }
        const bool jmp = rc == 0 && s.jmp;
        if (rc != 0 || (jmp && full_at(off, &in) != 0)) {
            f.decode_failed = true;
            f.decode_fail_addr = start + off;
            break;
        }
        f.insns.push_back(start + off);
        off += s.len;
        const Flow flow = jmp ? in.flow : s.relative ? s.flow : Flow::kSequential;
        switch (flow) {
        case Flow::kJump:
        case Flow::kCondJump:
            f.start_jumped = f.start_jumped || s.target == start;
            [[fallthrough]];
        case Flow::kCall:
            if (f.contains(s.target)) f.branch_targets.push_back(s.target);
            break;
        case Flow::kIndirectJump: {
            // The last kPatternWindow instructions, the jmp included, oldest first.
            const size_t n = std::min(f.insns.size(), kPatternWindow);
            std::vector<Insn> window(n);
            for (size_t i = 0; i < n; ++i) {
                // Decoded (minimally) before: the same bytes decode whole as well.
                if (full_at(f.insns[f.insns.size() - n + i] - start, &window[i]) != 0) f.decode_failed = true;
            }
            if (f.decode_failed) {
                f.decode_fail_addr = in.addr; // ends the sweep
                break;
            }
            IndirectJump ij;
            ij.addr = in.addr;
            match_jump_table(window, f, read, ij);
            for (uint64_t t : ij.targets) {
                if (f.contains(t)) f.branch_targets.push_back(t);
                f.start_jumped = f.start_jumped || t == start;
            }
            f.indirect_jumps.push_back(std::move(ij));
            break;
        }
        default:
            break;
        }
    }
    std::sort(f.branch_targets.begin(), f.branch_targets.end());
    f.branch_targets.erase(std::unique(f.branch_targets.begin(), f.branch_targets.end()), f.branch_targets.end());
    if (f.reliable() && f.has_unresolved_indirect_jump()) classify_pointers(f, read);
    if (read) {
        // Whatever is readable of the bytes after the function, longest first.
        for (size_t n = kMaxTail; n > 0; n /= 2) {
            uint8_t buf[kMaxTail];
            if (read(start + size, buf, n)) {
                f.tail.assign(buf, buf + n);
                break;
            }
        }
    }
    return f;
}

} // namespace

bool FunctionMap::has_unresolved_indirect_jump() const {
    for (const IndirectJump &ij : indirect_jumps) {
        if (!ij.resolved) return true;
    }
    return false;
}

bool FunctionMap::is_boundary(uint64_t addr) const { return std::binary_search(insns.begin(), insns.end(), addr); }

FunctionMap analyze_function(uint64_t start, const uint8_t *code, size_t size, const ReadFn &read) {
    try {
        if (code == nullptr && size != 0) throw std::bad_alloc();
        return analyze(start, code, size, read);
    } catch (...) {
        // Out of memory, or a throwing read callback: nothing here is trustworthy.
        FunctionMap f;
        f.start = start;
        f.size = size;
        f.decode_failed = true;
        f.decode_fail_addr = start;
        return f;
    }
}

} // namespace ukp::arch
