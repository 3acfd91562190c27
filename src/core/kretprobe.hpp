// Return-probe instances, shared by kretprobe.cpp and the unwinding hooks (unwind.cpp).
#pragma once

#include "core/core.hpp"

#include <atomic>
#include <cstdint>
#include <vector>

namespace ukp::core {

struct RetPool;
struct RetInstance;

// A thread's return-probe state (thread-local in kretprobe.cpp; trampolines.S reads it).
struct RetThread {
    RetInstance *head; // the instances in flight, newest first
    int tid;           // gettid(), 0 until asked (and again in the child of a fork)
    uint32_t home;     // 1 + the shard it takes instances from first, 0 until chosen
    bool exit_hooked;  // exit_hook will run at its exit
    // While ukp_optprobe_dispatch runs the handlers of a point with a kretprobe detour:
    // the point's region copy (else 0), and the instance a kretprobe took there, which
    // finish_kret_entry() sets up once every handler ran.
    uint64_t stub_call_copy;
    RetInstance *deferred;
};

// Named for the trampolines (kretprobe.cpp). __thread, not thread_local: read from other
// files with no call of a TLS init function (a call the lean scan cannot follow).
extern __attribute__((visibility("hidden"))) __thread RetThread t_ret __asm__("ukp_ret_thread")
    __attribute__((tls_model("initial-exec")));

// After ukp_optprobe_dispatch ran the handlers of a point with a kretprobe detour (with
// t_ret.stub_call_copy set before): the instance a kretprobe's entry took, if any, goes
// on the thread's list. Where the handlers left the thread on its way into the region
// copy with sp unmoved, its stub calls the function (regs->ip set to it, the copy's
// address 16 bytes below sp), so that the function's return is predicted, as through
// ukp_kret_entry_trampoline; else the return address is replaced, as on the other paths.
void finish_kret_entry(pt_regs *regs);

// One call in flight. Lives in its pool's array; `pub` is what handlers see and must
// stay last: rp->data_size bytes of ri->data follow it.
struct RetInstance {
    // kSuspect: taken for abandoned by a guess from frame addresses (unwound), but kept
    // out of the free list, so that its stub still leads to the right return address if
    // its frame returns after all (a stack the agent did not know about).
    enum State : int { kFree, kLive, kReturnedElsewhere, kSuspect };
    RetInstance *next = nullptr; // the owning thread's list, most recent first
    RetPool *pool = nullptr;
    uint32_t index = 0; // in the pool; its stub is the index-th of the sled
    uint16_t shard = 0; // pool->shard_of(index), kept: a division costs ns on the return path
    // Its stub called the probed function (ukp_kret_entry_trampoline) instead of taking its
    // return by a hijacked return address: the return trampoline leaves by `ret`.
    bool called = false;
    std::atomic<int> state{kFree};      // kReturnedElsewhere: its frame returned on another
                                        // thread; the owner releases it when it walks its list
    std::atomic<uint32_t> next_free{0}; // while free: index + 1 of the next in its shard's list
    kretprobe_instance pub{};
};

struct RetPool {
    std::atomic<kretprobe *> rp{nullptr}; // null once unregistered: no handler runs
    uint32_t count = 0;                   // maxactive
    size_t stride = 0;                    // bytes per instance, data included
    uint8_t *mem = nullptr;               // the instances
    uint64_t sled = 0;                    // count return stubs
    size_t sled_size = 0;
    std::vector<uint8_t> eh_frame;        // the sled's CIE and FDE, registered with libgcc
    void *unw_info = nullptr;             // the same, registered with libunwind if loaded
    alignas(8) int32_t unw_table[2] = {}; // its one-entry search table: {ip offset, FDE offset}
    // The lean handlers (core.hpp, handler_is_lean): called without saving the vector
    // state on the jump and return paths.
    bool entry_gpr_only = false;
    bool handler_gpr_only = false;
    // The handlers that are the agent's own (core.hpp, handler_is_own): called unguarded.
    bool entry_own = false;
    bool handler_own = false;
    // Set once a thread had to take a spare from another's reader cell (kretprobe.cpp,
    // "spare instances"): more threads share the pool than it has instances to spare, and
    // the return trampoline gives them back to the shards from then on.
    std::atomic<bool> no_spares{false};
    // rp->handler as registered: the return trampoline's fast case reads it here, a load
    // sooner than through rp.
    kretprobe_handler_t handler = nullptr;
    // The free instances, in shards: threads on different CPUs take and give back
    // instances without writing the same cache line (kretprobe.cpp, pool_pop). Each
    // instance belongs to one shard (a contiguous range of indexes) and goes back there.
    static constexpr uint32_t kShards = 8;
    struct alignas(64) Shard {
        std::atomic<uint64_t> free_head{0}; // lock-free list: (tag << 32) | (index + 1), 0 if empty
    };
    Shard shards[kShards];

    RetInstance *at(uint32_t i) { return reinterpret_cast<RetInstance *>(mem + i * stride); }
    uint32_t shard_of(uint32_t index) const { return static_cast<uint32_t>(uint64_t{index} * kShards / count); }
    // Instances not free: taken by a call, or released as unwound but kept (kSuspect). A
    // spare in a thread's reader cell is free.
    // Read by walking them all rather than counted on the hit path (two locked adds per
    // call); exact once no call can be taking one (the probe unregistered, a grace period
    // past), which is when the pool's reaper asks.
    int in_use() {
        int n = 0;
        for (uint32_t i = 0; i < count; ++i) n += at(i)->state.load(std::memory_order_acquire) != RetInstance::kFree;
        return n;
    }
};

// Releases, as unwound, this thread's instances whose frames lie below sp on sp's stack
// (the frame's return-address word is lower): called when those frames are known to be
// gone. sp == ~0 releases every instance of the thread (it is exiting).
void release_frames_below(uint64_t sp);

// Whether addr lies in a return stub (for taking stubs out of backtraces).
bool in_return_stub(uint64_t addr);

// Stacks other than the threads' own (unwind.cpp): coroutine stacks entered with
// swapcontext/setcontext, signal stacks set with sigaltstack. Frame addresses say which
// frame is deeper only within one stack, so the rules that release abandoned frames
// compare frames of the same stack only. Lock-free and async-signal-safe.
void note_stack(uint64_t lo, uint64_t size);
// 1 + the index of the known stack containing addr, or 0: a thread's own stack.
UKP_HOT uint32_t stack_of(uint64_t addr);

// jprobe.cpp
bool is_jprobe(const kprobe *p);

} // namespace ukp::core
