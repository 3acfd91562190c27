// Programs that block signals: a probe hit (SIGTRAP) or a fault-safe read (SIGSEGV) on a
// thread that blocks the signal would be turned by the kernel into the default action, the
// death of the process. The agent keeps its signals deliverable whatever mask the program
// sets, the masks of the calls that wait under one of their own included. Each case runs
// in a child (death test) so that a regression shows as a signal instead of killing the
// suite.
#include <ukprobes/kprobes.h>

#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <poll.h>
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace {

extern "C" __attribute__((noinline)) long sigmask_target(long x) {
    asm volatile("");
    return 5 * x + 1;
}

std::atomic<long> g_pre{0}, g_post{0};
int count_pre(kprobe *, pt_regs *) {
    ++g_pre;
    return 0;
}
// A post_handler keeps the probe on the breakpoint path (never jump-optimized).
void count_post(kprobe *, pt_regs *, unsigned long) { ++g_post; }

kprobe g_kp;
void register_target_probe() {
    g_kp = kprobe{};
    g_kp.addr = reinterpret_cast<kprobe_opcode_t *>(&sigmask_target);
    g_kp.pre_handler = count_pre;
    g_kp.post_handler = count_post;
    if (register_kprobe(&g_kp) != 0) _exit(2);
}

void *blocked_thread(void *) {
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, nullptr);
    return reinterpret_cast<void *>(sigmask_target(3));
}

// Exit codes: 0 correct; 10+ a wrong value.
void thread_with_every_signal_blocked() {
    register_target_probe();
    pthread_t t;
    void *result = nullptr;
    pthread_create(&t, nullptr, blocked_thread, nullptr);
    pthread_join(t, &result);
    if (reinterpret_cast<long>(result) != 16) _exit(10);
    if (g_pre != 1 || g_post != 1) _exit(11);
    _exit(0);
}

TEST(SignalMasks, AProbeHitOnAThreadThatBlocksEverySignal) {
    EXPECT_EXIT(thread_with_every_signal_blocked(), ::testing::ExitedWithCode(0), "");
}

void sigprocmask_blocks_sigtrap() {
    register_target_probe();
    sigset_t set, old;
    sigemptyset(&set);
    sigaddset(&set, SIGTRAP);
    sigaddset(&set, SIGSEGV);
    sigaddset(&set, SIGUSR1);
    if (sigprocmask(SIG_BLOCK, &set, nullptr) != 0) _exit(3);
    if (sigmask_target(1) != 6) _exit(10);
    if (g_pre != 1) _exit(11);
    // What the program blocked besides the agent's signals stays blocked.
    sigprocmask(SIG_BLOCK, nullptr, &old);
    if (!sigismember(&old, SIGUSR1)) _exit(12);
    if (sigismember(&old, SIGTRAP)) _exit(13);
    _exit(0);
}

TEST(SignalMasks, SigprocmaskBlockingSigtrap) {
    EXPECT_EXIT(sigprocmask_blocks_sigtrap(), ::testing::ExitedWithCode(0), "");
}

std::atomic<long> g_handler_result{0};
void usr1_full_mask(int) { g_handler_result = sigmask_target(7); }

void probe_hit_in_handler_with_full_mask() {
    register_target_probe();
    struct sigaction act {};
    act.sa_handler = usr1_full_mask;
    sigfillset(&act.sa_mask);
    if (sigaction(SIGUSR1, &act, nullptr) != 0) _exit(3);
    raise(SIGUSR1);
    if (g_handler_result != 36) _exit(10);
    if (g_pre != 1 || g_post != 1) _exit(11);
    _exit(0);
}

TEST(SignalMasks, AProbeHitInAHandlerWhoseMaskBlocksEverything) {
    EXPECT_EXIT(probe_hit_in_handler_with_full_mask(), ::testing::ExitedWithCode(0), "");
}

