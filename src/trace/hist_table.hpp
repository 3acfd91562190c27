// A hist trigger's table (hist.hpp), one generation of it: fixed arrays sized when the
// trigger is written, filled by probe hits without a lock. Apart from hist.cpp for tests.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "trace/bytes.hpp"

namespace ukp::trace {

// One generation of a hist table (see hist.hpp): fixed arrays sized at creation.
struct HistTable {
    uint32_t n_elts = 0;                                  // elements: the trigger's size
    uint32_t n_buckets = 0;                               // 2 * n_elts, a power of two
    uint32_t key_bytes = 0;                               // packed key size
    uint32_t n_vals = 0;                                  // sums per element, hitcount first
    std::unique_ptr<std::atomic<uint32_t>[]> bucket_hash; // 0: free
    std::unique_ptr<std::atomic<uint32_t>[]> bucket_elt;  // element index + 1; 0: not yet published
    std::unique_ptr<uint8_t[]> keys;                      // n_elts * key_bytes
    std::unique_ptr<std::atomic<uint64_t>[]> sums;        // n_elts * n_vals
    std::unique_ptr<char[]> comms;                        // n_elts * 16: .execname
    uint32_t n_vars = 0;                                  // variables per element
    std::unique_ptr<std::atomic<uint64_t>[]> vars;        // n_elts * n_vars
    std::unique_ptr<std::atomic<uint8_t>[]> var_set;      // n_elts * n_vars: set since last read
    std::atomic<uint32_t> next_elt{0};                    // elements handed out
    std::atomic<uint64_t> drops{0};                       // hits whose new key found the table full

    HistTable(uint32_t elts, uint32_t kbytes, uint32_t vals, uint32_t nvars = 0)
        : n_elts(elts), n_buckets(elts * 2), key_bytes(kbytes), n_vals(vals),
          bucket_hash(new std::atomic<uint32_t>[elts * 2]), bucket_elt(new std::atomic<uint32_t>[elts * 2]),
          keys(new uint8_t[size_t(elts) * kbytes]()), sums(new std::atomic<uint64_t>[size_t(elts) * vals]),
          comms(new char[size_t(elts) * 16]()), n_vars(nvars), vars(new std::atomic<uint64_t>[size_t(elts) * nvars]),
          var_set(new std::atomic<uint8_t>[size_t(elts) * nvars]) {
        for (size_t i = 0; i < size_t(elts) * nvars; i++) {
            vars[i].store(0, std::memory_order_relaxed);
            var_set[i].store(0, std::memory_order_relaxed);
        }
        for (uint32_t i = 0; i < n_buckets; i++) {
            bucket_hash[i].store(0, std::memory_order_relaxed);
            bucket_elt[i].store(0, std::memory_order_relaxed);
        }
        for (size_t i = 0; i < size_t(elts) * vals; i++) sums[i].store(0, std::memory_order_relaxed);
    }

    // The hits that found or made their element (the kernel's map->hits, which leaves the
    // drops out): the sum of the elements' hitcounts, added up when asked rather than
    // counted by every hit in one word all threads would share.
    uint64_t hits() const noexcept {
        const uint32_t n = std::min(next_elt.load(std::memory_order_acquire), n_elts);
        uint64_t total = 0;
        for (size_t el = 0; el < n; el++) total += sums[el * n_vals].load(std::memory_order_relaxed);
        return total;
    }

    // The hash of a key: whole 8-byte words (numbers, zero-padded strings), a word at a time.
    uint32_t hash_of(const uint8_t *key) const noexcept {
        uint64_t acc = 0x9e3779b97f4a7c15ull;
        for (uint32_t i = 0; i < key_bytes; i += 8) {
            uint64_t w;
            std::memcpy(&w, key + i, 8);
            acc = (acc ^ w) * 0xff51afd7ed558ccdull;
            acc ^= acc >> 32;
        }
        const uint32_t h = uint32_t(acc ^ (acc >> 29));
        return h == 0 ? 1 : h;
    }

