// Loaded objects and their symbols: `[MOD:]SYM[+offs]` <-> address, function bounds.
//
// Not on the hit path: everything here may allocate and take locks.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ukp::sym {

struct Symbol {
    std::string name;   // as in the ELF file (mangled for C++)
    uint64_t value = 0; // run-time address (load bias applied)
    uint64_t size = 0;
    bool function = false; // STT_FUNC or STT_GNU_IFUNC
    bool ifunc = false;    // STT_GNU_IFUNC: `value` is the resolver, not the implementation
};

namespace detail {
struct Tables; // defined in symbols.cpp

// Owns the lookup tables an Object derives from its `symbols` on first use. Building
// them is thread-safe; a copied (or assigned-to) Object starts with empty tables.
class LazyTables {
public:
    LazyTables();
    ~LazyTables();
    LazyTables(const LazyTables &);
    LazyTables &operator=(const LazyTables &);
    Tables &get() const { return *tables_; }

private:
    std::unique_ptr<Tables> tables_;
};

// An Object's symbols and PLT ranges, read from its ELF image on first use: a refresh()
// reads only the link map, and a process probing one function of libc parses libc alone
// (the agent's own libraries, libstdc++ among them, cost milliseconds each at every start).
// Loading is thread-safe; a copy takes the loaded contents, or the source to load them from.
class LazySymbols {
public:
    struct Source {
        std::string open_path;                     // a file to open, or
        std::pair<uint64_t, uint64_t> image{0, 0}; // an ELF image in memory (the vdso)
        uint64_t bias = 0;
    };

    LazySymbols() = default;
    explicit LazySymbols(Source source) : source_(std::move(source)) {}
    LazySymbols(const LazySymbols &other);
    LazySymbols &operator=(const LazySymbols &other);

    const std::vector<Symbol> &symbols() const { return load().symbols; }
    const std::vector<std::pair<uint64_t, uint64_t>> &plt_ranges() const { return load().plt_ranges; }
    void set(std::vector<Symbol> symbols, std::vector<std::pair<uint64_t, uint64_t>> plt_ranges);
    bool loaded() const { return loaded_.load(std::memory_order_acquire); }

    struct Contents {
        std::vector<Symbol> symbols;
        std::vector<std::pair<uint64_t, uint64_t>> plt_ranges;
    };

private:
    const Contents &load() const;

    Source source_;
    mutable Contents contents_;
    mutable std::atomic<bool> loaded_{false};
};
} // namespace detail

// Parsed tables kept between processes: the agent keeps them on disk (table_cache.cpp),
// where a cache directory is set (platform/disk_cache.hpp). Keyed by the file a table
// was read from and the separate debug file that gave its .symtab ("" when none); values
// relative to nothing: `bias` is what the caller's table has added (load adds it back).
struct TableStore {
    bool (*load)(const std::string &path, const std::string &debug_path, uint64_t bias,
                 detail::LazySymbols::Contents *out);
    void (*store)(const std::string &path, const std::string &debug_path, uint64_t bias,
                  const detail::LazySymbols::Contents &in);
};
// The store LazySymbols asks before it parses a file, and gives what it parsed; null: none.
void set_table_store(const TableStore *store);
// The store on disk (table_cache.cpp), and how many tables this process took from it.
const TableStore *disk_table_store();
uint64_t tables_loaded_from_disk();

// One ELF object mapped into the process (the main program, a shared library, the vdso).
struct Object {
    std::string path; // as the dynamic linker knows it ("" for the main program is
                      // replaced by /proc/self/exe's target)
    std::string name; // file name only: "libc.so.6", "sample_target"
    // Other names a definition's MOD may give it (Registry::resolve): the path the main
    // program was executed as and its file name ("python3" for python3.11 run through
    // the link /usr/bin/python3), /proc/self/exe and /proc/PID/exe, the path without the
    // " (deleted)" of an executable removed or replaced since it started, a library's
    // path with its links resolved.
    std::vector<std::string> aliases;
    uint64_t bias = 0; // load bias (dlpi_addr)
    bool main_program = false;
    unsigned load_index = 0; // order in the link map: 0 for the main program
    // Executable PT_LOAD ranges, run-time addresses, [start, end).
    std::vector<std::pair<uint64_t, uint64_t>> exec_ranges;
    // Symbols from .symtab when the file has one (or its separate debug file under
    // /usr/lib/debug/.build-id has one), merged with .dynsym; sorted by value, and at
    // one address the preferred name first (function, sized, global, fewer leading
    // underscores, shorter). Read from the file at the first call (see LazySymbols).
    const std::vector<Symbol> &symbols() const { return contents.symbols(); }
    // Sections holding PLT entries, run-time addresses, [start, end): decoding may start there.
    const std::vector<std::pair<uint64_t, uint64_t>> &plt_ranges() const { return contents.plt_ranges(); }
    // For hand-made objects (tests): the symbols as they are, sorted as above. Must not
    // change once the object has been queried.
    void set_symbols(std::vector<Symbol> s) { contents.set(std::move(s), {}); }

    detail::LazySymbols contents;
    // Built from `symbols` by the first function_at()/find().
    detail::LazyTables tables;

