// Grace periods: an unregistration returns only once every handler that began before it
// has returned, whether the hit came through a breakpoint or an optimized jump, and
// whether the thread marks its read sections in a slot of its own or, with the slots all
// taken, in the shared counters. Slots of threads that ended are given back.
#include <ukprobes/kprobes.h>

#include "core/core.hpp"
#include "opt_functions_decl.h"
#include "sanitizers.h"

#include <gtest/gtest.h>

#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#include <atomic>
#include <cstddef>
#include <iterator>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <pthread.h>
#include <thread>
#include <unistd.h>
#include <vector>

extern "C" __attribute__((noinline)) int ukg_work(int x) {
    asm volatile("" ::: "memory");
    return x + 3;
}

namespace {

using namespace std::chrono_literals;

std::atomic<bool> g_block{false}; // the next hit's handler waits for g_release
std::atomic<bool> g_inside{false};
std::atomic<bool> g_release{false};
std::atomic<bool> g_left{false};
std::atomic<long> g_hits{0};

int blocking_pre(kprobe *, pt_regs *) {
    g_hits.fetch_add(1, std::memory_order_relaxed);
    if (!g_block.exchange(false)) return 0;
    g_inside = true;
    while (!g_release) usleep(100);
    usleep(20000); // unregister_kprobe must not return while this runs
    g_left = true;
    return 0;
}

// The same without a call into the C library (usleep goes through the PLT, which the
// scan of a handler does not follow): a handler proven to leave the vector state alone,
// which the jump path's trampoline calls itself when it is a point's only one.
int proven_blocking_pre(kprobe *, pt_regs *) {
    g_hits.fetch_add(1, std::memory_order_relaxed);
    if (!g_block.exchange(false)) return 0;
    g_inside = true;
    while (!g_release) __builtin_ia32_pause();
    for (int i = 0; i < 1000; ++i) // unregister_kprobe must not return while this runs
        for (long spin = 0; spin < 20000; ++spin) asm volatile("pause" ::: "memory");
    g_left = true;
    return 0;
}

kprobe blocking_probe(const char *symbol) {
    kprobe kp{};
    kp.symbol_name = symbol;
    kp.pre_handler = blocking_pre;
    return kp;
}

// Makes membarrier fail with `err` in this process from now on (a seccomp filter, as a
// sandbox or a container's profile would).
bool refuse_membarrier(int err) {
    sock_filter code[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_membarrier, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | static_cast<uint32_t>(err)),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    sock_fprog prog{static_cast<unsigned short>(std::size(code)), code};
    return prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 && prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) == 0;
}

bool optimized(const kprobe &kp) { return (__atomic_load_n(&kp.flags, __ATOMIC_RELAXED) & KPROBE_FLAG_OPTIMIZED) != 0; }

// Registers kp (its symbol and handler set) and lets the optimizer put its jump in.
// Callers wrap it in ASSERT_NO_FATAL_FAILURE.
void register_on_jump_path(kprobe *kp) {
    ASSERT_EQ(register_kprobe(kp), 0);
    ukp_optimizer_flush();
    ASSERT_TRUE(optimized(*kp));
}

template <typename Pred>
bool wait_until(Pred pred, std::chrono::milliseconds limit = 10s) {
    const auto end = std::chrono::steady_clock::now() + limit;
    while (!pred()) {
        if (std::chrono::steady_clock::now() > end) return false;
        usleep(200);
    }
    return true;
}

// Starts `hit` on a thread whose handler blocks, then unregisters kp on another: the
// unregistration must wait for the handler. Returns once everything has joined.
void expect_unregister_waits_for_the_handler(kprobe *kp, void (*hit)(),
                                             void (*unregister)(kprobe *) = unregister_kprobe) {
    g_inside = false;
    g_release = false;
    g_left = false;
    g_block = true;
    std::thread hitter(hit);
    ASSERT_TRUE(wait_until([] { return g_inside.load(); })) << "the handler never ran";
    std::atomic<bool> returned{false};
    bool left_at_return = false;
    std::thread writer([&] {
        unregister(kp);
        left_at_return = g_left.load();
        returned = true;
    });
    std::this_thread::sleep_for(200ms);
    EXPECT_FALSE(returned.load()) << "unregister_kprobe returned while a pre_handler was running";
    g_release = true;
    writer.join();
    hitter.join();
    EXPECT_TRUE(left_at_return) << "unregister_kprobe returned before the pre_handler did";
}

