// Signals: the agent's handlers for SIGTRAP and the fault signals, chaining to the
// program's own handlers, and interposition of sigaction()/signal() so that a program
// installing a handler later records it with us instead of displacing ours. Each
// interposed function answers as glibc 2.36's (result, errno, the action read back); the
// one difference is the agent's signals left out of the sa_mask given to the kernel.
#include "core/core.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <dlfcn.h>
#include <mutex>
#include <sys/syscall.h>
#include <unistd.h>

namespace ukp::core {

thread_local int t_in_agent_handler __attribute__((tls_model("initial-exec")));

namespace {

// The signals the agent needs: int3 traps, and the faults of handlers and out-of-line copies.
constexpr int kManaged[] = {SIGTRAP, SIGSEGV, SIGBUS, SIGFPE, SIGILL};

bool managed(int sig) {
    for (int s : kManaged)
        if (s == sig) return true;
    return false;
}

using SigactionFn = int (*)(int, const struct sigaction *, struct sigaction *);
SigactionFn g_real_sigaction = nullptr;

// What the program believes is installed for a managed signal. Written under a
// seqlock by sigaction() callers (with signals blocked), read by our handlers.
struct ProgramAction {
    std::atomic<unsigned> seq{0};
    struct sigaction act {};
};
ProgramAction g_program[NSIG];
std::atomic<bool> g_installed{false};
std::mutex g_install_mutex;

// Flags of struct sigaction the kernel knows (UAPI_SA_FLAGS, x86-64): since Linux 5.11 it
// clears every other bit of the action it stores.
constexpr unsigned long kSaUnsupported = 0x400, kSaExposeTagbits = 0x800, kSaRestorer = 0x04000000;
constexpr unsigned long kKernelSaFlags = SA_NOCLDSTOP | SA_NOCLDWAIT | SA_SIGINFO | SA_ONSTACK | SA_RESTART |
                                         SA_NODEFER | SA_RESETHAND | kSaExposeTagbits | kSaRestorer;
// Set by the kernel itself for the ABI of the caller: never kept from the program's flags.
constexpr unsigned long kSaAbiFlags = 0x02000000 | 0x01000000;
// Whether this kernel keeps unknown flag bits (older than 5.11), and glibc's sa_restorer:
// both learnt from the agent's own action once installed.
std::atomic<bool> g_kernel_keeps_unknown_flags{false};
std::atomic<void (*)()> g_restorer{nullptr};
// The signals siginterrupt() asked to interrupt system calls (glibc's _sigintr, which its
// signal() reads and the agent's cannot).
std::atomic<uint64_t> g_interrupting{0};

// What glibc and the kernel make of `act` for a managed signal: the action the program
// reads back from sigaction() afterwards.
void as_kernel_stores(const struct sigaction &act, struct sigaction *stored) {
    *stored = act;
    // glibc's sigaction adds its own restorer.
    unsigned long flags = static_cast<unsigned int>(act.sa_flags) | kSaRestorer;
    flags &= g_kernel_keeps_unknown_flags.load(std::memory_order_relaxed) ? ~kSaAbiFlags : kKernelSaFlags;
    stored->sa_flags = static_cast<int>(flags);
    stored->sa_restorer = g_restorer.load(std::memory_order_relaxed);
    // The kernel keeps 64 signals and never SIGKILL or SIGSTOP.
    for (size_t i = 1; i < sizeof stored->sa_mask.__val / sizeof stored->sa_mask.__val[0]; ++i)
        stored->sa_mask.__val[i] = 0;
    sigdelset(&stored->sa_mask, SIGKILL);
    sigdelset(&stored->sa_mask, SIGSTOP);
}

void resolve_real_sigaction() {
    if (g_real_sigaction != nullptr) return;
    // RTLD_NEXT finds the next interposer (a sanitizer runtime) or libc; it finds nothing
    // when the agent was loaded after libc (a dependency of a preloaded module).
    void *fn = dlsym(RTLD_NEXT, "sigaction");
    if (fn == nullptr) {
        if (void *libc = dlopen("libc.so.6", RTLD_LAZY | RTLD_NOLOAD); libc != nullptr) {
            fn = dlsym(libc, "sigaction");
            dlclose(libc);
        }
    }
    g_real_sigaction = reinterpret_cast<SigactionFn>(fn);
}

// The library constructor resolves the real sigaction before the program can call ours
// from a signal handler (dlsym is not async-signal-safe).
__attribute__((constructor(101))) void init_signals() { resolve_real_sigaction(); }

void read_program_action(int sig, struct sigaction *out) {
    ProgramAction &pa = g_program[sig];
    for (;;) {
        const unsigned s1 = pa.seq.load(std::memory_order_acquire);
        if (s1 & 1) continue;
        std::memcpy(out, &pa.act, sizeof *out);
        std::atomic_thread_fence(std::memory_order_acquire);
        if (pa.seq.load(std::memory_order_relaxed) == s1) return;
    }
}

void write_program_action(int sig, const struct sigaction *act) {
    ProgramAction &pa = g_program[sig];
    pa.seq.fetch_add(1, std::memory_order_acq_rel);
    std::memcpy(&pa.act, act, sizeof *act);
    pa.seq.fetch_add(1, std::memory_order_release);
}

// In a section of its own, so that the optimizer can tell a thread on its way out of it
// (after t_in_agent_handler went back to 0) from one anywhere else.
__attribute__((section("ukp_trap_text"), noinline)) void agent_handler(int sig, siginfo_t *info, void *ctx) {
    const int saved_errno = errno; // the interrupted code's errno survives us
    auto *uc = static_cast<ucontext_t *>(ctx);
    ++t_in_agent_handler;
    // This invocation's choice of where to resume, kept past its end (until sigreturn);
    // a nested one that chose nothing leaves the outer one's.
    const unsigned outer_decision = t_decision_epoch;
    t_decision_epoch = kNoDecision;
    if (sig == SIGTRAP)
        on_breakpoint(info, uc);
    else if (sig == SIGILL && on_traced_trap(info, uc))
        ; // a point armed under a tracer
    else if (!on_fault(sig, info, uc))
        deliver_to_program(sig, info, uc, /*replayable=*/true);
    if (t_decision_epoch == kNoDecision) t_decision_epoch = outer_decision;
    --t_in_agent_handler;
    errno = saved_errno;
}

// Raised by the CPU (si_code > 0, SI_KERNEL for int3) rather than sent: the kernel
// forces these through even when ignored or blocked.
bool synchronous_fault(const siginfo_t *info) { return info->si_code > 0; }

// Ends the process with `sig` and its default action (core dump for all managed signals).
[[noreturn]] void die_by(int sig) {
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    g_real_sigaction(sig, &dfl, nullptr);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, sig);
    pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
    syscall(SYS_tgkill, getpid(), static_cast<pid_t>(syscall(SYS_gettid)), sig);
    // A default action of "core" cannot be blocked or ignored once unblocked.
    for (;;) pause();
}

} // namespace