    bool contains_exec(uint64_t addr) const;
    // The function symbol containing addr (value <= addr < value + size; a size-0
    // symbol contains only its own address), or null. The innermost one when
    // functions nest; at one address the first (preferred) one.
    const Symbol *function_at(uint64_t addr) const;
    // The function symbol containing addr, else the nearest function symbol below it.
    const Symbol *function_at_or_before(uint64_t addr) const;
    // Finds a symbol by exact ELF name or by demangled name (full demangled string, or
    // the demangled name without its parameter list, e.g. "ns::f" for "ns::f(int)",
    // also without ABI tags: "ns::g" for "ns::g[abi:cxx11](int)"). The first match in
    // address order, functions before data; exact ELF names before demangled ones.
    // The first demangled lookup demangles the whole table once.
    const Symbol *find(std::string_view name) const;
};

// A snapshot of the loaded objects. Cheap to query; refresh() re-reads the link map
// and reuses the parsed symbol tables of objects that are still loaded. Empty until the
// first refresh(). Not synchronized: callers serialize refresh() against queries.
class Registry {
public:
    // The objects a process maps, as /proc/PID/maps showed them.
    struct ProcessMaps {
        struct File {
            std::string path;        // as maps names it ("[vdso]" for the vdso)
            uint64_t first_exec = 0; // start of its lowest executable mapping
        };
        std::string exe;         // the main program's path
        std::vector<File> files; // with an executable mapping
    };

    Registry();
    ~Registry();

    void refresh();
    // The same for another process, from outside it: the objects of /proc/PID/maps
    // (files with an executable mapping, and the vdso, whose image is this process's
    // own), the main program first. For a reader that prints the process's addresses.
    // `remembered`, when given, keeps what maps showed (read_maps), and is used instead
    // once the process is gone: its maps with it, its files stay. Objects already parsed
    // are kept when neither names any.
    void refresh_from_maps(int pid, ProcessMaps *remembered = nullptr);
    // What /proc/PID/maps shows now (a read of one small file; nothing is parsed).
    static ProcessMaps read_maps(int pid);
    // The objects `maps` names, from their files as they are now (a recorded process's,
    // printed later: ukprobe report). Objects already parsed are kept when it names none.
    void load_maps(const ProcessMaps &maps);
    const std::vector<std::shared_ptr<const Object>> &objects() const { return objects_; }

    // The object whose executable ranges contain addr, or null.
    const Object *object_at(uint64_t addr) const;

    // Resolves "sym" or "MOD:sym" plus offset to an address.
    //   -ENOENT: no such object or symbol
    //   -EINVAL: empty MOD or sym, null addr
    // With no MOD, the main program is searched first, then the others in load order.
    // MOD is matched against Object::name, the full path, and Object::aliases; a MOD
    // with a '/' also by where its links lead (realpath). MOD ends at the
    // first single ':' outside brackets: "ns::f" and "f[abi:cxx11]()" have no MOD.
    // `skip`, when given, passes over definitions an unqualified name should not find
    // (the agent's own interposers of libc functions); "MOD:sym" is never skipped.
    // `call_resolvers` false: an ifunc symbol gives -EAGAIN instead of calling its
    // resolver (for objects mapped but not yet relocated by the dynamic linker).
    using SkipFn = bool (*)(const Object &, const Symbol &);
    int resolve(std::string_view spec, uint64_t offset, uint64_t *addr, SkipFn skip = nullptr,
                bool call_resolvers = true) const;

    // The MOD of "MOD:sym" ("" when there is none), and whether an object of that name
    // or path is loaded.
    static std::string_view module_of(std::string_view spec);
    bool has_module(std::string_view module) const;
    // The objects MOD names (as resolve() matches it), in load order; every object for "".
    std::vector<const Object *> objects_named(std::string_view module) const;

    // For list output: "sym+0xoff" and the object's name for an address.
    struct Location {
        const Object *object = nullptr; // whose executable ranges hold the address
        const Symbol *symbol = nullptr; // containing function, else nearest one below
        uint64_t offset = 0;            // from symbol->value, or from object->bias
    };
    Location locate(uint64_t addr) const;

private:
    // `alive_pid`: the process is alive (its main program is opened through /proc/PID/exe);
    // `pid`: whose aliases the objects get (0: none).
    void load_maps(const ProcessMaps &maps, int alive_pid, int pid);
    std::vector<std::shared_ptr<const Object>> objects_;
    // The link map's counts of objects loaded and unloaded (dlpi_adds, dlpi_subs) when
    // refresh() last read objects_ from it; false when objects_ came from elsewhere.
    bool from_link_map_ = false;
    unsigned long long link_adds_ = 0, link_subs_ = 0;
};

// Parses one ELF file's symbols (for tests and for Registry). `bias` is added to values.
// Fills path, name (path's file name), bias, exec_ranges (from the file's program
// headers), plt_ranges and symbols (read now). Null when the file cannot be read as ELF.
std::shared_ptr<Object> load_object(const std::string &path, uint64_t bias);

// "_ZN2ns1fEi" -> "ns::f(int)"; a non-mangled name (one not starting with "_Z") or
// one the demangler rejects is returned unchanged.
std::string demangle(std::string_view name);

// One site of an SDT probe (<sys/sdt.h>: the .note.stapsdt notes of an object), at its
// run-time addresses.
struct SdtProbe {
    std::string provider, name;
    uint64_t pc = 0;        // the site: a nop where the probe goes
    uint64_t semaphore = 0; // its 16-bit semaphore (0: none), raised while a tracer is attached
    std::string args;       // the note's argument specs, blank-separated: "8@%rdi -4@-20(%rbp)"
};
// The SDT probe sites of `obj`, read from its file (sdt.cpp); empty when it has none.
std::vector<SdtProbe> sdt_probes(const Object &obj);

} // namespace ukp::sym
