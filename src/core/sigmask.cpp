// The signals the agent lives on are never blocked. A probe hit (SIGTRAP), or a fault of a
// handler, of an instruction run out of line or of a fault-safe read (SIGSEGV, SIGBUS,
// SIGFPE, SIGILL), on a thread that blocks the signal is turned by the kernel into the
// default action: the death of the process. The optimizer's stop signal, blocked, would
// stay pending for the program's signalfd or sigwaitinfo to take. So the agent takes them out of every mask the
// program sets: pthread_sigmask/sigprocmask (interposed here), the masks a call installs
// while it waits (sigsuspend, pselect, ppoll, epoll_pwait, epoll_pwait2: the handlers that
// run meanwhile run under them; interposed here, calling glibc's with the mask copied), the
// BSD sigblock/sigsetmask and the System V sighold/sigset(SIG_HOLD) (here), and the
// sa_mask of every handler (signals.cpp).
//
// Apart from that mask content, the interposed functions answer as glibc's: the same
// result, the same errno on failure, errno untouched on success.
#include "platform/raw_syscall.hpp"
#include "core/core.hpp"

#include <atomic>
#include <csignal>
#include <cerrno>
#include <dlfcn.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/syscall.h>

namespace ukp::core {

namespace {

// glibc's sigdelset refuses 32 and 33 (EINVAL, errno set): the bit is cleared by hand.
void clear_signal(sigset_t *set, int sig) {
    constexpr int kBitsPerWord = 8 * sizeof set->__val[0];
    set->__val[(sig - 1) / kBitsPerWord] &= ~(1UL << ((sig - 1) % kBitsPerWord));
}

} // namespace

void strip_agent_signals(sigset_t *set) {
    for (int sig : {SIGTRAP, SIGSEGV, SIGBUS, SIGFPE, SIGILL}) clear_signal(set, sig);
    if (const int stop = opt_stop_signal(); stop > 0) clear_signal(set, stop);
}

namespace {

// glibc's own signals for cancellation and set*id (__SIGRTMIN, __SIGRTMIN + 1): its
// pthread_sigmask never blocks them either.
constexpr int kGlibcCancel = 32, kGlibcSetxid = 33;

// rt_sigprocmask itself, errno untouched: a negative errno on failure, as the kernel
// answers. These run before the agent's constructors too (a sanitizer runtime masks
// signals while it starts), when nothing could be resolved yet.
int set_mask(int how, const sigset_t *set, sigset_t *old) {
    sigset_t copy;
    if (set != nullptr && how != SIG_UNBLOCK) {
        copy = *set;
        strip_agent_signals(&copy);
        clear_signal(&copy, kGlibcCancel);
        clear_signal(&copy, kGlibcSetxid);
        set = &copy;
    }
    return static_cast<int>(platform::raw_syscall(SYS_rt_sigprocmask, how, reinterpret_cast<long>(set),
                                                  reinterpret_cast<long>(old), _NSIG / 8));
}

// The C library's own definition of name (the next one in lookup order after the
// agent's), resolved once. Also at load time (wait_functions_resolved): dlsym is not
// async-signal-safe, and these may be called first in a signal handler.
void *next_definition(std::atomic<void *> &cache, const char *name) {
    void *fn = cache.load(std::memory_order_acquire);
    if (fn == nullptr) {
        fn = dlsym(RTLD_NEXT, name);
        cache.store(fn, std::memory_order_release);
    }
    return fn;
}

std::atomic<void *> g_sigsuspend, g_pselect, g_ppoll, g_epoll_pwait, g_epoll_pwait2, g_sigblock, g_sigsetmask,
    g_sighold, g_sigset;

__attribute__((constructor)) void wait_functions_resolved() {
    next_definition(g_sigsuspend, "sigsuspend");
    next_definition(g_pselect, "pselect");
    next_definition(g_ppoll, "ppoll");
    next_definition(g_epoll_pwait, "epoll_pwait");
    next_definition(g_epoll_pwait2, "epoll_pwait2");
    next_definition(g_sigblock, "sigblock");
    next_definition(g_sigsetmask, "sigsetmask");
    next_definition(g_sighold, "sighold");
    next_definition(g_sigset, "sigset");
}

bool agent_signal(int sig) {
    return sig == SIGTRAP || sig == SIGSEGV || sig == SIGBUS || sig == SIGFPE || sig == SIGILL;
}

// What a waiting call is given: a copy of the program's mask without the agent's
// signals (read as set_mask reads one), or null where the program gave null.
class WaitMask {
public:
    explicit WaitMask(const sigset_t *set) : given_(set) {
        if (set != nullptr) {
            copy_ = *set;
            strip_agent_signals(&copy_);
            given_ = &copy_;
        }
    }
    const sigset_t *get() const { return given_; }

private:
    sigset_t copy_;
    const sigset_t *given_;
};

// The agent's signals as bits of a BSD mask (signals 1 to 31).
int bsd_agent_bits() {
    int bits = 0;
    for (int sig : {SIGTRAP, SIGSEGV, SIGBUS, SIGFPE, SIGILL}) bits |= 1 << (sig - 1);
    return bits;
}

// Where the C library has no such function (the call cannot have been linked against it).
[[noreturn]] void missing(const char *name) { die_naming("ukprobes: the C library has no ", name); }

template <typename Fn>
Fn next_or_die(std::atomic<void *> &cache, const char *name) {
    void *fn = next_definition(cache, name);
    if (fn == nullptr) missing(name);
    return reinterpret_cast<Fn>(fn);
}

} // namespace

} // namespace ukp::core

