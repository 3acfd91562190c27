// End-to-end target linked with the agent: registers a kprobe on its own function
// e2e_work() and calls it for argv[1] seconds, pausing argv[2] ns (default 1 ms; 0: never,
// so that the main thread makes no system call) after each 1000 calls. Exits 0 if the results were right and the
// probe hit (at least once, at most once per call: kprobes may be off for a while).
#include <ukprobes/kprobes.h>

#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static volatile unsigned long g_hits;

__attribute__((noinline)) int e2e_work(int x) {
    __asm__ volatile("" ::: "memory");
    return x * 3 + 1;
}

static int pre(struct kprobe *p, struct pt_regs *regs) {
    (void)p;
    (void)regs;
    ++g_hits;
    return 0;
}

int main(int argc, char **argv) {
    const double seconds = argc > 1 ? atof(argv[1]) : 5.0;
    const long pause_ns = argc > 2 ? atol(argv[2]) : 1000000;
    struct kprobe kp = {0};
    kp.symbol_name = "e2e_work";
    kp.pre_handler = pre;
    const int rc = register_kprobe(&kp);
    if (rc != 0) {
        printf("register_kprobe: %d\n", rc);
        return 1;
    }
    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    unsigned long calls = 0;
    long sum = 0;
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    do {
        for (int i = 0; i < 1000; ++i, ++calls) sum += e2e_work(i);
        struct timespec pause = {0, pause_ns};
        if (pause_ns > 0) nanosleep(&pause, NULL);
        clock_gettime(CLOCK_MONOTONIC, &now);
    } while ((double)(now.tv_sec - start.tv_sec) + (double)(now.tv_nsec - start.tv_nsec) / 1e9 < seconds);
    unregister_kprobe(&kp);
    const int ok = g_hits > 0 && g_hits <= calls && sum == (long)(calls / 1000) * (3 * 999 * 1000 / 2 + 1000);
    printf("calls %lu, hits %s\n", calls, ok ? "ok" : "WRONG");
    return ok ? 0 : 1;
}
