// Tests of the jump-optimization safety check (src/arch/x86_64/region.hpp). Every test
// name contains "region" (ctest -R region):
//  - region/RegionCase.*: small functions as hex bytes, a probe offset, the expected
//    verdict (reason, DCR length, DCR instruction count), as a table.
//  - region.*: jump table resolution, landing pads of a real try/catch, error paths,
//    and a sweep over every function entry of this test binary.
#include "arch/x86_64/insn.hpp"
#include "arch/x86_64/island.hpp"
#include "arch/x86_64/region.hpp"
#include "symbols/symbols.hpp"

#include <gtest/gtest.h>

#include "loaded_code.h"
#include "test_hex.h"

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <link.h>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using ukp::arch::analyze_function;
using ukp::arch::check_region;
using ukp::arch::FunctionMap;
using ukp::arch::IndirectJump;
using ukp::arch::OptimizeCheck;
using ukp::arch::Reason;
using ukp::arch::reason_name;

// Where the functions of the table live: far from everything, so that relocation to a
// near and a far buffer are both exercised for real. Jump tables sit at kTable.
constexpr uint64_t kStart = 0x7f00'0000'1000;
constexpr uint64_t kTable = kStart + 0x100;

struct RegionSpec {
    const char *name;
    const char *code;                 // the function, instruction by instruction
    uint64_t probe;                   // offset of the probe in it
    Reason reason;                    // expected first failed check (kOk: optimizable)
    uint64_t dcr_len;                 // expected DCR length (0: not checked)
    size_t dcr_insns;                 // expected DCR instruction count (0: not checked)
    std::vector<int32_t> table = {};  // int32 entries readable at kTable (rel32 tables)
    std::vector<uint64_t> extra = {}; // extra entries, as offsets from kStart
    bool abs_table = false;           // the entries are 8-byte absolute addresses
};

// Entries of a rel32 table are offsets from kTable: "kStart + off" is off - 0x100.
constexpr int32_t to(uint64_t off) { return static_cast<int32_t>(off) - 0x100; }

