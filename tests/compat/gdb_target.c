/* tests/compat/gdb.txt: the program gdb runs: work() allocates through libc's malloc. */
#include <stdio.h>
#include <stdlib.h>
int total; /* gdb watches it */
int work(int i) {
    char *p = malloc(64 + i);
    snprintf(p, 64, "w%d", i);
    int n = p[1];
    free(p);
    return n;
}

int main(void) {
    for (int i = 0; i < 100; ++i) total += work(i);
    printf("sum %d\n", total);

    return 0;
}
