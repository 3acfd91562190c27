// Return probes (kprobes.rst, "Return Probes", "Kretprobe entry-handler", the kretprobe API,
// "Kprobes Features and Limitations"): registration rules, the instance fields seen by
// entry and return handlers, maxactive and nmissed, deep recursion, many threads, and a
// program that leaves probed frames without returning (C++ exceptions, longjmp,
// pthread_exit, pthread_cancel) or walks its own stack (backtrace, _Unwind_Backtrace)
// behaving exactly as without probes.
#include <ukprobes/kprobes.h>

#include "asm_functions.h"

#include <gtest/gtest.h>

#include <dlfcn.h>
#include <execinfo.h>
#include <pthread.h>
#include <sched.h>
#include <unistd.h>
#include <unwind.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csetjmp>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#define NOIPA __attribute__((noipa))
// Keeps a value in a register across this point and stops the compiler from turning
// `return f(n - 1) + 1` into a loop or a tail call.
#define OPAQUE(v) asm volatile("" : "+r"(v) : : "memory")

// ---- functions to probe -----------------------------------------------------------------

extern "C" {
NOIPA long ukr_square(long x) {
    asm volatile("" ::: "memory");
    return x * x;
}
NOIPA long ukr_call_square(long x) {
    long r = ukr_square(x);
    OPAQUE(r);
    return r + 1;
}
// Returns n; ukr_rec(n) makes n + 1 calls of itself.
NOIPA long ukr_rec(long n) {
    if (n == 0) return 0;
    long r = ukr_rec(n - 1);
    OPAQUE(r);
    return r + 1;
}
NOIPA long ukr_triple(long x) {
    asm volatile("" ::: "memory");
    return 3 * x + 1;
}
}

namespace ukr_ns {
NOIPA long twice_plus(long x) {
    asm volatile("" ::: "memory");
    return 2 * x + 5;
}
} // namespace ukr_ns

