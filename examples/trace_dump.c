/*
 * trace_dump: a preloadable "module" that prints the tracer's `trace` and `kprobe_profile`
 * files when the program exits, as `cat /sys/kernel/tracing/trace` would after a run.
 * The events themselves come from UKP_EVENTS (the kernel's kprobe_event= boot parameter),
 * which the agent applies and enables before main:
 *
 *   UKP_EVENTS='p:req,handle_request,id=%di:s32,path=+0(%si):string' \
 *   LD_PRELOAD="libukprobes.so ./trace_dump.so" ./sample_target
 *
 * It also shows the in-process file API of <ukprobes/trace.h>, with which a program can
 * trace itself.
 */
#include <ukprobes/trace.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void print_file(const char *path) {
    char *text = NULL;
    int err = ukp_trace_read(path, &text);
    if (err != 0) {
        fprintf(stderr, "trace_dump: reading %s: %s\n", path, strerror(-err));
        return;
    }
    fprintf(stderr, "---- %s\n%s", path, text);
    free(text);
}

__attribute__((destructor)) static void dump(void) {
    fflush(stdout); /* the program's own output first */
    print_file("kprobe_events");
    print_file("trace");
    print_file("kprobe_profile");
}