class Grace : public ::testing::Test {
protected:
    void SetUp() override { g_hits = 0; }
    void TearDown() override { ukp_set_kprobes_optimization(1); }
};

TEST_F(Grace, UnregisterWaitsForAHandlerOnTheBreakpointPath) {
    ASSERT_EQ(ukp_set_kprobes_optimization(0), 0);
    kprobe kp = blocking_probe("ukg_work");
    ASSERT_EQ(register_kprobe(&kp), 0);
    expect_unregister_waits_for_the_handler(&kp, [] { EXPECT_EQ(ukg_work(1), 4); });
}

TEST_F(Grace, UnregisterWaitsForAHandlerOnTheJumpPath) {
    ASSERT_EQ(ukp_set_kprobes_optimization(1), 0);
    kprobe kp = blocking_probe("ukpt_opt_work");
    ASSERT_NO_FATAL_FAILURE(register_on_jump_path(&kp));
    expect_unregister_waits_for_the_handler(&kp, [] { EXPECT_EQ(ukpt_opt_work(4), (5 * 3) ^ 4); });
}

// The trampoline's own call of a proven handler, by a thread that has its reader slot
// already (its first hit claims it through the C dispatcher).
TEST_F(Grace, UnregisterWaitsForAProvenHandlerOnTheJumpPath) {
    ASSERT_EQ(ukp_set_kprobes_optimization(1), 0);
    kprobe kp{};
    kp.symbol_name = "ukpt_opt_work";
    kp.pre_handler = proven_blocking_pre;
    ASSERT_NO_FATAL_FAILURE(register_on_jump_path(&kp));
    bool proven;
    {
        std::lock_guard lock(ukp::core::registry_mutex());
        proven = ukp::core::handler_is_lean(reinterpret_cast<const void *>(&proven_blocking_pre));
    }
    // Under AddressSanitizer its checks call out of the handler: the dispatcher calls it.
    EXPECT_EQ(proven, !UKP_UNDER_ASAN);
    expect_unregister_waits_for_the_handler(&kp, [] {
        ukp::core::read_unlock(ukp::core::read_lock()); // claims the thread's slot
        EXPECT_EQ(ukpt_opt_work(3), (4 * 3) ^ 3);       // g_block is set: this one blocks
    });
    EXPECT_EQ(g_hits.load(), 1);
}

// A kretprobe's return handler, proven, called by the return trampoline itself: its
// read section holds unregister_kretprobe back too.
int proven_blocking_ret(kretprobe_instance *, pt_regs *regs) { return proven_blocking_pre(nullptr, regs); }

TEST_F(Grace, UnregisterWaitsForAProvenReturnHandler) {
    static kretprobe rp{};
    rp = kretprobe{};
    rp.kp.symbol_name = "ukg_work";
    rp.handler = proven_blocking_ret;
    ASSERT_EQ(register_kretprobe(&rp), 0);
    bool proven;
    {
        std::lock_guard lock(ukp::core::registry_mutex());
        proven = ukp::core::handler_is_lean(reinterpret_cast<const void *>(&proven_blocking_ret));
    }
    EXPECT_EQ(proven, !UKP_UNDER_ASAN);
    expect_unregister_waits_for_the_handler(
        &rp.kp,
        [] {
            ukp::core::read_unlock(ukp::core::read_lock()); // claims the thread's slot
            EXPECT_EQ(ukg_work(1), 4);
        },
        [](kprobe *kp) { unregister_kretprobe(reinterpret_cast<kretprobe *>(kp)); });
    EXPECT_EQ(g_hits.load(), 1);
}

