// Return probes (kprobes.rst, "Return Probes").
//
// On entry the return address is saved in an instance and replaced by the address of
// that instance's stub in its pool's sled; the stub jumps to the return trampoline, which
// runs the handler and resumes at the real return address. On the jump path (a kretprobe
// alone on its entry) the stub calls the function instead, which puts the same address
// in the same place and keeps the CPU's return predictions right (trampolines.S). The
// stub tells which instance returned, so pairing needs no search; DWARF CFI registered
// for the sled (with libgcc, libunwind, and debuggers through GDB's JIT interface) lets
// unwinders (C++ exceptions, backtraces, gdb's bt) walk through a hijacked frame to its
// real caller. Frames left without returning (exceptions, longjmp, thread exit) release their
// instances as soon as that is known (unwind.cpp), and at the latest when a frame below
// them on the stack returns.
#include "core/core.hpp"

#include "arch/x86_64/trampoline.hpp"
#include "core/jit_debug.hpp"
#include "core/kretprobe.hpp"
#include "platform/agent_heap.hpp"
#include "text/text.hpp"

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <initializer_list>
#include <mutex>
#include <new>
#include <pthread.h>
#include <sched.h>
#include <string>
#include <sys/syscall.h>
#include <unistd.h>
#include <vector>

extern "C" {
// libgcc's registry of run-time DWARF unwind information (as JIT compilers use it).
void __register_frame(void *begin);
void __deregister_frame(void *begin);
}

