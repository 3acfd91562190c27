// A statically linked program (linked with -static): no dynamic loader, so no LD_PRELOAD.
// It starts a dynamically linked child, which `ukprobe run` traces: sh -c 'exit N'.
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    printf("static program\n");
    fflush(stdout);
    return argc > 1 ? system(argv[1]) >> 8 : 0;
}
