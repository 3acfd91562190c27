#include "arch/x86_64/detour.hpp"

#include <cerrno>
#include <cstring>

namespace ukp::arch {

namespace {
// lea -0x80(%rsp),%rsp
constexpr uint8_t kSkipRedZone[] = {0x48, 0x8d, 0x64, 0x24, 0x80};
constexpr size_t kPushLen = 6; // push qword ptr [rip + disp32]
// lea 0x88(%rsp),%rsp: back over the context word and the red zone
constexpr uint8_t kBackOverRedZone[] = {0x48, 0x8d, 0xa4, 0x24, 0x88, 0x00, 0x00, 0x00};
constexpr size_t kFarCallLen = 6; // call qword ptr [rip + disp32]

void put_rip_disp(uint8_t *out, size_t insn_at, size_t insn_len, size_t literal_at) {
    const auto disp = static_cast<int32_t>(literal_at - (insn_at + insn_len));
    std::memcpy(out + insn_at + insn_len - sizeof disp, &disp, sizeof disp);
}

// What both kinds of detour begin with: up to and including the way back over the red
// zone, the literals' references left for put_literals.
struct Head {
    size_t push_at = 0; // push context(%rip)
    size_t call_at = 0; // call trampoline, near or through a literal
    bool near = false;
    uint64_t trampoline = 0;
    size_t end = 0; // after `lea 0x88(%rsp),%rsp`
};

int emit_head(uint64_t dest, void (*trampoline_fn)(), uint8_t *out, size_t cap, Head *h) {
    size_t at = sizeof kSkipRedZone;
    if (cap < at + kPushLen) return -ENOSPC;
    std::memcpy(out, kSkipRedZone, at);
    h->push_at = at;
    at += kPushLen;
    // A call, so that the trampoline's usual way back is a `ret` the CPU predicts (the
    // return stack stays paired); far, through a literal placed after the context.
    h->trampoline = reinterpret_cast<uint64_t>(trampoline_fn);
    const int64_t rel = static_cast<int64_t>(h->trampoline - (dest + at + 5));
    h->near = rel >= INT32_MIN && rel <= INT32_MAX;
    h->call_at = at;
    const size_t call_len = h->near ? 5 : kFarCallLen;
    if (cap < at + call_len + sizeof kBackOverRedZone) return -ENOSPC;
    if (h->near) {
        out[at] = 0xe8;
        const auto rel32 = static_cast<int32_t>(rel);
        std::memcpy(out + at + 1, &rel32, sizeof rel32);
    } else {
        out[at] = 0xff;
        out[at + 1] = 0x15;
    }
    at += call_len;
    std::memcpy(out + at, kBackOverRedZone, sizeof kBackOverRedZone);
    h->end = at + sizeof kBackOverRedZone;
    return 0;
}

// Pads the code that ends at code_end with int3 to 8 bytes, then places the context (and
// the trampoline's address for a far call) and points the head's instructions at them.
// The size emitted, or -ENOSPC.
int put_literals(const Head &h, uint64_t context, size_t code_end, uint8_t *out, size_t cap) {
    size_t at = (code_end + 7) & ~size_t{7};
    if (cap < at + sizeof context + (h.near ? 0 : sizeof h.trampoline)) return -ENOSPC;
    std::memset(out + code_end, 0xcc, at - code_end);
    out[h.push_at] = 0xff;
    out[h.push_at + 1] = 0x35;
    put_rip_disp(out, h.push_at, kPushLen, at);
    std::memcpy(out + at, &context, sizeof context);
    at += sizeof context;
    if (!h.near) {
        put_rip_disp(out, h.call_at, kFarCallLen, at);
        std::memcpy(out + at, &h.trampoline, sizeof h.trampoline);
        at += sizeof h.trampoline;
    }
    return static_cast<int>(at);
}
} // namespace

bool encode_jmp_rel32(uint64_t from, uint64_t to, uint8_t out[5]) {
    const int64_t rel = static_cast<int64_t>(to - (from + 5));
    if (rel < INT32_MIN || rel > INT32_MAX) return false;
    const auto rel32 = static_cast<int32_t>(rel);
    out[0] = 0xe9;
    std::memcpy(out + 1, &rel32, sizeof rel32);
    return true;
}

int emit_detour(uint64_t dest, uint64_t context, const Insn *dcr, size_t n, uint8_t *out, size_t cap,
                DetourLayout *layout) {
    if (n == 0 || n > kMaxDcrInsns) return -EINVAL;
    DetourLayout l;
    const uint64_t probe = dcr[0].addr;
    Head h;
    if (int err = emit_head(dest, ukp_optprobe_trampoline, out, cap, &h); err != 0) return err;
    size_t at = h.end;
    l.copy = static_cast<uint16_t>(at);
    int r = 0;
    uint64_t next = probe;
    for (size_t i = 0; i < n; ++i) {
        if (dcr[i].addr != next) return -EINVAL;
        if (dcr[i].flow == Flow::kUnsupported) return -EOPNOTSUPP;
        l.orig_offset[i] = static_cast<uint8_t>(next - probe);
        l.copy_offset[i] = static_cast<uint16_t>(at);
        r = relocate(dcr[i], dest + at, out + at, cap - at, Exit::kNone, nullptr, &l.undo[i]);
        if (r < 0) return r;
        at += static_cast<size_t>(r);
        next += dcr[i].len;
    }
    // Fall-through and untaken branches go back after the region (a relocated call
    // pushes the original return address, which is there too).
    r = emit_jmp(dest + at, next, out + at, cap - at);
    if (r < 0) return r;
    r = put_literals(h, context, at + static_cast<size_t>(r), out, cap);
    if (r < 0) return r;
    l.size = static_cast<uint16_t>(r);
    l.count = static_cast<uint8_t>(n);
    l.dcr_len = static_cast<uint8_t>(next - probe);
    *layout = l;
    return 0;
}

int emit_kret_detour(uint64_t dest, uint64_t context, uint8_t *out, size_t cap, size_t *back) {
    // jmp *-8(%rsp): to the address the trampoline left in the red zone, dead at a
    // function's entry, and out of a signal frame's way (the kernel skips 128 bytes).
    static constexpr uint8_t kJmpLeft[] = {0xff, 0x64, 0x24, 0xf8};
    Head h;
    if (int err = emit_head(dest, ukp_kret_entry_trampoline, out, cap, &h); err != 0) return err;
    if (cap < h.end + sizeof kJmpLeft) return -ENOSPC;
    std::memcpy(out + h.end, kJmpLeft, sizeof kJmpLeft);
    if (back != nullptr) *back = h.end - sizeof kBackOverRedZone;
    return put_literals(h, context, h.end + sizeof kJmpLeft, out, cap);
}

uint64_t detour_copy_of(const DetourLayout &layout, uint64_t dest, uint64_t probe_addr, uint64_t orig) {
    for (size_t i = 0; i < layout.count; ++i)
        if (probe_addr + layout.orig_offset[i] == orig) return dest + layout.copy_offset[i];
    return 0;
}

const FaultUndo *detour_fault_undo(const DetourLayout &layout, uint64_t dest, uint64_t probe_addr, uint64_t ip,
                                   uint64_t *orig) {
    *orig = 0;
    // The last copy that starts at or before ip: the copies follow one another.
    for (size_t i = layout.count; i-- > 0;) {
        const uint64_t start = dest + layout.copy_offset[i];
        if (ip < start) continue;
        const FaultUndo *u = layout.undo[i].find(ip - start);
        if (ip == start || u != nullptr) *orig = probe_addr + layout.orig_offset[i];
        return u;
    }
    return nullptr;
}

uint64_t detour_orig_of(const DetourLayout &layout, uint64_t dest, uint64_t probe_addr, uint64_t copy_addr) {
    for (size_t i = 0; i < layout.count; ++i)
        if (dest + layout.copy_offset[i] == copy_addr) return probe_addr + layout.orig_offset[i];
    return 0;
}

} // namespace ukp::arch
