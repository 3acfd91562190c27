// Hardware breakpoints (<ukprobes/hw_breakpoint.h>): data and execute breakpoints on one
// thread or all, the kernel's errors, modification, removal, fork, handlers that touch
// what they watch, beside kprobes and the program's own perf signals.
#include <ukprobes/hw_breakpoint.h>

#include <gtest/gtest.h>

#include <atomic>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

extern "C" {
volatile long ukhw_counter;
volatile long ukhw_other;
alignas(8) volatile unsigned char ukhw_bytes[16];

__attribute__((noinline)) long ukhw_function(long x) {
    asm volatile("" ::: "memory");
    return x * 3;
}
__attribute__((noinline)) void ukhw_bump(void) { ukhw_counter = ukhw_counter + 1; }
}

namespace {

struct Seen {
    std::atomic<int> hits{0};
    std::atomic<unsigned long> last_addr{0};
    std::atomic<long> last_value{0};
    std::atomic<unsigned long> last_ip{0};
    std::atomic<pid_t> last_tid{0};
};

void count(struct perf_event *bp, struct perf_sample_data *data, struct pt_regs *regs) {
    auto *seen = static_cast<Seen *>(bp->overflow_handler_context);
    seen->hits.fetch_add(1);
    seen->last_addr.store(data->addr);
    seen->last_value.store(ukhw_counter);
    seen->last_ip.store(regs->ip);
    seen->last_tid.store(static_cast<pid_t>(syscall(SYS_gettid)));
}

perf_event_attr watch(const volatile void *addr, unsigned len, unsigned type) {
    perf_event_attr attr;
    hw_breakpoint_init(&attr);
    attr.bp_addr = reinterpret_cast<unsigned long>(addr);
    attr.bp_len = len;
    attr.bp_type = type;
    return attr;
}

template <typename Body>
int in_child(Body body) {
    const pid_t pid = fork();
    if (pid == 0) _exit(body());
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// Whether this machine gives a thread a hardware breakpoint that is hit: a guest may have
// no debug registers (the kernel has no breakpoint PMU then), or a PMU with none behind it
// (a write is never counted; errno is ENODEV then).
bool have_debug_registers() {
    perf_event_attr attr = watch(&ukhw_other, HW_BREAKPOINT_LEN_8, HW_BREAKPOINT_W);
    attr.exclude_kernel = 1;
    const long fd = syscall(SYS_perf_event_open, &attr, 0, -1, -1, PERF_FLAG_FD_CLOEXEC);
    if (fd < 0) return false;
    ukhw_other = ukhw_other + 1;
    uint64_t writes = 0;
    const bool counted = read(static_cast<int>(fd), &writes, sizeof writes) == sizeof writes;
    close(static_cast<int>(fd));
    if (counted && writes == 0) errno = ENODEV;
    return !counted || writes > 0;
}

class HwBreakpoint : public ::testing::Test {
protected:
    void SetUp() override {
        if (!have_debug_registers()) GTEST_SKIP() << "no hardware breakpoints on this machine: " << strerror(errno);
    }
};

// Where the kernel gives breakpoints that are never hit, a registration says so rather
// than watch in silence.
TEST(HwBreakpointMachine, BreakpointsThatNeverFireAreENODEV) {
    if (have_debug_registers() || errno != ENODEV)
        GTEST_SKIP() << "this machine's breakpoints are hit, or there are none";
    perf_event_attr attr = watch(&ukhw_counter, HW_BREAKPOINT_LEN_8, HW_BREAKPOINT_W);
    Seen seen;
    perf_event *bp = register_user_hw_breakpoint(&attr, count, &seen, 0);
    ASSERT_TRUE(IS_ERR(bp));
    EXPECT_EQ(PTR_ERR(bp), -ENODEV);
    perf_event **wide = register_wide_hw_breakpoint(&attr, count, &seen);
    ASSERT_TRUE(IS_ERR(wide));
    EXPECT_EQ(PTR_ERR(wide), -ENODEV);
}

TEST_F(HwBreakpoint, WriteWatchSeesEveryWriteAfterIt) {
    Seen seen;
    perf_event_attr attr = watch(&ukhw_counter, HW_BREAKPOINT_LEN_8, HW_BREAKPOINT_W);
    perf_event *bp = register_user_hw_breakpoint(&attr, count, &seen, 0);
    ASSERT_FALSE(IS_ERR(bp)) << PTR_ERR(bp);
    ukhw_counter = 0;
    for (int i = 0; i < 100; ++i) ukhw_bump();
    (void)ukhw_other; // a read, and a neighbour's write, are not hits
    ukhw_other = 5;
    EXPECT_EQ(seen.hits.load(), 101);
    EXPECT_EQ(seen.last_addr.load(), reinterpret_cast<unsigned long>(&ukhw_counter));
    EXPECT_EQ(seen.last_value.load(), 100); // the value after the write
    // The handler ran after the writing instruction: ip is past it, inside ukhw_bump.
    const auto bump = reinterpret_cast<unsigned long>(&ukhw_bump);
    EXPECT_GT(seen.last_ip.load(), bump);
    EXPECT_LT(seen.last_ip.load(), bump + 64);
    EXPECT_EQ(bp->nmissed, 0u);
    unregister_hw_breakpoint(bp);
    ukhw_counter = 7;
    EXPECT_EQ(seen.hits.load(), 101);
}

TEST_F(HwBreakpoint, ReadWriteWatchSeesReads) {
    Seen seen;
    perf_event_attr attr = watch(&ukhw_counter, HW_BREAKPOINT_LEN_8, HW_BREAKPOINT_RW);
    perf_event *bp = register_user_hw_breakpoint(&attr, count, &seen, 0);
    ASSERT_FALSE(IS_ERR(bp)) << PTR_ERR(bp);
    long sum = 0;
    for (int i = 0; i < 10; ++i) sum += ukhw_counter;
    EXPECT_EQ(seen.hits.load(), 10);
    unregister_hw_breakpoint(bp);
    (void)sum;
}

TEST_F(HwBreakpoint, ExecuteBreakpointRunsBeforeTheInstructionAndTheProgramGoesOn) {
    Seen seen;
    perf_event_attr attr;
    hw_breakpoint_init(&attr);
    attr.bp_addr = reinterpret_cast<unsigned long>(&ukhw_function);
    attr.bp_len = sizeof(long);
    attr.bp_type = HW_BREAKPOINT_X;
    perf_event *bp = register_user_hw_breakpoint(&attr, count, &seen, 0);
    ASSERT_FALSE(IS_ERR(bp)) << PTR_ERR(bp);
    long sum = 0;
    for (long i = 0; i < 20; ++i) sum += ukhw_function(i);
    EXPECT_EQ(sum, 3 * 190);
    EXPECT_EQ(seen.hits.load(), 20);
    EXPECT_EQ(seen.last_ip.load(), reinterpret_cast<unsigned long>(&ukhw_function));
    unregister_hw_breakpoint(bp);
}

TEST_F(HwBreakpoint, TheKernelsErrorsForBadAttributes) {
    Seen seen;
    struct Case {
        const volatile void *addr;
        unsigned len, type;
    } cases[] = {
        {&ukhw_bytes[0], 3, HW_BREAKPOINT_W},                   // no such length
        {&ukhw_bytes[1], HW_BREAKPOINT_LEN_4, HW_BREAKPOINT_W}, // not aligned to its length
        {&ukhw_bytes[2], HW_BREAKPOINT_LEN_8, HW_BREAKPOINT_RW},
        {&ukhw_bytes[0], HW_BREAKPOINT_LEN_4, 0},                       // nothing to watch
        {&ukhw_bytes[0], HW_BREAKPOINT_LEN_4, HW_BREAKPOINT_R},         // x86: no read-only watch
        {&ukhw_bytes[0], HW_BREAKPOINT_LEN_4, HW_BREAKPOINT_INVALID},   // both kinds
        {reinterpret_cast<void *>(&ukhw_function), 1, HW_BREAKPOINT_X}, // execute: sizeof(long)
    };
    for (const Case &c : cases) {
        perf_event_attr attr = watch(c.addr, c.len, c.type);
        perf_event *bp = register_user_hw_breakpoint(&attr, count, &seen, 0);
        EXPECT_EQ(PTR_ERR(bp), -EINVAL) << c.len << " " << c.type;
        if (!IS_ERR(bp)) unregister_hw_breakpoint(bp);
    }
    perf_event_attr attr = watch(&ukhw_counter, HW_BREAKPOINT_LEN_8, HW_BREAKPOINT_W);
    EXPECT_EQ(PTR_ERR(register_user_hw_breakpoint(&attr, nullptr, &seen, 0)), -EINVAL);
    EXPECT_EQ(PTR_ERR(register_user_hw_breakpoint(&attr, count, &seen, 1)), -ESRCH); // not our thread
    attr.type = PERF_TYPE_HARDWARE;
    EXPECT_EQ(PTR_ERR(register_user_hw_breakpoint(&attr, count, &seen, 0)), -EINVAL);
    EXPECT_EQ(seen.hits.load(), 0);
}

TEST_F(HwBreakpoint, AFifthBreakpointOnAThreadIsENOSPC) {
    Seen seen;
    ASSERT_EQ(hw_breakpoint_slots(TYPE_DATA), 4);
    std::vector<perf_event *> bps;
    for (int i = 0; i < 4; ++i) {
        perf_event_attr attr = watch(&ukhw_bytes[i], HW_BREAKPOINT_LEN_1, HW_BREAKPOINT_W);
        bps.push_back(register_user_hw_breakpoint(&attr, count, &seen, 0));
        ASSERT_FALSE(IS_ERR(bps.back())) << PTR_ERR(bps.back());
    }
    perf_event_attr attr = watch(&ukhw_bytes[4], HW_BREAKPOINT_LEN_1, HW_BREAKPOINT_W);
    perf_event *fifth = register_user_hw_breakpoint(&attr, count, &seen, 0);
    EXPECT_EQ(PTR_ERR(fifth), -ENOSPC);
    // A wide one needs this thread too: refused whole.
    perf_event **wide = register_wide_hw_breakpoint(&attr, count, &seen);
    EXPECT_EQ(PTR_ERR(wide), -ENOSPC);
    for (int i = 0; i < 5; ++i) ukhw_bytes[i] = 1;
    EXPECT_EQ(seen.hits.load(), 4);
    unregister_hw_breakpoint(bps[0]);
    fifth = register_user_hw_breakpoint(&attr, count, &seen, 0);
    EXPECT_FALSE(IS_ERR(fifth));
    ukhw_bytes[4] = 2;
    EXPECT_EQ(seen.hits.load(), 5);
    unregister_hw_breakpoint(fifth);
    for (int i = 1; i < 4; ++i) unregister_hw_breakpoint(bps[i]);
}

TEST_F(HwBreakpoint, OneThreadsBreakpointIsThatThreadsOnly) {
    Seen seen;
    std::atomic<pid_t> tid{0};
    std::atomic<bool> go{false}, done{false};
    std::thread other([&] {
        tid = static_cast<pid_t>(syscall(SYS_gettid));
        while (!go) std::this_thread::yield();
        for (int i = 0; i < 10; ++i) ukhw_bump();
        done = true;
    });
    while (tid == 0) std::this_thread::yield();
    perf_event_attr attr = watch(&ukhw_counter, HW_BREAKPOINT_LEN_8, HW_BREAKPOINT_W);
    perf_event *bp = register_user_hw_breakpoint(&attr, count, &seen, tid);
    ASSERT_FALSE(IS_ERR(bp)) << PTR_ERR(bp);
    EXPECT_EQ(bp->tid, tid.load());
    ukhw_bump(); // this thread: not watched
    go = true;
    other.join();
    EXPECT_EQ(seen.hits.load(), 10);
    EXPECT_EQ(seen.last_tid.load(), tid.load());
    unregister_hw_breakpoint(bp);
}

TEST_F(HwBreakpoint, AWideBreakpointCoversThreadsBeforeAndAfter) {
    Seen seen;
    std::atomic<bool> go{false};
    std::thread before([&] {
        while (!go) std::this_thread::yield();
        for (int i = 0; i < 10; ++i) ukhw_bump();
    });
    perf_event_attr attr = watch(&ukhw_counter, HW_BREAKPOINT_LEN_8, HW_BREAKPOINT_W);
    perf_event **wide = register_wide_hw_breakpoint(&attr, count, &seen);
    ASSERT_FALSE(IS_ERR(wide)) << PTR_ERR(wide);
    EXPECT_EQ((*wide)->tid, 0);
    go = true;
    before.join();
    std::thread after([] {
        for (int i = 0; i < 10; ++i) ukhw_bump();
        std::thread grandchild([] {
            for (int i = 0; i < 10; ++i) ukhw_bump();
        });
        grandchild.join();
    });
    after.join();
    for (int i = 0; i < 10; ++i) ukhw_bump();
    EXPECT_EQ(seen.hits.load(), 40);
    unregister_wide_hw_breakpoint(wide);
    std::thread later([] { ukhw_bump(); });
    later.join();
    EXPECT_EQ(seen.hits.load(), 40);
}

TEST_F(HwBreakpoint, ModifyMovesDisarmsAndRearms) {
    Seen seen;
    perf_event_attr attr = watch(&ukhw_counter, HW_BREAKPOINT_LEN_8, HW_BREAKPOINT_W);
    perf_event **wide = register_wide_hw_breakpoint(&attr, count, &seen);
    ASSERT_FALSE(IS_ERR(wide)) << PTR_ERR(wide);
    perf_event *bp = *wide;
    ukhw_counter = 1;
    EXPECT_EQ(seen.hits.load(), 1);

    attr.bp_addr = reinterpret_cast<unsigned long>(&ukhw_other);
    ASSERT_EQ(modify_user_hw_breakpoint(bp, &attr), 0);
    EXPECT_EQ(bp->attr.bp_addr, reinterpret_cast<unsigned long>(&ukhw_other));
    ukhw_counter = 2;
    EXPECT_EQ(seen.hits.load(), 1);
    std::thread([] { ukhw_other = 3; }).join(); // the thread's copy moved too
    ukhw_other = 4;
    EXPECT_EQ(seen.hits.load(), 3);

    attr.disabled = 1;
    ASSERT_EQ(modify_user_hw_breakpoint(bp, &attr), 0);
    ukhw_other = 5;
    EXPECT_EQ(seen.hits.load(), 3);
    attr.disabled = 0;
    ASSERT_EQ(modify_user_hw_breakpoint(bp, &attr), 0);
    ukhw_other = 6;
    EXPECT_EQ(seen.hits.load(), 4);

    // A bad modification changes nothing.
    perf_event_attr bad = attr;
    bad.bp_addr += 1;
    EXPECT_EQ(modify_user_hw_breakpoint(bp, &bad), -EINVAL);
    EXPECT_EQ(bp->attr.bp_addr, reinterpret_cast<unsigned long>(&ukhw_other));
    ukhw_other = 7;
    EXPECT_EQ(seen.hits.load(), 5);
    unregister_wide_hw_breakpoint(wide);
}

// A handler that writes what it watches, and a write in a kprobe handler: neither calls it
// again; they count as missed.
void write_again(struct perf_event *bp, struct perf_sample_data *, struct pt_regs *) {
    static_cast<Seen *>(bp->overflow_handler_context)->hits.fetch_add(1);
    ukhw_counter = ukhw_counter + 1000;
}
int bump_in_kprobe(kprobe *, pt_regs *) {
    ukhw_counter = ukhw_counter + 1;
    return 0;
}

TEST_F(HwBreakpoint, AHitInsideAHandlerIsMissedNotNested) {
    Seen seen;
    perf_event_attr attr = watch(&ukhw_counter, HW_BREAKPOINT_LEN_8, HW_BREAKPOINT_W);
    perf_event *bp = register_user_hw_breakpoint(&attr, write_again, &seen, 0);
    ASSERT_FALSE(IS_ERR(bp)) << PTR_ERR(bp);
    ukhw_counter = 0;
    EXPECT_EQ(seen.hits.load(), 1);
    EXPECT_EQ(ukhw_counter, 1000);
    EXPECT_EQ(bp->nmissed, 1u);

    kprobe kp{};
    kp.symbol_name = "ukhw_function";
    kp.pre_handler = bump_in_kprobe;
    ASSERT_EQ(register_kprobe(&kp), 0);
    EXPECT_EQ(ukhw_function(2), 6);
    EXPECT_EQ(seen.hits.load(), 1);
    EXPECT_EQ(bp->nmissed, 2u);
    unregister_kprobe(&kp);
    unregister_hw_breakpoint(bp);
}

// The probes and a watch on the same code: a kprobe on the function whose store is watched.
TEST_F(HwBreakpoint, BesideAKprobeOnTheWritingFunction) {
    Seen seen;
    static std::atomic<int> probe_hits{0};
    kprobe kp{};
    kp.symbol_name = "ukhw_bump";
    kp.pre_handler = [](kprobe *, pt_regs *) {
        ++probe_hits;
        return 0;
    };
    ASSERT_EQ(register_kprobe(&kp), 0);
    perf_event_attr attr = watch(&ukhw_counter, HW_BREAKPOINT_LEN_8, HW_BREAKPOINT_W);
    perf_event *bp = register_user_hw_breakpoint(&attr, count, &seen, 0);
    ASSERT_FALSE(IS_ERR(bp)) << PTR_ERR(bp);
    ukhw_counter = 0;
    for (int i = 0; i < 50; ++i) ukhw_bump(); // the probe's int3, or its jump already
    ukp_optimizer_flush();                    // its jump, if the function takes one
    for (int i = 0; i < 50; ++i) ukhw_bump();
    EXPECT_EQ(ukhw_counter, 100);
    EXPECT_EQ(probe_hits.load(), 100);
    EXPECT_EQ(seen.hits.load(), 101);
    char *list = ukp_kprobes_list();
    EXPECT_NE(std::string(list).find("ukhw_bump+0x0"), std::string::npos);
    free(list);
    unregister_hw_breakpoint(bp);
    unregister_kprobe(&kp);
}

// exec removes every breakpoint (remove_on_exec): a program exec'd from a child of a
// watching process runs as it would anyway, here a shell that exits 7.
TEST_F(HwBreakpoint, AProgramExecdAfterForkHasNone) {
    Seen seen;
    perf_event_attr attr = watch(&ukhw_counter, HW_BREAKPOINT_LEN_8, HW_BREAKPOINT_W);
    perf_event **wide = register_wide_hw_breakpoint(&attr, count, &seen);
    ASSERT_FALSE(IS_ERR(wide)) << PTR_ERR(wide);
    EXPECT_EQ(in_child([] {
                  ukhw_bump(); // the child's own breakpoint, before the exec
                  execl("/bin/sh", "sh", "-c", "exit 7", static_cast<char *>(nullptr));
                  return 99;
              }),
              7);
    unregister_wide_hw_breakpoint(wide);
}

std::atomic<int> g_handler_writes{0};
TEST_F(HwBreakpoint, WritesInASignalHandlerAreHits) {
    Seen seen;
    perf_event_attr attr = watch(&ukhw_counter, HW_BREAKPOINT_LEN_8, HW_BREAKPOINT_W);
    perf_event *bp = register_user_hw_breakpoint(&attr, count, &seen, 0);
    ASSERT_FALSE(IS_ERR(bp)) << PTR_ERR(bp);
    struct sigaction sa {
    }, old{};
    sa.sa_handler = [](int) {
        ukhw_bump();
        ++g_handler_writes;
    };
    sigaction(SIGUSR1, &sa, &old);
    for (int i = 0; i < 5; ++i) raise(SIGUSR1);
    sigaction(SIGUSR1, &old, nullptr);
    EXPECT_EQ(g_handler_writes.load(), 5);
    EXPECT_EQ(seen.hits.load(), 5);
    unregister_hw_breakpoint(bp);
}

TEST_F(HwBreakpoint, AChildOfForkKeepsTheWideBreakpointsAndNotTheThreadsOnes) {
    Seen wide_seen, own_seen;
    perf_event_attr wattr = watch(&ukhw_counter, HW_BREAKPOINT_LEN_8, HW_BREAKPOINT_W);
    perf_event **wide = register_wide_hw_breakpoint(&wattr, count, &wide_seen);
    ASSERT_FALSE(IS_ERR(wide)) << PTR_ERR(wide);
    perf_event_attr oattr = watch(&ukhw_other, HW_BREAKPOINT_LEN_8, HW_BREAKPOINT_W);
    perf_event *own = register_user_hw_breakpoint(&oattr, count, &own_seen, 0);
    ASSERT_FALSE(IS_ERR(own)) << PTR_ERR(own);
    const int status = in_child([&] {
        const int before = wide_seen.hits.load();
        for (int i = 0; i < 10; ++i) ukhw_bump();
        std::thread([] { ukhw_bump(); }).join(); // the child's threads too
        ukhw_other = 1;                          // the forking thread's own: not in the child
        if (wide_seen.hits.load() - before != 11) return 1;
        if (own_seen.hits.load() != 0) return 2;
        unregister_wide_hw_breakpoint(wide);
        unregister_hw_breakpoint(own);
        ukhw_bump();
        return wide_seen.hits.load() - before == 11 ? 0 : 3;
    });
    EXPECT_EQ(status, 0);
    // The parent's are untouched by the child's removal.
    const int before = wide_seen.hits.load();
    ukhw_bump();
    ukhw_other = 2;
    EXPECT_EQ(wide_seen.hits.load(), before + 1);
    EXPECT_EQ(own_seen.hits.load(), 1);
    // UKP_FORK_REMOVE: the child has none.
    ASSERT_EQ(ukp_set_fork_policy(UKP_FORK_REMOVE), 0);
    EXPECT_EQ(in_child([&] {
                  const int b = wide_seen.hits.load();
                  ukhw_bump();
                  return wide_seen.hits.load() == b ? 0 : 1;
              }),
              0);
    ASSERT_EQ(ukp_set_fork_policy(UKP_FORK_KEEP), 0);
    unregister_wide_hw_breakpoint(wide);
    unregister_hw_breakpoint(own);
}

// The program's own perf events that signal: their SIGTRAPs are the program's.
std::atomic<int> g_program_traps{0};
TEST_F(HwBreakpoint, TheProgramsOwnPerfSignalsReachIt) {
    struct sigaction sa {
    }, old{};
    sa.sa_flags = SA_SIGINFO;
    sa.sa_sigaction = [](int, siginfo_t *info, void *) {
        if (info->si_code == 6) ++g_program_traps;
    };
    sigaction(SIGTRAP, &sa, &old);
    perf_event_attr attr = watch(&ukhw_counter, HW_BREAKPOINT_LEN_8, HW_BREAKPOINT_W);
    attr.sigtrap = 1;
    attr.remove_on_exec = 1;
    attr.exclude_kernel = 1;
    attr.sig_data = 42;
    const long fd = syscall(SYS_perf_event_open, &attr, 0, -1, -1, PERF_FLAG_FD_CLOEXEC);
    ASSERT_GE(fd, 0) << strerror(errno);
    for (int i = 0; i < 3; ++i) ukhw_bump();
    close(static_cast<int>(fd));
    sigaction(SIGTRAP, &old, nullptr);
    EXPECT_EQ(g_program_traps.load(), 3);
}

TEST_F(HwBreakpoint, KallsymsLookupNameFindsDataAndFunctions) {
    EXPECT_EQ(kallsyms_lookup_name("ukhw_counter"), reinterpret_cast<unsigned long>(&ukhw_counter));
    EXPECT_EQ(kallsyms_lookup_name("ukhw_function"), reinterpret_cast<unsigned long>(&ukhw_function));
    EXPECT_NE(kallsyms_lookup_name("libc.so.6:malloc"), 0u);
    EXPECT_EQ(kallsyms_lookup_name("no_such_symbol_anywhere"), 0u);
    EXPECT_EQ(kallsyms_lookup_name(nullptr), 0u);
}

} // namespace
