// End-to-end target for watch events: threads (argv[2], default 3) add 1 to the global
// e2e_shared every 100 us for argv[1] seconds; one more thread starts argv[3] seconds in
// (default 1.5). Prints "ready PID" once the first threads run, and at the end whether
// e2e_shared is the sum of every thread's additions. With argv[4] "fork", a child of fork()
// adds for 0.3 s on a thread of its own meanwhile, and says whether its sum is right too.
// `e2e_watched probe` only says (by its status) whether this machine gives a thread a
// hardware breakpoint (a guest may have no debug registers).
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/hw_breakpoint.h>
#include <linux/perf_event.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

_Alignas(8) _Atomic long e2e_shared;
static atomic_int g_stop;

static void *adder(void *arg) {
    (void)arg;
    long mine = 0;
    const struct timespec pause = {0, 100000};
    while (!atomic_load(&g_stop)) {
        atomic_fetch_add(&e2e_shared, 1);
        ++mine;
        nanosleep(&pause, NULL);
    }
    return (void *)mine;
}

static void sleep_for(double seconds) {
    struct timespec t = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
    while (nanosleep(&t, &t) != 0) {
    }
}

// In the child of fork(): one adder for 0.3 s; 0 if e2e_shared grew by its additions.
static int child(void) {
    const long before = atomic_load(&e2e_shared);
    atomic_store(&g_stop, 0);
    pthread_t t;
    pthread_create(&t, NULL, adder, NULL);
    sleep_for(0.3);
    atomic_store(&g_stop, 1);
    void *mine;
    pthread_join(t, &mine);
    return atomic_load(&e2e_shared) - before == (long)mine && (long)mine > 0 ? 0 : 1;
}

static int probe(void) {
    struct perf_event_attr a;
    memset(&a, 0, sizeof a);
    a.type = PERF_TYPE_BREAKPOINT;
    a.size = sizeof a;
    a.bp_addr = (unsigned long)&e2e_shared;
    a.bp_len = HW_BREAKPOINT_LEN_8;
    a.bp_type = HW_BREAKPOINT_W;
    a.sample_period = 1;
    a.exclude_kernel = 1;
    a.sigtrap = 1;
    a.remove_on_exec = 1;
    const long fd = syscall(SYS_perf_event_open, &a, 0, -1, -1, PERF_FLAG_FD_CLOEXEC);
    if (fd < 0) return 1;
    close((int)fd);
    // And one that is hit: a guest may offer the PMU with no debug registers behind it.
    a.sigtrap = 0;
    a.remove_on_exec = 0;
    const long counting = syscall(SYS_perf_event_open, &a, 0, -1, -1, PERF_FLAG_FD_CLOEXEC);
    if (counting < 0) return 1;
    atomic_fetch_add(&e2e_shared, 1);
    unsigned long long writes = 0;
    const int counted = read((int)counting, &writes, sizeof writes) == (ssize_t)sizeof writes;
    close((int)counting);
    return counted && writes > 0 ? 0 : 1;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "probe") == 0) return probe();
    const double seconds = argc > 1 ? atof(argv[1]) : 3.0;
    const int threads = argc > 2 ? atoi(argv[2]) : 3;
    const double late = argc > 3 ? atof(argv[3]) : 1.5;
    pthread_t tids[65];
    if (threads < 1 || threads > 64 || late >= seconds) return 2;
    for (int i = 0; i < threads; ++i) pthread_create(&tids[i], NULL, adder, NULL);
    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    const int forks = argc > 4 && strcmp(argv[4], "fork") == 0;
    pid_t pid = -1;
    if (forks) {
        fflush(stdout);
        pid = fork();
        if (pid == 0) _exit(child());
    }
    sleep_for(late);
    pthread_create(&tids[threads], NULL, adder, NULL);
    sleep_for(seconds - late);
    atomic_store(&g_stop, 1);
    long sum = 0;
    for (int i = 0; i <= threads; ++i) {
        void *mine;
        pthread_join(tids[i], &mine);
        sum += (long)mine;
    }
    if (forks) {
        int status = 0;
        waitpid(pid, &status, 0);
        printf("child additions %s\n", WIFEXITED(status) && WEXITSTATUS(status) == 0 ? "ok" : "WRONG");
    }
    printf("additions %s\n", sum == atomic_load(&e2e_shared) && sum > 0 ? "ok" : "WRONG");
    return sum == atomic_load(&e2e_shared) ? 0 : 1;
}
