#include "arch/x86_64/trampoline.hpp"

#include "arch/x86_64/insn.hpp"

#include <cerrno>
#include <cpuid.h>
#include <cstring>

// Bytes XSAVE needs for the state components the OS enabled, or 0 where XSAVE is not
// enabled (the trampolines then use FXSAVE). Read by the trampolines' assembly.
extern "C" {
__attribute__((visibility("hidden"))) uint64_t ukp_xsave_size = 0;
// How the trampolines save vector state around C code: 0 XSAVE/FXSAVE everything, 1 xmm0-15
// and MXCSR by hand (no AVX), 2 ymm0-15 and MXCSR by hand (XCR0 has nothing beyond AVX).
__attribute__((visibility("hidden"))) uint8_t ukp_fast_ext = 0;
__attribute__((visibility("hidden"))) uint8_t ukp_gpr_dispatch = 0;
__attribute__((visibility("hidden"))) uint8_t ukp_gpr_ret_dispatch = 0;
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

namespace ukp::arch {

void emit_ret_stub(uint64_t literal, uint8_t *out) {
    // push 33(%rip) pushes the first literal (at +48), jmp *35(%rip) goes through the
    // second (at +56), so the stub works at any distance from the trampoline. No `call`
    // there: the trampoline leaves by a jump (or by `ret` after a call from the stub's
    // start), and a call would leave its return address on the CPU's return stack, to be
    // mispredicted by the caller's own `ret`.
    static constexpr uint8_t kCode[] = {
        0x48, 0x8d, 0x64, 0x24, 0x08,       // lea 8(%rsp),%rsp
        0xff, 0x54, 0x24, 0xe8,             // call *-24(%rsp)
        0xff, 0x35, 0x21, 0x00, 0x00, 0x00, // push 0x21(%rip)
        0xff, 0x25, 0x23, 0x00, 0x00, 0x00, // jmp *0x23(%rip)
    };
    static_assert(kRetStubSize == 64 && kRetStubCalling == 5 && kRetStubEntry == 9 && kRetStubPushed == 15 &&
                  sizeof kCode == 21);
    const auto trampoline = reinterpret_cast<uint64_t>(&ukp_kretprobe_trampoline);
    std::memset(out, 0xcc, kRetStubSize);
    std::memcpy(out, kCode, sizeof kCode);
    std::memcpy(out + 48, &literal, sizeof literal);
    std::memcpy(out + 56, &trampoline, sizeof trampoline);
}

int emit_post_exit(uint64_t dest, uint64_t context, uint8_t *out, size_t cap) {
    // lea -0x80(%rsp),%rsp: steps over the red zone without touching the flags.
    static constexpr uint8_t kSkipRedZone[] = {0x48, 0x8d, 0x64, 0x24, 0x80};
    constexpr size_t kPushLen = 6; // push qword ptr [rip + disp32]
    size_t at = sizeof kSkipRedZone;
    if (cap < at + kPushLen) return -ENOSPC;
    std::memcpy(out, kSkipRedZone, at);
    const size_t push_at = at;
    at += kPushLen;
    const int jmp = emit_jmp(dest + at, reinterpret_cast<uint64_t>(&ukp_post_trampoline), out + at, cap - at);
    if (jmp < 0) return jmp;
    at += static_cast<size_t>(jmp);
    if (cap < at + sizeof context) return -ENOSPC;
    // The pushed value is a literal after the code, addressed relative to the push's end.
    const auto disp = static_cast<int32_t>(at - (push_at + kPushLen));
    out[push_at] = 0xff;
    out[push_at + 1] = 0x35;
    std::memcpy(out + push_at + 2, &disp, sizeof disp);
    std::memcpy(out + at, &context, sizeof context);
    return static_cast<int>(at + sizeof context);
}

} // namespace ukp::arch
