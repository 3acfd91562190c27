// Islands: a way onto the jump path for a function entry that code elsewhere enters a few
// bytes in.
//
// glibc's assembly shares one body between `mempcpy` and `memmove`/`memcpy`: `mempcpy`
// sets its return value and goes on with `jmp rel8` to memmove+3, past memmove's first
// instruction. A 5-byte jmp at memmove's entry would cover memmove+3, so the region check
// refuses it (kJumpIntoRegion), and the function programs call most stays a breakpoint.
//
// The short branch cannot reach the detour (anywhere within 2 GiB), but the alignment
// padding after it is dead: nothing runs or names it. An island is a `jmp rel32` written
// there that leads to the detour's copy of the instruction the branch entered at; the
// branch's displacement byte is then changed to lead to the island. One byte, so every
// thread sees the old branch or the new one, and both are right while the region's bytes
// are the original ones: the optimizer redirects the branch before it writes the entry's
// jmp, and puts it back after it took the jmp out (core/optimizer.cpp).
//
// Pure analysis of bytes, as region.hpp.
#pragma once

#include "arch/x86_64/region.hpp"

#include <cstdint>

namespace ukp::arch {

inline constexpr size_t kIslandSize = 5; // a jmp rel32

struct Island {
    uint64_t source = 0;            // the `jmp rel8` whose target is inside the region
    uint64_t target = 0;            // where it enters the region: an instruction of the DCR
    uint64_t at = 0;                // the island: kIslandSize dead bytes in the branch's reach
    uint8_t source_disp = 0;        // the branch's displacement byte (at source + 1), as the file has it
    uint8_t island_disp = 0;        // the displacement that leads the branch to `at`
    uint8_t orig[kIslandSize] = {}; // the island's bytes as the file has them
};

// Plans an island for a probe at addr whose region check `c` (with refs) failed for a
// jump into the region and nothing else. It takes:
// - one branch into the region in the whole object (c.entered_by), landing on an
//   instruction of the DCR; a `jmp rel8` (2 bytes, EB disp8) outside the region, as
//   `read` shows it;
// - nop or int3 padding right after that jmp (dead: the jmp does not fall through),
//   kIslandSize bytes of it at least, before the next function start, that no value or
//   branch of the object lands in.
// A conditional branch's next bytes are live; another place in reach would need a
// padding search this does not do.
// False when any of that does not hold (*out is then unspecified).
bool plan_island(const OptimizeCheck &c, uint64_t addr, const ObjectRefs &refs, const ReadFn &read, Island *out);

} // namespace ukp::arch
