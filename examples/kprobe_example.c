/*
 * kprobe_example.c - the kernel's samples/kprobes/kprobe_example.c, in user space.
 *
 * A kernel module becomes a shared object: module_init is its constructor and
 * module_exit its destructor, and it is loaded into an unmodified program with
 * LD_PRELOAD:
 *
 *   LD_PRELOAD=./kprobe_example.so ./sample_target
 *
 * It places a kprobe on the function named by $KPROBE_SYMBOL (default: the sample
 * program's handle_request) and prints from the pre- and post-handlers. printf() is not
 * async-signal-safe, so the handlers format with snprintf() into a buffer and write(2) it.
 */
#include <ukprobes/kprobes.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static struct kprobe kp;

static void say(const char *fmt, ...) {
    char buf[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n > 0) (void)!write(STDERR_FILENO, buf, n < (int)sizeof buf ? (size_t)n : sizeof buf - 1);
}

/* kprobe pre_handler: called just before the probed instruction is executed */
static int handler_pre(struct kprobe *p, struct pt_regs *regs) {
    say("<%s> pre_handler: p->addr = %p, ip = %lx, flags = 0x%lx, arg1 = %ld, arg2 = %p\n", p->symbol_name,
        (void *)p->addr, regs->ip, regs->flags, (long)regs->di, (void *)regs->si);
    return 0;
}

/* kprobe post_handler: called after the probed instruction is executed */
static void handler_post(struct kprobe *p, struct pt_regs *regs, unsigned long flags) {
    (void)flags;
    say("<%s> post_handler: p->addr = %p, flags = 0x%lx\n", p->symbol_name, (void *)p->addr, regs->flags);
}

/*
 * fault_handler: this is called if an exception is generated for any instruction
 * within the pre- or post-handler, or when the probed instruction faults.
 */
static int handler_fault(struct kprobe *p, struct pt_regs *regs, int trapnr) {
    (void)regs;
    say("fault_handler: p->addr = %p, trap #%d\n", (void *)p->addr, trapnr);
    /* Return 0 because we don't handle the fault. */
    return 0;
}

__attribute__((constructor)) static void kprobe_init(void) {
    const char *symbol = getenv("KPROBE_SYMBOL");
    kp.symbol_name = symbol && *symbol ? symbol : "handle_request";
    kp.pre_handler = handler_pre;
    kp.post_handler = handler_post;
    kp.fault_handler = handler_fault;

    int ret = register_kprobe(&kp);
    if (ret < 0) {
        say("register_kprobe failed, returned %d\n", ret);
        return;
    }
    if (kp.addr)
        say("Planted kprobe at %p\n", (void *)kp.addr);
    else
        say("Planted kprobe on %s: armed when its object is loaded\n", kp.symbol_name);
}

__attribute__((destructor)) static void kprobe_exit(void) {
    unregister_kprobe(&kp);
    say("kprobe at %p unregistered (missed %lu)\n", (void *)kp.addr, kp.nmissed);
}