namespace {

std::string list() {
    char *text = ukp_kprobes_list();
    std::string s = text != nullptr ? text : "";
    std::free(text);
    return s;
}

long my_tid() { return static_cast<long>(gettid()); }

// ---- recording handlers (async-signal-safe: fixed arrays and atomics only) ---------------

struct EntryData {
    long arg;           // regs->di at entry
    unsigned long sp;   // regs->sp at entry: the return address slot
    unsigned long slot; // *(regs->sp) at entry: the real return address
    long tid;           // gettid() in the entry handler
};

struct RetEvent {
    long value;
    EntryData data;
    int task;
    unsigned long ret_addr;
    unsigned long fp;
    kretprobe *rp;
    long handler_tid;
};

constexpr int kMaxEvents = 1 << 15;
RetEvent g_events[kMaxEvents];
std::atomic<int> g_nevents{0};
std::atomic<int> g_nentries{0};
long g_ret_add = 0; // added to the return value by ret_record

EntryData load_data(kretprobe_instance *ri) {
    EntryData d;
    std::memcpy(&d, ri->data, sizeof d);
    return d;
}

int entry_record(kretprobe_instance *ri, pt_regs *regs) {
    EntryData d{};
    d.arg = static_cast<long>(regs->di);
    d.sp = regs->sp;
    d.slot = *reinterpret_cast<unsigned long *>(regs->sp);
    d.tid = my_tid();
    std::memcpy(ri->data, &d, sizeof d);
    g_nentries.fetch_add(1);
    return 0;
}

// Tracks only calls with an even first argument.
int entry_even_only(kretprobe_instance *ri, pt_regs *regs) {
    if (regs->di % 2 != 0) return 1;
    return entry_record(ri, regs);
}

int ret_record(kretprobe_instance *ri, pt_regs *regs) {
    const int i = g_nevents.fetch_add(1);
    if (i < kMaxEvents) {
        RetEvent &e = g_events[i];
        e.value = static_cast<long>(regs_return_value(regs));
        e.data = ri->rp != nullptr && ri->rp->data_size >= sizeof(EntryData) ? load_data(ri) : EntryData{};
        e.task = ri->task;
        e.ret_addr = reinterpret_cast<unsigned long>(ri->ret_addr);
        e.fp = reinterpret_cast<unsigned long>(ri->fp);
        e.rp = get_kretprobe(ri);
        e.handler_tid = my_tid();
    }
    if (g_ret_add != 0) regs->ax += static_cast<unsigned long>(g_ret_add);
    return 0;
}

std::atomic<int> g_kp_hits{0};
unsigned long g_kp_di = 0;
int kp_count(kprobe *, pt_regs *regs) {
    g_kp_hits.fetch_add(1);
    g_kp_di = regs->di;
    return 0;
}

kretprobe make_rp(const char *sym, int maxactive = 0, bool with_entry = true) {
    kretprobe rp{};
    rp.kp.symbol_name = sym;
    rp.handler = ret_record;
    if (with_entry) {
        rp.entry_handler = entry_record;
        rp.data_size = sizeof(EntryData);
    }
    rp.maxactive = maxactive;
    return rp;
}

class KretprobesTest : public ::testing::Test {
protected:
    void SetUp() override {
        g_nevents = 0;
        g_nentries = 0;
        g_ret_add = 0;
        g_kp_hits = 0;
        ASSERT_EQ(ukp_kprobes_enabled(), 1);
    }
    void TearDown() override { EXPECT_EQ(list(), "") << "a test left probes registered"; }
};

// ---- registration ---------------------------------------------------------------------------

TEST_F(KretprobesTest, ErrorsOfRegistration) {
    kretprobe unknown = make_rp("no_such_function_anywhere");
    EXPECT_EQ(register_kretprobe(&unknown), -ENOENT);
    // An object not loaded: pending, as a kprobe (dlopen_test arms one).
    kretprobe unknown_obj = make_rp("libnothere.so.9:malloc");
    EXPECT_EQ(register_kretprobe(&unknown_obj), 0);
    EXPECT_EQ(list(), "0000000000000000  r  malloc+0x0  libnothere.so.9 [GONE]\n");
    unregister_kretprobe(&unknown_obj);
    kretprobe unknown_obj_offset = make_rp("libnothere.so.9:malloc");
    unknown_obj_offset.kp.offset = 4;
    EXPECT_EQ(register_kretprobe(&unknown_obj_offset), -ENOENT) << "pending only at a symbol";

    // Not the function's first instruction (but an instruction boundary): -EINVAL.
    kretprobe with_offset = make_rp("ukpt_branches");
    with_offset.kp.offset = static_cast<unsigned>(ukpt_branches_at_call - reinterpret_cast<char *>(&ukpt_branches));
    EXPECT_EQ(register_kretprobe(&with_offset), -EINVAL);
    kretprobe mid_addr = make_rp(nullptr);
    mid_addr.kp.addr = reinterpret_cast<kprobe_opcode_t *>(ukpt_branches_at_jcc);
    EXPECT_EQ(register_kretprobe(&mid_addr), -EINVAL);
    kretprobe mid_addr2 = make_rp(nullptr);
    mid_addr2.kp.addr = reinterpret_cast<kprobe_opcode_t *>(ukpt_rip_load_at_store);
    EXPECT_EQ(register_kretprobe(&mid_addr2), -EINVAL);

    kretprobe both = make_rp("ukr_square");
    both.kp.addr = reinterpret_cast<kprobe_opcode_t *>(&ukr_square);
    EXPECT_EQ(register_kretprobe(&both), -EINVAL) << "symbol_name and addr both set";

    kretprobe once = make_rp("ukr_square");
    ASSERT_EQ(register_kretprobe(&once), 0);
    EXPECT_EQ(reinterpret_cast<void *>(once.kp.addr), reinterpret_cast<void *>(&ukr_square));
    EXPECT_EQ(register_kretprobe(&once), -EINVAL) << "registered twice";
    EXPECT_EQ(ukr_square(5), 25);
    EXPECT_EQ(g_nevents, 1) << "the failed second registration changed nothing";
    unregister_kretprobe(&once);
    EXPECT_EQ(ukr_square(5), 25);
    EXPECT_EQ(g_nevents, 1);
    EXPECT_EQ(list(), "");
}

TEST_F(KretprobesTest, UnregisteringAnUnknownProbeClearsItsAddr) {
    kretprobe rp = make_rp(nullptr);
    rp.kp.addr = reinterpret_cast<kprobe_opcode_t *>(&ukr_square);
    unregister_kretprobe(&rp);
    EXPECT_EQ(rp.kp.addr, nullptr);
    EXPECT_EQ(disable_kretprobe(&rp), -EINVAL);
    EXPECT_EQ(enable_kretprobe(&rp), -EINVAL);
}

TEST_F(KretprobesTest, ByAddressByObjectSymbolAndByCxxName) {
    kretprobe by_addr = make_rp(nullptr);
    by_addr.kp.addr = reinterpret_cast<kprobe_opcode_t *>(&ukr_triple);
    ASSERT_EQ(register_kretprobe(&by_addr), 0);
    EXPECT_EQ(ukr_triple(4), 13);
    ASSERT_EQ(g_nevents, 1);
    EXPECT_EQ(g_events[0].value, 13);
    EXPECT_EQ(g_events[0].data.arg, 4);
    unregister_kretprobe(&by_addr);

    g_nevents = 0;
    kretprobe cxx = make_rp("ukr_ns::twice_plus");
    ASSERT_EQ(register_kretprobe(&cxx), 0);
    EXPECT_EQ(ukr_ns::twice_plus(10), 25);
    ASSERT_EQ(g_nevents, 1);
    EXPECT_EQ(g_events[0].value, 25);
    unregister_kretprobe(&cxx);

    // A libc function, named with its object.
    g_nevents = 0;
    const long ppid = getppid();
    kretprobe libc = make_rp("libc.so.6:getppid");
    ASSERT_EQ(register_kretprobe(&libc), 0);
    EXPECT_EQ(getppid(), ppid);
    unregister_kretprobe(&libc);
    ASSERT_GE(g_nevents, 1);
    bool found = false;
    for (int i = 0; i < std::min<int>(g_nevents, kMaxEvents); ++i)
        if (g_events[i].task == my_tid() && g_events[i].value == ppid) found = true;
    EXPECT_TRUE(found) << "the return handler saw getppid()'s return value";
}

// ---- what the handlers see ------------------------------------------------------------------

TEST_F(KretprobesTest, HandlersSeeArgumentsReturnValueAndInstanceFields) {
    kretprobe rp = make_rp("ukr_square", 4);
    ASSERT_EQ(register_kretprobe(&rp), 0);
    EXPECT_EQ(rp.nmissed, 0);
    EXPECT_EQ(ukr_call_square(7), 50);
    EXPECT_EQ(g_nentries, 1);
    ASSERT_EQ(g_nevents, 1);
    const RetEvent &e = g_events[0];
    EXPECT_EQ(e.value, 49) << "regs_return_value";
    EXPECT_EQ(e.data.arg, 7) << "entry_handler saw the first argument in di; ri->data round trip";
    EXPECT_EQ(e.task, my_tid()) << "ri->task is gettid() of the caller";
    EXPECT_EQ(e.handler_tid, my_tid()) << "the return handler runs on the calling thread";
    EXPECT_EQ(e.data.tid, my_tid());
    EXPECT_EQ(e.fp, e.data.sp) << "ri->fp is where the return address was (regs->sp at entry)";
    EXPECT_EQ(e.ret_addr, e.data.slot) << "ri->ret_addr is the real return address";
    const auto caller = reinterpret_cast<unsigned long>(&ukr_call_square);
    EXPECT_GT(e.ret_addr, caller) << "inside ukr_call_square";
    EXPECT_LT(e.ret_addr, caller + 256) << "inside ukr_call_square";
    EXPECT_EQ(e.rp, &rp) << "ri->rp / get_kretprobe()";
    EXPECT_EQ(rp.nmissed, 0);
    EXPECT_EQ(rp.ukp_unwound, 0u);

    // Every call, from the same site: the same return address and slot.
    for (long i = 0; i < 20; ++i) EXPECT_EQ(ukr_call_square(i), i * i + 1);
    ASSERT_EQ(g_nevents, 21);
    for (int i = 1; i < 21; ++i) {
        SCOPED_TRACE(i);
        EXPECT_EQ(g_events[i].value, (i - 1) * (i - 1));
        EXPECT_EQ(g_events[i].data.arg, i - 1);
        EXPECT_EQ(g_events[i].ret_addr, e.ret_addr);
    }
    EXPECT_EQ(rp.nmissed, 0) << "maxactive 4 is enough for calls one after the other";
    unregister_kretprobe(&rp);
    EXPECT_EQ(ukr_call_square(3), 10);
    EXPECT_EQ(g_nevents, 21) << "no hit after unregister";
}

TEST_F(KretprobesTest, WithoutEntryHandlerOrData) {
    kretprobe rp = make_rp("ukr_triple", 2, /*with_entry=*/false);
    ASSERT_EQ(register_kretprobe(&rp), 0);
    EXPECT_EQ(ukr_triple(2), 7);
    ASSERT_EQ(g_nevents, 1);
    EXPECT_EQ(g_events[0].value, 7);
    EXPECT_EQ(g_events[0].task, my_tid());
    unregister_kretprobe(&rp);
}

TEST_F(KretprobesTest, ReturnHandlerCanChangeTheReturnValue) {
    kretprobe rp = make_rp("ukr_square", 4);
    ASSERT_EQ(register_kretprobe(&rp), 0);
    g_ret_add = 1000;
    EXPECT_EQ(ukr_call_square(3), 9 + 1000 + 1) << "the caller sees the changed rax";
    g_ret_add = 0;
    ASSERT_EQ(g_nevents, 1);
    EXPECT_EQ(g_events[0].value, 9) << "the handler saw the original value";
    unregister_kretprobe(&rp);
    EXPECT_EQ(ukr_call_square(3), 10);
}

TEST_F(KretprobesTest, EntryHandlerNonZeroLeavesTheCallUnprobed) {
    kretprobe rp = make_rp("ukr_square", 1);
    rp.entry_handler = entry_even_only;
    ASSERT_EQ(register_kretprobe(&rp), 0);
    for (long i = 0; i < 100; ++i) EXPECT_EQ(ukr_square(i), i * i);
    ASSERT_EQ(g_nevents, 50) << "return handler only for calls whose entry_handler returned 0";
    for (int i = 0; i < 50; ++i) {
        SCOPED_TRACE(i);
        EXPECT_EQ(g_events[i].data.arg, 2 * i);
        EXPECT_EQ(g_events[i].value, 4L * i * i);
    }
    EXPECT_EQ(rp.nmissed, 0) << "the instance of a refused call went back to the pool (maxactive 1)";
    // Recursion: with maxactive 1, only one even-argument frame can hold the instance.
    g_nevents = 0;
    unregister_kretprobe(&rp);
}

// ---- maxactive, nmissed, recursion -------------------------------------------------------------

TEST_F(KretprobesTest, DeepRecursionEveryLevelInLifoOrder) {
    constexpr long kDepth = 10000;
    kretprobe rp = make_rp("ukr_rec", static_cast<int>(kDepth + 1));
    ASSERT_EQ(register_kretprobe(&rp), 0);
    EXPECT_EQ(ukr_rec(kDepth), kDepth);
    EXPECT_EQ(rp.nmissed, 0);
    EXPECT_EQ(g_nentries, kDepth + 1);
    ASSERT_EQ(g_nevents, kDepth + 1);
    int bad = 0;
    for (long i = 0; i <= kDepth; ++i) {
        const RetEvent &e = g_events[i];
        // The deepest call (argument 0) returns first.
        if (e.value != i || e.data.arg != i || e.fp != e.data.sp || e.ret_addr != e.data.slot) {
            if (++bad < 10)
                ADD_FAILURE() << "event " << i << ": value " << e.value << " arg " << e.data.arg << " fp " << std::hex
                              << e.fp << " sp " << e.data.sp << " ret " << e.ret_addr << " slot " << e.data.slot;
        }
    }
    EXPECT_EQ(bad, 0);
    // Recursive frames return into ukr_rec itself, the outermost one into this test.
    const auto self = reinterpret_cast<unsigned long>(&ukr_rec);
    EXPECT_GT(g_events[0].ret_addr, self);
    EXPECT_LT(g_events[0].ret_addr, self + 256);
    // Again, to see every instance back in the pool.
    g_nevents = 0;
    EXPECT_EQ(ukr_rec(kDepth), kDepth);
    EXPECT_EQ(g_nevents, kDepth + 1);
    EXPECT_EQ(rp.nmissed, 0);
    unregister_kretprobe(&rp);
}

TEST_F(KretprobesTest, SmallMaxactiveCountsExactMisses) {
    constexpr long kDepth = 99; // 100 calls
    constexpr int kMax = 5;
    kretprobe rp = make_rp("ukr_rec", kMax);
    ASSERT_EQ(register_kretprobe(&rp), 0);
    EXPECT_EQ(ukr_rec(kDepth), kDepth);
    EXPECT_EQ(rp.nmissed, kDepth + 1 - kMax);
    EXPECT_EQ(g_nentries, kMax) << "no entry_handler call for a call without an instance";
    ASSERT_EQ(g_nevents, kMax);
    for (int i = 0; i < kMax; ++i) {
        SCOPED_TRACE(i);
        // The outermost kMax calls hold the instances; the innermost of them returns first.
        EXPECT_EQ(g_events[i].value, kDepth - kMax + 1 + i);
        EXPECT_EQ(g_events[i].data.arg, kDepth - kMax + 1 + i);
    }
    EXPECT_EQ(ukr_rec(kDepth), kDepth);
    EXPECT_EQ(rp.nmissed, 2 * (kDepth + 1 - kMax)) << "every instance came back";
    EXPECT_EQ(g_nevents, 2 * kMax);
    // A call that fits: no miss.
    EXPECT_EQ(ukr_rec(kMax - 1), kMax - 1);
    EXPECT_EQ(rp.nmissed, 2 * (kDepth + 1 - kMax));
    EXPECT_EQ(g_nevents, 3 * kMax);
    unregister_kretprobe(&rp);
}

TEST_F(KretprobesTest, DefaultMaxactive) {
    std::set<long> candidates;
    const long conf = sysconf(_SC_NPROCESSORS_CONF), onln = sysconf(_SC_NPROCESSORS_ONLN);
    cpu_set_t set;
    const long aff = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : onln;
    for (long n : {conf, onln, aff}) candidates.insert(std::max(10L, 2 * n));
    for (int maxactive : {0, -3}) {
        SCOPED_TRACE(maxactive);
        g_nevents = 0;
        g_nentries = 0;
        kretprobe rp = make_rp("ukr_rec", maxactive);
        ASSERT_EQ(register_kretprobe(&rp), 0);
        constexpr long kCalls = 200;
        EXPECT_EQ(ukr_rec(kCalls - 1), kCalls - 1);
        const long got = g_nevents;
        EXPECT_TRUE(candidates.count(got) == 1) << "instances: " << got << ", expected max(10, 2 * ncpu)";
        EXPECT_EQ(rp.nmissed, kCalls - got);
        unregister_kretprobe(&rp);
    }
}

// ---- many threads ------------------------------------------------------------------------------

thread_local long t_tid = 0;
std::atomic<long> g_mt_returns{0}, g_mt_bad_task{0}, g_mt_bad_data{0}, g_mt_bad_value{0};

int mt_entry(kretprobe_instance *ri, pt_regs *regs) {
    const long token[2] = {my_tid(), static_cast<long>(regs->di)};
    std::memcpy(ri->data, token, sizeof token);
    return 0;
}
int mt_ret(kretprobe_instance *ri, pt_regs *regs) {
    long token[2];
    std::memcpy(token, ri->data, sizeof token);
    g_mt_returns.fetch_add(1);
    if (ri->task != t_tid) g_mt_bad_task.fetch_add(1);
    if (token[0] != t_tid) g_mt_bad_data.fetch_add(1);
    if (static_cast<long>(regs_return_value(regs)) != token[1]) g_mt_bad_value.fetch_add(1);
    return 0;
}

TEST_F(KretprobesTest, ManyThreadsEachGetTheirOwnInstances) {
    constexpr int kThreads = 6, kRounds = 15;
    constexpr long kDepth = 150;
    g_mt_returns = g_mt_bad_task = g_mt_bad_data = g_mt_bad_value = 0;
    kretprobe rp{};
    rp.kp.symbol_name = "ukr_rec";
    rp.entry_handler = mt_entry;
    rp.handler = mt_ret;
    rp.data_size = 2 * sizeof(long);
    rp.maxactive = kThreads * (kDepth + 1);
    ASSERT_EQ(register_kretprobe(&rp), 0);
    std::atomic<int> wrong_results{0};
    std::atomic<int> go{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t)
        threads.emplace_back([&] {
            t_tid = my_tid();
            while (go.load() == 0) std::this_thread::yield();
            for (int r = 0; r < kRounds; ++r)
                if (ukr_rec(kDepth) != kDepth) wrong_results.fetch_add(1);
        });
    go = 1;
    for (auto &t : threads) t.join();
    EXPECT_EQ(wrong_results, 0);
    EXPECT_EQ(rp.nmissed, 0);
    EXPECT_EQ(g_mt_returns, kThreads * kRounds * (kDepth + 1));
    EXPECT_EQ(g_mt_bad_task, 0) << "ri->task is the returning thread";
    EXPECT_EQ(g_mt_bad_data, 0) << "ri->data came from this thread's own entry";
    EXPECT_EQ(g_mt_bad_value, 0) << "each level's return value matches its own argument";
    unregister_kretprobe(&rp);
}

TEST_F(KretprobesTest, ThreadsBlockedInsideCountMisses) {
    // kThreads threads wait inside the function at once; maxactive is smaller.
    constexpr int kThreads = 6, kMax = 2;
    static std::atomic<int> inside{0}, release{0};
    inside = 0;
    release = 0;
    struct Blocker {
        NOIPA static long run(long x) {
            inside.fetch_add(1);
            while (release.load() == 0) usleep(200);
            return x + 100;
        }
    };
    kretprobe rp = make_rp(nullptr, kMax);
    rp.kp.addr = reinterpret_cast<kprobe_opcode_t *>(&Blocker::run);
    ASSERT_EQ(register_kretprobe(&rp), 0);
    std::vector<std::thread> threads;
    std::vector<long> results(kThreads, -1);
    for (int t = 0; t < kThreads; ++t) threads.emplace_back([&, t] { results[t] = Blocker::run(t); });
    while (inside.load() < kThreads) usleep(200);
    EXPECT_EQ(rp.nmissed, kThreads - kMax);
    EXPECT_EQ(g_nentries, kMax);
    release = 1;
    for (auto &t : threads) t.join();
    for (int t = 0; t < kThreads; ++t) EXPECT_EQ(results[t], t + 100);
    EXPECT_EQ(g_nevents, kMax);
    EXPECT_EQ(rp.nmissed, kThreads - kMax);
    for (int i = 0; i < std::min<int>(g_nevents, kMax); ++i) EXPECT_EQ(g_events[i].value, g_events[i].data.arg + 100);
    unregister_kretprobe(&rp);
}

// ---- C++ exceptions through probed frames -----------------------------------------------------

struct DiveError {
    int value;
};
std::atomic<long> g_ctor{0}, g_dtor{0};
thread_local int t_caught_at = -1;

struct Counted {
    Counted() { g_ctor.fetch_add(1, std::memory_order_relaxed); }
    ~Counted() { g_dtor.fetch_add(1, std::memory_order_relaxed); }
    Counted(const Counted &) = delete;
    Counted &operator=(const Counted &) = delete;
};

} // namespace

