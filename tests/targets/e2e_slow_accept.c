// A control thread slow to answer, as a loaded machine makes it (run.txt): preloaded after
// the agent, this accept4 waits 300 ms before it calls the C library's, so the agent's
// answer to ukprobe's first connection comes that late.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <sys/socket.h>
#include <time.h>

int accept4(int fd, struct sockaddr *addr, socklen_t *len, int flags) {
    static int (*next)(int, struct sockaddr *, socklen_t *, int);
    if (next == NULL) next = (int (*)(int, struct sockaddr *, socklen_t *, int))dlsym(RTLD_NEXT, "accept4");
    const struct timespec wait = {0, 300 * 1000 * 1000};
    nanosleep(&wait, NULL);
    return next(fd, addr, len, flags);
}
