// An allocator of its own for a program (LD_PRELOAD), as jemalloc or tcmalloc is: its
// malloc, calloc, realloc and free (the C library's own calls, the dynamic loader's and
// pthread_create's included) take its lock and keep counts under it, then call libc's.
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

void *__libc_malloc(size_t n);
void *__libc_calloc(size_t n, size_t size);
void *__libc_realloc(void *p, size_t n);
void __libc_free(void *p);

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t g_sizes[64]; // calls by the size's log2, kept under g_lock

// A count of the call kept under the allocator's lock, with enough work that a thread is
// often stopped here, outside the C library, holding it.
static void count(size_t n) {
    unsigned bits = 0;
    for (size_t v = n; v != 0; v >>= 1) ++bits;
    for (unsigned i = 0; i < 64; ++i) g_sizes[i] += (i == bits);
}

void *malloc(size_t n) {
    pthread_mutex_lock(&g_lock);
    count(n);
    void *p = __libc_malloc(n);
    pthread_mutex_unlock(&g_lock);
    return p;
}

void *calloc(size_t n, size_t size) {
    pthread_mutex_lock(&g_lock);
    count(n * size);
    void *p = __libc_calloc(n, size);
    pthread_mutex_unlock(&g_lock);
    return p;
}

void *realloc(void *old, size_t n) {
    pthread_mutex_lock(&g_lock);
    count(n);
    void *p = __libc_realloc(old, n);
    pthread_mutex_unlock(&g_lock);
    return p;
}

void free(void *p) {
    pthread_mutex_lock(&g_lock);
    count(0);
    __libc_free(p);
    pthread_mutex_unlock(&g_lock);
}
