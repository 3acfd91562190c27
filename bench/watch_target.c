/*
 * watch_target: writes the global `watched` argv[1] times, for watch_bench's run of gdb's
 * hardware watchpoint on it (a `watch` whose commands only continue).
 */
#include <stdlib.h>

volatile long watched;

int main(int argc, char **argv) {
    const long n = argc > 1 ? atol(argv[1]) : 1000;
    for (long i = 0; i < n; ++i) watched = i;
    return 0;
}
