/*
 * <ukprobes/hw_breakpoint.h> - the kernel's hardware breakpoint API (<linux/hw_breakpoint.h>,
 * samples/hw_breakpoint/data_breakpoint.c) for ordinary user-space processes: a handler
 * that runs when the program reads, writes or executes an address, without stopping it.
 *
 * The names, structures and error values are the kernel's, with two differences a user
 * space process imposes:
 *   - register_user_hw_breakpoint() takes a thread id (gettid(); 0: the calling thread)
 *     where the kernel takes a struct task_struct *;
 *   - register_wide_hw_breakpoint() covers every thread of this process (those started
 *     later too) where the kernel's covers every CPU. Its handle is a pointer to the
 *     event: `*handle` is the struct perf_event.
 * Registration functions return an event pointer, or an error encoded as the kernel does
 * (IS_ERR(), PTR_ERR(): -EINVAL for a bad address, length, alignment or type; -ENOSPC when
 * a thread has no free debug register left, the program's own breakpoints or a debugger's
 * watchpoints holding them; -EOPNOTSUPP on a kernel without synchronous perf signals;
 * -ENODEV on a machine whose breakpoints are never hit, a guest without debug registers
 * behind its breakpoint PMU; -ENOMEM).
 *
 * Each breakpoint is a perf event of the thread (PERF_TYPE_BREAKPOINT, with synchronous
 * SIGTRAP delivery, Linux 5.13 or later; no privilege needed): the handler runs in the
 * thread that made the access, in the agent's SIGTRAP handler, after the access (data) or
 * before the instruction (execute). docs/reference.md, "Hardware breakpoints", has the
 * rules: limits, fork and exec, what a handler may do.
 *
 * This header is C-compatible and includes <ukprobes/kprobes.h> for struct pt_regs.
 */
#ifndef UKPROBES_HW_BREAKPOINT_H
#define UKPROBES_HW_BREAKPOINT_H

#include <ukprobes/kprobes.h>

#include <errno.h>
#include <linux/hw_breakpoint.h>
#include <linux/perf_event.h>
#include <string.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The kernel's annotations for per-CPU and forced pointers: nothing in user space. */
#ifndef __percpu
#define __percpu
#endif
#ifndef __force
#define __force
#endif

/* The kernel's error pointers (<linux/err.h>). */
#define MAX_ERRNO 4095
#ifndef IS_ERR_VALUE
#define IS_ERR_VALUE(x) ((unsigned long)(void *)(x) >= (unsigned long)-MAX_ERRNO)
#endif
static inline void *ERR_PTR(long error) { return (void *)error; }
static inline long PTR_ERR(const void *ptr) { return (long)ptr; }
static inline int IS_ERR(const void *ptr) { return IS_ERR_VALUE((unsigned long)ptr); }
static inline int IS_ERR_OR_NULL(const void *ptr) { return !ptr || IS_ERR_VALUE((unsigned long)ptr); }

struct perf_event;

/* What a hit carries besides the registers: the breakpoint's address. */
struct perf_sample_data {
    unsigned long long addr; /* attr.bp_addr of the breakpoint that fired */
    unsigned long long period;
};

/*
 * Called in the thread that made the access, with its registers: for a data breakpoint
 * after the instruction ran (regs->ip is the next one), for an execute breakpoint before
 * it. Changes to regs apply when the thread resumes. A hit inside a handler (of this
 * breakpoint, another one or a kprobe) does not call it again.
 */
typedef void (*perf_overflow_handler_t)(struct perf_event *bp, struct perf_sample_data *data, struct pt_regs *regs);

/*
 * A breakpoint, as the kernel's struct perf_event shows it to a handler: the attributes
 * it was registered (or last modified) with, and the context given at registration.
 */
struct perf_event {
    struct perf_event_attr attr;
    perf_overflow_handler_t overflow_handler;
    void *overflow_handler_context;
    pid_t tid; /* the thread, or 0 for a wide breakpoint */
    /* Hits whose handler did not run (inside another handler, or during the agent's own work). */
    unsigned long nmissed;
    struct perf_event *self; /* what a wide breakpoint's handle points to */
    void *ukp_private;       /* the agent's; do not touch */
};

/*
 * The kernel's hw_breakpoint_init(): a breakpoint attribute, pinned, calling its handler at
 * every hit, with nothing to watch yet (HW_BREAKPOINT_EMPTY): set bp_addr, bp_len and
 * bp_type.
 */
static inline void hw_breakpoint_init(struct perf_event_attr *attr) {
    memset(attr, 0, sizeof(*attr));
    attr->type = PERF_TYPE_BREAKPOINT;
    attr->size = sizeof(*attr);
    attr->pinned = 1;
    attr->sample_period = 1;
}

/* The kernel's ptrace_breakpoint_init(): the same, for user-space accesses only (all are). */
static inline void ptrace_breakpoint_init(struct perf_event_attr *attr) {
    hw_breakpoint_init(attr);
    attr->exclude_kernel = 1;
}

/*
 * A breakpoint on one thread (`tid`, 0 for the calling one). attr: PERF_TYPE_BREAKPOINT,
 * bp_type HW_BREAKPOINT_W or HW_BREAKPOINT_RW (data: bp_len 1, 2, 4 or 8, bp_addr aligned to
 * it; x86 has no read-only watch) or HW_BREAKPOINT_X (bp_len sizeof(long));
 * attr->disabled registers it disarmed.
 */
struct perf_event *register_user_hw_breakpoint(struct perf_event_attr *attr, perf_overflow_handler_t triggered,
                                               void *context, pid_t tid);

/*
 * A breakpoint on every thread of the process, those it starts later included. All or
 * nothing: should one thread refuse it (its debug registers taken), none keeps it.
 */
struct perf_event *__percpu *register_wide_hw_breakpoint(struct perf_event_attr *attr,
                                                         perf_overflow_handler_t triggered, void *context);

/*
 * Moves a breakpoint (either kind) to attr's address, length and type, or arms
 * (attr->disabled = 0) or disarms it. 0 or a negative errno; on error nothing changed.
 */
int modify_user_hw_breakpoint(struct perf_event *bp, struct perf_event_attr *attr);

/*
 * Removes it: once this returns, its handler runs nowhere and will not be called again,
 * and the struct is freed.
 */
void unregister_hw_breakpoint(struct perf_event *bp);
void unregister_wide_hw_breakpoint(struct perf_event *__percpu *cpu_events);

/* The number of debug registers a thread has for breakpoints of each kind (x86-64: 4). */
int hw_breakpoint_slots(int type);

/*
 * The address of a symbol of the process ("sym" or "MOD:sym", functions and data), as the
 * kernel's kallsyms_lookup_name(): 0 when there is none.
 */
unsigned long kallsyms_lookup_name(const char *name);

#ifdef __cplusplus
}
#endif

#endif /* UKPROBES_HW_BREAKPOINT_H */