    // The element of `key`, or -1 when it has none (nothing is made).
    int64_t find(const uint8_t *key) const noexcept { return find(key, hash_of(key)); }
    // The same, its hash h (hash_of) known.
    int64_t find(const uint8_t *key, uint32_t h) const noexcept {
        for (uint32_t idx = h, probes = 0; probes <= n_buckets; ++idx, ++probes) {
            idx &= n_buckets - 1;
            const uint32_t test = bucket_hash[idx].load(std::memory_order_acquire);
            if (test == 0) return -1;
            if (test != h) continue;
            const uint32_t e = bucket_elt[idx].load(std::memory_order_acquire);
            if (e && same_bytes(keys.get() + size_t(e - 1) * key_bytes, key, key_bytes)) return e - 1;
        }
        return -1;
    }

    // How often a hit looks again at a bucket another hit is filling in before passing on.
    static constexpr uint32_t kPendingWaits = 1024;

    // The element of `key`, created on first sight; -1 when the table is full (dropped).
    int64_t find_or_insert(const uint8_t *key, const char *comm) noexcept {
        return find_or_insert(key, comm, hash_of(key));
    }
    // The same, its hash h (hash_of) known.
    int64_t find_or_insert(const uint8_t *key, const char *comm, uint32_t h) noexcept {
        uint32_t idx = h, probes = 0, waits = 0;
        for (;;) {
            idx &= n_buckets - 1;
            uint32_t test = bucket_hash[idx].load(std::memory_order_acquire);
            if (test == h) {
                const uint32_t e = bucket_elt[idx].load(std::memory_order_acquire);
                if (e) {
                    if (same_bytes(keys.get() + size_t(e - 1) * key_bytes, key, key_bytes)) return e - 1;
                } else if (++waits <= kPendingWaits) {
                    continue; // another hit is filling this bucket in: look again
                }
                // Still unfilled: its thread may have been preempted (the kernel's never is,
                // and drops the hit here). Passed over: the key goes on in a bucket of its
                // own if it is new here, and published() adds up the two elements.
            } else if (test == 0) {
                if (bucket_hash[idx].compare_exchange_strong(test, h, std::memory_order_acq_rel)) {
                    if (next_elt.load(std::memory_order_relaxed) >= n_elts) {
                        bucket_hash[idx].store(0, std::memory_order_release);
                        break;
                    }
                    const uint32_t el = next_elt.fetch_add(1, std::memory_order_relaxed);
                    if (el >= n_elts) {
                        bucket_hash[idx].store(0, std::memory_order_release);
                        break;
                    }
                    copy_bytes(keys.get() + size_t(el) * key_bytes, key, key_bytes);
                    if (comm) copy_bytes(comms.get() + size_t(el) * 16, comm, bounded_strlen(comm, 15));
                    bucket_elt[idx].store(el + 1, std::memory_order_release); // publishes key and comm
                    return el;
                }
                continue; // lost the race for this bucket: look at it again
            }
            idx++;
            if (++probes > n_buckets) break;
        }
        drops.fetch_add(1, std::memory_order_relaxed);
        return -1;
    }

    // One key's line: its bytes, the comm of its first hit, its sums.
    struct Published {
        const uint8_t *key;
        const char *comm;
        std::vector<uint64_t> sums;
    };
    // The published elements, one per key: a key that a passed-over bucket made twice
    // (find_or_insert) has its sums added up. Not for the hit path.
    std::vector<Published> published() const {
        std::vector<Published> out;
        for (uint32_t b = 0; b < n_buckets; b++) {
            const uint32_t e = bucket_elt[b].load(std::memory_order_acquire);
            if (!e) continue;
            Published p{keys.get() + size_t(e - 1) * key_bytes, comms.get() + size_t(e - 1) * 16, {}};
            for (uint32_t v = 0; v < n_vals; v++)
                p.sums.push_back(sums[size_t(e - 1) * n_vals + v].load(std::memory_order_relaxed));
            out.push_back(std::move(p));
        }
        std::sort(out.begin(), out.end(),
                  [&](const Published &x, const Published &y) { return std::memcmp(x.key, y.key, key_bytes) < 0; });
        size_t kept = 0;
        for (size_t i = 0; i < out.size(); i++) {
            if (kept > 0 && std::memcmp(out[kept - 1].key, out[i].key, key_bytes) == 0) {
                for (uint32_t v = 0; v < n_vals; v++) out[kept - 1].sums[v] += out[i].sums[v];
                continue;
            }
            if (kept != i) out[kept] = std::move(out[i]);
            kept++;
        }
        out.resize(kept);
        return out;
    }
};

} // namespace ukp::trace