const RegionSpec kCases[] = {
    // --- optimizable ---
    {"FirstInsnLong", "48 8b 05 00 01 00 00 | c3", 0, Reason::kOk, 7, 1}, // mov 0x100(%rip),%rax
    {"MovImmIsFive", "b8 01 00 00 00 | c3", 0, Reason::kOk, 5, 1},        // mov $1,%eax
    {"PushesAndMov", "55 | 53 | 41 54 | 48 89 e5 | 5d | 5b | 41 5c | c3", 0, Reason::kOk, 7, 4},
    {"Endbr64Push", "f3 0f 1e fa | 55 | 48 89 e5 | 5d | c3", 0, Reason::kOk, 5, 2},
    {"LoopToProbeItself", "31 c0 | 83 c0 01 | 83 f8 0a | 7c f6 | c3", 0, Reason::kOk, 5, 2},
    {"JccInRegionRelocates", "85 ff | 74 05 | b8 01 00 00 00 | c3", 0, Reason::kOk, 9, 3},
    {"DirectCallLast", "53 | e8 00 10 00 00 | 5b | c3", 0, Reason::kOk, 6, 2},
    {"IndirectCallLast", "31 c0 | 89 c7 | ff d0 | c3", 0, Reason::kOk, 6, 3},
    {"RetLast", "31 c0 | 89 c7 | c3 | 90 90", 0, Reason::kOk, 5, 3},
    {"ProbeMidFunction", "55 | 48 89 e5 | 48 83 ec 10 | c9 | c3", 4, Reason::kOk, 5, 2},
    {"SyscallRelocates", "0f 05 | 48 89 c7 | c3", 0, Reason::kOk, 5, 2},
    {"JumpAfterRegion", "31 c0 | 83 c0 01 | 83 f8 0a | 7c fb | c3", 0, Reason::kOk, 5, 2}, // jl to 5
    // --- jump table: cmp $2,%edi; ja ret; lea T(%rip),%rax; movslq (%rax,%rdi,4),%rdx;
    //     add %rax,%rdx; jmp *%rdx; ret (at 21). Targets resolved from kTable. ---
    {"JumpTableOutsideRegion",
     "83 ff 02 | 77 10 | 48 8d 05 f4 00 00 00 | 48 63 14 b8 | 48 01 c2 | ff e2 | c3",
     0,
     Reason::kOk,
     5,
     2,
     {to(21), to(21), to(5)}},
    {"JumpTableIntoRegion",
     "83 ff 02 | 77 10 | 48 8d 05 f4 00 00 00 | 48 63 14 b8 | 48 01 c2 | ff e2 | c3",
     0,
     Reason::kJumpIntoRegion,
     5,
     2,
     {to(21), to(3), to(21)}},
    {"JumpTableUnreadable", "83 ff 02 | 77 10 | 48 8d 05 f4 00 00 00 | 48 63 14 b8 | 48 01 c2 | ff e2 | c3", 0,
     Reason::kIndirectJump, 5, 2},
    // notrack jmp *%rdx, and the index copied after the bounds check (mov %edi,%ecx).
    {"JumpTableNotrackCopiedIndex",
     "83 ff 02 | 77 13 | 89 f9 | 48 8d 05 f2 00 00 00 | 48 63 14 88 | 48 01 c2 | 3e ff e2 | c3",
     0,
     Reason::kJumpIntoRegion,
     5,
     2,
     {to(24), to(24), to(1)}},
    // No bounds check: the table cannot be sized.
    {"JumpTableUnbounded",
     "48 8d 05 f9 00 00 00 | 48 63 14 b8 | 48 01 c2 | ff e2 | c3",
     0,
     Reason::kIndirectJump,
     7,
     1,
     {to(16)}},
    // glibc's assembly: bsf %rdx,%rdx; lea T(%rip),%r11; movslq (%r11,%rdx,4),%rcx;
    // lea (%r11,%rcx,1),%rcx; jmp *%rcx; ret (at 21). bsf bounds the index to 64 entries.
    {"JumpTableLeaSumBsfBound", "48 0f bc d2 | 4c 8d 1d f5 00 00 00 | 49 63 0c 93 | 49 8d 0c 0b | ff e1 | c3", 0,
     Reason::kOk, 11, 2, std::vector<int32_t>(64, to(21))},
    {"JumpTableLeaSumBsfIntoRegion", "48 0f bc d2 | 4c 8d 1d f5 00 00 00 | 49 63 0c 93 | 49 8d 0c 0b | ff e1 | c3", 0,
     Reason::kJumpIntoRegion, 11, 2,
     [] {
         std::vector<int32_t> t(64, to(21));
         t[63] = to(4); // the last entry bsf allows
         return t;
     }()},
    // The same with 63 readable entries: the 64th that bsf allows cannot be read.
    {"JumpTableLeaSumBsfShortTable", "48 0f bc d2 | 4c 8d 1d f5 00 00 00 | 49 63 0c 93 | 49 8d 0c 0b | ff e1 | c3", 0,
     Reason::kIndirectJump, 11, 2, std::vector<int32_t>(63, to(21))},
    // bsf of another register: no bound on %rdx.
    {"JumpTableLeaSumOtherBsf", "48 0f bc c2 | 4c 8d 1d f5 00 00 00 | 49 63 0c 93 | 49 8d 0c 0b | ff e1 | c3", 0,
     Reason::kIndirectJump, 11, 2, std::vector<int32_t>(64, to(21))},
    // A constant index: nop x3; movslq T+8(%rip),%rax; lea T(%rip),%rdx; add %rdx,%rax;
    // jmp *%rax; ret (at 22): one entry, T[2].
    {"JumpTableConstantIndex",
     "90 | 90 | 90 | 48 63 05 fe 00 00 00 | 48 8d 15 ef 00 00 00 | 48 01 d0 | ff e0 | c3",
     0,
     Reason::kOk,
     10,
     4,
     {to(1), to(1), to(22)}},
    {"JumpTableConstantIndexIntoRegion",
     "90 | 90 | 90 | 48 63 05 fe 00 00 00 | 48 8d 15 ef 00 00 00 | 48 01 d0 | ff e0 | c3",
     0,
     Reason::kJumpIntoRegion,
     10,
     4,
     {to(22), to(22), to(1)}},
    // cmp $1,%edi; ja ret; jmp *T(,%rdi,8); ret (at 12)
    {"AbsJumpTableUnreadable", "83 ff 01 | 77 07 | ff 24 fd 00 11 00 00 | c3", 0, Reason::kIndirectJump, 5, 2},
    // --- not optimizable ---
    {"JccBackIntoRegion", "31 c0 | ff c0 | 83 f8 0a | 7c f9 | c3", 0, Reason::kJumpIntoRegion, 7, 3},
    {"LandingPadInRegion", "31 c0 | 48 89 c7 | e8 00 10 00 00 | c3", 0, Reason::kJumpIntoRegion, 5, 2, {}, {2}},
    {"OtherSymbolInRegion", "31 c0 | 89 c7 | c3 | 90 90", 0, Reason::kJumpIntoRegion, 5, 3, {}, {4}},
    {"UnresolvableJmpRax", "48 8b 07 | 48 83 c0 08 | ff e0", 0, Reason::kIndirectJump, 7, 2},
    {"TailCallThroughGot", "48 89 f8 | 48 89 f2 | ff 25 00 01 00 00", 0, Reason::kIndirectJump, 6, 2},
    {"RegionPastEnd", "48 89 f8 | 48 01 f0 | c3", 3, Reason::kRegionPastFunctionEnd, 0, 0},
    {"IndirectCallNotLast", "31 c0 | ff d0 | 90 | c3", 0, Reason::kCallInRegion, 5, 3},
    {"RetInside", "31 c0 | c3 | b8 01 00 00 00 | c3", 0, Reason::kCrossesControlFlowEnd, 8, 3},
    {"JmpInside", "31 c0 | eb 05 | b8 01 00 00 00 | c3", 0, Reason::kCrossesControlFlowEnd, 9, 3},
    {"Int3InRegion", "cc | 48 89 e5 | 48 89 ec | c3", 0, Reason::kNotRelocatable, 7, 3},
    {"FarRipPushNotRelocatable", "ff 35 00 01 00 00 | c3", 0, Reason::kNotRelocatable, 6, 1},
    {"CallRspNotRelocatable", "48 89 e0 | ff d4 | c3", 0, Reason::kNotRelocatable, 5, 2},
    {"NotBoundary", "48 89 e5 | 48 89 ec | c3", 1, Reason::kNotInstructionBoundary, 0, 0},
    {"OutsideFunction", "48 89 e5 | 48 89 ec | c3", 7, Reason::kNotInstructionBoundary, 0, 0},
    {"InvalidBytes", "48 89 e5 | 48 89 ec | 06 | c3", 0, Reason::kDecodeFailed, 6, 2},
    {"TruncatedLastInsn", "48 89 e5 | 48 89 ec | 48 8b", 0, Reason::kDecodeFailed, 6, 2},
    {"TooSmall", "31 c0 | c3", 0, Reason::kTooSmallFunction, 0, 0},
    {"TooSmallRet", "c3", 0, Reason::kTooSmallFunction, 0, 0},
};

class RegionCase : public ::testing::TestWithParam<RegionSpec> {};

TEST_P(RegionCase, Verdict) {
    const RegionSpec &tc = GetParam();
    const std::vector<uint8_t> code = unhex(tc.code);
    std::vector<uint8_t> table;
    for (int32_t e : tc.table) {
        if (tc.abs_table) {
            const uint64_t a = kStart + static_cast<uint64_t>(e + 0x100);
            table.insert(table.end(), reinterpret_cast<const uint8_t *>(&a), reinterpret_cast<const uint8_t *>(&a) + 8);
        } else {
            table.insert(table.end(), reinterpret_cast<const uint8_t *>(&e), reinterpret_cast<const uint8_t *>(&e) + 4);
        }
    }
    const ukp::arch::ReadFn read = [&table](uint64_t addr, void *out, size_t n) {
        if (addr < kTable || addr - kTable > table.size() || n > table.size() - (addr - kTable)) return false;
        std::memcpy(out, table.data() + (addr - kTable), n);
        return true;
    };
    const FunctionMap f = analyze_function(kStart, code.data(), code.size(), read);
    std::vector<uint64_t> extra;
    for (uint64_t e : tc.extra) extra.push_back(kStart + e);
    const OptimizeCheck c = check_region(f, kStart + tc.probe, extra);
    EXPECT_EQ(c.ok, tc.reason == Reason::kOk);
    EXPECT_STREQ(reason_name(c.reason), reason_name(tc.reason));
    if (tc.dcr_len != 0) {
        EXPECT_EQ(c.dcr_len, tc.dcr_len);
    }
    if (tc.dcr_insns != 0) {
        EXPECT_EQ(c.insns.size(), tc.dcr_insns);
    }
    if (c.ok) {
        EXPECT_EQ(c.reasons, 0u);
    } else {
        EXPECT_TRUE(c.reasons & (1u << static_cast<unsigned>(c.reason)));
    }
}

