/*
 * A program built against an installed ukprobes, as a user would build one: it places a
 * kprobe on a function of its own by name, calls the function, and checks that the
 * pre_handler ran once and saw the argument in %rdi, and watches a variable of its own with a
 * write breakpoint. It exits 0 only then.
 */
#include <ukprobes/hw_breakpoint.h>
#include <ukprobes/kprobes.h>

#include <stdio.h>

static volatile int hits;
static volatile unsigned long seen_arg;

/* Not named ukp_*: the agent never probes its own ukp_* functions, and linked statically it
 * is part of the program. */
__attribute__((noinline)) int consumer_probed(int x) {
    __asm__ volatile("" ::: "memory");
    return x * 3;
}

static int handler_pre(struct kprobe *p, struct pt_regs *regs) {
    (void)p;
    hits++;
    seen_arg = regs->di;
    return 0;
}

static struct kprobe kp = {
    .symbol_name = "consumer_probed",
    .pre_handler = handler_pre,
};

static volatile long watched;
static volatile int writes;

static void on_write(struct perf_event *bp, struct perf_sample_data *data, struct pt_regs *regs) {
    (void)bp;
    (void)data;
    (void)regs;
    writes++;
}

int main(void) {
    int ret = register_kprobe(&kp);
    if (ret < 0) {
        fprintf(stderr, "consumer: register_kprobe: %d\n", ret);
        return 1;
    }
    /* Read from volatile objects, so that the compiler cannot specialize the call. */
    static volatile int arg = 14;
    int result = consumer_probed(arg);
    unregister_kprobe(&kp);
    consumer_probed(arg); /* unregistered: not counted */
    if (result != 42 || hits != 1 || seen_arg != 14) {
        fprintf(stderr, "consumer: result %d, %d hits, argument %lu (expected 42, 1, 14)\n", result, hits, seen_arg);
        return 1;
    }
    printf("consumer: the kprobe on consumer_probed ran once, argument 14\n");

    struct perf_event_attr attr;
    hw_breakpoint_init(&attr);
    attr.bp_addr = (unsigned long)&watched;
    attr.bp_len = HW_BREAKPOINT_LEN_8;
    attr.bp_type = HW_BREAKPOINT_W;
    struct perf_event *bp = register_user_hw_breakpoint(&attr, on_write, NULL, 0);
    if (IS_ERR(bp) && (PTR_ERR(bp) == -ENOENT || PTR_ERR(bp) == -ENODEV || PTR_ERR(bp) == -EOPNOTSUPP)) {
        printf("consumer: no hardware breakpoints on this machine (%ld)\n", PTR_ERR(bp));
        return 0;
    }
    if (IS_ERR(bp)) {
        fprintf(stderr, "consumer: register_user_hw_breakpoint: %ld\n", PTR_ERR(bp));
        return 1;
    }
    for (int i = 0; i < 3; i++) watched = i;
    unregister_hw_breakpoint(bp);
    watched = 9;
    if (writes != 3) {
        fprintf(stderr, "consumer: %d writes seen (expected 3)\n", writes);
        return 1;
    }
    printf("consumer: the write breakpoint saw 3 writes\n");
    return 0;
}
