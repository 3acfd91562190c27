// A thread that blocks every signal, as libuv's, Go's and the JVM's helper threads do,
// then calls write() every millisecond; the main thread lives SECONDS (default 2) and
// prints "alive" and how many writes the thread made.
//
//   e2e_blocked [SECONDS]
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
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
    for (int i = 0; i < seconds * 100; i++) usleep(10000);
    printf("alive, writes %s\n", atomic_load(&g_writes) > 0 ? "made" : "none");
    return 0;
}
