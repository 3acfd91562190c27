// A test that tries to break the agent: worker threads run the probed test functions and
// check every result, while a mutator registers, unregisters, enables and disables
// kprobes, kretprobes and jprobes on them at random, for a bounded time.
//
// Reproducible: the seed is printed (and recorded as a test property); run again with
// UKP_STRESS_SEED=<seed>. UKP_STRESS_SECONDS sets the duration (default 3).
#include <ukprobes/kprobes.h>

#include "asm_functions.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <vector>

extern "C" __attribute__((noinline)) long uks_sum(long a, long b) {
    asm volatile("" ::: "memory");
    return a + b;
}

namespace {

long g_jprobe_seen_a = 0;
long j_sum(long a, long) {
    g_jprobe_seen_a = a; // a jprobe handler: sees the arguments, then returns to the probe
    jprobe_return();
    return 0;
}

int pre_counts(kprobe *, pt_regs *) { return 0; }
void post_counts(kprobe *, pt_regs *, unsigned long) {}
int ret_handler(kretprobe_instance *, pt_regs *) { return 0; }

// A probe site: where, and what kinds of probe may go there.
struct Site {
    const char *symbol; // for kretprobes and jprobes (function entries)
    const void *addr;   // for kprobes
    bool entry;
};

std::vector<Site> sites() {
    return {
        {"ukpt_twice", reinterpret_cast<const void *>(&ukpt_twice), true},
        {"ukpt_branches", reinterpret_cast<const void *>(&ukpt_branches), true},
        {nullptr, ukpt_branches_at_jcc, false},
        {nullptr, ukpt_branches_at_call, false},
        {nullptr, ukpt_branches_at_ret, false},
        {nullptr, ukpt_rip_load_at_mov, false},
        {nullptr, ukpt_rip_load_at_store, false},
        {nullptr, ukpt_loop_at_loop, false},
        {nullptr, ukpt_red_zone_at_nop, false},
        {"uks_sum", reinterpret_cast<const void *>(&uks_sum), true},
    };
}

// One slot of the mutator: a probe struct of each kind and what state it is in.
struct Slot {
    enum Kind { kNone, kKprobe, kKretprobe, kJprobe } kind = kNone;
    kprobe kp{};
    kretprobe rp{};
    jprobe jp{};
    bool disabled = false;
};

TEST(Stress, RandomRegistrationWhileThreadsRunProbedCode) {
    const char *seed_env = std::getenv("UKP_STRESS_SEED");
    const unsigned seed = seed_env != nullptr ? static_cast<unsigned>(std::strtoul(seed_env, nullptr, 10))
                                              : static_cast<unsigned>(std::random_device{}());
    const char *seconds_env = std::getenv("UKP_STRESS_SECONDS");
    const double seconds = seconds_env != nullptr ? std::atof(seconds_env) : 3.0;
    std::printf("stress seed: %u (UKP_STRESS_SEED=%u reproduces it), %.1f s\n", seed, seed, seconds);
    RecordProperty("seed", static_cast<int>(seed));

    // The agent's first registration in a process builds what it needs once (the symbol
    // tables, the test program's reference table for jump verdicts: a few hundred
    // milliseconds here, seconds on a loaded machine). Done before the timed part, which is
    // about registration against running threads.
    {
        kprobe warm{};
        warm.symbol_name = "uks_sum";
        warm.pre_handler = pre_counts;
        ASSERT_EQ(register_kprobe(&warm), 0);
        unregister_kprobe(&warm);
    }

    std::atomic<bool> done{false};
    std::atomic<long> wrong{0}, calls{0};
    std::vector<std::thread> workers;
    for (int t = 0; t < 4; ++t) {
        workers.emplace_back([&, t] {
            long data_copy_check = 0;
            for (long i = 0; !done.load(std::memory_order_relaxed); ++i) {
                const long x = (i * 7 + t) % 1000;
                long bad = 0;
                bad += ukpt_twice(x) != 2 * x;
                bad += ukpt_branches(x) != 2 * x + 1;
                bad += ukpt_branches(-x - 1) != -1;
                bad += ukpt_rip_load() != 0x1234 * 2;
                bad += ukpt_loop(x % 50) != (x % 50) * (x % 50 + 1) / 2;
                bad += ukpt_red_zone(x) != x + 0x5a5a5a5a;
                bad += uks_sum(x, t) != x + t;
                data_copy_check += ukpt_data_copy != 0x1234; // written by ukpt_rip_load
                if (bad != 0) wrong.fetch_add(bad);
                calls.fetch_add(1, std::memory_order_relaxed);
            }
            if (data_copy_check != 0) wrong.fetch_add(data_copy_check);
        });
    }

    const std::vector<Site> where = sites();
    std::vector<Slot> slots(12);
    std::vector<size_t> slot_site(slots.size(), 0);
    std::mt19937 rng(seed);
    long operations = 0, failures = 0, optimized_seen = 0;
    // One operation on slot i: what it did.
    const auto operate = [&](size_t i) -> const char * {
        Slot &s = slots[i];
        if (s.kind == Slot::kNone) {
            const size_t w = rng() % where.size();
            const Site &site = where[w];
            const unsigned pick = rng() % 3;
            s = Slot{};
            int err;
            const char *did;
            if (site.entry && pick == 1) {
                s.rp.kp.symbol_name = site.symbol;
                s.rp.handler = ret_handler;
                s.rp.maxactive = 16;
                err = register_kretprobe(&s.rp);
                s.kind = Slot::kKretprobe;
                did = "register_kretprobe";
            } else if (site.entry && pick == 2 && std::string(site.symbol) == "uks_sum") {
                s.jp.kp.symbol_name = site.symbol;
                s.jp.entry = JPROBE_ENTRY(j_sum);
                err = register_jprobe(&s.jp);
                s.kind = Slot::kJprobe;
                did = "register_jprobe";
            } else {
                s.kp.addr = static_cast<kprobe_opcode_t *>(const_cast<void *>(site.addr));
                s.kp.pre_handler = pre_counts;
                if (rng() % 2 == 0) s.kp.post_handler = post_counts;
                err = register_kprobe(&s.kp);
                s.kind = Slot::kKprobe;
                did = "register_kprobe";
            }
            // -EBUSY: a second jprobe on the function; anything else is a failure.
            if (err != 0) {
                if (err != -EBUSY) ++failures;
                s.kind = Slot::kNone;
            }
            slot_site[i] = w;
            return did;
        }
        kprobe *kp = s.kind == Slot::kKprobe ? &s.kp : s.kind == Slot::kKretprobe ? &s.rp.kp : &s.jp.kp;
        switch (rng() % 3) {
        case 0:
            if (s.kind == Slot::kKretprobe)
                unregister_kretprobe(&s.rp);
            else if (s.kind == Slot::kJprobe)
                unregister_jprobe(&s.jp);
            else
                unregister_kprobe(&s.kp);
            s.kind = Slot::kNone;
            return "unregister";
        case 1:
            if (disable_kprobe(kp) != 0) ++failures;
            s.disabled = true;
            return "disable_kprobe";
        default:
            if (enable_kprobe(kp) != 0) ++failures;
            s.disabled = false;
            return "enable_kprobe";
        }
    };
    // The slowest operation, and what it was: a stall shows where it happened.
    double slowest_ms = 0;
    long slowest_at = 0;
    const char *slowest = "none";
    // The time asked for, and at least kMinOperations (a slow machine gets more time, up to
    // a minute more).
    constexpr long kMinOperations = 500;
    const auto now = [] { return std::chrono::steady_clock::now(); };
    const auto end = now() + std::chrono::duration<double>(seconds);
    const auto last = end + std::chrono::seconds(60);
    while ((now() < end || operations < kMinOperations) && now() < last) {
        const size_t i = rng() % slots.size();
        ++operations;
        // How often the optimizer got a jump in: the run must exercise that path too.
        for (const Slot &o : slots) {
            const kprobe *okp = o.kind == Slot::kKprobe ? &o.kp : o.kind == Slot::kKretprobe ? &o.rp.kp : nullptr;
            if (okp != nullptr && (__atomic_load_n(&okp->flags, __ATOMIC_RELAXED) & KPROBE_FLAG_OPTIMIZED) != 0)
                ++optimized_seen;
        }
        // Now and then a pause, so that the optimizer gets jumps in (a pass signals every
        // thread and waits for them) and the workers run through optimized regions.
        if (rng() % 32 == 0) std::this_thread::sleep_for(std::chrono::microseconds(rng() % 3000));
        const auto start = now();
        const char *did = operate(i);
        const double ms = std::chrono::duration<double, std::milli>(now() - start).count();
        if (ms > slowest_ms) {
            slowest_ms = ms;
            slowest_at = operations;
            slowest = did;
        }
    }
    done = true;
    for (auto &w : workers) w.join();
    for (Slot &s : slots) {
        if (s.kind == Slot::kKretprobe) unregister_kretprobe(&s.rp);
        if (s.kind == Slot::kJprobe) unregister_jprobe(&s.jp);
        if (s.kind == Slot::kKprobe) unregister_kprobe(&s.kp);
    }

    std::printf("stress: %ld operations, %ld rounds of calls, %ld optimized probe states seen\n", operations,
                calls.load(), optimized_seen);
    std::printf("stress: the slowest operation, number %ld, %s: %.1f ms\n", slowest_at, slowest, slowest_ms);
    EXPECT_EQ(wrong.load(), 0) << "seed " << seed;
    EXPECT_EQ(failures, 0) << "seed " << seed;
    EXPECT_GE(operations, kMinOperations) << "the mutator made progress";
    EXPECT_GT(calls.load(), 100) << "the workers made progress";
    char *text = ukp_kprobes_list();
    EXPECT_STREQ(text, "") << "seed " << seed;
    std::free(text);
    EXPECT_EQ(ukp_verify(nullptr), 0) << "code restored byte for byte; seed " << seed;
}

} // namespace
