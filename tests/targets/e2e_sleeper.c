// End-to-end target: sleeps in one nanosleep() for argv[1] seconds, then reports how long
// the sleep took. Exits 0 only if it ended on time (an attach must restart the system
// call, neither cutting it short nor restarting it from the beginning).
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    const double seconds = argc > 1 ? atof(argv[1]) : 2.0;
    struct timespec req = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    const double start = now();
    const int rc = nanosleep(&req, NULL);
    const double slept = now() - start;
    printf("nanosleep returned %d after %.1f s\n", rc, slept);
    // On time: not early, and well before a restart from the beginning would end.
    const int on_time = rc == 0 && slept >= seconds && slept < seconds + 0.5;
    printf("%s\n", on_time ? "on time" : "NOT ON TIME");
    return on_time ? 0 : 1;
}
