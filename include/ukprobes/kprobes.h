/*
 * <ukprobes/kprobes.h> - the kernel's Kprobes API for ordinary user-space processes.
 *
 * The names, structures and return values are those of the Linux kernel's
 * <linux/kprobes.h> (Documentation/kprobes.txt and Documentation/trace/kprobes.rst),
 * so that probe code written for a kernel module ports with few changes. Functions
 * return 0 or a negative errno value.
 *
 * This header is C-compatible. It defines its own struct pt_regs with the kernel's
 * (not the uapi's) field names; do not include <linux/ptrace.h> or <asm/ptrace.h> in
 * the same translation unit.
 */
#ifndef UKPROBES_KPROBES_H
#define UKPROBES_KPROBES_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Registers at the probe point, laid out as the kernel's x86-64 struct pt_regs.
 * Handlers may change any field; every change is applied when the program resumes
 * (cs and ss excepted: user space cannot change them). flags is RFLAGS; orig_ax is
 * -1 (no system call in progress).
 */
struct pt_regs {
    unsigned long r15;
    unsigned long r14;
    unsigned long r13;
    unsigned long r12;
    unsigned long bp;
    unsigned long bx;
    unsigned long r11;
    unsigned long r10;
    unsigned long r9;
    unsigned long r8;
    unsigned long ax;
    unsigned long cx;
    unsigned long dx;
    unsigned long si;
    unsigned long di;
    unsigned long orig_ax;
    unsigned long ip;
    unsigned long cs;
    unsigned long flags;
    unsigned long sp;
    unsigned long ss;
};

/* The breakpoint instruction, as in the kernel's asm/kprobes.h. */
typedef unsigned char kprobe_opcode_t;
#define BREAKPOINT_INSTRUCTION 0xcc
#define MAX_INSN_SIZE 16

struct kprobe;

/*
 * Called before the probed instruction runs. Return 0 to go on normally. Return
 * non-zero after changing regs->ip to resume there: the probed instruction is then
 * skipped and no post_handler runs ("Changing Execution Path", kprobes.rst).
 */
typedef int (*kprobe_pre_handler_t)(struct kprobe *p, struct pt_regs *regs);
/* Called after the probed instruction ran; flags is always 0. */
typedef void (*kprobe_post_handler_t)(struct kprobe *p, struct pt_regs *regs, unsigned long flags);
/*
 * Called when a pre_handler or post_handler faults, or the probed instruction faults.
 * trapnr is the x86 trap number (0 divide error, 6 invalid opcode, 13 general
 * protection, 14 page fault, 17 alignment check). Return 1 if handled; see
 * docs/reference.md, "fault_handler", for the exact rules.
 */
typedef int (*kprobe_fault_handler_t)(struct kprobe *p, struct pt_regs *regs, int trapnr);

/* kprobe.flags */
#define KPROBE_FLAG_GONE 1     /* the probed object was unloaded */
#define KPROBE_FLAG_DISABLED 2 /* registered but disarmed */
#define KPROBE_FLAG_OPTIMIZED 4
#define KPROBE_FLAG_FTRACE 8

struct kprobe {
    /* Count of hits whose handlers did not run (recursion, a faulting handler). */
    unsigned long nmissed;
    /* Probe address; filled in from symbol_name + offset by register_kprobe(). */
    kprobe_opcode_t *addr;
    /* "sym" or "OBJECT:sym", OBJECT being a loaded object's file name. */
    const char *symbol_name;
    /* Offset into symbol_name (or from addr). */
    unsigned int offset;
    kprobe_pre_handler_t pre_handler;
    kprobe_post_handler_t post_handler;
    kprobe_fault_handler_t fault_handler;
    /* The original first byte of the probed instruction, saved at registration. */
    kprobe_opcode_t opcode;
    /* KPROBE_FLAG_* */
    unsigned int flags;
    /* Owned by ukprobes while the probe is registered; leave zero. */
    void *ukp_private;
};

int register_kprobe(struct kprobe *p);
void unregister_kprobe(struct kprobe *p);
int register_kprobes(struct kprobe **kps, int num);
void unregister_kprobes(struct kprobe **kps, int num);
int disable_kprobe(struct kprobe *p);
int enable_kprobe(struct kprobe *p);

/*
 * Return probes (kprobes.rst, "Return Probes"). A kretprobe sits at the entry of a
 * function (kp.symbol_name or kp.addr, offset 0): on entry it takes an instance from its
 * pool of maxactive, saves the return address in it and replaces it with a trampoline;
 * when the function returns, handler runs with the return-value registers, then the
 * program continues at the real return address.
 */
struct kretprobe_instance;
typedef int (*kretprobe_handler_t)(struct kretprobe_instance *ri, struct pt_regs *regs);

struct kretprobe {
    struct kprobe kp;
    /* Called when the function returns; its return value is ignored. */
    kretprobe_handler_t handler;
    /* Called on entry; a non-zero return leaves this call unprobed (no handler call). */
    kretprobe_handler_t entry_handler;
    /* Instances allocated at registration: calls in flight at once, all threads.
	 * <= 0: the kernel's default, max(10, 2 * number of CPUs). */
    int maxactive;
    /* Entries that found no free instance (their return is not probed). */
    int nmissed;
    /* Bytes of private data per instance (ri->data), shared by entry and return handler. */
    size_t data_size;
    /* ukprobes: instances released without their handler because their frame was left
	 * without returning (a C++ exception, longjmp, thread exit or cancellation). */
    unsigned long ukp_unwound;
    /* Owned by ukprobes while registered; leave zero. */
    void *ukp_private;
};

