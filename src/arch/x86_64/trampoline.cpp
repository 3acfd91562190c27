#include "arch/x86_64/trampoline.hpp"

#include "arch/x86_64/insn.hpp"

#include <cerrno>
#include <cstring>

namespace ukp::arch {

void emit_ret_stub(uint64_t literal, uint64_t trampoline, uint8_t *out) {
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
    std::memset(out, 0xcc, kRetStubSize);
    std::memcpy(out, kCode, sizeof kCode);
    std::memcpy(out + 48, &literal, sizeof literal);
    std::memcpy(out + 56, &trampoline, sizeof trampoline);
}

int emit_post_exit(uint64_t dest, uint64_t context, uint64_t trampoline, uint8_t *out, size_t cap) {
    // lea -0x80(%rsp),%rsp: steps over the red zone without touching the flags.
    static constexpr uint8_t kSkipRedZone[] = {0x48, 0x8d, 0x64, 0x24, 0x80};
    constexpr size_t kPushLen = 6; // push qword ptr [rip + disp32]
    size_t at = sizeof kSkipRedZone;
    if (cap < at + kPushLen) return -ENOSPC;
    std::memcpy(out, kSkipRedZone, at);
    const size_t push_at = at;
    at += kPushLen;
    const int jmp = emit_jmp(dest + at, trampoline, out + at, cap - at);
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
