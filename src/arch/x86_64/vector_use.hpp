// Whether code is lean: whether it leaves the vector state alone (the x87, MMX, SSE, AVX
// and AVX-512 registers, their mask registers, and MXCSR).
//
// The jump path saves that state around C code because a handler is arbitrary C and the
// probed code may keep live values in it. Saving it costs more than the rest of the
// detour together (STMXCSR/LDMXCSR, 16 ymm stores and loads, VZEROUPPER); lean code needs
// none of that. The scan is a decode of every instruction the code can reach: direct
// jumps, both ways of a conditional branch, direct calls (into the callee and on after
// the call). An indirect jump or call — a PLT entry, a jump table, a function pointer —
// ends the scan with "no", except calls to the `stops` given, which the caller vouches
// for.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ukp::arch {

struct VectorScan {
    bool clean = false;      // lean: no reachable instruction touches the state
    uint64_t at = 0;         // else: the first instruction found that does, or ends the scan
    const char *why = "";    // and what it is ("vector register", "indirect call", ...)
    size_t instructions = 0; // how many instructions were decoded
};

// Reads n bytes of code at addr into buf: 0, or non-zero if they cannot be read.
using CodeReader = int (*)(uint64_t addr, uint8_t *buf, size_t n);

// Scans the code reachable from `entry` in this process. Gives up (clean = false) past
// `budget` instructions. `read` supplies the bytes: the agent's reader gives the code as
// it was before its probes (an int3 would otherwise look like the end of a path, a jump
// to a detour like the detour's code); null reads the bytes in place, fault-safe.
VectorScan scan_vector_use(uint64_t entry, const uint64_t *stops, size_t nstops, size_t budget = 20000,
                           CodeReader read = nullptr);

// How many scans this process has made (for tests).
uint64_t vector_scans();

} // namespace ukp::arch
