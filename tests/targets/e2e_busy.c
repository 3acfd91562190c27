// End-to-end target: N threads (argv[2], default 4) allocate, fill, check and free memory
// for argv[1] seconds, each checking its own arithmetic as it goes. Exits 0 if every
// thread made progress and never saw a wrong result.
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static atomic_int g_stop;
static atomic_int g_errors;

static void *worker(void *arg) {
    uint64_t seed = (uint64_t)(uintptr_t)arg * 2654435761u + 1;
    uint64_t rounds = 0;
    while (!atomic_load(&g_stop)) {
        const size_t n = 16 + (seed % 4096);
        uint64_t *buf = malloc(n * sizeof *buf);
        uint64_t want = 0, got = 0;
        for (size_t i = 0; i < n; ++i) {
            seed = seed * 6364136223846793005u + 1442695040888963407u;
            buf[i] = seed;
            want += seed;
        }
        for (size_t i = 0; i < n; ++i) got += buf[i];
        if (got != want) atomic_fetch_add(&g_errors, 1);
        free(buf);
        ++rounds;
    }
    return (void *)(uintptr_t)rounds;
}

int main(int argc, char **argv) {
    const double seconds = argc > 1 ? atof(argv[1]) : 2.0;
    const int threads = argc > 2 ? atoi(argv[2]) : 4;
    pthread_t tids[64];
    if (threads < 1 || threads > 64) return 2;
    for (int i = 0; i < threads; ++i) pthread_create(&tids[i], NULL, worker, (void *)(uintptr_t)(i + 1));
    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    struct timespec t = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
    while (nanosleep(&t, &t) != 0) {
    }
    atomic_store(&g_stop, 1);
    int idle = 0;
    for (int i = 0; i < threads; ++i) {
        void *rounds;
        pthread_join(tids[i], &rounds);
        if ((uintptr_t)rounds == 0) ++idle;
    }
    printf("threads %d, idle %d, errors %d\n", threads, idle, atomic_load(&g_errors));
    return idle == 0 && atomic_load(&g_errors) == 0 ? 0 : 1;
}