namespace ukp::core {

// The thread's return-probe state (kretprobe.hpp). Named for the trampolines
// (trampolines.S), which read and update it in their fast cases: external, hidden.
__attribute__((visibility("hidden"))) __thread RetThread t_ret __asm__("ukp_ret_thread")
    __attribute__((tls_model("initial-exec")));

namespace {

// This thread's kSuspect instances: released by the thread's exit, or by a longjmp or a
// caught exception past them, or returned to after all.
thread_local RetInstance *t_suspect_head __attribute__((tls_model("initial-exec")));

pthread_key_t g_exit_key;
std::once_flag g_exit_key_once;
void exit_hook(void *);
void create_exit_key() {
    std::call_once(g_exit_key_once, [] { pthread_key_create(&g_exit_key, exit_hook); });
}
// At load, before the program's constructors take keys: glibc keeps the values of the
// first 32 keys in the thread descriptor, so the first pthread_setspecific of a thread,
// on its first kretprobe hit, allocates nothing.
__attribute__((constructor(101))) void create_exit_key_early() { create_exit_key(); }
std::mutex g_pools_mutex;
// Unregistered pools, waiting for their last instance.
std::vector<RetPool *> &dead_pools() {
    static auto *value = new std::vector<RetPool *>(); // never destroyed: probes outlive static destructors
    return *value;
}

// Sled ranges, for filtering stubs out of backtraces: append-only, read without a lock.
constexpr size_t kMaxSleds = 4096;
uint64_t g_sled_start[kMaxSleds], g_sled_end[kMaxSleds];
std::atomic<size_t> g_sled_count{0};

uint64_t stub_entry(const RetPool *pool, uint32_t index) {
    return pool->sled + index * arch::kRetStubSize + arch::kRetStubEntry;
}

// The shard a thread takes instances from first: spread over the threads in the order
// they first hit a kretprobe.
uint32_t home_shard() {
    static std::atomic<uint32_t> next{0};
    if (t_ret.home == 0) t_ret.home = 1 + next.fetch_add(1, std::memory_order_relaxed) % RetPool::kShards;
    return t_ret.home - 1;
}

RetInstance *shard_pop(RetPool *pool, RetPool::Shard &sh) {
    uint64_t head = sh.free_head.load(std::memory_order_acquire);
    for (;;) {
        const auto top = static_cast<uint32_t>(head);
        if (top == 0) return nullptr;
        const uint32_t next = pool->at(top - 1)->next_free.load(std::memory_order_relaxed);
        // The tag in the high half changes on every update, so a stale `next` (the top
        // was popped and pushed back meanwhile) makes the exchange fail.
        const uint64_t desired = ((head >> 32) + 1) << 32 | next;
        if (sh.free_head.compare_exchange_weak(head, desired, std::memory_order_acq_rel)) break;
    }
    RetInstance *ri = pool->at(static_cast<uint32_t>(head) - 1);
    ri->state.store(RetInstance::kLive, std::memory_order_relaxed);
    return ri;
}

void pool_push(RetInstance *ri) {
    RetPool *pool = ri->pool;
    RetPool::Shard &sh = pool->shards[ri->shard];
    ri->state.store(RetInstance::kFree, std::memory_order_relaxed);
    uint64_t head = sh.free_head.load(std::memory_order_relaxed);
    for (;;) {
        ri->next_free.store(static_cast<uint32_t>(head), std::memory_order_relaxed);
        const uint64_t desired = ((head >> 32) + 1) << 32 | (ri->index + 1);
        if (sh.free_head.compare_exchange_weak(head, desired, std::memory_order_acq_rel)) break;
    }
}

// ---- spare instances -----------------------------------------------------------------
//
// Taking an instance from a shard and giving it back are a locked instruction each,
// together about a fifth of an optimized kretprobe's cost. So the return trampoline's
// fast case keeps the instance it frees in the thread's reader cell (ReaderCell::spare)
// when the reader cell has none, and the entry trampoline's fast case takes it from there
// when it is of the probe's pool: plain loads and stores, inside the thread's read section.
//
// A spare is still free for every thread: maxactive keeps its meaning. A thread that finds
// every shard empty takes spares from other threads' reader cells before it counts a miss
// (steal_spares). It cannot stop the owner, so it uses the grace-period protocol: it locks
// the reader cell (spare_lock), has every running thread execute a memory barrier, and then
// reads the reader cell's section word. An owner's section begun before the barrier shows
// there (that reader cell is passed over: its owner may be taking the spare that very
// moment); one begun after it sees the lock, and leaves the spare alone. A section that
// ended before shows its stores to the reader cell. The barrier is a system call, on a hit
// that would otherwise miss; the pool then stops keeping spares (RetPool::no_spares), so
// that a pool shared by more threads than it has instances pays for it a few times, not at
// every call.
//
// The owner's own C path (kretprobe_pre) takes its spare too: inside its section, as the
// trampolines. Other threads touch a reader cell's spare only under its lock: a steal, the
// thread's exit (flush_own_spare), a dead pool's reaping (forget_spares).

// Locks the spare of reader cell `slot` against the other lockers; the owner's trampolines
// are kept off by the steal's protocol, not by this.
void lock_spare(ReaderCell &slot) {
    for (uint32_t free = 0; !slot.spare_lock.compare_exchange_weak(free, 1, std::memory_order_acquire); free = 0)
        sched_yield();
}

// Gives the spare of reader cell `slot` back to its shard, by a thread that may touch it
// (see above). The reader cell names the pool until the push is done: a reaper that finds
// it there waits for the lock before it frees the pool (forget_spares).
void give_spare_back(ReaderCell &slot) {
    pool_push(static_cast<RetInstance *>(slot.spare));
    slot.spare_pool.store(nullptr, std::memory_order_release);
}

// The calling thread's spare, if it is of pool (inside a read section, see above).
RetInstance *take_own_spare(RetPool *pool) {
    ReaderCell *own = own_cell();
    if (own == nullptr || own->spare_pool.load(std::memory_order_relaxed) != pool ||
        own->spare_lock.load(std::memory_order_relaxed) != 0)
        return nullptr;
    auto *ri = static_cast<RetInstance *>(own->spare);
    own->spare_pool.store(nullptr, std::memory_order_relaxed);
    return ri;
}

// Takes back every spare of pool from the other threads' reader cells it can, 64 of them
// and one barrier at a time until it has one; returns one of them (the rest go back to the
// shards), or null.
RetInstance *steal_spares(RetPool *pool) {
    size_t count = 0;
    ReaderCell *slots = claimed_cells(&count);
    const ReaderCell *own = own_cell();
    RetInstance *got = nullptr;
    for (size_t next = 0; next < count && got == nullptr;) {
        constexpr size_t kAtOnce = 64; // on the hit path's stack, which may be a small signal stack
        ReaderCell *locked[kAtOnce];
        size_t n = 0;
        for (; next < count && n < kAtOnce; ++next) {
            ReaderCell &slot = slots[next];
            uint32_t free = 0;
            if (&slot != own && slot.spare_pool.load(std::memory_order_relaxed) == pool &&
                slot.spare_lock.compare_exchange_strong(free, 1, std::memory_order_acquire))
                locked[n++] = &slot;
        }
        if (n == 0) break;
        pool->no_spares.store(true, std::memory_order_relaxed);
        const bool barrier = barrier_everywhere();
        for (size_t i = 0; i < n; ++i) {
            ReaderCell &slot = *locked[i];
            if (barrier && !cell_in_section(slot.word.load(std::memory_order_acquire)) &&
                slot.spare_pool.load(std::memory_order_acquire) == pool) {
                if (got == nullptr) {
                    got = static_cast<RetInstance *>(slot.spare);
                    slot.spare_pool.store(nullptr, std::memory_order_relaxed);
                } else {
                    give_spare_back(slot);
                }
            }
            slot.spare_lock.store(0, std::memory_order_release);
        }
    }
    return got;
}

// The calling thread's spare of pool, which a stealer had locked when take_own_spare()
// looked: the stealer passes over this thread's reader cell (it is inside a read section)
// or takes the spare, and unlocks within its one system call. Waits for that, not longer
// than some milliseconds (a stealer preempted meanwhile: the call then counts a miss).
RetInstance *take_own_spare_after_steal(RetPool *pool) {
    ReaderCell *own = own_cell();
    if (own == nullptr || own->spare_pool.load(std::memory_order_relaxed) != pool) return nullptr;
    for (unsigned spins = 0; own->spare_lock.load(std::memory_order_acquire) != 0; ++spins) {
        if (spins == (1u << 16)) return nullptr;
        __builtin_ia32_pause();
    }
    return take_own_spare(pool);
}

// At the thread's exit: its spare goes back to its shard.
void flush_own_spare() {
    ReaderCell *own = own_cell();
    if (own == nullptr || own->spare_pool.load(std::memory_order_relaxed) == nullptr) return;
    lock_spare(*own);
    if (own->spare_pool.load(std::memory_order_relaxed) != nullptr) give_spare_back(*own);
    own->spare_lock.store(0, std::memory_order_release);
}

// Before pool's memory goes: no reader cell may name it (a new pool could come at its
// address). No trampoline takes or keeps a spare of it any more (a grace period passed
// since its kretprobe was unregistered).
void forget_spares(const RetPool *pool) {
    size_t count = 0;
    ReaderCell *slots = claimed_cells(&count);
    for (size_t i = 0; i < count; ++i) {
        ReaderCell &slot = slots[i];
        if (slot.spare_pool.load(std::memory_order_relaxed) != pool) continue;
        lock_spare(slot);
        if (slot.spare_pool.load(std::memory_order_relaxed) == pool)
            slot.spare_pool.store(nullptr, std::memory_order_relaxed);
        slot.spare_lock.store(0, std::memory_order_release);
    }
}

// A free instance: the thread's spare, else from the thread's shard, else from the
// others in turn, else the other threads' spares (null only when all those were found
// empty: maxactive instances are live).
RetInstance *pool_pop(RetPool *pool) {
    if (RetInstance *ri = take_own_spare(pool)) {
        ri->state.store(RetInstance::kLive, std::memory_order_relaxed);
        return ri;
    }
    const uint32_t first = home_shard();
    for (uint32_t k = 0; k < RetPool::kShards; ++k)
        if (RetInstance *ri = shard_pop(pool, pool->shards[(first + k) % RetPool::kShards])) return ri;
    RetInstance *ri = nullptr;
    outside_gpr(false, [&] { ri = steal_spares(pool); }); // a system call: the vector state saved
    if (ri == nullptr) ri = take_own_spare_after_steal(pool);
    if (ri != nullptr) ri->state.store(RetInstance::kLive, std::memory_order_relaxed);
    return ri;
}

void count_unwound(RetInstance *ri) {
    // The user's struct may be gone after unregister: count only while it is ours.
    if (kretprobe *rp = ri->pool->rp.load(std::memory_order_acquire); rp != nullptr)
        __atomic_fetch_add(&rp->ukp_unwound, 1, __ATOMIC_RELAXED);
}

void exit_hook(void *) {
    // The thread is exiting: none of its probed frames will return.
    release_frames_below(~0ull);
    flush_own_spare();
}

void ensure_exit_hook() {
    if (t_ret.exit_hooked) return;
    t_ret.exit_hooked = true;
    outside_gpr(false, [] {
        const AgentWork quiet; // the agent's call, not the program's
        pthread_setspecific(g_exit_key, reinterpret_cast<void *>(1));
    });
}

// Puts ri's stub in place of the return address at ri->pub.fp (its ret_addr read from
// there) and ri on the thread's list; or gives ri back if the stack cannot be written.
void replace_return_address(RetInstance *ri) {
    const uint64_t stub = stub_entry(ri->pool, ri->index);
    if (ukp_safe_copy(ri->pub.fp, &stub, sizeof stub) != 0) {
        pool_push(ri);
        return;
    }
    ri->next = t_ret.head;
    t_ret.head = ri;
}

} // namespace

// A kretprobe's pre_handler. Named for ukp_kret_entry_trampoline (trampolines.S), which
// does its work in the usual case and recognizes a kretprobe by it: external, hidden.
__attribute__((visibility("hidden"))) int kretprobe_pre(kprobe *p, pt_regs *regs) __asm__("ukp_kretprobe_pre");

int kretprobe_pre(kprobe *p, pt_regs *regs) {
    auto *rp = reinterpret_cast<kretprobe *>(p); // kp is the first member
    auto *pool = static_cast<RetPool *>(rp->ukp_private);
    if (pool == nullptr) return 0;
    RetInstance *ri = pool_pop(pool);
    if (ri == nullptr) {
        __atomic_fetch_add(&rp->nmissed, 1, __ATOMIC_RELAXED);
        return 0;
    }
    auto *slot = reinterpret_cast<uint64_t *>(regs->sp);
    uint64_t ret;
    if (ukp_safe_copy(&ret, slot, sizeof ret) != 0) {
        pool_push(ri);
        return 0;
    }
    ri->pub.ret_addr = reinterpret_cast<kprobe_opcode_t *>(ret);
    ri->pub.task = current_tid();
    ri->pub.fp = slot;
    ri->called = false;
    if (rp->entry_handler != nullptr) {
        // Non-zero: leave this call alone. A fault: the same, and the instance goes back.
        if (call_guarded(p, reinterpret_cast<void *>(rp->entry_handler), &ri->pub, regs, pool->entry_gpr_only,
                         pool->entry_own) != 0) {
            pool_push(ri);
            return 0;
        }
    }
    ensure_exit_hook();
    if (t_ret.stub_call_copy != 0) {
        // The rest once the point's other handlers ran (finish_kret_entry). The newest of
        // the point's kretprobes waits, so that the returns come in the order they come
        // when each replaces the return address in turn: the last one's first.
        RetInstance *older = t_ret.deferred;
        t_ret.deferred = ri;
        if (older != nullptr) replace_return_address(older);
        return 0;
    }
    replace_return_address(ri);
    return 0;
}

void finish_kret_entry(pt_regs *regs) {
    const uint64_t copy = t_ret.stub_call_copy;
    t_ret.stub_call_copy = 0;
    RetInstance *ri = t_ret.deferred;
    if (ri == nullptr) return;
    t_ret.deferred = nullptr;
    auto *slot = static_cast<uint64_t *>(ri->pub.fp);
    // Read again: another kretprobe at the point may have replaced it since. This
    // instance's return then comes first, and it is the newest of the list.
    uint64_t ret;
    if (ukp_safe_copy(&ret, slot, sizeof ret) != 0) {
        pool_push(ri);
        return;
    }
    ri->pub.ret_addr = reinterpret_cast<kprobe_opcode_t *>(ret);
    if (regs->ip != copy || regs->sp != reinterpret_cast<uint64_t>(slot)) {
        replace_return_address(ri);
        return;
    }
    if (ukp_safe_copy(slot - 2, &copy, sizeof copy) != 0) {
        pool_push(ri);
        return;
    }
    ri->called = true;
    regs->ip = ri->pool->sled + ri->index * arch::kRetStubSize + arch::kRetStubCall;
    ri->next = t_ret.head;
    t_ret.head = ri;
}

namespace {

// kretprobe_pre reads the program's memory only through ukp_safe_copy: the hit path calls
// it as the agent's own (core.hpp, handler_is_own). Marked at load, before any probe.
__attribute__((constructor(101))) void mark_kretprobe_pre_own() {
    mark_own_handler(reinterpret_cast<const void *>(&kretprobe_pre));
}

// Takes ri out of this thread's list, releasing as unwound the instances whose frames must
// be gone: newer ones deeper on the stack (they never returned), and older ones at or below
// ri's frame (their frames were left, and ri's call reused the stack) - except the chain of
// older instances of the same call: several kretprobes on one function hijack the same
// return-address word, each saving the previous one's stub as its return address.
// Returns false if ri is not in this thread's list.
bool take_from_list(RetInstance *ri) {
    const auto *fp = static_cast<const char *>(ri->pub.fp);
    RetInstance **link = &t_ret.head;
    bool found = false;
    const RetInstance *chain = ri; // the newest instance of ri's call seen so far
    const uint32_t stack = stack_of(reinterpret_cast<uint64_t>(fp));
    while (*link != nullptr) {
        RetInstance *cur = *link;
        const auto *cur_fp = static_cast<const char *>(cur->pub.fp);
        if (cur == ri) {
            *link = cur->next;
            found = true;
            continue;
        }
        const bool returned_elsewhere = cur->state.load(std::memory_order_acquire) == RetInstance::kReturnedElsewhere;
        const bool same_call = found && cur_fp == fp &&
                               reinterpret_cast<uint64_t>(chain->pub.ret_addr) == stub_entry(cur->pool, cur->index);
        if (same_call) chain = cur;
        // Frames on another stack (a suspended coroutine, a signal stack) are not comparable.
        const bool comparable = stack_of(reinterpret_cast<uint64_t>(cur_fp)) == stack;
        const bool dead = comparable && (found ? (cur_fp < fp || (cur_fp == fp && !same_call)) : cur_fp < fp);
        if (returned_elsewhere) {
            *link = cur->next;
            pool_push(cur);
            continue;
        }
        if (dead) { // a guess: quarantined, not reused, in case its frame returns after all
            *link = cur->next;
            count_unwound(cur);
            cur->state.store(RetInstance::kSuspect, std::memory_order_release);
            cur->next = t_suspect_head;
            t_suspect_head = cur;
            continue;
        }
        // Below ri, the first frame above it is live, and so is everything older.
        if (found) break;
        link = &cur->next;
    }
    return found;
}

// Takes ri out of this thread's suspects; false if it is not there.
bool take_suspect(RetInstance *ri) {
    for (RetInstance **link = &t_suspect_head; *link != nullptr; link = &(*link)->next) {
        if (*link != ri) continue;
        *link = ri->next;
        return true;
    }
    return false;
}

// The frame of a suspect returned after all: it was not unwound.
void uncount_unwound(RetInstance *ri) {
    if (kretprobe *rp = ri->pool->rp.load(std::memory_order_acquire); rp != nullptr)
        __atomic_fetch_sub(&rp->ukp_unwound, 1, __ATOMIC_RELAXED);
}

// Writes the agent's complaint without allocating: "kretprobe BUG!: ..." as the kernel.
void report_bug(const RetInstance *ri, uint64_t sp) {
    char buf[256];
    size_t n = 0;
    const auto put = [&](const char *s) {
        while (*s != '\0' && n < sizeof buf) buf[n++] = *s++;
    };
    const auto hex = [&](uint64_t v) {
        put("0x");
        char digits[16];
        int k = 0;
        do {
            digits[k++] = "0123456789abcdef"[v & 15];
            v >>= 4;
        } while (v != 0);
        while (k > 0 && n < sizeof buf) buf[n++] = digits[--k];
    };
    put("ukprobes: kretprobe BUG!: Processing kretprobe instance ");
    hex(reinterpret_cast<uint64_t>(ri));
    put(" @ ");
    hex(sp);
    put(": the instance was not in flight; resuming at its last return address ");
    hex(reinterpret_cast<uint64_t>(ri->pub.ret_addr));
    put("\n");
    outside_gpr(false, [&] {
        const AgentWork quiet;
        (void)!write(STDERR_FILENO, buf, n);
    });
}

// libunwind's dynamic unwind-information registry (libunwind-dynamic.h of libunwind 1.6,
// Debian 12's), mirrored here
// so that the agent needs neither its headers nor its library: used when the program
// has libunwind loaded, whose unwinder does not read libgcc's registry.
struct UnwDynTableInfo {
    uint64_t name_ptr;
    uint64_t segbase;   // the search table's offsets are from here
    uint64_t table_len; // in 8-byte words
    const int32_t *table_data;
};
struct UnwDynInfo {
    UnwDynInfo *next, *prev;
    uint64_t start_ip, end_ip, gp;
    // UNW_INFO_FORMAT_REMOTE_TABLE = 2: an .eh_frame_hdr-style search table read through
    // the address space's accessors (local here); FORMAT_TABLE (1) means .debug_frame.
    int32_t format;
    int32_t pad;
    uint64_t load_offset; // ELF load offset (libunwind 1.6's layout; 0 here)
    union {
        UnwDynTableInfo ti;
        uint64_t space[8];
    } u;
};
using UnwRegisterFn = void (*)(UnwDynInfo *);
constexpr const char kStubName[] = "ukprobes_return_stub";

void register_with_libunwind(RetPool *pool, uint64_t fde_addr) {
    auto reg = reinterpret_cast<UnwRegisterFn>(dlsym(RTLD_DEFAULT, "_U_dyn_register"));
    if (reg == nullptr) return;
    auto *info = new (std::nothrow) UnwDynInfo{};
    if (info == nullptr) return;
    pool->unw_table[0] = 0; // the sled starts at segbase
    pool->unw_table[1] = static_cast<int32_t>(fde_addr - pool->sled);
    info->start_ip = pool->sled;
    info->end_ip = pool->sled + pool->count * arch::kRetStubSize;
    info->format = 2;
    info->u.ti = {reinterpret_cast<uint64_t>(kStubName), pool->sled, 1, pool->unw_table};
    reg(info);
    pool->unw_info = info;
}

void unregister_from_libunwind(RetPool *pool) {
    if (pool->unw_info == nullptr) return;
    if (auto cancel = reinterpret_cast<UnwRegisterFn>(dlsym(RTLD_DEFAULT, "_U_dyn_cancel")); cancel != nullptr)
        cancel(static_cast<UnwDynInfo *>(pool->unw_info));
    delete static_cast<UnwDynInfo *>(pool->unw_info);
    pool->unw_info = nullptr;
}

// Which unwinder a copy of the sled's unwind information is for.
enum class Unwinder { kLibgcc, kLibunwind };

// The sled's unwind information as an .eh_frame section; *fde_at receives the FDE's
// offset in it.
std::vector<uint8_t> sled_eh_frame(RetPool *pool, Unwinder unwinder, size_t *fde_at) {
    std::vector<uint8_t> out;
    const auto u8 = [&](uint8_t v) { out.push_back(v); };
    const auto u32 = [&](uint32_t v) {
        for (int i = 0; i < 4; ++i) u8(static_cast<uint8_t>(v >> (8 * i)));
    };
    const auto u64 = [&](uint64_t v) {
        for (int i = 0; i < 8; ++i) u8(static_cast<uint8_t>(v >> (8 * i)));
    };
    const auto pad = [&](size_t start) {
        while ((out.size() - start) % 8 != 4) u8(0); // DW_CFA_nop up to the next length word
    };
    const auto set_len = [&](size_t at) {
        const auto len = static_cast<uint32_t>(out.size() - at - 4);
        std::memcpy(out.data() + at, &len, 4);
    };
    // CIE: version 1, "zR", code align 1, data align -8, return address column 16,
    // FDE addresses as absolute 8-byte pointers.
    const size_t cie = out.size();
    u32(0);
    u32(0);
    for (uint8_t b : std::initializer_list<uint8_t>{1, 'z', 'R', 0, 1, 0x78, 16, 1, 0x00}) u8(b);
    pad(cie);
    set_len(cie);
    *fde_at = out.size();
    // FDE over the whole sled: at each stub the caller's sp is rsp itself (the function
    // has returned) and the return address is that instance's ret_addr. The CFA is put
    // 8 above sp, and sp given its own rule: unwinders identify a frame by its CFA, and
    // the stub's frame must not look like its caller's (libgcc asserts in phase 2 of an
    // exception when a frame without personality has the handler frame's identity).
    const size_t fde = out.size();
    u32(0);
    u32(static_cast<uint32_t>(out.size() - cie)); // CIE pointer: back to the CIE
    u64(pool->sled);
    u64(pool->count * arch::kRetStubSize);
    u8(0); // no augmentation data
    if (unwinder == Unwinder::kLibgcc) {
        // DW_CFA_def_cfa rsp, 8; DW_CFA_val_offset rsp, CFA + 1 * -8
        for (uint8_t b : std::initializer_list<uint8_t>{0x0c, 7, 8, 0x14, 7, 1}) u8(b);
    } else {
        // libunwind takes the caller's sp to be the CFA whatever the rules say, and has no
        // frame-identity check to trip: DW_CFA_def_cfa rsp, 0.
        for (uint8_t b : std::initializer_list<uint8_t>{0x0c, 7, 0}) u8(b);
    }
    // The CFA's offset from rsp at a stub's entry (and at its call): 8 more while the
    // return address or the literal is on the stack, before the call and after the push.
    const uint8_t cfa_offset = unwinder == Unwinder::kLibgcc ? 8 : 0;
    const auto row = [&](size_t advance, uint8_t offset) {
        u8(static_cast<uint8_t>(0x40 | advance)); // DW_CFA_advance_loc
        u8(0x0e);                                 // DW_CFA_def_cfa_offset
        u8(offset);
    };
    static_assert(arch::kRetStubCall == 0 && arch::kRetStubCalling < arch::kRetStubEntry &&
                  arch::kRetStubSize - arch::kRetStubPushed < 64); // one-byte DW_CFA_advance_loc
    for (uint32_t i = 0; i < pool->count; ++i) {
        if (i > 0) {
            row(arch::kRetStubSize - arch::kRetStubPushed, cfa_offset + 8);
        } else {
            u8(0x0e);
            u8(cfa_offset + 8);
        }
        // DW_CFA_val_expression(rip, {DW_OP_addr &ret_addr; DW_OP_deref})
        for (uint8_t b : std::initializer_list<uint8_t>{0x16, 16, 10, 0x03}) u8(b);
        u64(reinterpret_cast<uint64_t>(&pool->at(i)->pub.ret_addr));
        u8(0x06);
        row(arch::kRetStubCalling, cfa_offset);
        row(arch::kRetStubPushed - arch::kRetStubCalling, cfa_offset + 8);
    }
    pad(fde);
    set_len(fde);
    u32(0); // end of the section
    return out;
}

// Debuggers (GDB's JIT interface): the sled as code with a name for each stub and the
// same CFI, so that a debugger stopped below a hijacked frame walks on to its caller.
void register_with_debuggers(RetPool *pool, const kretprobe *rp) {
    std::string name = "ukp_kretprobe_stub";
    if (rp->kp.symbol_name != nullptr) name.append(".").append(rp->kp.symbol_name);
    std::vector<jit::CodeSymbol> symbols(pool->count);
    for (uint32_t i = 0; i < pool->count; ++i) symbols[i] = {i * arch::kRetStubSize, arch::kRetStubSize, name};
    jit::register_code(pool->sled, pool->count * arch::kRetStubSize, symbols, pool->eh_frame);
}

void free_pool(RetPool *pool) {
    if (!pool->eh_frame.empty()) jit::unregister_code(pool->sled);
    unregister_from_libunwind(pool);
    if (!pool->eh_frame.empty()) __deregister_frame(pool->eh_frame.data());
    text::free_code(pool->sled, pool->sled_size);
    platform::agent_free(pool->mem);
    delete pool;
}

RetPool *make_pool(kretprobe *rp) {
    int maxactive = rp->maxactive;
    if (maxactive <= 0) maxactive = std::max(10, 2 * static_cast<int>(sysconf(_SC_NPROCESSORS_CONF)));
    auto *pool = new (std::nothrow) RetPool;
    if (pool == nullptr) return nullptr;
    pool->count = static_cast<uint32_t>(maxactive);
    // A cache line or more each: threads write their instances at every hit.
    pool->stride = (sizeof(RetInstance) + rp->data_size + 63) & ~size_t{63};
    // (A large pool is a mapping of the agent's: platform/agent_heap.hpp.)
    pool->mem = static_cast<uint8_t *>(platform::agent_alloc(pool->count * pool->stride, 64));
    if (pool->mem != nullptr) std::memset(pool->mem, 0, pool->count * pool->stride);
    // The stubs, then a copy of their unwind information within 32-bit offsets of them
    // (for libunwind's search table): 22 bytes a stub plus headers.
    const size_t stubs = pool->count * arch::kRetStubSize;
    pool->sled_size = (stubs + pool->count * 32 + 128 + 4095) & ~size_t{4095};
    pool->sled = text::alloc_code(pool->sled_size);
    if (pool->mem == nullptr || pool->sled == 0) {
        free_pool(pool);
        return nullptr;
    }
    std::vector<uint8_t> code(pool->count * arch::kRetStubSize);
    for (uint32_t i = 0; i < pool->count; ++i) {
        RetInstance *ri = pool->at(i);
        new (ri) RetInstance{};
        ri->pool = pool;
        ri->pub.rp = rp; // for good: an instance serves one kretprobe
        ri->index = i;
        ri->shard = static_cast<uint16_t>(pool->shard_of(i));
        // Each shard's list in index order; its last instance ends it.
        const bool last = i + 1 == pool->count || pool->shard_of(i + 1) != pool->shard_of(i);
        ri->next_free.store(last ? 0 : i + 2, std::memory_order_relaxed);
        RetPool::Shard &sh = pool->shards[pool->shard_of(i)];
        if (sh.free_head.load(std::memory_order_relaxed) == 0) sh.free_head.store(i + 1, std::memory_order_relaxed);
        arch::emit_ret_stub(reinterpret_cast<uint64_t>(&ri->pub.ret_addr),
                            reinterpret_cast<uint64_t>(&ukp_kretprobe_trampoline), &code[i * arch::kRetStubSize]);
    }
    if (text::write(pool->sled, code.data(), code.size()) != 0) {
        free_pool(pool);
        return nullptr;
    }
    size_t fde_at = 0;
    pool->eh_frame = sled_eh_frame(pool, Unwinder::kLibgcc, &fde_at);
    __register_frame(pool->eh_frame.data());
    register_with_debuggers(pool, rp);
    const std::vector<uint8_t> for_libunwind = sled_eh_frame(pool, Unwinder::kLibunwind, &fde_at);
    const uint64_t frame_copy = pool->sled + stubs;
    if (stubs + for_libunwind.size() <= pool->sled_size &&
        text::write(frame_copy, for_libunwind.data(), for_libunwind.size()) == 0)
        register_with_libunwind(pool, frame_copy + fde_at);
    pool->rp.store(rp, std::memory_order_release);
    const size_t n = g_sled_count.load(std::memory_order_relaxed);
    if (n < kMaxSleds) {
        g_sled_start[n] = pool->sled;
        g_sled_end[n] = pool->sled + pool->count * arch::kRetStubSize;
        g_sled_count.store(n + 1, std::memory_order_release);
    }
    return pool;
}

// Frees the pools of unregistered kretprobes whose last instance came back.
void reap_dead_pools() {
    std::vector<RetPool *> ready;
    {
        std::lock_guard lock(g_pools_mutex);
        auto it = std::partition(dead_pools().begin(), dead_pools().end(), [](RetPool *p) { return p->in_use() != 0; });
        ready.assign(it, dead_pools().end());
        dead_pools().erase(it, dead_pools().end());
    }
    if (ready.empty()) return;
    // A trampoline that just released the last instance may still be reading its pool.
    if (!synchronize()) {
        std::lock_guard lock(g_pools_mutex);
        dead_pools().insert(dead_pools().end(), ready.begin(), ready.end());
        return;
    }
    for (RetPool *p : ready) {
        forget_spares(p);
        free_pool(p);
    }
}

} // namespace

int current_tid() {
    if (t_ret.tid == 0)
        outside_gpr(false, [] { // once per thread; the agent's call, not the program's
            const AgentWork quiet;
            t_ret.tid = static_cast<int>(syscall(SYS_gettid));
        });
    return t_ret.tid;
}

void forget_tid_after_fork() { t_ret.tid = 0; }

void spares_after_fork_child() {
    // Without membarrier here (grace_after_fork_child() could not register the child), no
    // thread has a reader cell of its own and no spare could be taken: all go back to the
    // shards. The child has one thread, this one.
    if (private_cells()) return;
    size_t count = 0;
    ReaderCell *slots = claimed_cells(&count);
    for (size_t i = 0; i < count; ++i) {
        ReaderCell &slot = slots[i];
        if (slot.spare_pool.load(std::memory_order_relaxed) != nullptr) give_spare_back(slot);
    }
}

void release_frames_below(uint64_t sp) {
    ThreadState &ts = thread_state();
    ++ts.depth; // a signal handler's probe hits must not touch the list meanwhile
    // In a read section: a reaper that found these instances in use waits for it before
    // it frees their pool (reap_dead_pools), so the pushes below never land in freed memory.
    const unsigned idx = read_lock();
    const bool all = sp == ~0ull;
    const uint32_t stack = all ? 0 : stack_of(sp);
    // Suspects are certainly gone now when they lie below sp (already counted unwound).
    for (RetInstance **link = &t_suspect_head; *link != nullptr;) {
        RetInstance *cur = *link;
        const auto cur_fp = reinterpret_cast<uint64_t>(cur->pub.fp);
        if (all || (cur_fp < sp && stack_of(cur_fp) == stack) ||
            cur->state.load(std::memory_order_acquire) == RetInstance::kReturnedElsewhere) {
            *link = cur->next;
            pool_push(cur);
        } else {
            link = &cur->next;
        }
    }
    RetInstance **link = &t_ret.head;
    while (*link != nullptr) {
        RetInstance *cur = *link;
        const auto cur_fp = reinterpret_cast<uint64_t>(cur->pub.fp);
        if (all || (cur_fp < sp && stack_of(cur_fp) == stack) ||
            cur->state.load(std::memory_order_acquire) == RetInstance::kReturnedElsewhere) {
            *link = cur->next;
            if (cur->state.load(std::memory_order_relaxed) == RetInstance::kLive) count_unwound(cur);
            pool_push(cur);
        } else {
            link = &cur->next;
        }
    }
    read_unlock(idx);
    --ts.depth;
}

bool in_return_stub(uint64_t addr) {
    const size_t n = g_sled_count.load(std::memory_order_acquire);
    for (size_t i = 0; i < n; ++i)
        if (addr >= g_sled_start[i] && addr < g_sled_end[i]) return true;
    return false;
}

void *kret_pool_without_entry_handler(const kprobe *p) {
    if (p->pre_handler != kretprobe_pre) return nullptr;
    const auto *rp = reinterpret_cast<const kretprobe *>(p);
    return rp->entry_handler == nullptr ? rp->ukp_private : nullptr;
}

char probe_type(const kprobe *p) {
    if (p->pre_handler == kretprobe_pre) return 'r';
    if (is_jprobe(p)) return 'j';
    return 'k';
}

} // namespace ukp::core

