// Handlers on many threads at once while another thread registers, unregisters,
// disables and enables probes at the same and nearby addresses: no crash, no wrong
// result, and exact hit counts for the probe that stays armed throughout.
#include <ukprobes/kprobes.h>

#include "asm_functions.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <thread>
#include <vector>

namespace {

std::atomic<long> g_steady_hits{0};
std::atomic<long> g_churn_hits{0};

int steady_pre(kprobe *, pt_regs *) {
    g_steady_hits.fetch_add(1, std::memory_order_relaxed);
    return 0;
}
int churn_pre(kprobe *, pt_regs *) {
    g_churn_hits.fetch_add(1, std::memory_order_relaxed);
    return 0;
}
void churn_post(kprobe *, pt_regs *, unsigned long) {}

long calls_per_thread() {
    // UKP_STRESS_CALLS lets a sanitizer build run fewer; the default is the 1M.
    const char *env = std::getenv("UKP_STRESS_CALLS");
    return env != nullptr ? std::atol(env) : 1'000'000;
}

TEST(Concurrency, EightThreadsWhileRegisteringAndUnregistering) {
    constexpr int kThreads = 8;
    const long calls = calls_per_thread();
    char *entry = reinterpret_cast<char *>(&ukpt_twice);
    kprobe steady{};
    steady.addr = reinterpret_cast<kprobe_opcode_t *>(entry);
    steady.pre_handler = steady_pre;
    ASSERT_EQ(register_kprobe(&steady), 0);

    std::atomic<bool> done{false};
    std::atomic<long> wrong{0};
    std::vector<std::thread> workers;
    for (int t = 0; t < kThreads; ++t) {
        workers.emplace_back([&, t] {
            for (long i = 0; i < calls; ++i)
                if (ukpt_twice(i + t) != 2 * (i + t)) wrong.fetch_add(1);
        });
    }
    long rounds = 0;
    std::thread churn([&] {
        while (!done.load()) {
            // Same address as the steady probe (aggregation), and the ret after it
            // (an emulated instruction), with a post_handler that needs the trap copy.
            kprobe same{}, ret{};
            same.addr = reinterpret_cast<kprobe_opcode_t *>(entry);
            same.pre_handler = churn_pre;
            same.post_handler = churn_post;
            ret.addr = reinterpret_cast<kprobe_opcode_t *>(entry + 4); // lea (%rdi,%rdi),%rax is 4 bytes
            ret.pre_handler = churn_pre;
            if (register_kprobe(&same) != 0 || register_kprobe(&ret) != 0) {
                wrong.fetch_add(1000000);
                return;
            }
            disable_kprobe(&same);
            enable_kprobe(&same);
            kprobe *both[] = {&same, &ret};
            unregister_kprobes(both, 2);
            ++rounds;
        }
    });
    for (auto &w : workers) w.join();
    done = true;
    churn.join();
    unregister_kprobe(&steady);

    EXPECT_EQ(wrong.load(), 0);
    EXPECT_EQ(g_steady_hits.load(), kThreads * calls) << "every call through the armed probe counted";
    EXPECT_EQ(steady.nmissed, 0u);
    EXPECT_GT(rounds, 10) << "the churn thread made progress";
    RecordProperty("churn_rounds", static_cast<int>(rounds));
    RecordProperty("churn_hits", static_cast<int>(g_churn_hits.load()));
}

} // namespace
