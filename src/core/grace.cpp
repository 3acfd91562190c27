// Grace periods: the writer's wait for the read sections that began before it, and the
// reader cells the sections are marked in (the read side is inline, grace.hpp).
//
// A thread marks its read sections in a reader cell of its own: one word, the nesting depth
// in its low 16 bits and above them the count of outermost sections it has begun. The marks
// are plain stores, ordered only against the compiler. The writer first has every running
// thread of the process execute a full memory barrier (membarrier's private expedited
// command; a thread not running passed one when it was switched out): a section begun
// before that is visible in its word, and one begun after it sees what the writer changed.
// Then it waits for each word it found inside a section to show depth 0 or a later section.
// Threads that find no free reader cell, and every thread when membarrier is missing, use
// two shared counters (SRCU-like), with a locked instruction at each end of a section.
//
// A reader cell stays with its thread until the thread is gone. Nothing runs when a thread
// ends (the hit path registers no destructor: that would allocate), so the writer
// reclaims: a reader cell whose owner's ThreadState no longer names it belongs to a thread
// that ended (its memory is free, or another thread's now). That memory is read fault-safe.
#include "core/agent.hpp"
#include "core/core.hpp"
#include "core/grace.hpp"

#include "platform/agent_threads.hpp"
#include "platform/safe_access.hpp"

#include <linux/membarrier.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <ctime>

