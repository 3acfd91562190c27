// Threads that allocate and free while they run and again while they exit (a
// thread-specific value's destructor, run after the agent's own, then glibc's own frees
// and madvise): the events of the exit go into the buffer the thread keeps to its end.
// argv[1]: how many threads, one after the other (default 4). Prints "done".
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

static pthread_key_t g_key;

static void destroy(void *value) {
    for (int i = 0; i < 50; i++) free(malloc(64));
    free(value);
}

static void *worker(void *arg) {
    pthread_setspecific(g_key, malloc(8));
    for (int i = 0; i < 10; i++) free(malloc(32));
    return arg;
}

int main(int argc, char **argv) {
    const int threads = argc > 1 ? atoi(argv[1]) : 4;
    pthread_key_create(&g_key, destroy);
    for (int t = 0; t < threads; t++) {
        pthread_t thread;
        pthread_create(&thread, NULL, worker, NULL);
        pthread_join(thread, NULL);
    }
    printf("done\n");
    return 0;
}