// Returns depth, or, when it throws at depth 0 and frame catch_at catches,
// 1000 + 7 + (depth - catch_at). catch_at < 0: nobody inside catches.
extern "C" NOIPA int ukr_dive(int depth, int catch_at, int do_throw) {
    Counted guard;
    asm volatile("" ::: "memory");
    int r;
    if (depth == 0) {
        if (do_throw) throw DiveError{7};
        r = -1;
    } else if (depth == catch_at) {
        try {
            r = ukr_dive(depth - 1, catch_at, do_throw);
        } catch (const DiveError &e) {
            t_caught_at = depth;
            r = 1000 + e.value - 1;
        }
    } else {
        r = ukr_dive(depth - 1, catch_at, do_throw);
    }
    OPAQUE(r);
    return r + 1;
}

namespace {

class KretprobesUnwindTest : public KretprobesTest {
protected:
    void SetUp() override {
        KretprobesTest::SetUp();
        g_ctor = 0;
        g_dtor = 0;
        t_caught_at = -1;
    }
};

// Throws through depth + 1 frames; returns whether it was caught here.
NOIPA bool throw_through(int depth, int *value) {
    try {
        (void)ukr_dive(depth, -1, 1);
    } catch (const DiveError &e) {
        *value = e.value;
        return true;
    }
    return false;
}

TEST_F(KretprobesUnwindTest, ExceptionThroughProbedFramesCaughtOutside) {
    kretprobe rp = make_rp("ukr_dive", 64);
    ASSERT_EQ(register_kretprobe(&rp), 0);
    unsigned long unwound = 0;
    for (int frames : {1, 2, 50}) {
        SCOPED_TRACE(frames);
        g_ctor = g_dtor = 0;
        g_nevents = g_nentries = 0;
        int value = 0;
        EXPECT_TRUE(throw_through(frames - 1, &value)) << "caught where it should be";
        EXPECT_EQ(value, 7);
        EXPECT_EQ(g_ctor, frames);
        EXPECT_EQ(g_dtor, frames) << "every skipped frame's destructor ran";
        EXPECT_EQ(g_nentries, frames);
        EXPECT_EQ(g_nevents, 0) << "skipped frames get no return handler";
        unwound += static_cast<unsigned long>(frames);
        // A normal call afterwards is probed normally (and lets a lazy release happen).
        EXPECT_EQ(ukr_dive(3, -1, 0), 3);
        EXPECT_EQ(g_nevents, 4);
        for (int i = 0; i < std::min<int>(g_nevents, 4); ++i) EXPECT_EQ(g_events[i].value, i);
        EXPECT_EQ(rp.ukp_unwound, unwound) << "the skipped frames' instances were released";
        EXPECT_EQ(rp.nmissed, 0);
    }
    unregister_kretprobe(&rp);
}

TEST_F(KretprobesUnwindTest, ExceptionCaughtInTheMiddleOfProbedRecursion) {
    kretprobe rp = make_rp("ukr_dive", 64);
    ASSERT_EQ(register_kretprobe(&rp), 0);
    constexpr int kDepth = 50; // 51 frames
    unsigned long unwound = 0;
    for (int catch_at : {1, 2, 25, 50}) {
        SCOPED_TRACE(catch_at);
        g_ctor = g_dtor = 0;
        g_nevents = g_nentries = 0;
        t_caught_at = -1;
        const int expected = 1000 + 7 + (kDepth - catch_at);
        EXPECT_EQ(ukr_dive(kDepth, catch_at, 1), expected);
        EXPECT_EQ(t_caught_at, catch_at);
        EXPECT_EQ(g_ctor, kDepth + 1);
        EXPECT_EQ(g_dtor, kDepth + 1);
        // Frames catch_at..kDepth returned normally, innermost first.
        const int returned = kDepth - catch_at + 1;
        ASSERT_EQ(g_nevents, returned) << "frames that were not skipped get their return handler";
        for (int i = 0; i < returned; ++i) {
            SCOPED_TRACE(i);
            EXPECT_EQ(g_events[i].value, 1000 + 7 + i);
            EXPECT_EQ(g_events[i].data.arg, catch_at + i) << "each frame's own instance";
            EXPECT_EQ(g_events[i].fp, g_events[i].data.sp);
            EXPECT_EQ(g_events[i].ret_addr, g_events[i].data.slot);
        }
        unwound += static_cast<unsigned long>(catch_at);
        g_nevents = 0;
        EXPECT_EQ(ukr_dive(2, -1, 0), 2);
        EXPECT_EQ(g_nevents, 3);
        EXPECT_EQ(rp.ukp_unwound, unwound);
        EXPECT_EQ(rp.nmissed, 0);
    }
    unregister_kretprobe(&rp);
}

TEST_F(KretprobesUnwindTest, ThrownExceptionsDoNotLeakInstances) {
    constexpr int kMax = 4, kIterations = 300;
    kretprobe rp = make_rp("ukr_dive", kMax);
    ASSERT_EQ(register_kretprobe(&rp), 0);
    int caught = 0;
    for (int i = 0; i < kIterations; ++i) {
        int value = 0;
        if (throw_through(2, &value) && value == 7) ++caught; // 3 frames
    }
    EXPECT_EQ(caught, kIterations);
    EXPECT_EQ(g_ctor, 3 * kIterations);
    EXPECT_EQ(g_dtor, 3 * kIterations);
    EXPECT_EQ(g_nevents, 0);
    const int missed_while_throwing = rp.nmissed;
    EXPECT_EQ(missed_while_throwing, 0) << "each throw released its instances";
    // Later non-throwing calls that need every instance.
    for (int i = 0; i < 10; ++i) EXPECT_EQ(ukr_dive(kMax - 1, -1, 0), kMax - 1);
    EXPECT_EQ(rp.nmissed, missed_while_throwing) << "instances leaked by the throws";
    EXPECT_EQ(g_nevents, 10 * kMax);
    EXPECT_EQ(rp.ukp_unwound, 3ul * kIterations);
    unregister_kretprobe(&rp);
}

TEST_F(KretprobesUnwindTest, ExceptionThroughProbedAndMissedFrames) {
    // maxactive 3: of 11 frames, the outermost 3 hold instances and 8 are missed.
    kretprobe rp = make_rp("ukr_dive", 3);
    ASSERT_EQ(register_kretprobe(&rp), 0);
    for (int round = 1; round <= 3; ++round) {
        SCOPED_TRACE(round);
        const int missed_before = 16 * (round - 1);
        const unsigned long unwound_before = 4ul * static_cast<unsigned long>(round - 1);
        int value = 0;
        EXPECT_TRUE(throw_through(10, &value));
        EXPECT_EQ(value, 7);
        EXPECT_EQ(rp.nmissed, missed_before + 8);
        EXPECT_EQ(ukr_dive(2, -1, 0), 2);
        EXPECT_EQ(rp.nmissed, missed_before + 8) << "the 3 instances came back";
        EXPECT_EQ(rp.ukp_unwound, unwound_before + 3);
        // Caught in the middle, at frame 9: frames 10 and 9 hold instances and return;
        // frame 8, which held the third, is skipped.
        g_nevents = 0;
        t_caught_at = -1;
        EXPECT_EQ(ukr_dive(10, 9, 1), 1000 + 7 + 1);
        EXPECT_EQ(t_caught_at, 9);
        ASSERT_EQ(g_nevents, 2);
        EXPECT_EQ(g_events[0].data.arg, 9);
        EXPECT_EQ(g_events[1].data.arg, 10);
        EXPECT_EQ(rp.nmissed, missed_before + 16);
        EXPECT_EQ(ukr_dive(2, -1, 0), 2);
        EXPECT_EQ(rp.nmissed, missed_before + 16);
        EXPECT_EQ(rp.ukp_unwound, unwound_before + 4);
    }
    EXPECT_EQ(g_ctor, g_dtor);
    unregister_kretprobe(&rp);
}

TEST_F(KretprobesUnwindTest, ExceptionsOnManyThreads) {
    constexpr int kThreads = 4, kRounds = 100, kDepth = 20;
    kretprobe rp = make_rp("ukr_dive", kThreads * (kDepth + 1));
    ASSERT_EQ(register_kretprobe(&rp), 0);
    std::atomic<int> wrong{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t)
        threads.emplace_back([&, t] {
            for (int r = 0; r < kRounds; ++r) {
                int value = 0;
                if (!throw_through(kDepth, &value) || value != 7) wrong.fetch_add(1);
                // Alternate with a catch in the middle and a normal return.
                const int catch_at = 1 + (r + t) % kDepth;
                t_caught_at = -1;
                if (ukr_dive(kDepth, catch_at, 1) != 1000 + 7 + (kDepth - catch_at) || t_caught_at != catch_at)
                    wrong.fetch_add(1);
                if (ukr_dive(kDepth, -1, 0) != kDepth) wrong.fetch_add(1);
            }
        });
    for (auto &t : threads) t.join();
    EXPECT_EQ(wrong, 0);
    EXPECT_EQ(g_ctor, g_dtor);
    EXPECT_EQ(g_ctor, 3L * kThreads * kRounds * (kDepth + 1));
    EXPECT_EQ(rp.nmissed, 0);
    // Unwound: kDepth + 1 per outside catch, catch_at per middle catch.
    unsigned long unwound = 0;
    for (int t = 0; t < kThreads; ++t)
        for (int r = 0; r < kRounds; ++r) unwound += kDepth + 1 + 1 + (r + t) % kDepth;
    EXPECT_EQ(rp.ukp_unwound, unwound);
    // Returned frames: (kDepth - catch_at + 1) per middle catch, kDepth + 1 per normal call.
    long returned = 0;
    for (int t = 0; t < kThreads; ++t)
        for (int r = 0; r < kRounds; ++r) returned += kDepth - (1 + (r + t) % kDepth) + 1 + kDepth + 1;
    EXPECT_EQ(g_nevents, returned);
    unregister_kretprobe(&rp);
}

// ---- longjmp / siglongjmp out of probed frames -------------------------------------------------

jmp_buf g_jb;
sigjmp_buf g_sjb;

} // namespace

