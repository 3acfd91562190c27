// Tests of the x86-64 decoder and relocator (src/arch/x86_64/insn.hpp). Every test name
// contains "relocator" (ctest -R relocator):
//  - relocator/RelocateBytes.*: input bytes -> expected output bytes, as a table.
//  - relocator/Decode.*: flow classification, branch and RIP-relative targets.
//  - relocator.*: emit_jmp, error paths, invalid input, a fuzzed size/contract check.
//  - relocator_exec.*: relocated copies actually run, near (<2 GiB) and far (>4 GiB)
//    from the original code, each in a forked child so a bad copy reports a signal.
#include "arch/x86_64/detour.hpp"
#include "arch/x86_64/insn.hpp"
#include "arch/x86_64/regs.hpp"

#include <gtest/gtest.h>

#include "test_hex.h"
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <ucontext.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iterator>
#include <random>
#include <string>
#include <vector>

namespace {

using ukp::arch::decode;
using ukp::arch::emit_jmp;
using ukp::arch::Exit;
using ukp::arch::Flow;
using ukp::arch::Insn;
using ukp::arch::kMaxRelocatedSize;
using ukp::arch::relocate;

// The run-time addresses of the table: near ones 4 KiB apart, far ones ~127 TiB apart.
constexpr uint64_t kNearOrig = 0x1000'0000;
constexpr uint64_t kNearDest = 0x1000'1000;
constexpr uint64_t kFarOrig = 0x7f00'0000'1000;
constexpr uint64_t kFarDest = 0x1000'0000;

// ---------------------------------------------------------------------------------------
// RelocateBytes
// ---------------------------------------------------------------------------------------

struct RelocCase {
    const char *name;     // test name suffix
    const char *input;    // the original instruction
    uint64_t orig;        // where it lives
    uint64_t dest;        // where the copy goes
    Exit exit;            // requested exit
    const char *expected; // emitted bytes (code | literal pool); unused if error != 0
    int error = 0;        // expected negative errno, or 0
    int trap_offset = -1; // expected *trap_offset
};

// Displacements below: "0x100(%rip)" at kNearOrig seen from kNearDest is 0x100 - 0x1000
// = -0xf00 (00 f1 ff ff). Far targets are 0x7f00'0000'1xxx and appear as literals.
const RelocCase kRelocCases[] = {
    // --- ordinary instructions: copied, then the exit ---
    {"PlainExitNone", "48 89 e5", kNearOrig, kNearDest, Exit::kNone, "48 89 e5"}, // mov %rsp,%rbp
    {"PlainJumpBackNear", "48 89 e5", kNearOrig, kNearDest, Exit::kJumpBack,
     "48 89 e5 | e9 fb ef ff ff"}, // jmp 0x10000003 from 0x10001008
    {"PlainJumpBackFar", "48 89 e5", kFarOrig, kFarDest, Exit::kJumpBack,
     "48 89 e5 | ff 25 00 00 00 00 | 03 10 00 00 00 7f 00 00"}, // jmp *lit; lit = next
    {"PlainTrap", "48 89 e5", kNearOrig, kNearDest, Exit::kTrap, "48 89 e5 | cc", 0, 3},
    {"Ud2Copied", "0f 0b", kNearOrig, kNearDest, Exit::kNone, "0f 0b"},
    {"Int80Copied", "cd 80", kNearOrig, kNearDest, Exit::kTrap, "cd 80 | cc", 0, 2},
    {"Endbr64Copied", "f3 0f 1e fa", kNearOrig, kNearDest, Exit::kNone, "f3 0f 1e fa"},

    // --- RIP-relative data operands, near: disp32 re-aimed ---
    {"MovLoadRipNear", "48 8b 05 00 01 00 00", kNearOrig, kNearDest, Exit::kNone,
     "48 8b 05 00 f1 ff ff"}, // mov 0x100(%rip),%rax
    {"MovStoreRipNear", "48 89 05 00 01 00 00", kNearOrig, kNearDest, Exit::kNone,
     "48 89 05 00 f1 ff ff"}, // mov %rax,0x100(%rip)
    {"CmpImmRipNear", "83 3d 00 01 00 00 05", kNearOrig, kNearDest, Exit::kNone,
     "83 3d 00 f1 ff ff 05"}, // cmpl $5,0x100(%rip): imm8 follows disp, rip = end
    {"LeaRipNear", "48 8d 05 00 01 00 00", kNearOrig, kNearDest, Exit::kNone,
     "48 8d 05 00 f1 ff ff"}, // lea 0x100(%rip),%rax
    {"MovapsRipNear", "0f 28 05 00 01 00 00", kNearOrig, kNearDest, Exit::kNone,
     "0f 28 05 00 f1 ff ff"}, // movaps 0x100(%rip),%xmm0
    {"PushRipNear", "ff 35 00 01 00 00", kNearOrig, kNearDest, Exit::kNone,
     "ff 35 00 f1 ff ff"}, // push 0x100(%rip): fine when only the disp changes
    {"MovLoadRipNearJumpBack", "48 8b 05 00 01 00 00", kNearOrig, kNearDest, Exit::kJumpBack,
     "48 8b 05 00 f1 ff ff | e9 fb ef ff ff"}, // jmp 0x10000007 from 0x1000100c

    // --- RIP-relative data operands, far: scratch register holding the address ---
    // lea -128(%rsp),%rsp | push %s | movabs $EA,%s | insn with (%s) | pop %s | lea 128(%rsp),%rsp
    {"MovLoadRipFar", "48 8b 05 00 01 00 00", kFarOrig, kFarDest, Exit::kNone,
     "48 8d 64 24 80 | 51 | 48 b9 07 11 00 00 00 7f 00 00 | 48 8b 01 | 59 | "
     "48 8d a4 24 80 00 00 00"}, // rax is the operand: scratch rcx
    {"MovStoreRipFar", "48 89 05 00 01 00 00", kFarOrig, kFarDest, Exit::kNone,
     "48 8d 64 24 80 | 51 | 48 b9 07 11 00 00 00 7f 00 00 | 48 89 01 | 59 | "
     "48 8d a4 24 80 00 00 00"},
    {"CmpImmRipFar", "83 3d 00 01 00 00 05", kFarOrig, kFarDest, Exit::kNone,
     "48 8d 64 24 80 | 50 | 48 b8 07 11 00 00 00 7f 00 00 | 83 38 05 | 58 | "
     "48 8d a4 24 80 00 00 00"}, // no GPR operand: scratch rax
    {"MovapsRipFar", "0f 28 05 00 01 00 00", kFarOrig, kFarDest, Exit::kNone,
     "48 8d 64 24 80 | 50 | 48 b8 07 11 00 00 00 7f 00 00 | 0f 28 00 | 58 | "
     "48 8d a4 24 80 00 00 00"},
    {"MovAhRipFar", "8a 25 00 01 00 00", kFarOrig, kFarDest, Exit::kNone,
     "48 8d 64 24 80 | 51 | 48 b9 06 11 00 00 00 7f 00 00 | 8a 21 | 59 | "
     "48 8d a4 24 80 00 00 00"}, // mov 0x100(%rip),%ah: ah is part of rax
    {"FsMovRipFar", "64 48 8b 05 00 01 00 00", kFarOrig, kFarDest, Exit::kNone,
     "48 8d 64 24 80 | 51 | 48 b9 08 11 00 00 00 7f 00 00 | 64 48 8b 01 | 59 | "
     "48 8d a4 24 80 00 00 00"}, // mov %fs:0x100(%rip),%rax keeps its fs override
    {"CmpxchgRipFar", "48 0f b1 0d 00 01 00 00", kFarOrig, kFarDest, Exit::kNone,
     "48 8d 64 24 80 | 52 | 48 ba 08 11 00 00 00 7f 00 00 | 48 0f b1 0a | 5a | "
     "48 8d a4 24 80 00 00 00"}, // cmpxchg %rcx,0x100(%rip) uses rax implicitly: rdx
    {"MovLoadRipFarJumpBack", "48 8b 05 00 01 00 00", kFarOrig, kFarDest, Exit::kJumpBack,
     "48 8d 64 24 80 | 51 | 48 b9 07 11 00 00 00 7f 00 00 | 48 8b 01 | 59 | "
     "48 8d a4 24 80 00 00 00 | ff 25 00 00 00 00 | 07 10 00 00 00 7f 00 00"},
    {"MovLoadRipFarTrap", "48 8b 05 00 01 00 00", kFarOrig, kFarDest, Exit::kTrap,
     "48 8d 64 24 80 | 51 | 48 b9 07 11 00 00 00 7f 00 00 | 48 8b 01 | 59 | "
     "48 8d a4 24 80 00 00 00 | cc",
     0, 28},
    {"VmovdqaRipNear", "c5 fd 6f 05 00 01 00 00", kNearOrig, kNearDest, Exit::kNone,
     "c5 fd 6f 05 00 f1 ff ff"}, // vmovdqa 0x100(%rip),%ymm0
    {"VmovdqaRipFar", "c5 fd 6f 05 00 01 00 00", kFarOrig, kFarDest, Exit::kNone,
     "48 8d 64 24 80 | 50 | 48 b8 08 11 00 00 00 7f 00 00 | c5 fd 6f 00 | 58 | "
     "48 8d a4 24 80 00 00 00"}, // VEX: re-encoded as vmovdqa (%rax),%ymm0
    {"VmovapsZmmRipFar", "62 f1 7c 48 28 05 00 01 00 00", kFarOrig, kFarDest, Exit::kNone,
     "48 8d 64 24 80 | 50 | 48 b8 0a 11 00 00 00 7f 00 00 | 62 f1 7c 48 28 00 | 58 | "
     "48 8d a4 24 80 00 00 00"}, // EVEX: vmovaps 0x100(%rip),%zmm0
    {"LeaRipFar", "48 8d 05 00 01 00 00", kFarOrig, kFarDest, Exit::kNone,
     "48 b8 07 11 00 00 00 7f 00 00"}, // movabs $EA,%rax
    {"LeaRipFarR9", "4c 8d 0d 00 01 00 00", kFarOrig, kFarDest, Exit::kNone,
     "49 b9 07 11 00 00 00 7f 00 00"}, // lea 0x100(%rip),%r9 -> movabs $EA,%r9
    {"LeaRipFar32", "8d 05 00 01 00 00", kFarOrig, kFarDest, Exit::kNone,
     "b8 06 11 00 00"}, // lea 0x100(%rip),%eax -> mov $(EA & 0xffffffff),%eax
    {"PushRipFar", "ff 35 00 01 00 00", kFarOrig, kFarDest, Exit::kNone, nullptr, -EOPNOTSUPP},

    // --- jmp rel ---
    {"JmpRel8Near", "eb 10", kNearOrig, kNearDest, Exit::kJumpBack,
     "e9 0d f0 ff ff"}, // to 0x10000012 from 0x10001005; no exit after a jmp
    {"JmpRel8Far", "eb 10", kFarOrig, kFarDest, Exit::kNone, "ff 25 00 00 00 00 | 12 10 00 00 00 7f 00 00"},
    {"JmpRel32Near", "e9 00 01 00 00", kNearOrig, kNearDest, Exit::kNone, "e9 00 f1 ff ff"}, // to 0x10000105
    {"JmpRel32Far", "e9 00 01 00 00", kFarOrig, kFarDest, Exit::kJumpBack,
     "ff 25 00 00 00 00 | 05 11 00 00 00 7f 00 00"},
    {"BndJmpRel32Near", "f2 e9 00 01 00 00", kNearOrig, kNearDest, Exit::kNone,
     "e9 01 f1 ff ff"}, // bnd jmp to 0x10000106, bnd dropped
    {"JmpTrap", "eb 10", kNearOrig, kNearDest, Exit::kTrap, nullptr, -EINVAL},

    // --- jcc ---
    {"JeRel8Near", "74 10", kNearOrig, kNearDest, Exit::kJumpBack,
     "0f 84 0c f0 ff ff | e9 f7 ef ff ff"}, // je 0x10000012; jmp 0x10000002
    {"JeRel8Far", "74 10", kFarOrig, kFarDest, Exit::kJumpBack,
     "75 06 | ff 25 06 00 00 00 | ff 25 08 00 00 00 | 12 10 00 00 00 7f 00 00 | "
     "02 10 00 00 00 7f 00 00"}, // jne over jmp *target; jmp *next
    {"JeRel8FarExitNone", "74 10", kFarOrig, kFarDest, Exit::kNone,
     "75 06 | ff 25 02 00 00 00 | eb 08 | 12 10 00 00 00 7f 00 00"}, // fall through past pool
    {"JgRel32Near", "0f 8f 00 01 00 00", kNearOrig, kNearDest, Exit::kNone, "0f 8f 00 f1 ff ff"}, // jg 0x10000106
    {"JbRel32Far", "0f 82 00 01 00 00", kFarOrig, kFarDest, Exit::kNone,
     "73 06 | ff 25 02 00 00 00 | eb 08 | 06 11 00 00 00 7f 00 00"}, // jae over jmp
    {"JeTrap", "74 10", kNearOrig, kNearDest, Exit::kTrap, nullptr, -EINVAL},

    // --- loop / jrcxz: only rel8, so `insn +2; jmp short over; jmp target` ---
    {"LoopNear", "e2 10", kNearOrig, kNearDest, Exit::kJumpBack, "e2 02 | eb 05 | e9 09 f0 ff ff | e9 f4 ef ff ff"},
    {"LoopFar", "e2 10", kFarOrig, kFarDest, Exit::kJumpBack,
     "e2 02 | eb 06 | ff 25 06 00 00 00 | ff 25 08 00 00 00 | 12 10 00 00 00 7f 00 00 | "
     "02 10 00 00 00 7f 00 00"},
    {"JrcxzNear", "e3 10", kNearOrig, kNearDest, Exit::kNone, "e3 02 | eb 05 | e9 09 f0 ff ff"},
    {"JecxzNear", "67 e3 10", kNearOrig, kNearDest, Exit::kNone,
     "67 e3 02 | eb 05 | e9 09 f0 ff ff"}, // keeps the 67 prefix (tests ecx)

    // --- call rel32: push the original return address, then jmp ---
    {"CallRel32Near", "e8 00 01 00 00", kNearOrig, kNearDest, Exit::kJumpBack,
     "ff 35 05 00 00 00 | e9 fa f0 ff ff | 05 00 00 10 00 00 00 00"}, // push lit; jmp
    {"CallRel32Far", "e8 00 01 00 00", kFarOrig, kFarDest, Exit::kNone,
     "ff 35 06 00 00 00 | ff 25 08 00 00 00 | 05 10 00 00 00 7f 00 00 | "
     "05 11 00 00 00 7f 00 00"}, // push lit(ret); jmp *lit(target)
    {"CallTrap", "e8 00 01 00 00", kNearOrig, kNearDest, Exit::kTrap, nullptr, -EINVAL},

    // --- call r/m64 ---
    {"CallRipNear", "ff 15 00 01 00 00", kNearOrig, kNearDest, Exit::kNone,
     "ff 35 06 00 00 00 | ff 25 fa f0 ff ff | 06 00 00 10 00 00 00 00"}, // jmp *0x10000106
    {"NotrackCallRipNear", "3e ff 15 00 01 00 00", kNearOrig, kNearDest, Exit::kNone,
     "ff 35 07 00 00 00 | 3e ff 25 fa f0 ff ff | 07 00 00 10 00 00 00 00"},
    {"CallRipFar", "ff 15 00 01 00 00", kFarOrig, kFarDest, Exit::kJumpBack,
     "ff 35 1a 00 00 00 | 48 8d 64 24 80 | 50 | 48 b8 06 11 00 00 00 7f 00 00 | 48 8b 00 | "
     "48 87 04 24 | c2 80 00 | 06 10 00 00 00 7f 00 00"},
    {"CallRspDisp8", "ff 54 24 08", kNearOrig, kNearDest, Exit::kNone,
     "ff 35 04 00 00 00 | ff 64 24 10 | 04 00 00 10 00 00 00 00"}, // jmp *16(%rsp)
    {"CallRspNoDisp", "ff 14 24", kNearOrig, kNearDest, Exit::kNone,
     "ff 35 04 00 00 00 | ff 64 24 08 | 03 00 00 10 00 00 00 00"}, // jmp *8(%rsp)
    {"CallRspDisp8Grows", "ff 54 24 7c", kNearOrig, kNearDest, Exit::kNone,
     "ff 35 07 00 00 00 | ff a4 24 84 00 00 00 | 04 00 00 10 00 00 00 00"}, // disp8 -> disp32
    {"NotrackCallRsp", "3e ff 54 24 08", kNearOrig, kNearDest, Exit::kNone,
     "ff 35 05 00 00 00 | 3e ff 64 24 10 | 05 00 00 10 00 00 00 00"}, // notrack kept
    {"CallRax", "ff d0", kNearOrig, kNearDest, Exit::kNone, "ff 35 02 00 00 00 | ff e0 | 02 00 00 10 00 00 00 00"},
    {"CallR11Far", "41 ff d3", kFarOrig, kFarDest, Exit::kNone,
     "ff 35 03 00 00 00 | 41 ff e3 | 03 10 00 00 00 7f 00 00"},
    {"CallRsp", "ff d4", kNearOrig, kNearDest, Exit::kNone, nullptr, -EOPNOTSUPP},
    {"CallRspRedZoneSlot", "ff 54 24 f8", kNearOrig, kNearDest, Exit::kNone, nullptr,
     -EOPNOTSUPP}, // call *-8(%rsp): our push would overwrite the pointer first

    // --- jmp r/m64 ---
    {"JmpRax", "ff e0", kFarOrig, kFarDest, Exit::kJumpBack, "ff e0"},
    {"NotrackJmpRax", "3e ff e0", kNearOrig, kNearDest, Exit::kNone, "3e ff e0"},
    {"JmpRipNear", "ff 25 00 01 00 00", kNearOrig, kNearDest, Exit::kNone, "ff 25 00 f1 ff ff"},
    {"JmpRipFar", "ff 25 00 01 00 00", kFarOrig, kFarDest, Exit::kNone,
     "48 8d 64 24 80 | 50 | 48 b8 06 11 00 00 00 7f 00 00 | 48 8b 00 | 48 87 04 24 | "
     "c2 80 00"},

    // --- ret ---
    {"Ret", "c3", kFarOrig, kFarDest, Exit::kJumpBack, "c3"},
    {"RetImm16", "c2 10 00", kNearOrig, kNearDest, Exit::kNone, "c2 10 00"},
    {"BndRet", "f2 c3", kNearOrig, kNearDest, Exit::kNone, "f2 c3"},
    {"RetTrap", "c3", kNearOrig, kNearDest, Exit::kTrap, nullptr, -EINVAL},

    // --- syscall: rcx must hold the original next address ---
    {"SyscallNear", "0f 05", kNearOrig, kNearDest, Exit::kJumpBack,
     "0f 05 | 48 b9 02 00 00 10 00 00 00 00 | e9 f1 ef ff ff"},
    {"SyscallFarTrap", "0f 05", kFarOrig, kFarDest, Exit::kTrap, "0f 05 | 48 b9 02 10 00 00 00 7f 00 00 | cc", 0, 12},

    // --- refused ---
    {"Int3", "cc", kNearOrig, kNearDest, Exit::kNone, nullptr, -EOPNOTSUPP},
    {"Int1", "f1", kNearOrig, kNearDest, Exit::kNone, nullptr, -EOPNOTSUPP},
    {"IntImm3", "cd 03", kNearOrig, kNearDest, Exit::kNone, nullptr, -EOPNOTSUPP},
    {"Retf", "cb", kNearOrig, kNearDest, Exit::kNone, nullptr, -EOPNOTSUPP},
    {"Sysenter", "0f 34", kNearOrig, kNearDest, Exit::kNone, nullptr, -EOPNOTSUPP},
    {"Xbegin", "c7 f8 00 01 00 00", kNearOrig, kNearDest, Exit::kNone, nullptr, -EOPNOTSUPP},
};

// Test names and failure messages show the case name instead of the struct's bytes.
void PrintTo(const RelocCase &c, std::ostream *os) { *os << c.name; }

class RelocateBytes : public ::testing::TestWithParam<RelocCase> {};

TEST_P(RelocateBytes, Emits) {
    const RelocCase &c = GetParam();
    const std::vector<uint8_t> input = unhex(c.input);
    Insn insn;
    ASSERT_EQ(decode(c.orig, input.data(), input.size(), &insn), 0);
    ASSERT_EQ(insn.len, input.size()) << "the table's input must be one instruction";

    uint8_t out[kMaxRelocatedSize + 16];
    std::memset(out, 0xaa, sizeof(out));
    int trap = 12345;
    const int n = relocate(insn, c.dest, out, sizeof(out), c.exit, &trap);
    if (c.error != 0) {
        EXPECT_EQ(n, c.error);
        return;
    }
    ASSERT_GT(n, 0) << "relocate failed: " << n;
    EXPECT_LE(static_cast<size_t>(n), kMaxRelocatedSize);
    EXPECT_EQ(hex(out, static_cast<size_t>(n)), hex(unhex(c.expected)));
    EXPECT_EQ(trap, c.trap_offset);
    EXPECT_EQ(out[n], 0xaa) << "wrote past the returned length";

    // One byte short of the output: -ENOSPC, and nothing written.
    uint8_t small[kMaxRelocatedSize];
    std::memset(small, 0xaa, sizeof(small));
    EXPECT_EQ(relocate(insn, c.dest, small, static_cast<size_t>(n) - 1, c.exit), -ENOSPC);
    for (uint8_t b : small) ASSERT_EQ(b, 0xaa);
}

INSTANTIATE_TEST_SUITE_P(relocator, RelocateBytes, ::testing::ValuesIn(kRelocCases),
                         [](const ::testing::TestParamInfo<RelocCase> &info) { return std::string(info.param.name); });

TEST(relocator, EmitJmpNearIsRel32) {
    uint8_t out[16];
    ASSERT_EQ(emit_jmp(kNearDest, kNearOrig, out, sizeof(out)), 5);
    EXPECT_EQ(hex(out, 5), "e9 fb ef ff ff"); // 0x10000000 - 0x10001005
}

TEST(relocator, EmitJmpFarIsAbsolute) {
    uint8_t out[16];
    ASSERT_EQ(emit_jmp(kFarDest, kFarOrig, out, sizeof(out)), 14);
    EXPECT_EQ(hex(out, 14), "ff 25 00 00 00 00 00 10 00 00 00 7f 00 00");
}

TEST(relocator, EmitJmpEdgeOfReach) {
    uint8_t out[16];
    // rel32 = INT32_MAX is in reach, one more is not.
    EXPECT_EQ(emit_jmp(0x1000, 0x1000 + 5 + 0x7fff'ffffULL, out, sizeof(out)), 5);
    EXPECT_EQ(emit_jmp(0x1000, 0x1000 + 5 + 0x8000'0000ULL, out, sizeof(out)), 14);
    EXPECT_EQ(emit_jmp(0x9000'0000, 0x9000'0005 - 0x8000'0000ULL, out, sizeof(out)), 5);
    EXPECT_EQ(emit_jmp(0x9000'0000, 0x9000'0004 - 0x8000'0000ULL, out, sizeof(out)), 14);
}

TEST(relocator, EmitJmpNoSpace) {
    uint8_t out[16];
    EXPECT_EQ(emit_jmp(kNearDest, kNearOrig, out, 4), -ENOSPC);
    EXPECT_EQ(emit_jmp(kFarDest, kFarOrig, out, 13), -ENOSPC);
}

TEST(relocator, UnsupportedFlowIsRefusedWhateverTheBytes) {
    Insn insn;
    const uint8_t nop = 0x90;
    ASSERT_EQ(decode(kNearOrig, &nop, 1, &insn), 0);
    insn.flow = Flow::kUnsupported;
    uint8_t out[kMaxRelocatedSize];
    EXPECT_EQ(relocate(insn, kNearDest, out, sizeof(out), Exit::kNone), -EOPNOTSUPP);
}

TEST(relocator, TrapOffsetIsMinusOneWithoutTrap) {
    Insn insn;
    const uint8_t nop = 0x90;
    ASSERT_EQ(decode(kNearOrig, &nop, 1, &insn), 0);
    uint8_t out[kMaxRelocatedSize];
    int trap = 7;
    EXPECT_EQ(relocate(insn, kNearDest, out, sizeof(out), Exit::kJumpBack, &trap), 6);
    EXPECT_EQ(trap, -1);
}

// Random bytes, half of them forced into a [rip + disp32] ModRM: whatever decodes is
// relocated within kMaxRelocatedSize or refused with a documented error, and a
// RIP-relative ordinary instruction 4 KiB away always relocates (only its disp changes).
TEST(relocator, FuzzStaysWithinBoundsAndContract) {
    std::mt19937_64 rng(20240611);
    int decoded = 0;
    for (int iter = 0; iter < 200000; ++iter) {
        uint8_t code[15];
        for (uint8_t &b : code) b = static_cast<uint8_t>(rng());
        if (iter % 2 != 0) {
            const size_t at = 1 + rng() % 4; // ModRM after 0-3 prefix/opcode bytes
            code[at] = static_cast<uint8_t>((code[at] & 0x38) | 0x05);
        }
        Insn insn;
        if (decode(kFarOrig, code, sizeof(code), &insn) != 0) continue;
        ++decoded;
        for (uint64_t dest : {kFarOrig + 0x1000, kFarDest}) {
            for (Exit exit : {Exit::kNone, Exit::kJumpBack, Exit::kTrap}) {
                uint8_t out[kMaxRelocatedSize + 8];
                std::memset(out, 0xaa, sizeof(out));
                const int n = relocate(insn, dest, out, kMaxRelocatedSize, exit);
                ASSERT_LE(n, static_cast<int>(kMaxRelocatedSize)) << hex(insn.bytes, insn.len);
                ASSERT_EQ(out[kMaxRelocatedSize], 0xaa) << hex(insn.bytes, insn.len);
                if (n < 0) {
                    ASSERT_TRUE(n == -EOPNOTSUPP || (n == -EINVAL && exit == Exit::kTrap))
                        << n << " for " << hex(insn.bytes, insn.len);
                }
                if (insn.flow == Flow::kSequential && insn.rip_relative && dest != kFarDest) {
                    ASSERT_GT(n, 0) << hex(insn.bytes, insn.len);
                }
            }
        }
    }
    EXPECT_GT(decoded, 100000);
}

// ---------------------------------------------------------------------------------------
// Decode
// ---------------------------------------------------------------------------------------

struct DecodeCase {
    const char *name;
    const char *input;
    Flow flow;
    uint64_t target = 0;     // expected Insn::target (instruction at 0x1000)
    uint64_t rip_target = 0; // expected Insn::rip_target, 0: not RIP-relative
};

const DecodeCase kDecodeCases[] = {
    {"MovRegReg", "48 89 e5", Flow::kSequential},
    {"Nop5", "0f 1f 44 00 00", Flow::kSequential},
    {"Endbr64", "f3 0f 1e fa", Flow::kSequential},
    {"Ud2", "0f 0b", Flow::kSequential},
    {"Hlt", "f4", Flow::kSequential},
    {"Int80", "cd 80", Flow::kSequential},
    {"MovLoadRip", "48 8b 05 00 01 00 00", Flow::kSequential, 0, 0x1107},
    {"LeaRip", "48 8d 05 00 01 00 00", Flow::kSequential, 0, 0x1107},
    {"MovImmToRip", "48 c7 05 10 00 00 00 01 00 00 00", Flow::kSequential, 0, 0x101b},
    {"VmovdqaRipNegative", "c5 fd 6f 05 f0 ff ff ff", Flow::kSequential, 0, 0xff8},
    {"JmpRel8", "eb 10", Flow::kJump, 0x1012},
    {"JmpRel8Self", "eb fe", Flow::kJump, 0x1000},
    {"JmpRel32", "e9 00 01 00 00", Flow::kJump, 0x1105},
    {"BndJmpRel32", "f2 e9 fb ff ff ff", Flow::kJump, 0x1001},
    {"JeRel8", "74 10", Flow::kCondJump, 0x1012},
    {"JgRel32", "0f 8f 00 01 00 00", Flow::kCondJump, 0x1106},
    {"Loop", "e2 10", Flow::kCondJump, 0x1012},
    {"Loope", "e1 f0", Flow::kCondJump, 0xff2},
    {"Loopne", "e0 10", Flow::kCondJump, 0x1012},
    {"Jrcxz", "e3 10", Flow::kCondJump, 0x1012},
    {"Jecxz", "67 e3 10", Flow::kCondJump, 0x1013},
    {"CallRel32", "e8 00 01 00 00", Flow::kCall, 0x1105},
    {"BndCallRel32", "f2 e8 00 01 00 00", Flow::kCall, 0x1106},
    {"CallRax", "ff d0", Flow::kIndirectCall},
    {"CallRip", "ff 15 00 01 00 00", Flow::kIndirectCall, 0, 0x1106},
    {"NotrackCallRip", "3e ff 15 00 01 00 00", Flow::kIndirectCall, 0, 0x1107},
    {"CallRspDisp8", "ff 54 24 08", Flow::kIndirectCall},
    {"JmpRax", "ff e0", Flow::kIndirectJump},
    {"NotrackJmpRax", "3e ff e0", Flow::kIndirectJump},
    {"JmpRip", "ff 25 00 01 00 00", Flow::kIndirectJump, 0, 0x1106},
    {"Ret", "c3", Flow::kRet},
    {"RetImm16", "c2 10 00", Flow::kRet},
    {"BndRet", "f2 c3", Flow::kRet},
    {"Syscall", "0f 05", Flow::kSyscall},
    {"Int3", "cc", Flow::kUnsupported},
    {"Int1", "f1", Flow::kUnsupported},
    {"IntImm3", "cd 03", Flow::kUnsupported},
    {"Retf", "cb", Flow::kUnsupported},
    {"RetfImm16", "ca 08 00", Flow::kUnsupported},
    {"Iretq", "48 cf", Flow::kUnsupported},
    {"CallFarMem", "ff 1d 00 00 00 00", Flow::kUnsupported, 0, 0x1006},
    {"JmpFarMem", "48 ff 2d 00 00 00 00", Flow::kUnsupported, 0, 0x1007},
    {"Sysenter", "0f 34", Flow::kUnsupported},
    {"Xbegin", "c7 f8 00 01 00 00", Flow::kUnsupported, 0x1106},
    {"EipRelative", "67 8b 05 10 00 00 00", Flow::kUnsupported},
    // An operand-size prefix on a near branch: ignored by Intel, honoured by AMD.
    {"OpsizeJgRel8", "66 7f 00", Flow::kUnsupported, 0x1003},
    {"OpsizeJmpRel32", "66 e9 00 01 00 00", Flow::kUnsupported, 0x1106},
    {"OpsizeCallRel32", "66 e8 00 01 00 00", Flow::kUnsupported, 0x1106},
    {"OpsizeJmpRax", "66 ff e0", Flow::kUnsupported},
    {"OpsizeRet", "66 c3", Flow::kUnsupported},
    {"OpsizeMovIsSequential", "66 89 c8", Flow::kSequential},
};

void PrintTo(const DecodeCase &c, std::ostream *os) { *os << c.name; }

class Decode : public ::testing::TestWithParam<DecodeCase> {};

TEST_P(Decode, Classifies) {
    const DecodeCase &c = GetParam();
    const std::vector<uint8_t> input = unhex(c.input);
    Insn insn;
    ASSERT_EQ(decode(0x1000, input.data(), input.size(), &insn), 0);
    EXPECT_EQ(insn.addr, 0x1000u);
    EXPECT_EQ(insn.len, input.size());
    EXPECT_EQ(hex(insn.bytes, insn.len), hex(input));
    EXPECT_EQ(static_cast<int>(insn.flow), static_cast<int>(c.flow));
    EXPECT_EQ(insn.target, c.target);
    EXPECT_EQ(insn.rip_relative, c.rip_target != 0);
    EXPECT_EQ(insn.rip_target, c.rip_target);
}

INSTANTIATE_TEST_SUITE_P(relocator, Decode, ::testing::ValuesIn(kDecodeCases),
                         [](const ::testing::TestParamInfo<DecodeCase> &info) { return std::string(info.param.name); });

TEST(relocator, DecodeInvalidAndTruncated) {
    Insn insn;
    const uint8_t push_es[] = {0x06};                // invalid in 64-bit mode
    const uint8_t lock_nop[] = {0xf0, 0x90};         // lock without a memory operand
    const uint8_t short_call[] = {0xe8, 0x00, 0x00}; // rel32 cut short
    const uint8_t rip_load[] = {0x48, 0x8b, 0x05, 0x00, 0x01, 0x00, 0x00};
    EXPECT_EQ(decode(0x1000, push_es, sizeof(push_es), &insn), -EILSEQ);
    EXPECT_EQ(decode(0x1000, lock_nop, sizeof(lock_nop), &insn), -EILSEQ);
    EXPECT_EQ(decode(0x1000, short_call, sizeof(short_call), &insn), -EILSEQ);
    EXPECT_EQ(decode(0x1000, rip_load, sizeof(rip_load) - 1, &insn), -EILSEQ);
    EXPECT_EQ(decode(0x1000, rip_load, 0, &insn), -EILSEQ);
    EXPECT_EQ(decode(0x1000, rip_load, sizeof(rip_load), &insn), 0);
}

TEST(relocator, DecodeReadsOnlyTheFirstInstruction) {
    const uint8_t two[] = {0x90, 0xc3, 0xcc, 0xcc};
    Insn insn;
    ASSERT_EQ(decode(0x1000, two, sizeof(two), &insn), 0);
    EXPECT_EQ(insn.len, 1);
    EXPECT_EQ(static_cast<int>(insn.flow), static_cast<int>(Flow::kSequential));
}

// ---------------------------------------------------------------------------------------
// relocator_exec: run relocated copies
// ---------------------------------------------------------------------------------------

constexpr size_t kPageSize = 0x1000;
constexpr size_t kOrigSize = 4 * kPageSize;
constexpr size_t kDataOffset = 0x800; // rip-relative data in the original page
constexpr size_t kOutOffset = 0xc00;  // scratch output the code may copy to
constexpr uint64_t kGiB = 1ULL << 30;

using Fn = uint64_t (*)(uint64_t, uint64_t, uint64_t);

uint64_t distance(const void *a, const void *b) {
    const auto x = reinterpret_cast<uint64_t>(a);
    const auto y = reinterpret_cast<uint64_t>(b);
    return x > y ? x - y : y - x;
}

// Shared (so a child's stores are visible to the parent) RWX memory at exactly `hint`,
// or nullptr.
uint8_t *map_rwx_at(uint64_t hint, size_t size) {
    void *p = mmap(reinterpret_cast<void *>(hint), size, PROT_READ | PROT_WRITE | PROT_EXEC,
                   MAP_SHARED | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    if (p == MAP_FAILED) return nullptr;
    if (reinterpret_cast<uint64_t>(p) != hint) { // kernels before 4.17 treat it as a hint
        munmap(p, size);
        return nullptr;
    }
    return static_cast<uint8_t *>(p);
}

// First successful map_rwx_at(base + k * step), trying k = -1, 1, -2, 2, ...
uint8_t *map_rwx_around(uint8_t *base, uint64_t step, size_t size) {
    const auto b = reinterpret_cast<uint64_t>(base);
    for (uint64_t k = 1; k <= 64; ++k) {
        if (b > k * step + (1ULL << 24)) {
            if (uint8_t *p = map_rwx_at(b - k * step, size)) return p;
        }
        if (b + k * step + size < (1ULL << 47)) {
            if (uint8_t *p = map_rwx_at(b + k * step, size)) return p;
        }
    }
    return nullptr;
}

// A tiny function to run: `code` goes to the original page; the instruction at
// code[probe] is relocated (Exit::kJumpBack) into a slot right after `prologue`, and the
// slot (prologue first) is called with three integer arguments.
struct Program {
    std::vector<uint8_t> code;
    size_t probe;
    std::vector<uint8_t> prologue;
};

// Where a child ended up.
struct Outcome {
    bool ok;          // exited normally after the call returned
    uint64_t value;   // the call's result
    std::string what; // otherwise, what happened
};

class relocator_exec : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        // The near page is carved out of the same mapping, 16 pages past the original code:
        // searching the address space for a free page nearby fails when it is crowded
        // (AddressSanitizer's shadow mappings).
        orig_ = static_cast<uint8_t *>(mmap(nullptr, kOrigSize + 17 * kPageSize, PROT_READ | PROT_WRITE | PROT_EXEC,
                                            MAP_SHARED | MAP_ANONYMOUS, -1, 0));
        if (orig_ == MAP_FAILED) orig_ = nullptr;
        if (orig_ == nullptr) return;
        munmap(orig_ + kOrigSize, 16 * kPageSize); // a gap between the two
        near_ = orig_ + kOrigSize + 16 * kPageSize;
        far_ = map_rwx_around(orig_, 8 * kGiB, kPageSize);
    }
    static void TearDownTestSuite() {
        if (orig_ != nullptr) munmap(orig_, kOrigSize);
        if (near_ != nullptr) munmap(near_, kPageSize);
        if (far_ != nullptr) munmap(far_, kPageSize);
        orig_ = near_ = far_ = nullptr;
    }
    void SetUp() override {
        ASSERT_NE(orig_, nullptr);
        ASSERT_NE(near_, nullptr);
        ASSERT_NE(far_, nullptr);
        ASSERT_LT(distance(orig_, near_), kGiB);
        ASSERT_GT(distance(orig_, far_), 4 * kGiB); // no rel32 can bridge this
        std::memset(orig_, 0xcc, kOrigSize);        // stray execution traps
    }

    static uint64_t orig_addr(size_t offset) { return reinterpret_cast<uint64_t>(orig_) + offset; }
    static uint64_t *data() { return reinterpret_cast<uint64_t *>(orig_ + kDataOffset); }
    static uint64_t *out() { return reinterpret_cast<uint64_t *>(orig_ + kOutOffset); }

    // Lays out `p` with its copy in `slot_page`; returns the entry point or nullptr.
    static Fn install(const Program &p, uint8_t *slot_page) {
        std::memcpy(orig_, p.code.data(), p.code.size());
        std::memset(slot_page, 0xcc, kPageSize);
        if (!p.prologue.empty()) std::memcpy(slot_page, p.prologue.data(), p.prologue.size());
        Insn insn;
        const uint64_t at = orig_addr(p.probe);
        EXPECT_EQ(decode(at, orig_ + p.probe, p.code.size() - p.probe, &insn), 0);
        uint8_t *copy = slot_page + p.prologue.size();
        const int n = relocate(insn, reinterpret_cast<uint64_t>(copy), copy, kMaxRelocatedSize, Exit::kJumpBack);
        EXPECT_GT(n, 0) << "relocate: " << n;
        if (n <= 0) return nullptr;
        return reinterpret_cast<Fn>(slot_page);
    }

    // Calls fn(a, b, c) in a forked child.
    static Outcome run(Fn fn, uint64_t a = 0, uint64_t b = 0, uint64_t c = 0) {
        if (fn == nullptr) return {false, 0, "not installed"};
        auto *result = static_cast<uint64_t *>(
            mmap(nullptr, kPageSize, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
        if (result == MAP_FAILED) return {false, 0, "mmap failed"};
        const pid_t pid = fork();
        if (pid == 0) {
            alarm(10); // a copy that loops forever
            *result = fn(a, b, c);
            _exit(0);
        }
        int status = 0;
        Outcome o{false, 0, {}};
        if (pid < 0 || waitpid(pid, &status, 0) != pid) {
            o.what = "fork/waitpid failed";
        } else if (WIFSIGNALED(status)) {
            o.what = std::string("killed by ") + strsignal(WTERMSIG(status));
        } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            o.what = "exit status " + std::to_string(status);
        } else {
            o.ok = true;
            o.value = *result;
        }
        munmap(result, kPageSize);
        return o;
    }

    // Installs `p` at each distance and expects fn(a, b, c) == expected.
    static void expect_result(const Program &p, uint64_t a, uint64_t b, uint64_t c, uint64_t expected,
                              const std::function<void()> &setup = {}) {
        for (uint8_t *page : {near_, far_}) {
            SCOPED_TRACE(page == near_ ? "copy near the original" : "copy >4 GiB from the original");
            Fn fn = install(p, page);
            if (setup) setup();
            const Outcome o = run(fn, a, b, c);
            ASSERT_TRUE(o.ok) << o.what;
            EXPECT_EQ(o.value, expected) << std::hex << "got 0x" << o.value << ", want 0x" << expected;
        }
    }

    static uint8_t *orig_;
    static uint8_t *near_;
    static uint8_t *far_;
};

uint8_t *relocator_exec::orig_ = nullptr;
uint8_t *relocator_exec::near_ = nullptr;
uint8_t *relocator_exec::far_ = nullptr;

// All rip-relative displacements below point at orig+0x800 (kDataOffset):
// disp = 0x800 - (offset of the instruction + its length).

TEST_F(relocator_exec, MovLoadRip) {
    const Program p{{
                        0x48, 0x8b, 0x05, 0xf9, 0x07, 0x00, 0x00, // 0: mov 0x7f9(%rip),%rax  <- probe
                        0xc3,                                     // 7: ret
                    },
                    0,
                    {}};
    expect_result(p, 0, 0, 0, 0x1122334455667788, [] { data()[0] = 0x1122334455667788; });
}

TEST_F(relocator_exec, MovStoreRip) {
    const Program p{{
                        0x48, 0x89, 0x3d, 0xf9, 0x07, 0x00, 0x00, // 0: mov %rdi,0x7f9(%rip)  <- probe
                        0x48, 0x89, 0xf8,                         // 7: mov %rdi,%rax
                        0xc3,                                     // a: ret
                    },
                    0,
                    {}};
    for (uint8_t *page : {near_, far_}) {
        Fn fn = install(p, page);
        data()[0] = 0;
        const Outcome o = run(fn, 0xfeedfacecafebeef);
        ASSERT_TRUE(o.ok) << o.what;
        EXPECT_EQ(data()[0], 0xfeedfacecafebeefULL) << (page == near_ ? "near" : "far");
    }
}

TEST_F(relocator_exec, LeaRip) {
    const Program p{{
                        0x48, 0x8d, 0x05, 0xf9, 0x07, 0x00, 0x00, // 0: lea 0x7f9(%rip),%rax  <- probe
                        0xc3,                                     // 7: ret
                    },
                    0,
                    {}};
    expect_result(p, 0, 0, 0, orig_addr(kDataOffset));
}

TEST_F(relocator_exec, CmpRipSetsFlags) {
    const Program p{{
                        0x48, 0x39, 0x3d, 0xf9, 0x07, 0x00, 0x00, // 0: cmp %rdi,0x7f9(%rip)  <- probe
                        0x0f, 0x94, 0xc0,                         // 7: sete %al
                        0x0f, 0xb6, 0xc0,                         // a: movzbl %al,%eax
                        0xc3,                                     // d: ret
                    },
                    0,
                    {}};
    const auto setup = [] { data()[0] = 77; };
    expect_result(p, 77, 0, 0, 1, setup);
    expect_result(p, 78, 0, 0, 0, setup);
}

TEST_F(relocator_exec, MovapsRip) {
    const Program p{{
                        0x0f, 0x28, 0x05, 0xf9, 0x07, 0x00, 0x00, // 0: movaps 0x7f9(%rip),%xmm0 <- probe
                        0x66, 0x48, 0x0f, 0x7e, 0xc0,             // 7: movq %xmm0,%rax
                        0xc3,                                     // c: ret
                    },
                    0,
                    {}};
    expect_result(p, 0, 0, 0, 0x0123456789abcdef, [] {
        data()[0] = 0x0123456789abcdef;
        data()[1] = 0;
    });
}

// The far form goes through push/movabs/pop of a scratch register: flags and that
// register must come out unchanged.
TEST_F(relocator_exec, FlagsSurviveRipLoad) {
    const Program p{{
                        0x48, 0x8b, 0x0d, 0xf9, 0x07, 0x00, 0x00, // 0: mov 0x7f9(%rip),%rcx  <- probe
                        0x9c,                                     // 7: pushfq
                        0x58,                                     // 8: pop %rax
                        0x4c, 0x31, 0xc0,                         // 9: xor %r8,%rax (flags before)
                        0x48, 0x01, 0xc8,                         // c: add %rcx,%rax
                        0xc3,                                     // f: ret
                    },
                    0,
                    {
                        0x48, 0x39, 0xf7, // cmp %rsi,%rdi
                        0x9c,             // pushfq
                        0x41, 0x58,       // pop %r8
                    }};
    const auto setup = [] { data()[0] = 0x5000; };
    // Equal, below, above, signed-less, overflow: different ZF/CF/SF/OF/PF/AF patterns.
    expect_result(p, 5, 5, 0, 0x5000, setup);
    expect_result(p, 5, 6, 0, 0x5000, setup);
    expect_result(p, 6, 5, 0, 0x5000, setup);
    expect_result(p, static_cast<uint64_t>(-1), 1, 0, 0x5000, setup);
    expect_result(p, 0x8000000000000000, 1, 0, 0x5000, setup);
}

TEST_F(relocator_exec, ScratchRegisterSurvivesRipLoad) {
    const Program p{{
                        0x48, 0x8b, 0x0d, 0xf9, 0x07, 0x00, 0x00, // 0: mov 0x7f9(%rip),%rcx  <- probe
                        0xc3,                                     // 7: ret (rax from the prologue)
                    },
                    0,
                    {
                        0x48, 0x89, 0xd0, // mov %rdx,%rax
                    }};
    expect_result(p, 0, 0, 0xabcdef0123456789, 0xabcdef0123456789, [] { data()[0] = 1; });
}

// A pattern written below rsp (the red zone) before the copy runs is intact after.
TEST_F(relocator_exec, RedZoneSurvivesRipStore) {
    std::vector<uint8_t> prologue;
    for (int k = 1; k <= 16; ++k) { // mov %rdi,-8k(%rsp) for the whole 128-byte red zone
        const uint8_t b[] = {0x48, 0x89, 0x7c, 0x24, static_cast<uint8_t>(-8 * k)};
        prologue.insert(prologue.end(), b, b + sizeof(b));
    }
    const Program p{{
                        0x48, 0x89, 0x35, 0xf9, 0x07, 0x00, 0x00, // 0: mov %rsi,0x7f9(%rip)  <- probe
                        0x48, 0x8d, 0x74, 0x24, 0x80,             // 7: lea -0x80(%rsp),%rsi
                        0x48, 0x89, 0xd7,                         // c: mov %rdx,%rdi
                        0xb9, 0x80, 0x00, 0x00, 0x00,             // f: mov $0x80,%ecx
                        0xf3, 0xa4,                               // 14: rep movsb
                        0xc3,                                     // 16: ret
                    },
                    0,
                    prologue};
    const uint64_t pattern = 0x5a5a'a5a5'1234'8765;
    for (uint8_t *page : {near_, far_}) {
        SCOPED_TRACE(page == near_ ? "near" : "far");
        Fn fn = install(p, page);
        data()[0] = 0;
        std::memset(out(), 0, 128);
        const Outcome o = run(fn, pattern, 42, reinterpret_cast<uint64_t>(out()));
        ASSERT_TRUE(o.ok) << o.what;
        EXPECT_EQ(data()[0], 42u);
        for (int i = 0; i < 16; ++i) EXPECT_EQ(out()[i], pattern) << "red zone qword " << i;
    }
}

TEST_F(relocator_exec, JmpRel8) {
    const Program p{{
                        0xeb, 0x0e,                   // 0: jmp 0x10  <- probe
                        0xb8, 0x01, 0x00, 0x00, 0x00, // 2: mov $1,%eax
                        0xc3,                         // 7: ret
                        0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc,
                        0xcc, 0xb8, 0x2a, 0x00, 0x00, 0x00, // 10: mov $42,%eax
                        0xc3,                               // 15: ret
                    },
                    0,
                    {}};
    expect_result(p, 0, 0, 0, 42);
}

TEST_F(relocator_exec, JccRel8) {
    // je / jl after `cmp %rsi,%rdi`: 2 when taken, 1 when not.
    for (uint8_t opcode : {0x74 /* je */, 0x7c /* jl */}) {
        SCOPED_TRACE(opcode == 0x74 ? "je" : "jl");
        const Program p{{
                            opcode, 0x06,                 // 0: jcc 8  <- probe
                            0xb8, 0x01, 0x00, 0x00, 0x00, // 2: mov $1,%eax
                            0xc3,                         // 7: ret
                            0xb8, 0x02, 0x00, 0x00, 0x00, // 8: mov $2,%eax
                            0xc3,                         // d: ret
                        },
                        0,
                        {0x48, 0x39, 0xf7}}; // cmp %rsi,%rdi
        const bool je = opcode == 0x74;
        expect_result(p, 3, 3, 0, je ? 2 : 1);
        expect_result(p, 3, 4, 0, je ? 1 : 2);
        expect_result(p, 4, 3, 0, 1);
        expect_result(p, static_cast<uint64_t>(-4), 3, 0, je ? 1 : 2); // signed less
    }
}

TEST_F(relocator_exec, JccRel32) {
    const Program p{{
                        0x0f, 0x82, 0x06, 0x00, 0x00, 0x00, // 0: jb 0xc  <- probe
                        0xb8, 0x01, 0x00, 0x00, 0x00,       // 6: mov $1,%eax
                        0xc3,                               // b: ret
                        0xb8, 0x02, 0x00, 0x00, 0x00,       // c: mov $2,%eax
                        0xc3,                               // 11: ret
                    },
                    0,
                    {0x48, 0x39, 0xf7}}; // cmp %rsi,%rdi
    expect_result(p, 3, 4, 0, 2);
    expect_result(p, 4, 3, 0, 1);
    expect_result(p, static_cast<uint64_t>(-4), 3, 0, 1); // unsigned above
}

// loop / jrcxz at 0 with rcx = first argument: taken -> rcx, not taken -> -1.
Program rcx_branch(uint8_t opcode) {
    return Program{{
                       opcode, 0x08,                             // 0: loop/jrcxz 0xa  <- probe
                       0x48, 0xc7, 0xc0, 0xff, 0xff, 0xff, 0xff, // 2: mov $-1,%rax
                       0xc3,                                     // 9: ret
                       0x48, 0x89, 0xc8,                         // a: mov %rcx,%rax
                       0xc3,                                     // d: ret
                   },
                   0,
                   {0x48, 0x89, 0xf9}}; // mov %rdi,%rcx
}

TEST_F(relocator_exec, Loop) {
    const Program p = rcx_branch(0xe2);
    expect_result(p, 5, 0, 0, 4);                         // rcx 5 -> 4: taken
    expect_result(p, 1, 0, 0, static_cast<uint64_t>(-1)); // rcx 1 -> 0: falls through
}

TEST_F(relocator_exec, Jrcxz) {
    const Program p = rcx_branch(0xe3);
    expect_result(p, 0, 0, 0, 0);                         // rcx == 0: taken
    expect_result(p, 3, 0, 0, static_cast<uint64_t>(-1)); // falls through
}

// The callee at 0x30 returns the return address it finds at (%rsp).
constexpr uint8_t kReturnAddressCallee[] = {0x48, 0x8b, 0x04, 0x24, 0xc3}; // mov (%rsp),%rax; ret

// Pads `code` with int3 up to 0x30 and puts `bytes` there. Sized first, then copied:
// GCC 12 at -O3 warns falsely (-Warray-bounds) about vector::insert at the end.
template <size_t N>
void put_at_0x30(std::vector<uint8_t> &code, const uint8_t (&bytes)[N]) {
    code.resize(0x30, 0xcc);
    code.resize(0x30 + N);
    std::memcpy(code.data() + 0x30, bytes, N);
}

std::vector<uint8_t> with_callee_at_0x30(std::vector<uint8_t> code) {
    put_at_0x30(code, kReturnAddressCallee);
    return code;
}

TEST_F(relocator_exec, CallRel32PushesOriginalReturnAddress) {
    const Program p{with_callee_at_0x30({
                        0xe8, 0x2b, 0x00, 0x00, 0x00, // 0: call 0x30  <- probe
                        0xc3,                         // 5: ret
                    }),
                    0,
                    {}};
    expect_result(p, 0, 0, 0, orig_addr(5));
}

TEST_F(relocator_exec, CallRipPushesOriginalReturnAddress) {
    const Program p{with_callee_at_0x30({
                        0xff, 0x15, 0xfa, 0x07, 0x00, 0x00, // 0: call *0x7fa(%rip)  <- probe
                        0xc3,                               // 6: ret
                    }),
                    0,
                    {}};
    expect_result(p, 0, 0, 0, orig_addr(6), [] { data()[0] = orig_addr(0x30); });
}

TEST_F(relocator_exec, CallRspReadsTargetAboveThePush) {
    const Program p{with_callee_at_0x30({
                        0xff, 0x14, 0x24, // 0: call *(%rsp)  <- probe
                        0x59,             // 3: pop %rcx
                        0xc3,             // 4: ret
                    }),
                    0,
                    {0x57}}; // push %rdi (the callee)
    expect_result(p, orig_addr(0x30), 0, 0, orig_addr(3));
}

TEST_F(relocator_exec, CallRegister) {
    const Program p{with_callee_at_0x30({
                        0x41, 0xff, 0xd3, // 0: call *%r11  <- probe
                        0xc3,             // 3: ret
                    }),
                    0,
                    {0x49, 0x89, 0xfb}}; // mov %rdi,%r11
    expect_result(p, orig_addr(0x30), 0, 0, orig_addr(3));
}

// The callee sees its caller's red zone (below the return address) as the caller left it.
TEST_F(relocator_exec, CallRipKeepsCallerRedZone) {
    std::vector<uint8_t> prologue;
    for (int k = 2; k <= 16; ++k) { // mov %rdi,-8k(%rsp): all of the red zone below the slot
        const uint8_t b[] = {0x48, 0x89, 0x7c, 0x24, static_cast<uint8_t>(-8 * k)};
        prologue.insert(prologue.end(), b, b + sizeof(b));
    }
    std::vector<uint8_t> code = {
        0xff, 0x15, 0xfa, 0x07, 0x00, 0x00, // 0: call *0x7fa(%rip)  <- probe
        0xc3,                               // 6: ret
    };
    const uint8_t callee[] = {
        0x48, 0x89, 0xf7,             // 30: mov %rsi,%rdi (out)
        0x48, 0x8d, 0x74, 0x24, 0x88, // 33: lea -0x78(%rsp),%rsi (caller's rsp - 128)
        0xb9, 0x78, 0x00, 0x00, 0x00, // 38: mov $0x78,%ecx
        0xf3, 0xa4,                   // 3d: rep movsb
        0x48, 0x8b, 0x04, 0x24,       // 3f: mov (%rsp),%rax
        0xc3,                         // 43: ret
    };
    put_at_0x30(code, callee);
    const Program p{code, 0, prologue};
    const uint64_t pattern = 0x0bad'f00d'dead'beef;
    for (uint8_t *page : {near_, far_}) {
        SCOPED_TRACE(page == near_ ? "near" : "far");
        Fn fn = install(p, page);
        data()[0] = orig_addr(0x30);
        std::memset(out(), 0, 128);
        const Outcome o = run(fn, pattern, reinterpret_cast<uint64_t>(out()));
        ASSERT_TRUE(o.ok) << o.what;
        EXPECT_EQ(o.value, orig_addr(6));
        for (int i = 0; i < 15; ++i) EXPECT_EQ(out()[i], pattern) << "red zone qword " << i;
    }
}

TEST_F(relocator_exec, JmpRip) {
    std::vector<uint8_t> code = {
        0xff, 0x25, 0xfa, 0x07, 0x00, 0x00, // 0: jmp *0x7fa(%rip)  <- probe
    };
    const uint8_t target[] = {0xb8, 0x2a, 0x00, 0x00, 0x00, 0xc3}; // 30: mov $42,%eax; ret
    put_at_0x30(code, target);
    expect_result(Program{code, 0, {}}, 0, 0, 0, 42, [] { data()[0] = orig_addr(0x30); });
}

TEST_F(relocator_exec, SyscallSetsOriginalRcx) {
    const Program p{{
                        0x0f, 0x05,       // 0: syscall  <- probe
                        0x48, 0x89, 0xc8, // 2: mov %rcx,%rax
                        0xc3,             // 5: ret
                    },
                    0,
                    {0xb8, 0x27, 0x00, 0x00, 0x00}}; // mov $39 (getpid),%eax
    expect_result(p, 0, 0, 0, orig_addr(2));
}

TEST_F(relocator_exec, EmitJmpReachesOriginal) {
    const uint8_t ret42[] = {0xb8, 0x2a, 0x00, 0x00, 0x00, 0xc3}; // mov $42,%eax; ret
    std::memcpy(orig_, ret42, sizeof(ret42));
    for (uint8_t *page : {near_, far_}) {
        const int n = emit_jmp(reinterpret_cast<uint64_t>(page), orig_addr(0), page, kPageSize);
        EXPECT_EQ(n, page == near_ ? 5 : 14);
        const Outcome o = run(reinterpret_cast<Fn>(page));
        ASSERT_TRUE(o.ok) << o.what;
        EXPECT_EQ(o.value, 42u);
    }
}

// ---- A fault past the first instruction of a copy ----

// What the child's SIGSEGV handler saw, after applying the copy's FaultUndo (if any).
struct FaultSeen {
    uint64_t reached;    // 1 when the handler ran
    uint64_t rip_offset; // the faulting instruction's offset in the copy
    uint64_t undone;     // 1 when a FaultUndo applied
    uint64_t rsp, r15, rax;
};
ukp::arch::FaultUndos g_undos;
uint64_t g_copy_base;
FaultSeen *g_seen;

void on_copy_fault(int, siginfo_t *, void *ctx) {
    auto *uc = static_cast<ucontext_t *>(ctx);
    greg_t *g = uc->uc_mcontext.gregs;
    const uint64_t off = static_cast<uint64_t>(g[REG_RIP]) - g_copy_base;
    g_seen->rip_offset = off;
    if (const ukp::arch::FaultUndo *u = g_undos.find(off)) {
        ukp::arch::undo_copy_fault(*u, uc);
        g_seen->undone = 1;
    }
    g_seen->rsp = static_cast<uint64_t>(g[REG_RSP]);
    g_seen->r15 = static_cast<uint64_t>(g[REG_R15]);
    g_seen->rax = static_cast<uint64_t>(g[REG_RAX]);
    g_seen->reached = 1;
    _exit(0);
}

// The prologue keeps rsp in r15 and puts c in rax; the probed instruction then faults
// reading the unmapped gap after the original pages (orig + kOrigSize + 0x100).
constexpr uint64_t kRaxBefore = 0x1122334455667788;

class relocator_fault : public relocator_exec {
protected:
    static uint64_t gap() { return orig_addr(kOrigSize + 0x100); }

    // Runs `code` (probe at 0) with its copy in `page` until the fault; what the program
    // would see once the handler put back what the copy changed.
    static FaultSeen run_to_fault(const std::vector<uint8_t> &code, uint8_t *page, uint64_t a,
                                  const std::vector<uint8_t> &more_prologue = {}) {
        Program p{code, 0, {0x49, 0x89, 0xe7, 0x48, 0x89, 0xd0}}; // mov %rsp,%r15; mov %rdx,%rax
        p.prologue.insert(p.prologue.end(), more_prologue.begin(), more_prologue.end());
        Fn fn = install(p, page);
        EXPECT_NE(fn, nullptr);
        Insn insn;
        EXPECT_EQ(decode(orig_addr(0), orig_, code.size(), &insn), 0);
        uint8_t scratch[kMaxRelocatedSize];
        g_copy_base = reinterpret_cast<uint64_t>(page) + p.prologue.size();
        EXPECT_GT(relocate(insn, g_copy_base, scratch, sizeof scratch, Exit::kJumpBack, nullptr, &g_undos), 0);
        g_seen = static_cast<FaultSeen *>(
            mmap(nullptr, kPageSize, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
        *g_seen = FaultSeen{};
        const pid_t pid = fork();
        if (pid == 0) {
            alarm(10);
            struct sigaction sa {};
            sa.sa_sigaction = on_copy_fault;
            sa.sa_flags = SA_SIGINFO;
            sigaction(SIGSEGV, &sa, nullptr);
            fn(a, 0, kRaxBefore);
            _exit(3); // no fault: the test's premise is wrong
        }
        int status = 0;
        waitpid(pid, &status, 0);
        const FaultSeen seen = *g_seen;
        munmap(g_seen, kPageSize);
        EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
        return seen;
    }

    // The fault shows the program's own rsp and rax, whatever the copy did before it.
    static void expect_state_restored(const std::vector<uint8_t> &code, uint64_t a,
                                      const std::vector<uint8_t> &more_prologue = {}) {
        for (uint8_t *page : {near_, far_}) {
            SCOPED_TRACE(page == near_ ? "copy near the original" : "copy >4 GiB from the original");
            const FaultSeen seen = run_to_fault(code, page, a, more_prologue);
            ASSERT_EQ(seen.reached, 1u);
            EXPECT_EQ(seen.rsp, seen.r15) << "rsp off by " << static_cast<int64_t>(seen.r15 - seen.rsp);
            EXPECT_EQ(seen.rax, kRaxBefore);
            if (page == far_) {
                EXPECT_EQ(seen.undone, 1u) << "fault at +" << seen.rip_offset; // a multi-instruction form
            }
        }
    }
};

// disp32 = gap - (end of the instruction) = kOrigSize + 0x100 - len.
TEST_F(relocator_fault, FarRipLoadThroughAScratchRegister) {
    expect_state_restored({0x48, 0x8b, 0x0d, 0xf9, 0x40, 0x00, 0x00, 0xc3}, 0); // mov gap(%rip),%rcx
}

TEST_F(relocator_fault, CallThroughRipSlot) {
    expect_state_restored({0xff, 0x15, 0xfa, 0x40, 0x00, 0x00, 0xc3}, 0); // call *gap(%rip)
}

TEST_F(relocator_fault, CallThroughAPointerInARegister) {
    const FaultSeen near = run_to_fault({0xff, 0x17, 0xc3}, near_, gap()); // call *(%rdi)
    EXPECT_EQ(near.undone, 1u); // the copy pushes, then reads: near or far alike
    expect_state_restored({0xff, 0x17, 0xc3}, gap());
}

TEST_F(relocator_fault, CallThroughAnRspBasedOperand) {
    // call *(%rsp,%rcx,1) with rcx = gap - rsp: the copy pushes first and reads 8 further.
    expect_state_restored({0xff, 0x14, 0x0c, 0xc3}, gap(),
                          {0x48, 0x89, 0xf9, 0x48, 0x29, 0xe1}); // mov %rdi,%rcx; sub %rsp,%rcx
}

// The same inside a jump optimization's detour: the DCR `nop; mov gap(%rip),%rcx; ret`
// relocated >4 GiB away, where the load goes through a scratch register saved on the stack.
ukp::arch::DetourLayout g_layout;
uint64_t g_detour;
uint64_t g_fault_orig; // the original instruction the fault was mapped to

void on_detour_fault(int, siginfo_t *, void *ctx) {
    auto *uc = static_cast<ucontext_t *>(ctx);
    greg_t *g = uc->uc_mcontext.gregs;
    const uint64_t ip = static_cast<uint64_t>(g[REG_RIP]);
    g_seen->rip_offset = ip - g_detour;
    uint64_t orig = 0;
    if (const ukp::arch::FaultUndo *u = ukp::arch::detour_fault_undo(g_layout, g_detour, g_fault_orig, ip, &orig)) {
        ukp::arch::undo_copy_fault(*u, uc);
        g_seen->undone = 1;
    }
    g_seen->rsp = static_cast<uint64_t>(g[REG_RSP]);
    g_seen->r15 = static_cast<uint64_t>(g[REG_R15]);
    g_seen->rax = static_cast<uint64_t>(g[REG_RAX]);
    g_seen->reached = orig; // the DCR instruction it stands for
    _exit(0);
}

TEST_F(relocator_fault, FarRipLoadInsideADetour) {
    // 0: nop  1: mov gap(%rip),%rcx (disp32 = kOrigSize + 0x100 - 8)  8: ret
    const std::vector<uint8_t> code = {0x90, 0x48, 0x8b, 0x0d, 0xf8, 0x40, 0x00, 0x00, 0xc3};
    std::memcpy(orig_, code.data(), code.size());
    Insn dcr[2];
    ASSERT_EQ(decode(orig_addr(0), orig_, code.size(), &dcr[0]), 0);
    ASSERT_EQ(decode(orig_addr(1), orig_ + 1, code.size() - 1, &dcr[1]), 0);
    std::memset(far_, 0xcc, kPageSize);
    // The detour at far_ + 64; at far_: mov %rsp,%r15; mov %rdx,%rax; jmp <its copy>.
    g_detour = reinterpret_cast<uint64_t>(far_) + 64;
    ASSERT_EQ(ukp::arch::emit_detour(g_detour, 0, dcr, 2, far_ + 64, kPageSize - 64, &g_layout), 0);
    const uint8_t prologue[] = {0x49, 0x89, 0xe7, 0x48, 0x89, 0xd0};
    std::memcpy(far_, prologue, sizeof prologue);
    ASSERT_EQ(emit_jmp(reinterpret_cast<uint64_t>(far_) + sizeof prologue, g_detour + g_layout.copy,
                       far_ + sizeof prologue, 64 - sizeof prologue),
              5);
    g_fault_orig = orig_addr(0);
    g_seen =
        static_cast<FaultSeen *>(mmap(nullptr, kPageSize, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
    *g_seen = FaultSeen{};
    const pid_t pid = fork();
    if (pid == 0) {
        alarm(10);
        struct sigaction sa {};
        sa.sa_sigaction = on_detour_fault;
        sa.sa_flags = SA_SIGINFO;
        sigaction(SIGSEGV, &sa, nullptr);
        reinterpret_cast<Fn>(far_)(0, 0, kRaxBefore);
        _exit(3); // no fault: the test's premise is wrong
    }
    int status = 0;
    waitpid(pid, &status, 0);
    const FaultSeen seen = *g_seen;
    munmap(g_seen, kPageSize);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
    EXPECT_EQ(seen.undone, 1u) << "fault at detour +" << seen.rip_offset;
    EXPECT_EQ(seen.reached, orig_addr(1)) << "the faulting DCR instruction";
    EXPECT_EQ(seen.rsp, seen.r15) << "rsp off by " << static_cast<int64_t>(seen.r15 - seen.rsp);
    EXPECT_EQ(seen.rax, kRaxBefore);
}

} // namespace
