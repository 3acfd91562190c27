// An object's parsed symbol table kept on disk (platform/disk_cache.hpp): a libc table
// takes milliseconds to read and sort from its debug file, at every process's first probe
// in libc. Keyed also by the separate debug file its .symtab came from; values relative
// to the load bias.
#include "symbols/symbols.hpp"

#include "platform/disk_cache.hpp"

#include <atomic>
#include <cstring>
#include <string>
#include <vector>

namespace ukp::sym {

using platform::FileKey;

namespace {

constexpr char kSymMagic[8] = {'U', 'K', 'P', 'S', 'Y', 'M', 'S', '1'};

struct SymHeader {
    platform::CacheStamp stamp;
    FileKey debug; // zero when the table came from the file alone
    uint64_t n_path, n_symbols, n_plt, n_names;
    uint64_t checksum; // of everything after the header
};

struct SymEntry {
    uint64_t value; // minus the bias
    uint64_t size;
    uint32_t name_at, name_len; // in the names that follow the entries
    uint32_t flags;             // 1 function, 2 ifunc
    uint32_t reserved;
};

std::atomic<uint64_t> g_symbol_loads{0};

bool symbol_keys(const std::string &path, const std::string &debug_path, FileKey *file, FileKey *debug) {
    *debug = FileKey{};
    return platform::file_key(path, file) && (debug_path.empty() || platform::file_key(debug_path, debug));
}

bool load_cached_symbols(const std::string &path, const std::string &debug_path, uint64_t bias,
                         detail::LazySymbols::Contents *out) {
    const std::string dir = platform::cache_dir();
    FileKey file{}, debug{};
    if (dir.empty() || platform::agent_id() == 0 || !symbol_keys(path, debug_path, &file, &debug)) return false;
    const std::string bytes =
        platform::read_cache_entry(platform::cache_entry_path(dir, "syms", path, file, debug), sizeof(SymHeader));
    if (bytes.size() < sizeof(SymHeader)) return false;
    SymHeader h;
    memcpy(&h, bytes.data(), sizeof h);
    if (!(h.stamp == platform::CacheStamp::of(kSymMagic, file)) || !(h.debug == debug) ||
        h.checksum != platform::cache_checksum(bytes.data() + sizeof h, bytes.size() - sizeof h))
        return false;
    size_t at = sizeof h;
    std::vector<char> stored_path, names;
    std::vector<SymEntry> entries;
    std::vector<std::pair<uint64_t, uint64_t>> plt;
    if (!platform::cache_take(bytes, &at, h.n_path, &stored_path) ||
        std::string(stored_path.begin(), stored_path.end()) != path ||
        !platform::cache_take(bytes, &at, h.n_symbols, &entries) || !platform::cache_take(bytes, &at, h.n_plt, &plt) ||
        !platform::cache_take(bytes, &at, h.n_names, &names) || at != bytes.size())
        return false;
    detail::LazySymbols::Contents c;
    c.symbols.reserve(entries.size());
    for (const SymEntry &e : entries) {
        if (e.name_at > names.size() || e.name_len > names.size() - e.name_at) return false;
        c.symbols.push_back(Symbol{std::string(names.data() + e.name_at, e.name_len), e.value + bias, e.size,
                                   (e.flags & 1) != 0, (e.flags & 2) != 0});
    }
    for (auto &[lo, hi] : plt) c.plt_ranges.emplace_back(lo + bias, hi + bias);
    *out = std::move(c);
    g_symbol_loads.fetch_add(1, std::memory_order_relaxed);
    return true;
}

void store_cached_symbols(const std::string &path, const std::string &debug_path, uint64_t bias,
                          const detail::LazySymbols::Contents &in) {
    const std::string dir = platform::cache_dir();
    FileKey file{}, debug{};
    if (dir.empty() || platform::agent_id() == 0 || !symbol_keys(path, debug_path, &file, &debug)) return;
    std::string body, names;
    try {
        std::vector<SymEntry> entries;
        entries.reserve(in.symbols.size());
        for (const Symbol &s : in.symbols) {
            if (names.size() > UINT32_MAX - s.name.size()) return;
            entries.push_back(SymEntry{s.value - bias, s.size, static_cast<uint32_t>(names.size()),
                                       static_cast<uint32_t>(s.name.size()),
                                       (s.function ? 1u : 0u) | (s.ifunc ? 2u : 0u), 0});
            names += s.name;
        }
        std::vector<std::pair<uint64_t, uint64_t>> plt;
        for (auto [lo, hi] : in.plt_ranges) plt.emplace_back(lo - bias, hi - bias);
        platform::cache_append(&body, path.data(), path.size());
        platform::cache_append(&body, entries.data(), entries.size());
        platform::cache_append(&body, plt.data(), plt.size());
        platform::cache_append(&body, names.data(), names.size());
    } catch (...) {
        return; // out of memory: no entry
    }
    SymHeader h{};
    h.stamp = platform::CacheStamp::of(kSymMagic, file);
    h.debug = debug;
    h.n_path = path.size();
    h.n_symbols = in.symbols.size();
    h.n_plt = in.plt_ranges.size();
    h.n_names = names.size();
    h.checksum = platform::cache_checksum(body.data(), body.size());
    platform::write_cache_entry(dir, platform::cache_entry_path(dir, "syms", path, file, debug), "syms-", &h, sizeof h,
                                body);
}

const TableStore kDiskStore{load_cached_symbols, store_cached_symbols};

} // namespace

const TableStore *disk_table_store() { return &kDiskStore; }

uint64_t tables_loaded_from_disk() { return g_symbol_loads.load(std::memory_order_relaxed); }

} // namespace ukp::sym
