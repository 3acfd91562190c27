/*
 * data_breakpoint.c - the kernel's samples/hw_breakpoint/data_breakpoint.c, in user space.
 *
 * A module loaded into an unmodified program with LD_PRELOAD (module_init is its
 * constructor, module_exit its destructor) that says whenever the program writes a
 * variable, without stopping it:
 *
 *   LD_PRELOAD="libukprobes.so ./data_breakpoint.so" ./sample_target
 *   KSYM=MOD:variable LD_PRELOAD=... program
 *
 * $KSYM names the variable (the kernel module's ksym parameter; default: the sample
 * program's requests_served), found with kallsyms_lookup_name() among the program's and
 * its libraries' symbols. The breakpoint is wide: every thread of the program, those it
 * starts later too. The kernel's handler calls dump_stack(); a stack walk is not
 * async-signal-safe, so this one names the instruction after the write and the value
 * written instead, formatted with snprintf() and written with write(2).
 */
#include <ukprobes/hw_breakpoint.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static struct perf_event *__percpu *sample_hbp;
static const char *ksym_name = "requests_served";
static volatile unsigned long *watched;

static void say(const char *fmt, ...) {
    char buf[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n > 0) (void)!write(STDERR_FILENO, buf, n < (int)sizeof buf ? (size_t)n : sizeof buf - 1);
}

static void sample_hbp_handler(struct perf_event *bp, struct perf_sample_data *data, struct pt_regs *regs) {
    (void)bp;
    (void)data;
    say("%s value is changed: %lu, written before ip %#lx\n", ksym_name, *watched, regs->ip);
}

__attribute__((constructor)) static void hw_break_module_init(void) {
    const char *name = getenv("KSYM");
    struct perf_event_attr attr;

    if (name && *name) ksym_name = name;
    unsigned long addr = kallsyms_lookup_name(ksym_name);
    if (!addr) {
        say("Breakpoint registration failed: no symbol %s\n", ksym_name);
        return;
    }
    watched = (volatile unsigned long *)addr;

    hw_breakpoint_init(&attr);
    attr.bp_addr = addr;
    attr.bp_len = HW_BREAKPOINT_LEN_4;
    attr.bp_type = HW_BREAKPOINT_W;

    sample_hbp = register_wide_hw_breakpoint(&attr, sample_hbp_handler, NULL);
    if (IS_ERR((void __force *)sample_hbp)) {
        say("Breakpoint registration failed: %ld\n", PTR_ERR((void __force *)sample_hbp));
        sample_hbp = NULL;
        return;
    }
    say("HW Breakpoint for %s write installed\n", ksym_name);
}

__attribute__((destructor)) static void hw_break_module_exit(void) {
    if (!sample_hbp) return;
    unregister_wide_hw_breakpoint(sample_hbp);
    say("HW Breakpoint for %s write uninstalled\n", ksym_name);
}
