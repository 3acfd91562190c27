// A kprobe (`o`) and a kretprobe (`ro`) as a user writes them: plain C, empty handlers,
// the default maxactive, built -O2 with no flag of the project's, linked against
// libukprobes.so; the handlers in the program itself, then in a library of its own
// (user_handlers.c). Five rounds alternate the three cases over 20,000,000 calls each;
// the fastest of each is kept. Prints the time per call and ro / o, over the call too.
// (The project's own figures are overhead_bench's; this checks that they hold for code
// the project did not write: docs/performance.md.)
#include <ukprobes/kprobes.h>

#include <stdio.h>
#include <time.h>

int user_lib_pre(struct kprobe *p, struct pt_regs *regs);
int user_lib_ret(struct kretprobe_instance *ri, struct pt_regs *regs);

__attribute__((noinline)) long user_function(long x) {
    __asm__ volatile("");
    return x + 1;
}

static int own_pre(struct kprobe *p, struct pt_regs *regs) {
    (void)p;
    (void)regs;
    return 0;
}

static int own_ret(struct kretprobe_instance *ri, struct pt_regs *regs) {
    (void)ri;
    (void)regs;
    return 0;
}

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

enum { kCalls = 20000000, kRounds = 5 };

static double per_call(void) {
    volatile long sum = 0;
    const double t0 = now_ns();
    for (long i = 0; i < kCalls; ++i) sum += user_function(i);
    const double ns = (now_ns() - t0) / kCalls;
    (void)sum;
    return ns;
}

static double min(double a, double b) { return a < b ? a : b; }

static int measure(const char *where, kprobe_pre_handler_t pre, kretprobe_handler_t ret) {
    double call = 1e9, o = 1e9, ro = 1e9;
    for (int round = 0; round < kRounds; ++round) {
        call = min(call, per_call());
        struct kprobe kp = {0};
        kp.symbol_name = "user_function";
        kp.pre_handler = pre;
        if (register_kprobe(&kp) != 0) return 1;
        ukp_optimizer_flush();
        o = min(o, per_call());
        unregister_kprobe(&kp);
        struct kretprobe rp = {0};
        rp.kp.symbol_name = "user_function";
        rp.handler = ret;
        if (register_kretprobe(&rp) != 0) return 1;
        ukp_optimizer_flush();
        ro = min(ro, per_call());
        unregister_kretprobe(&rp);
    }
    printf("handlers %-13s call %5.2f ns   o %6.2f ns   ro %6.2f ns   ro / o %.2f   over the call %.2f\n", where, call,
           o, ro, ro / o, (ro - call) / (o - call));
    return 0;
}

int main(void) {
    if (measure("in the program", own_pre, own_ret) != 0) return 1;
    if (measure("in a library", user_lib_pre, user_lib_ret) != 0) return 1;
    return 0;
}