INSTANTIATE_TEST_SUITE_P(region, RegionCase, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<RegionSpec> &i) { return std::string(i.param.name); });

// ---------------------------------------------------------------------------------------
// The rules that need the whole object's references (ObjectRefs), with the references
// given by hand: values (materialized addresses), branches (target, source) and function
// starts, all as offsets from kStart. Each positive case has a negative twin that differs
// by one reference or one instruction.

struct RefsSpec {
    const char *name;
    const char *code;     // the function
    const char *tail;     // the bytes after it ("" : none readable)
    Reason reason;        // expected first failed check with the references
    bool trusted = false; // expected OptimizeCheck::trusted_jumps
    bool padding = false; // expected OptimizeCheck::into_padding
    std::vector<uint64_t> values = {};
    std::vector<std::pair<uint64_t, uint64_t>> branches = {};
    std::vector<uint64_t> starts = {0, 0x40};
    std::vector<int32_t> table = {}; // int32 entries at kTable (offsets from kTable)
};

const RefsSpec kRefsCases[] = {
    // xor %eax,%eax; mov 0x10(%rdi),%rax; jmp *%rax: a tail call through a loaded pointer.
    {"TailCallLoadedPointer", "31 c0 | 48 8b 47 10 | ff e0", "", Reason::kOk, true},
    {"TailCallEntryPlus2Taken", "31 c0 | 48 8b 47 10 | ff e0", "", Reason::kJumpIntoRegion, true, false, {2}},
    {"TailCallEntryPlus2Branched",
     "31 c0 | 48 8b 47 10 | ff e0",
     "",
     Reason::kJumpIntoRegion,
     true,
     false,
     {},
     {{2, 0x80}}},
    // mov (%rdi),%rax; add $8,%rax; jmp *%rax: computed, whatever the references.
    {"ComputedTarget", "48 8b 07 | 48 83 c0 08 | ff e0", "", Reason::kIndirectJump},
    // jmp *0x18(%rax) through a vtable; jmp *0x100(%rip) through a GOT slot.
    {"VtableSlot", "48 8b 07 | 48 89 f2 | ff 60 18", "", Reason::kOk, true},
    {"GotSlot", "48 89 f8 | 48 89 f2 | ff 25 00 01 00 00", "", Reason::kOk, true},
    // jmp *%rdi: the caller's value.
    {"ArgumentPointer", "48 89 f8 | 48 89 f2 | ff e7", "", Reason::kOk, true},
    // The same, but the function branches back to its entry after computing %rdi.
    {"ArgumentRecomputedOnLoop", "48 89 f8 | 48 89 f2 | 85 c0 | 74 06 | 48 83 c7 08 | eb f0 | ff e7", "",
     Reason::kIndirectJump},
    // glibc's PTR_DEMANGLE: mov 0x20(%rax),%rax; ror $0x11,%rax; xor %fs:0x30,%rax; jmp *%rax
    {"DemangledPointer", "48 8b 40 20 | 48 c1 c8 11 | 64 48 33 04 25 30 00 00 00 | ff e0", "", Reason::kOk, true},
    // ror by another count: not the demangling.
    {"RotatedPointer", "48 8b 40 20 | 48 c1 c8 10 | 64 48 33 04 25 30 00 00 00 | ff e0", "", Reason::kIndirectJump},
    // Devirtualization check: mov (%rdi),%rax; mov 0x10(%rax),%rax; cmp 0x100(%rip),%rax;
    // jne L; ret; L: jmp *%rax -- the jmp is reached only by the jne.
    {"PointerThroughBranch", "48 8b 07 | 48 8b 40 10 | 48 3b 05 00 01 00 00 | 75 01 | c3 | ff e0", "", Reason::kOk,
     true},
    // ... but another function jumps to L (with anything in %rax).
    {"PointerThroughBranchJoinedFromOutside",
     "48 8b 07 | 48 8b 40 10 | 48 3b 05 00 01 00 00 | 75 01 | c3 | ff e0",
     "",
     Reason::kIndirectJump,
     false,
     false,
     {},
     {{0x11, 0x80}}},
    // -O0 computed goto: push %rbp; mov %rsp,%rbp; lea 0x100(%rip),%rax; add $0x10,%rax;
    // mov %rax,-8(%rbp); mov -8(%rbp),%rax; jmp *%rax -- the spill is followed to the add.
    {"SpilledComputedValue", "55 | 48 89 e5 | 48 8d 05 00 01 00 00 | 48 83 c0 10 | 48 89 45 f8 | 48 8b 45 f8 | ff e0",
     "", Reason::kIndirectJump},
    {"SpilledLeaValue", "55 | 48 89 e5 | 48 8d 05 00 01 00 00 | 48 89 45 f8 | 48 8b 45 f8 | ff e0", "", Reason::kOk,
     true},
    // The function takes the address of a label inside itself (a computed goto's &&label).
    {"LabelAddressInside", "48 8b 07 | 48 89 f2 | ff 60 18 | c3", "", Reason::kIndirectJump, false, false, {9}},
    // xor %eax,%eax; ret, then nop padding (nopl (%rax); nop x2) up to the next start at 8.
    {"ShortIntoPadding", "31 c0 | c3", "0f 1f 00 | 90 90 | 55", Reason::kOk, false, true, {}, {}, {0, 8}},
    {"ShortPaddingReachedByJump",
     "31 c0 | c3",
     "0f 1f 00 | 90 90 | 55",
     Reason::kJumpIntoRegion,
     false,
     true,
     {},
     {{3, 0x80}},
     {0, 8}},
    {"ShortPaddingAddressTaken",
     "31 c0 | c3",
     "0f 1f 00 | 90 90 | 55",
     Reason::kJumpIntoRegion,
     false,
     true,
     {4},
     {},
     {0, 8}},
    {"ShortNextFunctionInside",
     "31 c0 | c3",
     "0f 1f 00 | 90 90 | 55",
     Reason::kTooSmallFunction,
     false,
     false,
     {},
     {},
     {0, 4}},
    // No ret at the end: execution would fall into the padding.
    {"ShortFallsThrough", "31 c0 | 90", "0f 1f 00 | 90 90 | 55", Reason::kTooSmallFunction},
    {"ShortInt3Padding", "31 c0 | c3", "cc cc cc cc", Reason::kTooSmallFunction},
    {"ShortTailCall", "eb 10", "0f 1f 40 00 | 55", Reason::kOk, false, true, {}, {}, {0, 8}},
    // Through a stack slot: xor %eax,%eax; mov 0x10(%rdi),%rax; push %rax; call f;
    // pop %rcx; jmp *%rcx -- and the same with the slot overwritten by a computed value
    // (add $8,%rax; mov %rax,(%rsp)).
    {"PushedPointer", "31 c0 | 48 8b 47 10 | 50 | e8 fb 00 00 00 | 59 | ff e1", "", Reason::kOk, true},
    {"PushedPointerOverwritten", "31 c0 | 48 8b 47 10 | 50 | 48 83 c0 08 | 48 89 04 24 | 59 | ff e1", "",
     Reason::kIndirectJump},
    // Null on one path: test %rdi,%rdi; je L; mov 8(%rdi),%rax; jmp *%rax; L: xor %eax,%eax;
    // jmp *%rax -- a constant names no code.
    {"NullOnOnePath", "48 85 ff | 74 06 | 48 8b 47 08 | ff e0 | 31 c0 | ff e0", "", Reason::kOk, true},
    // A table whose base is set before a join: lea T(%rip),%rbx; test %esi,%esi; jne L;
    // call f; L: cmp $2,%edi; ja out; mov %edi,%edi; movslq (%rbx,%rdi,4),%rax;
    // add %rbx,%rax; jmp *%rax; out: ret (at 0x20). Every path to the add has %rbx = T.
    {"TableBaseOnEveryPath",
     "48 8d 1d f9 00 00 00 | 85 f6 | 75 05 | e8 fb 01 00 00 | 83 ff 02 | 77 0b | 89 ff | 48 63 04 bb | 48 01 d8 | ff "
     "e0 | c3",
     "",
     Reason::kOk,
     false,
     false,
     {},
     {},
     {0, 0x40},
     {to(0x20), to(0x20), to(0x20)}},
    {"TableBaseOnEveryPathIntoRegion",
     "48 8d 1d f9 00 00 00 | 85 f6 | 75 05 | e8 fb 01 00 00 | 83 ff 02 | 77 0b | 89 ff | 48 63 04 bb | 48 01 d8 | ff "
     "e0 | c3",
     "",
     Reason::kJumpIntoRegion,
     false,
     false,
     {},
     {},
     {0, 0x40},
     {to(0x20), to(3), to(0x20)}},
    // ... and another function jumps to the cmp, with anything in %rbx.
    {"TableBaseJoinedFromOutside",
     "48 8d 1d f9 00 00 00 | 85 f6 | 75 05 | e8 fb 01 00 00 | 83 ff 02 | 77 0b | 89 ff | 48 63 04 bb | 48 01 d8 | ff "
     "e0 | c3",
     "",
     Reason::kIndirectJump,
     false,
     false,
     {},
     {{0x10, 0x80}},
     {0, 0x40},
     {to(0x20), to(0x20), to(0x20)}},
};