extern "C" {

__attribute__((visibility("default"))) int sigsuspend(const sigset_t *set) {
    using namespace ukp::core;
    const WaitMask mask(set);
    return next_or_die<int (*)(const sigset_t *)>(g_sigsuspend, "sigsuspend")(mask.get());
}

__attribute__((visibility("default"))) int pselect(int n, fd_set *r, fd_set *w, fd_set *e,
                                                   const struct timespec *timeout, const sigset_t *set) {
    using namespace ukp::core;
    const WaitMask mask(set);
    using Fn = int (*)(int, fd_set *, fd_set *, fd_set *, const struct timespec *, const sigset_t *);
    return next_or_die<Fn>(g_pselect, "pselect")(n, r, w, e, timeout, mask.get());
}

__attribute__((visibility("default"))) int ppoll(struct pollfd *fds, nfds_t n, const struct timespec *timeout,
                                                 const sigset_t *set) {
    using namespace ukp::core;
    const WaitMask mask(set);
    using Fn = int (*)(struct pollfd *, nfds_t, const struct timespec *, const sigset_t *);
    return next_or_die<Fn>(g_ppoll, "ppoll")(fds, n, timeout, mask.get());
}

__attribute__((visibility("default"))) int epoll_pwait(int epfd, struct epoll_event *events, int max, int timeout,
                                                       const sigset_t *set) {
    using namespace ukp::core;
    const WaitMask mask(set);
    using Fn = int (*)(int, struct epoll_event *, int, int, const sigset_t *);
    return next_or_die<Fn>(g_epoll_pwait, "epoll_pwait")(epfd, events, max, timeout, mask.get());
}

__attribute__((visibility("default"))) int epoll_pwait2(int epfd, struct epoll_event *events, int max,
                                                        const struct timespec *timeout, const sigset_t *set) {
    using namespace ukp::core;
    const WaitMask mask(set);
    using Fn = int (*)(int, struct epoll_event *, int, const struct timespec *, const sigset_t *);
    return next_or_die<Fn>(g_epoll_pwait2, "epoll_pwait2")(epfd, events, max, timeout, mask.get());
}

// The BSD calls (still in glibc, deprecated): a mask of signals 1-31 as an int. glibc's
// own go to its internal sigprocmask, past the interposed one.
__attribute__((visibility("default"))) int sigblock(int bits) {
    using namespace ukp::core;
    return next_or_die<int (*)(int)>(g_sigblock, "sigblock")(bits & ~bsd_agent_bits());
}

__attribute__((visibility("default"))) int sigsetmask(int bits) {
    using namespace ukp::core;
    return next_or_die<int (*)(int)>(g_sigsetmask, "sigsetmask")(bits & ~bsd_agent_bits());
}

// The System V calls (deprecated, still in glibc, which carries them out with its
// internal sigprocmask): holding one of the agent's signals holds nothing, as blocking it
// with sigprocmask blocks nothing.
__attribute__((visibility("default"))) int sighold(int sig) {
    using namespace ukp::core;
    if (agent_signal(sig)) return 0;
    return next_or_die<int (*)(int)>(g_sighold, "sighold")(sig);
}

// sigset(sig, SIG_HOLD) blocks sig and answers SIG_HOLD if it was blocked, else its
// disposition: one of the agent's signals is never blocked, so its disposition. Any other
// disposition goes to glibc's (which unblocks the signal and sets the handler).
__attribute__((visibility("default"))) sighandler_t sigset(int sig, sighandler_t disp) {
    using namespace ukp::core;
    if (agent_signal(sig) && disp == SIG_HOLD) {
        struct sigaction old {};
        if (sigaction(sig, nullptr, &old) != 0) return SIG_ERR;
        return old.sa_handler;
    }
    return next_or_die<sighandler_t (*)(int, sighandler_t)>(g_sigset, "sigset")(sig, disp);
}

// Like glibc's: the error number as the result, errno untouched.
__attribute__((visibility("default"))) int pthread_sigmask(int how, const sigset_t *set, sigset_t *old) {
    return -ukp::core::set_mask(how, set, old);
}

__attribute__((visibility("default"))) int sigprocmask(int how, const sigset_t *set, sigset_t *old) {
    const int r = ukp::core::set_mask(how, set, old);
    if (r == 0) return 0;
    errno = -r;
    return -1;
}

} // extern "C"