using namespace ukp::core;

// Called by ukp_kretprobe_trampoline when a probed function returned into a stub, and
// its fast case (trampolines.S) did not take the return. Without the vector state saved
// (ext_saved 0) when ukp_lean_return_path is set (see ukp_optprobe_dispatch in hit.cpp).
extern "C" __attribute__((used, visibility("hidden"))) void ukp_kretprobe_dispatch(uint64_t ret_addr_field,
                                                                                   pt_regs *regs, int ext_saved) {
    ThreadState &ts = thread_state();
    ++ts.depth;
    const unsigned idx = read_lock();
    // The stub pushed its literal: the address of its instance's pub.ret_addr.
    auto *ri = reinterpret_cast<RetInstance *>(ret_addr_field - offsetof(RetInstance, pub) -
                                               offsetof(kretprobe_instance, ret_addr));
    regs->ip = reinterpret_cast<uint64_t>(ri->pub.ret_addr);
    int expected = RetInstance::kLive;
    bool ours = take_from_list(ri);
    bool in_flight = ours || ri->state.compare_exchange_strong(expected, RetInstance::kReturnedElsewhere);
    if (!in_flight && expected == RetInstance::kSuspect) {
        // Taken for abandoned, wrongly: its frame was alive on a stack we did not know.
        ours = take_suspect(ri);
        in_flight = ours || ri->state.compare_exchange_strong(expected, RetInstance::kReturnedElsewhere);
        if (in_flight) uncount_unwound(ri);
    }
    if (!in_flight) {
        // Not in flight any more: the frame returned twice, or was released as unwound.
        report_bug(ri, regs->sp);
    } else {
        kretprobe *rp = ri->pool->rp.load(std::memory_order_acquire);
        if (rp != nullptr && rp->handler != nullptr && !g_handlers_silenced.load(std::memory_order_relaxed)) {
            call_guarded(&rp->kp, reinterpret_cast<void *>(rp->handler), &ri->pub, regs,
                         ext_saved != 0 || ri->pool->handler_gpr_only, ri->pool->handler_own);
        }
        // Another thread's instance (its stack moved here) goes back when that thread
        // next walks its list; ours goes back now.
        if (ours) pool_push(ri);
    }
    read_unlock(idx);
    --ts.depth;
}