void PrintTo(const RefsSpec &s, std::ostream *os) { *os << s.name; }

class RegionRefsCase : public ::testing::TestWithParam<RefsSpec> {};

TEST_P(RegionRefsCase, Verdict) {
    const RefsSpec &tc = GetParam();
    const std::vector<uint8_t> code = unhex(tc.code), tail = unhex(tc.tail);
    const ukp::arch::ReadFn read = [&](uint64_t addr, void *out, size_t n) {
        const uint64_t end = kStart + code.size();
        const size_t tbytes = tc.table.size() * sizeof(int32_t);
        if (addr >= kTable && addr - kTable <= tbytes && n <= tbytes - (addr - kTable)) {
            std::memcpy(out, reinterpret_cast<const uint8_t *>(tc.table.data()) + (addr - kTable), n);
            return true;
        }
        if (addr < end || addr - end > tail.size() || n > tail.size() - (addr - end)) return false;
        std::memcpy(out, tail.data() + (addr - end), n);
        return true;
    };
    const FunctionMap f = analyze_function(kStart, code.data(), code.size(), read);
    ukp::arch::ObjectRefs refs;
    for (uint64_t v : tc.values) refs.values.push_back(kStart + v);
    for (auto [t, from] : tc.branches) refs.branches.emplace_back(kStart + t, kStart + from);
    for (uint64_t st : tc.starts) refs.starts.push_back(kStart + st);
    std::sort(refs.values.begin(), refs.values.end());
    std::sort(refs.branches.begin(), refs.branches.end());
    const OptimizeCheck c = check_region(f, kStart, {}, 5, &refs);
    EXPECT_STREQ(reason_name(c.reason), reason_name(tc.reason));
    EXPECT_EQ(c.ok, tc.reason == Reason::kOk);
    if (c.ok) {
        EXPECT_EQ(c.trusted_jumps, tc.trusted);
        EXPECT_EQ(c.into_padding, tc.padding);
        EXPECT_GE(c.dcr_len, 5u);
    }
    // Without the references none of these rules applies.
    if (tc.trusted || tc.padding || !tc.table.empty()) {
        EXPECT_FALSE(check_region(f, kStart, {}).ok);
    }
}

INSTANTIATE_TEST_SUITE_P(region, RegionRefsCase, ::testing::ValuesIn(kRefsCases),
                         [](const ::testing::TestParamInfo<RefsSpec> &i) { return std::string(i.param.name); });

// ---------------------------------------------------------------------------------------

