// The reference tables of objects kept on disk (platform/disk_cache.hpp), so that the next
// process that loads the same file skips the sweep (a tenth of a second for libc, most of
// a traced process's start). A table is stored with its addresses relative to the load
// bias; the header repeats the key and a checksum covers the rest.
#include "arch/x86_64/region.hpp"

#include "platform/disk_cache.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <string>
#include <vector>

namespace ukp::arch {
namespace {

using platform::FileKey;

constexpr char kMagic[8] = {'U', 'K', 'P', 'R', 'E', 'F', 'S', '2'};

struct Header {
    platform::CacheStamp stamp;
    uint64_t resynced_bytes;
    uint64_t identity_offset; // identity_addr - bias
    uint64_t n_path, n_identity, n_values, n_branches, n_starts;
    uint64_t checksum; // of everything after the header
};

std::atomic<uint64_t> g_loads{0};

} // namespace

std::shared_ptr<const ObjectRefs> load_cached_refs(const std::string &path, uint64_t bias) {
    const std::string dir = platform::cache_dir();
    FileKey file{};
    if (dir.empty() || platform::agent_id() == 0 || !platform::file_key(path, &file)) return nullptr;
    const std::string bytes =
        platform::read_cache_entry(platform::cache_entry_path(dir, "refs", path, file), sizeof(Header));
    if (bytes.size() < sizeof(Header)) return nullptr;
    Header h;
    memcpy(&h, bytes.data(), sizeof h);
    if (!(h.stamp == platform::CacheStamp::of(kMagic, file)) ||
        h.checksum != platform::cache_checksum(bytes.data() + sizeof h, bytes.size() - sizeof h))
        return nullptr;
    size_t at = sizeof h;
    std::vector<char> stored_path;
    auto refs = std::make_shared<ObjectRefs>();
    if (!platform::cache_take(bytes, &at, h.n_path, &stored_path) ||
        std::string(stored_path.begin(), stored_path.end()) != path ||
        !platform::cache_take(bytes, &at, h.n_identity, &refs->identity) ||
        !platform::cache_take(bytes, &at, h.n_values, &refs->values) ||
        !platform::cache_take(bytes, &at, h.n_branches, &refs->branches) ||
        !platform::cache_take(bytes, &at, h.n_starts, &refs->starts) || at != bytes.size())
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
    const std::string dir = platform::cache_dir();
    FileKey file{};
    if (dir.empty() || platform::agent_id() == 0 || !platform::file_key(path, &file)) return;
    std::string body;
    try {
        platform::cache_append(&body, path.data(), path.size());
        platform::cache_append(&body, refs.identity.data(), refs.identity.size());
        const size_t addresses_at = body.size(); // from here on, every 8 bytes an address
        platform::cache_append(&body, refs.values.data(), refs.values.size());
        platform::cache_append(&body, refs.branches.data(), refs.branches.size());
        platform::cache_append(&body, refs.starts.data(), refs.starts.size());
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
    h.stamp = platform::CacheStamp::of(kMagic, file);
    h.resynced_bytes = refs.resynced_bytes;
    h.identity_offset = refs.identity_addr - bias;
    h.n_path = path.size();
    h.n_identity = refs.identity.size();
    h.n_values = refs.values.size();
    h.n_branches = refs.branches.size();
    h.n_starts = refs.starts.size();
    h.checksum = platform::cache_checksum(body.data(), body.size());
    platform::write_cache_entry(dir, platform::cache_entry_path(dir, "refs", path, file), "refs-", &h, sizeof h, body);
}

uint64_t object_refs_loaded_from_disk() { return g_loads.load(std::memory_order_relaxed); }

} // namespace ukp::arch