struct kretprobe_instance {
    struct kretprobe *rp;      /* the probe (see get_kretprobe()) */
    kprobe_opcode_t *ret_addr; /* the real return address */
    int task;                  /* the thread id (gettid()) of the call */
    void *fp;                  /* where the return address is on the stack */
    char data[];               /* rp->data_size bytes */
};

static inline struct kretprobe *get_kretprobe(struct kretprobe_instance *ri) { return ri->rp; }

/* The function's return value, in a return handler (rax on x86-64). */
#define regs_return_value(regs) ((regs)->ax)

int register_kretprobe(struct kretprobe *rp);
void unregister_kretprobe(struct kretprobe *rp);
int register_kretprobes(struct kretprobe **rps, int num);
void unregister_kretprobes(struct kretprobe **rps, int num);
int disable_kretprobe(struct kretprobe *rp);
int enable_kretprobe(struct kretprobe *rp);

/*
 * Jprobes (kprobes.txt, "Jprobe"), removed from the kernel in 4.15 but kept here: the
 * handler entry has the probed function's prototype, runs on entry with the same
 * arguments (registers, and a copy of the top of the stack restored afterwards), and
 * must end with jprobe_return(); the function then runs with its original arguments.
 */
struct jprobe {
    struct kprobe kp;
    void *entry; /* the handler: same prototype as the probed function */
};

#define JPROBE_ENTRY(pentry) ((void *)(pentry))

int register_jprobe(struct jprobe *jp);
void unregister_jprobe(struct jprobe *jp);
int register_jprobes(struct jprobe **jps, int num);
void unregister_jprobes(struct jprobe **jps, int num);
/* Ends a jprobe handler: never returns to its caller. */
void jprobe_return(void) __attribute__((noreturn));

/*
 * NOKPROBE_SYMBOL(fn): puts a function of the program on the blacklist, so that no
 * probe can be registered inside it (register_kprobe() returns -EINVAL). Use at file
 * scope, after the function's definition, as in the kernel.
 */
struct ukp_blacklist_entry {
    const void *addr;
    const char *name;
};
void ukp_blacklist_add(const void *addr, const char *name);
#define NOKPROBE_SYMBOL(fname)                                                                                         \
    __attribute__((constructor)) static void __ukp_nokprobe_##fname(void) {                                            \
        ukp_blacklist_add((const void *)&(fname), #fname);                                                             \
    }

/*
 * Introspection, as the kernel's debugfs files.
 * ukp_kprobes_list(): the text of kprobes/list, one line per registered probe:
 *   "ADDRESS  TYPE  SYM+0xOFF  OBJECT [GONE][DISABLED][OPTIMIZED]". Returns a
 *   malloc()ed string the caller frees, or NULL with errno set.
 * ukp_kprobes_enabled()/ukp_set_kprobes_enabled(): kprobes/enabled. Turning it
 *   off disarms every probe; turning it on re-arms every probe not disabled on its own.
 */
char *ukp_kprobes_list(void);

/*
 * What the child of a fork() does with the probes. UKP_FORK_KEEP (the default): the
 * child keeps every probe armed, with the same handlers, as the code it inherited.
 * UKP_FORK_REMOVE: at fork, the child's code is restored and no handler runs in it (its
 * probes are left registered, disarmed, as with ukp_set_kprobes_enabled(0)). A vfork()
 * child shares the parent's memory and is never changed. Returns 0 or -EINVAL.
 */
/*
 * Compares the executable code of every loaded object with its file on disk and counts
 * the bytes that differ, leaving out the bytes of armed probes (their int3). 0 means the
 * code is exactly what the files say, probes aside. If report is not NULL, *report gets
 * a malloc()ed text, one line per differing run: "ADDRESS  OBJECT+0xOFFSET  n bytes".
 * Returns the count, or a negative errno.
 */
int ukp_verify(char **report);

#define UKP_FORK_KEEP 0
#define UKP_FORK_REMOVE 1
int ukp_set_fork_policy(int policy);
int ukp_kprobes_enabled(void);
int ukp_set_kprobes_enabled(int on);

/*
 * Jump optimization, the kernel's debug.kprobes_optimization sysctl. On by default
 * (UKP_KPROBES_OPTIMIZATION=0 in the environment starts with it off); when on, a
 * background optimizer replaces the int3 of a probe point with a 5-byte jmp to a detour
 * when the point's probes have no post_handler and no jprobe, all are enabled, no other
 * probe lies in the replaced region and the region passes the safety checks; kprobes/list
 * shows such probes [OPTIMIZED]. ukp_set_kprobes_optimization(0) puts every int3 back
 * before it returns; (1) lets the optimizer at them again. Returns 0 or -errno.
 * ukp_optimizer_flush() returns once the optimizer has been through the work queued
 * before the call.
 */
int ukp_set_kprobes_optimization(int on);
int ukp_kprobes_optimization(void);
void ukp_optimizer_flush(void);

/*
 * Which paths run without saving the vector state (x87, SSE, AVX registers and MXCSR):
 * UKP_LEAN_KPROBE, the jump path (the detour of an optimized probe);
 * UKP_LEAN_KRETPROBE, the return trampoline of a kretprobe. A path is lean when the
 * scan, a decode of its dispatcher's code at start, proved the dispatcher lean (not in
 * builds with the sanitizers, whose checks call out through the PLT). On a lean path, a
 * handler the scan proves lean at registration (no vector or x87 instruction, no
 * indirect call, in all the code it can reach) runs as it is; any other handler runs
 * with the state saved around it, as on the other paths. Returns the bits, or a
 * negative errno if the agent could not start.
 */
#define UKP_LEAN_KPROBE 1
#define UKP_LEAN_KRETPROBE 2
int ukp_lean_dispatch(void);

#ifdef __cplusplus
}
#endif

#endif /* UKPROBES_KPROBES_H */
