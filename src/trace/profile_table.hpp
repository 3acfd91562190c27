// kprobe_profile for a reader in another process: where an agent's counters are.
//
// `ukprobe run` prints each process's kprobe_profile as the process left it, and cannot
// always ask the process: a child of fork() that has not exec'd serves no control socket,
// and a process killed by a signal is gone before anyone can ask. So the agent lists its
// counters in this table, kept with the counters themselves in the memory it shares with
// readers (counters.hpp); a reader that holds that memfd sums them as the agent's
// kprobe_profile file does, alive or not. The table is rebuilt when events are defined or
// removed; a child of fork() zeroes the counters it lists (its counts are its own).
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

// The reader's side: kprobe_profile from a process's shared counters (counters.hpp),
// mapped at `map` (`size` bytes), as the process left them: alive, exited or killed.
// Empty, with *why set, when they hold no valid table.
std::string read_profile(const uint8_t *map, size_t size, std::string *why);

} // namespace ukp::trace