TEST(SignalMasks, PthreadSigmaskStillReportsErrors) {
    sigset_t set;
    sigemptyset(&set);
    EXPECT_EQ(pthread_sigmask(12345, &set, nullptr), EINVAL);
    errno = 0;
    EXPECT_EQ(sigprocmask(12345, &set, nullptr), -1);
    EXPECT_EQ(errno, EINVAL);
}

// The trap handler saves errno through libc's __errno_location before its recursion
// guard is up: a probe there would recurse without end.
TEST(SignalMasks, ErrnoLocationIsBlacklisted) {
    kprobe kp{};
    kp.symbol_name = "libc.so.6:__errno_location";
    kp.pre_handler = count_pre;
    EXPECT_EQ(register_kprobe(&kp), -EINVAL);
}

} // namespace

// The calls that wait under a mask of their own: the handler that ends the wait runs under
// it. Exit codes: 0 correct; 3 a call failed as it should not; 10+ a wrong value.
void usr1_probe_hit(int) { g_handler_result = sigmask_target(7); }

enum class Wait { kSigsuspend, kPpoll, kPselect, kEpollPwait, kEpollPwait2 };

void probe_hit_while_waiting(Wait how) {
    register_target_probe();
    struct sigaction act {};
    act.sa_handler = usr1_probe_hit;
    if (sigaction(SIGUSR1, &act, nullptr) != 0) _exit(3);
    sigset_t usr1, all_but_usr1;
    sigemptyset(&usr1);
    sigaddset(&usr1, SIGUSR1);
    sigfillset(&all_but_usr1);
    sigdelset(&all_but_usr1, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &usr1, nullptr);
    raise(SIGUSR1); // pending until the wait's mask lets it in
    const int ep = epoll_create1(EPOLL_CLOEXEC);
    epoll_event ev{};
    int r = 0;
    switch (how) {
    case Wait::kSigsuspend:
        r = sigsuspend(&all_but_usr1);
        break;
    case Wait::kPpoll:
        r = ppoll(nullptr, 0, nullptr, &all_but_usr1);
        break;
    case Wait::kPselect:
        r = pselect(0, nullptr, nullptr, nullptr, nullptr, &all_but_usr1);
        break;
    case Wait::kEpollPwait:
        r = epoll_pwait(ep, &ev, 1, -1, &all_but_usr1);
        break;
    case Wait::kEpollPwait2:
        r = epoll_pwait2(ep, &ev, 1, nullptr, &all_but_usr1);
        break;
    }
    if (r != -1 || errno != EINTR) _exit(3);
    if (g_handler_result != 36) _exit(10);
    if (g_pre != 1 || g_post != 1) _exit(11);
    _exit(0);
}

TEST(SignalMasks, AProbeHitInAHandlerRunDuringSigsuspend) {
    EXPECT_EXIT(probe_hit_while_waiting(Wait::kSigsuspend), ::testing::ExitedWithCode(0), "");
}
TEST(SignalMasks, AProbeHitInAHandlerRunDuringPpoll) {
    EXPECT_EXIT(probe_hit_while_waiting(Wait::kPpoll), ::testing::ExitedWithCode(0), "");
}
TEST(SignalMasks, AProbeHitInAHandlerRunDuringPselect) {
    EXPECT_EXIT(probe_hit_while_waiting(Wait::kPselect), ::testing::ExitedWithCode(0), "");
}
TEST(SignalMasks, AProbeHitInAHandlerRunDuringEpollPwait) {
    EXPECT_EXIT(probe_hit_while_waiting(Wait::kEpollPwait), ::testing::ExitedWithCode(0), "");
}
TEST(SignalMasks, AProbeHitInAHandlerRunDuringEpollPwait2) {
    EXPECT_EXIT(probe_hit_while_waiting(Wait::kEpollPwait2), ::testing::ExitedWithCode(0), "");
}

// The BSD calls, which glibc carries out with its internal sigprocmask (deprecated, and
// still there for the programs that call them).
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
void probe_hit_after_bsd_mask(bool setmask) {
    register_target_probe();
    if (setmask)
        sigsetmask(~0);
    else
        sigblock(~0);
    if (sigmask_target(1) != 6) _exit(10);
    if (g_pre != 1 || g_post != 1) _exit(11);
    sigset_t now;
    pthread_sigmask(SIG_BLOCK, nullptr, &now);
    if (!sigismember(&now, SIGUSR2)) _exit(12); // the rest is blocked as asked
    _exit(0);
}

