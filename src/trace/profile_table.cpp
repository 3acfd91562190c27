#include "trace/profile_table.hpp"
#include "trace/counters.hpp"

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstddef>
#include <cstdio>
#include <cstring>

namespace ukp::trace {

void ProfileTableBuilder::add_event(std::string_view name) {
    events_.push_back(ProfileEventEntry{static_cast<uint32_t>(names_.size()), static_cast<uint32_t>(name.size()),
                                        static_cast<uint32_t>(counters_.size()), 0});
    names_ += name;
}

void ProfileTableBuilder::add_counter(const void *addr, uint16_t size, uint16_t count, uint16_t stride, bool misses) {
    counters_.push_back(
        ProfileCounter{reinterpret_cast<uint64_t>(addr), size, count, stride, misses ? uint16_t{1} : uint16_t{0}});
    ++events_.back().counters;
}

std::vector<uint8_t> ProfileTableBuilder::finish() const {
    const size_t ev = events_.size() * sizeof(ProfileEventEntry), co = counters_.size() * sizeof(ProfileCounter);
    std::vector<uint8_t> out(sizeof(ProfileTableHeader) + ev + co + names_.size());
    const ProfileTableHeader h{kProfileMagic, static_cast<uint32_t>(out.size()), static_cast<uint32_t>(events_.size()),
                               static_cast<uint32_t>(counters_.size())};
    uint8_t *p = out.data();
    std::memcpy(p, &h, sizeof h);
    p += sizeof h;
    if (ev != 0) std::memcpy(p, events_.data(), ev);
    p += ev;
    if (co != 0) std::memcpy(p, counters_.data(), co);
    p += co;
    if (!names_.empty()) std::memcpy(p, names_.data(), names_.size());
    return out;
}

namespace {

const ProfileCounter *counters_of(const uint8_t *table, const ProfileTableHeader &h) {
    return reinterpret_cast<const ProfileCounter *>(table + sizeof h + h.events * sizeof(ProfileEventEntry));
}

// Whether `h` describes a table that fits in its size.
bool plausible(const ProfileTableHeader &h) {
    const uint64_t fixed =
        sizeof h + uint64_t{h.events} * sizeof(ProfileEventEntry) + uint64_t{h.counters} * sizeof(ProfileCounter);
    return h.magic == kProfileMagic && h.total_size <= kProfileMaxSize && fixed <= h.total_size;
}

} // namespace

void profile_table_zero(const uint8_t *table) {
    ProfileTableHeader h;
    std::memcpy(&h, table, sizeof h);
    if (!plausible(h)) return;
    const ProfileCounter *c = counters_of(table, h);
    for (uint32_t i = 0; i < h.counters; ++i)
        for (uint32_t k = 0; k < c[i].count; ++k) {
            const uint64_t at = c[i].addr + uint64_t{k} * c[i].stride;
            if (c[i].size == 8)
                __atomic_store_n(reinterpret_cast<uint64_t *>(at), 0, __ATOMIC_RELAXED);
            else if (c[i].size == 4)
                __atomic_store_n(reinterpret_cast<uint32_t *>(at), 0, __ATOMIC_RELAXED);
        }
}

std::string profile_line(std::string_view name, uint64_t hits, uint64_t misses) {
    char buf[64];
    std::snprintf(buf, sizeof buf, " %15" PRIu64 " %15" PRIu64 "\n", hits, misses);
    std::string line = "  ";
    line += name;
    if (name.size() < 44) line.append(44 - name.size(), ' ');
    return line + buf;
}

std::string read_profile(const uint8_t *map, size_t size, std::string *why) {
    CountersHeader h;
    if (map == nullptr || size < sizeof h) {
        *why = "the process shares no counters";
        return {};
    }
    std::memcpy(static_cast<void *>(&h), map, offsetof(CountersHeader, table_seq));
    if (h.magic != kCountersMagic || h.version != kCountersVersion || h.size > size) {
        *why = "the process's counters are not of this version";
        return {};
    }
    const auto *live = reinterpret_cast<const CountersHeader *>(map);
    // The table, copied between two equal even readings of table_seq (the agent may be
    // replacing it: a new event defined).
    std::vector<uint8_t> table;
    for (int tries = 0;; ++tries) {
        if (tries == 1000) {
            *why = "the process's counter table kept changing while it was read";
            return {};
        }
        const uint64_t seq = live->table_seq.load(std::memory_order_acquire);
        if (seq % 2 != 0) continue;
        const uint64_t off = live->table_off.load(std::memory_order_relaxed);
        const uint64_t n = live->table_size.load(std::memory_order_relaxed);
        if (off == 0 || n < sizeof(ProfileTableHeader) || n > kProfileMaxSize || off > h.size || n > h.size - off) {
            *why = "the process publishes no counter table";
            return {};
        }
        table.resize(n);
        for (uint64_t i = 0; i < n; ++i) table[i] = __atomic_load_n(map + off + i, __ATOMIC_RELAXED);
        std::atomic_thread_fence(std::memory_order_acquire);
        if (live->table_seq.load(std::memory_order_relaxed) == seq) break;
    }
    ProfileTableHeader th;
    std::memcpy(&th, table.data(), sizeof th);
    if (!plausible(th) || th.total_size != table.size()) {
        *why = "the process's counter table is not valid";
        return {};
    }
    const auto *events = reinterpret_cast<const ProfileEventEntry *>(table.data() + sizeof th);
    const ProfileCounter *counters = counters_of(table.data(), th);
    const auto *names = reinterpret_cast<const char *>(counters + th.counters);
    const size_t names_size = table.size() - static_cast<size_t>(names - reinterpret_cast<const char *>(table.data()));

    std::string text;
    for (uint32_t e = 0; e < th.events; ++e) {
        const ProfileEventEntry &ev = events[e];
        if (uint64_t{ev.name_off} + ev.name_len > names_size ||
            uint64_t{ev.first_counter} + ev.counters > th.counters) {
            *why = "the process's counter table is not valid";
            return {};
        }
        uint64_t sums[2] = {0, 0};
        for (uint32_t i = ev.first_counter; i < ev.first_counter + ev.counters; ++i) {
            const ProfileCounter &c = counters[i];
            // Where the integers are here: the table names them by the process's addresses.
            const uint64_t span = c.count == 0 ? 0 : uint64_t{c.count - 1u} * c.stride + c.size;
            if ((c.size != 4 && c.size != 8) || c.addr < h.base || c.addr - h.base > h.size ||
                span > h.size - (c.addr - h.base) || (c.addr - h.base) % c.size != 0 || c.stride % c.size != 0) {
                *why = "the process keeps a counter outside its shared counters";
                return {};
            }
            const uint8_t *at = map + (c.addr - h.base);
            for (uint32_t k = 0; k < c.count; ++k, at += c.stride) {
                // A 4-byte counter is a kretprobe's int nmissed: summed as the agent sums it.
                const uint64_t x = c.size == 4
                                       ? static_cast<uint64_t>(static_cast<int64_t>(
                                             __atomic_load_n(reinterpret_cast<const int32_t *>(at), __ATOMIC_RELAXED)))
                                       : __atomic_load_n(reinterpret_cast<const uint64_t *>(at), __ATOMIC_RELAXED);
                sums[c.misses != 0 ? 1 : 0] += x;
            }
        }
        text += profile_line(std::string_view(names + ev.name_off, ev.name_len), sums[0], sums[1]);
    }
    return text;
}

} // namespace ukp::trace
