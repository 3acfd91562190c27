// Loaded objects and their symbols: `[MOD:]SYM[+offs]` <-> address, function bounds.
//
// Not on any hot path: everything here may allocate and take locks.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ukp::sym {

struct Symbol {
    std::string name;      // as in the ELF file (mangled for C++)
    uint64_t value = 0;    // run-time address (load bias applied)
    uint64_t size = 0;
    bool function = false; // STT_FUNC or STT_GNU_IFUNC
};

// One ELF object mapped into the process (the main program, a shared library, the vdso).
struct Object {
    std::string path;   // as the dynamic linker knows it ("" for the main program is
                        // replaced by /proc/self/exe's target)
    std::string name;   // file name only: "libc.so.6", "sample_target"
    uint64_t bias = 0;  // load bias (dlpi_addr)
    bool main_program = false;
    unsigned load_index = 0; // order in the link map: 0 for the main program
    // Executable PT_LOAD ranges, run-time addresses, [start, end).
    std::vector<std::pair<uint64_t, uint64_t>> exec_ranges;
    // Sections holding PLT stubs, run-time addresses, [start, end): decoding may start there.
    std::vector<std::pair<uint64_t, uint64_t>> plt_ranges;
    // Symbols from .symtab when the file has one, else .dynsym; sorted by value.
    std::vector<Symbol> symbols;

    bool contains_exec(uint64_t addr) const;
    // The function symbol containing addr (value <= addr < value + size), or null.
    const Symbol *function_at(uint64_t addr) const;
    // Finds a symbol by exact ELF name or by demangled name (full demangled string, or
    // the demangled name without its parameter list, e.g. "ns::f" for "ns::f(int)").
    const Symbol *find(std::string_view name) const;
};

// A snapshot of the loaded objects. Cheap to query; refresh() re-reads the link map
// and reuses the parsed symbol tables of objects that are still loaded.
class Registry {
public:
    Registry();
    ~Registry();

    void refresh();
    const std::vector<std::shared_ptr<const Object>> &objects() const { return objects_; }

    // The object whose executable ranges contain addr, or null.
    const Object *object_at(uint64_t addr) const;

    // Resolves "sym" or "MOD:sym" plus offset to an address.
    //   -ENOENT: no such object or symbol
    // With no MOD, the main program is searched first, then the others in load order.
    // MOD is matched against Object::name, or against the full path.
    int resolve(std::string_view spec, uint64_t offset, uint64_t *addr) const;

    // For list output: "sym+0xoff" and the object's name for an address.
    struct Location {
        const Object *object = nullptr;
        const Symbol *symbol = nullptr;
        uint64_t offset = 0;
    };
    Location locate(uint64_t addr) const;

private:
    std::vector<std::shared_ptr<const Object>> objects_;
};

// Parses one ELF file's symbols (for tests and for Registry). `bias` is added to values.
std::shared_ptr<Object> load_object(const std::string &path, uint64_t bias);

// "_ZN2ns1fEi" -> "ns::f(int)"; a non-mangled name is returned unchanged.
std::string demangle(std::string_view name);

} // namespace ukp::sym
