// The reference tables (and, below, the symbol tables) of objects kept on disk, so that
// the next process that loads the same file skips the sweep (a tenth of a second for libc,
// most of a traced process's start). Only where UKP_CACHE_DIR names a directory (ukprobe run sets it), or, without
// it, where a controller named one (ukprobe attach: set_refs_cache_dir).
//
// A table is stored with its addresses relative to the load bias, under a name derived
// from the file's identity (path, device, inode, size, modification time) and the agent's
// own (its file's): a file replaced or an agent rebuilt finds nothing. The header repeats
// the key and a checksum covers the rest; anything that does not match, a file or
// directory another user could have written, is ignored. Writes go to a temporary file
// renamed into place, so readers see whole tables or none. Every rebuilt agent and
// upgraded library writes new entries: past kObjectRefsCacheEntries of a kind the least
// recently used go (a load marks an entry used).
#include "arch/x86_64/region.hpp"
#include "symbols/symbols.hpp"

#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace ukp::arch {
namespace {

constexpr char kMagic[8] = {'U', 'K', 'P', 'R', 'E', 'F', 'S', '2'};

struct FileKey {
    uint64_t dev, ino, size, mtime_ns;
    bool operator==(const FileKey &) const = default;
};

struct Header {
    char magic[8];
    uint64_t agent;  // hash of the agent's FileKey
    FileKey file;
    uint64_t resynced_bytes;
    uint64_t identity_offset; // identity_addr - bias
    uint64_t n_path, n_identity, n_values, n_branches, n_starts;
    uint64_t checksum; // of everything after the header
};

std::atomic<uint64_t> g_loads{0};

constexpr size_t kMaxEntries = kObjectRefsCacheEntries;

uint64_t fnv(const void *data, size_t n, uint64_t h = 0xcbf29ce484222325ull) {
    const auto *p = static_cast<const uint8_t *>(data);
    for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

// The checksum of an entry's body: four lanes over 8-byte words, each multiplied and
// rotated, then folded with the last bytes. Byte-wise FNV over libc's table (~900 KB) took a
// millisecond of every process's start; this catches the same torn or damaged files.
uint64_t checksum(const void *data, size_t n) {
    const auto *p = static_cast<const uint8_t *>(data);
    uint64_t lane[4] = {0xcbf29ce484222325ull, 0x9e3779b97f4a7c15ull, 0xc2b2ae3d27d4eb4full, 0x165667b19e3779f9ull};
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        for (int k = 0; k < 4; ++k) {
            uint64_t w;
            memcpy(&w, p + i + 8 * k, sizeof w);
            const uint64_t m = (lane[k] ^ w) * 0x100000001b3ull;
            lane[k] = (m << 29) | (m >> 35);
        }
    }
    uint64_t h = fnv(p + i, n - i);
    for (uint64_t l : lane) h = fnv(&l, sizeof l, h);
    return fnv(&n, sizeof n, h);
}

bool key_of(const struct stat &st, FileKey *key) {
    if (!S_ISREG(st.st_mode)) return false;
    *key = {static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino), static_cast<uint64_t>(st.st_size),
            static_cast<uint64_t>(st.st_mtim.tv_sec) * 1000000000ull + static_cast<uint64_t>(st.st_mtim.tv_nsec)};
    return true;
}

// The agent's own file: a rebuilt agent may build other tables.
uint64_t agent_id() {
    static const uint64_t id = [] {
        Dl_info info{};
        struct stat st{};
        FileKey key{};
        if (dladdr(reinterpret_cast<void *>(&agent_id), &info) == 0 || info.dli_fname == nullptr ||
            stat(info.dli_fname, &st) != 0 || !key_of(st, &key))
            return uint64_t{0};
        return fnv(&key, sizeof key);
    }();
    return id;
}

std::mutex g_dir_mu;
std::string &given_dir() { // under g_dir_mu
    static auto *dir = new std::string(); // never destroyed: a probe may register at exit
    return *dir;
}

// The cache directory, if UKP_CACHE_DIR (else the controller's) names one that only this
// user can write (made, mode 0700, if missing and its parent exists).
std::string cache_dir() {
    std::string given;
    const char *dir = getenv("UKP_CACHE_DIR");
    if (dir == nullptr) {
        std::lock_guard lock(g_dir_mu);
        given = given_dir();
        dir = given.c_str();
    }
    if (dir[0] != '/') return {};
    struct stat st{};
    if (lstat(dir, &st) != 0 && (mkdir(dir, 0700) != 0 || lstat(dir, &st) != 0)) return {};
    if (!S_ISDIR(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 022) != 0) return {};
    return dir;
}

