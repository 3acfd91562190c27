// check_region(): whether a jump may replace the instructions at an address.
#include "arch/x86_64/region.hpp"

#include "arch/x86_64/insn.hpp"

#include <algorithm>
#include <cerrno>
#include <new>

namespace ukp::arch {
namespace {

constexpr size_t kJmpRel32Size = 5;

// A destination near addr (same 2 GiB) and one far from it (1 TiB away) for relocate().
uint64_t near_dest(uint64_t addr) { return addr < (1ull << 46) ? addr + 0x10000 : addr - 0x10000; }
uint64_t far_dest(uint64_t addr) { return addr < (1ull << 46) ? addr + (1ull << 40) : addr - (1ull << 40); }

bool any_in(const std::vector<uint64_t> &sorted, uint64_t lo, uint64_t hi) {
    auto it = std::upper_bound(sorted.begin(), sorted.end(), lo);
    return it != sorted.end() && *it < hi;
}

} // namespace

const char *reason_name(Reason r) {
    switch (r) {
    case Reason::kOk:
        return "ok";
    case Reason::kNotInstructionBoundary:
        return "not-instruction-boundary";
    case Reason::kRegionPastFunctionEnd:
        return "region-past-function-end";
    case Reason::kNotRelocatable:
        return "not-relocatable";
    case Reason::kJumpIntoRegion:
        return "jump-into-region";
    case Reason::kIndirectJump:
        return "indirect-jump";
    case Reason::kCallInRegion:
        return "call-in-region";
    case Reason::kCrossesControlFlowEnd:
        return "crosses-control-flow-end";
    case Reason::kDecodeFailed:
        return "decode-failed";
    case Reason::kTooSmallFunction:
        return "too-small-function";
    case Reason::kCount_:
        break;
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
        if (!f.contains(addr) || !f.is_boundary(addr)) {
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
            if (in.flow == Flow::kUnsupported || relocate(in, near_dest(in.addr), buf, sizeof(buf), Exit::kNone) < 0 ||
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

} // namespace ukp::arch
