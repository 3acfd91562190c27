// Which functions of an object a call can reach: a walk from given entries over direct
// calls and jumps, code addresses formed by a rip-relative lea (a function pointer
// handed on, as to clone()), and code pointers read through rip-relative memory by an
// indirect jmp or call (PLT and GOT slots, resolved IFUNCs included).
//
// Pure analysis: the object's code and data come through callbacks, so that the caller
// decides whether they are the file's bytes or the process's.
#pragma once

#include "arch/x86_64/region.hpp"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace ukp::arch {

// [lo, hi): from one function start of ObjectRefs::starts to the next.
struct FunctionRange {
    uint64_t lo = 0;
    uint64_t hi = 0;
};

struct Reach {
    std::vector<FunctionRange> functions; // sorted by lo
    bool complete = true;                 // false if the walk stopped at `limit`

    bool contains(uint64_t addr) const;
};

// The functions reachable from `entries` without entering those that start at one of
// `stops` (the error paths that end the process: the walk would otherwise take in
// printf and half of the library). Functions longer than 1 MiB are not decoded.
// `read_code` reads the original instructions; `read_data` the pointers in memory.
Reach reachable_functions(const ObjectRefs &refs, const std::vector<uint64_t> &entries,
                          const std::vector<uint64_t> &stops, const ReadFn &read_code,
                          const ReadFn &read_data, size_t limit);

} // namespace ukp::arch
