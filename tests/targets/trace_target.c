#include "trace_target.h"

struct ttarget_rec ttarget_second = {
    7, 0x01, 1, 0x1111, 99, "beta", {"b1", "b2", "b3"}, {'a', 'b', 'c', 'd'}, 0,
};
struct ttarget_rec ttarget_first = {
    -5, 0xb5, 200, 0xbeef, -1234567890123LL, "alpha", {"one", "two", "three"}, {'w', 'x', 'y', 'z'}, &ttarget_second,
};
const char ttarget_greeting[] = "hello";
long ttarget_counter = 4242;
/* In .probes, as SystemTap's SDT semaphores: file-backed data, not .bss. */
unsigned short ttarget_semaphore __attribute__((used, section(".probes"))) = 0;

__attribute__((noinline, used)) long ttarget_triple(long x) {
    __asm__ volatile("" ::: "memory");
    return x * 3;
}

__attribute__((noinline, used)) long ttarget_eight(long a1, long a2, long a3, long a4, long a5, long a6, long a7,
                                                   long a8) {
    __asm__ volatile("" ::: "memory");
    return a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8;
}

__attribute__((noinline, used)) long ttarget_record(struct ttarget_rec *r, const char *s, int c, unsigned long u) {
    __asm__ volatile("" ::: "memory");
    return r->neg + (s != 0) + c + (long)u;
}

__attribute__((noinline, used)) long ttarget_pointer(const char *s) {
    __asm__ volatile("" ::: "memory");
    return (long)(s != 0);
}
