// kprobe_profile's counters, in memory a reader in another process maps.
//
// `ukprobe run` prints each process's kprobe_profile when it ends. A process that dies of
// a signal never waits in exit_group, where it was asked for its counts; its private
// memory is gone with it. So the agent keeps every counter kprobe_profile sums (an
// event's hits, its misses, its probes' nmissed), and the table naming them
// (profile_table.hpp), in a memfd of its own: the reader holds the memfd (Op::kOpenFd
// kCountersPath, or pidfd_getfd for a child of fork() that serves no socket) and reads
// the counts as the process left them, alive or not.
//
// Layout: CountersHeader at offset 0; ranges allocated from kCountersFirstBlock on. The
// table's counter addresses are the process's (from CountersHeader::base).
//
// The child of fork() maps a copy in a memfd of its own at the same address before
// anything else runs there (counters_after_fork_child): its hits are not its parent's.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <sys/types.h>
#include <vector>

namespace ukp::trace {

inline constexpr uint32_t kCountersMagic = 0x544e4355; // "UCNT"
inline constexpr uint32_t kCountersVersion = 1;
inline constexpr uint64_t kCountersFirstBlock = 4096;

struct CountersHeader {
    uint32_t magic;   // kCountersMagic
    uint32_t version; // kCountersVersion
    int32_t pid;      // the process whose counters these are (a forked child maps a copy)
    uint32_t reserved;
    uint64_t base; // where the process maps them
    uint64_t size; // bytes mapped (the memfd's size)
    // The current kprobe_profile table (profile_table.hpp): its offset and bytes, 0 when
    // none. `table_seq` is odd while they change: a reader that saw it move reads again.
    std::atomic<uint64_t> table_seq;
    std::atomic<uint64_t> table_off;
    std::atomic<uint64_t> table_size;
};

// `size` bytes, aligned to 64, zeroed: in the shared memory when there is room, on the
// heap otherwise (counted all the same, but not readable once the process is gone).
// Throws std::bad_alloc as new does. Off the hit path: takes a lock.
void *counters_alloc(size_t size);
void counters_free(void *p, size_t size) noexcept;

// Makes `table` the one readers sum. The one before stays readable until the next call.
// Returns the table's address in this process (on the heap when the shared memory has no
// room: readers in other processes then find none).
const uint8_t *counters_publish_table(const std::vector<uint8_t> &table);

// A descriptor of the memfd of its own (close-on-exec), or a negative errno (-ENOENT: the
// counters are in memory no other process can map).
int counters_memfd_copy();
// The memfd moves to the calling thread's own table (ring.hpp, adopt_program_fds); then
// the program's copy is closed; a child of fork() closes its own once its supervisor has it.
int counters_adopt(pid_t from);
void counters_close_adopted();
void counters_release_fd();

// In the child of fork(), first, single-threaded: its counters in a memfd of its own,
// mapped where its parent's were, with their values (zeroed after by ring.cpp's
// after_fork_child, through the table). Once per process: later calls do nothing.
void counters_after_fork_child() noexcept;

} // namespace ukp::trace
