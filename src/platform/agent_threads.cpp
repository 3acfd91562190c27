#include "platform/agent_threads.hpp"
#include "platform/raw_syscall.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <initializer_list>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>

namespace ukp::platform {

namespace {

// The stacks noted. A stack, once mapped, stays: a thread that ended leaves it kept for
// the next (as glibc keeps the stacks of ended threads in its cache), so what still points
// into a dead thread's TLS (a reader cell's owner, which the grace period reads through
// the fault-safe copy) reads memory that is there, and no mapping of the program's ever
// takes its place. An entry is set up by the thread that moved it to kTaking.
constexpr size_t kMaxThreads = 64;
constexpr size_t kGuard = 4096;
constexpr size_t kLoaderStack = 2u << 20;
// kLoader: given to a thread started from outside the agent (take_loader_stack), taken
// again once the word at `ended` (its clear_child_tid) is 0.
enum State : int { kFree, kTaking, kRunning, kKept, kLoader };

struct Noted {
    std::atomic<uint64_t> lo{0}, hi{0}; // the stack, once mapped; hi stored last
    std::atomic<int> state{kFree};
    std::atomic<uint64_t> ended{0}; // kLoader: the address the kernel clears at the thread's end
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

// Whether e is a loader's stack whose thread has ended: the kernel wrote 0 at its end
// (and pthread_join() -1 after it), as glibc's stack cache tells a free stack.
bool loader_ended(const Noted &e) {
    if (e.state.load(std::memory_order_acquire) != kLoader) return false;
    const uint64_t ended = e.ended.load(std::memory_order_acquire);
    return ended != 0 && __atomic_load_n(reinterpret_cast<const int *>(ended), __ATOMIC_ACQUIRE) <= 0;
}

// An entry in the first state of `order` that has one (kLoader: a loader's stack whose
// thread ended), moved to kTaking.
Noted *take_entry(std::initializer_list<int> order) {
    for (int from : order) {
        for (Noted &e : g_noted) {
            if (from == kLoader && !loader_ended(e)) continue;
            int expected = from;
            if (e.state.compare_exchange_strong(expected, kTaking, std::memory_order_acq_rel)) {
                e.ended.store(0, std::memory_order_relaxed);
                return &e;
            }
        }
    }
    return nullptr;
}

// Maps e's stack if it has none yet (e is kTaking). 0 or -errno.
int map_stack(Noted *e, size_t size) {
    if (e->hi.load(std::memory_order_acquire) != 0) return 0;
    const long map = raw_syscall(SYS_mmap, 0, static_cast<long>(size + kGuard), PROT_READ | PROT_WRITE,
                                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
    if (map < 0 && map > -4096) return static_cast<int>(map);
    const auto lo = static_cast<uint64_t>(map) + kGuard;
    raw_syscall(SYS_mprotect, map, kGuard, PROT_NONE); // an overflow faults instead of writing below
    e->lo.store(lo, std::memory_order_relaxed);
    e->hi.store(lo + size, std::memory_order_release); // noted before the thread runs
    return 0;
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
    Noted *e = take_entry({kKept, kFree}); // a loader's stack is smaller: loaders only
    if (e == nullptr) return -EAGAIN;
    if (const int err = map_stack(e, stack_size()); err != 0) {
        e->state.store(kFree, std::memory_order_release);
        return err;
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

int take_loader_stack(uint64_t *lo, uint64_t *size) noexcept {
    Noted *e = take_entry({kLoader, kKept, kFree}); // a loader's again where one ended
    if (e == nullptr) return -EAGAIN;
    // Enough for dlopen() of a loaded object and ukp_control_start(); only what is touched
    // costs memory. A kept stack of the agent's own threads is larger.
    if (const int err = map_stack(e, kLoaderStack); err != 0) {
        e->state.store(kFree, std::memory_order_release);
        return err;
    }
    *lo = e->lo.load(std::memory_order_relaxed);
    *size = e->hi.load(std::memory_order_relaxed) - *lo;
    e->state.store(kLoader, std::memory_order_release); // never taken again without `ended`
    return 0;
}

void note_loader_thread() noexcept {
    int here = 0;
    Noted *e = entry_of(reinterpret_cast<uint64_t>(&here));
    if (e == nullptr || e->state.load(std::memory_order_acquire) != kLoader) return;
    uint64_t ended = 0; // glibc's &pd->tid: the control block is at the top of this stack
    if (raw_syscall(SYS_prctl, PR_GET_TID_ADDRESS, reinterpret_cast<long>(&ended)) == 0 && ended >= e->lo.load() &&
        ended < e->hi.load())
        e->ended.store(ended, std::memory_order_release);
}

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
