// What trampolines.S reads of the core's structures, generated at build time as the
// kernel's asm-offsets.c does: this file is compiled to assembly only (never linked), each
// DEFINE leaving a line `->NAME VALUE` in it, which cmake/asm_offsets.cmake turns into
// core/asm_offsets.h in the build tree, the header trampolines.S includes. No offset is
// kept by hand: a change of a layout changes the header.
#include "core/core.hpp"
#include "core/kretprobe.hpp"

#include <bit>
#include <cstddef>

#define DEFINE(sym, val) asm volatile("\n.ascii \"->" #sym " %c0\"" : : "i"(val))

namespace ukp::core {

// What the assembly assumes beyond single offsets.
static_assert(offsetof(ThreadState, quiet) == offsetof(ThreadState, depth) + 4,
              "depth and quiet are one 8-byte word, 0 when both are");
static_assert(offsetof(ReaderCell, word) == 0);
static_assert(sizeof(std::atomic<int>) == 4 && sizeof(std::atomic<uint32_t>) == 4 &&
              sizeof(std::atomic<uint64_t>) == 8 && sizeof(std::atomic<void *>) == 8 && sizeof(std::atomic<bool>) == 1);
static_assert(sizeof(RetPool::Shard) == 64 && offsetof(RetPool::Shard, free_head) == 0);
static_assert(RetPool::kShards < 65536);
static_assert(std::has_single_bit(arch::kRetStubSize), "a stub is found by a shift");

void asm_offsets() {
    // struct ThreadState (core.hpp), reached through %fs.
    DEFINE(UKP_TS_DEPTH, offsetof(ThreadState, depth)); // int depth, then int quiet: one word
    DEFINE(UKP_TS_READER, offsetof(ThreadState, reader));
    DEFINE(UKP_TS_FAST_FRAME, offsetof(ThreadState, fast_frame));

    // struct ReaderCell (core.hpp): the thread's spare return-probe instance.
    DEFINE(UKP_SLOT_SPARE, offsetof(ReaderCell, spare));
    DEFINE(UKP_SLOT_SPARE_POOL, offsetof(ReaderCell, spare_pool));
    DEFINE(UKP_SLOT_SPARE_LOCK, offsetof(ReaderCell, spare_lock));
    // A reader cell's word: the depth of its read sections in the low bits, the count of
    // its outermost sections above (hit.cpp, "grace periods").
    DEFINE(UKP_SECTION_DEPTH_MASK, kSectionDepthMask);
    DEFINE(UKP_SECTION_NEW, kSectionOne + 1); // one more outermost section, at depth 1

    // struct Point, struct ProbeList (core.hpp).
    DEFINE(UKP_PT_ADDR, offsetof(Point, addr));
    DEFINE(UKP_PT_LIST, offsetof(Point, list));
    DEFINE(UKP_PT_COPY, offsetof(Point, region_copy));
    DEFINE(UKP_PT_KRET_BACK, offsetof(Point, kret_back));
    DEFINE(UKP_LIST_FAST, offsetof(ProbeList, fast));
    DEFINE(UKP_LIST_KRET_POOL, offsetof(ProbeList, kret_pool));
    DEFINE(UKP_LIST_PROBE0, offsetof(ProbeList, probes));
    DEFINE(UKP_FAST_NONE, kFastNone);
    DEFINE(UKP_FAST_GUARDED, kFastGuarded);
    DEFINE(UKP_FAST_OWN, kFastOwn);

    // struct kprobe (ukprobes/kprobes.h).
    DEFINE(UKP_KP_PRE_HANDLER, offsetof(kprobe, pre_handler));
    DEFINE(UKP_KP_FLAGS, offsetof(kprobe, flags));
    DEFINE(UKP_KP_OFF_FLAGS, KPROBE_FLAG_GONE | KPROBE_FLAG_DISABLED);

    // The return path (kretprobe.hpp): struct RetInstance as a stub's literal (the address
    // of its pub.ret_addr) finds it, its pool, its thread's list.
    DEFINE(UKP_RI_NEXT, offsetof(RetInstance, next));
    DEFINE(UKP_RI_POOL, offsetof(RetInstance, pool));
    DEFINE(UKP_RI_INDEX, offsetof(RetInstance, index));
    DEFINE(UKP_RI_SHARD, offsetof(RetInstance, shard));
    DEFINE(UKP_RI_CALLED, offsetof(RetInstance, called));
    DEFINE(UKP_RI_STATE, offsetof(RetInstance, state));
    DEFINE(UKP_RI_NEXT_FREE, offsetof(RetInstance, next_free));
    DEFINE(UKP_RI_PUB, offsetof(RetInstance, pub));
    DEFINE(UKP_RI_RET_ADDR, offsetof(RetInstance, pub) + offsetof(kretprobe_instance, ret_addr));
    DEFINE(UKP_RI_TASK, offsetof(RetInstance, pub) + offsetof(kretprobe_instance, task));
    DEFINE(UKP_RI_FP, offsetof(RetInstance, pub) + offsetof(kretprobe_instance, fp));
    DEFINE(UKP_RI_FREE, RetInstance::kFree);
    DEFINE(UKP_RI_LIVE, RetInstance::kLive);
    DEFINE(UKP_POOL_RP, offsetof(RetPool, rp));
    DEFINE(UKP_POOL_STRIDE, offsetof(RetPool, stride));
    DEFINE(UKP_POOL_MEM, offsetof(RetPool, mem));
    DEFINE(UKP_POOL_SLED, offsetof(RetPool, sled));
    DEFINE(UKP_POOL_HANDLER_GPR, offsetof(RetPool, handler_gpr_only));
    DEFINE(UKP_POOL_HANDLER_OWN, offsetof(RetPool, handler_own));
    DEFINE(UKP_POOL_NO_SPARES, offsetof(RetPool, no_spares));
    DEFINE(UKP_POOL_HANDLER, offsetof(RetPool, handler));
    DEFINE(UKP_POOL_SHARDS, offsetof(RetPool, shards));           // 64 bytes each, free_head first
    DEFINE(UKP_STUB_SHIFT, std::countr_zero(arch::kRetStubSize)); // log2 of a stub's size
    DEFINE(UKP_STUB_CALL, arch::kRetStubCall);

    // struct RetThread (kretprobe.hpp), the thread's return-probe state, through %fs.
    DEFINE(UKP_RT_HEAD, offsetof(RetThread, head));
    DEFINE(UKP_RT_TID, offsetof(RetThread, tid));
    DEFINE(UKP_RT_HOME, offsetof(RetThread, home));
    DEFINE(UKP_RT_HOOKED, offsetof(RetThread, exit_hooked));
}

} // namespace ukp::core
