// End-to-end target for thread names in the trace: on each SIGUSR1 it starts a thread
// that names itself "shortlived", calls e2e_comm_work() and ends by a raw exit system
// call (no thread-exit handlers run, as with a thread a runtime ends itself), then waits
// until the thread is gone from /proc and prints "gone TID". Runs for argv[1] seconds.
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static atomic_int g_asked;
static atomic_int g_tid;

__attribute__((noinline)) int e2e_comm_work(int x) {
    __asm__ volatile("" ::: "memory");
    return x + 1;
}

static void on_usr1(int sig) {
    (void)sig;
    atomic_fetch_add(&g_asked, 1);
}

static void *shortlived(void *arg) {
    (void)arg;
    prctl(PR_SET_NAME, "shortlived", 0, 0, 0);
    atomic_store(&g_tid, (int)syscall(SYS_gettid));
    e2e_comm_work(7);
    syscall(SYS_exit, 0);
    return NULL;
}

static int gone(int tid) {
    char path[64];
    snprintf(path, sizeof path, "/proc/self/task/%d", tid);
    return access(path, F_OK) != 0;
}

int main(int argc, char **argv) {
    const double seconds = argc > 1 ? atof(argv[1]) : 5.0;
    signal(SIGUSR1, on_usr1);
    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    int done = 0;
    for (;;) {
        clock_gettime(CLOCK_MONOTONIC, &now);
        if ((double)(now.tv_sec - start.tv_sec) + (double)(now.tv_nsec - start.tv_nsec) / 1e9 > seconds) break;
        if (atomic_load(&g_asked) > done) {
            ++done;
            atomic_store(&g_tid, 0);
            pthread_t t;
            pthread_attr_t attr;
            pthread_attr_init(&attr);
            pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
            if (pthread_create(&t, &attr, shortlived, NULL) != 0) return 1;
            pthread_attr_destroy(&attr);
            while (atomic_load(&g_tid) == 0) usleep(1000);
            const int tid = atomic_load(&g_tid);
            while (!gone(tid)) usleep(1000);
            printf("gone %d\n", tid);
            fflush(stdout);
        }
        usleep(10000);
    }
    return 0;
}