// An entry's file: `prefix` ("refs" or "syms") and a hash of what it depends on.
std::string entry_path(const std::string &dir, const char *prefix, const std::string &path, const FileKey &file,
                       const FileKey &more = FileKey{}) {
    uint64_t h = fnv(path.data(), path.size());
    h = fnv(&file, sizeof file, h);
    h = fnv(&more, sizeof more, h);
    const uint64_t agent = agent_id();
    h = fnv(&agent, sizeof agent, h);
    char name[48];
    snprintf(name, sizeof name, "/%s-%016llx", prefix, static_cast<unsigned long long>(h));
    return dir + name;
}

bool file_key(const std::string &path, FileKey *key) {
    struct stat st{};
    return stat(path.c_str(), &st) == 0 && key_of(st, key);
}

template <typename T>
void append(std::string *out, const T *data, size_t n) {
    out->append(reinterpret_cast<const char *>(data), n * sizeof(T));
}

// Reads `n` items of T from `in` at *at.
template <typename T>
bool take(const std::string &in, size_t *at, size_t n, std::vector<T> *out) {
    if (n > (in.size() - *at) / sizeof(T)) return false;
    out->resize(n);
    memcpy(static_cast<void *>(out->data()), in.data() + *at, n * sizeof(T)); // T: bytes or integers
    *at += n * sizeof(T);
    return true;
}

// Removes the least recently used entries of one kind (`prefix`, "refs-" or "syms-")
// beyond kMaxEntries.
void prune(const std::string &dir, const char *prefix) {
    DIR *d = opendir(dir.c_str());
    if (d == nullptr) return;
    std::vector<std::pair<timespec, std::string>> entries;
    while (const dirent *e = readdir(d)) {
        if (strncmp(e->d_name, prefix, strlen(prefix)) != 0) continue;
        struct stat st{};
        if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0) entries.emplace_back(st.st_mtim, e->d_name);
    }
    if (entries.size() > kMaxEntries) {
        std::sort(entries.begin(), entries.end(), [](const auto &a, const auto &b) {
            return a.first.tv_sec != b.first.tv_sec ? a.first.tv_sec < b.first.tv_sec : a.first.tv_nsec < b.first.tv_nsec;
        });
        for (size_t i = 0; i + kMaxEntries < entries.size(); ++i) unlinkat(dirfd(d), entries[i].second.c_str(), 0);
    }
    closedir(d);
}

// An entry's bytes, if it is a regular file of this user's that others cannot write, at
// least `min` bytes long; marked used (the last to go when the directory is pruned).
std::string read_entry(const std::string &entry, size_t min) {
    const int fd = open(entry.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) return {};
    std::string bytes;
    struct stat st{};
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid() && (st.st_mode & 022) == 0 &&
        st.st_size >= static_cast<off_t>(min) && st.st_size < (off_t{1} << 32)) {
        bytes.resize(static_cast<size_t>(st.st_size));
        if (pread(fd, bytes.data(), bytes.size(), 0) != static_cast<ssize_t>(bytes.size())) bytes.clear();
        futimens(fd, nullptr);
    }
    close(fd);
    return bytes;
}

// Writes head and body to a temporary file renamed into place as `entry` (readers see a
// whole entry or none), then prunes the entries of its kind.
template <typename H>
void write_entry(const std::string &dir, const std::string &entry, const char *prefix, const H &head,
                 const std::string &body) {
    static std::atomic<unsigned> serial{0};
    char tmp_name[64];
    snprintf(tmp_name, sizeof tmp_name, "/.tmp-%d-%u", getpid(), serial.fetch_add(1));
    const std::string tmp = dir + tmp_name;
    const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) return;
    bool ok = write(fd, &head, sizeof head) == static_cast<ssize_t>(sizeof head);
    for (size_t at = 0; ok && at < body.size();) {
        const ssize_t n = write(fd, body.data() + at, body.size() - at);
        ok = n > 0;
        if (ok) at += static_cast<size_t>(n);
    }
    ok = close(fd) == 0 && ok;
    if (!ok || rename(tmp.c_str(), entry.c_str()) != 0) {
        unlink(tmp.c_str());
        return;
    }
    prune(dir, prefix);
}

} // namespace

