// End-to-end target: blocked in read() on a pipe (a restartable system call) with a
// SA_RESTART handler for SIGUSR1 and SIGUSR2 blocked. A thread writes "hello" after
// argv[1] seconds. Prints what read() got, how many SIGUSR1 arrived, and whether the
// signal mask is what it was; exits 0 if all is as without ukprobes.
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static atomic_int g_usr1;
static int g_pipe[2];
static double g_delay;

static void on_usr1(int sig) {
    (void)sig;
    atomic_fetch_add(&g_usr1, 1);
}

static void *writer(void *arg) {
    (void)arg;
    usleep((useconds_t)(g_delay * 1e6));
    if (write(g_pipe[1], "hello", 5) != 5) abort();
    return NULL;
}

int main(int argc, char **argv) {
    g_delay = argc > 1 ? atof(argv[1]) : 2.0;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGUSR1, &sa, NULL);
    sigset_t block, before, after;
    sigemptyset(&block);
    sigaddset(&block, SIGUSR2);
    sigprocmask(SIG_BLOCK, &block, NULL);
    sigemptyset(&before);
    sigprocmask(SIG_BLOCK, NULL, &before);
    if (pipe(g_pipe) != 0) return 2;
    pthread_t t;
    // The writer thread must not take SIGUSR1: block it there.
    sigset_t usr1;
    sigemptyset(&usr1);
    sigaddset(&usr1, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &usr1, NULL);
    pthread_create(&t, NULL, writer, NULL);
    pthread_sigmask(SIG_UNBLOCK, &usr1, NULL);
    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    char buf[16] = {0};
    const ssize_t n = read(g_pipe[0], buf, sizeof buf - 1);
    pthread_join(t, NULL);
    sigemptyset(&after);
    sigprocmask(SIG_BLOCK, NULL, &after);
    int same_mask = sigismember(&after, SIGUSR2) == 1;
    for (int sig = 1; sig < NSIG; ++sig) same_mask &= sigismember(&before, sig) == sigismember(&after, sig);
    printf("read %zd '%s'\n", n, n > 0 ? buf : "");
    printf("usr1 %d\n", atomic_load(&g_usr1));
    printf("mask %s\n", same_mask ? "unchanged" : "CHANGED");
    return n == 5 && same_mask ? 0 : 1;
}
