// kprobe_profile for a reader in another process: where an agent's counters are.
//
// A child of fork() that has not exec'd serves no control socket, so `ukprobe run`
// cannot ask it for kprobe_profile. Its agent keeps this table instead, in its own
// memory, and names it in its ring's header (RingHeader::profile_addr). The reader
// copies the table, then the counters it lists, out of the process (process_vm_readv)
// while the process waits in exit_group or execve, and sums them as the agent's
// kprobe_profile file does. The table is rebuilt (and the header's address changed) when
// events are defined or removed.
//
// Layout: ProfileTableHeader, then `events` ProfileEventEntry, then `counters`
// ProfileCounter, then the names (not NUL-terminated), `total_size` bytes in all.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ukp::trace {

inline constexpr uint32_t kProfileMagic = 0x46525055; // "UPRF"
inline constexpr uint32_t kProfileMaxSize = 16u << 20;

struct ProfileTableHeader {
    uint32_t magic;      // kProfileMagic
    uint32_t total_size; // bytes of the whole table
    uint32_t events;
    uint32_t counters;
};

struct ProfileEventEntry {
    uint32_t name_off; // from the start of the names
    uint32_t name_len;
    uint32_t first_counter;
    uint32_t counters;
};

// `count` integers of `size` bytes (4 or 8), `stride` bytes apart, from `addr` in the
// process; they add up to the event's hits, or to its misses.
struct ProfileCounter {
    uint64_t addr;
    uint16_t size;
    uint16_t count;
    uint16_t stride;
    uint16_t misses; // 0: hits, 1: misses
};

// The agent's side: one table, built event by event.
class ProfileTableBuilder {
public:
    void add_event(std::string_view name);
    // A counter of the event added last.
    void add_counter(const void *addr, uint16_t size, uint16_t count, uint16_t stride, bool misses);
    std::vector<uint8_t> finish() const;

private:
    std::vector<ProfileEventEntry> events_;
    std::vector<ProfileCounter> counters_;
    std::string names_;
};

// Sets every counter the table at `table` lists to 0 (a child of fork() counts its own
// hits from there). For the agent, in the child, single-threaded: plain stores.
void profile_table_zero(const uint8_t *table);

// One line of kprobe_profile: the event's name, its hits and its misses.
std::string profile_line(std::string_view name, uint64_t hits, uint64_t misses);

// The reader's side: kprobe_profile of process `pid` from its table at `addr`, read with
// process_vm_readv. Empty, with *why set, when the table cannot be read or is not valid.
std::string read_profile(pid_t pid, uint64_t addr, std::string *why);

} // namespace ukp::trace
