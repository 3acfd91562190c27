#include "arch/x86_64/reach.hpp"

#include "arch/x86_64/insn.hpp"

#include <algorithm>
#include <set>

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

} // namespace

bool Reach::contains(uint64_t addr) const {
    auto it = std::upper_bound(functions.begin(), functions.end(), addr,
                               [](uint64_t a, const FunctionRange &f) { return a < f.lo; });
    return it != functions.begin() && addr < std::prev(it)->hi;
}

Reach reachable_functions(const ObjectRefs &refs, const std::vector<uint64_t> &entries,
                          const std::vector<uint64_t> &stops, const ReadFn &read_code,
                          const ReadFn &read_data, size_t limit) {
    Reach out;
    std::set<uint64_t> seen;
    std::vector<uint64_t> work;
    const auto reach = [&](uint64_t addr) {
        const uint64_t start = start_of(refs, addr);
        if (start == 0 || std::find(stops.begin(), stops.end(), start) != stops.end()) return;
        if (seen.insert(start).second) work.push_back(start);
    };
    for (uint64_t e : entries) reach(e);
    std::vector<uint8_t> code;
    while (!work.empty()) {
        if (out.functions.size() >= limit) {
            out.complete = false;
            break;
        }
        const uint64_t lo = work.back();
        work.pop_back();
        const uint64_t next = refs.next_start(lo);
        if (next == ~0ull || next - lo > kMaxFunctionBytes) continue;
        out.functions.push_back({lo, next});
        code.resize(next - lo);
        if (!read_code(lo, code.data(), code.size())) continue;
        for (uint64_t pc = lo; pc < next;) {
            Insn in;
            if (decode(pc, code.data() + (pc - lo), next - pc, &in) != 0) {
                ++pc; // data or padding: resynchronize
                continue;
            }
            switch (in.flow) {
            case Flow::kJump:
            case Flow::kCondJump:
            case Flow::kCall:
                if (in.target < lo || in.target >= next) reach(in.target);
                break;
            case Flow::kIndirectJump:
            case Flow::kIndirectCall:
                if (in.rip_relative) {
                    uint64_t pointer = 0;
                    if (read_data(in.rip_target, &pointer, sizeof pointer) && is_start(refs, pointer))
                        reach(pointer);
                }
                break;
            default:
                if (in.zi.mnemonic == ZYDIS_MNEMONIC_LEA && in.rip_relative && is_start(refs, in.rip_target))
                    reach(in.rip_target);
                break;
            }
            pc += in.len;
        }
    }
    std::sort(out.functions.begin(), out.functions.end(),
              [](const FunctionRange &a, const FunctionRange &b) { return a.lo < b.lo; });
    return out;
}

} // namespace ukp::arch
