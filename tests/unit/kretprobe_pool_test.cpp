// A kretprobe's instances are kept in shards, one per group of threads, so that threads
// on different CPUs do not take them from the same cache line; a thread whose shard is
// empty takes from the others. maxactive still means maxactive calls in flight at once,
// however the threads fall on the shards.
#include <ukprobes/kprobes.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <unistd.h>
#include <vector>

namespace {

std::atomic<int> g_inside{0};
std::atomic<bool> g_leave{false};
std::atomic<int> g_returns{0};

int ret_handler(kretprobe_instance *, pt_regs *) {
    g_returns.fetch_add(1);
    return 0;
}

} // namespace

extern "C" __attribute__((noinline)) int ukpool_wait(int x) {
    g_inside.fetch_add(1);
    while (!g_leave.load()) usleep(200);
    asm volatile("" ::: "memory");
    return x + 1;
}

namespace {

// `threads` calls of ukpool_wait in flight at once, then let go and joined.
void calls_in_flight(int threads) {
    g_inside = 0;
    g_leave = false;
    std::vector<std::thread> callers;
    for (int i = 0; i < threads; ++i) callers.emplace_back([i] { EXPECT_EQ(ukpool_wait(i), i + 1); });
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (g_inside.load() < threads && std::chrono::steady_clock::now() < end) usleep(500);
    ASSERT_EQ(g_inside.load(), threads);
    g_leave = true;
    for (std::thread &t : callers) t.join();
}

// Fewer instances than shards (some shards hold none), all live at once on new threads
// (each starts from another shard): every call gets one.
TEST(KretprobePool, MaxactiveCallsInFlightAllGetAnInstance) {
    for (int maxactive : {3, 8, 13}) {
        SCOPED_TRACE(maxactive);
        kretprobe rp{};
        rp.kp.symbol_name = "ukpool_wait";
        rp.handler = ret_handler;
        rp.maxactive = maxactive;
        ASSERT_EQ(register_kretprobe(&rp), 0);
        g_returns = 0;
        calls_in_flight(maxactive);
        EXPECT_EQ(rp.nmissed, 0) << "a call missed while instances were free in other shards";
        EXPECT_EQ(g_returns.load(), maxactive);
        // One more than maxactive at once: exactly one misses.
        g_returns = 0;
        calls_in_flight(maxactive + 1);
        EXPECT_EQ(rp.nmissed, 1);
        EXPECT_EQ(g_returns.load(), maxactive);
        unregister_kretprobe(&rp);
    }
}

} // namespace