TEST(region, AnalyzeRecordsBoundariesTargetsAndTables) {
    const std::vector<uint8_t> code =
        unhex("83 ff 02 | 77 10 | 48 8d 05 f4 00 00 00 | 48 63 14 b8 | 48 01 c2 | ff e2 | c3");
    const int32_t entries[] = {to(21), to(5), to(16)};
    const ukp::arch::ReadFn read = [&](uint64_t addr, void *out, size_t n) {
        if (addr != kTable || n != sizeof(entries)) return false;
        std::memcpy(out, entries, n);
        return true;
    };
    const FunctionMap f = analyze_function(kStart, code.data(), code.size(), read);
    ASSERT_TRUE(f.reliable());
    const std::vector<uint64_t> insns = {kStart,      kStart + 3,  kStart + 5, kStart + 12,
                                         kStart + 16, kStart + 19, kStart + 21};
    EXPECT_EQ(f.insns, insns);
    ASSERT_EQ(f.indirect_jumps.size(), 1u);
    const IndirectJump &ij = f.indirect_jumps[0];
    EXPECT_EQ(ij.kind, IndirectJump::Kind::kTableRel32);
    EXPECT_EQ(ij.table, kTable);
    EXPECT_EQ(ij.entries, 3u);
    EXPECT_TRUE(ij.resolved);
    const std::vector<uint64_t> targets = {kStart + 5, kStart + 16, kStart + 21};
    EXPECT_EQ(f.branch_targets, targets); // ja -> 21, the table -> 21, 5, 16
    EXPECT_FALSE(f.has_unresolved_indirect_jump());
}

// Whether the function's own code jumps to its first instruction: a jcc or jmp back does,
// a recursive call does not; a jump table's entry does too (the case above: no).
TEST(region, AJumpBackToTheStartIsRecorded) {
    const ukp::arch::ReadFn none = [](uint64_t, void *, size_t) { return false; };
    // dec %rdi; jnz start; ret
    std::vector<uint8_t> code = unhex("48 ff cf | 75 fb | c3");
    EXPECT_TRUE(analyze_function(kStart, code.data(), code.size(), none).start_jumped);
    // dec %rdi; jmp start
    code = unhex("48 ff cf | eb fb");
    EXPECT_TRUE(analyze_function(kStart, code.data(), code.size(), none).start_jumped);
    // dec %rdi; call start; ret
    code = unhex("48 ff cf | e8 f8 ff ff ff | c3");
    const FunctionMap f = analyze_function(kStart, code.data(), code.size(), none);
    ASSERT_TRUE(f.reliable());
    EXPECT_EQ(f.branch_targets, std::vector<uint64_t>{kStart});
    EXPECT_FALSE(f.start_jumped);
}

TEST(region, AbsoluteJumpTableResolved) {
    // cmp $1,%edi; ja ret; jmp *T(,%rdi,8); ret, with T = 0x1100 (absolute, non-PIE style)
    const uint64_t start = 0x1000;
    const std::vector<uint8_t> code = unhex("83 ff 01 | 77 07 | ff 24 fd 00 11 00 00 | c3");
    const uint64_t entries[] = {start + 12, start + 3};
    const ukp::arch::ReadFn read = [&](uint64_t addr, void *out, size_t n) {
        if (addr != 0x1100 || n != sizeof(entries)) return false;
        std::memcpy(out, entries, n);
        return true;
    };
    const FunctionMap f = analyze_function(start, code.data(), code.size(), read);
    ASSERT_EQ(f.indirect_jumps.size(), 1u);
    EXPECT_EQ(f.indirect_jumps[0].kind, IndirectJump::Kind::kTableAbs64);
    EXPECT_TRUE(f.indirect_jumps[0].resolved);
    EXPECT_EQ(check_region(f, start, {}).reason, Reason::kJumpIntoRegion); // entry 1 -> start + 3
}

TEST(region, ByteIndexBoundsTableTo256) {
    // movzbl (%rsi),%edi; lea T(%rip),%rax; movslq (%rax,%rdi,4),%rdx; add %rax,%rdx; jmp *%rdx
    const std::vector<uint8_t> code = unhex("0f b6 3e | 48 8d 05 f6 00 00 00 | 48 63 14 b8 | 48 01 c2 | ff e2");
    size_t asked = 0;
    const ukp::arch::ReadFn read = [&](uint64_t, void *out, size_t n) {
        asked = std::max(asked, n); // the table; the tail after the function is read too
        std::memset(out, 0, n);
        return true;
    };
    const FunctionMap f = analyze_function(kStart, code.data(), code.size(), read);
    ASSERT_EQ(f.indirect_jumps.size(), 1u);
    EXPECT_TRUE(f.indirect_jumps[0].resolved);
    EXPECT_EQ(f.indirect_jumps[0].entries, 256u);
    EXPECT_EQ(asked, 256u * 4);
}

TEST(region, ReasonNamesAreDistinct) {
    std::map<std::string, int> seen;
    for (unsigned r = 0; r < static_cast<unsigned>(Reason::kCount_); ++r) {
        EXPECT_EQ(seen[reason_name(static_cast<Reason>(r))]++, 0) << r;
        EXPECT_STRNE(reason_name(static_cast<Reason>(r)), "unknown");
    }
}

// ---------------------------------------------------------------------------------------
// Landing pads
// ---------------------------------------------------------------------------------------

TEST(region, LandingPadsErrors) {
    std::vector<uint64_t> pads;
    std::string why;
    const ukp::arch::ReadFn none = [](uint64_t, void *, size_t) { return false; };
    EXPECT_EQ(ukp::arch::landing_pads(0, 0x1000, 0x2000, none, &pads, &why), -ENOENT);
    EXPECT_EQ(ukp::arch::landing_pads(0x5000, 0x1000, 0x2000, none, &pads, &why), -EFAULT);
    EXPECT_NE(why.find("0x5000"), std::string::npos) << why;
    // Version 2 of .eh_frame_hdr does not exist.
    const uint8_t bad_version[] = {2, 0x1b, 0x03, 0x3b, 0, 0, 0, 0, 0, 0, 0, 0};
    const ukp::arch::ReadFn read = [&](uint64_t addr, void *out, size_t n) {
        if (addr < 0x5000 || addr - 0x5000 + n > sizeof(bad_version)) return false;
        std::memcpy(out, bad_version + (addr - 0x5000), n);
        return true;
    };
    EXPECT_EQ(ukp::arch::landing_pads(0x5000, 0x1000, 0x2000, read, &pads, &why), -EPROTO);
    EXPECT_NE(why.find("version"), std::string::npos) << why;
    EXPECT_TRUE(pads.empty());
}

