// Calls every libc function the agent interposes, in valid and invalid ways, and prints
// one line per case: the call, its result and errno afterwards. interpose_test runs it
// with and without the agent and compares the outputs line for line, so nothing that
// varies between runs (addresses, the agent's own signals in a mask) is printed.
// With the argument `managed`, the sa_mask read back for SIGSEGV is printed whole: exact
// only once the agent's handlers are installed (a probe registered).
#define _GNU_SOURCE
// siginterrupt() is deprecated, and still one of the calls to compare.
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#include <dlfcn.h>
#include <errno.h>
#include <execinfo.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <ucontext.h>
#include <sys/wait.h>
#include <unistd.h>
#include <unwind.h>

// Exported by glibc, declared by no header (or only under feature macros).
extern int __sigaction(int, const struct sigaction *, struct sigaction *);
extern __sighandler_t bsd_signal(int, __sighandler_t);
extern __sighandler_t __sysv_signal(int, __sighandler_t);
extern void __longjmp_chk(struct __jmp_buf_tag *, int) __attribute__((noreturn));

// The kernel's flag (linux/signal.h), absent from glibc's headers.
#ifndef SS_AUTODISARM
#define SS_AUTODISARM (1U << 31)
#endif
#ifndef SA_RESTORER
#define SA_RESTORER 0x04000000
#endif

static int g_sentinel; // errno before every call of the current pass
static int g_managed_exact;

static void report(const char *call, long ret) {
    const int err = errno;
    printf("%s [errno=%d before]: ret=%ld errno=%d\n", call, g_sentinel, ret, err);
}