int install_signal_handlers() {
    std::lock_guard lock(g_install_mutex);
    resolve_real_sigaction();
    if (g_real_sigaction == nullptr) return -ENOSYS;
    // Every handler still the agent's (each registration asks): nothing to write, so no
    // signal needs blocking meanwhile.
    const auto ours = [](int sig) {
        struct sigaction current {};
        g_real_sigaction(sig, nullptr, &current);
        return (current.sa_flags & SA_SIGINFO) && current.sa_sigaction == agent_handler;
    };
    if (g_installed.load(std::memory_order_acquire) && std::all_of(std::begin(kManaged), std::end(kManaged), ours))
        return 0;
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    int result = 0;
    for (int sig : kManaged) {
        struct sigaction current {};
        g_real_sigaction(sig, nullptr, &current);
        if ((current.sa_flags & SA_SIGINFO) && current.sa_sigaction == agent_handler) continue;
        // Not ours (yet, or any more: the program may have reached libc's sigaction
        // directly when the agent could not interpose it): what is there is the program's.
        write_program_action(sig, &current);
        struct sigaction ours {};
        ours.sa_sigaction = agent_handler;
        sigemptyset(&ours.sa_mask);
        // NODEFER: a probe hit or a fault inside a handler must nest, not kill the
        // process as a blocked synchronous signal would. ONSTACK: run on the program's
        // alternate stack if it has one (stack overflow handlers rely on it).
        // SA_UNSUPPORTED: read back below, it tells whether the kernel clears unknown bits.
        ours.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK | SA_RESTART | static_cast<int>(kSaUnsupported);
        if (g_real_sigaction(sig, &ours, nullptr) != 0) {
            result = -errno;
            break;
        }
    }
    if (result == 0) {
        struct sigaction check {};
        g_real_sigaction(kManaged[0], nullptr, &check);
        g_kernel_keeps_unknown_flags.store((check.sa_flags & kSaUnsupported) != 0, std::memory_order_relaxed);
        g_restorer.store(check.sa_restorer, std::memory_order_relaxed);
        g_installed.store(true, std::memory_order_release);
    }
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    return result;
}

