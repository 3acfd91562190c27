// The registry mutex knows its owner, and a function that must run under it stops the
// process when it does not (UKP_CHECKS builds: scripts/test.sh's sanitizer build).
#include "core/checked_mutex.hpp"
#include "core/core.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <thread>

namespace {

using ukp::core::CheckedMutex;

TEST(CheckedMutex, TheThreadThatHoldsItPassesTheCheck) {
    CheckedMutex m;
    {
        std::lock_guard lock(m);
        m.assert_held("the test");
    }
    ASSERT_TRUE(m.try_lock());
    m.assert_held("the test");
    m.unlock();
    m.assert_not_held("the test");
    std::lock_guard lock(ukp::core::registry_mutex());
    UKP_ASSERT_REGISTRY_HELD();
}

#ifdef UKP_CHECKS
TEST(CheckedMutexDeathTest, AFunctionRunOutsideTheMutexStopsTheProcess) {
    GTEST_FLAG_SET(death_test_style, "threadsafe"); // a thread holds the mutex meanwhile
    CheckedMutex m;
    EXPECT_DEATH(m.assert_held("unheld_function"), "a lock rule is broken: the mutex is not held in unheld_function");
    // Held by another thread is not held.
    std::atomic<int> stage{0};
    std::thread other([&] {
        std::lock_guard lock(m);
        stage = 1;
        while (stage.load() != 2) std::this_thread::yield();
    });
    while (stage.load() != 1) std::this_thread::yield();
    EXPECT_DEATH(m.assert_held("another_thread_holds_it"), "not held in another_thread_holds_it");
    stage = 2;
    other.join();
    // The registry's own: its points are read under it only.
    EXPECT_DEATH(ukp::core::all_points(), "not held in points");
}

TEST(CheckedMutexDeathTest, AFunctionThatMustRunWithoutItStopsTheProcessUnderIt) {
    CheckedMutex m;
    std::lock_guard lock(m);
    EXPECT_DEATH(m.assert_not_held("waiting_function"), "a lock rule is broken: the mutex is held in waiting_function");
    // The registry's own: starting the optimizer waits for the dynamic linker's lock.
    std::lock_guard registry(ukp::core::registry_mutex());
    EXPECT_DEATH(ukp::core::optimizer_start(), "the mutex is held in optimizer_start");
}
#else
TEST(CheckedMutexDeathTest, AFunctionRunOutsideTheMutexStopsTheProcess) {
    GTEST_SKIP() << "lock rules are checked in UKP_CHECKS builds";
}
#endif

} // namespace