// Threads that hit once and end: their slots stay taken until a writer (here the
// unregistration) finds their owners gone. The threads past the table's size still work,
// on the shared counters.
TEST_F(Grace, SlotsOfThreadsThatEndedAreGivenBack) {
    kprobe kp = blocking_probe("ukg_work");
    ASSERT_EQ(register_kprobe(&kp), 0);
    // The optimizer's pass on the new probe waits for a grace period, and that reclaims
    // too: it ran during the threads once (854 slots, not 1,000, in CI).
    ukp_optimizer_flush();
    const size_t before = ukp::core::reader_cells_in_use();
    constexpr int kThreads = 1500;
    for (int i = 0; i < kThreads; ++i) std::thread([] { ukg_work(2); }).join();
    EXPECT_EQ(g_hits.load(), kThreads);
    const size_t full = ukp::core::reader_cells_in_use();
    EXPECT_GE(full, before + 1000) << "each thread that hit took a slot";
    unregister_kprobe(&kp);
    EXPECT_LE(ukp::core::reader_cells_in_use(), before + 2)
        << "slots of ended threads, before: " << before << ", with them: " << full;
    // And new threads get slots again (a slot's marks work after it changed hands).
    kprobe again = blocking_probe("ukg_work");
    ASSERT_EQ(register_kprobe(&again), 0);
    expect_unregister_waits_for_the_handler(&again, [] { EXPECT_EQ(ukg_work(1), 4); });
}

// Every slot taken by a live thread: the next thread's sections go to the shared counters,
// and the unregistration waits for those too.
TEST_F(Grace, AThreadWithoutASlotIsWaitedForToo) {
    ASSERT_EQ(ukp_set_kprobes_optimization(0), 0);
    kprobe kp = blocking_probe("ukg_work");
    ASSERT_EQ(register_kprobe(&kp), 0);
    std::mutex mu;
    std::condition_variable cv;
    bool go_home = false;
    std::vector<pthread_t> holders;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 128 * 1024);
    struct Holder {
        std::mutex *mu;
        std::condition_variable *cv;
        bool *go_home;
    } h{&mu, &cv, &go_home};
    auto body = [](void *arg) -> void * {
        auto *h = static_cast<Holder *>(arg);
        ukg_work(3);
        std::unique_lock lock(*h->mu);
        h->cv->wait(lock, [h] { return *h->go_home; });
        return nullptr;
    };
    // Until the table is full (the count stops growing) and then some.
    for (size_t i = 0; i < ukp::core::kReaderCells + 76; ++i) {
        pthread_t t;
        ASSERT_EQ(pthread_create(&t, &attr, body, &h), 0);
        holders.push_back(t);
    }
    pthread_attr_destroy(&attr);
    ASSERT_TRUE(wait_until([] { return g_hits.load() >= static_cast<long>(ukp::core::kReaderCells) + 76; }, 60s));
    EXPECT_EQ(ukp::core::reader_cells_in_use(), ukp::core::kReaderCells) << "every slot held by a live thread";
    expect_unregister_waits_for_the_handler(&kp, [] { EXPECT_EQ(ukg_work(1), 4); });
    {
        std::lock_guard lock(mu);
        go_home = true;
    }
    cv.notify_all();
    for (pthread_t t : holders) pthread_join(t, nullptr);
}

