// The registry mutex, and "under the registry mutex" (or "not under it") checked where a
// function states it, as the kernel's lockdep_assert_held() (lockdep_assert_not_held()). The mutex always knows its owner (a relaxed store
// at each lock and unlock: it is never taken on the hit path); assert_held() checks it in
// builds with UKP_CHECKS (scripts/test.sh's sanitizer build) and is nothing elsewhere.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>

namespace ukp::core {

class CheckedMutex {
public:
    void lock() {
        m_.lock();
        owner_.store(self(), std::memory_order_relaxed);
    }
    bool try_lock() {
        if (!m_.try_lock()) return false;
        owner_.store(self(), std::memory_order_relaxed);
        return true;
    }
    void unlock() {
        owner_.store(0, std::memory_order_relaxed);
        m_.unlock();
    }
    // Ends the process, naming `where`, unless the calling thread holds the mutex.
    void assert_held([[maybe_unused]] const char *where) const {
#ifdef UKP_CHECKS
        if (owner_.load(std::memory_order_relaxed) != self()) not_held(where);
#endif
    }
    // Ends the process, naming `where`, if the calling thread holds the mutex: for a function
    // that takes it, or waits for a thread that does.
    void assert_not_held([[maybe_unused]] const char *where) const {
#ifdef UKP_CHECKS
        if (owner_.load(std::memory_order_relaxed) == self()) held(where);
#endif
    }

private:
    // The thread pointer: the thread's identity, no system call (the child of a fork has
    // its parent's forking thread's).
    static uintptr_t self() { return reinterpret_cast<uintptr_t>(__builtin_thread_pointer()); }
    [[noreturn]] static void not_held(const char *where);
    [[noreturn]] static void held(const char *where);

    std::mutex m_;
    std::atomic<uintptr_t> owner_{0};
};

} // namespace ukp::core
