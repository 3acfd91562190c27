// A kretprobe's instances are kept in shards, one per group of threads, so that threads
// on different CPUs do not take them from the same cache line; a thread whose shard is
// empty takes from the others. maxactive still means maxactive calls in flight at once,
// however the threads fall on the shards.
#include <ukprobes/kprobes.h>

#include "core/core.hpp"
#include "core/kretprobe.hpp"

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

// ---- spare instances (kretprobe.cpp) ------------------------------------------------------

// How many threads' slots keep a spare instance of pool.
size_t spares_of(const void *pool) {
    size_t count = 0, n = 0;
    const ukp::core::ReaderCell *slots = ukp::core::claimed_cells(&count);
    for (size_t i = 0; i < count; ++i) n += slots[i].spare_pool.load() == pool;
    return n;
}

// A kretprobe of one instance on ukpool_wait, optimized: only its trampolines' fast cases
// keep spares. Without a handler: the return trampoline takes the fast case for a handler
// only if it is proven to leave the vector state alone, which no scan proves under the
// sanitizers. A call that got no instance counts a miss.
void put_one_instance(kretprobe &rp) {
    rp.kp.symbol_name = "ukpool_wait";
    rp.maxactive = 1;
    ASSERT_EQ(register_kretprobe(&rp), 0);
    ukp_optimizer_flush();
    g_leave = true; // ukpool_wait returns at once
}

// A thread that calls ukpool_wait a few times, then waits to be let go.
struct SpareHolder {
    std::atomic<bool> called{false}, go{false};
    std::thread thread{[this] {
        for (int i = 0; i < 3; ++i) EXPECT_EQ(ukpool_wait(i), i + 1);
        called = true;
        while (!go.load()) usleep(200);
    }};
    void wait_called() {
        while (!called.load()) usleep(200);
    }
    ~SpareHolder() {
        go = true;
        thread.join();
    }
};

// The one instance sits in a live thread's slot: another thread's call takes it from
// there rather than missing, and from then on the pool keeps no spares.
TEST(KretprobePool, AnotherThreadsSpareIsTakenBeforeAMiss) {
    kretprobe rp{};
    put_one_instance(rp);
    auto *pool = static_cast<ukp::core::RetPool *>(rp.ukp_private);
    {
        SpareHolder holder;
        holder.wait_called();
        ASSERT_EQ(spares_of(pool), 1u) << "the holder's return trampoline kept its instance";
        EXPECT_EQ(ukpool_wait(10), 11);
        EXPECT_EQ(rp.nmissed, 0) << "the call missed while the instance was another thread's spare";
        EXPECT_TRUE(pool->no_spares.load());
        EXPECT_EQ(spares_of(pool), 0u);
        EXPECT_EQ(pool->in_use(), 0);
    }
    unregister_kretprobe(&rp);
}

