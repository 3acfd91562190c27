// The memfds an agent shares its process's state in, seen from ukprobe: its ring
// (trace/ring.hpp) and its kprobe_profile counters (trace/counters.hpp), found among the
// process's descriptors and taken from it, or passed by its agent; the counters mapped.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace ukprobe {

// The memfd of `pid`'s own ring, taken from the process (pidfd_getfd through `pidfd`:
// ukprobe is its ancestor; a child of fork() also holds its parent's); -1 if none.
// *number, when given, is its descriptor there.
int ring_of(int pid, int pidfd, int *number = nullptr);

// The memfd of `pid`'s own kprobe_profile counters, taken as ring_of takes the ring.
int counters_of(int pid, int pidfd);

// A process's kprobe_profile counters, mapped from the memfd it shares them in
// (src/trace/counters.hpp): read as the process left them, alive or gone.
class SharedCounts {
public:
    SharedCounts() = default;
    ~SharedCounts() { unmap(); }
    SharedCounts(const SharedCounts &) = delete;
    SharedCounts &operator=(const SharedCounts &) = delete;

    // Maps the memfd `fd` (taking it); false if it cannot.
    bool map(int fd);
    // kprobe_profile's text; empty (and *why) when not mapped or not valid.
    std::string read(std::string *why) const;

private:
    void unmap();
    const uint8_t *base_ = nullptr;
    size_t size_ = 0;
};

} // namespace ukprobe
