/*
 * jprobe_example.c - the kernel's samples/kprobes/jprobe_example.c (removed in 4.15),
 * in user space.
 *
 * The handler has the probed function's prototype: it sees the arguments of every call
 * to the sample program's handle_request() as the function does, prints them, and ends
 * with jprobe_return(); the function then runs with its original arguments.
 *
 *   LD_PRELOAD="libukprobes.so ./jprobe_example.so" ./sample_target
 */
#include <ukprobes/kprobes.h>

#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* Proxy routine having the same arguments as the actual handle_request() routine */
static int j_handle_request(int id, const char *path) {
    char buf[256];
    int n = snprintf(buf, sizeof buf, "jprobe: id = %d, path = \"%s\"\n", id, path);
    if (n > 0) (void)!write(STDERR_FILENO, buf, (size_t)n < sizeof buf ? (size_t)n : sizeof buf - 1);
    /* Always end with a call to jprobe_return(). */
    jprobe_return();
    return 0;
}

static struct jprobe my_jprobe = {
    .entry = JPROBE_ENTRY(j_handle_request),
    .kp =
        {
            .symbol_name = "handle_request",
        },
};

__attribute__((constructor)) static void jprobe_init(void) {
    int ret = register_jprobe(&my_jprobe);
    if (ret < 0) {
        fprintf(stderr, "register_jprobe failed, returned %d\n", ret);
        return;
    }
    fprintf(stderr, "Planted jprobe at %p, handler addr %p\n", (void *)my_jprobe.kp.addr, my_jprobe.entry);
}

__attribute__((destructor)) static void jprobe_exit(void) {
    unregister_jprobe(&my_jprobe);
    fprintf(stderr, "jprobe at %p unregistered\n", (void *)my_jprobe.kp.addr);
}