// mode 0: returns depth. mode 1: longjmp(g_jb, 5) at depth 0; mode 2: siglongjmp(g_sjb, 6).
// Frame setjmp_at (if >= 0) sets the jump target itself and then returns 1000 + depth - setjmp_at.
extern "C" NOIPA int ukr_jump(int depth, int setjmp_at, int mode) {
    int r;
    if (depth == 0) {
        if (mode == 1) longjmp(g_jb, 5);
        if (mode == 2) siglongjmp(g_sjb, 6);
        r = -1;
    } else if (depth == setjmp_at && mode == 1) {
        switch (setjmp(g_jb)) {
        case 0:
            r = ukr_jump(depth - 1, setjmp_at, mode);
            break;
        case 5:
            r = 999;
            break;
        default:
            r = -999;
            break;
        }
    } else if (depth == setjmp_at && mode == 2) {
        switch (sigsetjmp(g_sjb, 1)) {
        case 0:
            r = ukr_jump(depth - 1, setjmp_at, mode);
            break;
        case 6:
            r = 999;
            break;
        default:
            r = -999;
            break;
        }
    } else {
        r = ukr_jump(depth - 1, setjmp_at, mode);
    }
    OPAQUE(r);
    return r + 1;
}

void *g_bjb[5];

extern "C" NOIPA void ukr_bjump_leaf() { __builtin_longjmp(g_bjb, 1); }

void *g_bjb_in[5];
extern "C" NOIPA void ukr_bjump_in_leaf() { __builtin_longjmp(g_bjb_in, 1); }

// Probed: ukr_bjump_in(1) calls ukr_bjump_in(0), which jumps back into it; returns 9.
extern "C" NOIPA long ukr_bjump_in(long outer) {
    if (outer == 0) ukr_bjump_in_leaf();
    if (__builtin_setjmp(g_bjb_in) == 0) {
        long r = ukr_bjump_in(0);
        OPAQUE(r);
        return r;
    }
    return 9;
}

// Probed: returns 7, or jumps back to bjump_driver's __builtin_setjmp.
extern "C" NOIPA long ukr_bjump(long jump) {
    if (jump != 0) ukr_bjump_leaf();
    asm volatile("" ::: "memory");
    return 7;
}

