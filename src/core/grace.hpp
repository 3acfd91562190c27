// Grace periods (grace.cpp): the read side, inline for the hit path (hit.cpp's
// read_lock() and read_unlock()), and what it shares with the writer's side.
#pragma once

#include "core/core.hpp"

#include <atomic>
#include <cstdint>

namespace ukp::core {

constexpr uint64_t kDepthMask = kSectionDepthMask;
constexpr unsigned kPrivateSection = 2; // read_lock()'s answer for a section in a reader cell

// Readers inside a section begun in an epoch of each parity. Separate cache lines.
struct alignas(64) ReaderCount {
    std::atomic<long> n{0};
};

// Hidden: the hit path reaches them with a rip-relative address, as a file's own.
// The `reader` of a thread that uses the shared counters. Its word shows depth 1 for good
// (nothing writes it): trampolines.S's fast cases then go to the dispatcher.
extern ReaderCell g_no_cell __attribute__((visibility("hidden")));
extern ReaderCount g_readers[2] __attribute__((visibility("hidden")));

// The calling thread's first section: a free reader cell, claimed without a lock (or
// g_no_cell).
__attribute__((noinline)) ReaderCell *claim_cell(ThreadState &ts);
// A section on the shared counters: the parity it counts in.
unsigned shared_read_lock();

// A read section of the thread whose state is ts (the caller's), begun and ended.
__attribute__((always_inline)) inline unsigned read_lock_on(ThreadState &ts) {
    ReaderCell *cell = ts.reader;
    if (__builtin_expect(cell == nullptr, 0)) cell = claim_cell(ts);
    if (__builtin_expect(cell == &g_no_cell, 0)) return shared_read_lock();
    const uint64_t w = cell->word.load(std::memory_order_relaxed);
    // A signal handler's section between this load and the store ends before the store.
    cell->word.store((w & kDepthMask) == 0 ? (w & ~kDepthMask) + kSectionOne + 1 : w + 1, std::memory_order_relaxed);
    std::atomic_signal_fence(std::memory_order_seq_cst); // the writer's membarrier does the rest
    return kPrivateSection;
}

__attribute__((always_inline)) inline void read_unlock_on(ThreadState &ts, unsigned idx) {
    if (__builtin_expect(idx != kPrivateSection, 0)) {
        g_readers[idx & 1].n.fetch_sub(1, std::memory_order_release);
        return;
    }
    ReaderCell *cell = ts.reader;
    std::atomic_signal_fence(std::memory_order_seq_cst);
    cell->word.store(cell->word.load(std::memory_order_relaxed) - 1, std::memory_order_release);
}

} // namespace ukp::core