void set_refs_cache_dir(const std::string &dir) {
    std::lock_guard lock(g_dir_mu);
    given_dir() = dir;
}

std::string refs_cache_dir() { return cache_dir(); }

std::shared_ptr<const ObjectRefs> load_cached_refs(const std::string &path, uint64_t bias) {
    const std::string dir = cache_dir();
    FileKey file{};
    if (dir.empty() || agent_id() == 0 || !file_key(path, &file)) return nullptr;
    const std::string bytes = read_entry(entry_path(dir, "refs", path, file), sizeof(Header));
    if (bytes.size() < sizeof(Header)) return nullptr;
    Header h;
    memcpy(&h, bytes.data(), sizeof h);
    if (memcmp(h.magic, kMagic, sizeof kMagic) != 0 || h.agent != agent_id() || !(h.file == file) ||
        h.checksum != checksum(bytes.data() + sizeof h, bytes.size() - sizeof h))
        return nullptr;
    size_t at = sizeof h;
    std::vector<char> stored_path;
    auto refs = std::make_shared<ObjectRefs>();
    if (!take(bytes, &at, h.n_path, &stored_path) || std::string(stored_path.begin(), stored_path.end()) != path ||
        !take(bytes, &at, h.n_identity, &refs->identity) || !take(bytes, &at, h.n_values, &refs->values) ||
        !take(bytes, &at, h.n_branches, &refs->branches) || !take(bytes, &at, h.n_starts, &refs->starts) ||
        at != bytes.size())
        return nullptr;
    refs->resynced_bytes = h.resynced_bytes;
    refs->identity_addr = h.identity_offset + bias;
    for (uint64_t &v : refs->values) v += bias;
    for (auto &[target, source] : refs->branches) {
        target += bias;
        source += bias;
    }
    for (uint64_t &v : refs->starts) v += bias;
    // Sorted as built unless an address wrapped around zero on the way (it never does for
    // an object's own addresses; a value naming another object might).
    if (!std::is_sorted(refs->values.begin(), refs->values.end())) std::sort(refs->values.begin(), refs->values.end());
    if (!std::is_sorted(refs->branches.begin(), refs->branches.end()))
        std::sort(refs->branches.begin(), refs->branches.end());
    if (!std::is_sorted(refs->starts.begin(), refs->starts.end())) std::sort(refs->starts.begin(), refs->starts.end());
    g_loads.fetch_add(1, std::memory_order_relaxed);
    return refs;
}

void store_cached_refs(const std::string &path, uint64_t bias, const ObjectRefs &refs) {
    const std::string dir = cache_dir();
    FileKey file{};
    if (dir.empty() || agent_id() == 0 || !file_key(path, &file)) return;
    std::string body;
    try {
        append(&body, path.data(), path.size());
        append(&body, refs.identity.data(), refs.identity.size());
        const size_t addresses_at = body.size(); // from here on, every 8 bytes an address
        append(&body, refs.values.data(), refs.values.size());
        append(&body, refs.branches.data(), refs.branches.size());
        append(&body, refs.starts.data(), refs.starts.size());
        for (size_t at = addresses_at; at < body.size(); at += sizeof(uint64_t)) {
            uint64_t v;
            memcpy(&v, body.data() + at, sizeof v);
            v -= bias;
            memcpy(body.data() + at, &v, sizeof v);
        }
    } catch (...) {
        return; // out of memory: no entry
    }
    Header h{};
    memcpy(h.magic, kMagic, sizeof kMagic);
    h.agent = agent_id();
    h.file = file;
    h.resynced_bytes = refs.resynced_bytes;
    h.identity_offset = refs.identity_addr - bias;
    h.n_path = path.size();
    h.n_identity = refs.identity.size();
    h.n_values = refs.values.size();
    h.n_branches = refs.branches.size();
    h.n_starts = refs.starts.size();
    h.checksum = checksum(body.data(), body.size());
    write_entry(dir, entry_path(dir, "refs", path, file), "refs-", h, body);
}

uint64_t object_refs_loaded_from_disk() { return g_loads.load(std::memory_order_relaxed); }

// ---- Symbol tables ----------------------------------------------------------------------
//
// An object's parsed symbol table (symbols.cpp: a libc table takes milliseconds to read and
// sort from its debug file, at every process's first probe in libc), under the same rules, keyed
// also by the separate debug file its .symtab came from. Values relative to the load bias.

