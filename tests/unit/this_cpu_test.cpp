// platform::count_on_this_cpu: the per-CPU hit counter of the probe-hit path, a plain add
// inside an rseq critical section. More threads than CPUs, moved between the CPUs all
// the time, so that threads are preempted and migrated between reading cpu_id and the
// add: the sum must come out exact, and the kernel's aborts must land on a valid
// handler (a wrong signature kills the process with SIGSEGV). And a stream of signals
// must never find the thread inside a critical section: the kernel moves it to the
// abort handler before it delivers one, if the section is in force. And a debugger that
// single-steps through it (each step aborts the section) gets through.
#include "platform/this_cpu.hpp"

#include <gtest/gtest.h>

#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/ptrace.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <ucontext.h>
#include <sys/rseq.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

namespace {

constexpr unsigned kShards = 16;
struct alignas(64) Shard {
    std::atomic<uint64_t> n{0};
};

uint64_t sum(const Shard *shards) {
    uint64_t n = 0;
    for (unsigned i = 0; i < kShards; ++i) n += shards[i].n.load(std::memory_order_relaxed);
    return n;
}

TEST(ThisCpu, TheRseqAreaIsThere) {
    // Without it the counter is a locked add, and the test below proves nothing new.
    ASSERT_NE(__rseq_size, 0u) << "glibc registered no rseq area (glibc.pthread.rseq=0?)";
    EXPECT_GE(ukp::platform::this_cpu(), 0);
}

TEST(ThisCpu, CountsExactlyWhileThreadsMigrate) {
    const long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    if (ncpu < 2) GTEST_SKIP() << "one CPU: no migration to race with";
    constexpr int kThreads = 8;
    constexpr uint64_t kCalls = 50'000'000;
    Shard shards[kShards];
    std::atomic<int> done{0};
    std::vector<std::thread> threads;
    threads.reserve(kThreads);
    for (int t = 0; t < kThreads; ++t)
        threads.emplace_back([&] {
            for (uint64_t i = 0; i < kCalls; ++i) ukp::platform::count_on_this_cpu<kShards, sizeof(Shard)>(shards);
            done.fetch_add(1);
        });
    // Moves the counting threads between CPUs while they run (none is joined yet: their
    // handles stay valid).
    unsigned k = 0;
    while (done.load() < kThreads) {
        for (auto &th : threads) {
            cpu_set_t set;
            CPU_ZERO(&set);
            CPU_SET(static_cast<int>(k++ % static_cast<unsigned>(ncpu)), &set);
            pthread_setaffinity_np(th.native_handle(), sizeof set, &set);
        }
        usleep(200);
    }
    for (auto &th : threads) th.join();
    EXPECT_EQ(sum(shards), kThreads * kCalls);
    // Every count went to a shard of a CPU that exists, or to the shared last one.
    for (unsigned i = static_cast<unsigned>(ncpu); i + 1 < kShards; ++i) EXPECT_EQ(shards[i].n.load(), 0u) << i;
}

// The critical sections' descriptors, as the linker gathers them (every inlined copy's).
struct RseqCs {
    uint32_t version, flags;
    uint64_t start_ip, post_commit_offset, abort_ip;
};
extern "C" const RseqCs __start___rseq_cs[], __stop___rseq_cs[];

std::atomic<long> g_signals{0}, g_inside{0};

void on_alarm(int, siginfo_t *, void *ctx) {
    const auto ip = static_cast<uint64_t>(static_cast<ucontext_t *>(ctx)->uc_mcontext.gregs[REG_RIP]);
    for (const RseqCs *cs = __start___rseq_cs; cs < __stop___rseq_cs; ++cs)
        if (ip >= cs->start_ip && ip < cs->start_ip + cs->post_commit_offset) g_inside.fetch_add(1);
    g_signals.fetch_add(1);
}

TEST(ThisCpu, ASignalNeverFindsTheThreadInsideTheSection) {
    ASSERT_LT(__start___rseq_cs, __stop___rseq_cs);
    Shard shards[kShards];
    struct sigaction sa {
    }, old{};
    sa.sa_sigaction = on_alarm;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    ASSERT_EQ(sigaction(SIGALRM, &sa, &old), 0);
    itimerval every{{0, 20}, {0, 20}}; // as often as the timer goes
    ASSERT_EQ(setitimer(ITIMER_REAL, &every, nullptr), 0);
    uint64_t calls = 0;
    while (g_signals.load(std::memory_order_relaxed) < 20000) {
        for (int i = 0; i < 1000; ++i) ukp::platform::count_on_this_cpu<kShards, sizeof(Shard)>(shards);
        calls += 1000;
    }
    itimerval off{};
    setitimer(ITIMER_REAL, &off, nullptr);
    sigaction(SIGALRM, &old, nullptr);
    EXPECT_EQ(g_inside.load(), 0) << "of " << g_signals.load() << " signals";
    EXPECT_EQ(sum(shards), calls);
}

// gdb's software watchpoints and `stepi` single-step the program: every step is a trap
// that aborts an rseq critical section. A child counts 100 times under PTRACE_SINGLESTEP
// and must end within a bounded number of steps, with every count made.
TEST(ThisCpu, SingleSteppedCountsEndAndAreExact) {
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
        Shard shards[kShards];
        ptrace(PTRACE_TRACEME, 0, nullptr, nullptr);
        raise(SIGSTOP);
        for (int i = 0; i < 100; ++i) ukp::platform::count_on_this_cpu<kShards, sizeof(Shard)>(shards);
        _exit(static_cast<int>(sum(shards)));
    }
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFSTOPPED(status));
    long steps = 0;
    for (; steps < 2'000'000; ++steps) {
        if (ptrace(PTRACE_SINGLESTEP, child, nullptr, nullptr) != 0) break;
        if (waitpid(child, &status, 0) != child || WIFEXITED(status) || WIFSIGNALED(status)) break;
    }
    if (!WIFEXITED(status)) {
        kill(child, SIGKILL);
        waitpid(child, &status, 0);
        FAIL() << "still counting after " << steps << " single steps";
    }
    EXPECT_EQ(WEXITSTATUS(status), 100);
}

} // namespace
