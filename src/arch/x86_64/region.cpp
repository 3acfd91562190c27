// analyze_function(), check_region(), landing_pads(), ElfImage: where a jump may go.
#include "arch/x86_64/region.hpp"

#include "arch/x86_64/insn.hpp"

#include <fcntl.h>
#include <gelf.h>
#include <libelf.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <new>

namespace ukp::arch {
namespace {

constexpr size_t kJmpRel32Size = 5;
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
int last_writer(const std::vector<Insn> &w, int before, ZydisRegister r) {
    for (int i = before - 1; i >= 0; --i) {
        if (writes(w[i], r)) return i;
        if (w[i].flow != Flow::kSequential && w[i].flow != Flow::kCondJump) return -1;
    }
    return -1;
}

bool same_memory(const ZydisDecodedOperand &a, const ZydisDecodedOperand &b) {
    return a.type == ZYDIS_OPERAND_TYPE_MEMORY && b.type == ZYDIS_OPERAND_TYPE_MEMORY &&
           a.mem.base == b.mem.base && a.mem.index == b.mem.index && a.mem.scale == b.mem.scale &&
           a.mem.disp.value == b.mem.disp.value && a.mem.segment == b.mem.segment && a.size == b.size;
}

// For `cmp $n, x` at w[i]: the entry count the following ja/jae/jbe/jb (after any
// flag-preserving moves) admits, or 0.
uint64_t bound_of_cmp(const std::vector<Insn> &w, size_t i) {
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
uint64_t table_bound(const std::vector<Insn> &w, int before, ZydisRegister index) {
    ZydisRegister reg = index;          // holds the index value here (or NONE: `mem` does)
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
        const bool copy = (m == ZYDIS_MNEMONIC_MOV || m == ZYDIS_MNEMONIC_MOVZX) &&
                          in.zi.operand_count_visible == 2 && is_reg(in.ops[0]);
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
void match_jump_table(const std::vector<Insn> &w, const FunctionMap &f, const ReadFn &read,
                      IndirectJump &ij) {
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

bool in_function(const FunctionMap &f, uint64_t a) { return a >= f.start && a - f.start < f.size; }

bool callee_saved(ZydisRegister r) {
    switch (r) {
    case ZYDIS_REGISTER_RBX: case ZYDIS_REGISTER_RBP: case ZYDIS_REGISTER_R12:
    case ZYDIS_REGISTER_R13: case ZYDIS_REGISTER_R14: case ZYDIS_REGISTER_R15: return true;
    default: return false;
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
    std::vector<Insn> insns;
    std::vector<std::vector<uint32_t>> preds; // indices of direct jmp/jcc/call sources
    std::vector<bool> table_target;           // also reached from a resolved jump table
    bool rbp_frame = false;                   // some instruction sets %rbp from %rsp
    int index_of(uint64_t addr) const {
        auto it = std::lower_bound(insns.begin(), insns.end(), addr,
                                   [](const Insn &in, uint64_t a) { return in.addr < a; });
        return it != insns.end() && it->addr == addr ? static_cast<int>(it - insns.begin()) : -1;
    }
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
        const Insn &in = b.insns[i];
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
    if (m == ZYDIS_MNEMONIC_PUSH) *delta = -static_cast<int64_t>(in.zi.operand_width / 8);
    else if (m == ZYDIS_MNEMONIC_POP) *delta = in.zi.operand_width / 8;
    else if (in.flow == Flow::kCall || in.flow == Flow::kIndirectCall) return true; // the callee pops its return address
    else if (!writes(in, ZYDIS_REGISTER_RSP)) return true;
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
void classify_pointer(const Body &b, uint64_t fn_start, int jmp, IndirectJump &ij) {
    const ZydisDecodedOperand &target = b.insns[jmp].ops[0];
    Loc start;
    if (target.type == ZYDIS_OPERAND_TYPE_MEMORY) {
        if (pointer_memory(target, b.rbp_frame)) {
            ij.whole_pointer = true;
            return;
        }
        if (!is_rsp(target.mem.base) || target.mem.index != ZYDIS_REGISTER_NONE || target.size != 64) return;
        start.slot = target.mem.disp.value; // jmp *d(%rsp)
    } else if (is_reg(target)) {
        start.reg = gpr64(target.reg.value);
    } else {
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
            walked.push_back(b.insns[i].addr);
            if (b.table_target[i]) return;
            for (uint32_t p : b.preds[i]) {
                // A jump or call to i: the value there is the one before the branch (a call
                // pushes: the stack word is 8 bytes further from %rsp before it).
                Loc l = loc;
                if (b.insns[p].flow == Flow::kCall && l.reg == ZYDIS_REGISTER_NONE) {
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
            const Insn &in = b.insns[i - 1];
            if (!falls_through(in)) break; // only the branches above lead here
            --i;
            const ZydisMnemonic m = in.zi.mnemonic;
            if (loc.reg == ZYDIS_REGISTER_NONE) {
                int64_t delta;
                if (!rsp_delta(in, &delta)) return;
                const int64_t before = loc.slot + delta; // the stack word, from %rsp before `in`
                if (m == ZYDIS_MNEMONIC_PUSH && before < 0) {
                    // push wrote [rsp_before - 8, rsp_before): the stack word, whole or in part.
                    if (before != -8 || in.zi.operand_width != 64) return;
                    const ZydisDecodedOperand &src = in.ops[0];
                    if (is_reg(src)) {
                        loc = Loc{gpr64(src.reg.value), 0};
                        continue;
                    }
                    if (src.type == ZYDIS_OPERAND_TYPE_IMMEDIATE || pointer_memory(src, b.rbp_frame)) break;
                    return;
                }
                if (before < 0) return; // below %rsp: anything may have written it
                loc.slot = before;
                for (int k = 0; k < in.zi.operand_count; ++k) {
                    const ZydisDecodedOperand &op = in.ops[k];
                    if (op.type != ZYDIS_OPERAND_TYPE_MEMORY || !(op.actions & ZYDIS_OPERAND_ACTION_MASK_WRITE)) continue;
                    if (in.flow == Flow::kCall || in.flow == Flow::kIndirectCall || m == ZYDIS_MNEMONIC_PUSH) continue;
                    const ZydisRegister base = gpr64(op.mem.base);
                    if (base == ZYDIS_REGISTER_RSP && op.mem.index == ZYDIS_REGISTER_NONE) {
                        const int64_t lo = op.mem.disp.value, hi = lo + op.size / 8;
                        if (hi <= loc.slot || lo >= loc.slot + 8) continue; // another stack word
                        if (lo != loc.slot || op.size != 64 || m != ZYDIS_MNEMONIC_MOV) return;
                        if (is_reg(in.ops[1])) {
                            loc = Loc{gpr64(in.ops[1].reg.value), 0};
                            break;
                        }
                        if (in.ops[1].type == ZYDIS_OPERAND_TYPE_IMMEDIATE) loc = Loc{ZYDIS_REGISTER_RIP, 0};
                        else return;
                        break;
                    }
                    if (base == ZYDIS_REGISTER_RSP || gpr64(op.mem.index) == ZYDIS_REGISTER_RSP ||
                        (b.rbp_frame && (base == ZYDIS_REGISTER_RBP || gpr64(op.mem.index) == ZYDIS_REGISTER_RBP)) ||
                        op.visibility != ZYDIS_OPERAND_VISIBILITY_EXPLICIT) {
                        return; // may be the stack word
                    }
                }
                if (loc.reg == ZYDIS_REGISTER_RIP) break; // a constant was stored
                continue;
            }
            const ZydisRegister r = loc.reg;
            if (in.flow == Flow::kCall || in.flow == Flow::kIndirectCall || in.flow == Flow::kSyscall) {
                // The callee (or kernel) may change any register but the callee-saved ones.
                const bool clobbered = in.flow == Flow::kSyscall
                                           ? (r == ZYDIS_REGISTER_RAX || r == ZYDIS_REGISTER_RCX || r == ZYDIS_REGISTER_R11)
                                           : !callee_saved(r);
                if (clobbered) return;
                continue;
            }
            if (!writes(in, r)) continue;
            if (is_demangle_step(in, r)) continue;
            if (m == ZYDIS_MNEMONIC_LEA && in.rip_relative) break; // a materialized address
            if (is_constant_def(in, r)) break;
            if (m == ZYDIS_MNEMONIC_POP && in.zi.operand_width == 64) {
                loc = Loc{ZYDIS_REGISTER_NONE, 0}; // [rsp] before the pop
                continue;
            }
            if (m != ZYDIS_MNEMONIC_MOV || in.zi.operand_count_visible != 2 || !is_reg(in.ops[0]) ||
                in.zi.operand_width != 64) {
                return; // computed, or not a whole 64-bit value
            }
            if (is_reg(in.ops[1])) {
                loc.reg = gpr64(in.ops[1].reg.value);
                continue;
            }
            const ZydisDecodedOperand &src = in.ops[1];
            if (src.type != ZYDIS_OPERAND_TYPE_MEMORY) return;
            if (pointer_memory(src, b.rbp_frame)) break; // loaded whole
            if (is_rsp(src.mem.base) && src.mem.index == ZYDIS_REGISTER_NONE) {
                loc = Loc{ZYDIS_REGISTER_NONE, src.mem.disp.value};
                continue;
            }
            // An %rbp-based stack word: the value stored there on the straight line before.
            const int st = spilled_from(b, i, src);
            if (st < 0) return;
            for (int k = st + 1; k < i; ++k) walked.push_back(b.insns[k].addr);
            loc.reg = gpr64(b.insns[st].ops[1].reg.value);
            i = st;
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
            walked->push_back(b.insns[i].addr);
            if (b.table_target[i] || i == 0) return 0; // the entry: no lea on this path
            for (uint32_t p : b.preds[i]) work.emplace_back(static_cast<int>(p), r);
            const Insn &in = b.insns[i - 1];
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
    Body b;
    b.insns.resize(f.insns.size());
    for (size_t i = 0; i < f.insns.size(); ++i) {
        const uint64_t off = f.insns[i] - f.start;
        if (decode(f.insns[i], f.code.data() + off, f.size - off, &b.insns[i]) != 0) return;
    }
    b.preds.resize(b.insns.size());
    b.table_target.assign(b.insns.size(), false);
    for (size_t i = 0; i < b.insns.size(); ++i) {
        const Insn &in = b.insns[i];
        if (writes(in, ZYDIS_REGISTER_RBP) && !b.rbp_frame) {
            // mov %rsp,%rbp / lea d(%rsp),%rbp, or anything that reads %rsp into %rbp.
            for (int k = 0; k < in.zi.operand_count; ++k) {
                const ZydisDecodedOperand &op = in.ops[k];
                const bool reads_rsp = (is_reg(op) && gpr64(op.reg.value) == ZYDIS_REGISTER_RSP &&
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
            if (in_function(f, t)) f.branch_targets.push_back(t);
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

FunctionMap analyze(uint64_t start, const uint8_t *code, size_t size, const ReadFn &read) {
    FunctionMap f;
    f.start = start;
    f.size = size;
    f.code.assign(code, code + size);
    std::vector<Insn> window; // the last kPatternWindow instructions, oldest first
    window.reserve(kPatternWindow + 1);

    size_t off = 0;
    while (off < size) {
        Insn in;
        const size_t left = size - off;
        int rc;
        if (left >= sizeof(in.bytes)) {
            rc = decode(start + off, code + off, left, &in);
        } else {
            // Zero-padded, so that an instruction cut by the end decodes and shows its length.
            uint8_t tmp[sizeof(in.bytes)] = {};
            std::memcpy(tmp, code + off, left);
            rc = decode(start + off, tmp, sizeof(tmp), &in);
            if (rc == 0 && in.len > left) {
                f.ran_past_end = true;
                f.decode_fail_addr = start + off;
                break;
            }
        }
        if (rc != 0) {
            f.decode_failed = true;
            f.decode_fail_addr = start + off;
            break;
        }
        f.insns.push_back(in.addr);
        if (window.size() == kPatternWindow) window.erase(window.begin());
        window.push_back(in);

        switch (in.flow) {
        case Flow::kJump:
        case Flow::kCondJump:
            f.start_jumped = f.start_jumped || in.target == start;
            [[fallthrough]];
        case Flow::kCall:
            if (in_function(f, in.target)) f.branch_targets.push_back(in.target);
            break;
        case Flow::kIndirectJump: {
            IndirectJump ij;
            ij.addr = in.addr;
            match_jump_table(window, f, read, ij);
            for (uint64_t t : ij.targets) {
                if (in_function(f, t)) f.branch_targets.push_back(t);
                f.start_jumped = f.start_jumped || t == start;
            }
            f.indirect_jumps.push_back(std::move(ij));
            break;
        }
        default:
            break;
        }
        off += in.len;
    }
    std::sort(f.branch_targets.begin(), f.branch_targets.end());
    f.branch_targets.erase(std::unique(f.branch_targets.begin(), f.branch_targets.end()),
                           f.branch_targets.end());
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

// A destination near addr (same 2 GiB) and one far from it (1 TiB away) for relocate().
uint64_t near_dest(uint64_t addr) { return addr < (1ull << 46) ? addr + 0x10000 : addr - 0x10000; }
uint64_t far_dest(uint64_t addr) { return addr < (1ull << 46) ? addr + (1ull << 40) : addr - (1ull << 40); }

bool any_in(const std::vector<uint64_t> &sorted, uint64_t lo, uint64_t hi) {
    auto it = std::upper_bound(sorted.begin(), sorted.end(), lo);
    return it != sorted.end() && *it < hi;
}

} // namespace

bool FunctionMap::has_unresolved_indirect_jump() const {
    for (const IndirectJump &ij : indirect_jumps) {
        if (!ij.resolved) return true;
    }
    return false;
}

bool FunctionMap::is_boundary(uint64_t addr) const {
    return std::binary_search(insns.begin(), insns.end(), addr);
}

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

const char *reason_name(Reason r) {
    switch (r) {
    case Reason::kOk: return "ok";
    case Reason::kNotInstructionBoundary: return "not-instruction-boundary";
    case Reason::kRegionPastFunctionEnd: return "region-past-function-end";
    case Reason::kNotRelocatable: return "not-relocatable";
    case Reason::kJumpIntoRegion: return "jump-into-region";
    case Reason::kIndirectJump: return "indirect-jump";
    case Reason::kCallInRegion: return "call-in-region";
    case Reason::kCrossesControlFlowEnd: return "crosses-control-flow-end";
    case Reason::kDecodeFailed: return "decode-failed";
    case Reason::kTooSmallFunction: return "too-small-function";
    case Reason::kCount_: break;
    }
    return "unknown";
}

namespace {

// Whether the paths a walk relied on (ij.walked) are all the paths: no object reference
// or extra entry arrives at a walked instruction from outside f.
bool paths_hold(const FunctionMap &f, const IndirectJump &ij, const std::vector<uint64_t> &extra,
                const ObjectRefs &refs) {
    for (uint64_t a : ij.walked) {
        if (refs.reached_from_outside(a, f.start, f.start + f.size)) return false;
        if (std::find(extra.begin(), extra.end(), a) != extra.end()) return false;
    }
    return true;
}

// Tables resolved through a walk over paths (IndirectJump::via_paths) hold only with the
// object's references to show that no path from outside joins.
bool tables_hold(const FunctionMap &f, const std::vector<uint64_t> &extra, const ObjectRefs *refs) {
    for (const IndirectJump &ij : f.indirect_jumps) {
        if (ij.via_paths && (refs == nullptr || !paths_hold(f, ij, extra, *refs))) return false;
    }
    return true;
}

// Whether the indirect jumps of f that no table resolves may be trusted: each is a whole
// pointer on every path the walk saw, no path from outside f arrives on those paths (no
// object reference or extra entry at a walked instruction), and f materializes no address
// inside itself (`&&label`: a computed goto could store `&&l + off` in memory and jump
// through it).
bool indirect_jumps_trusted(const FunctionMap &f, const std::vector<uint64_t> &extra, const ObjectRefs &refs) {
    const uint64_t fn_end = f.start + f.size;
    if (refs.value_in(f.start, fn_end)) return false;
    for (const IndirectJump &ij : f.indirect_jumps) {
        if (ij.resolved && !ij.via_paths) continue;
        if (!ij.resolved && !ij.whole_pointer) return false;
        if (!paths_hold(f, ij, extra, refs)) return false;
    }
    return true;
}

bool is_nop(const Insn &in) { return in.zi.mnemonic == ZYDIS_MNEMONIC_NOP; }

// The object's direct branches into (lo, hi), (target, source), if nothing else leads
// there: no materialized value, no extra entry, no target of the function's own that the
// object's branches do not show (a jump table entry). Else empty.
std::vector<std::pair<uint64_t, uint64_t>> branches_into(const FunctionMap &f, const std::vector<uint64_t> &extra,
                                                         const ObjectRefs &refs, uint64_t lo, uint64_t hi) {
    if (refs.value_in(lo, hi)) return {};
    for (uint64_t e : extra)
        if (e > lo && e < hi) return {};
    const auto first_from = [&](uint64_t t) {
        return std::lower_bound(refs.branches.begin(), refs.branches.end(), std::pair<uint64_t, uint64_t>{t, 0});
    };
    for (auto it = std::upper_bound(f.branch_targets.begin(), f.branch_targets.end(), lo);
         it != f.branch_targets.end() && *it < hi; ++it) {
        const auto b = first_from(*it);
        if (b == refs.branches.end() || b->first != *it) return {};
    }
    std::vector<std::pair<uint64_t, uint64_t>> out;
    for (auto it = first_from(lo + 1); it != refs.branches.end() && it->first < hi; ++it) out.push_back(*it);
    return out;
}

} // namespace

OptimizeCheck check_region(const FunctionMap &f, uint64_t addr, const std::vector<uint64_t> &extra_entries,
                           size_t jump_len, const ObjectRefs *refs) {
    OptimizeCheck c;
    auto fail = [&c](Reason r) {
        if (c.reasons == 0) c.reason = r;
        c.reasons |= 1u << static_cast<unsigned>(r);
    };
    try {
        if (!f.reliable()) fail(Reason::kDecodeFailed);
        if (jump_len == 0) jump_len = kJmpRel32Size;
        if (!in_function(f, addr) || !f.is_boundary(addr)) {
            if (f.size < jump_len) fail(Reason::kTooSmallFunction);
            if (f.reliable()) fail(Reason::kNotInstructionBoundary);
            return c;
        }
        // The DCR: whole instructions from addr until jump_len bytes are covered. Past the
        // function's end only nop padding may follow, after a final ret/jmp, with refs to
        // tell that no code reaches it and where the next function starts.
        std::vector<Insn> dcr;
        uint64_t end = addr;
        const uint64_t fn_end = f.start + f.size;
        while (end - addr < jump_len) {
            Insn in;
            if (end >= fn_end) {
                const bool after_exit = !dcr.empty() && end == fn_end &&
                                        (dcr.back().flow == Flow::kRet || dcr.back().flow == Flow::kJump ||
                                         dcr.back().flow == Flow::kIndirectJump);
                const uint64_t toff = end - fn_end;
                if (refs == nullptr || !f.reliable() || (!after_exit && !c.into_padding) || toff >= f.tail.size() ||
                    decode(end, f.tail.data() + toff, f.tail.size() - toff, &in) != 0 ||
                    in.len > f.tail.size() - toff || !is_nop(in) || end + in.len > refs->next_start(f.start)) {
                    if (!f.reliable()) return c;
                    fail(f.size < jump_len ? Reason::kTooSmallFunction : Reason::kRegionPastFunctionEnd);
                    c.insns.clear();
                    return c;
                }
                c.into_padding = true;
            } else {
                const uint64_t off = end - f.start;
                if (!f.is_boundary(end)) {
                    // Into bytes the sweep never decoded.
                    if (!f.reliable()) return c;
                    fail(Reason::kRegionPastFunctionEnd);
                    c.insns.clear();
                    return c;
                }
                if (decode(end, f.code.data() + off, f.size - off, &in) != 0 || in.len > f.size - off) {
                    fail(Reason::kDecodeFailed);
                    return c;
                }
            }
            c.insns.push_back(end);
            dcr.push_back(in);
            end += in.len;
        }
        c.dcr_len = end - addr;

        uint8_t buf[kMaxRelocatedSize];
        bool relocatable = true;
        for (size_t i = 0; i < dcr.size(); ++i) {
            const Insn &in = dcr[i];
            const bool last = i + 1 == dcr.size();
            // The function's final ret/jmp before the padding: nothing but the padding follows.
            const bool exit_before_padding = c.into_padding && in.addr + in.len == fn_end;
            if (!last) {
                // A return address inside the DCR would point into the middle of the jmp.
                if (in.flow == Flow::kCall || in.flow == Flow::kIndirectCall) fail(Reason::kCallInRegion);
                // After ret/jmp, the next DCR bytes are reached only by jumps we may not see.
                if ((in.flow == Flow::kRet || in.flow == Flow::kJump || in.flow == Flow::kIndirectJump) &&
                    !exit_before_padding) {
                    fail(Reason::kCrossesControlFlowEnd);
                }
            }
            if (in.flow == Flow::kUnsupported ||
                relocate(in, near_dest(in.addr), buf, sizeof(buf), Exit::kNone) < 0 ||
                relocate(in, far_dest(in.addr), buf, sizeof(buf), Exit::kNone) < 0) {
                relocatable = false;
            }
        }
        if (!relocatable) fail(Reason::kNotRelocatable);

        bool into = any_in(f.branch_targets, addr, end);
        for (uint64_t e : extra_entries) into = into || (e > addr && e < end);
        // Resolved tables' targets outside the function are not in branch_targets; other
        // functions' jumps and every materialized address are in refs.
        if (refs != nullptr) into = into || refs->any_in(addr, end);
        if (into) {
            fail(Reason::kJumpIntoRegion);
            if (refs != nullptr) c.entered_by = branches_into(f, extra_entries, *refs, addr, end);
        }
        if (f.has_unresolved_indirect_jump()) {
            c.trusted_jumps = refs != nullptr && indirect_jumps_trusted(f, extra_entries, *refs);
            if (!c.trusted_jumps) fail(Reason::kIndirectJump);
        } else if (!tables_hold(f, extra_entries, refs)) {
            fail(Reason::kIndirectJump);
        }
    } catch (...) {
        fail(Reason::kDecodeFailed); // allocation failure
    }
    c.ok = c.reasons == 0;
    if (c.ok) c.reason = Reason::kOk;
    return c;
}

// ---------------------------------------------------------------------------------------
// Landing pads
// ---------------------------------------------------------------------------------------
namespace {

// DW_EH_PE_* (LSB "Linux Standard Base Core Specification", .eh_frame pointer encodings).
constexpr uint8_t kPeOmit = 0xff;
constexpr uint8_t kPeAbsptr = 0x00, kPeUleb128 = 0x01, kPeUdata2 = 0x02, kPeUdata4 = 0x03,
                  kPeUdata8 = 0x04, kPeSleb128 = 0x09, kPeSdata2 = 0x0a, kPeSdata4 = 0x0b,
                  kPeSdata8 = 0x0c;
constexpr uint8_t kPePcrel = 0x10, kPeDatarel = 0x30;
constexpr uint8_t kPeIndirect = 0x80;
// Sanity limits: no real table comes near them; a corrupt one stops here.
constexpr uint64_t kMaxFdeCount = 1u << 24;
constexpr uint64_t kMaxCallSiteTable = 1u << 20;
constexpr uint64_t kLsdaWindow = 1u << 24;

// A bounds-checked reader over [pos, end) through a ReadFn; the first failure sticks.
class Cursor {
public:
    Cursor(const ReadFn &read, uint64_t pos, uint64_t end) : read_(read), pos_(pos), end_(end) {}
    uint64_t pos() const { return pos_; }
    int error() const { return error_; }
    const char *what() const { return what_; }
    void fail(int err, const char *what) {
        if (error_ == 0) {
            error_ = err;
            what_ = what;
        }
    }
    bool get(void *out, size_t n) {
        if (error_ != 0) return false;
        if (pos_ > end_ || n > end_ - pos_) {
            fail(-EPROTO, "record runs past its end");
            return false;
        }
        if (!read_(pos_, out, n)) {
            fail(-EFAULT, "unreadable address");
            return false;
        }
        pos_ += n;
        return true;
    }
    template <class T> T get() {
        T v{};
        get(&v, sizeof(v));
        return v;
    }
    uint64_t uleb() {
        uint64_t v = 0;
        for (unsigned shift = 0; shift < 64; shift += 7) {
            const uint8_t b = get<uint8_t>();
            if (error_ != 0) return 0;
            v |= static_cast<uint64_t>(b & 0x7f) << shift;
            if (!(b & 0x80)) return v;
        }
        fail(-EPROTO, "LEB128 longer than 64 bits");
        return 0;
    }
    int64_t sleb() {
        int64_t v = 0;
        for (unsigned shift = 0; shift < 64; shift += 7) {
            const uint8_t b = get<uint8_t>();
            if (error_ != 0) return 0;
            v |= static_cast<int64_t>(static_cast<uint64_t>(b & 0x7f) << shift);
            if (!(b & 0x80)) {
                // Sign extension as an unsigned mask: negating 1 << 63 would overflow.
                if (shift + 7 < 64 && (b & 0x40)) v |= static_cast<int64_t>(~uint64_t{0} << (shift + 7));
                return v;
            }
        }
        fail(-EPROTO, "LEB128 longer than 64 bits");
        return 0;
    }
    // A DW_EH_PE-encoded pointer. `datarel` is the DW_EH_PE_datarel base (0: not allowed).
    // A raw 0 stays 0 (a null pointer), as libgcc reads it.
    uint64_t pointer(uint8_t enc, uint64_t datarel = 0) {
        const uint64_t field = pos_;
        uint64_t v = 0;
        switch (enc & 0x0f) {
        case kPeAbsptr: v = get<uint64_t>(); break;
        case kPeUleb128: v = uleb(); break;
        case kPeUdata2: v = get<uint16_t>(); break;
        case kPeUdata4: v = get<uint32_t>(); break;
        case kPeUdata8: v = get<uint64_t>(); break;
        case kPeSleb128: v = static_cast<uint64_t>(sleb()); break;
        case kPeSdata2: v = static_cast<uint64_t>(static_cast<int64_t>(get<int16_t>())); break;
        case kPeSdata4: v = static_cast<uint64_t>(static_cast<int64_t>(get<int32_t>())); break;
        case kPeSdata8: v = get<uint64_t>(); break;
        default: fail(-EPROTO, "unknown pointer encoding format"); return 0;
        }
        if (error_ != 0 || v == 0) return v;
        switch (enc & 0x70) {
        case 0: break;
        case kPePcrel: v += field; break;
        case kPeDatarel:
            if (datarel == 0) {
                fail(-EPROTO, "datarel pointer where no data base is defined");
                return 0;
            }
            v += datarel;
            break;
        default: fail(-EPROTO, "unsupported pointer encoding base (textrel/funcrel/aligned)"); return 0;
        }
        if (enc & kPeIndirect) {
            uint64_t p = 0;
            if (!read_(v, &p, sizeof(p))) {
                fail(-EFAULT, "unreadable indirect pointer");
                return 0;
            }
            v = p;
        }
        return v;
    }
    // Only the size of an encoding: for pc_range, which has the FDE encoding's format but
    // no base.
    uint64_t value(uint8_t enc) { return pointer(static_cast<uint8_t>(enc & 0x0f)); }
    void skip(uint64_t n) {
        if (error_ == 0 && (pos_ > end_ || n > end_ - pos_)) fail(-EPROTO, "record runs past its end");
        else pos_ += n;
    }

private:
    const ReadFn &read_;
    uint64_t pos_, end_;
    int error_ = 0;
    const char *what_ = nullptr;
};

// Reads a CIE/FDE length field; sets *body (first byte after it) and *end.
bool record_bounds(Cursor &c, uint64_t *end) {
    uint64_t len = c.get<uint32_t>();
    if (len == 0xffffffffu) len = c.get<uint64_t>();
    if (c.error() != 0) return false;
    if (len == 0) {
        c.fail(-EPROTO, "zero-length record (terminator) where an FDE was expected");
        return false;
    }
    *end = c.pos() + len;
    return true;
}

struct CieInfo {
    uint8_t fde_enc = kPeAbsptr;
    uint8_t lsda_enc = kPeOmit;
    bool has_z = false;
};

int parse_cie(const ReadFn &read, uint64_t cie, CieInfo *out, std::string *why) {
    Cursor c(read, cie, ~0ull);
    uint64_t end = 0;
    if (!record_bounds(c, &end)) {
        if (why) *why = std::string(c.what()) + " in CIE";
        return c.error();
    }
    Cursor b(read, c.pos(), end);
    if (b.get<uint32_t>() != 0 && b.error() == 0) b.fail(-EPROTO, "CIE pointer of an FDE leads to no CIE");
    const uint8_t version = b.get<uint8_t>();
    if (b.error() == 0 && version != 1 && version != 3) b.fail(-EPROTO, "CIE version not 1 or 3");
    char aug[16];
    size_t n = 0;
    while (b.error() == 0) {
        const char ch = static_cast<char>(b.get<uint8_t>());
        if (b.error() != 0 || ch == '\0') break;
        if (n + 1 >= sizeof(aug)) {
            b.fail(-EPROTO, "CIE augmentation string too long");
            break;
        }
        aug[n++] = ch;
    }
    aug[n] = '\0';
    b.uleb(); // code alignment
    b.sleb(); // data alignment
    if (version == 1) b.get<uint8_t>();
    else b.uleb(); // return address register
    if (b.error() == 0 && n > 0) {
        if (aug[0] != 'z') {
            b.fail(-EPROTO, "CIE augmentation without 'z'");
        } else {
            out->has_z = true;
            b.uleb(); // augmentation data length
            for (size_t i = 1; i < n && b.error() == 0; ++i) {
                switch (aug[i]) {
                case 'P': { // personality routine: skipped
                    const uint8_t enc = b.get<uint8_t>();
                    b.value(enc);
                    break;
                }
                case 'L': out->lsda_enc = b.get<uint8_t>(); break;
                case 'R': out->fde_enc = b.get<uint8_t>(); break;
                case 'S': case 'B': case 'G': break; // no data
                default: b.fail(-EPROTO, "unknown CIE augmentation character"); break;
                }
            }
        }
    }
    if (b.error() == 0) return 0;
    if (why) *why = std::string(b.what()) + " in CIE";
    return b.error();
}

// Appends the landing pads of the LSDA at `lsda` of a function starting at `region_start`.
int parse_lsda(const ReadFn &read, uint64_t lsda, uint64_t region_start, std::vector<uint64_t> *pads,
               std::string *why) {
    Cursor c(read, lsda, lsda + kLsdaWindow);
    uint64_t lpstart = region_start;
    const uint8_t lpstart_enc = c.get<uint8_t>();
    if (lpstart_enc != kPeOmit) lpstart = c.pointer(lpstart_enc);
    const uint8_t ttype_enc = c.get<uint8_t>();
    if (ttype_enc != kPeOmit) c.uleb(); // offset of the type table: not needed
    const uint8_t cs_enc = c.get<uint8_t>();
    if (c.error() == 0 && (cs_enc & 0x70) != 0) c.fail(-EPROTO, "call-site encoding with a base");
    const uint64_t cs_len = c.uleb();
    if (c.error() == 0 && cs_len > kMaxCallSiteTable) c.fail(-EPROTO, "call-site table too long");
    if (c.error() == 0) {
        const uint64_t cs_end = c.pos() + cs_len;
        Cursor t(read, c.pos(), cs_end);
        while (t.error() == 0 && t.pos() < cs_end) {
            t.value(cs_enc); // call-site start
            t.value(cs_enc); // call-site length
            const uint64_t lp = t.value(cs_enc);
            t.uleb(); // action
            if (t.error() == 0 && lp != 0) pads->push_back(lpstart + lp);
        }
        if (t.error() == 0) return 0;
        if (why) *why = std::string(t.what()) + " in LSDA call-site table";
        return t.error();
    }
    if (why) *why = std::string(c.what()) + " in LSDA header";
    return c.error();
}

} // namespace

int landing_pads(uint64_t eh_frame_hdr, uint64_t lo, uint64_t hi, const ReadFn &read,
                 std::vector<uint64_t> *pads, std::string *error) {
    std::string why;
    auto done = [&](int rc, const std::string &what, uint64_t at) {
        if (rc != 0 && error != nullptr) {
            char buf[32];
            std::snprintf(buf, sizeof(buf), " at 0x%llx", static_cast<unsigned long long>(at));
            *error = what + buf;
        }
        return rc;
    };
    if (eh_frame_hdr == 0) return done(-ENOENT, "no .eh_frame_hdr (PT_GNU_EH_FRAME)", 0);
    if (!read || pads == nullptr) return done(-EINVAL, "no reader or output", 0);
    try {
        Cursor h(read, eh_frame_hdr, ~0ull);
        const uint8_t version = h.get<uint8_t>();
        const uint8_t eh_frame_ptr_enc = h.get<uint8_t>();
        const uint8_t fde_count_enc = h.get<uint8_t>();
        const uint8_t table_enc = h.get<uint8_t>();
        if (h.error() != 0) return done(h.error(), std::string(h.what()) + " in .eh_frame_hdr", h.pos());
        if (version != 1) return done(-EPROTO, ".eh_frame_hdr version not 1", eh_frame_hdr);
        h.pointer(eh_frame_ptr_enc, eh_frame_hdr);
        if (fde_count_enc == kPeOmit || table_enc != (kPeDatarel | kPeSdata4)) {
            return done(-EPROTO, ".eh_frame_hdr without a datarel|sdata4 search table", eh_frame_hdr);
        }
        const uint64_t count = h.pointer(fde_count_enc, eh_frame_hdr);
        if (h.error() != 0) return done(h.error(), std::string(h.what()) + " in .eh_frame_hdr", h.pos());
        if (count > kMaxFdeCount) return done(-EPROTO, ".eh_frame_hdr FDE count implausible", eh_frame_hdr);
        const uint64_t table = h.pos();

        auto entry = [&](uint64_t i, uint64_t *loc, uint64_t *fde) {
            int32_t e[2];
            if (!read(table + i * 8, e, sizeof(e))) return false;
            *loc = eh_frame_hdr + static_cast<uint64_t>(static_cast<int64_t>(e[0]));
            *fde = eh_frame_hdr + static_cast<uint64_t>(static_cast<int64_t>(e[1]));
            return true;
        };
        // The last entry with initial location <= lo: the FDE that may cover lo.
        uint64_t first = 0, l = 0, r = count;
        while (l < r) {
            const uint64_t m = l + (r - l) / 2;
            uint64_t loc, fde;
            if (!entry(m, &loc, &fde)) return done(-EFAULT, "unreadable .eh_frame_hdr table", table + m * 8);
            if (loc <= lo) {
                first = m;
                l = m + 1;
            } else {
                r = m;
            }
        }
        for (uint64_t i = first; i < count; ++i) {
            uint64_t loc, fde;
            if (!entry(i, &loc, &fde)) return done(-EFAULT, "unreadable .eh_frame_hdr table", table + i * 8);
            if (loc >= hi) break;
            // The FDE: length, CIE pointer, pc_begin, pc_range, augmentation data (LSDA).
            Cursor c(read, fde, ~0ull);
            uint64_t end = 0;
            if (!record_bounds(c, &end)) return done(c.error(), std::string(c.what()) + " in FDE", fde);
            Cursor b(read, c.pos(), end);
            const uint64_t cie_field = b.pos();
            const uint32_t cie_off = b.get<uint32_t>();
            if (b.error() == 0 && (cie_off == 0 || cie_off > cie_field)) {
                b.fail(-EPROTO, "FDE with a bad CIE pointer");
            }
            if (b.error() != 0) return done(b.error(), std::string(b.what()) + " in FDE", fde);
            CieInfo cie;
            if (int rc = parse_cie(read, cie_field - cie_off, &cie, &why); rc != 0) {
                return done(rc, why + " (of FDE)", cie_field - cie_off);
            }
            const uint64_t pc_begin = b.pointer(cie.fde_enc);
            const uint64_t pc_range = b.value(cie.fde_enc);
            if (b.error() == 0 && pc_begin != loc) b.fail(-EPROTO, "FDE pc_begin differs from .eh_frame_hdr");
            uint64_t lsda = 0;
            if (cie.has_z) {
                const uint64_t aug_len = b.uleb();
                const uint64_t aug_start = b.pos();
                if (cie.lsda_enc != kPeOmit) lsda = b.pointer(cie.lsda_enc);
                if (b.error() == 0 && b.pos() - aug_start > aug_len) b.fail(-EPROTO, "FDE augmentation overrun");
            }
            if (b.error() != 0) return done(b.error(), std::string(b.what()) + " in FDE", fde);
            if (pc_begin + pc_range <= lo || lsda == 0) continue;
            if (int rc = parse_lsda(read, lsda, pc_begin, pads, &why); rc != 0) return done(rc, why, lsda);
        }
        return 0;
    } catch (...) {
        return done(-ENOMEM, "out of memory", eh_frame_hdr);
    }
}

// ---------------------------------------------------------------------------------------
// ElfImage
// ---------------------------------------------------------------------------------------

std::unique_ptr<ElfImage> ElfImage::open(const std::string &path, uint64_t bias, std::string *error) {
    auto fail = [&](const std::string &why) -> std::unique_ptr<ElfImage> {
        if (error != nullptr) *error = path + ": " + why;
        return nullptr;
    };
    try {
        std::unique_ptr<ElfImage> img(new ElfImage());
        img->bias_ = bias;
        std::string why;
        if (!img->elf_.open(path, &why)) return fail(why);
        Elf *elf = img->elf_.elf();
        if (!img->elf_.is_64()) return fail("not a 64-bit ELF file");
        img->file_ = img->elf_.bytes(&img->file_size_);
        if (img->file_ == nullptr) return fail(std::string("cannot map: ") + elf_errmsg(-1));
        size_t phnum = 0;
        if (elf_getphdrnum(elf, &phnum) != 0) return fail("no program headers");
        for (size_t i = 0; i < phnum; ++i) {
            GElf_Phdr ph;
            if (!gelf_getphdr(elf, static_cast<int>(i), &ph)) return fail("unreadable program header");
            if (ph.p_type == PT_LOAD) {
                if (ph.p_offset > img->file_size_ || ph.p_filesz > img->file_size_ - ph.p_offset ||
                    ph.p_filesz > ph.p_memsz) {
                    return fail("PT_LOAD segment outside the file");
                }
                img->segments_.push_back({ph.p_vaddr, ph.p_filesz, ph.p_memsz, ph.p_offset});
            } else if (ph.p_type == PT_GNU_EH_FRAME) {
                img->eh_frame_hdr_ = bias + ph.p_vaddr;
            }
        }
        return img;
    } catch (...) {
        return fail("out of memory");
    }
}

ElfImage::~ElfImage() = default;

bool ElfImage::read(uint64_t addr, void *out, size_t n) const {
    const uint64_t vaddr = addr - bias_;
    for (const Segment &s : segments_) {
        if (vaddr < s.vaddr || vaddr - s.vaddr > s.memsz || n > s.memsz - (vaddr - s.vaddr)) continue;
        const uint64_t at = vaddr - s.vaddr;
        const uint64_t from_file = at >= s.filesz ? 0 : std::min<uint64_t>(n, s.filesz - at);
        if (from_file != 0) std::memcpy(out, file_ + s.offset + at, from_file);
        std::memset(static_cast<uint8_t *>(out) + from_file, 0, n - from_file);
        return true;
    }
    return false;
}

const uint8_t *ElfImage::bytes(uint64_t addr, size_t n) const {
    const uint64_t vaddr = addr - bias_;
    for (const Segment &s : segments_) {
        if (vaddr < s.vaddr || vaddr - s.vaddr > s.filesz || n > s.filesz - (vaddr - s.vaddr)) continue;
        return file_ + s.offset + (vaddr - s.vaddr);
    }
    return nullptr;
}

ReadFn ElfImage::reader() const {
    return [this](uint64_t addr, void *out, size_t n) { return read(addr, out, n); };
}

} // namespace ukp::arch
