// Declarations for opt_functions.S.
#pragma once
extern "C" {
long ukpt_opt_red_zone(long x);
long ukpt_opt_read(int fd, void *buf, long n);
long ukpt_opt_work(long x);
long ukpt_opt_inner(long x);
void ukpt_opt_vectors(const void *in, void *out);
long ukpt_opt_flags(long a, long b);
long ukpt_opt_flags_down(long a, long b);
long ukpt_opt_reentry(long n, long started);
void ukpt_opt_regs(const long in[16]);
void ukpt_opt_regs_probe();
extern char ukpt_opt_regs_return[];
void ukpt_on_stack(void (*fn)(const long *), const long *arg, void *sp);
extern long ukpt_regs_seen[16], ukpt_regs_after[16];
}
