// A scope in which the calling thread blocks every asynchronous signal, the synchronous
// faults left open: a thread of the agent's created in it starts so, and never takes a
// signal meant for the program, while its fault-safe reads (SIGSEGV, SIGBUS) and a probe
// hit on it (SIGTRAP) still work.
#pragma once

#include <initializer_list>
#include <pthread.h>
#include <signal.h>

namespace ukp::platform {

class AsyncSignalsBlocked {
public:
    AsyncSignalsBlocked() {
        sigset_t all, sync;
        sigfillset(&all);
        sigemptyset(&sync);
        for (int sig : {SIGSEGV, SIGBUS, SIGTRAP, SIGILL, SIGFPE}) sigaddset(&sync, sig);
        pthread_sigmask(SIG_BLOCK, &all, &old_);
        pthread_sigmask(SIG_UNBLOCK, &sync, nullptr);
    }
    ~AsyncSignalsBlocked() { pthread_sigmask(SIG_SETMASK, &old_, nullptr); }
    AsyncSignalsBlocked(const AsyncSignalsBlocked &) = delete;
    AsyncSignalsBlocked &operator=(const AsyncSignalsBlocked &) = delete;

private:
    sigset_t old_;
};

} // namespace ukp::platform
