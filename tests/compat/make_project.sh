#!/bin/sh
# tests/compat/make.txt: writes a small C project into DIR: 8 generated modules, main.c and
# a Makefile that builds them with the system compiler (make -j2) into DIR/prog, whose
# output is fixed.
set -e
dir=$1
mkdir -p "$dir"
i=1
: >"$dir/mods.h"
while [ $i -le 8 ]; do
    cat >"$dir/mod$i.c" <<EOC
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
struct node$i { struct node$i *next; long v; char name[24]; };
long mod$i(int n)
{
    struct node$i *head = NULL;
    for (int k = 0; k < n; ++k) {
        struct node$i *p = malloc(sizeof *p);
        p->next = head; p->v = (long)k * $i % 1009;
        snprintf(p->name, sizeof p->name, "m$i-%d", k);
        head = p;
    }
    long s = 0;
    while (head) { struct node$i *p = head; s += p->v + (long)strlen(p->name); head = p->next; free(p); }
    return s;
}
EOC
    echo "long mod$i(int n);" >>"$dir/mods.h"
    i=$((i + 1))
done
cat >"$dir/main.c" <<'EOC'
#include <stdio.h>
#include "mods.h"
int main(void)
{
    long (*f[])(int) = { mod1, mod2, mod3, mod4, mod5, mod6, mod7, mod8 };
    long total = 0;
    for (int i = 0; i < 8; ++i) { long s = f[i](20000); printf("mod%d %ld\n", i + 1, s); total += s; }
    printf("total %ld\n", total);
    return 0;
}
EOC
cat >"$dir/Makefile" <<'EOC'
OBJS = main.o mod1.o mod2.o mod3.o mod4.o mod5.o mod6.o mod7.o mod8.o
prog: $(OBJS)
	$(CC) -o $@ $(OBJS)
%.o: %.c mods.h
	$(CC) -O2 -Wall -c -o $@ $<
clean:
	rm -f prog $(OBJS)
EOC
