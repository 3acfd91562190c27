// A thread that blocks every signal, as libuv's, Go's and the JVM's helper threads do,
// then calls write() every millisecond; the main thread lives SECONDS (default 2) and
// prints "alive" and how many writes the thread made. With `busy`, the main thread
// computes instead of sleeping: the blocking thread is then the only one waiting in a
// system call, the one `ukprobe attach` interrupts to load the agent.
//
//   e2e_blocked [SECONDS [busy]]
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static atomic_long g_writes;

static void *worker(void *arg) {
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
    const int fd = open("/dev/null", O_WRONLY | O_CLOEXEC);
    for (;;) {
        if (write(fd, "x", 1) == 1) atomic_fetch_add(&g_writes, 1);
        usleep(1000);
    }
    return arg;
}

int main(int argc, char **argv) {
    const int seconds = argc > 1 ? atoi(argv[1]) : 2;
    pthread_t t;
    pthread_create(&t, NULL, worker, NULL);
    while (atomic_load(&g_writes) == 0) usleep(1000); // its mask is set by then
    printf("ready\n");
    fflush(stdout);
    if (argc > 2 && strcmp(argv[2], "busy") == 0) {
        struct timespec t0, t;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        volatile unsigned long spin = 0;
        do {
            for (int i = 0; i < 100000; i++) spin += i; // no system call: clock_gettime is the vDSO's
            clock_gettime(CLOCK_MONOTONIC, &t);
        } while (t.tv_sec - t0.tv_sec < seconds);
        (void)spin;
    } else {
        for (int i = 0; i < seconds * 100; i++) usleep(10000);
    }
    printf("alive, writes %s\n", atomic_load(&g_writes) > 0 ? "made" : "none");
    return 0;
}