// The main program: its object, and its ELF image at the run-time bias.
struct Self {
    std::shared_ptr<const ukp::sym::Object> obj;
    std::unique_ptr<ukp::arch::ElfImage> img;
};

Self self() {
    static ukp::sym::Registry reg;
    if (reg.objects().empty()) reg.refresh();
    Self s;
    for (const auto &o : reg.objects()) {
        if (o->main_program) s.obj = o;
    }
    if (s.obj) {
        std::string err;
        s.img = ukp::arch::ElfImage::open(s.obj->path, s.obj->bias, &err);
        EXPECT_TRUE(s.img) << err;
    }
    return s;
}

} // namespace

// A function with a try/catch whose landing pad stays in the function's own section
// (no .cold split), so that the pad lies inside [value, value + size).
extern "C" __attribute__((noinline)) int ukp_region_might_throw(int x) {
    if (x > 100) throw std::runtime_error("too big");
    return x;
}

extern "C" __attribute__((noinline, optimize("no-reorder-blocks-and-partition"))) int ukp_region_catches(int x) {
    try {
        return ukp_region_might_throw(x) + 1;
    } catch (const std::exception &) {
        return -1;
    }
}

namespace {

TEST(region, LandingPadOfTryCatchIsInsideTheFunction) {
    volatile int big = 1000;
    EXPECT_EQ(ukp_region_catches(big), -1); // the pad really runs
    EXPECT_EQ(ukp_region_catches(1), 2);

    Self s = self();
    ASSERT_TRUE(s.obj && s.img);
    ASSERT_NE(s.img->eh_frame_hdr(), 0u);
    const ukp::sym::Symbol *fn = s.obj->find("ukp_region_catches");
    ASSERT_NE(fn, nullptr);
    ASSERT_GT(fn->size, 0u);
    std::vector<uint64_t> pads;
    std::string why;
    ASSERT_EQ(
        ukp::arch::landing_pads(s.img->eh_frame_hdr(), fn->value, fn->value + fn->size, s.img->reader(), &pads, &why),
        0)
        << why;
    ASSERT_FALSE(pads.empty());
    for (uint64_t p : pads) {
        EXPECT_GT(p, fn->value) << std::hex << p;
        EXPECT_LT(p, fn->value + fn->size) << std::hex << p;
    }
    // A function without try/catch has none.
    const ukp::sym::Symbol *plain = s.obj->find("ukp_region_might_throw");
    ASSERT_NE(plain, nullptr);
    std::vector<uint64_t> none;
    EXPECT_EQ(ukp::arch::landing_pads(s.img->eh_frame_hdr(), plain->value, plain->value + plain->size, s.img->reader(),
                                      &none, &why),
              0)
        << why;
    EXPECT_TRUE(none.empty());

    // A landing pad moved into the DCR would forbid the jump.
    const FunctionMap f =
        analyze_function(fn->value, reinterpret_cast<const uint8_t *>(fn->value), fn->size, s.img->reader());
    const OptimizeCheck c = check_region(f, fn->value, pads);
    if (c.ok) {
        EXPECT_EQ(check_region(f, fn->value, {fn->value + 1}).reason, Reason::kJumpIntoRegion);
    }
}

TEST(region, EveryEntryOfThisBinary) {
    Self s = self();
    ASSERT_TRUE(s.obj && s.img);
    size_t total = 0, ok = 0, pad_errors = 0;
    std::map<std::string, size_t> by_reason;
    uint64_t last = 0;
    for (const ukp::sym::Symbol &sym : s.obj->symbols()) {
        if (!sym.function || sym.size == 0 || sym.value == last || !s.obj->contains_exec(sym.value) ||
            !s.obj->contains_exec(sym.value + sym.size - 1)) {
            continue;
        }
        last = sym.value;
        // Code from the file: identical to memory here, and safe to read past the symbol.
        const uint8_t *code = s.img->bytes(sym.value, sym.size);
        ASSERT_NE(code, nullptr) << sym.name;
        const FunctionMap f = analyze_function(sym.value, code, sym.size, s.img->reader());
        std::vector<uint64_t> pads;
        std::string why;
        if (ukp::arch::landing_pads(s.img->eh_frame_hdr(), sym.value, sym.value + sym.size, s.img->reader(), &pads,
                                    &why) != 0) {
            ++pad_errors;
            ADD_FAILURE() << sym.name << ": " << why;
            continue;
        }
        const OptimizeCheck c = check_region(f, sym.value, pads);
        ++total;
        ok += c.ok;
        ++by_reason[reason_name(c.reason)];
        if (c.ok) {
            EXPECT_GE(c.dcr_len, 5u) << sym.name;
            EXPECT_LE(c.dcr_len, 5u + 14u) << sym.name;
            EXPECT_EQ(c.insns.front(), sym.value) << sym.name;
        }
    }
    std::string dist;
    for (const auto &[r, n] : by_reason) dist += r + "=" + std::to_string(n) + " ";
    RecordProperty("distribution", dist);
    std::printf("region: %zu entries, %zu optimizable: %s\n", total, ok, dist.c_str());
    EXPECT_GT(total, 500u);
    EXPECT_GT(ok * 2, total) << dist;
    EXPECT_EQ(pad_errors, 0u);
}

// ---------------------------------------------------------------------------------------
// ObjectRefs from real files.

struct EntryVerdict {
    OptimizeCheck check;
    bool analyzed = false;
};

// The verdict at every distinct function entry of the ELF file at path (file vaddrs), as
// ukp-coverage gives it: landing pads and inner symbols as extra entries, the object's
// references. Keyed by the first symbol name at each address.
std::map<std::string, EntryVerdict> entry_verdicts(const std::string &path) {
    std::map<std::string, EntryVerdict> out;
    auto obj = ukp::sym::load_object(path, 0);
    std::string err;
    auto img = ukp::arch::ElfImage::open(path, 0, &err);
    auto refs = ukp::arch::build_object_refs(path, 0, &err);
    EXPECT_TRUE(obj && img && refs) << path << ": " << err;
    if (!obj || !img || !refs) return out;
    std::vector<uint64_t> starts;
    for (const ukp::sym::Symbol &s : obj->symbols()) starts.push_back(s.value);
    std::sort(starts.begin(), starts.end());
    uint64_t last = ~0ull;
    for (const ukp::sym::Symbol &s : obj->symbols()) {
        if (!s.function || s.size == 0 || s.value == last) continue;
        last = s.value;
        EntryVerdict &v = out[s.name];
        const uint8_t *code = img->bytes(s.value, s.size);
        if (code == nullptr) continue;
        const FunctionMap f = analyze_function(s.value, code, s.size, img->reader());
        std::vector<uint64_t> extra;
        if (ukp::arch::landing_pads(img->eh_frame_hdr(), s.value, s.value + s.size, img->reader(), &extra) != 0) {
            continue;
        }
        for (auto it = std::upper_bound(starts.begin(), starts.end(), s.value);
             it != starts.end() && *it < s.value + s.size; ++it) {
            extra.push_back(*it);
        }
        v.check = check_region(f, s.value, extra, 5, refs.get());
        v.analyzed = true;
    }
    return out;
}

TEST(region, ObjectRefsOfHandWrittenFunctions) {
    auto v = entry_verdicts(UKP_REGION_REFS_FIXTURE);
    auto reason = [&](const char *name) -> std::string {
        auto it = v.find(name);
        if (it == v.end() || !it->second.analyzed) return "missing";
        return reason_name(it->second.check.reason);
    };
    EXPECT_EQ(reason("ukp_refs_tail_call"), "ok");
    EXPECT_TRUE(v["ukp_refs_tail_call"].check.trusted_jumps);
    EXPECT_EQ(reason("ukp_refs_tail_call_taken"), "jump-into-region");  // a lea of entry+2
    EXPECT_EQ(reason("ukp_refs_tail_call_reloc"), "jump-into-region");  // a RELATIVE relocation
    EXPECT_EQ(reason("ukp_refs_tail_call_jumped"), "jump-into-region"); // jne from another function
    EXPECT_EQ(reason("ukp_refs_short"), "ok");
    EXPECT_TRUE(v["ukp_refs_short"].check.into_padding);
    EXPECT_EQ(reason("ukp_refs_short_reached"), "jump-into-region"); // jmp into its padding
    const auto refs = ukp::arch::build_object_refs(UKP_REGION_REFS_FIXTURE, 0);
    ASSERT_TRUE(refs);
    EXPECT_EQ(refs->resynced_bytes, 0u);
}

// object_refs() gives the references only for the file that is loaded: its build-id (or
// .eh_frame_hdr) bytes must be what memory holds.
TEST(region, ObjectRefsOnlyForTheLoadedFile) {
    std::string err;
    auto img = ukp::arch::ElfImage::open(UKP_REGION_REFS_FIXTURE, 0x10000, &err);
    ASSERT_TRUE(img) << err;
    const auto same = img->reader();
    const auto refs = ukp::arch::object_refs(UKP_REGION_REFS_FIXTURE, 0x10000, same);
    ASSERT_TRUE(refs);
    EXPECT_FALSE(refs->identity.empty());
    const ukp::arch::ReadFn other = [&](uint64_t addr, void *out, size_t n) {
        if (!same(addr, out, n)) return false;
        static_cast<uint8_t *>(out)[n - 1] ^= 1;
        return true;
    };
    EXPECT_FALSE(ukp::arch::object_refs(UKP_REGION_REFS_FIXTURE, 0x10000, other));
    EXPECT_FALSE(ukp::arch::object_refs(UKP_REGION_REFS_FIXTURE, 0x10000, {}));
    EXPECT_TRUE(ukp::arch::object_refs(UKP_REGION_REFS_FIXTURE, 0x10000, same));
}

// The libraries this test links, by file name.
std::string loaded_path(const std::string &file) {
    static ukp::sym::Registry reg;
    if (reg.objects().empty()) reg.refresh();
    for (const auto &o : reg.objects()) {
        if (o->name == file) return o->path;
    }
    return "";
}

// Issue 4 asks for >= 99% of libc.so.6 and libstdc++.so.6 entries on the jump path; the
// floors leave a margin for other builds of the libraries (docs/performance.md has the
// figures of Debian 12's).
TEST(region, CoverageOfLibcAndLibstdcxxAboveFloors) {
    for (const auto &[file, floor] :
         {std::pair{std::string("libc.so.6"), 98.5}, std::pair{std::string("libstdc++.so.6"), 99.5}}) {
        const std::string path = loaded_path(file);
        ASSERT_FALSE(path.empty()) << file << " not loaded";
        const auto v = entry_verdicts(path);
        size_t ok = 0;
        for (const auto &[name, e] : v) ok += e.analyzed && e.check.ok;
        const double pct = 100.0 * static_cast<double>(ok) / static_cast<double>(v.size());
        std::printf("region: %s: %zu of %zu entries optimizable = %.1f%%\n", file.c_str(), ok, v.size(), pct);
        EXPECT_GE(pct, floor) << file;
    }
}

} // namespace

