// What the files of the symbols layer share, and nothing outside it uses.
#pragma once

#include "symbols/symbols.hpp"

#include <libelf.h>

#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>

namespace ukp::sym::detail {

// The forms a mangled name answers to (names.cpp).
struct DemangledNames {
    std::string full;      // "ns::f[abi:cxx11](int)"; empty when not mangled
    std::string_view base; // "ns::f[abi:cxx11]" (points into full); may be empty
    std::string untagged;  // "ns::f"; empty when base has no ABI tag

    DemangledNames(const DemangledNames &) = delete; // base points into full
    DemangledNames &operator=(const DemangledNames &) = delete;

    explicit DemangledNames(std::string_view elf_name);

    template <typename F>
    void for_each(F &&f) const {
        if (!full.empty()) f(std::string_view(full));
        if (!base.empty()) f(base);
        if (!untagged.empty()) f(std::string_view(untagged));
    }

    bool matches(std::string_view name) const {
        bool hit = false;
        for_each([&](std::string_view n) { hit = hit || n == name; });
        return hit;
    }
};

// The hash the demangled-name index keys on.
uint64_t name_hash(std::string_view s);

// Reads an object's program headers and symbol tables (elf_tables.cpp).
void parse_elf(Elf *elf, uint64_t bias, Object &obj);

// Serializes the lazy reading of symbols (LazySymbols::load), all objects at once; after
// fork() in the child, the locks a thread held that did not come along are made anew
// (registry.cpp).
std::mutex &load_mutex();
void forget_locks_at_fork();

} // namespace ukp::sym::detail