TEST(SignalMasks, AProbeHitAfterSigsetmaskOfEverything) {
    EXPECT_EXIT(probe_hit_after_bsd_mask(true), ::testing::ExitedWithCode(0), "");
}
TEST(SignalMasks, AProbeHitAfterSigblockOfEverything) {
    EXPECT_EXIT(probe_hit_after_bsd_mask(false), ::testing::ExitedWithCode(0), "");
}

// The System V calls: glibc holds a signal with its internal sigprocmask.
void probe_hit_after_sysv_hold(bool with_sigset) {
    register_target_probe();
    for (int sig : {SIGTRAP, SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGUSR2}) {
        if (with_sigset) {
            if (sigset(sig, SIG_HOLD) == SIG_ERR) _exit(9);
        } else if (sighold(sig) != 0) {
            _exit(9);
        }
    }
    if (sigmask_target(1) != 6) _exit(10);
    if (g_pre != 1 || g_post != 1) _exit(11);
    sigset_t now;
    pthread_sigmask(SIG_BLOCK, nullptr, &now);
    if (!sigismember(&now, SIGUSR2)) _exit(12); // the rest is held as asked
    if (sigismember(&now, SIGTRAP)) _exit(13);
    _exit(0);
}

TEST(SignalMasks, AProbeHitAfterSigholdOfTheAgentsSignals) {
    EXPECT_EXIT(probe_hit_after_sysv_hold(false), ::testing::ExitedWithCode(0), "");
}
TEST(SignalMasks, AProbeHitAfterSigsetHoldOfTheAgentsSignals) {
    EXPECT_EXIT(probe_hit_after_sysv_hold(true), ::testing::ExitedWithCode(0), "");
}

// sigset(SIG_HOLD) of one of the agent's signals answers its disposition, as glibc's
// does for a signal that was not blocked.
TEST(SignalMasks, SigsetHoldOfAnAgentSignalAnswersItsDisposition) {
    struct sigaction old {};
    ASSERT_EQ(sigaction(SIGFPE, nullptr, &old), 0);
    EXPECT_EQ(sigset(SIGFPE, SIG_HOLD), old.sa_handler);
}

namespace {

// The optimizer's stop signal (the real-time signal of the agent's with a handler; the
// test installs none) is taken out of every mask the program sets too: blocked, it would
// wait for the program's signalfd or sigwaitinfo, which would take it for its own.
void stop_signal_never_blocked() {
    kprobe kp{};
    kp.addr = reinterpret_cast<kprobe_opcode_t *>(&sigmask_target);
    kp.pre_handler = count_pre; // no post_handler: it goes to the optimizer
    if (register_kprobe(&kp) != 0) _exit(2);
    ukp_optimizer_flush();
    int stop = 0;
    for (int sig = SIGRTMIN; sig <= SIGRTMAX && stop == 0; ++sig) {
        struct sigaction cur {};
        if (sigaction(sig, nullptr, &cur) == 0 && cur.sa_handler != SIG_DFL) stop = sig;
    }
    if (stop == 0) _exit(10);
    sigset_t all, now;
    sigfillset(&all);
    if (pthread_sigmask(SIG_BLOCK, &all, nullptr) != 0) _exit(11);
    if (syscall(SYS_rt_sigprocmask, SIG_BLOCK, nullptr, &now, _NSIG / 8) != 0) _exit(12);
    if (sigismember(&now, stop)) _exit(13);
    if (!sigismember(&now, SIGUSR1)) _exit(14);
    _exit(0);
}

} // namespace

TEST(SignalMasks, TheOptimizersStopSignalIsNeverBlocked) {
    EXPECT_EXIT(stop_signal_never_blocked(), ::testing::ExitedWithCode(0), "");
}