// The object-wide sweep's light decode gives, for every instruction of libc.so.6 and
// libstdc++.so.6 (linear sweeps of their executable segments), the length, branch target
// and lea [rip + disp] address that the full decode gives, a direct branch's flow and
// whether it is another jmp, and fails where it fails.
TEST(region, SweepDecoderAgreesWithDecodeOnLibcAndLibstdcxx) {
    size_t checked = 0;
    const ukp::arch::SweepDecoder light;
    const char *const objects[] = {"libc.so.6", "libstdc++.so.6", nullptr};
    for_each_loaded_code(objects, [&](const std::string &name, uint64_t bias, uint64_t lo, uint64_t hi) {
        const auto *bytes = reinterpret_cast<const uint8_t *>(lo);
        for (uint64_t a = lo; a < hi;) {
            ukp::arch::Insn full;
            ukp::arch::SweepInsn fast;
            const int e1 = ukp::arch::decode(a, bytes + (a - lo), hi - a, &full);
            const int e2 = light.decode(a, bytes + (a - lo), hi - a, &fast);
            EXPECT_EQ(e1, e2) << name << " +" << std::hex << (a - bias);
            if (e1 != 0 || e2 != 0) {
                ++a;
                continue;
            }
            const uint64_t lea = full.zi.mnemonic == ZYDIS_MNEMONIC_LEA && full.rip_relative ? full.rip_target : 0;
            // A direct branch is a relative one, with decode()'s flow (what analyze_function
            // takes from the sweep).
            const bool direct = full.flow == ukp::arch::Flow::kJump || full.flow == ukp::arch::Flow::kCondJump ||
                                full.flow == ukp::arch::Flow::kCall;
            bool relative = false;
            for (int k = 0; k < full.zi.operand_count; ++k)
                relative =
                    relative || (full.ops[k].type == ZYDIS_OPERAND_TYPE_IMMEDIATE && full.ops[k].imm.is_relative);
            const bool jmp = full.zi.mnemonic == ZYDIS_MNEMONIC_JMP && !relative;
            if (fast.jmp != jmp || (direct && !fast.relative) || (fast.relative && fast.flow != full.flow)) {
                ADD_FAILURE() << name << " +" << std::hex << (a - bias) << ": jmp or flow differs";
                return false;
            }
            if (fast.len != full.len || fast.target != full.target || fast.lea_target != lea) {
                ADD_FAILURE() << name << " +" << std::hex << (a - bias) << ": len " << int(fast.len) << "/"
                              << int(full.len) << " target " << fast.target << "/" << full.target << " lea "
                              << fast.lea_target << "/" << lea;
                return false;
            }
            ++checked;
            a += full.len;
        }
        return true;
    });
    EXPECT_GT(checked, 200000u) << "instructions compared";
}

