// The handlers of user_harness.c in a library of their own, as a user's plugin would hold
// them: empty, built as any C file is (-O2).
#include <ukprobes/kprobes.h>

int user_lib_pre(struct kprobe *p, struct pt_regs *regs) {
    (void)p;
    (void)regs;
    return 0;
}

int user_lib_ret(struct kretprobe_instance *ri, struct pt_regs *regs) {
    (void)ri;
    (void)regs;
    return 0;
}
