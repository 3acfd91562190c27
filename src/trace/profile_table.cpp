#include "trace/profile_table.hpp"

#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <climits>
#include <cstdio>
#include <cstring>

namespace ukp::trace {

void ProfileTableBuilder::add_event(std::string_view name) {
    events_.push_back(ProfileEventEntry{static_cast<uint32_t>(names_.size()), static_cast<uint32_t>(name.size()),
                                        static_cast<uint32_t>(counters_.size()), 0});
    names_ += name;
}

void ProfileTableBuilder::add_counter(const void *addr, uint16_t size, uint16_t count, uint16_t stride, bool misses) {
    counters_.push_back(ProfileCounter{reinterpret_cast<uint64_t>(addr), size, count, stride, misses ? uint16_t{1} : uint16_t{0}});
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
    const uint64_t fixed = sizeof h + uint64_t{h.events} * sizeof(ProfileEventEntry) +
                           uint64_t{h.counters} * sizeof(ProfileCounter);
    return h.magic == kProfileMagic && h.total_size <= kProfileMaxSize && fixed <= h.total_size;
}

bool read_remote(pid_t pid, uint64_t addr, void *out, size_t n) {
    iovec local{out, n}, remote{reinterpret_cast<void *>(addr), n};
    return process_vm_readv(pid, &local, 1, &remote, 1, 0) == static_cast<ssize_t>(n);
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
            if (c[i].size == 8) __atomic_store_n(reinterpret_cast<uint64_t *>(at), 0, __ATOMIC_RELAXED);
            else if (c[i].size == 4) __atomic_store_n(reinterpret_cast<uint32_t *>(at), 0, __ATOMIC_RELAXED);
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

std::string read_profile(pid_t pid, uint64_t addr, std::string *why) {
    ProfileTableHeader h{};
    if (addr == 0) {
        *why = "the process publishes no counters";
        return {};
    }
    if (!read_remote(pid, addr, &h, sizeof h)) {
        *why = std::string("process_vm_readv: ") + std::strerror(errno);
        return {};
    }
    if (!plausible(h)) {
        *why = "the process's counter table is not valid";
        return {};
    }
    std::vector<uint8_t> table(h.total_size);
    if (!read_remote(pid, addr, table.data(), table.size()) || std::memcmp(table.data(), &h, sizeof h) != 0) {
        *why = "the process's counter table changed while it was read";
        return {};
    }
    const auto *events = reinterpret_cast<const ProfileEventEntry *>(table.data() + sizeof h);
    const ProfileCounter *counters = counters_of(table.data(), h);
    const auto *names = reinterpret_cast<const char *>(counters + h.counters);
    const size_t names_size = table.size() - static_cast<size_t>(names - reinterpret_cast<const char *>(table.data()));

    // Every integer the counters list, read in batches of IOV_MAX. A table read while it was
    // replaced could list anything: at most kMaxValues (16 per-CPU shards and a few misses
    // per event: tens of thousands of events).
    constexpr size_t kMaxValues = 1u << 20;
    std::vector<uint64_t> values;
    std::vector<iovec> local, remote;
    std::vector<size_t> first_value(h.counters); // counter i's integers start at values[first_value[i]]
    for (uint32_t i = 0; i < h.counters; ++i) {
        first_value[i] = remote.size();
        const ProfileCounter &c = counters[i];
        if ((c.size != 4 && c.size != 8) || c.count == 0 || c.count > 64) {
            *why = "the process's counter table is not valid";
            return {};
        }
        if (remote.size() + c.count > kMaxValues) {
            *why = "the process's counter table lists too many counters";
            return {};
        }
        for (uint32_t k = 0; k < c.count; ++k) remote.push_back({reinterpret_cast<void *>(c.addr + uint64_t{k} * c.stride), c.size});
    }
    values.assign(remote.size(), 0);
    for (size_t i = 0; i < remote.size(); ++i) local.push_back({&values[i], remote[i].iov_len});
    for (size_t at = 0; at < remote.size(); at += IOV_MAX) {
        const size_t n = std::min<size_t>(IOV_MAX, remote.size() - at);
        size_t bytes = 0;
        for (size_t i = at; i < at + n; ++i) bytes += remote[i].iov_len;
        if (process_vm_readv(pid, &local[at], n, &remote[at], n, 0) != static_cast<ssize_t>(bytes)) {
            *why = std::string("process_vm_readv: ") + (errno != 0 ? std::strerror(errno) : "short read");
            return {};
        }
    }

    std::string text;
    for (uint32_t e = 0; e < h.events; ++e) {
        const ProfileEventEntry &ev = events[e];
        if (uint64_t{ev.name_off} + ev.name_len > names_size || uint64_t{ev.first_counter} + ev.counters > h.counters) {
            *why = "the process's counter table is not valid";
            return {};
        }
        uint64_t sums[2] = {0, 0};
        for (uint32_t i = ev.first_counter; i < ev.first_counter + ev.counters; ++i) {
            const ProfileCounter &c = counters[i];
            for (uint32_t k = 0; k < c.count; ++k) {
                // A 4-byte counter is a kretprobe's int nmissed: summed as the agent sums it.
                const uint64_t raw = values[first_value[i] + k];
                const uint64_t x = c.size == 4 ? static_cast<uint64_t>(static_cast<int32_t>(raw)) : raw;
                sums[c.misses != 0 ? 1 : 0] += x;
            }
        }
        text += profile_line(std::string_view(names + ev.name_off, ev.name_len), sums[0], sums[1]);
    }
    return text;
}

} // namespace ukp::trace
