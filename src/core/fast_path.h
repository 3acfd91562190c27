/* The jump path's fast case, written in trampolines.S: where it finds what it reads
 * in the core's structures. Plain preprocessor constants, for the assembler; hit.cpp
 * checks each against the C++ layout (static_assert), so a change there fails the build.
 */
#pragma once

/* struct ThreadState (core.hpp), reached through %fs. */
#define UKP_TS_DEPTH 0          /* int depth, then int quiet: one 8-byte word, 0 when both are */
#define UKP_TS_READER 120       /* ReaderSlot *reader */
#define UKP_TS_FAST_FRAME 8     /* pt_regs *fast_frame */

/* struct ReaderSlot (core.hpp): the thread's spare return-probe instance (kretprobe.cpp). */
#define UKP_SLOT_SPARE 16       /* void *spare: a free RetInstance while spare_pool is set */
#define UKP_SLOT_SPARE_POOL 24  /* std::atomic<void *> spare_pool: its RetPool, or 0 */
#define UKP_SLOT_SPARE_LOCK 32  /* std::atomic<uint32_t> spare_lock: another thread handles it */

/* struct Point */
#define UKP_PT_ADDR 0
#define UKP_PT_LIST 104         /* std::atomic<ProbeList *> list */
#define UKP_PT_COPY 112         /* uint64_t copy_code: the detour's region copy */

/* struct ProbeList */
#define UKP_LIST_FAST 25        /* uint8_t fast: one of the UKP_FAST_* below */
#define UKP_LIST_KRET_POOL 32   /* void *kret_pool: a lone kretprobe's pool, without entry_handler */
#define UKP_LIST_PROBE0 40      /* kprobe *probes[0] */
#define UKP_FAST_NONE 0         /* the C dispatcher decides */
#define UKP_FAST_GUARDED 1      /* one user probe: called under a recovery point */
#define UKP_FAST_OWN 2          /* one of the agent's own handlers: called as it is */

/* struct kprobe (ukprobes/kprobes.h) */
#define UKP_KP_PRE_HANDLER 32
#define UKP_KP_FLAGS 60
#define UKP_KP_OFF_FLAGS 0x3    /* KPROBE_FLAG_GONE | KPROBE_FLAG_DISABLED */

/* A reader cell's word: the depth of the thread's read sections in the low 16 bits, and
 * the count of its outermost sections above (hit.cpp, "grace periods"). The shared
 * counters' stand-in reader cell shows a depth that never ends, so that the fast cases,
 * which begin a section only at depth 0, leave those threads to the dispatcher. */
#define UKP_SECTION_DEPTH_MASK 0xffff
#define UKP_SECTION_NEW 0x10001 /* one more outermost section, at depth 1 */

/* The return trampoline's fast case (kretprobe.hpp): struct RetInstance, as the stub's
 * literal (the address of its pub.ret_addr) finds it, its pool, and its kretprobe. */
#define UKP_RI_RET_ADDR 40      /* offsetof(RetInstance, pub) + offsetof(kretprobe_instance, ret_addr) */
#define UKP_RI_NEXT 0           /* RetInstance *next: the thread's list, most recent first */
#define UKP_RI_POOL 8
#define UKP_RI_INDEX 16
#define UKP_RI_SHARD 20         /* uint16_t shard */
#define UKP_RI_CALLED 22        /* bool called */
#define UKP_RI_STATE 24         /* std::atomic<int> state */
#define UKP_RI_NEXT_FREE 28
#define UKP_RI_PUB 32           /* kretprobe_instance pub: what handlers see */
#define UKP_RI_FP 56            /* pub.fp: where its return address was */
#define UKP_RI_FREE 0           /* RetInstance::kFree */
#define UKP_RI_LIVE 1           /* RetInstance::kLive */
#define UKP_POOL_RP 0           /* std::atomic<kretprobe *> rp: null once unregistered */
#define UKP_POOL_HANDLER_GPR 89 /* bool handler_gpr_only */
#define UKP_POOL_HANDLER_OWN 91 /* bool handler_own */
#define UKP_POOL_NO_SPARES 92   /* std::atomic<bool> no_spares: keep no spare of it */
#define UKP_POOL_HANDLER 96     /* kretprobe_handler_t handler: rp->handler */
#define UKP_POOL_SHARDS 128     /* Shard shards[], 64 bytes each: free_head first */
#define UKP_POOL_STRIDE 16      /* size_t stride: bytes per instance */
#define UKP_POOL_MEM 24         /* uint8_t *mem: the instances */
#define UKP_POOL_SLED 32        /* uint64_t sled: the stubs, 1 << UKP_STUB_SHIFT bytes each */
#define UKP_STUB_SHIFT 6        /* log2 of arch::kRetStubSize */
#define UKP_STUB_CALL 0         /* arch::kRetStubCall: where a kretprobe's detour sends a call */
#define UKP_RI_TASK 48          /* pub.task */

/* struct RetThread (kretprobe.cpp), the thread's return-probe state, through %fs. */
#define UKP_RT_HEAD 0           /* RetInstance *head: the instances in flight, newest first */
#define UKP_RT_TID 8            /* int tid, 0 until known */
#define UKP_RT_HOME 12          /* uint32_t home: 1 + the shard taken from first, 0 until chosen */
#define UKP_RT_HOOKED 16        /* bool exit_hooked */