namespace {

int g_returns = 0;
int count_return(kretprobe_instance *, pt_regs *) {
    __atomic_fetch_add(&g_returns, 1, __ATOMIC_RELAXED);
    return 0;
}

// Proven too: calls the function it probes, from its handler.
long g_inner_result = 0;
int calling_return(kretprobe_instance *, pt_regs *) {
    __atomic_fetch_add(&g_returns, 1, __ATOMIC_RELAXED);
    g_inner_result = ukr_square(3);
    return 0;
}

// A kretprobe on `sym` with a return handler only; g_returns starts again from 0.
kretprobe handler_only_rp(const char *sym, kretprobe_handler_t handler, int maxactive = 0) {
    kretprobe rp{};
    rp.kp.symbol_name = sym;
    rp.handler = handler;
    rp.maxactive = maxactive;
    g_returns = 0;
    return rp;
}

// Calls ukr_bjump(jump) from the same stack depth each time: -1 if it jumped back.
NOIPA long bjump_driver(long jump) {
    if (__builtin_setjmp(g_bjb) == 0) {
        long r = ukr_bjump(jump);
        OPAQUE(r);
        return r;
    }
    return -1;
}

// Jumps out of depth + 1 probed frames to a target here; returns the value delivered.
NOIPA int jump_out(int depth, int mode) {
    if (mode == 1) {
        switch (setjmp(g_jb)) {
        case 0: {
            int r = ukr_jump(depth, -1, 1);
            OPAQUE(r);
            return -1000 - r;
        }
        case 5:
            return 5;
        default:
            return -1;
        }
    }
    switch (sigsetjmp(g_sjb, 1)) {
    case 0: {
        int r = ukr_jump(depth, -1, 2);
        OPAQUE(r);
        return -1000 - r;
    }
    case 6:
        return 6;
    default:
        return -1;
    }
}

TEST_F(KretprobesTest, LongjmpOutOfProbedFrames) {
    for (int mode : {1, 2}) {
        SCOPED_TRACE(mode == 1 ? "longjmp" : "siglongjmp");
        constexpr int kMax = 4, kIterations = 300;
        g_nevents = g_nentries = 0;
        kretprobe rp = make_rp("ukr_jump", kMax);
        ASSERT_EQ(register_kretprobe(&rp), 0);
        sigset_t before, after;
        sigemptyset(&before);
        sigaddset(&before, SIGUSR2);
        ASSERT_EQ(pthread_sigmask(SIG_BLOCK, &before, nullptr), 0);
        int arrived = 0;
        for (int i = 0; i < kIterations; ++i)
            if (jump_out(2, mode) == 4 + mode) ++arrived; // 3 frames skipped
        EXPECT_EQ(arrived, kIterations) << "control arrived at setjmp's return";
        ASSERT_EQ(pthread_sigmask(SIG_UNBLOCK, &before, &after), 0);
        EXPECT_TRUE(sigismember(&after, SIGUSR2)) << "signal mask intact";
        EXPECT_EQ(g_nentries, 3 * kIterations);
        EXPECT_EQ(g_nevents, 0);
        EXPECT_EQ(rp.nmissed, 0) << "instances of jumped-over frames came back to the pool";
        // Later calls are probed normally and find every instance.
        for (int i = 0; i < 5; ++i) EXPECT_EQ(ukr_jump(kMax - 1, -1, 0), kMax - 1);
        EXPECT_EQ(rp.nmissed, 0);
        ASSERT_EQ(g_nevents, 5 * kMax);
        for (int i = 0; i < kMax; ++i) EXPECT_EQ(g_events[i].value, i);
        EXPECT_EQ(rp.ukp_unwound, 3ul * kIterations);
        unregister_kretprobe(&rp);
    }
}

// A jump out of a probed frame that the agent does not see (GCC's __builtin_longjmp is
// inlined: no libc call to hook). The frame's instance stays in the thread's list until
// the next return of a frame at the same place finds it there, dead, and counts it
// unwound (quarantined as a suspect, in case that was a guess). That return takes the
// dispatcher's path, not the return trampoline's fast case, which would leave it there.
TEST_F(KretprobesTest, AJumpTheAgentDoesNotSeeIsFoundAtTheNextReturn) {
    constexpr int kIterations = 50;
    // count_return is proven to leave the vector state alone: the fast case may take it.
    kretprobe rp = handler_only_rp("ukr_bjump", count_return, 2 * kIterations + 2); // suspects are not reused
    ASSERT_EQ(register_kretprobe(&rp), 0);
    int jumped = 0, returned = 0;
    for (int i = 0; i < kIterations; ++i) {
        jumped += bjump_driver(1) == -1;
        returned += bjump_driver(0) == 7;
    }
    EXPECT_EQ(jumped, kIterations);
    EXPECT_EQ(returned, kIterations);
    EXPECT_EQ(rp.nmissed, 0);
    EXPECT_EQ(rp.ukp_unwound, static_cast<unsigned long>(kIterations)) << "each jumped-over frame found";
    EXPECT_EQ(g_returns, kIterations);
    unregister_kretprobe(&rp);

    // Out of a probed frame into another one: when the outer frame returns, the inner
    // one's instance is the newest of the thread's list, above it.
    rp = handler_only_rp("ukr_bjump_in", count_return, 2 * kIterations + 2);
    ASSERT_EQ(register_kretprobe(&rp), 0);
    int nines = 0;
    for (int i = 0; i < kIterations; ++i) nines += ukr_bjump_in(1) == 9;
    EXPECT_EQ(nines, kIterations);
    EXPECT_EQ(rp.nmissed, 0);
    EXPECT_EQ(rp.ukp_unwound, static_cast<unsigned long>(kIterations)) << "each inner frame found";
    EXPECT_EQ(g_returns, kIterations) << "the outer frames' returns";
    unregister_kretprobe(&rp);
}

// A signal handler that calls a probed function which jumps out unseen (bjump_driver),
// while the interrupted thread may be anywhere in a return, the fast case's steps on the
// thread's list included: every entry of the inner function either found no instance or
// had its instance found dead (unwound) at a later return. None may drop out of the list
// unaccounted for, as one would if the fast case took its instance off the list at
// depth 0, where the handler's entry goes on the list at the same moment.
std::atomic<int> g_storm_entries{0};
void storm_handler(int) {
    const int saved = errno;
    bjump_driver(1);
    g_storm_entries.fetch_add(1, std::memory_order_relaxed);
    errno = saved;
}

TEST_F(KretprobesTest, ASignalHandlersJumpDuringAReturnLosesNoInstance) {
    kretprobe outer = handler_only_rp("ukr_square", count_return, 8);
    kretprobe inner{};
    inner.kp.symbol_name = "ukr_bjump";
    inner.handler = count_return;
    inner.maxactive = 4096; // instances found dead are quarantined, not reused
    ASSERT_EQ(register_kretprobe(&outer), 0);
    ASSERT_EQ(register_kretprobe(&inner), 0);
    ukp_optimizer_flush(); // a return costs some 30 ns: the fast case is a good share of it
    struct sigaction sa {
    }, old{};
    sa.sa_handler = storm_handler;
    ASSERT_EQ(sigaction(SIGUSR1, &sa, &old), 0);
    g_storm_entries = 0;
    const pthread_t target = pthread_self();
    std::atomic<bool> stop{false};
    std::thread sender([&] {
        for (int i = 0; i < 3000 && !stop.load(); ++i) {
            pthread_kill(target, SIGUSR1);
            std::this_thread::sleep_for(std::chrono::microseconds(20));
        }
        stop = true;
    });
    long wrong = 0;
    while (!stop.load())
        for (int i = 0; i < 1000; ++i) wrong += ukr_square(i) != long{i} * i;
    sender.join();
    ASSERT_EQ(sigaction(SIGUSR1, &old, nullptr), 0);
    EXPECT_EQ(ukr_square(5), 25); // the last jumped-over instance is found here
    EXPECT_EQ(wrong, 0);
    const long entries = g_storm_entries.load();
    EXPECT_GT(entries, 1000);
    const long accounted = static_cast<long>(inner.ukp_unwound) + inner.nmissed + static_cast<long>(inner.kp.nmissed);
    EXPECT_EQ(accounted, entries) << "unwound " << inner.ukp_unwound << ", no instance " << inner.nmissed
                                  << ", hit inside a handler " << inner.kp.nmissed;
    unregister_kretprobe(&inner);
    unregister_kretprobe(&outer);
}

TEST_F(KretprobesTest, LongjmpToATargetInsideProbedRecursion) {
    for (int mode : {1, 2}) {
        SCOPED_TRACE(mode == 1 ? "longjmp" : "siglongjmp");
        constexpr int kDepth = 12;
        kretprobe rp = make_rp("ukr_jump", 64);
        ASSERT_EQ(register_kretprobe(&rp), 0);
        unsigned long unwound = 0;
        for (int setjmp_at : {1, 6, 12}) {
            SCOPED_TRACE(setjmp_at);
            g_nevents = g_nentries = 0;
            EXPECT_EQ(ukr_jump(kDepth, setjmp_at, mode), 1000 + kDepth - setjmp_at);
            EXPECT_EQ(g_nentries, kDepth + 1);
            const int returned = kDepth - setjmp_at + 1;
            ASSERT_EQ(g_nevents, returned);
            for (int i = 0; i < returned; ++i) {
                SCOPED_TRACE(i);
                EXPECT_EQ(g_events[i].value, 1000 + i);
                EXPECT_EQ(g_events[i].data.arg, setjmp_at + i);
            }
            unwound += static_cast<unsigned long>(setjmp_at);
            EXPECT_EQ(ukr_jump(3, -1, 0), 3);
            EXPECT_EQ(rp.ukp_unwound, unwound);
            EXPECT_EQ(rp.nmissed, 0);
        }
        unregister_kretprobe(&rp);
    }
}

// siglongjmp out of a signal handler that interrupted a probed function: the common way
// of leaving a frame without returning in C programs.
sigjmp_buf g_sig_jb;
void jump_from_handler(int) { siglongjmp(g_sig_jb, 9); }

} // namespace

