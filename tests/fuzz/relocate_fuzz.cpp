// decode -> relocate -> run the original and the copy, compare (src/arch/x86_64/insn.hpp).
//
// One instruction is decoded at kOrig and relocated (relocate()) to a destination near it
// (< 2 GiB) and to one far from it (1 TiB). The original and each copy then run in forked,
// seccomp-confined children (sandbox.hpp) from the same registers and the same memory.
// Every byte around the original that is not the instruction is an int3, and so is every
// page a branch may go to: wherever control goes, it stops at once, with rip telling where.
// These code pages are read-only, as a program's code is: an instruction that stores into
// its own bytes (rep movsb with rdi walking down over it) would otherwise re-decode what it
// wrote, which no copy elsewhere can follow (stores there fault in both runs alike).
// The copy must end the same way: same signal, same place (a fault at the instruction may
// be anywhere inside the copy), same registers, flags, xmm and memory. A difference aborts.
//
// Input layout (fixed offsets; missing bytes read as zero):
//   [0]        options: exit kind, where the original and the copies sit in their pages
//   [1, 16)    the instruction bytes
//   [16, 32)   one selector per GPR: how its value below is turned into a register value
//   [32, 160)  16 GPR values
//   [160, 162) flags (CF PF AF ZF SF DF OF)
//   [162, 418) xmm0..15
//   [418, ...) bytes placed at rsp (up to 512)
#include "arch/x86_64/insn.hpp"
#include "sandbox.hpp"

#include <Zydis/Zydis.h>
#include <signal.h>
#include <sys/ucontext.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <vector>

namespace {

using namespace ukp::arch;
using ukp::fuzz::CpuState;
using ukp::fuzz::kPageSize;
using ukp::fuzz::RunResult;
using ukp::fuzz::RunSpec;

// Far from anything the process maps (ASan's shadow ends at 0x10007fff7fff, its heap
// starts at 0x600000000000, libraries sit at 0x7f...): +-2 GiB around it is free.
constexpr uint64_t kOrigBase = 0x2000'0000'0000;
constexpr uint64_t kFarDistance = 0x100'0000'0000; // 1 TiB
constexpr uint64_t kDataBase = 0x3000'0000;        // 4 pages: what registers point to
constexpr size_t kDataPages = 4;
constexpr uint64_t kStackBase = kDataBase + 0x2c00; // rsp = this + [0, 0x400)
constexpr size_t kInputSize = 418;
constexpr size_t kMaxStackBytes = 512;
constexpr uint64_t kFlagsMask = 0xcd5; // CF PF AF ZF SF DF OF

[[noreturn]] void finding(const char *what, const uint8_t *insn, size_t len) {
    std::fprintf(stderr, "relocate_fuzz: %s; instruction:", what);
    for (size_t i = 0; i < len; ++i) std::fprintf(stderr, " %02x", insn[i]);
    std::fprintf(stderr, "\n");
    std::abort();
}

uint64_t load64(const uint8_t *p) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    return v;
}

uint64_t page_of(uint64_t a) { return a & ~(kPageSize - 1); }

// Deterministic filler for data pages.
uint64_t mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

