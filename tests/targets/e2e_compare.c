// The bundled program of scripts/compare-kernel.sh's end-to-end records (tests/e2e/
// compare.txt): calls tests/targets/trace_target.c's functions, whose values are known, so
// that ukprobes and the kernel's uprobe tracer can probe the same calls in one run.
//   e2e_compare [COUNT]
// For i = 0..COUNT-1: ttarget_triple(i - 1), ttarget_eight(1..6, 7 + i, 8),
// ttarget_record(&ttarget_first, ttarget_greeting, -i, ~0 - i),
// ttarget_record(&ttarget_second, "alpha", i, i), ttarget_pointer(a bad pointer when
// i == 1, else ttarget_greeting); then prints "sum SUM".
#include <stdio.h>
#include <stdlib.h>

#include "trace_target.h"

int main(int argc, char **argv) {
    const int count = argc > 1 ? atoi(argv[1]) : 3;
    long sum = 0;
    for (int i = 0; i < count; ++i) {
        sum += ttarget_triple(i - 1);
        sum += ttarget_eight(1, 2, 3, 4, 5, 6, 7 + i, 8);
        sum += ttarget_record(&ttarget_first, ttarget_greeting, -i, ~0ul - (unsigned long)i);
        sum += ttarget_record(ttarget_first.next, ttarget_first.name, i, (unsigned long)i);
        // 16: a pointer into the unmapped first page, for the fault forms.
        sum += ttarget_pointer(i == 1 ? (const char *)16 : ttarget_greeting);
    }
    printf("sum %ld\n", sum);
    return 0;
}