// A program that sandboxes itself after the probes went in may refuse membarrier: the
// writer falls back to a TLB shootdown, and still waits for the handler.
TEST_F(Grace, AMembarrierRefusedLaterStillWaits) {
    ASSERT_EQ(ukp_set_kprobes_optimization(0), 0);
    kprobe kp = blocking_probe("ukg_work");
    ASSERT_EQ(register_kprobe(&kp), 0);
    const pid_t pid = fork();
    if (pid == 0) {
        alarm(30);
        if (!refuse_membarrier(EPERM)) _exit(2);
        if (syscall(SYS_membarrier, 0, 0, 0) != -1) _exit(3); // MEMBARRIER_CMD_QUERY
        g_inside = false;
        g_release = false;
        g_left = false;
        g_block = true;
        std::thread hitter([] { ukg_work(1); });
        if (!wait_until([] { return g_inside.load(); })) _exit(4);
        std::atomic<bool> returned{false};
        bool left_at_return = false;
        std::thread writer([&] {
            unregister_kprobe(&kp);
            left_at_return = g_left.load();
            returned = true;
        });
        std::this_thread::sleep_for(200ms);
        const bool early = returned.load();
        g_release = true;
        writer.join();
        hitter.join();
        _exit(early ? 5 : !left_at_return ? 6 : 0);
    }
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    unregister_kprobe(&kp);
    EXPECT_TRUE(WIFEXITED(status)) << "the child died of signal " << WTERMSIG(status);
    EXPECT_EQ(WEXITSTATUS(status), 0) << "2: no filter, 3: membarrier allowed, 4: no hit, 5: returned early, "
                                         "6: returned before the handler";
}

// Where membarrier is refused from the start (an old kernel, a container's seccomp
// profile), every thread uses the shared counters: no slot is taken, and an unregistration
// still waits for a handler in flight. Run in a new image of this test (the agent's state
// is made at the first registration), under a filter that refuses membarrier.
TEST_F(Grace, WithoutMembarrierTheSharedCountersServe) {
    if (getenv("UKP_GRACE_NO_MEMBARRIER") != nullptr) {
        ASSERT_EQ(syscall(SYS_membarrier, 0, 0, 0), -1) << "the filter lets membarrier through";
        ASSERT_EQ(ukp_set_kprobes_optimization(0), 0);
        kprobe kp = blocking_probe("ukg_work");
        ASSERT_EQ(register_kprobe(&kp), 0);
        for (int i = 0; i < 10; ++i) std::thread([] { ukg_work(2); }).join();
        EXPECT_EQ(ukp::core::reader_cells_in_use(), 0u);
        expect_unregister_waits_for_the_handler(&kp, [] { EXPECT_EQ(ukg_work(1), 4); });
        ASSERT_EQ(ukp_set_kprobes_optimization(1), 0);
        kprobe jump = blocking_probe("ukpt_opt_work");
        ASSERT_NO_FATAL_FAILURE(register_on_jump_path(&jump));
        expect_unregister_waits_for_the_handler(&jump, [] { EXPECT_EQ(ukpt_opt_work(4), (5 * 3) ^ 4); });
        // A proven handler, which the trampoline would call itself for a thread with a slot
        // of its own: this thread has the shared counters' stand-in, so the dispatcher does.
        kprobe proven{};
        proven.symbol_name = "ukpt_opt_work";
        proven.pre_handler = proven_blocking_pre;
        ASSERT_NO_FATAL_FAILURE(register_on_jump_path(&proven));
        expect_unregister_waits_for_the_handler(&proven, [] {
            ukp::core::read_unlock(ukp::core::read_lock()); // the stand-in, not a slot
            EXPECT_EQ(ukpt_opt_work(3), (4 * 3) ^ 3);
        });
        EXPECT_EQ(ukp::core::reader_cells_in_use(), 0u);
        return;
    }
    const pid_t pid = fork();
    if (pid == 0) {
        alarm(60);
        if (!refuse_membarrier(ENOSYS)) _exit(2);
        setenv("UKP_GRACE_NO_MEMBARRIER", "1", 1);
        execl("/proc/self/exe", "grace_test", "--gtest_filter=Grace.WithoutMembarrierTheSharedCountersServe",
              static_cast<char *>(nullptr));
        _exit(3);
    }
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status)) << "the test's new image died of signal " << WTERMSIG(status);
    EXPECT_EQ(WEXITSTATUS(status), 0) << "its output above; 2: no filter, 3: no exec";
}

} // namespace