namespace ukp::core {

ReaderCell g_no_cell{{1}, {0}};
ReaderCount g_readers[2];

namespace {

constexpr uint64_t kOwnerMask = (uint64_t{1} << 48) - 1;
constexpr uint64_t kClaimOne = kOwnerMask + 1;

ReaderCell g_cells[kReaderCells];
std::atomic<size_t> g_cell_hint{0};
// One past the highest reader cell ever claimed: those above it were never written, and
// grace_after_fork_child() leaves their pages alone (reading one would fault it in).
std::atomic<size_t> g_cells_touched{0};
std::atomic<bool> g_membarrier{false};

std::atomic<unsigned> g_epoch{0};

long sys_membarrier(int cmd) { return syscall(SYS_membarrier, cmd, 0, 0); }

// A page of the agent's whose write permission is taken away when membarrier fails after
// registration (a sandbox the program installed later may refuse it): the kernel then
// interrupts every CPU that runs a thread of the process to flush its TLB, and an
// interrupt drains the CPU's store buffer, which is the barrier asked for.
void *g_shootdown_page = MAP_FAILED;

void barrier_by_tlb_shootdown() {
    auto *page = static_cast<volatile char *>(g_shootdown_page);
    if (g_shootdown_page == MAP_FAILED || mprotect(g_shootdown_page, 4096, PROT_READ | PROT_WRITE) != 0) abort();
    __atomic_fetch_add(page, 1, __ATOMIC_SEQ_CST); // a TLB entry, dirty, for the kernel to take back
    if (mprotect(g_shootdown_page, 4096, PROT_READ) != 0) abort();
}

ThreadState *owner_of(uint64_t claim) { return reinterpret_cast<ThreadState *>(claim & kOwnerMask); }

// Whether the thread that owns `cell` has ended (see above). Writers only.
bool owner_gone(const ReaderCell &cell, const ThreadState *owner) {
    // `claiming` first: the claimer sets `reader` before it clears `claiming`.
    ReaderCell *claiming = nullptr, *reader = nullptr;
    if (ukp_safe_copy(&claiming, &owner->claiming, sizeof claiming) != 0) return true; // unmapped
    if (claiming == &cell) return false;
    if (ukp_safe_copy(&reader, &owner->reader, sizeof reader) != 0) return true;
    return reader != &cell;
}

void reclaim_slots() {
    for (ReaderCell &cell : g_cells) {
        uint64_t c = cell.claim.load(std::memory_order_acquire);
        ThreadState *owner = owner_of(c);
        if (owner == nullptr || owner == &thread_state() || !owner_gone(cell, owner)) continue;
        cell.claim.compare_exchange_strong(c, c & ~kOwnerMask, std::memory_order_acq_rel);
    }
}

void wait_a_little(unsigned spins) {
    if (spins < 100) {
        sched_yield();
    } else {
        const timespec pause{0, 50 * 1000};
        nanosleep(&pause, nullptr);
    }
}

// Waits until the section `cell` was found in (`word`, under `claim`) has ended: its depth
// went to 0, a later section began, or the reader cell changed hands (its thread ended).
void wait_for_section(const ReaderCell &cell, uint64_t word, uint64_t claim) {
    for (unsigned spins = 0;; ++spins) {
        const uint64_t now = cell.word.load(std::memory_order_acquire);
        if ((now & kDepthMask) == 0 || (now & ~kDepthMask) != (word & ~kDepthMask) ||
            cell.claim.load(std::memory_order_acquire) != claim)
            return;
        wait_a_little(spins);
    }
}

} // namespace

// The calling thread's first section: a free reader cell, claimed without a lock.
// `claiming` names it before the claim and `reader` after, so a writer that sees the claim
// sees whose it is. A section begun by a signal handler in the middle of the claim uses the
// shared counters.
ReaderCell *claim_cell(ThreadState &ts) {
    if (ts.claiming != nullptr) return &g_no_cell;
    // A thread of the agent's, still in libc's code before its function (or after it):
    // its hits are the agent's work for the rest of its life, as AgentWork makes them.
    if (platform::in_agent_thread(reinterpret_cast<uint64_t>(&ts))) ++ts.quiet;
    if (!g_membarrier.load(std::memory_order_acquire)) {
        // Decided before the first probe (grace_init): shared counters for good.
        ts.reader = &g_no_cell;
        return &g_no_cell;
    }
    const size_t start = g_cell_hint.load(std::memory_order_relaxed);
    ReaderCell *got = &g_no_cell;
    for (size_t n = 0; n < kReaderCells && got == &g_no_cell; ++n) {
        ReaderCell &cell = g_cells[(start + n) % kReaderCells];
        uint64_t c = cell.claim.load(std::memory_order_relaxed);
        if (owner_of(c) != nullptr) continue;
        __atomic_store_n(&ts.claiming, &cell, __ATOMIC_RELEASE);
        const uint64_t mine = (c & ~kOwnerMask) + kClaimOne + reinterpret_cast<uint64_t>(&ts);
        if (cell.claim.compare_exchange_strong(c, mine, std::memory_order_seq_cst)) {
            // An ended thread may have left its depth behind; the section count goes on.
            cell.word.store(cell.word.load(std::memory_order_relaxed) & ~kDepthMask, std::memory_order_relaxed);
            const size_t index = (start + n) % kReaderCells;
            g_cell_hint.store((index + 1) % kReaderCells, std::memory_order_relaxed);
            for (size_t seen = g_cells_touched.load(std::memory_order_relaxed);
                 seen <= index && !g_cells_touched.compare_exchange_weak(seen, index + 1, std::memory_order_relaxed);)
                ;
            got = &cell;
        }
    }
    __atomic_store_n(&ts.reader, got, __ATOMIC_RELEASE); // a full table: shared counters for good
    __atomic_store_n(&ts.claiming, nullptr, __ATOMIC_RELEASE);
    return got;
}

unsigned shared_read_lock() {
    for (;;) {
        const unsigned e = g_epoch.load(std::memory_order_seq_cst);
        g_readers[e & 1].n.fetch_add(1, std::memory_order_seq_cst);
        // If the epoch moved between the load and the increment, a writer may already
        // have found this counter at zero: step back and join the new epoch instead.
        if (g_epoch.load(std::memory_order_seq_cst) == e) return e & 1;
        g_readers[e & 1].n.fetch_sub(1, std::memory_order_release);
    }
}

ReaderCell *claimed_cells(size_t *n) {
    *n = g_cells_touched.load(std::memory_order_acquire);
    return g_cells;
}

ReaderCell *own_cell() {
    ReaderCell *cell = thread_state().reader;
    return cell == &g_no_cell ? nullptr : cell;
}

bool private_cells() { return g_membarrier.load(std::memory_order_acquire); }

bool cell_in_section(uint64_t word) { return (word & kDepthMask) != 0; }

bool barrier_everywhere() {
    if (!g_membarrier.load(std::memory_order_acquire)) return false;
    if (sys_membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) != 0) barrier_by_tlb_shootdown();
    return true;
}