extern "C" NOIPA int ukr_raise_at_bottom(int depth) {
    int r;
    if (depth == 0) {
        raise(SIGUSR1);
        r = -1;
    } else {
        r = ukr_raise_at_bottom(depth - 1);
    }
    OPAQUE(r);
    return r + 1;
}

namespace {

NOIPA int raise_and_jump(int depth) {
    switch (sigsetjmp(g_sig_jb, 1)) {
    case 0: {
        int r = ukr_raise_at_bottom(depth);
        OPAQUE(r);
        return -1000 - r;
    }
    case 9:
        return 9;
    default:
        return -1;
    }
}

TEST_F(KretprobesTest, SiglongjmpFromASignalHandlerOutOfProbedFrames) {
    struct sigaction act {
    }, old{};
    act.sa_handler = jump_from_handler;
    sigemptyset(&act.sa_mask);
    ASSERT_EQ(sigaction(SIGUSR1, &act, &old), 0);
    constexpr int kMax = 4, kIterations = 200;
    kretprobe rp = make_rp("ukr_raise_at_bottom", kMax);
    ASSERT_EQ(register_kretprobe(&rp), 0);
    int arrived = 0;
    for (int i = 0; i < kIterations; ++i)
        if (raise_and_jump(3) == 9) ++arrived;
    EXPECT_EQ(arrived, kIterations);
    sigset_t now;
    ASSERT_EQ(pthread_sigmask(SIG_SETMASK, nullptr, &now), 0);
    EXPECT_FALSE(sigismember(&now, SIGUSR1)) << "siglongjmp restored the mask";
    EXPECT_EQ(rp.nmissed, 0);
    EXPECT_EQ(g_nevents, 0);
    EXPECT_EQ(rp.ukp_unwound, 4ul * kIterations);
    unregister_kretprobe(&rp);
    ASSERT_EQ(sigaction(SIGUSR1, &old, nullptr), 0);
}

// ---- backtraces through hijacked frames ----------------------------------------------------

struct Trace {
    void *bt[64];
    int nbt = 0;
    uintptr_t uw[64];
    int nuw = 0;
};

_Unwind_Reason_Code collect_ip(struct _Unwind_Context *ctx, void *arg) {
    auto *t = static_cast<Trace *>(arg);
    if (t->nuw >= 64) return _URC_END_OF_STACK;
    t->uw[t->nuw++] = _Unwind_GetIP(ctx);
    return _URC_NO_REASON;
}

} // namespace

extern "C" NOIPA void ukr_bt_capture(Trace *t) {
    t->nbt = backtrace(t->bt, 64);
    t->nuw = 0;
    _Unwind_Backtrace(collect_ip, t);
    asm volatile("" ::: "memory");
}

extern "C" NOIPA int ukr_bt_level(int depth, Trace *t) {
    int r;
    if (depth == 0) {
        ukr_bt_capture(t);
        r = 0;
    } else {
        r = ukr_bt_level(depth - 1, t);
    }
    OPAQUE(r);
    return r + 1;
}

namespace {

NOIPA void take_trace(Trace *t) {
    int r = ukr_bt_level(3, t);
    OPAQUE(r);
}

// Takes two traces from one call site, calling between() in between. The loop counter is
// hidden from the compiler so that it cannot unroll the loop into two call sites.
NOIPA void trace_twice(Trace *traces, void (*between)()) {
    for (int pass = 0; pass < 2; ++pass) {
        OPAQUE(pass);
        if (pass == 1) between();
        take_trace(&traces[pass]);
        OPAQUE(pass);
    }
}

kretprobe g_bt_level, g_bt_capture;
int g_bt_rc[2] = {-1, -1};
void register_bt_probes() {
    g_bt_rc[0] = register_kretprobe(&g_bt_level);
    g_bt_rc[1] = register_kretprobe(&g_bt_capture);
}

// Takes a trace from one call site without probes, then with the kretprobes that
// `registration` puts on ukr_bt_level and ukr_bt_capture, and checks that both walks
// are the same; unregisters them.
void expect_traces_unchanged_by(void (*registration)()) {
    Trace traces[2];
    Trace warm;
    take_trace(&warm); // loads libgcc_s for backtrace()
    trace_twice(traces, registration);
    ASSERT_EQ(g_bt_rc[0], 0);
    ASSERT_EQ(g_bt_rc[1], 0);
    EXPECT_EQ(g_nevents, 5) << "ukr_bt_capture and four ukr_bt_level frames returned through probes";
    unregister_kretprobe(&g_bt_capture);
    unregister_kretprobe(&g_bt_level);

    const Trace &ref = traces[0], &got = traces[1];
    ASSERT_GE(ref.nbt, 7);
    ASSERT_EQ(got.nbt, ref.nbt) << "backtrace(): same depth as without probes";
    for (int i = 0; i < ref.nbt; ++i) {
        SCOPED_TRACE(i);
        EXPECT_EQ(got.bt[i], ref.bt[i]) << "backtrace() frame";
        Dl_info info{};
        EXPECT_NE(dladdr(got.bt[i], &info), 0) << "every frame is inside a loaded object";
    }
    ASSERT_GE(ref.nuw, 7);
    ASSERT_EQ(got.nuw, ref.nuw) << "_Unwind_Backtrace: same depth as without probes";
    for (int i = 0; i < ref.nuw; ++i) {
        SCOPED_TRACE(i);
        EXPECT_EQ(got.uw[i], ref.uw[i]) << "_Unwind_Backtrace frame";
    }
}

TEST_F(KretprobesTest, BacktracesShowTheRealCallers) {
    g_bt_level = make_rp("ukr_bt_level", 16, false);
    g_bt_capture = make_rp("ukr_bt_capture", 16, false);
    expect_traces_unchanged_by(register_bt_probes);
}

// Registers a handler-only kretprobe (ret_record) on sym and waits for its jump: alone on
// the entry, it is entered through its own detour, whose trampoline sends the call
// through the instance's stub (the frame's return address is the stub's call's).
void put_called_rp(kretprobe *rp, const char *sym, int maxactive) {
    *rp = make_rp(sym, maxactive, /*with_entry=*/false);
    ASSERT_EQ(register_kretprobe(rp), 0);
    ukp_optimizer_flush();
    ASSERT_NE(rp->kp.flags & KPROBE_FLAG_OPTIMIZED, 0u) << sym;
}

void register_called_bt_probes() {
    g_bt_rc[0] = g_bt_rc[1] = -1;
    put_called_rp(&g_bt_level, "ukr_bt_level", 16);
    put_called_rp(&g_bt_capture, "ukr_bt_capture", 16);
    g_bt_rc[0] = g_bt_rc[1] = 0;
    // The thread's first hit is the C path's, the rest the trampoline's.
    g_nevents = 0;
    Trace warm;
    EXPECT_EQ(ukr_bt_level(2, &warm), 3) << "warm-up";
    g_nevents = 0;
}

// Frames entered through a kretprobe's own detour (the stub calls the function, see
// trampoline.hpp) unwind as hijacked ones do: backtraces show the real callers, C++
// exceptions and longjmp through them release their instances, on a thread whose entries
// take the trampoline's way.
TEST_F(KretprobesTest, FramesTheStubCalledUnwindAsOthers) {
    std::thread([] {
        expect_traces_unchanged_by(register_called_bt_probes);

        kretprobe dive{};
        put_called_rp(&dive, "ukr_dive", 64);
        EXPECT_EQ(ukr_dive(2, -1, 0), 2) << "warm-up";
        g_ctor = g_dtor = 0;
        g_nevents = 0;
        int value = 0;
        EXPECT_TRUE(throw_through(49, &value)) << "caught where it should be";
        EXPECT_EQ(value, 7);
        EXPECT_EQ(g_dtor, 50) << "every skipped frame's destructor ran";
        EXPECT_EQ(g_nevents, 0) << "skipped frames get no return handler";
        EXPECT_EQ(dive.ukp_unwound, 50ul) << "the skipped frames' instances were released";
        EXPECT_EQ(ukr_dive(3, -1, 0), 3);
        ASSERT_EQ(g_nevents, 4);
        for (int i = 0; i < 4; ++i) EXPECT_EQ(g_events[i].value, i);
        EXPECT_EQ(dive.nmissed, 0);
        unregister_kretprobe(&dive);

        kretprobe jump{};
        put_called_rp(&jump, "ukr_jump", 8); // one in each shard: the thread's home shard has one
        EXPECT_EQ(ukr_jump(1, -1, 0), 1) << "warm-up";
        g_nevents = 0;
        for (int i = 0; i < 100; ++i) ASSERT_EQ(jump_out(2, 1), 5);
        EXPECT_EQ(g_nevents, 0);
        for (int i = 0; i < 5; ++i) EXPECT_EQ(ukr_jump(3, -1, 0), 3);
        EXPECT_EQ(jump.nmissed, 0) << "instances of jumped-over frames came back to the pool";
        EXPECT_EQ(g_nevents, 5 * 4);
        EXPECT_EQ(jump.ukp_unwound, 300ul);
        unregister_kretprobe(&jump);
    }).join();
}

// ---- unregister with live instances ------------------------------------------------------------

std::atomic<int> g_block_inside{0}, g_block_release{0};

} // namespace

