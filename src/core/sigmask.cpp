// The signals the agent lives on are never blocked. A probe hit (SIGTRAP), or a fault of a
// handler, of an instruction run out of line or of a fault-safe read (SIGSEGV, SIGBUS,
// SIGFPE, SIGILL), on a thread that blocks the signal is turned by the kernel into the
// default action: the death of the process. So the agent takes them out of every mask the
// program sets: pthread_sigmask/sigprocmask (interposed here) and the sa_mask of every
// handler (signals.cpp).
#include "core/core.hpp"

#include <csignal>
#include <cerrno>
#include <sys/syscall.h>
#include <unistd.h>

namespace ukp::core {

void strip_agent_signals(sigset_t *set) {
    for (int sig : {SIGTRAP, SIGSEGV, SIGBUS, SIGFPE, SIGILL}) sigdelset(set, sig);
}

namespace {

// glibc's own signals for cancellation and set*id (__SIGRTMIN, __SIGRTMIN + 1): its
// pthread_sigmask never blocks them either.
constexpr int kGlibcCancel = 32, kGlibcSetxid = 33;

// rt_sigprocmask itself: these run before the agent's constructors too (a sanitizer
// runtime masks signals while it starts), when nothing could be resolved yet.
int set_mask(int how, const sigset_t *set, sigset_t *old) {
    sigset_t copy;
    if (set != nullptr && how != SIG_UNBLOCK) {
        copy = *set;
        strip_agent_signals(&copy);
        sigdelset(&copy, kGlibcCancel);
        sigdelset(&copy, kGlibcSetxid);
        set = &copy;
    }
    return static_cast<int>(syscall(SYS_rt_sigprocmask, how, set, old, _NSIG / 8));
}

} // namespace

} // namespace ukp::core

extern "C" {

__attribute__((visibility("default"))) int pthread_sigmask(int how, const sigset_t *set, sigset_t *old) {
    const int saved = errno;
    const int r = ukp::core::set_mask(how, set, old);
    const int err = r == 0 ? 0 : errno;
    errno = saved; // pthread_sigmask reports through its result, not errno
    return err;
}

__attribute__((visibility("default"))) int sigprocmask(int how, const sigset_t *set, sigset_t *old) {
    return ukp::core::set_mask(how, set, old);
}

} // extern "C"