// A thread inside a read section (here, inside a kprobe's handler) may be taking its
// spare at that very moment: no other thread takes it from it then. A call that finds
// nothing else counts a miss; once the thread has left the section, its spare is taken.
std::atomic<bool> g_in_handler{false}, g_release_handler{false};
int blocking_pre(kprobe *, pt_regs *) {
    g_in_handler = true;
    while (!g_release_handler.load()) usleep(200);
    return 0;
}
} // namespace
extern "C" __attribute__((noinline)) int ukpool_block(int x) {
    asm volatile("" ::: "memory");
    return x + 2;
}
namespace {

TEST(KretprobePool, ASpareOfAThreadInsideAHandlerIsLeftToIt) {
    kretprobe rp{};
    put_one_instance(rp);
    auto *pool = static_cast<ukp::core::RetPool *>(rp.ukp_private);
    kprobe block{};
    block.symbol_name = "ukpool_block";
    block.pre_handler = blocking_pre;
    ASSERT_EQ(register_kprobe(&block), 0);
    g_in_handler = false;
    g_release_handler = false;
    std::thread holder([] {
        for (int i = 0; i < 3; ++i) EXPECT_EQ(ukpool_wait(i), i + 1);
        EXPECT_EQ(ukpool_block(1), 3); // stays in blocking_pre until released
    });
    while (!g_in_handler.load()) usleep(200);
    EXPECT_EQ(spares_of(pool), 1u) << "the holder's return trampoline kept its instance";
    EXPECT_EQ(ukpool_wait(10), 11);
    EXPECT_EQ(rp.nmissed, 1) << "the spare of a thread inside a read section was taken";
    EXPECT_EQ(spares_of(pool), 1u);
    g_release_handler = true;
    holder.join(); // its exit gives the spare back
    EXPECT_EQ(ukpool_wait(11), 12);
    EXPECT_EQ(rp.nmissed, 1);
    EXPECT_EQ(pool->in_use(), 0);
    unregister_kprobe(&block);
    unregister_kretprobe(&rp);
}

// A thread that ends gives its spare back to the shards: the next call finds it there,
// without taking it from the ended thread's slot.
TEST(KretprobePool, AThreadsSpareGoesBackWhenTheThreadEnds) {
    kretprobe rp{};
    put_one_instance(rp);
    auto *pool = static_cast<ukp::core::RetPool *>(rp.ukp_private);
    std::thread([pool] {
        for (int i = 0; i < 3; ++i) EXPECT_EQ(ukpool_wait(i), i + 1);
        EXPECT_EQ(spares_of(pool), 1u) << "the thread's return trampoline kept its instance";
    }).join();
    EXPECT_EQ(spares_of(pool), 0u);
    EXPECT_EQ(ukpool_wait(10), 11);
    EXPECT_EQ(rp.nmissed, 0);
    EXPECT_FALSE(pool->no_spares.load()) << "the ended thread's spare was stolen, not given back";
    unregister_kretprobe(&rp);
}

// A pool freed at unregistration leaves no slot naming it: a pool made later at the same
// address would otherwise hand out the old pool's memory.
TEST(KretprobePool, AnUnregisteredPoolLeavesNoSpareBehind) {
    kretprobe rp{};
    put_one_instance(rp);
    const void *pool = rp.ukp_private;
    for (int i = 0; i < 3; ++i) EXPECT_EQ(ukpool_wait(i), i + 1);
    ASSERT_EQ(spares_of(pool), 1u) << "this thread's return trampoline kept its instance";
    unregister_kretprobe(&rp);
    EXPECT_EQ(spares_of(pool), 0u);
}

// Threads beyond the instances, all calling at once: spares are kept, taken by their
// owners and stolen by the others, and no instance is ever had by two calls (its task
// would be another thread's, or a thread's list would lose a call and its return, and a
// call would come back to the wrong address). Without a handler too: under the
// sanitizers only that way keeps spares (put_one_instance).
thread_local int t_my_tid = 0;
std::atomic<long> g_wrong_task{0};
int task_checking_handler(kretprobe_instance *ri, pt_regs *) {
    g_returns.fetch_add(1, std::memory_order_relaxed);
    if (ri->task != t_my_tid) g_wrong_task.fetch_add(1, std::memory_order_relaxed);
    return 0;
}

TEST(KretprobePool, ThreadsBeyondTheInstancesShareThemWithoutLosingOne) {
    for (int run = 0; run < 6; ++run) {
        const int maxactive = 1 + run % 3;
        const bool handler = run < 3;
        SCOPED_TRACE(testing::Message() << "maxactive " << maxactive << ", handler " << handler);
        kretprobe rp{};
        rp.kp.symbol_name = "ukpool_wait";
        rp.handler = handler ? task_checking_handler : nullptr;
        rp.maxactive = maxactive;
        ASSERT_EQ(register_kretprobe(&rp), 0);
        ukp_optimizer_flush();
        g_returns = 0;
        g_wrong_task = 0;
        g_leave = true;
        constexpr int kThreads = 4, kCalls = 20000;
        std::atomic<long> wrong_value{0};
        std::vector<std::thread> threads;
        for (int t = 0; t < kThreads; ++t)
            threads.emplace_back([&] {
                t_my_tid = static_cast<int>(gettid());
                for (int i = 0; i < kCalls; ++i)
                    if (ukpool_wait(i) != i + 1) wrong_value.fetch_add(1);
            });
        for (std::thread &t : threads) t.join();
        EXPECT_EQ(wrong_value.load(), 0);
        EXPECT_EQ(g_wrong_task.load(), 0);
        if (handler) {
            EXPECT_EQ(g_returns.load() + static_cast<long>(rp.nmissed), long{kThreads} * kCalls);
            EXPECT_GT(g_returns.load(), 0);
        } else {
            EXPECT_LT(static_cast<long>(rp.nmissed), long{kThreads} * kCalls);
        }
        auto *pool = static_cast<ukp::core::RetPool *>(rp.ukp_private);
        EXPECT_EQ(pool->in_use(), 0);
        EXPECT_EQ(spares_of(pool), 0u) << "the threads ended: their spares went back";
        unregister_kretprobe(&rp);
    }
}

} // namespace
