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
}
