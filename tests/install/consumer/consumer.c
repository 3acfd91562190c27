/*
 * A program built against an installed ukprobes, as a user would build one: it places a
 * kprobe on a function of its own by name, calls the function, and checks that the
 * pre_handler ran once and saw the argument in %rdi. It exits 0 only then.
 */
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
    return 0;
}
