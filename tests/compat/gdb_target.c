/* tests/compat/gdb.txt: the program gdb runs: work() allocates through libc's malloc. */
#include <stdio.h>
#include <stdlib.h>

int work(int i)
{
    char *p = malloc(64 + i);
    snprintf(p, 64, "w%d", i);
    int n = p[1];
    free(p);
    return n;
}

int main(void)
{
    int s = 0;
    for (int i = 0; i < 100; ++i) s += work(i);
    printf("sum %d\n", s);
    return 0;
}