// Whether the instruction may run in the sandbox and behave the same in every run:
// nothing that reaches the kernel, changes segments, or reads per-run or per-CPU state.
bool safe_to_run(const Insn &in) {
    const ZydisDecodedInstruction &zi = in.zi;
    if (zi.attributes & ZYDIS_ATTRIB_IS_PRIVILEGED) return false;
    if (zi.meta.branch_type == ZYDIS_BRANCH_TYPE_FAR) return false;
    switch (zi.meta.category) {
    case ZYDIS_CATEGORY_SYSCALL:
    case ZYDIS_CATEGORY_SYSRET:
    case ZYDIS_CATEGORY_SYSTEM:
    case ZYDIS_CATEGORY_INTERRUPT:
    case ZYDIS_CATEGORY_IO:
    case ZYDIS_CATEGORY_IOSTRINGOP:
    case ZYDIS_CATEGORY_SEGOP:
    case ZYDIS_CATEGORY_RDWRFSGS:
    case ZYDIS_CATEGORY_RDRAND:
    case ZYDIS_CATEGORY_RDSEED:
    case ZYDIS_CATEGORY_RDPID:
    case ZYDIS_CATEGORY_RDPRU:
    case ZYDIS_CATEGORY_UINTR:
    case ZYDIS_CATEGORY_VTX:
    case ZYDIS_CATEGORY_SGX:
    case ZYDIS_CATEGORY_PKU:
    case ZYDIS_CATEGORY_WAITPKG:
    case ZYDIS_CATEGORY_XSAVE:
    case ZYDIS_CATEGORY_XSAVEOPT:
    case ZYDIS_CATEGORY_PT:
        return false;
    default:
        break;
    }
    switch (zi.mnemonic) {
    case ZYDIS_MNEMONIC_CPUID: // per-CPU answers (APIC id)
    case ZYDIS_MNEMONIC_RDTSC:
    case ZYDIS_MNEMONIC_RDTSCP:
    case ZYDIS_MNEMONIC_RDPMC:
    case ZYDIS_MNEMONIC_POPF: // could set TF/AC: a trap or fault after the next instruction
    case ZYDIS_MNEMONIC_POPFD:
    case ZYDIS_MNEMONIC_POPFQ:
    case ZYDIS_MNEMONIC_FXSAVE: // store the last x87 instruction pointer
    case ZYDIS_MNEMONIC_FXSAVE64:
    case ZYDIS_MNEMONIC_FNSAVE:
    case ZYDIS_MNEMONIC_FNSTENV:
    case ZYDIS_MNEMONIC_XGETBV: // xgetbv 1 reports which state is in use
    case ZYDIS_MNEMONIC_ENCLU:
        return false;
    default:
        break;
    }
    for (int i = 0; i < zi.operand_count; ++i) {
        const ZydisDecodedOperand &op = in.ops[i];
        if (op.type == ZYDIS_OPERAND_TYPE_REGISTER && (op.actions & ZYDIS_OPERAND_ACTION_MASK_WRITE) &&
            ZydisRegisterGetClass(op.reg.value) == ZYDIS_REGCLASS_SEGMENT) {
            return false;
        }
    }
    return true;
}

// The [rip + disp] operand's bytes, or {0, 0}; `written` if the instruction stores there.
struct RipAccess {
    uint64_t lo = 0, hi = 0;
    bool written = false;
};
RipAccess rip_access(const Insn &in) {
    RipAccess a;
    for (int i = 0; i < in.zi.operand_count; ++i) {
        const ZydisDecodedOperand &op = in.ops[i];
        if (op.type != ZYDIS_OPERAND_TYPE_MEMORY || op.mem.base != ZYDIS_REGISTER_RIP) continue;
        a.lo = in.rip_target;
        // lea computes an address only; others touch at most 64 bytes (zmm), fxrstor 512.
        a.hi = in.rip_target + std::max<uint64_t>(op.size / 8, 1);
        if (in.zi.mnemonic == ZYDIS_MNEMONIC_LEA) a.hi = a.lo;
        a.written = a.written || (op.actions & ZYDIS_OPERAND_ACTION_MASK_WRITE);
    }
    return a;
}

struct Page {
    uint64_t addr;
    bool code; // int3-filled, executable and read-only; else pattern-filled data
    std::unique_ptr<uint8_t[]> bytes;
};

// Where one run places things.
struct Layout {
    uint64_t orig;
    std::vector<Page> pages; // common to all runs, in snapshot order
    uint64_t rsp0;
};

bool overlaps(uint64_t a_lo, uint64_t a_hi, uint64_t b_lo, uint64_t b_hi) { return a_lo < b_hi && b_lo < a_hi; }