// Where ukp_kretprobe_trampoline's fast case goes when the return handler it called
// faulted (on_fault, then ukp_optprobe_fast_recovery): the thread is inside its read
// section at depth 1, ri already out of its list. As ukp_kretprobe_dispatch after a
// guarded call that came back with -1: the miss is counted, the instance goes back, then
// the depth and the section end. With the vector state saved.
extern "C" __attribute__((used, visibility("hidden"))) void ukp_kretprobe_fast_fault(RetInstance *ri) {
    if (kretprobe *rp = ri->pool->rp.load(std::memory_order_acquire); rp != nullptr) count_missed(&rp->kp);
    pool_push(ri);
    --thread_state().depth;
    read_unlock_own_cell();
}

extern "C" {

int register_kretprobe(struct kretprobe *rp) {
    if (rp == nullptr || rp->data_size > (1u << 20)) return -EINVAL;
    optimizer_start(); // never under the registry mutex
    if (is_registered(&rp->kp)) return -EINVAL;
    uint64_t addr = 0;
    bool entry = false;
    const int resolved = resolve_probe(&rp->kp, &addr, &entry);
    // On an object not loaded yet, as a kprobe: armed when it loads, if the symbol is a
    // function's first instruction there (registry.cpp checks it then).
    const bool waiting = resolved == -ENOENT && rp->kp.offset == 0 && waits_for_object(&rp->kp);
    if (resolved != 0 && !waiting) return resolved;
    if (!waiting && !entry) return -EINVAL; // a return probe goes on the first instruction of a function
    reap_dead_pools();
    create_exit_key();
    RetPool *pool = make_pool(rp);
    if (pool == nullptr) return -ENOMEM;
    {
        std::lock_guard lock(registry_mutex());
        pool->entry_gpr_only = handler_is_lean(reinterpret_cast<const void *>(rp->entry_handler));
        pool->handler_gpr_only = handler_is_lean(reinterpret_cast<const void *>(rp->handler));
        pool->entry_own = handler_is_own(reinterpret_cast<const void *>(rp->entry_handler));
        pool->handler_own = handler_is_own(reinterpret_cast<const void *>(rp->handler));
        pool->handler = rp->handler;
    }
    rp->nmissed = 0;
    rp->ukp_unwound = 0;
    rp->ukp_private = pool;
    rp->kp.pre_handler = kretprobe_pre;
    rp->kp.post_handler = nullptr;
    if (int err = register_kprobe(&rp->kp); err != 0) {
        rp->ukp_private = nullptr;
        free_pool(pool);
        return err;
    }
    return 0;
}

void unregister_kretprobes(struct kretprobe **rps, int num) {
    if (rps == nullptr || num <= 0) return;
    std::vector<kprobe *> kps;
    std::vector<RetPool *> pools;
    for (int i = 0; i < num; ++i) {
        if (rps[i] == nullptr) continue;
        kps.push_back(&rps[i]->kp);
        if (!is_registered(&rps[i]->kp)) continue;
        auto *pool = static_cast<RetPool *>(rps[i]->ukp_private);
        // Returns still in flight land at their real address; no handler runs for them.
        if (pool != nullptr) {
            pool->rp.store(nullptr, std::memory_order_release);
            pools.push_back(pool);
        }
    }
    // One grace period for all: afterwards neither entry nor return handlers run.
    unregister_kprobes(kps.data(), static_cast<int>(kps.size()));
    for (int i = 0; i < num; ++i)
        if (rps[i] != nullptr && std::find(pools.begin(), pools.end(), rps[i]->ukp_private) != pools.end())
            rps[i]->ukp_private = nullptr;
    {
        std::lock_guard lock(g_pools_mutex);
        dead_pools().insert(dead_pools().end(), pools.begin(), pools.end());
    }
    reap_dead_pools();
}

void unregister_kretprobe(struct kretprobe *rp) { unregister_kretprobes(&rp, 1); }

int register_kretprobes(struct kretprobe **rps, int num) {
    if (rps == nullptr || num <= 0) return -EINVAL;
    for (int i = 0; i < num; ++i) {
        const int err = rps[i] == nullptr ? -EINVAL : register_kretprobe(rps[i]);
        if (err != 0) {
            if (i > 0) unregister_kretprobes(rps, i);
            return err;
        }
    }
    return 0;
}

int disable_kretprobe(struct kretprobe *rp) { return rp == nullptr ? -EINVAL : disable_kprobe(&rp->kp); }

int enable_kretprobe(struct kretprobe *rp) { return rp == nullptr ? -EINVAL : enable_kprobe(&rp->kp); }

} // extern "C"
