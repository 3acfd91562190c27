// What an optimized probe's jump leads to, read from the code: for tests that check which
// detour (arch/x86_64/detour.hpp) a point's probes were given.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>

// The trampoline the detour that fn's first instruction jumps to calls (detour.hpp's
// layout: lea, push, then the call, near or through a literal), or 0 if fn does not start
// with a jmp.
inline uint64_t jumped_trampoline(const void *fn) {
    const auto *p = static_cast<const uint8_t *>(fn);
    if (p[0] != 0xe9) return 0;
    int32_t rel;
    std::memcpy(&rel, p + 1, sizeof rel);
    const auto *d = p + 5 + rel;
    std::memcpy(&rel, d + 12, sizeof rel);
    if (d[11] == 0xe8) return reinterpret_cast<uint64_t>(d + 16 + rel);
    EXPECT_EQ(d[11], 0xff) << "call *disp32(%rip)";
    uint64_t target;
    std::memcpy(&target, d + 17 + rel, sizeof target);
    return target;
}