#define CASE(call)                                                                                                     \
    do {                                                                                                               \
        errno = g_sentinel;                                                                                            \
        const long ret_ = (long)(call);                                                                                \
        report(#call, ret_);                                                                                           \
    } while (0)

static void h1(int sig) { (void)sig; }
static void h2(int sig) { (void)sig; }
static void h3(int sig, siginfo_t *info, void *ctx) { (void)sig, (void)info, (void)ctx; }

static const char *handler_name(__sighandler_t h) {
    if (h == SIG_DFL) return "SIG_DFL";
    if (h == SIG_IGN) return "SIG_IGN";
    if (h == SIG_ERR) return "SIG_ERR";
    if (h == h1) return "h1";
    if (h == h2) return "h2";
    return "other";
}

#define CASE_HANDLER(call)                                                                                             \
    do {                                                                                                               \
        errno = g_sentinel;                                                                                            \
        const __sighandler_t h_ = (call);                                                                              \
        const int err_ = errno;                                                                                        \
        printf("%s [errno=%d before]: ret=%s errno=%d\n", #call, g_sentinel, handler_name(h_), err_);                  \
    } while (0)

// The agent never blocks these, and strips them from every sa_mask it installs.
static int agent_signal(int sig) {
    return sig == SIGTRAP || sig == SIGSEGV || sig == SIGBUS || sig == SIGFPE || sig == SIGILL;
}

static void print_mask(const char *what, const sigset_t *set, int with_agent_signals) {
    printf("  %s:", what);
    for (int sig = 1; sig <= 64; ++sig)
        if ((with_agent_signals || !agent_signal(sig)) && sigismember(set, sig) == 1) printf(" %d", sig);
    printf("\n");
}

static void print_action(const char *what, const struct sigaction *sa, int with_agent_signals) {
    const char *handler = sa->sa_sigaction == h3 ? "h3" : handler_name(sa->sa_handler);
    printf("  %s: handler=%s flags=%#x restorer=%s\n", what, handler, (unsigned)sa->sa_flags,
           sa->sa_restorer != NULL ? "set" : "null");
    print_mask("sa_mask", &sa->sa_mask, with_agent_signals);
}

static void print_thread_mask(const char *what) {
    sigset_t now;
    sigemptyset(&now);
    pthread_sigmask(SIG_BLOCK, NULL, &now);
    print_mask(what, &now, 0);
}

static void reset_state(void) {
    sigset_t none;
    sigemptyset(&none);
    pthread_sigmask(SIG_SETMASK, &none, NULL);
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    for (int sig = 1; sig < NSIG; ++sig)
        if (sig != SIGKILL && sig != SIGSTOP && sig != 32 && sig != 33) sigaction(sig, &dfl, NULL);
    siginterrupt(SIGUSR1, 0);
    siginterrupt(SIGUSR2, 0);
    stack_t off = {.ss_flags = SS_DISABLE};
    sigaltstack(&off, NULL);
}

static void mask_cases(void) {
    sigset_t usr1, usr2, full, old;
    sigemptyset(&usr1);
    sigaddset(&usr1, SIGUSR1);
    sigemptyset(&usr2);
    sigaddset(&usr2, SIGUSR2);
    sigfillset(&full); // holds glibc's own 32 and 33 too

    CASE(sigprocmask(SIG_SETMASK, &usr1, NULL));
    print_thread_mask("mask");
    CASE(sigprocmask(SIG_BLOCK, &usr2, &old));
    print_mask("old", &old, 0);
    CASE(sigprocmask(SIG_UNBLOCK, &usr1, NULL));
    print_thread_mask("mask");
    CASE(sigprocmask(SIG_SETMASK, NULL, &old));
    print_mask("old", &old, 0);
    CASE(sigprocmask(SIG_BLOCK, NULL, NULL));
    CASE(sigprocmask(99, &usr1, NULL));
    CASE(sigprocmask(99, &usr1, &old));
    CASE(sigprocmask(-1, &usr1, NULL));
    CASE(sigprocmask(99, NULL, &old));
    CASE(sigprocmask(SIG_BLOCK, &full, NULL));
    print_thread_mask("mask");
    CASE(sigprocmask(SIG_UNBLOCK, &full, NULL));
    print_thread_mask("mask");
    CASE(sigprocmask(SIG_SETMASK, &full, &old));
    print_thread_mask("mask");
    CASE(sigprocmask(SIG_SETMASK, &usr2, NULL));

    CASE(pthread_sigmask(SIG_SETMASK, &usr1, NULL));
    print_thread_mask("mask");
    CASE(pthread_sigmask(SIG_BLOCK, &usr2, &old));
    print_mask("old", &old, 0);
    CASE(pthread_sigmask(SIG_UNBLOCK, &usr1, NULL));
    CASE(pthread_sigmask(SIG_SETMASK, NULL, &old));
    print_mask("old", &old, 0);
    CASE(pthread_sigmask(99, &usr1, NULL));
    CASE(pthread_sigmask(-1, &usr1, &old));
    CASE(pthread_sigmask(99, NULL, &old));
    CASE(pthread_sigmask(SIG_BLOCK, &full, NULL));
    print_thread_mask("mask");
    CASE(pthread_sigmask(SIG_SETMASK, &full, NULL));
    print_thread_mask("mask");
    CASE(pthread_sigmask(SIG_UNBLOCK, &full, NULL));
    print_thread_mask("mask");
}

static void sigaction_cases(void) {
    struct sigaction act, old;
    memset(&act, 0, sizeof act);
    act.sa_handler = h1;
    sigemptyset(&act.sa_mask);

    CASE(sigaction(0, &act, NULL));
    CASE(sigaction(-1, &act, NULL));
    CASE(sigaction(32, &act, NULL));
    CASE(sigaction(33, &act, NULL));
    CASE(sigaction(32, NULL, &old));
    CASE(sigaction(33, NULL, NULL));
    CASE(sigaction(65, &act, NULL));
    CASE(sigaction(65, NULL, &old));
    CASE(sigaction(SIGKILL, &act, NULL));
    CASE(sigaction(SIGSTOP, &act, NULL));
    CASE(sigaction(SIGKILL, NULL, &old));
    print_action("old", &old, 0);
    CASE(sigaction(SIGUSR1, NULL, NULL));
    CASE(__sigaction(0, &act, NULL));
    CASE(__sigaction(33, &act, NULL));
    CASE(__sigaction(SIGKILL, &act, NULL));

    // A mask with signals the kernel drops (SIGKILL, SIGSTOP), and flags it adds to or
    // clears from what it stores (SA_RESTORER; 0x400 is SA_UNSUPPORTED, always cleared).
    struct sigaction rich;
    memset(&rich, 0, sizeof rich);
    rich.sa_handler = h1;
    sigemptyset(&rich.sa_mask);
    sigaddset(&rich.sa_mask, SIGUSR2);
    sigaddset(&rich.sa_mask, SIGINT);
    sigaddset(&rich.sa_mask, SIGKILL);
    sigaddset(&rich.sa_mask, SIGSTOP);
    sigaddset(&rich.sa_mask, 40);
    sigaddset(&rich.sa_mask, 64);
    rich.sa_flags = SA_RESTART | SA_NODEFER | 0x400;

    for (int i = 0; i < 2; ++i) {
        const int sig = i == 0 ? SIGUSR1 : SIGSEGV; // not the agent's; the agent's
        const int exact = sig == SIGSEGV && g_managed_exact;
        printf("signal %d\n", sig);
        CASE(sigaction(sig, NULL, &old));
        print_action("old", &old, exact);
        struct sigaction with_agent = rich;
        sigaddset(&with_agent.sa_mask, SIGTRAP);
        sigaddset(&with_agent.sa_mask, SIGBUS);
        CASE(sigaction(sig, &with_agent, &old));
        print_action("old", &old, exact);
        CASE(sigaction(sig, NULL, &old));
        print_action("old", &old, exact);
        struct sigaction info = rich;
        info.sa_sigaction = h3;
        info.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESETHAND | SA_RESTORER;
        CASE(__sigaction(sig, &info, &old));
        print_action("old", &old, exact);
        CASE(sigaction(sig, NULL, &old));
        print_action("old", &old, exact);
        // Delivered once: the handler goes back to SIG_DFL, flags and mask stay.
        CASE(raise(sig));
        CASE(sigaction(sig, NULL, &old));
        print_action("old", &old, exact);
        CASE(sigaction(sig, &act, &old));
        print_action("old", &old, exact);
        CASE_HANDLER(signal(sig, SIG_DFL));
        CASE(sigaction(sig, NULL, &old));
        print_action("old", &old, exact);
        CASE_HANDLER(sysv_signal(sig, h2));
        CASE(sigaction(sig, NULL, &old));
        print_action("old", &old, exact);
        CASE(siginterrupt(sig, 1));
        CASE(sigaction(sig, NULL, &old));
        print_action("old", &old, exact);
        CASE_HANDLER(signal(sig, h1));
        CASE(sigaction(sig, NULL, &old));
        print_action("old", &old, exact);
        CASE(siginterrupt(sig, 0));
        CASE_HANDLER(bsd_signal(sig, h2));
        CASE(sigaction(sig, NULL, &old));
        print_action("old", &old, exact);
        CASE_HANDLER(signal(sig, SIG_DFL));
    }
}

static void signal_cases(void) {
    CASE_HANDLER(signal(SIGUSR1, h1));
    CASE_HANDLER(signal(SIGUSR1, h2));
    CASE_HANDLER(signal(SIGUSR1, SIG_IGN));
    CASE_HANDLER(signal(SIGUSR1, SIG_ERR));
    CASE_HANDLER(signal(SIGUSR1, SIG_DFL));
    CASE_HANDLER(signal(0, h1));
    CASE_HANDLER(signal(-1, h1));
    CASE_HANDLER(signal(32, h1));
    CASE_HANDLER(signal(33, SIG_DFL));
    CASE_HANDLER(signal(65, h1));
    CASE_HANDLER(signal(SIGKILL, h1));
    CASE_HANDLER(signal(SIGSTOP, SIG_DFL));
    CASE_HANDLER(bsd_signal(SIGUSR2, h1));
    CASE_HANDLER(bsd_signal(SIGUSR2, h2));
    CASE_HANDLER(bsd_signal(SIGUSR2, SIG_ERR));
    CASE_HANDLER(bsd_signal(33, h1));
    CASE_HANDLER(bsd_signal(SIGUSR2, SIG_DFL));
    CASE_HANDLER(sysv_signal(SIGUSR1, h1));
    CASE_HANDLER(sysv_signal(SIGUSR1, h2));
    CASE_HANDLER(sysv_signal(SIGUSR1, SIG_ERR));
    CASE_HANDLER(sysv_signal(0, h1));
    CASE_HANDLER(sysv_signal(32, h1));
    CASE_HANDLER(sysv_signal(65, h1));
    CASE_HANDLER(sysv_signal(SIGKILL, h1));
    CASE_HANDLER(__sysv_signal(SIGUSR1, h1));
    CASE_HANDLER(__sysv_signal(33, h1));
    CASE_HANDLER(__sysv_signal(SIGUSR1, SIG_DFL));
    CASE(siginterrupt(0, 1));
    CASE(siginterrupt(33, 1));
    CASE(siginterrupt(SIGKILL, 1));
    CASE(siginterrupt(SIGUSR2, 1));
    CASE(siginterrupt(SIGUSR2, 0));
}

static char g_alt[1 << 16];
static volatile long g_nested_ret, g_nested_errno;

static void on_alt_stack(int sig) {
    (void)sig;
    stack_t other = {.ss_sp = g_alt, .ss_size = sizeof g_alt};
    errno = g_sentinel;
    g_nested_ret = sigaltstack(&other, NULL);
    g_nested_errno = errno;
}

static void altstack_cases(void) {
    stack_t ss, old;
    memset(&old, 0, sizeof old);
    CASE(sigaltstack(NULL, &old));
    printf("  old: flags=%d\n", old.ss_flags);
    CASE(sigaltstack(NULL, NULL));
    ss = (stack_t){.ss_sp = g_alt, .ss_size = 100};
    CASE(sigaltstack(&ss, NULL));
    ss = (stack_t){.ss_sp = g_alt, .ss_size = 0};
    CASE(sigaltstack(&ss, NULL));
    ss = (stack_t){.ss_sp = g_alt, .ss_size = sizeof g_alt, .ss_flags = 12345};
    CASE(sigaltstack(&ss, NULL));
    ss = (stack_t){.ss_sp = g_alt, .ss_size = sizeof g_alt, .ss_flags = SS_ONSTACK | SS_DISABLE};
    CASE(sigaltstack(&ss, NULL));
    ss = (stack_t){.ss_sp = g_alt, .ss_size = sizeof g_alt, .ss_flags = SS_ONSTACK};
    CASE(sigaltstack(&ss, &old));
    printf("  old: flags=%d\n", old.ss_flags);
    ss = (stack_t){.ss_sp = g_alt, .ss_size = sizeof g_alt};
    CASE(sigaltstack(&ss, &old));
    printf("  old: flags=%d size=%zu\n", old.ss_flags, old.ss_size);
    ss = (stack_t){.ss_sp = g_alt, .ss_size = sizeof g_alt, .ss_flags = (int)SS_AUTODISARM};
    CASE(sigaltstack(&ss, &old));
    printf("  old: flags=%d size=%zu\n", old.ss_flags, old.ss_size);
    // Changing the alternate stack while running on it: EPERM.
    ss = (stack_t){.ss_sp = g_alt, .ss_size = sizeof g_alt};
    sigaltstack(&ss, NULL);
    struct sigaction onstack;
    memset(&onstack, 0, sizeof onstack);
    onstack.sa_handler = on_alt_stack;
    onstack.sa_flags = SA_ONSTACK;
    sigemptyset(&onstack.sa_mask);
    sigaction(SIGUSR2, &onstack, NULL);
    raise(SIGUSR2);
    printf("sigaltstack(&other, NULL) on the alternate stack [errno=%d before]: ret=%ld errno=%ld\n", g_sentinel,
           g_nested_ret, g_nested_errno);
    signal(SIGUSR2, SIG_DFL);
    ss = (stack_t){.ss_flags = SS_DISABLE};
    CASE(sigaltstack(&ss, &old));
    printf("  old: flags=%d\n", old.ss_flags);
}

static ucontext_t g_main_ctx, g_side_ctx;
static char g_side_stack[1 << 16];
static volatile int g_side_ran;

static void side(void) { g_side_ran = 1; }

static void context_cases(void) {
    getcontext(&g_side_ctx);
    g_side_ctx.uc_stack.ss_sp = g_side_stack;
    g_side_ctx.uc_stack.ss_size = sizeof g_side_stack;
    g_side_ctx.uc_link = &g_main_ctx;
    makecontext(&g_side_ctx, side, 0);
    CASE(swapcontext(&g_main_ctx, &g_side_ctx));
    printf("  side ran: %d\n", g_side_ran);

    static ucontext_t back;
    static volatile int jumped;
    jumped = 0;
    errno = g_sentinel;
    getcontext(&back);
    if (!jumped) {
        jumped = 1;
        errno = g_sentinel;
        setcontext(&back);
        printf("setcontext returned\n");
    }
    printf("setcontext(&back) [errno=%d before]: errno=%d\n", g_sentinel, errno);
}

static void jump_cases(void) {
    jmp_buf env;
    sigjmp_buf senv;
    volatile int round = 0;
    if (setjmp(env) == 0) {
        errno = g_sentinel;
        longjmp(env, 1);
    }
    printf("longjmp(env, 1) [errno=%d before]: errno=%d\n", g_sentinel, errno);
    if (setjmp(env) == 0) {
        errno = g_sentinel;
        _longjmp(env, 1);
    }
    printf("_longjmp(env, 1) [errno=%d before]: errno=%d\n", g_sentinel, errno);
    if (sigsetjmp(senv, 1) == 0) {
        errno = g_sentinel;
        siglongjmp(senv, 1);
    }
    printf("siglongjmp(senv, 1) [errno=%d before]: errno=%d\n", g_sentinel, errno);
    if (setjmp(env) == 0) {
        errno = g_sentinel;
        __longjmp_chk(env, 1);
    }
    printf("__longjmp_chk(env, 1) [errno=%d before]: errno=%d\n", g_sentinel, errno);
    (void)round;
}

static _Unwind_Reason_Code count_frame(struct _Unwind_Context *ctx, void *arg) {
    (void)ctx;
    ++*(int *)arg;
    return _URC_NO_REASON;
}

static _Unwind_Reason_Code stop_after_two(struct _Unwind_Context *ctx, void *arg) {
    (void)ctx;
    return ++*(int *)arg == 2 ? _URC_END_OF_STACK : _URC_NO_REASON;
}

__attribute__((noinline)) static void backtrace_cases(void) {
    void *frames[256];
    CASE(backtrace(frames, 256));
    CASE(backtrace(frames, 2));
    CASE(backtrace(frames, 1));
    CASE(backtrace(frames, 0));
    CASE(backtrace(frames, -1));
    int n = 0;
    errno = g_sentinel;
    const _Unwind_Reason_Code r = _Unwind_Backtrace(count_frame, &n);
    report("_Unwind_Backtrace(count_frame, &n)", r);
    printf("  frames: %d\n", n);
    n = 0;
    errno = g_sentinel;
    const _Unwind_Reason_Code r2 = _Unwind_Backtrace(stop_after_two, &n);
    report("_Unwind_Backtrace(stop_after_two, &n)", r2);
    printf("  frames: %d\n", n);
}

// fork and dlopen are not interposed (the agent follows them through pthread_atfork and a
// probe on the dynamic linker's r_brk): their results and errno must still be glibc's.
static void fork_dlopen_cases(void) {
    errno = g_sentinel;
    const pid_t child = fork();
    if (child == 0) _exit(errno == g_sentinel ? 7 : 8);
    report("fork() > 0", child > 0);
    int status = 0;
    CASE(waitpid(child, &status, 0) == child);
    printf("  child exit %d\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    errno = g_sentinel;
    void *none = dlopen("libukprobes-test-none.so", RTLD_NOW);
    report("dlopen(missing) != NULL", none != NULL);
    const char *why = dlerror();
    printf("  dlerror: %s\n", why != NULL ? why : "(none)");
    errno = g_sentinel;
    void *m = dlopen("libm.so.6", RTLD_NOW | RTLD_LOCAL);
    report("dlopen(libm.so.6) != NULL", m != NULL);
    errno = g_sentinel;
    report("dlsym(m, cos) != NULL", m != NULL && dlsym(m, "cos") != NULL);
    if (m != NULL) CASE(dlclose(m));
    errno = g_sentinel;
    void *self = dlopen(NULL, RTLD_NOW);
    report("dlopen(NULL) != NULL", self != NULL);
    if (self != NULL) CASE(dlclose(self));
}

static volatile sig_atomic_t g_usr1_seen;
static void on_usr1(int sig) {
    (void)sig;
    g_usr1_seen = 1;
}

// The calls that install a mask while they wait, and the BSD mask calls: results, errno,
// and the mask in force afterwards (theirs is temporary). A pending SIGUSR1 ends each wait.
static void wait_cases(void) {
    struct sigaction act;
    memset(&act, 0, sizeof act);
    act.sa_handler = on_usr1;
    sigaction(SIGUSR1, &act, NULL);
    sigset_t usr1, all_but_usr1, full;
    sigemptyset(&usr1);
    sigaddset(&usr1, SIGUSR1);
    sigfillset(&all_but_usr1);
    sigdelset(&all_but_usr1, SIGUSR1);
    sigfillset(&full);
    const struct timespec zero = {0, 0}, bad = {0, -1};
    struct pollfd none;
    struct epoll_event ev;
    const int ep = epoll_create1(EPOLL_CLOEXEC);

    sigprocmask(SIG_BLOCK, &usr1, NULL);
    raise(SIGUSR1);
    CASE(sigsuspend(&all_but_usr1));
    printf("  handler ran: %d\n", (int)g_usr1_seen);
    print_thread_mask("mask");
    raise(SIGUSR1);
    CASE(ppoll(NULL, 0, NULL, &all_but_usr1));
    raise(SIGUSR1);
    CASE(pselect(0, NULL, NULL, NULL, NULL, &all_but_usr1));
    raise(SIGUSR1);
    CASE(epoll_pwait(ep, &ev, 1, -1, &all_but_usr1));
    raise(SIGUSR1);
    CASE(epoll_pwait2(ep, &ev, 1, NULL, &all_but_usr1));
    print_thread_mask("mask");
    CASE(ppoll(&none, 0, &zero, &full));
    CASE(ppoll(&none, 0, &zero, NULL));
    CASE(ppoll(&none, 0, &bad, &full));
    CASE(pselect(0, NULL, NULL, NULL, &zero, &full));
    CASE(pselect(-1, NULL, NULL, NULL, &zero, &full));
    CASE(epoll_pwait(ep, &ev, 1, 0, &full));
    CASE(epoll_pwait(-1, &ev, 1, 0, &full));
    CASE(epoll_pwait(ep, &ev, 0, 0, NULL));
    CASE(epoll_pwait2(ep, &ev, 1, &zero, &full));
    CASE(epoll_pwait2(-1, &ev, 1, &zero, &full));
    CASE(epoll_pwait2(ep, &ev, 1, &bad, NULL));
    print_thread_mask("mask");
    close(ep);

    // The old masks they return, without the agent's signals (never blocked with it).
    int agent_bits = 0;
    for (int sig = 1; sig < 32; ++sig)
        if (agent_signal(sig)) agent_bits |= 1 << (sig - 1);
    CASE(sigsetmask(1 << (SIGUSR2 - 1)) & ~agent_bits);
    print_thread_mask("mask");
    CASE(sigblock(~0) & ~agent_bits);
    print_thread_mask("mask");
    CASE(sigsetmask(0) & ~agent_bits);
    print_thread_mask("mask");
}

int main(int argc, char **argv) {
    g_managed_exact = argc > 1 && strcmp(argv[1], "managed") == 0;
    setvbuf(stdout, NULL, _IOFBF, 1 << 20);
    // The first backtrace loads libgcc_s; errno is then glibc's, not the calls'.
    void *warm[4];
    backtrace(warm, 4);
    static const int sentinels[] = {EINTR, 12345};
    for (size_t i = 0; i < sizeof sentinels / sizeof *sentinels; ++i) {
        g_sentinel = sentinels[i];
        reset_state();
        mask_cases();
        reset_state();
        sigaction_cases();
        reset_state();
        signal_cases();
        reset_state();
        altstack_cases();
        reset_state();
        context_cases();
        reset_state();
        wait_cases();
        fork_dlopen_cases();
        jump_cases();
        backtrace_cases();
    }
    reset_state();
    return 0;
}
