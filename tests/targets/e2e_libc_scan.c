// End-to-end target: argv[2] threads (default 1), the main one among them, scan 1 GiB of
// zeros with memchr for a byte it does not hold, over and over for argv[1] seconds: each
// is inside libc (memchr's vector loop) nearly all the time and never in a system call.
// The zeros are a read-only anonymous mapping never written (every page the kernel's zero
// page: no memory used, mapped before the program says it is ready), so long that a scan
// takes tens of milliseconds (37 ms here; 64 MiB took 2): attach, which single-steps a
// thread stopped in libc for 20 ms at most (some thousands of instructions, a few tens of
// kilobytes of memchr's loop), leaves memchr only from an interrupt that landed within
// that distance of its end. With 64 MiB (a chance about 16 times as high) a CI run once
// saw attach step out and succeed.
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static const size_t kBytes = (size_t)1 << 30;

static unsigned char *g_buf;
static atomic_int g_wrong;
static double g_seconds;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t); // the vDSO: no system call
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static void *scan(void *arg) {
    (void)arg;
    uint64_t scans = 0;
    const double end = now() + g_seconds;
    // (The clock is the vDSO, which counts as the program's code: an interrupt landing
    // there would end attach's search, but a scan is a million times as long.)
    while (now() < end) {
        if (memchr(g_buf, 1, kBytes) != NULL) atomic_fetch_add(&g_wrong, 1);
        ++scans;
    }
    return (void *)(uintptr_t)scans;
}

int main(int argc, char **argv) {
    g_seconds = argc > 1 ? atof(argv[1]) : 2.0;
    const int threads = argc > 2 ? atoi(argv[2]) : 1;
    pthread_t tids[16];
    if (threads < 1 || threads > 16) return 2;
    g_buf = mmap(NULL, kBytes, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_POPULATE, -1, 0);
    if (g_buf == MAP_FAILED) return 2;
    for (int i = 1; i < threads; ++i) pthread_create(&tids[i], NULL, scan, NULL);
    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    int idle = scan(NULL) == NULL;
    for (int i = 1; i < threads; ++i) {
        void *scans;
        pthread_join(tids[i], &scans);
        if (scans == NULL) ++idle;
    }
    printf("threads %d, idle %d, wrong %d\n", threads, idle, atomic_load(&g_wrong));
    return idle == 0 && atomic_load(&g_wrong) == 0 ? 0 : 1;
}