extern "C" NOIPA long ukr_block(long depth) {
    long r;
    if (depth == 0) {
        g_block_inside = 1;
        while (g_block_release.load() == 0) usleep(200);
        r = 500;
    } else {
        r = ukr_block(depth - 1);
    }
    OPAQUE(r);
    return r + 1;
}

kretprobe *g_unreg_rp = nullptr;
extern "C" NOIPA long ukr_rec_unreg(long n, long unreg_at) {
    if (n == unreg_at) unregister_kretprobe(g_unreg_rp);
    if (n == 0) return 0;
    long r = ukr_rec_unreg(n - 1, unreg_at);
    OPAQUE(r);
    return r + 1;
}

namespace {

// Starts a thread calling ukr_block(5), and returns once it is inside (blocked until
// g_block_release); *result gets the call's result.
std::thread call_blocked_inside(long *result) {
    g_block_inside = 0;
    g_block_release = 0;
    std::thread t([result] { *result = ukr_block(5); });
    while (g_block_inside.load() == 0) usleep(200);
    return t;
}

// The return trampoline's fast case: a handler proven to leave the vector state alone
// (count_return) is called from the trampoline, the instance taken off the thread's list
// and given back there. Recursion in LIFO order, threads at once with exactly maxactive
// instances, a handler entered with nothing of its own to release, and no handler once
// the probe is unregistered with calls still inside.
TEST_F(KretprobesTest, TheReturnFastCase) {
    kretprobe rp = handler_only_rp("ukr_rec", count_return, 4 * 11); // four threads, 11 frames each
    ASSERT_EQ(register_kretprobe(&rp), 0);
    for (int i = 0; i < 100; ++i) ASSERT_EQ(ukr_rec(10), 10);
    EXPECT_EQ(g_returns, 1100);
    std::vector<std::thread> threads;
    std::atomic<int> wrong{0};
    for (int t = 0; t < 4; ++t)
        threads.emplace_back([&] {
            for (int i = 0; i < 2000; ++i) wrong += ukr_rec(10) != 10;
        });
    for (auto &t : threads) t.join();
    EXPECT_EQ(wrong.load(), 0);
    EXPECT_EQ(rp.nmissed, 0) << "every instance went back to the pool at its return";
    EXPECT_EQ(g_returns, 1100 + 4 * 2000 * 11);
    EXPECT_EQ(rp.ukp_unwound, 0u);
    unregister_kretprobe(&rp);

    // A call of the probed function from the handler is not probed, and counts a miss.
    kretprobe calling = handler_only_rp("ukr_square", calling_return);
    ASSERT_EQ(register_kretprobe(&calling), 0);
    EXPECT_EQ(ukr_square(2), 4);
    EXPECT_EQ(g_inner_result, 9);
    EXPECT_EQ(g_returns, 1);
    EXPECT_EQ(calling.kp.nmissed, 1ul) << "the inner entry, hit inside a handler";
    EXPECT_EQ(calling.nmissed, 0);
    unregister_kretprobe(&calling);

    kretprobe blocked = handler_only_rp("ukr_block", count_return);
    ASSERT_EQ(register_kretprobe(&blocked), 0);
    long result = 0;
    std::thread t = call_blocked_inside(&result);
    unregister_kretprobe(&blocked);
    g_block_release = 1;
    t.join();
    EXPECT_EQ(result, 506);
    EXPECT_EQ(g_returns, 0) << "no handler after unregister_kretprobe";
}

TEST_F(KretprobesTest, UnregisterWhileAThreadIsInsideTheFunction) {
    kretprobe rp = make_rp("ukr_block", 16);
    ASSERT_EQ(register_kretprobe(&rp), 0);
    long result = 0;
    std::thread t = call_blocked_inside(&result);
    EXPECT_EQ(g_nentries, 6);
    unregister_kretprobe(&rp);
    EXPECT_EQ(list(), "") << "unregistered, even with an instance still pending";
    const int events_at_unregister = g_nevents;
    EXPECT_EQ(events_at_unregister, 0);
    g_block_release = 1;
    t.join();
    EXPECT_EQ(result, 506) << "the pending returns reached the real return addresses";
    EXPECT_EQ(g_nevents, events_at_unregister) << "no return handler after unregister returned";
    EXPECT_EQ(ukr_block(2), 503);
}

// The pool of an unregistered kretprobe is freed (by a later registration) only once its
// last instance is back: a call still inside the function returns through it.
TEST_F(KretprobesTest, ALaterRegistrationLeavesThePoolOfACallStillInside) {
    kretprobe rp = make_rp("ukr_block", 16);
    ASSERT_EQ(register_kretprobe(&rp), 0);
    long result = 0;
    std::thread t = call_blocked_inside(&result);
    unregister_kretprobe(&rp);
    // Registering reaps the dead pools; its own pool could take the freed one's place.
    kretprobe others[4];
    for (auto &o : others) {
        o = make_rp("ukr_square", 16);
        ASSERT_EQ(register_kretprobe(&o), 0);
    }
    g_block_release = 1;
    t.join();
    EXPECT_EQ(result, 506);
    EXPECT_EQ(ukr_square(3), 9);
    for (auto &o : others) unregister_kretprobe(&o);
}

TEST_F(KretprobesTest, UnregisterFromInsideTheProbedRecursion) {
    kretprobe rp = make_rp("ukr_rec_unreg", 64);
    ASSERT_EQ(register_kretprobe(&rp), 0);
    g_unreg_rp = &rp;
    EXPECT_EQ(ukr_rec_unreg(20, 10), 20);
    EXPECT_EQ(g_nentries, 11) << "frames 20..10 entered before unregister";
    EXPECT_EQ(g_nevents, 0) << "no return handler after unregister returned";
    EXPECT_EQ(ukr_rec_unreg(5, -1), 5);
    EXPECT_EQ(g_nentries, 11);
    // Registered again: works as new.
    rp.kp.addr = nullptr; // filled in by the first registration
    ASSERT_EQ(register_kretprobe(&rp), 0);
    EXPECT_EQ(ukr_rec_unreg(3, -1), 3);
    EXPECT_EQ(g_nevents, 4);
    unregister_kretprobe(&rp);
}

// ---- disable, enable, batches, kprobe on the same entry, list ---------------------------------

TEST_F(KretprobesTest, DisableAndEnable) {
    kretprobe rp = make_rp("ukr_square", 4);
    ASSERT_EQ(register_kretprobe(&rp), 0);
    EXPECT_EQ(ukr_square(2), 4);
    EXPECT_EQ(g_nevents, 1);
    ASSERT_EQ(disable_kretprobe(&rp), 0);
    EXPECT_EQ(ukr_square(3), 9);
    EXPECT_EQ(g_nentries, 1);
    EXPECT_EQ(g_nevents, 1);
    EXPECT_NE(list().find("[DISABLED]"), std::string::npos);
    ASSERT_EQ(enable_kretprobe(&rp), 0);
    EXPECT_EQ(ukr_square(4), 16);
    EXPECT_EQ(g_nevents, 2);
    EXPECT_EQ(g_events[1].value, 16);
    EXPECT_EQ(list().find("[DISABLED]"), std::string::npos);
    unregister_kretprobe(&rp);
}

TEST_F(KretprobesTest, BatchRegistration) {
    kretprobe a = make_rp("ukr_square", 4), b = make_rp("ukr_triple", 4);
    kretprobe *ok[] = {&a, &b};
    ASSERT_EQ(register_kretprobes(ok, 2), 0);
    EXPECT_EQ(ukr_square(3), 9);
    EXPECT_EQ(ukr_triple(3), 10);
    ASSERT_EQ(g_nevents, 2);
    EXPECT_EQ(g_events[0].rp, &a);
    EXPECT_EQ(g_events[1].rp, &b);
    unregister_kretprobes(ok, 2);
    EXPECT_EQ(list(), "");

    g_nevents = 0;
    kretprobe good = make_rp("ukr_square", 4), bad = make_rp("no_such_function_anywhere", 4);
    kretprobe *mixed[] = {&good, &bad};
    EXPECT_EQ(register_kretprobes(mixed, 2), -ENOENT);
    EXPECT_EQ(list(), "") << "the probes before the bad one were unregistered";
    EXPECT_EQ(ukr_square(3), 9);
    EXPECT_EQ(g_nevents, 0);
    kretprobe good2 = make_rp("ukr_triple", 4), mid = make_rp("ukpt_branches", 4);
    mid.kp.offset = static_cast<unsigned>(ukpt_branches_at_call - reinterpret_cast<char *>(&ukpt_branches));
    kretprobe *mixed2[] = {&good2, &mid};
    EXPECT_EQ(register_kretprobes(mixed2, 2), -EINVAL);
    EXPECT_EQ(list(), "");
    EXPECT_EQ(register_kretprobes(ok, 0), -EINVAL);
}

TEST_F(KretprobesTest, KprobeAndKretprobeOnTheSameEntryBothRun) {
    kprobe kp{};
    kp.symbol_name = "ukr_square";
    kp.pre_handler = kp_count;
    kretprobe rp = make_rp("ukr_square", 4);
    ASSERT_EQ(register_kprobe(&kp), 0);
    ASSERT_EQ(register_kretprobe(&rp), 0);
    EXPECT_EQ(ukr_square(6), 36);
    EXPECT_EQ(g_kp_hits, 1);
    EXPECT_EQ(g_kp_di, 6u);
    ASSERT_EQ(g_nevents, 1);
    EXPECT_EQ(g_events[0].value, 36);
    EXPECT_EQ(g_events[0].data.arg, 6);

    const std::string text = list();
    char addr[17];
    std::snprintf(addr, sizeof addr, "%016lx", reinterpret_cast<unsigned long>(&ukr_square));
    EXPECT_NE(text.find(std::string(addr) + "  k  ukr_square+0x0  "), std::string::npos) << text;
    EXPECT_NE(text.find(std::string(addr) + "  r  ukr_square+0x0  "), std::string::npos) << text;

    unregister_kprobe(&kp);
    EXPECT_EQ(ukr_square(7), 49);
    EXPECT_EQ(g_kp_hits, 1);
    EXPECT_EQ(g_nevents, 2) << "the kretprobe stays after the kprobe is gone";
    ASSERT_EQ(register_kprobe(&kp), -EINVAL) << "kp.addr was filled in by the first registration";
    kp.addr = nullptr;
    ASSERT_EQ(register_kprobe(&kp), 0);
    unregister_kretprobe(&rp);
    EXPECT_EQ(ukr_square(8), 64);
    EXPECT_EQ(g_kp_hits, 2) << "the kprobe stays after the kretprobe is gone";
    EXPECT_EQ(g_nevents, 2);
    unregister_kprobe(&kp);
}

// setjmp's family returns again at each longjmp to what it saved, getcontext at each
// setcontext, vfork in the child and then in the parent: a second return to the address
// seen at entry, which a return probe's stub would have replaced. No return probe goes
// there (every name at the address counts: glibc's setjmp and _setjmp are their own
// functions, vfork and __vfork one); a kprobe does, and its hits count.
TEST_F(KretprobesTest, NoReturnProbeOnAFunctionThatReturnsTwice) {
    for (const char *name : {"libc.so.6:setjmp", "libc.so.6:_setjmp", "libc.so.6:__sigsetjmp", "libc.so.6:getcontext",
                             "libc.so.6:vfork", "libc.so.6:__vfork"}) {
        kretprobe rp = make_rp(name);
        EXPECT_EQ(register_kretprobe(&rp), -EINVAL) << name;
        EXPECT_EQ(list().find("  r  "), std::string::npos) << name << "\n" << list();
    }
    kprobe kp{};
    kp.symbol_name = "libc.so.6:__sigsetjmp";
    kp.pre_handler = kp_count;
    ASSERT_EQ(register_kprobe(&kp), 0);
    sigjmp_buf jb;
    volatile int rounds = 0;
    if (sigsetjmp(jb, 1) == 0 || rounds < 3) {
        rounds = rounds + 1;
        siglongjmp(jb, 1);
    }
    unregister_kprobe(&kp);
    EXPECT_EQ(rounds, 3);
    EXPECT_EQ(g_kp_hits, 1) << "one call, however many returns";
    kretprobe beside = make_rp("libc.so.6:getpid");
    EXPECT_EQ(register_kretprobe(&beside), 0) << "an ordinary function of libc";
    unregister_kretprobe(&beside);
}

TEST_F(KretprobesTest, ListShowsTypeR) {
    kretprobe rp = make_rp("ukr_triple", 4);
    ASSERT_EQ(register_kretprobe(&rp), 0);
    const std::string text = list();
    const std::regex row("([0-9a-f]{16})  r  ukr_triple\\+0x0  kretprobes_test \n");
    std::smatch m;
    ASSERT_TRUE(std::regex_match(text, m, row)) << text;
    EXPECT_EQ(std::stoul(m[1].str(), nullptr, 16), reinterpret_cast<unsigned long>(&ukr_triple));
    ASSERT_EQ(disable_kretprobe(&rp), 0);
    EXPECT_TRUE(
        std::regex_match(list(), std::regex("[0-9a-f]{16}  r  ukr_triple\\+0x0  kretprobes_test \\[DISABLED\\]\n")))
        << list();
    unregister_kretprobe(&rp);
}

// ---- threads that exit or are cancelled inside probed frames -----------------------------------

std::atomic<int> g_exit_at_bottom{0};

} // namespace