struct Case {
    const uint8_t *in; // kInputSize bytes
    Insn insn;
    Layout lay;
    CpuState cpu{};
    std::vector<uint64_t> dests; // the copies' addresses
};

bool forbidden_value(const Case &c, uint64_t v) {
    // An address inside the original instruction (the copy runs see int3s there) or in
    // a copy's pages (mapped only in copy runs) would make runs differ for no bug.
    if (v >= c.lay.orig && v < c.lay.orig + 16) return true;
    for (uint64_t d : c.dests) {
        if (v >= page_of(d) && v < page_of(d) + 2 * kPageSize) return true;
    }
    return false;
}

// The same for a memory operand's address computed from registers (base + index * scale
// + disp, each register's value allowed on its own): the copy run could write into its
// own page where the original run faults.
bool forbidden_address(const Case &c) {
    auto value = [&](ZydisRegister r) -> uint64_t {
        const ZydisRegisterClass k = ZydisRegisterGetClass(r);
        if (k != ZYDIS_REGCLASS_GPR64 && k != ZYDIS_REGCLASS_GPR32) return 0;
        return c.cpu.gpr[ZydisRegisterGetId(r)];
    };
    for (int i = 0; i < c.insn.zi.operand_count; ++i) {
        const ZydisDecodedOperand &op = c.insn.ops[i];
        if (op.type != ZYDIS_OPERAND_TYPE_MEMORY || op.mem.base == ZYDIS_REGISTER_RIP) continue;
        const uint64_t ea = value(op.mem.base) + value(op.mem.index) * (op.mem.scale != 0 ? op.mem.scale : 1) +
                            static_cast<uint64_t>(op.mem.disp.value);
        if (forbidden_value(c, ea) || forbidden_value(c, ea & 0xffffffffull)) return true;
    }
    return false;
}

uint64_t sanitize_value(const Case &c, uint64_t v) { return forbidden_value(c, v) ? v ^ (1ull << 44) : v; }

void sanitize_bytes(const Case &c, uint8_t *p, size_t n) {
    for (size_t i = 0; i + 8 <= n; ++i) {
        if (forbidden_value(c, load64(p + i))) p[i + 5] ^= 0x10;
    }
}

Page &add_page(Layout &lay, uint64_t addr, bool code) {
    for (Page &p : lay.pages) {
        if (p.addr == addr) return p;
    }
    Page p{addr, code, std::make_unique<uint8_t[]>(kPageSize)};
    if (code) {
        std::memset(p.bytes.get(), 0xcc, kPageSize);
    } else {
        for (size_t i = 0; i < kPageSize; i += 8) {
            const uint64_t v = mix(addr + i);
            std::memcpy(p.bytes.get() + i, &v, 8);
        }
    }
    lay.pages.push_back(std::move(p));
    return lay.pages.back();
}

// UKP_FUZZ_VERBOSE=1: every run's result on stderr.
bool verbose() {
    static const bool v = std::getenv("UKP_FUZZ_VERBOSE") != nullptr;
    return v;
}

// UKP_RELOCATE_FUZZ_NAIVE=1 replaces relocate()'s output with the bytes copied verbatim
// (plus the exit): a relocator that forgets RIP-relative operands and branches, which
// the hand-made corpus must catch (scripts/fuzz.sh checks that it does).
bool naive() {
    static const bool v = std::getenv("UKP_RELOCATE_FUZZ_NAIVE") != nullptr;
    return v;
}

int naive_copy(const Insn &insn, uint64_t dest, Exit exit, uint8_t *out, int *trap_offset) {
    std::memcpy(out, insn.bytes, insn.len);
    int n = insn.len;
    *trap_offset = -1;
    if (exit == Exit::kJumpBack) n += emit_jmp(dest + static_cast<uint64_t>(n), insn.addr + insn.len, out + n, 14);
    if (exit == Exit::kTrap) {
        *trap_offset = n;
        out[n++] = 0xcc;
    }
    return n;
}

