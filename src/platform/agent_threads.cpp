#include "platform/agent_threads.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <sys/mman.h>
#include <sys/resource.h>

namespace ukp::platform {

namespace {

// The stacks noted. A stack, once mapped, stays: a thread that ended leaves it kept for
// the next (as glibc keeps the stacks of ended threads in its cache), so what still points
// into a dead thread's TLS (a reader cell's owner, which the grace period reads through
// the fault-safe copy) reads memory that is there, and no mapping of the program's ever
// takes its place. An entry is set up by the thread that moved it to kTaking.
constexpr size_t kMaxThreads = 64;
constexpr size_t kGuard = 4096;
enum State : int { kFree, kTaking, kRunning, kKept };

struct Noted {
    std::atomic<uint64_t> lo{0}, hi{0}; // the stack, once mapped; hi stored last
    std::atomic<int> state{kFree};
};
Noted g_noted[kMaxThreads];

// As glibc sizes a thread's stack: RLIMIT_STACK when it is set and finite (at most 64
// MiB here), else 8 MiB. Reserved, not committed: only the pages a thread touches cost
// memory.
size_t stack_size() {
    rlimit rl{};
    size_t n = 8u << 20;
    if (getrlimit(RLIMIT_STACK, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur >= (256u << 10))
        n = std::min<size_t>(static_cast<size_t>(rl.rlim_cur), 64u << 20); // the agent's work needs no more
    return (n + 4095) & ~size_t{4095};
}

// A kept stack, else a free entry: kTaking either way.
Noted *take_entry() {
    for (int from : {kKept, kFree}) {
        for (Noted &e : g_noted) {
            int expected = from;
            if (e.state.compare_exchange_strong(expected, kTaking, std::memory_order_acq_rel)) return &e;
        }
    }
    return nullptr;
}

Noted *entry_of(uint64_t addr) {
    for (Noted &e : g_noted) {
        const uint64_t hi = e.hi.load(std::memory_order_acquire);
        if (hi != 0 && addr >= e.lo.load(std::memory_order_relaxed) && addr < hi) return &e;
    }
    return nullptr;
}

} // namespace

int start_agent_thread(pthread_t *thread, void *(*fn)(void *), void *arg) {
    Noted *e = take_entry();
    if (e == nullptr) return -EAGAIN;
    if (e->hi.load(std::memory_order_acquire) == 0) {
        const size_t size = stack_size();
        void *map = mmap(nullptr, size + kGuard, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
        if (map == MAP_FAILED) {
            const int err = -errno;
            e->state.store(kFree, std::memory_order_release);
            return err;
        }
        const auto lo = reinterpret_cast<uint64_t>(map) + kGuard;
        mprotect(map, kGuard, PROT_NONE); // an overflow faults instead of writing below
        e->lo.store(lo, std::memory_order_relaxed);
        e->hi.store(lo + size, std::memory_order_release); // noted before the thread runs
    }
    const uint64_t lo = e->lo.load(std::memory_order_relaxed), hi = e->hi.load(std::memory_order_relaxed);
    pthread_attr_t attr;
    int rc = pthread_attr_init(&attr);
    if (rc == 0) {
        rc = pthread_attr_setstack(&attr, reinterpret_cast<void *>(lo), hi - lo);
        if (rc == 0) rc = pthread_create(thread, &attr, fn, arg);
        pthread_attr_destroy(&attr);
    }
    e->state.store(rc == 0 ? kRunning : kKept, std::memory_order_release);
    return -rc;
}

void release_agent_thread(pthread_t thread) {
    // glibc's pthread_t is the thread's control block, at the top of its stack.
    if (Noted *e = entry_of(reinterpret_cast<uint64_t>(thread)); e != nullptr)
        e->state.store(kKept, std::memory_order_release);
}

bool in_agent_thread(uint64_t addr) noexcept { return entry_of(addr) != nullptr; }

void agent_threads_after_fork_child() {
    // The child has the same mappings, and none of those threads: their stacks are kept
    // for its own (the calling thread's stays in use, if it is one).
    const auto self = reinterpret_cast<uint64_t>(__builtin_thread_pointer());
    for (Noted &e : g_noted) {
        const uint64_t lo = e.lo.load(std::memory_order_relaxed), hi = e.hi.load(std::memory_order_acquire);
        if (hi != 0 && self >= lo && self < hi) continue;
        e.state.store(hi != 0 ? kKept : kFree, std::memory_order_relaxed); // also one being set up
    }
}

} // namespace ukp::platform
