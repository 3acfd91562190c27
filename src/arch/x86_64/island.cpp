// plan_island(): island.hpp.
#include "arch/x86_64/island.hpp"

#include "arch/x86_64/insn.hpp"

#include <algorithm>

namespace ukp::arch {

bool plan_island(const OptimizeCheck &c, uint64_t addr, const ObjectRefs &refs, const ReadFn &read, Island *out) {
    if (c.reasons != 1u << static_cast<unsigned>(Reason::kJumpIntoRegion) || c.entered_by.size() != 1) return false;
    const auto [target, source] = c.entered_by.front();
    if (target == addr || std::find(c.insns.begin(), c.insns.end(), target) == c.insns.end()) return false;
    const uint64_t region_end = addr + c.dcr_len;
    if (source + 2 > addr && source < region_end) return false;
    uint8_t jmp[2];
    constexpr uint8_t kJmpRel8 = 0xeb;
    if (!read(source, jmp, sizeof jmp) || jmp[0] != kJmpRel8) return false;
    if (source + 2 + static_cast<uint64_t>(static_cast<int64_t>(static_cast<int8_t>(jmp[1]))) != target) return false;
    // The padding after the jmp: whole nops (or int3s) covering the island's bytes.
    const uint64_t at = source + 2;
    uint8_t pad[16];
    if (!read(at, pad, sizeof pad)) return false;
    for (size_t off = 0; off < kIslandSize;) {
        Insn in;
        if (decode(at + off, pad + off, sizeof pad - off, &in) != 0) return false;
        if (in.zi.mnemonic != ZYDIS_MNEMONIC_NOP && in.zi.mnemonic != ZYDIS_MNEMONIC_INT3) return false;
        off += in.len;
    }
    if (refs.next_start(source) < at + kIslandSize || refs.any_in(at - 1, at + kIslandSize)) return false;
    out->source = source;
    out->target = target;
    out->at = at;
    out->source_disp = jmp[1];
    out->island_disp = 0; // the island starts where the jmp ends
    std::copy(pad, pad + kIslandSize, out->orig);
    return true;
}

} // namespace ukp::arch
