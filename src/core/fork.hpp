// fork() in a process whose agent has threads of its own (registry.cpp).
//
// The child of fork() has one thread, the one that forked. Any lock another thread held at
// that moment stays held in the child for ever: the agent's mutexes, the trace layer's,
// and those inside the C library or a sanitizer's allocator (GCC 12's AddressSanitizer
// runtime takes no lock of its own around fork(): a child forked while another thread was
// inside malloc can hang at its first malloc). So the agent's own threads, the control
// thread, the optimizer and the tables thread, do their work inside a gate that fork()'s
// prepare handler takes first: a fork waits until they are idle (blocked in poll(),
// waiting for work, or between two tables), and a child never inherits a lock one of
// them held.
#pragma once

#include <mutex>

namespace ukp::core {

// Which agent thread a gate belongs to. Taken in this order by the prepare handler; the
// control thread may wait for the optimizer (optimizer_flush), and both for the tables
// thread, never the reverse.
enum class ForkGate { kControl, kOptimizer, kTables };

// Registers the agent's fork handlers (once): the gates, then the registry mutex, then the
// lower layers' locks, in the order normal code takes them. Called before an agent thread
// starts.
void hook_fork();

// In the child of fork(): the read sections of the threads that did not come along
// are forgotten, or a grace period (an unregistration) would wait for them for ever
// (hit.cpp).
void grace_after_fork_child();

// Held by an agent thread while it works (allocates, takes locks); a fork() waits for it.
// Never held while waiting for a program thread to leave a probe handler that could fork.
class ForkQuiet {
public:
    explicit ForkQuiet(ForkGate gate);
    ~ForkQuiet();
    ForkQuiet(const ForkQuiet &) = delete;
    ForkQuiet &operator=(const ForkQuiet &) = delete;

    // Lets fork() through while the thread waits for work (in poll()): released, then
    // taken again.
    class Unlocked {
    public:
        explicit Unlocked(const ForkQuiet &held) : held_(held) { held_.mutex_.unlock(); }
        ~Unlocked() { held_.mutex_.lock(); }
        Unlocked(const Unlocked &) = delete;
        Unlocked &operator=(const Unlocked &) = delete;

    private:
        const ForkQuiet &held_;
    };

private:
    std::mutex &mutex_;
};

} // namespace ukp::core