// ---- islands (island.hpp) ----

// glibc's shape: a "mempcpy" at 0x1000 (mov; add; jmp rel8 to memmove+3) with 8 bytes of
// nop padding after its jmp, and a "memmove" at 0x1040 (mov; cmp; jb; ret; ret).
struct IslandCase {
    std::vector<uint8_t> bytes; // from 0x1000
    ukp::arch::ObjectRefs refs;
    FunctionMap f;
    static constexpr uint64_t kBase = 0x1000, kEntry = 0x1040, kSource = 0x1006;

    IslandCase() {
        bytes.assign(0x50, 0x90);
        const std::vector<uint8_t> pcpy = unhex("4889f8 4801d0 eb3b 0f1f840000000000");
        const std::vector<uint8_t> move = unhex("4889f8 4883fa40 7201 c3 c3");
        std::copy(pcpy.begin(), pcpy.end(), bytes.begin());
        std::copy(move.begin(), move.end(), bytes.begin() + (kEntry - kBase));
        refs.values = {kBase, kEntry};
        refs.starts = {kBase, kEntry};
        refs.branches = {{kEntry + 3, kSource}, {kEntry + 10, kEntry + 7}};
    }
    ukp::arch::ReadFn reader() const {
        return [this](uint64_t addr, void *out, size_t n) {
            if (addr < kBase || addr - kBase > bytes.size() || n > bytes.size() - (addr - kBase)) return false;
            std::memcpy(out, bytes.data() + (addr - kBase), n);
            return true;
        };
    }
    // The region check at the entry, then the plan.
    bool plan(ukp::arch::Island *island, OptimizeCheck *check = nullptr) {
        std::sort(refs.values.begin(), refs.values.end());
        std::sort(refs.branches.begin(), refs.branches.end());
        std::sort(refs.starts.begin(), refs.starts.end());
        f = analyze_function(kEntry, bytes.data() + (kEntry - kBase), 11, reader());
        const OptimizeCheck c = check_region(f, kEntry, {}, 5, &refs);
        if (check != nullptr) *check = c;
        return ukp::arch::plan_island(c, kEntry, refs, reader(), island);
    }
};

TEST(IslandTest, AShortJumpIntoTheRegionGetsAnIslandInThePaddingAfterIt) {
    IslandCase k;
    ukp::arch::Island island;
    OptimizeCheck c;
    ASSERT_TRUE(k.plan(&island, &c));
    EXPECT_EQ(c.reason, Reason::kJumpIntoRegion);
    ASSERT_EQ(c.entered_by.size(), 1u);
    EXPECT_EQ(island.source, IslandCase::kSource);
    EXPECT_EQ(island.target, IslandCase::kEntry + 3);
    EXPECT_EQ(island.at, IslandCase::kSource + 2);
    EXPECT_EQ(island.source_disp, 0x3b);
    EXPECT_EQ(island.island_disp, 0);
    EXPECT_EQ(std::vector<uint8_t>(island.orig, island.orig + 5), unhex("0f1f840000"));
}

TEST(IslandTest, NoIslandWhereAnythingElseCouldLandInTheRegionOrTheIsland) {
    ukp::arch::Island island;
    {
        IslandCase k; // the address is materialized: an indirect jump may use it
        k.refs.values.push_back(IslandCase::kEntry + 3);
        EXPECT_FALSE(k.plan(&island));
    }
    {
        IslandCase k; // a second branch enters the region
        k.refs.branches.emplace_back(IslandCase::kEntry + 3, 0x1030);
        EXPECT_FALSE(k.plan(&island));
    }
    {
        IslandCase k; // a conditional branch: the bytes after it are live
        k.bytes[IslandCase::kSource - IslandCase::kBase] = 0x74;
        EXPECT_FALSE(k.plan(&island));
    }
    {
        IslandCase k; // a function starts 3 bytes into the padding
        k.refs.starts.push_back(IslandCase::kSource + 5);
        EXPECT_FALSE(k.plan(&island));
    }
    {
        IslandCase k; // something jumps into the padding
        k.refs.branches.emplace_back(IslandCase::kSource + 4, 0x1030);
        EXPECT_FALSE(k.plan(&island));
    }
    {
        IslandCase k; // code, not padding, after the jmp
        k.bytes[IslandCase::kSource + 2 - IslandCase::kBase] = 0xc3;
        EXPECT_FALSE(k.plan(&island));
    }
    {
        IslandCase k; // the branch lands on no instruction of the region
        k.refs.branches[0].first = IslandCase::kEntry + 2;
        k.bytes[IslandCase::kSource + 1 - IslandCase::kBase] = 0x3a;
        EXPECT_FALSE(k.plan(&island));
    }
}
