// The detour's bytes (detour.hpp): the call to the trampoline, near and far, the word
// the trampoline's usual return skips (DETOUR_BACK_LEN in trampolines.S), and the
// context literal.
#include "arch/x86_64/detour.hpp"
#include "arch/x86_64/insn.hpp"

#include <gtest/gtest.h>

#include <cstring>

namespace {

using namespace ukp::arch;

int32_t rel32_at(const uint8_t *p) {
    int32_t v;
    std::memcpy(&v, p, sizeof v);
    return v;
}
uint64_t u64_at(const uint8_t *p) {
    uint64_t v;
    std::memcpy(&v, p, sizeof v);
    return v;
}

// A DCR of one `mov %rdi,%rax` (48 89 f8) and one `add $1,%rax` (48 83 c0 01) at `addr`.
void one_region(uint64_t addr, Insn out[2]) {
    static const uint8_t code[] = {0x48, 0x89, 0xf8, 0x48, 0x83, 0xc0, 0x01};
    ASSERT_EQ(decode(addr, code, sizeof code, &out[0]), 0);
    ASSERT_EQ(decode(addr + 3, code + 3, sizeof code - 3, &out[1]), 0);
}

struct Emitted {
    uint8_t bytes[256];
    DetourLayout layout;
};

// Checks the head every detour has (the skip over the red zone, the push of the context,
// the call, the way back over the red zone) in b[0, size), and returns where the call's
// target is read from (the rel32's end for a near call, the literal for a far one)
// through *call_target and the offset after the head through *end.
void check_head(const uint8_t *b, size_t size, uint64_t dest, uint64_t context, uint64_t *call_target, size_t *end) {
    // lea -0x80(%rsp),%rsp
    const uint8_t skip[] = {0x48, 0x8d, 0x64, 0x24, 0x80};
    ASSERT_EQ(std::memcmp(b, skip, sizeof skip), 0);
    // push context(%rip)
    ASSERT_EQ(b[5], 0xff);
    ASSERT_EQ(b[6], 0x35);
    const uint64_t literal = dest + 11 + static_cast<int64_t>(rel32_at(b + 7));
    ASSERT_LE(literal + 8, dest + size);
    EXPECT_EQ(u64_at(b + (literal - dest)), context);
    size_t at = 11;
    if (b[at] == 0xe8) {
        *call_target = dest + at + 5 + static_cast<int64_t>(rel32_at(b + at + 1));
        at += 5;
    } else {
        ASSERT_EQ(b[at], 0xff);
        ASSERT_EQ(b[at + 1], 0x15); // call *disp32(%rip)
        const uint64_t lit = dest + at + 6 + static_cast<int64_t>(rel32_at(b + at + 2));
        ASSERT_LE(lit + 8, dest + size);
        *call_target = u64_at(b + (lit - dest));
        at += 6;
    }
    const uint8_t back[] = {0x48, 0x8d, 0xa4, 0x24, 0x88, 0x00, 0x00, 0x00};
    ASSERT_EQ(std::memcmp(b + at, back, sizeof back), 0);
    *end = at + sizeof back;
}

// Checks what every detour of a region has, and returns the call's target.
void check_common(const Emitted &e, uint64_t dest, uint64_t context, uint64_t *call_target) {
    size_t end = 0;
    check_head(e.bytes, e.layout.size, dest, context, call_target, &end);
    // The trampoline returns to its return address + 8 (DETOUR_BACK_LEN) when the handlers
    // changed nothing: that must be the relocated copy, right after `lea 0x88(%rsp),%rsp`.
    EXPECT_EQ(e.layout.copy, end);
    // The copy: the two instructions as they were (no rip-relative operand), then the jump back.
    EXPECT_EQ(e.bytes[e.layout.copy], 0x48);
    EXPECT_EQ(e.bytes[e.layout.copy + 1], 0x89);
}

TEST(Detour, CallsTheTrampolineNearByRel32) {
    const auto trampoline = reinterpret_cast<uint64_t>(&ukp_optprobe_trampoline);
    const uint64_t dest = trampoline + (1ull << 20);
    const uint64_t probe = dest + 4096;
    Insn dcr[2];
    one_region(probe, dcr);
    Emitted e;
    ASSERT_EQ(emit_detour(dest, 0x1122334455667788ull, dcr, 2, e.bytes, sizeof e.bytes, &e.layout), 0);
    uint64_t target = 0;
    check_common(e, dest, 0x1122334455667788ull, &target);
    EXPECT_EQ(e.bytes[11], 0xe8);
    EXPECT_EQ(target, trampoline);
    EXPECT_EQ(e.layout.dcr_len, 7);
}

TEST(Detour, CallsAFarTrampolineThroughALiteral) {
    const auto trampoline = reinterpret_cast<uint64_t>(&ukp_optprobe_trampoline);
    // 64 GiB away: out of rel32 reach, as a PIE program's code is from a library's.
    const uint64_t dest = (trampoline + (64ull << 30)) & ~uint64_t{0xfff};
    const uint64_t probe = dest + 4096;
    Insn dcr[2];
    one_region(probe, dcr);
    Emitted e;
    ASSERT_EQ(emit_detour(dest, 42, dcr, 2, e.bytes, sizeof e.bytes, &e.layout), 0);
    uint64_t target = 0;
    check_common(e, dest, 42, &target);
    EXPECT_EQ(e.bytes[11], 0xff);
    EXPECT_EQ(target, trampoline);
}

TEST(Detour, TooSmallABufferIsEnospc) {
    const auto trampoline = reinterpret_cast<uint64_t>(&ukp_optprobe_trampoline);
    const uint64_t dest = (trampoline + (64ull << 30)) & ~uint64_t{0xfff};
    Insn dcr[2];
    one_region(dest + 4096, dcr);
    Emitted e;
    ASSERT_EQ(emit_detour(dest, 42, dcr, 2, e.bytes, sizeof e.bytes, &e.layout), 0);
    // Every size short of what it took fails cleanly.
    for (size_t cap = 0; cap < e.layout.size; ++cap) {
        DetourLayout l;
        EXPECT_EQ(emit_detour(dest, 42, dcr, 2, e.bytes, cap, &l), -ENOSPC) << cap;
    }
}

// A kretprobe's detour: the same head, calling ukp_kret_entry_trampoline, then a jump to
// the address the trampoline left 8 bytes below the program's stack pointer.
TEST(Detour, TheKretprobeDetourCallsItsTrampolineThenJumpsWhereItChose) {
    const auto trampoline = reinterpret_cast<uint64_t>(&ukp_kret_entry_trampoline);
    for (const uint64_t dest : {trampoline + (1ull << 20), (trampoline + (64ull << 30)) & ~uint64_t{0xfff}}) {
        uint8_t b[128];
        size_t back = 0;
        const int size = emit_kret_detour(dest, 0x1122334455667788ull, b, sizeof b, &back);
        ASSERT_GT(size, 0);
        uint64_t target = 0;
        size_t end = 0;
        check_head(b, static_cast<size_t>(size), dest, 0x1122334455667788ull, &target, &end);
        EXPECT_EQ(target, trampoline);
        EXPECT_EQ(back, end - 8) << "the call's return site: `lea 0x88(%rsp),%rsp` follows";
        EXPECT_EQ(b[back - (b[11] == 0xe8 ? 5 : 6)], b[11]) << "the call ends there";
        EXPECT_EQ(b[11], dest < trampoline + (1ull << 30) ? 0xe8 : 0xff) << "near, then far";
        const uint8_t jmp[] = {0xff, 0x64, 0x24, 0xf8}; // jmp *-8(%rsp)
        EXPECT_EQ(std::memcmp(b + end, jmp, sizeof jmp), 0);
        EXPECT_EQ(size % 8, 0) << "ends with its literals";
        for (size_t cap = 0; cap < static_cast<size_t>(size); ++cap)
            EXPECT_EQ(emit_kret_detour(dest, 42, b, cap), -ENOSPC) << cap;
    }
}

} // namespace