// A run's result, for the report.
void print_result(const char *name, const RunResult &r) {
    std::fprintf(stderr,
                 "  %s: kind %d wait 0x%x sig %d code %d addr 0x%" PRIx64 " rip 0x%" PRIx64 " trapno %" PRIu64
                 " err 0x%" PRIx64 "\n",
                 name, r.kind, r.wait_status, r.sig, r.code, r.addr, r.gregs[REG_RIP], r.gregs[REG_TRAPNO],
                 r.gregs[REG_ERR]);
}

constexpr int kGregOfGpr[16] = {REG_RAX, REG_RCX, REG_RDX, REG_RBX, REG_RSP, REG_RBP, REG_RSI, REG_RDI,
                                REG_R8,  REG_R9,  REG_R10, REG_R11, REG_R12, REG_R13, REG_R14, REG_R15};
const char *const kGprName[16] = {"rax", "rcx", "rdx", "rbx", "rsp", "rbp", "rsi", "rdi",
                                  "r8",  "r9",  "r10", "r11", "r12", "r13", "r14", "r15"};

// Compares the copy's run with the original's; returns a description of the first
// difference, or null.
// The copy's registers at its fault, with what relocate()'s FaultUndos says put back;
// false when the value the undo needs from the stack is not in the snapshot.
bool undo_copy_regs(const Case &c, const RunResult &k, const FaultUndo &u, uint64_t *g) {
    std::memcpy(g, k.gregs, sizeof k.gregs);
    if (u.saved_reg >= 0) {
        const uint64_t sp = g[REG_RSP];
        for (size_t i = 0; i < c.lay.pages.size() && i < static_cast<size_t>(k.nsnap); ++i) {
            const uint64_t base = c.lay.pages[i].addr;
            if (sp < base || sp + 8 > base + kPageSize) continue;
            std::memcpy(&g[kGregOfGpr[u.saved_reg]], k.mem[i] + (sp - base), 8);
            g[REG_RSP] += u.sp_delta;
            return true;
        }
        return false;
    }
    g[REG_RSP] += u.sp_delta;
    return true;
}