void deliver_to_program(int sig, siginfo_t *info, ucontext_t *uc, bool replayable) {
    struct sigaction act;
    read_program_action(sig, &act);
    if (act.sa_handler == SIG_IGN && !synchronous_fault(info)) return;
    if (act.sa_handler == SIG_DFL || act.sa_handler == SIG_IGN) {
        if (replayable && sig != SIGTRAP && synchronous_fault(info)) {
            // The faulting instruction is the program's own: let it fault again under
            // the default action, so the core dump shows exactly where it was.
            struct sigaction dfl {};
            dfl.sa_handler = SIG_DFL;
            g_real_sigaction(sig, &dfl, nullptr);
            return;
        }
        die_by(sig);
    }

    if (act.sa_flags & SA_RESETHAND) {
        // As the kernel does: the handler only goes back to SIG_DFL, flags and mask stay.
        struct sigaction reset = act;
        reset.sa_handler = SIG_DFL;
        write_program_action(sig, &reset);
    }
    // Run the program's handler with the mask it asked for, as the kernel would have.
    sigset_t mask = uc->uc_sigmask, during;
    sigorset(&mask, &mask, &act.sa_mask);
    // Probes may be hit in the handler: the agent's signals stay deliverable, except the
    // handler's own signal, blocked as the kernel would block it (a fault inside a fault
    // handler still ends the process). SIGTRAP never: every probe hit needs it.
    strip_agent_signals(&mask);
    if (!(act.sa_flags & SA_NODEFER) && sig != SIGTRAP) sigaddset(&mask, sig);
    pthread_sigmask(SIG_SETMASK, &mask, &during);
    if (act.sa_flags & SA_SIGINFO)
        act.sa_sigaction(sig, info, uc);
    else
        act.sa_handler(sig);
    pthread_sigmask(SIG_SETMASK, &during, nullptr);
}

// sigaction() as the program sees it: for the managed signals, once the agent's
// handlers are in place, it reads and writes the program's own record.
int program_sigaction(int sig, const struct sigaction *act, struct sigaction *old) {
    resolve_real_sigaction();
    if (g_real_sigaction == nullptr) {
        errno = ENOSYS;
        return -1;
    }
    if (sig <= 0 || sig >= NSIG || !managed(sig) || !g_installed.load(std::memory_order_acquire)) {
        // No handler may block the agent's signals while it runs (a probe hit inside it).
        struct sigaction stripped;
        if (act != nullptr) {
            stripped = *act;
            strip_agent_signals(&stripped.sa_mask);
            act = &stripped;
        }
        return g_real_sigaction(sig, act, old);
    }
    // The program's mask is kept whole (it reads it back); deliver_to_program strips it.
    struct sigaction stored;
    if (act != nullptr) as_kernel_stores(*act, &stored);
    sigset_t all, saved;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &saved);
    struct sigaction prev;
    read_program_action(sig, &prev);
    if (act != nullptr) write_program_action(sig, &stored);
    pthread_sigmask(SIG_SETMASK, &saved, nullptr);
    if (old != nullptr) *old = prev;
    return 0;
}

