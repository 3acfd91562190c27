// End-to-end target: every thread, the main one too, allocates and frees memory for
// argv[1] seconds (argv[2] threads in all, default 2), never waiting in a system call: most
// of its time is inside malloc and free, holding an arena's lock. Checks a pattern in every
// block. Exits 0 when every thread made progress and no block was wrong.
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

enum { kBlocks = 64 };

static atomic_int g_errors;
static double g_seconds;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t); // the vDSO: no system call
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static void *churn(void *arg) {
    uint64_t seed = (uint64_t)(uintptr_t)arg * 2654435761u + 1;
    uint64_t rounds = 0;
    unsigned char *blocks[kBlocks] = {0};
    const double end = now() + g_seconds;
    while ((rounds & 255) != 0 || now() < end) {
        const unsigned slot = (unsigned)(seed % kBlocks);
        seed = seed * 6364136223846793005u + 1442695040888963407u;
        if (blocks[slot] != NULL) {
            if (blocks[slot][0] != (unsigned char)slot) atomic_fetch_add(&g_errors, 1);
            free(blocks[slot]);
        }
        // Past the thread caches' sizes: each call goes into the arena, under its lock.
        blocks[slot] = malloc(1100 + (size_t)(seed % 20000));
        if (blocks[slot] != NULL) blocks[slot][0] = (unsigned char)slot;
        ++rounds;
    }
    for (unsigned i = 0; i < kBlocks; ++i) free(blocks[i]);
    return (void *)(uintptr_t)rounds;
}

int main(int argc, char **argv) {
    g_seconds = argc > 1 ? atof(argv[1]) : 2.0;
    const int threads = argc > 2 ? atoi(argv[2]) : 2;
    pthread_t tids[64];
    if (threads < 1 || threads > 64) return 2;
    for (int i = 1; i < threads; ++i) pthread_create(&tids[i], NULL, churn, (void *)(uintptr_t)(i + 1));
    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    int idle = churn((void *)1) == NULL;
    for (int i = 1; i < threads; ++i) {
        void *rounds;
        pthread_join(tids[i], &rounds);
        if (rounds == NULL) ++idle;
    }
    printf("threads %d, idle %d, errors %d\n", threads, idle, atomic_load(&g_errors));
    return idle == 0 && atomic_load(&g_errors) == 0 ? 0 : 1;
}
