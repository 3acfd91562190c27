// What code of an object a call can reach: a walk of the control flow from given entries,
// over direct jumps and calls, function pointers formed by a rip-relative lea (handed on,
// as to clone()), and code pointers read through rip-relative memory by an indirect jmp
// or call (GOT entries, those behind PLT entries and resolved IFUNCs included). An
// indirect jump of another kind (a jump table) takes in its whole function.
//
// Pure analysis: the object's code and data come through callbacks, so that the caller
// decides whether they are the file's bytes or the process's.
#pragma once

#include "arch/x86_64/region.hpp"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace ukp::arch {

struct CodeRange {
    uint64_t lo = 0;
    uint64_t hi = 0;
};

struct Reach {
    std::vector<CodeRange> code; // the instructions reached: sorted, merged

    bool contains(uint64_t addr) const;
};

// The instructions reachable from `entries`, without entering the functions that start at
// one of `stops` (the error paths that end the process: the walk would otherwise take in
// printf and half of the library); each instruction is decoded once, so the walk ends
// within the object's code. `read_code` reads the original instructions; `read_data` the
// pointers in memory.
// With max_depth >= 0, only that many calls deep (a call, a function pointer formed or
// read: one level down; jumps stay at their level).
Reach reachable_code(const ObjectRefs &refs, const std::vector<uint64_t> &entries, const std::vector<uint64_t> &stops,
                     const ReadFn &read_code, const ReadFn &read_data, int max_depth = -1);

} // namespace ukp::arch
