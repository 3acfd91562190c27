#include "arch/x86_64/vector_use.hpp"

#include "arch/x86_64/insn.hpp"
#include "platform/safe_access.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <unordered_set>
#include <vector>

namespace ukp::arch {
namespace {

bool is_state_register(ZydisRegister r) {
    switch (ZydisRegisterGetClass(r)) {
    case ZYDIS_REGCLASS_X87:
    case ZYDIS_REGCLASS_MMX:
    case ZYDIS_REGCLASS_XMM:
    case ZYDIS_REGCLASS_YMM:
    case ZYDIS_REGCLASS_ZMM:
    case ZYDIS_REGCLASS_TMM:
    case ZYDIS_REGCLASS_MASK:
    case ZYDIS_REGCLASS_BOUND:
        return true;
    default:
        return r == ZYDIS_REGISTER_MXCSR || r == ZYDIS_REGISTER_X87CONTROL || r == ZYDIS_REGISTER_X87STATUS ||
               r == ZYDIS_REGISTER_X87TAG;
    }
}

// Instructions that save, load or reset the state as a whole, some with no register
// operand that says so.
bool is_state_instruction(const ZydisDecodedInstruction &zi) {
    switch (zi.meta.category) {
    case ZYDIS_CATEGORY_X87_ALU:
    case ZYDIS_CATEGORY_FCMOV:
    case ZYDIS_CATEGORY_MMX:
    case ZYDIS_CATEGORY_XSAVE:
    case ZYDIS_CATEGORY_XSAVEOPT:
        return true;
    default:
        break;
    }
    switch (zi.mnemonic) {
    case ZYDIS_MNEMONIC_EMMS:
    case ZYDIS_MNEMONIC_FEMMS:
    case ZYDIS_MNEMONIC_VZEROUPPER:
    case ZYDIS_MNEMONIC_VZEROALL:
    case ZYDIS_MNEMONIC_LDMXCSR:
    case ZYDIS_MNEMONIC_VLDMXCSR:
    case ZYDIS_MNEMONIC_STMXCSR:
    case ZYDIS_MNEMONIC_VSTMXCSR:
    case ZYDIS_MNEMONIC_FXSAVE:
    case ZYDIS_MNEMONIC_FXSAVE64:
    case ZYDIS_MNEMONIC_FXRSTOR:
    case ZYDIS_MNEMONIC_FXRSTOR64:
        return true;
    default:
        return false;
    }
}

// An instruction after which a path goes nowhere: the thread traps.
bool ends_in_trap(ZydisMnemonic m) {
    return m == ZYDIS_MNEMONIC_INT3 || m == ZYDIS_MNEMONIC_UD0 || m == ZYDIS_MNEMONIC_UD1 || m == ZYDIS_MNEMONIC_UD2 ||
           m == ZYDIS_MNEMONIC_HLT;
}

int read_in_place(uint64_t addr, uint8_t *buf, size_t n) {
    return ukp_safe_copy(buf, reinterpret_cast<const void *>(addr), n);
}

// Decodes the instruction at addr, of which the bytes up to a page end may be all there
// is.
int decode_here(uint64_t addr, CodeReader read, Insn *in) {
    uint8_t buf[ZYDIS_MAX_INSTRUCTION_LENGTH];
    size_t n = sizeof buf;
    while (n > 0 && read(addr, buf, n) != 0) --n;
    return n == 0 ? -EFAULT : decode(addr, buf, n, in);
}

} // namespace

namespace {
std::atomic<uint64_t> g_scans{0};
} // namespace

uint64_t vector_scans() { return g_scans.load(std::memory_order_relaxed); }

VectorScan scan_vector_use(uint64_t entry, const uint64_t *stops, size_t nstops, size_t budget, CodeReader read) {
    g_scans.fetch_add(1, std::memory_order_relaxed);
    if (read == nullptr) read = read_in_place;
    VectorScan scan;
    const auto fail = [&](uint64_t at, const char *why) {
        scan.at = at;
        scan.why = why;
        return scan;
    };
    std::vector<uint64_t> todo{entry};
    std::unordered_set<uint64_t> seen{entry};
    const auto go = [&](uint64_t addr) {
        if (seen.insert(addr).second) todo.push_back(addr);
    };
    while (!todo.empty()) {
        const uint64_t addr = todo.back();
        todo.pop_back();
        if (++scan.instructions > budget) return fail(addr, "too much code to follow");
        Insn in;
        if (const int err = decode_here(addr, read, &in); err != 0)
            return fail(addr, err == -EFAULT ? "unreadable code" : "undecodable bytes");
        if (is_state_instruction(in.zi)) return fail(addr, "floating-point or vector state instruction");
        for (int i = 0; i < in.zi.operand_count; ++i) {
            const ZydisDecodedOperand &op = in.ops[i];
            if (op.type == ZYDIS_OPERAND_TYPE_REGISTER && is_state_register(op.reg.value))
                return fail(addr, "floating-point or vector register");
        }
        if (ends_in_trap(in.zi.mnemonic)) continue;
        const uint64_t next = addr + in.len;
        switch (in.flow) {
        case Flow::kSequential:
        case Flow::kSyscall:
            go(next);
            break;
        case Flow::kJump:
            go(in.target);
            break;
        case Flow::kCondJump:
            go(in.target);
            go(next);
            break;
        case Flow::kCall:
            if (std::find(stops, stops + nstops, in.target) == stops + nstops) go(in.target);
            go(next);
            break;
        case Flow::kRet:
            break;
        case Flow::kIndirectJump:
            return fail(addr, "indirect jump");
        case Flow::kIndirectCall:
            return fail(addr, "indirect call");
        case Flow::kUnsupported:
            return fail(addr, "instruction that cannot be followed");
        }
    }
    scan.clean = true;
    return scan;
}

} // namespace ukp::arch