namespace {

constexpr char kSymMagic[8] = {'U', 'K', 'P', 'S', 'Y', 'M', 'S', '1'};

struct SymHeader {
    char magic[8];
    uint64_t agent;
    FileKey file, debug; // debug: zero when the table came from the file alone
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
    return file_key(path, file) && (debug_path.empty() || file_key(debug_path, debug));
}

bool load_cached_symbols(const std::string &path, const std::string &debug_path, uint64_t bias,
                         sym::detail::LazySymbols::Contents *out) {
    const std::string dir = cache_dir();
    FileKey file{}, debug{};
    if (dir.empty() || agent_id() == 0 || !symbol_keys(path, debug_path, &file, &debug)) return false;
    const std::string bytes = read_entry(entry_path(dir, "syms", path, file, debug), sizeof(SymHeader));
    if (bytes.size() < sizeof(SymHeader)) return false;
    SymHeader h;
    memcpy(&h, bytes.data(), sizeof h);
    if (memcmp(h.magic, kSymMagic, sizeof kSymMagic) != 0 || h.agent != agent_id() || !(h.file == file) ||
        !(h.debug == debug) || h.checksum != checksum(bytes.data() + sizeof h, bytes.size() - sizeof h))
        return false;
    size_t at = sizeof h;
    std::vector<char> stored_path, names;
    std::vector<SymEntry> entries;
    std::vector<std::pair<uint64_t, uint64_t>> plt;
    if (!take(bytes, &at, h.n_path, &stored_path) || std::string(stored_path.begin(), stored_path.end()) != path ||
        !take(bytes, &at, h.n_symbols, &entries) || !take(bytes, &at, h.n_plt, &plt) ||
        !take(bytes, &at, h.n_names, &names) || at != bytes.size())
        return false;
    sym::detail::LazySymbols::Contents c;
    c.symbols.reserve(entries.size());
    for (const SymEntry &e : entries) {
        if (e.name_at > names.size() || e.name_len > names.size() - e.name_at) return false;
        c.symbols.push_back(sym::Symbol{std::string(names.data() + e.name_at, e.name_len), e.value + bias, e.size,
                                        (e.flags & 1) != 0, (e.flags & 2) != 0});
    }
    for (auto &[lo, hi] : plt) c.plt_ranges.emplace_back(lo + bias, hi + bias);
    *out = std::move(c);
    g_symbol_loads.fetch_add(1, std::memory_order_relaxed);
    return true;
}

void store_cached_symbols(const std::string &path, const std::string &debug_path, uint64_t bias,
                          const sym::detail::LazySymbols::Contents &in) {
    const std::string dir = cache_dir();
    FileKey file{}, debug{};
    if (dir.empty() || agent_id() == 0 || !symbol_keys(path, debug_path, &file, &debug)) return;
    std::string body, names;
    try {
        std::vector<SymEntry> entries;
        entries.reserve(in.symbols.size());
        for (const sym::Symbol &s : in.symbols) {
            if (names.size() > UINT32_MAX - s.name.size()) return;
            entries.push_back(SymEntry{s.value - bias, s.size, static_cast<uint32_t>(names.size()),
                                       static_cast<uint32_t>(s.name.size()),
                                       (s.function ? 1u : 0u) | (s.ifunc ? 2u : 0u), 0});
            names += s.name;
        }
        std::vector<std::pair<uint64_t, uint64_t>> plt;
        for (auto [lo, hi] : in.plt_ranges) plt.emplace_back(lo - bias, hi - bias);
        append(&body, path.data(), path.size());
        append(&body, entries.data(), entries.size());
        append(&body, plt.data(), plt.size());
        append(&body, names.data(), names.size());
    } catch (...) {
        return; // out of memory: no entry
    }
    SymHeader h{};
    memcpy(h.magic, kSymMagic, sizeof kSymMagic);
    h.agent = agent_id();
    h.file = file;
    h.debug = debug;
    h.n_path = path.size();
    h.n_symbols = in.symbols.size();
    h.n_plt = in.plt_ranges.size();
    h.n_names = names.size();
    h.checksum = checksum(body.data(), body.size());
    write_entry(dir, entry_path(dir, "syms", path, file, debug), "syms-", h, body);
}

const sym::TableStore kSymbolStore{load_cached_symbols, store_cached_symbols};

} // namespace

const sym::TableStore *symbol_table_store() { return &kSymbolStore; }

uint64_t symbol_tables_loaded_from_disk() { return g_symbol_loads.load(std::memory_order_relaxed); }

} // namespace ukp::arch
