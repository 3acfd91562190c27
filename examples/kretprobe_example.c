/*
 * kretprobe_example.c - the kernel's samples/kprobes/kretprobe_example.c, in user space.
 *
 * Probes the return of the function named by $KRETPROBE_SYMBOL (default: the sample
 * program's handle_request), reports the calls that failed (a negative return value)
 * with that value, and how long each call took. The entry handler stores the start
 * time in the instance's private data, as the kernel's sample does.
 *
 *   LD_PRELOAD="libukprobes.so ./kretprobe_example.so" ./sample_target
 */
#include <ukprobes/kprobes.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

/* per-instance private data */
struct my_data {
    long long entry_stamp;
};

static void say(const char *fmt, ...) {
    char buf[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n > 0) (void)!write(STDERR_FILENO, buf, n < (int)sizeof buf ? (size_t)n : sizeof buf - 1);
}

static long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); /* the vDSO: no system call */
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Here we use the entry_handler to timestamp function entry */
static int entry_handler(struct kretprobe_instance *ri, struct pt_regs *regs) {
    struct my_data *data = (struct my_data *)ri->data;
    (void)regs;
    data->entry_stamp = now_ns();
    return 0;
}

/*
 * Return-probe handler: Log the return value and duration. Duration may turn out to be
 * zero consistently, depending upon the granularity of time accounting on the platform.
 */
static int ret_handler(struct kretprobe_instance *ri, struct pt_regs *regs) {
    /* handle_request() returns an int: only the low half of rax is its value. */
    long retval = (int)regs_return_value(regs);
    struct my_data *data = (struct my_data *)ri->data;
    long long delta = now_ns() - data->entry_stamp;
    if (retval < 0)
        say("%s failed: returned %ld and took %lld ns to execute (thread %d)\n", ri->rp->kp.symbol_name, retval, delta,
            ri->task);
    else
        say("%s returned %ld and took %lld ns to execute\n", ri->rp->kp.symbol_name, retval, delta);
    return 0;
}

static struct kretprobe my_kretprobe = {
    .handler = ret_handler,
    .entry_handler = entry_handler,
    .data_size = sizeof(struct my_data),
    /* Probe up to 20 instances concurrently. */
    .maxactive = 20,
};

__attribute__((constructor)) static void kretprobe_init(void) {
    const char *symbol = getenv("KRETPROBE_SYMBOL");
    my_kretprobe.kp.symbol_name = symbol && *symbol ? symbol : "handle_request";
    int ret = register_kretprobe(&my_kretprobe);
    if (ret < 0) {
        say("register_kretprobe failed, returned %d\n", ret);
        return;
    }
    say("Planted return probe at %s: %p\n", my_kretprobe.kp.symbol_name, (void *)my_kretprobe.kp.addr);
}

__attribute__((destructor)) static void kretprobe_exit(void) {
    unregister_kretprobe(&my_kretprobe);
    say("kretprobe at %p unregistered\n", (void *)my_kretprobe.kp.addr);
    /* nmissed > 0 suggests that maxactive was set too low. */
    say("Missed probing %d instances of %s\n", my_kretprobe.nmissed, my_kretprobe.kp.symbol_name);
}
