/* Functions and data with known values, for the tracer's tests to probe. */
#ifndef UKP_TRACE_TARGET_H
#define UKP_TRACE_TARGET_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct ttarget_rec {
    int32_t neg;              /* -5 */
    uint8_t flags;            /* 0xb5: bits 2..4 hold 5 */
    uint8_t small;            /* 200 */
    uint16_t word;            /* 0xbeef */
    int64_t big;              /* -1234567890123 */
    const char *name;         /* "alpha" */
    const char *names[3];     /* "one", "two", "three" */
    char letters[4];          /* "wxyz" (no NUL) */
    struct ttarget_rec *next; /* points to ttarget_second */
};

extern struct ttarget_rec ttarget_first;
extern struct ttarget_rec ttarget_second;
extern const char ttarget_greeting[];    /* "hello" */
extern long ttarget_counter;             /* 4242 */
extern unsigned short ttarget_semaphore; /* an SDT-style semaphore: 0 until a tracer attaches */

/* Returns its argument times 3. */
long ttarget_triple(long x);
/* Returns the sum of its eight arguments (two of them on the stack). */
long ttarget_eight(long a1, long a2, long a3, long a4, long a5, long a6, long a7, long a8);
/* Reads r->neg and returns it. */
long ttarget_record(struct ttarget_rec *r, const char *s, int c, unsigned long u);
/* Returns the length of s (s may be a bad pointer: it is not read). */
long ttarget_pointer(const char *s);

#ifdef __cplusplus
}
#endif

#endif
