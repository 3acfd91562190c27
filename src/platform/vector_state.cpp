#include "platform/vector_state.hpp"

#include <cpuid.h>

extern "C" {
__attribute__((visibility("hidden"))) uint64_t ukp_xsave_size = 0;
__attribute__((visibility("hidden"))) uint8_t ukp_fast_ext = 0;
}

namespace {

__attribute__((constructor)) void measure_extended_state() {
    unsigned eax, ebx, ecx, edx;
    if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) == 0 || (ecx & bit_OSXSAVE) == 0) return;
    // Leaf 0xD, sub-leaf 0: ebx = size of the XSAVE area for the features in XCR0.
    if (__get_cpuid_count(0xd, 0, &eax, &ebx, &ecx, &edx) == 0 || ebx < 576) return;
    ukp_xsave_size = (ebx + 63) & ~63u;
    // XCR0: the state components the OS enabled. Beyond x87 (0), SSE (1), AVX (2) and
    // PKRU (9, which compiled code does not write), C code may use AVX-512 or AMX
    // registers (glibc's string functions do): then only XSAVE saves enough.
    uint32_t xcr0_lo = 0, xcr0_hi = 0;
    asm volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
    if (xcr0_hi == 0 && (xcr0_lo & ~0x207u) == 0 && (xcr0_lo & 2u) != 0) ukp_fast_ext = (xcr0_lo & 4u) ? 2 : 1;
}

} // namespace
