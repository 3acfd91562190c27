// End-to-end target of trace-pipe's end (tests/e2e/control.txt), linked with the agent:
// prints "ready PID", waits for SIGUSR1, then calls e2e_burst_work() argv[1] times as
// fast as it can and exits at once, leaving its last records in its ring for the reader
// to take after it is gone.
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static volatile sig_atomic_t g_go;

static void on_usr1(int sig) {
    (void)sig;
    g_go = 1;
}

__attribute__((noinline)) unsigned long e2e_burst_work(unsigned long i) {
    __asm__ volatile("" ::: "memory");
    return i * 5 + 3;
}

int main(int argc, char **argv) {
    const unsigned long n = argc > 1 ? strtoul(argv[1], NULL, 10) : 100000;
    struct sigaction sa = {0};
    sa.sa_handler = on_usr1;
    sigaction(SIGUSR1, &sa, NULL);
    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    while (!g_go) pause();
    unsigned long sum = 0;
    for (unsigned long i = 0; i < n; ++i) sum += e2e_burst_work(i);
    printf("sum %lu\n", sum);
    return 0;
}
