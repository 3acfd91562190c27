// The program of pipeline_bench: `calls N` calls a probed function N times; `libc N`
// calls libc's strtoul N times (N + 1 with the one that reads N); `masks N` sets its
// signal mask N times (what servers do around every wait); `wait-calls N` prints
// "ready", waits for SIGUSR1, then calls the probed function N times (for a reader that
// attaches first).
#include <signal.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

__attribute__((noinline)) unsigned long pipeline_work(unsigned long i) {
    __asm__ volatile("" ::: "memory");
    return i * 3 + 1;
}

static volatile sig_atomic_t g_go;
static void on_usr1(int sig) {
    (void)sig;
    g_go = 1;
}

int main(int argc, char **argv) {
    if (argc != 3) return 2;
    const unsigned long n = strtoul(argv[2], NULL, 10);
    unsigned long sum = 0;
    if (strcmp(argv[1], "wait-calls") == 0) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_usr1;
        sigaction(SIGUSR1, &sa, NULL);
        printf("ready\n");
        fflush(stdout);
        while (!g_go) pause();
        for (unsigned long i = 0; i < n; ++i) sum += pipeline_work(i);
    } else if (strcmp(argv[1], "calls") == 0) {
        for (unsigned long i = 0; i < n; ++i) sum += pipeline_work(i);
    } else if (strcmp(argv[1], "libc") == 0) {
        static const char *const kNumbers[] = {"7", "12", "123456", "9"};
        for (unsigned long i = 0; i < n; ++i) sum += strtoul(kNumbers[i % 4], NULL, 10);
    } else {
        sigset_t a, b;
        sigemptyset(&a);
        sigemptyset(&b);
        sigaddset(&b, SIGUSR1);
        for (unsigned long i = 0; i < n; ++i) sigprocmask(SIG_SETMASK, i % 2 ? &a : &b, NULL);
    }
    printf("%lu\n", sum);
    return 0;
}
