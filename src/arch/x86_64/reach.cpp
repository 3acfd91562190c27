#include "arch/x86_64/reach.hpp"

#include "arch/x86_64/insn.hpp"

#include <algorithm>
#include <set>
#include <unordered_set>

namespace ukp::arch {

namespace {

constexpr uint64_t kMaxFunctionBytes = 1u << 20;

bool is_start(const ObjectRefs &refs, uint64_t addr) {
    return std::binary_search(refs.starts.begin(), refs.starts.end(), addr);
}

// The start of the function holding addr, or 0 if addr lies before every start.
uint64_t start_of(const ObjectRefs &refs, uint64_t addr) {
    auto it = std::upper_bound(refs.starts.begin(), refs.starts.end(), addr);
    return it == refs.starts.begin() ? 0 : *std::prev(it);
}

// Decodes the instruction at pc from the original code; false if it is unreadable or no
// instruction.
bool decode_at(const ReadFn &read_code, uint64_t pc, Insn *out) {
    uint8_t buf[15];
    for (size_t n = sizeof buf; n > 0; --n)
        if (read_code(pc, buf, n)) return decode(pc, buf, n, out) == 0;
    return false;
}

} // namespace

bool Reach::contains(uint64_t addr) const {
    auto it = std::upper_bound(code.begin(), code.end(), addr, [](uint64_t a, const CodeRange &r) { return a < r.lo; });
    return it != code.begin() && addr < std::prev(it)->hi;
}

Reach reachable_code(const ObjectRefs &refs, const std::vector<uint64_t> &entries, const std::vector<uint64_t> &stops,
                     const ReadFn &read_code, const ReadFn &read_data, int max_depth) {
    Reach out;
    std::unordered_set<uint64_t> seen;
    std::set<uint64_t> swept;
    // Breadth first by depth, so that code is taken in at the least depth it has.
    std::vector<uint64_t> work, deeper;
    int depth = 0;
    const auto follow_to = [&](uint64_t target, std::vector<uint64_t> &list) {
        if (std::find(stops.begin(), stops.end(), target) == stops.end() && seen.count(target) == 0)
            list.push_back(target);
    };
    const auto follow = [&](uint64_t target) { follow_to(target, work); };
    const auto enter = [&](uint64_t target) {
        if (max_depth < 0 || depth < max_depth) follow_to(target, max_depth < 0 ? work : deeper);
    };
    // An indirect jump that reads no pointer (a jump table): every instruction of its
    // function, as a linear sweep finds them, is a place to go on from.
    const auto sweep = [&](uint64_t pc) {
        const uint64_t lo = start_of(refs, pc), hi = refs.next_start(pc);
        if (lo == 0 || hi == ~0ull || hi - lo > kMaxFunctionBytes || !swept.insert(lo).second) return;
        for (uint64_t at = lo; at < hi;) {
            Insn in;
            if (!decode_at(read_code, at, &in)) {
                ++at;
                continue;
            }
            follow(at);
            at += in.len;
        }
    };
    for (uint64_t e : entries) follow(e);
    for (;;) {
        if (work.empty()) {
            if (deeper.empty()) break;
            work.swap(deeper);
            ++depth;
        }
        uint64_t pc = work.back();
        work.pop_back();
        for (bool more = true; more && seen.insert(pc).second;) {
            Insn in;
            if (!decode_at(read_code, pc, &in)) break;
            out.code.push_back({pc, pc + in.len});
            switch (in.flow) {
            case Flow::kJump:
                follow(in.target);
                more = false;
                break;
            case Flow::kCondJump:
                follow(in.target);
                break;
            case Flow::kCall:
                enter(in.target);
                break;
            case Flow::kIndirectJump:
            case Flow::kIndirectCall:
                if (in.rip_relative) {
                    uint64_t pointer = 0;
                    if (read_data(in.rip_target, &pointer, sizeof pointer) && is_start(refs, pointer)) enter(pointer);
                } else if (in.flow == Flow::kIndirectJump) {
                    sweep(pc);
                }
                more = in.flow == Flow::kIndirectCall;
                break;
            case Flow::kRet:
            case Flow::kUnsupported:
                more = false;
                break;
            default:
                if (in.zi.mnemonic == ZYDIS_MNEMONIC_LEA && in.rip_relative && is_start(refs, in.rip_target))
                    enter(in.rip_target);
                break;
            }
            pc += in.len;
        }
    }
    std::sort(out.code.begin(), out.code.end(), [](const CodeRange &a, const CodeRange &b) { return a.lo < b.lo; });
    std::vector<CodeRange> merged;
    for (const CodeRange &r : out.code) {
        if (!merged.empty() && r.lo <= merged.back().hi)
            merged.back().hi = std::max(merged.back().hi, r.hi);
        else
            merged.push_back(r);
    }
    out.code = std::move(merged);
    return out;
}

} // namespace ukp::arch
