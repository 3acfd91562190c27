/* The optimized path's fast case, written in trampolines.S: where it finds what it reads
 * in the core's structures. Plain preprocessor constants, for the assembler; hit.cpp
 * checks each against the C++ layout (static_assert), so a change there fails the build.
 */
#pragma once

/* struct ThreadState (core.hpp), reached through %fs. */
#define UKP_TS_DEPTH 0          /* int depth, then int quiet: one 8-byte word, 0 when both are */
#define UKP_TS_READER 120       /* ReaderSlot *reader */
#define UKP_TS_FAST_FRAME 8     /* pt_regs *fast_frame */

/* struct Point */
#define UKP_PT_ADDR 0
#define UKP_PT_LIST 104         /* std::atomic<ProbeList *> list */

/* struct ProbeList */
#define UKP_LIST_FAST 25        /* uint8_t fast: one of the UKP_FAST_* below */
#define UKP_LIST_PROBE0 32      /* kprobe *probes[0] */
#define UKP_FAST_NONE 0         /* the C dispatcher decides */
#define UKP_FAST_GUARDED 1      /* one user probe: called under a recovery point */
#define UKP_FAST_OWN 2          /* one of the agent's own handlers: called as it is */

/* struct kprobe (ukprobes/kprobes.h) */
#define UKP_KP_PRE_HANDLER 32
#define UKP_KP_FLAGS 60
#define UKP_KP_OFF_FLAGS 0x3    /* KPROBE_FLAG_GONE | KPROBE_FLAG_DISABLED */

/* A reader slot's word: the depth of the thread's read sections in the low 16 bits, and
 * the count of its outermost sections above (hit.cpp, "grace periods"). The shared
 * counters' stand-in slot shows a depth that never ends, so that the fast path, which
 * begins a section only at depth 0, leaves those threads to the dispatcher. */
#define UKP_SECTION_DEPTH_MASK 0xffff
#define UKP_SECTION_NEW 0x10001 /* one more outermost section, at depth 1 */
