// Object: one loaded ELF object's symbols, and the tables built from them on first use.
#include "symbols/symbols.hpp"
#include "symbols/internal.hpp"

#include "platform/elf_file.hpp"
#include "platform/maps.hpp"

#include <dlfcn.h>
#include <cxxabi.h>
#include <elf.h>
#include <fcntl.h>
#include <gelf.h>
#include <libelf.h>
#include <link.h>
#include <pthread.h>
#include <sys/auxv.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <tuple>

namespace ukp::sym {

namespace detail {

// One key of the demangled-name index: the hash of a name the symbol answers to.
struct NameKey {
    uint64_t hash = 0;
    uint32_t symbol = 0; // index into Object::symbols
};

struct Tables {
    std::once_flag ends_once;
    // ends[i]: the highest end address among the function symbols in symbols[0..i]
    // (a size-0 function ends one byte after its value); 0 when there is none.
    std::vector<uint64_t> ends;

    std::once_flag names_once;
    // Hashes of every demangled form of every mangled symbol, sorted by (hash, symbol).
    // Hashes rather than strings keep this small for libstdc++; hits are verified.
    std::vector<NameKey> names;
};

LazyTables::LazyTables() : tables_(std::make_unique<Tables>()) {}
LazyTables::~LazyTables() = default;
LazyTables::LazyTables(const LazyTables &) : LazyTables() {}
LazyTables &LazyTables::operator=(const LazyTables &other) {
    if (this != &other) tables_ = std::make_unique<Tables>();
    return *this;
}

} // namespace detail

// ---- Object -------------------------------------------------------------------------

bool Object::contains_exec(uint64_t addr) const {
    for (const auto &[start, end] : exec_ranges) {
        if (addr >= start && addr < end) return true;
    }
    return false;
}

const Symbol *Object::function_at(uint64_t addr) const {
    const std::vector<Symbol> &syms = symbols();
    try {
        detail::Tables &t = tables.get();
        std::call_once(t.ends_once, [&] {
            std::vector<uint64_t> ends(syms.size());
            uint64_t high = 0;
            for (size_t i = 0; i < syms.size(); ++i) {
                const Symbol &s = syms[i];
                if (s.function) high = std::max(high, s.value + std::max<uint64_t>(s.size, 1));
                ends[i] = high;
            }
            t.ends = std::move(ends);
        });
        auto above =
            std::upper_bound(syms.begin(), syms.end(), addr, [](uint64_t a, const Symbol &s) { return a < s.value; });
        if (t.ends.size() != syms.size()) return nullptr; // symbols changed after the first query
        const Symbol *best = nullptr;
        for (size_t i = static_cast<size_t>(above - syms.begin()); i-- > 0;) {
            if (t.ends[i] <= addr) break; // no function at or below i reaches addr
            const Symbol &s = syms[i];
            if (best && s.value != best->value) break;
            bool contains = s.size == 0 ? addr == s.value : addr - s.value < s.size;
            if (s.function && contains) best = &s; // walking down: the first of equal values wins
        }
        return best;
    } catch (...) {
        return nullptr;
    }
}

const Symbol *Object::function_at_or_before(uint64_t addr) const {
    if (const Symbol *s = function_at(addr)) return s;
    const std::vector<Symbol> &syms = symbols();
    auto above =
        std::upper_bound(syms.begin(), syms.end(), addr, [](uint64_t a, const Symbol &s) { return a < s.value; });
    const Symbol *best = nullptr;
    for (size_t i = static_cast<size_t>(above - syms.begin()); i-- > 0;) {
        const Symbol &s = syms[i];
        if (best && s.value != best->value) break;
        if (s.function) best = &s;
    }
    return best;
}

const Symbol *Object::find(std::string_view name) const {
    if (name.empty()) return nullptr;
    try {
        const std::vector<Symbol> &syms = symbols();
        const Symbol *data = nullptr;
        for (const Symbol &s : syms) {
            if (s.name != name) continue;
            if (s.function) return &s;
            if (!data) data = &s;
        }
        if (data) return data;

        detail::Tables &t = tables.get();
        std::call_once(t.names_once, [&] {
            std::vector<detail::NameKey> keys;
            for (size_t i = 0; i < syms.size(); ++i) {
                if (!std::string_view(syms[i].name).starts_with("_Z")) continue;
                detail::DemangledNames(syms[i].name).for_each([&](std::string_view n) {
                    keys.push_back({detail::name_hash(n), static_cast<uint32_t>(i)});
                });
            }
            std::sort(keys.begin(), keys.end(), [](const auto &a, const auto &b) {
                return std::tie(a.hash, a.symbol) < std::tie(b.hash, b.symbol);
            });
            keys.shrink_to_fit();
            t.names = std::move(keys);
        });
        uint64_t h = detail::name_hash(name);
        auto first = std::lower_bound(t.names.begin(), t.names.end(), h,
                                      [](const detail::NameKey &k, uint64_t v) { return k.hash < v; });
        for (auto it = first; it != t.names.end() && it->hash == h; ++it) {
            if (it->symbol >= syms.size()) break; // symbols changed after the first query
            const Symbol &s = syms[it->symbol];
            if ((s.function || !data) && detail::DemangledNames(s.name).matches(name)) {
                if (s.function) return &s;
                data = &s;
            }
        }
        return data;
    } catch (...) {
        return nullptr;
    }
}

} // namespace ukp::sym