const char *compare(const Case &c, const RunResult &o, const RunResult &k, uint64_t dest, int copy_len, int trap_offset,
                    const FaultUndos &undo, char *buf, size_t cap) {
    if (o.kind != k.kind) return "the runs ended differently (signal/timeout/killed)";
    if (o.kind != RunResult::kSignal) {
        return o.wait_status == k.wait_status ? nullptr : "the children's exit status differs";
    }
    if (o.sig != k.sig) return "different signals";
    if (o.gregs[REG_TRAPNO] != k.gregs[REG_TRAPNO]) return "different exception vectors";
    uint64_t krip = k.gregs[REG_RIP];
    const uint64_t orip = o.gregs[REG_RIP];
    const bool in_copy = krip >= dest && krip < dest + static_cast<uint64_t>(copy_len) + 16;
    if (trap_offset >= 0 && k.sig == SIGTRAP && krip == dest + static_cast<uint64_t>(trap_offset) + 1) {
        krip = c.lay.orig + c.insn.len + 1; // Exit::kTrap's int3 stands for "fell through"
    }
    // (An int3 right before the original also stops with rip == orig.)
    const bool orig_faulted_in_insn = orip == c.lay.orig && o.gregs[REG_TRAPNO] != 3;
    if (o.sig == SIGSEGV || o.sig == SIGBUS) {
        if (o.addr != k.addr) return "different fault addresses";
        if (o.code != k.code) return "different si_code";
        if (o.gregs[REG_ERR] != k.gregs[REG_ERR]) return "different page fault error codes";
    }
    if (orig_faulted_in_insn) {
        if (!in_copy) return "the original faulted in the instruction, the copy outside itself";
        // At the copy's first instruction, or at an access its FaultUndos describes, the
        // program's registers are recoverable and must match; elsewhere only the fault
        // and the memory are comparable.
        const FaultUndo first{};
        const FaultUndo *u = krip == dest ? &first : undo.find(krip - dest);
        uint64_t g[23];
        if (u != nullptr && undo_copy_regs(c, k, *u, g)) {
            for (int i = 0; i < 16; ++i) {
                if (o.gregs[kGregOfGpr[i]] != g[kGregOfGpr[i]]) {
                    std::snprintf(buf, cap, "after the undo at +%" PRIu64 ", %s differs: 0x%" PRIx64 " vs 0x%" PRIx64,
                                  krip - dest, kGprName[i], o.gregs[kGregOfGpr[i]], g[kGregOfGpr[i]]);
                    return buf;
                }
            }
            if ((o.gregs[REG_EFL] & kFlagsMask) != (g[REG_EFL] & kFlagsMask)) return "flags differ at the fault";
        }
    } else {
        if (orip != krip) return "control ended at different addresses";
        for (int i = 0; i < 16; ++i) {
            if (o.gregs[kGregOfGpr[i]] != k.gregs[kGregOfGpr[i]]) {
                std::snprintf(buf, cap, "%s differs: 0x%" PRIx64 " vs 0x%" PRIx64, kGprName[i], o.gregs[kGregOfGpr[i]],
                              k.gregs[kGregOfGpr[i]]);
                return buf;
            }
        }
        if ((o.gregs[REG_EFL] & kFlagsMask) != (k.gregs[REG_EFL] & kFlagsMask)) return "flags differ";
    }
    if (std::memcmp(o.xmm, k.xmm, sizeof(o.xmm)) != 0 || o.mxcsr != k.mxcsr) return "xmm/mxcsr differ";
    if (o.nsnap != k.nsnap) return "snapshot count differs";
    for (int i = 0; i < o.nsnap; ++i) {
        const uint64_t base = c.lay.pages[static_cast<size_t>(i)].addr;
        for (size_t b = 0; b < kPageSize; ++b) {
            if (o.mem[i][b] == k.mem[i][b]) continue;
            const uint64_t a = base + b;
            // Below the red zone the copy may use the stack (documented in insn.hpp).
            if (a >= c.lay.rsp0 - 256 && a < c.lay.rsp0 - 128) continue;
            // A relocated indirect call pushes the return address before it reads its
            // target, so when that read faults the copy has written the slot the call
            // would have (no program keeps data there across a call; rsp is put back).
            if (orig_faulted_in_insn && c.insn.flow == Flow::kIndirectCall && a >= c.lay.rsp0 - 8 && a < c.lay.rsp0) {
                continue;
            }
            // In copy runs the original instruction's bytes are int3s.
            if (a >= c.lay.orig && a < c.lay.orig + c.insn.len) continue;
            std::snprintf(buf, cap, "memory differs at 0x%" PRIx64 " (rsp0 0x%" PRIx64 "): %02x vs %02x", a, c.lay.rsp0,
                          o.mem[i][b], k.mem[i][b]);
            return buf;
        }
    }
    return nullptr;
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    uint8_t in[kInputSize] = {};
    std::memcpy(in, data, std::min(size, kInputSize));
    const uint8_t opts = in[0];

    Case c;
    c.in = in;
    static constexpr uint64_t kOrigOffsets[4] = {0x0, 0x123, 0xff8, 0x800};
    c.lay.orig = kOrigBase + kOrigOffsets[(opts >> 2) & 3];
    if (decode(c.lay.orig, in + 1, 15, &c.insn) != 0) return 0;
    const Insn &insn = c.insn;
    uint8_t out[kMaxRelocatedSize + 16]; // for the error-path checks
    if (insn.flow == Flow::kUnsupported) {
        if (relocate(insn, c.lay.orig + 0x10000, out, sizeof(out), Exit::kJumpBack) != -EOPNOTSUPP) {
            finding("relocate() accepted an unsupported instruction", insn.bytes, insn.len);
        }
        return 0;
    }
    if (insn.flow == Flow::kSyscall || !safe_to_run(insn)) return 0;

    Exit exit = Exit::kJumpBack;
    if ((opts & 3) == 1) exit = Exit::kNone;
    if ((opts & 3) == 2) exit = Exit::kTrap;
    if (exit == Exit::kTrap && insn.flow != Flow::kSequential) {
        if (relocate(insn, c.lay.orig + 0x10000, out, sizeof(out), exit) != -EINVAL) {
            finding("Exit::kTrap for a branch did not give -EINVAL", insn.bytes, insn.len);
        }
        exit = Exit::kJumpBack;
    }
    static constexpr int64_t kNearOffsets[4] = {0x10000, -0x10000, 0x7ff00000, -0x7ff00000};
    const uint64_t dest_in_page = (opts & 0x80) ? 0xfa0 : 0x40;
    c.dests.push_back(kOrigBase + static_cast<uint64_t>(kNearOffsets[(opts >> 4) & 3]) + dest_in_page);
    c.dests.push_back(((opts & 0x40) ? kOrigBase - kFarDistance : kOrigBase + kFarDistance) + dest_in_page);

    // Branch targets inside the instruction itself (jmp .) would loop in the original and
    // hit an int3 in the copy runs.
    const bool has_target = insn.flow == Flow::kJump || insn.flow == Flow::kCondJump || insn.flow == Flow::kCall;
    if (has_target && insn.target >= c.lay.orig && insn.target < c.lay.orig + insn.len) return 0;
    const RipAccess rip = rip_access(insn);
    if (rip.written && overlaps(rip.lo, rip.hi, kOrigBase - kPageSize, kOrigBase + 2 * kPageSize)) return 0;

    // Pages: data, the code around the original, what [rip + disp] touches, the branch target.
    for (size_t i = 0; i < kDataPages; ++i) add_page(c.lay, kDataBase + i * kPageSize, false);
    for (int i = -1; i < 2; ++i) add_page(c.lay, kOrigBase + static_cast<uint64_t>(i) * kPageSize, true);
    if (insn.rip_relative) {
        add_page(c.lay, page_of(insn.rip_target), false);
        add_page(c.lay, page_of(insn.rip_target) + kPageSize, false);
    }
    if (has_target) add_page(c.lay, page_of(insn.target), true);
    if (c.lay.pages.size() > static_cast<size_t>(ukp::fuzz::kMaxPages) - 2) return 0;

    // Registers.
    const uint8_t *sel = in + 16;
    const uint8_t *val = in + 32;
    for (int r = 0; r < 16; ++r) {
        const uint64_t v = load64(val + 8 * r);
        uint64_t x;
        switch (sel[r] & 3) {
        case 0:
            x = kDataBase + v % (kDataPages * kPageSize);
            break;
        case 1:
            x = v;
            break;
        case 2:
            x = static_cast<uint64_t>(static_cast<int64_t>(static_cast<int8_t>(v)));
            break;
        default:
            x = kOrigBase - kPageSize + v % (3 * kPageSize);
            break; // into the int3s
        }
        c.cpu.gpr[r] = sanitize_value(c, x);
    }
    c.lay.rsp0 = kStackBase + (load64(val + 8 * 4) & 0x3ff);
    c.cpu.gpr[4] = c.lay.rsp0;
    if (forbidden_address(c)) return 0;
    uint16_t fl;
    std::memcpy(&fl, in + 160, 2);
    c.cpu.rflags = 0x202 | (fl & kFlagsMask);
    std::memcpy(c.cpu.xmm, in + 162, sizeof(c.cpu.xmm));
    // Memory: the tail of the input at rsp, then no value that would make runs differ.
    if (size > kInputSize) {
        const size_t n = std::min(
            {size - kInputSize, kMaxStackBytes, static_cast<size_t>(kDataBase + kDataPages * kPageSize - c.lay.rsp0)});
        for (size_t i = 0; i < n; ++i) {
            const uint64_t a = c.lay.rsp0 + i;
            for (Page &p : c.lay.pages) {
                if (p.addr == page_of(a)) p.bytes[a - p.addr] = data[kInputSize + i];
            }
        }
    }
    for (Page &p : c.lay.pages) {
        if (!p.code) sanitize_bytes(c, p.bytes.get(), kPageSize);
    }

    auto spec_for = [&](RunSpec &spec, bool original, const uint8_t *copy_page0, const uint8_t *copy_page1,
                        uint64_t dest) {
        spec.npages = 0;
        for (Page &p : c.lay.pages) spec.pages[spec.npages++] = {p.addr, p.bytes.get(), p.code, true};
        if (!original) {
            spec.pages[spec.npages++] = {page_of(dest), copy_page0, true, false};
            spec.pages[spec.npages++] = {page_of(dest) + kPageSize, copy_page1, true, false};
        }
        spec.cpu = c.cpu;
        spec.cpu.rip = original ? c.lay.orig : dest;
    };

    // The copies first: no run at all when neither destination gets one.
    struct Copy {
        uint64_t dest;
        int n;
        int trap_offset;
        FaultUndos undo;
        uint8_t bytes[kMaxRelocatedSize + 16];
    };
    Copy copies[2];
    int ncopies = 0;
    for (uint64_t dest : c.dests) {
        bool clash = false;
        for (const Page &p : c.lay.pages) {
            clash = clash || overlaps(p.addr, p.addr + kPageSize, page_of(dest), page_of(dest) + 2 * kPageSize);
        }
        if (clash) continue;
        Copy &k = copies[ncopies];
        k.dest = dest;
        k.trap_offset = -2;
        std::memset(k.bytes, 0xa5, sizeof(k.bytes));
        k.n = relocate(insn, dest, k.bytes, kMaxRelocatedSize, exit, &k.trap_offset, &k.undo);
        if (naive() && k.n > 0) {
            k.n = naive_copy(insn, dest, exit, k.bytes, &k.trap_offset);
            k.undo = FaultUndos{};
        }
        if (k.n == -EOPNOTSUPP) {
            if (k.trap_offset != -1) finding("trap_offset not reset on failure", insn.bytes, insn.len);
            continue;
        }
        if (k.n <= 0) {
            char what[64];
            std::snprintf(what, sizeof(what), "relocate() returned %d", k.n);
            finding(what, insn.bytes, insn.len);
        }
        if (static_cast<size_t>(k.n) > kMaxRelocatedSize) {
            finding("output longer than kMaxRelocatedSize", insn.bytes, insn.len);
        }
        if (exit == Exit::kTrap ? (k.trap_offset < 0 || k.trap_offset >= k.n || k.bytes[k.trap_offset] != 0xcc)
                                : k.trap_offset != -1) {
            finding("bad trap_offset", insn.bytes, insn.len);
        }
        uint8_t small[kMaxRelocatedSize];
        if (!naive() && relocate(insn, dest, small, static_cast<size_t>(k.n) - 1, exit) != -ENOSPC) {
            finding("a buffer one byte short did not give -ENOSPC", insn.bytes, insn.len);
        }
        ++ncopies;
    }
    if (ncopies == 0) return 0;

    // The original run: the instruction at orig.
    auto write_orig = [&](const uint8_t *bytes) {
        for (size_t i = 0; i < insn.len; ++i) {
            const uint64_t a = c.lay.orig + i;
            for (Page &p : c.lay.pages) {
                if (p.addr == page_of(a)) p.bytes[a - p.addr] = bytes[i];
            }
        }
    };
    write_orig(insn.bytes);
    static RunSpec spec;
    static RunResult ro, rk;
    spec_for(spec, true, nullptr, nullptr, 0);
    if (!ukp::fuzz::run_in_child(spec, &ro)) return 0;
    if (ro.kind == RunResult::kSetupFailed) {
        std::fprintf(stderr, "relocate_fuzz: could not map the pages (address space in use?)\n");
        return 0;
    }
    if (ro.kind == RunResult::kTimeout) return 0;
    // Copy runs: int3s where the original was (a copy that jumps back into it stops
    // there), unless it reads its own bytes.
    uint8_t int3s[15];
    std::memset(int3s, 0xcc, sizeof(int3s));
    const bool int3s_at_orig = !overlaps(rip.lo, rip.hi, c.lay.orig, c.lay.orig + insn.len);
    if (int3s_at_orig) write_orig(int3s);

    for (int i = 0; i < ncopies; ++i) {
        const Copy &k = copies[i];
        // The copy, then (Exit::kNone) a jump to where the original falls through to.
        uint8_t code[2 * kPageSize];
        std::memset(code, 0xcc, sizeof(code));
        const size_t at = k.dest - page_of(k.dest);
        std::memcpy(code + at, k.bytes, static_cast<size_t>(k.n));
        if (exit == Exit::kNone) {
            emit_jmp(k.dest + static_cast<uint64_t>(k.n), c.lay.orig + insn.len, code + at + k.n, 14);
        }
        spec_for(spec, false, code, code + kPageSize, k.dest);
        if (!ukp::fuzz::run_in_child(spec, &rk)) return 0;
        if (rk.kind == RunResult::kTimeout || rk.kind == RunResult::kSetupFailed) continue;
        if (verbose()) {
            std::fprintf(stderr, "relocate_fuzz: insn len %d flow %d dest 0x%" PRIx64 " copy %d bytes\n", insn.len,
                         static_cast<int>(insn.flow), k.dest, k.n);
            print_result("original", ro);
            print_result("copy", rk);
        }
        char buf[160];
        const char *diff =
            compare(c, ro, rk, k.dest, k.n, exit == Exit::kTrap ? k.trap_offset : -1, k.undo, buf, sizeof(buf));
        const uint64_t krip = rk.gregs[REG_RIP];
        const bool ran_into_orig = rk.kind == RunResult::kSignal && rk.gregs[REG_TRAPNO] == 3 && krip > c.lay.orig &&
                                   krip <= c.lay.orig + insn.len;
        if (diff != nullptr && int3s_at_orig && !ran_into_orig) {
            // Memory operands (rep movs from a register, say) may read the original's
            // bytes: a difference that goes away with them in place is no finding.
            static RunResult again;
            write_orig(insn.bytes);
            spec_for(spec, false, code, code + kPageSize, k.dest);
            const bool ok = ukp::fuzz::run_in_child(spec, &again);
            write_orig(int3s);
            if (!ok) return 0;
            if (again.kind == RunResult::kTimeout || again.kind == RunResult::kSetupFailed) continue;
            diff =
                compare(c, ro, again, k.dest, k.n, exit == Exit::kTrap ? k.trap_offset : -1, k.undo, buf, sizeof(buf));
            if (diff == nullptr) continue;
        }
        if (diff != nullptr) {
            std::fprintf(stderr, "relocate_fuzz: orig 0x%" PRIx64 " dest 0x%" PRIx64 " exit %d copy:", c.lay.orig,
                         k.dest, static_cast<int>(exit));
            for (int j = 0; j < k.n; ++j) std::fprintf(stderr, " %02x", k.bytes[j]);
            std::fprintf(stderr, "\n");
            print_result("original", ro);
            print_result("copy", rk);
            finding(diff, insn.bytes, insn.len);
        }
    }
    return 0;
}
