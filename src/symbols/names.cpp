// Demangled names: the forms a C++ symbol answers to.
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

namespace {

constexpr size_t npos = std::string_view::npos;

// The demangled name without its parameter list, trailing cv/ref qualifiers and (for
// function templates) return type: "void ns::g<int>(int) const" -> "ns::g<int>".
// Empty when `full` does not end in a parameter list.
std::string_view without_params(std::string_view full) {
    // A clone ("f(int) [clone .cold]") must not answer for the function itself.
    if (full.find(" [clone ") != npos) return {};
    std::string_view s = full;
    static constexpr std::string_view kQualifiers[] = {" const", " volatile", " &&", " &", " noexcept"};
    for (bool stripped = true; stripped;) {
        stripped = false;
        for (std::string_view q : kQualifiers) {
            if (s.ends_with(q)) {
                s.remove_suffix(q.size());
                stripped = true;
            }
        }
    }
    if (!s.ends_with(')')) return {};
    size_t open = npos;
    int depth = 0;
    for (size_t i = s.size(); i-- > 0;) {
        if (s[i] == ')') {
            ++depth;
        } else if (s[i] == '(' && --depth == 0) {
            open = i;
            break;
        }
    }
    if (open == npos || open == 0) return {};
    s = s.substr(0, open);

    // A return type ends at the last space outside brackets; spaces inside an operator
    // name ("operator new", "operator unsigned long") are not such ends.
    size_t start = 0;
    depth = 0;
    for (size_t i = 0; i < s.size(); ++i) {
        if (depth == 0 && s.substr(i).starts_with("operator") && (i == 0 || s[i - 1] == ':' || s[i - 1] == ' '))
            break; // '<' and '>' in "operator<<" are no brackets either
        switch (s[i]) {
        case '<':
        case '(':
        case '[':
        case '{':
            ++depth;
            break;
        case '>':
        case ')':
        case ']':
        case '}':
            depth -= depth > 0;
            break;
        case ' ':
            if (depth == 0) start = i + 1;
            break;
        default:
            break;
        }
    }
    return s.substr(start);
}

// `s` without its ABI tags: "ns::f[abi:cxx11]" -> "ns::f".
std::string without_abi_tags(std::string_view s) {
    std::string out;
    out.reserve(s.size());
    for (size_t i = 0; i < s.size();) {
        if (s.substr(i).starts_with("[abi:")) {
            size_t close = s.find(']', i);
            if (close != npos) {
                i = close + 1;
                continue;
            }
        }
        out += s[i++];
    }
    return out;
}

// The demangled names a symbol answers to, besides its ELF name (at most 3).

} // namespace

namespace detail {

DemangledNames::DemangledNames(std::string_view elf_name) {
    if (!elf_name.starts_with("_Z")) return;
    full = demangle(elf_name);
    if (full == elf_name) {
        full.clear();
        return;
    }
    base = without_params(full);
    if (base.find("[abi:") != npos) untagged = without_abi_tags(base);
}

uint64_t name_hash(std::string_view s) { return std::hash<std::string_view>{}(s); }

} // namespace detail

std::string demangle(std::string_view name) {
    try {
        // Only "_Z" names: __cxa_demangle also takes bare type encodings ("i" -> "int").
        if (!name.starts_with("_Z")) return std::string(name);
        std::string copy(name);
        int status = 0;
        char *out = abi::__cxa_demangle(copy.c_str(), nullptr, nullptr, &status);
        if (status != 0 || !out) {
            std::free(out);
            return copy;
        }
        std::string result = out;
        std::free(out);
        return result;
    } catch (...) {
        return {};
    }
}

} // namespace ukp::sym