namespace {

// glibc's own signals (cancellation, set*id): its sigaction and signal() refuse them.
bool internal_signal(int sig) { return sig == 32 || sig == 33; }

// A handler installed with signal() restarts system calls unless siginterrupt() said not.
int bsd_signal_flags(int sig) {
    return (g_interrupting.load(std::memory_order_relaxed) >> (sig - 1)) & 1 ? 0 : SA_RESTART;
}

} // namespace

} // namespace ukp::core

// ---- interposed libc entry points ----------------------------------------------------

extern "C" {

__attribute__((visibility("default"))) int sigaction(int sig, const struct sigaction *act, struct sigaction *old) {
    return ukp::core::program_sigaction(sig, act, old);
}

__attribute__((visibility("default"))) int __sigaction(int sig, const struct sigaction *act, struct sigaction *old) {
    return ukp::core::program_sigaction(sig, act, old);
}

// signal() with glibc's (BSD) semantics: SA_RESTART, handler stays installed.
__attribute__((visibility("default"))) sighandler_t signal(int sig, sighandler_t handler) {
    if (handler == SIG_ERR || sig < 1 || sig >= NSIG || ukp::core::internal_signal(sig)) {
        errno = EINVAL;
        return SIG_ERR;
    }
    struct sigaction act {
    }, old{};
    act.sa_handler = handler;
    sigemptyset(&act.sa_mask);
    sigaddset(&act.sa_mask, sig);
    act.sa_flags = ukp::core::bsd_signal_flags(sig);
    if (ukp::core::program_sigaction(sig, &act, &old) != 0) return SIG_ERR;
    return old.sa_handler;
}

__attribute__((visibility("default"))) sighandler_t bsd_signal(int sig, sighandler_t handler) {
    return signal(sig, handler);
}

// System V semantics: one-shot, no restart, not blocked during the handler.
__attribute__((visibility("default"))) sighandler_t sysv_signal(int sig, sighandler_t handler) {
    if (handler == SIG_ERR || sig < 1 || sig >= NSIG) {
        errno = EINVAL;
        return SIG_ERR;
    }
    struct sigaction act {
    }, old{};
    act.sa_handler = handler;
    sigemptyset(&act.sa_mask);
    // SA_INTERRUPT: glibc sets it; kernels older than 5.11 keep it in the action.
    act.sa_flags = SA_RESETHAND | SA_NODEFER | SA_INTERRUPT;
    if (ukp::core::program_sigaction(sig, &act, &old) != 0) return SIG_ERR;
    return old.sa_handler;
}

__attribute__((visibility("default"))) sighandler_t __sysv_signal(int sig, sighandler_t handler) {
    return sysv_signal(sig, handler);
}

// glibc's reads and rewrites the action with its internal sigaction, bypassing the agent's
// record, and keeps the choice where only its own signal() sees it.
__attribute__((visibility("default"))) int siginterrupt(int sig, int interrupt) {
    struct sigaction act;
    if (ukp::core::program_sigaction(sig, nullptr, &act) != 0) return -1;
    const uint64_t bit = uint64_t{1} << (sig - 1);
    if (interrupt) {
        ukp::core::g_interrupting.fetch_or(bit, std::memory_order_relaxed);
        act.sa_flags &= ~SA_RESTART;
    } else {
        ukp::core::g_interrupting.fetch_and(~bit, std::memory_order_relaxed);
        act.sa_flags |= SA_RESTART;
    }
    return ukp::core::program_sigaction(sig, &act, nullptr) != 0 ? -1 : 0;
}

} // extern "C"
