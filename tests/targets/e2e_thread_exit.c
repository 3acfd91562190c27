// Threads that allocate and free while they run and again while they exit (a
// thread-specific value's destructor, run after the agent's own): the frees of the exit
// have no buffer to be recorded in. Prints "done".
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

int main(void) {
    pthread_key_create(&g_key, destroy);
    for (int t = 0; t < 4; t++) {
        pthread_t thread;
        pthread_create(&thread, NULL, worker, NULL);
        pthread_join(thread, NULL);
    }
    printf("done\n");
    return 0;
}
