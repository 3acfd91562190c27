#include "platform/vector_state.hpp"

#include <cpuid.h>

extern "C" {
__attribute__((visibility("hidden"))) uint64_t ukp_xsave_size = 0;
__attribute__((visibility("hidden"))) uint64_t ukp_xsave_mask = 0;
__attribute__((visibility("hidden"))) uint8_t ukp_fast_ext = 0;
}

namespace ukp::platform {

uint64_t xsave_components(uint64_t xcr0) {
    // PKRU (9): compiled code does not write it. AMX's tile configuration and data (17,
    // 18): compiled code has no use for the tiles, and a process that did not ask for
    // them (arch_prctl(ARCH_REQ_XCOMP_PERM)) cannot touch them.
    constexpr uint64_t kLeftAlone = (1ull << 9) | (1ull << 17) | (1ull << 18);
    return xcr0 & ~kLeftAlone;
}

} // namespace ukp::platform

namespace {

__attribute__((constructor)) void measure_extended_state() {
    unsigned eax, ebx, ecx, edx;
    if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) == 0 || (ecx & bit_OSXSAVE) == 0) return;
    if (__get_cpuid_count(0xd, 0, &eax, &ebx, &ecx, &edx) == 0 || ebx < 576) return;
    // XCR0: the state components the OS enabled. XSAVE saves those of the mask, each at
    // its offset in the standard layout (leaf 0xD, sub-leaf i: ebx its offset, eax its
    // size), after the legacy area and the header (576 bytes). With all of XCR0 (leaf 0xD,
    // sub-leaf 0's ebx) the area of a CPU with AMX is 11 KB: 11 KB of the program's stack
    // at every hit of a probe, where 2.7 KB hold AVX-512.
    uint32_t xcr0_lo = 0, xcr0_hi = 0;
    asm volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
    const uint64_t xcr0 = (uint64_t{xcr0_hi} << 32) | xcr0_lo;
    const uint64_t mask = ukp::platform::xsave_components(xcr0);
    uint64_t size = 576;
    for (unsigned i = 2; i < 64; ++i) {
        if ((mask >> i & 1) == 0) continue;
        if (__get_cpuid_count(0xd, i, &eax, &ebx, &ecx, &edx) == 0 || eax == 0) return; // FXSAVE then
        if (uint64_t end = uint64_t{ebx} + eax; end > size) size = end;
    }
    ukp_xsave_mask = mask;
    ukp_xsave_size = (size + 63) & ~uint64_t{63};
    // Beyond x87 (0), SSE (1), AVX (2) and PKRU (9), C code may use AVX-512 registers
    // (glibc's string functions do): then only XSAVE saves enough.
    if (xcr0_hi == 0 && (xcr0_lo & ~0x207u) == 0 && (xcr0_lo & 2u) != 0) ukp_fast_ext = (xcr0_lo & 4u) ? 2 : 1;
}

} // namespace