// mode 0: returns n; mode 1: pthread_exit((void *)77) at the bottom; mode 2: waits at the
// bottom in a cancellation point until cancelled.
extern "C" NOIPA long ukr_exit_rec(long n, long mode) {
    Counted guard;
    long r;
    if (n == 0) {
        if (mode == 1) pthread_exit(reinterpret_cast<void *>(77));
        if (mode == 2) {
            g_exit_at_bottom = 1;
            for (;;) usleep(1000);
        }
        r = 0;
    } else {
        r = ukr_exit_rec(n - 1, mode);
    }
    OPAQUE(r);
    return r + 1;
}

namespace {

void *exit_thread(void *arg) {
    const long mode = reinterpret_cast<long>(arg);
    return reinterpret_cast<void *>(ukr_exit_rec(3, mode));
}

class KretprobesThreadExitTest : public KretprobesUnwindTest {};

TEST_F(KretprobesThreadExitTest, PthreadExitAndCancelInsideProbedFrames) {
    constexpr int kFrames = 4, kIterations = 10;
    kretprobe rp = make_rp("ukr_exit_rec", kFrames); // exactly one thread's worth
    ASSERT_EQ(register_kretprobe(&rp), 0);
    unsigned long unwound = 0;
    for (int i = 0; i < kIterations; ++i) {
        SCOPED_TRACE(i);
        g_ctor = g_dtor = 0;
        // pthread_exit in a pthread.
        pthread_t th;
        ASSERT_EQ(pthread_create(&th, nullptr, exit_thread, reinterpret_cast<void *>(1L)), 0);
        void *ret = nullptr;
        ASSERT_EQ(pthread_join(th, &ret), 0);
        EXPECT_EQ(ret, reinterpret_cast<void *>(77));
        EXPECT_EQ(g_dtor, kFrames) << "forced unwinding ran the destructors";
        unwound += kFrames;
        // pthread_exit in a std::thread.
        std::thread st([] { (void)ukr_exit_rec(3, 1); });
        st.join();
        EXPECT_EQ(g_dtor, 2 * kFrames);
        unwound += kFrames;
        // pthread_cancel while waiting inside.
        g_exit_at_bottom = 0;
        ASSERT_EQ(pthread_create(&th, nullptr, exit_thread, reinterpret_cast<void *>(2L)), 0);
        while (g_exit_at_bottom.load() == 0) usleep(200);
        ASSERT_EQ(pthread_cancel(th), 0);
        ASSERT_EQ(pthread_join(th, &ret), 0);
        EXPECT_EQ(ret, PTHREAD_CANCELED);
        EXPECT_EQ(g_dtor, 3 * kFrames);
        EXPECT_EQ(g_ctor, 3 * kFrames);
        unwound += kFrames;
        EXPECT_EQ(rp.nmissed, 0) << "each new thread found every instance free again";
    }
    EXPECT_EQ(g_nevents, 0);
    // The main thread needs every instance too.
    EXPECT_EQ(ukr_exit_rec(kFrames - 1, 0), kFrames);
    EXPECT_EQ(rp.nmissed, 0);
    EXPECT_EQ(g_nevents, kFrames);
    EXPECT_EQ(rp.ukp_unwound, unwound);
    unregister_kretprobe(&rp);
}

} // namespace

// Two kretprobes on one function hijack the same return-address slot, one after the
// other: the second saves the first one's stub as its return address. Both handlers run,
// in LIFO order, and neither instance is taken for unwound (found by the stress test).
namespace {
std::vector<int> g_two_order;
int two_first(kretprobe_instance *, pt_regs *) {
    g_two_order.push_back(1);
    return 0;
}
int two_second(kretprobe_instance *, pt_regs *) {
    g_two_order.push_back(2);
    return 0;
}
} // namespace

extern "C" __attribute__((noinline)) int ukr_two_probes(int x) {
    asm volatile("" ::: "memory");
    return x * 5;
}

TEST(KretprobesTwo, TwoKretprobesOnOneFunction) {
    kretprobe first{}, second{};
    first.kp.symbol_name = second.kp.symbol_name = "ukr_two_probes";
    first.handler = two_first;
    second.handler = two_second;
    ASSERT_EQ(register_kretprobe(&first), 0);
    ASSERT_EQ(register_kretprobe(&second), 0);
    for (int i = 0; i < 3; ++i) EXPECT_EQ(ukr_two_probes(i), 5 * i);
    EXPECT_EQ(g_two_order, (std::vector<int>{2, 1, 2, 1, 2, 1}));
    EXPECT_EQ(first.ukp_unwound, 0u);
    EXPECT_EQ(second.ukp_unwound, 0u);
    EXPECT_EQ(first.nmissed, 0);
    unregister_kretprobe(&second);
    unregister_kretprobe(&first);
}
