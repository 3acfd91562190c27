// The signals the agent lives on are never blocked. A probe hit (SIGTRAP), or a fault of a
// handler, of an instruction run out of line or of a fault-safe read (SIGSEGV, SIGBUS,
// SIGFPE, SIGILL), on a thread that blocks the signal is turned by the kernel into the
// default action: the death of the process. So the agent takes them out of every mask the
// program sets: pthread_sigmask/sigprocmask (interposed here) and the sa_mask of every
// handler (signals.cpp).
//
// Apart from that mask content, the interposed functions answer as glibc's: the same
// result, the same errno on failure, errno untouched on success.
#include "arch/x86_64/raw_syscall.hpp"
#include "core/core.hpp"

#include <csignal>
#include <cerrno>
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
    return static_cast<int>(arch::raw_syscall(SYS_rt_sigprocmask, how, reinterpret_cast<long>(set),
                                              reinterpret_cast<long>(old), _NSIG / 8));
}

} // namespace

} // namespace ukp::core

extern "C" {

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