bool synchronize() {
    // From inside a handler this thread holds a section itself: waiting would never end.
    if (thread_state().depth > 0) return false;
    if (g_membarrier.load(std::memory_order_acquire)) {
        barrier_everywhere(); // after it, every section begun before the call shows in its reader cell
        reclaim_slots();
        for (const ReaderCell &cell : g_cells) {
            const uint64_t claim = cell.claim.load(std::memory_order_acquire);
            const uint64_t word = cell.word.load(std::memory_order_acquire);
            if (owner_of(claim) != nullptr && (word & kDepthMask) != 0) wait_for_section(cell, word, claim);
        }
    }
    const unsigned e = g_epoch.fetch_add(1, std::memory_order_seq_cst);
    for (unsigned spins = 0; g_readers[e & 1].n.load(std::memory_order_acquire) != 0; ++spins) wait_a_little(spins);
    return true;
}

bool wait_for_hits_in_flight() { return synchronize(); }

void grace_init() {
    static std::once_flag once;
    std::call_once(once, [] {
        const long cmds = sys_membarrier(MEMBARRIER_CMD_QUERY);
        if (cmds > 0 && (cmds & MEMBARRIER_CMD_PRIVATE_EXPEDITED) != 0 &&
            sys_membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0) {
            g_shootdown_page = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            g_membarrier.store(g_shootdown_page != MAP_FAILED, std::memory_order_release);
        }
    });
}

size_t reader_cells_in_use() {
    size_t n = 0;
    for (const ReaderCell &cell : g_cells) n += owner_of(cell.claim.load(std::memory_order_relaxed)) != nullptr;
    return n;
}

void grace_after_fork_child() {
    // The other threads' read sections ended with them. The forking thread holds none,
    // unless it forked from inside a handler (not supported: fork.hpp).
    // Only words that hold something are written, and only reader cells ever claimed are
    // read: a write would copy its page (copy-on-write), a read of a page never written would
    // map it, for nothing: the table spans 16 pages, a child goes through it at every fork.
    if (thread_state().depth > 0) return;
    const size_t touched = g_cells_touched.load(std::memory_order_relaxed);
    for (size_t i = 0; i < touched; ++i) {
        ReaderCell &cell = g_cells[i];
        // A thread that was taking another's spare (kretprobe.cpp) is not here to unlock it.
        if (cell.spare_lock.load(std::memory_order_relaxed) != 0) cell.spare_lock.store(0, std::memory_order_relaxed);
        if (&cell == thread_state().reader) continue;
        if (cell.word.load(std::memory_order_relaxed) != 0) cell.word.store(0, std::memory_order_relaxed);
        if (const uint64_t c = cell.claim.load(std::memory_order_relaxed); (c & kOwnerMask) != 0)
            cell.claim.store(c & ~kOwnerMask, std::memory_order_relaxed);
    }
    for (ReaderCount &count : g_readers)
        if (count.n.load(std::memory_order_relaxed) != 0) count.n.store(0, std::memory_order_relaxed);
    // The registration belongs to the parent's address space; without it here, this
    // thread goes over to the shared counters (it is in no section).
    if (g_membarrier.load(std::memory_order_relaxed) &&
        sys_membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) != 0) {
        g_membarrier.store(false, std::memory_order_relaxed);
        if (thread_state().reader != nullptr && thread_state().reader != &g_no_cell)
            thread_state().reader->claim.store(thread_state().reader->claim.load() & ~kOwnerMask);
        thread_state().reader = &g_no_cell;
    }
}

} // namespace ukp::core
