// End-to-end target: argv[2] threads (default 1), the main one among them, scan a 64 MiB
// buffer with memchr for a byte it does not hold, over and over for argv[1] seconds: each
// is inside libc (memchr's vector loop) nearly all the time and never in a system call.
// Prints the scans that came back wrong (not NULL) and exits 0 when none did and every
// thread finished scans.
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { kBytes = 64 << 20 };

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
    // The clock read once in 8 scans: the vDSO counts as the program's code, and an
    // interrupt landing there would end attach's search.
    while ((scans & 7) != 0 || now() < end) {
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
    g_buf = calloc(kBytes, 1);
    if (g_buf == NULL) return 2;
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
