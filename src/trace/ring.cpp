#include "trace/ring.hpp"
#include "core/agent.hpp"
#include "trace/counters.hpp"
#include "trace/profile_table.hpp"
#include "platform/held_fd.hpp"
#include "platform/high_fd.hpp"
#include "platform/raw_syscall.hpp"
#include "platform/this_cpu.hpp"
#include "platform/safe_access.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <cpuid.h>
#include <x86intrin.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>

namespace ukp::trace {

std::atomic<bool> g_tracing_on{true};

namespace {

constexpr uint64_t kDefaultKb = 1408; // ftrace's default per-CPU size
constexpr uint32_t kDefaultBuffers = 256;
constexpr uint64_t kMaxKb = 1ull << 22; // 4 GiB a buffer
constexpr uint32_t kRecHdr = sizeof(RecordHeader);
constexpr uint64_t kEvictAhead = 4096; // bytes a full ring evicts beyond what a record needs

uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

// A mapped ring. Never unmapped while the process lives: a writer that loaded the old
// ring just before it was replaced may still write into it (harmlessly).
struct MappedRing {
    platform::HeldFd fd; // its memfd, for readers in other processes
    uint8_t *base = nullptr;
    size_t size = 0;
    uint64_t cap = 0; // data bytes per buffer
    uint32_t gen = 0;
    RingHeader *hdr() const { return reinterpret_cast<RingHeader *>(base); }
    BufferHeader *buffer(uint32_t i) const { return reinterpret_cast<BufferHeader *>(base + hdr()->header_size) + i; }
    uint8_t *data(uint32_t i) const { return base + hdr()->data_offset + i * hdr()->buffer_stride; }
    RingView view() const { return RingView{base, size}; }
    // Per buffer, its owner's tid word (tid_word()), 0 while the buffer is free or being
    // taken: claim() takes the buffer of an owner that has ended. Null if it could not be
    // allocated: then a thread gives its buffer up in its exit destructor.
    std::unique_ptr<std::atomic<uint64_t>[]> tid_words;
};

std::mutex g_mu; // control operations and in-process readers
std::atomic<MappedRing *> g_main{nullptr};
std::atomic<MappedRing *> g_snap{nullptr}; // changed under g_mu, or by snapshot_swap
std::atomic<bool> g_swap_busy{false};      // held while main and snapshot change places (also from a hit)
uint64_t g_kb = kDefaultKb;                // under g_mu
uint32_t g_buffers = kDefaultBuffers;      // under g_mu
std::atomic<uint32_t> g_gen{0};
std::atomic<const uint8_t *> g_profile{nullptr}; // the kprobe_profile counter table
pthread_key_t g_exit_key;
bool g_key_made = false;    // under g_mu
bool g_atfork_done = false; // under g_mu

// Per-thread writer state (initial-exec TLS: no allocation on first use).
struct Writer {
    BufferHeader *buffer; // this thread's buffer in the ring of generation `gen`
    uint8_t *data;
    uint64_t cap;
    uint32_t gen;
    RingHeader *hdr;    // the ring's header
    bool tsc;           // the ring's clock is the TSC
    bool busy;          // between reserve and commit: a nested reserve is refused
    bool hooked;        // the thread-exit destructor is registered
    bool exited;        // past the thread-exit destructor: no buffer claimed any more
    bool comm_pending;  // the buffer's comm is this thread's: its first commit names it
    RecordHeader *pend; // the reserved record
    uint64_t pend_pos;  // its position
    uint64_t pend_off;  // its offset in the data area
    uint32_t pend_size; // bytes reserved for it
    uint64_t head_off;  // buffer->head % cap, kept here to spare a division per record
                        // (head is written by this thread only)
};
thread_local Writer t_w __attribute__((tls_model("initial-exec")));

using platform::raw_syscall;

// Saves the calling thread's name in its buffer (BufferHeader::comm). Not on the hit path
// (two system calls): at exit().
void save_comm(BufferHeader *s) {
    char name[16] = {};
    raw_syscall(SYS_prctl, PR_GET_NAME, reinterpret_cast<long>(name));
    name[15] = 0;
    s->comm_tid.store(0, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release); // 0 is seen before the name changes
    std::memcpy(s->comm, name, sizeof name);
    s->comm_tid.store(static_cast<int32_t>(raw_syscall(SYS_gettid)), std::memory_order_release);
}

uint64_t now_ns() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); // vDSO: no system call
    return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

// An invariant TSC (constant rate, runs in every C-state) is what the kernel's own
// clocksource reads: a writer can take it raw, a third of the vDSO clock_gettime's cost.
bool tsc_usable() {
    unsigned a, b, c, d;
    if (__get_cpuid(0x80000007, &a, &b, &c, &d) == 0) return false;
    return (d & (1u << 8)) != 0;
}

// A (TSC, CLOCK_MONOTONIC) pair taken as close together as a few tries allow.
void clock_pair(uint64_t *tsc, uint64_t *mono) {
    uint64_t best = ~0ull;
    for (int i = 0; i < 5; ++i) {
        const uint64_t t0 = __rdtsc();
        const uint64_t m = now_ns();
        const uint64_t t1 = __rdtsc();
        if (i == 0 || t1 - t0 < best) { // the first pair always, so that both are set
            best = t1 - t0;
            *tsc = t0 + (t1 - t0) / 2;
            *mono = m;
        }
    }
}

// ---- TSC to CLOCK_MONOTONIC (RingHeader::segments) ----

constexpr uint64_t kFirstSpacingNs = 10'000'000; // the first segment's length
constexpr uint64_t kLeadNs = 1'000'000;          // a new segment starts this far ahead
constexpr uint64_t kMaxSlewPpm = 100;            // steering back never exceeds this rate

// The best TSC rate this process has measured (ns per tick times 2^32): a new ring's
// first segment starts with it.
std::atomic<uint64_t> g_mult{0};

uint64_t ticks_for(uint64_t ns, uint64_t mult) {
    return static_cast<uint64_t>((static_cast<unsigned __int128>(ns) << 32) / mult);
}

uint64_t rate_between(uint64_t t0, uint64_t m0, uint64_t t1, uint64_t m1) {
    return static_cast<uint64_t>((static_cast<unsigned __int128>(m1 - m0) << 32) / (t1 - t0));
}

// A first estimate of the rate: over 200 us of spinning (once per process; the segments
// refine it within tens of milliseconds).
uint64_t first_mult() {
    if (const uint64_t m = g_mult.load(std::memory_order_relaxed); m != 0) return m;
    uint64_t t0, m0, t1, m1;
    clock_pair(&t0, &m0);
    do clock_pair(&t1, &m1);
    while (m1 - m0 < 200'000 || t1 == t0);
    const uint64_t m = rate_between(t0, m0, t1, m1);
    g_mult.store(m, std::memory_order_relaxed);
    return m;
}

void clock_start(RingHeader *h) {
    uint64_t t, m;
    clock_pair(&t, &m);
    const uint64_t mult = first_mult();
    h->clock = kClockTsc;
    h->clock_mono0 = m;
    h->segments[0] = ClockSegment{t, m, mult};
    h->clock_count.store(1, std::memory_order_release);
    h->clock_next.store(t + ticks_for(kFirstSpacingNs, mult), std::memory_order_release);
}

// Adds two segments when the next is due: one that steers the conversion back to a
// freshly taken (TSC, CLOCK_MONOTONIC) pair at no more than kMaxSlewPpm, then one at the
// rate measured since segments[0]. Both start in the future (kLeadNs), so no record
// already read falls into them, and each begins where the one before ends: times never
// jump. Called from a probe hit: lock-free (a busy table is left to the next caller), no
// allocation, no system call (clock_gettime is the vDSO's).
void clock_extend(RingHeader *h) {
    uint32_t idle = 0;
    if (!h->clock_busy.compare_exchange_strong(idle, 1, std::memory_order_acquire)) return;
    const uint32_t n = h->clock_count.load(std::memory_order_relaxed);
    uint64_t tb, mb;
    clock_pair(&tb, &mb);
    const ClockSegment first = h->segments[0], last = h->segments[n - 1];
    if (n + 2 > kClockSegments) {
        h->clock_next.store(~0ull, std::memory_order_relaxed);
    } else if (tb >= h->clock_next.load(std::memory_order_relaxed) && tb > first.tsc0 && mb > h->clock_mono0) {
        const uint64_t rate = rate_between(first.tsc0, h->clock_mono0, tb, mb);
        ClockSegment steer;
        steer.tsc0 = tb + ticks_for(kLeadNs, rate);
        steer.ns0 = clock_convert(last, steer.tsc0);
        const uint64_t truth = mb + kLeadNs;
        const uint64_t err = truth > steer.ns0 ? truth - steer.ns0 : steer.ns0 - truth;
        // Long enough to take err back at kMaxSlewPpm, and at least the first spacing.
        const uint64_t span_ns = std::max(kFirstSpacingNs, err * (1'000'000 / kMaxSlewPpm));
        const uint64_t span = ticks_for(span_ns, rate);
        const __int128 slew = (static_cast<__int128>(err) << 32) / span;
        steer.mult = truth > steer.ns0 ? rate + static_cast<uint64_t>(slew) : rate - static_cast<uint64_t>(slew);
        ClockSegment settle;
        settle.tsc0 = steer.tsc0 + span;
        settle.ns0 = clock_convert(steer, settle.tsc0);
        settle.mult = rate;
        h->segments[n] = steer;
        h->segments[n + 1] = settle;
        h->clock_count.store(n + 2, std::memory_order_release);
        // Spacings double: the rate is measured over ever longer spans.
        const uint64_t age = settle.tsc0 - first.tsc0;
        h->clock_next.store(n + 4 <= kClockSegments ? settle.tsc0 + age : ~0ull, std::memory_order_release);
        g_mult.store(rate, std::memory_order_relaxed);
    }
    h->clock_busy.store(0, std::memory_order_release);
}

MappedRing *map_ring(uint64_t kb, uint32_t buffers) {
    const uint64_t cap = std::max<uint64_t>(align_up(kb * 1024, 4096), 4096);
    const uint64_t header_size = align_up(sizeof(RingHeader), 64);
    const uint64_t data_offset = align_up(header_size + uint64_t(buffers) * sizeof(BufferHeader), 4096);
    const uint64_t total = data_offset + buffers * cap; // cap: whole pages
    const int fd = platform::move_fd_high(
        static_cast<int>(syscall(SYS_memfd_create, "ukprobes-trace", MFD_CLOEXEC | MFD_ALLOW_SEALING)));
    if (fd < 0) return nullptr;
    // Sealed at its size: a reader holding the memfd cannot shrink it under the writers,
    // whose stores into a page past the end would raise SIGBUS in the traced program
    // (the hit path writes the ring without a recovery point: core.hpp, handler_is_own).
    if (ftruncate(fd, static_cast<off_t>(total)) != 0 ||
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
        close(fd);
        return nullptr;
    }
    // MAP_NORESERVE: pages are backed as buffers fill, not all at once.
    void *p = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
    if (p == MAP_FAILED) {
        close(fd);
        return nullptr;
    }
    auto *r = new (std::nothrow) MappedRing;
    if (r == nullptr) {
        munmap(p, total);
        close(fd);
        return nullptr;
    }
    r->fd.set(fd);
    r->tid_words.reset(new (std::nothrow) std::atomic<uint64_t>[buffers]());
    r->base = static_cast<uint8_t *>(p);
    r->size = total;
    r->cap = cap;
    r->gen = g_gen.fetch_add(1) + 1;
    RingHeader *h = r->hdr(); // the memfd starts zeroed: atomics read as 0
    h->magic = kRingMagic;
    h->version = kRingVersion;
    h->header_size = static_cast<uint32_t>(header_size);
    h->buffer_count = buffers;
    h->buffer_header_size = sizeof(BufferHeader);
    h->buffer_stride = cap;
    h->data_size = cap;
    h->data_offset = data_offset;
    h->pid = static_cast<int32_t>(raw_syscall(SYS_getpid));
    if (struct stat ns{}; stat("/proc/self/ns/pid", &ns) == 0) h->pid_ns = ns.st_ino;
    h->generation = r->gen;
    h->profile_addr.store(reinterpret_cast<uint64_t>(g_profile.load(std::memory_order_acquire)),
                          std::memory_order_release);
    if (tsc_usable()) clock_start(h);
    return r;
}

// Waits (boundedly) until no writer is between reserve and commit in `r`, which is no
// longer the main ring.
void wait_writers(MappedRing *r) {
    for (int spin = 0; spin < 2000; ++spin) {
        bool idle = true;
        for (uint32_t i = 0; i < r->hdr()->buffer_count && idle; ++i)
            idle = r->buffer(i)->busy.load(std::memory_order_acquire) == 0;
        if (idle) return;
        usleep(50);
    }
}

// Rings replaced so far: kept, as their mappings are (see MappedRing). Under g_mu.
std::vector<MappedRing *> &retired() {
    static auto *v = new std::vector<MappedRing *>(); // never destroyed: writers may outlive statics
    return *v;
}

// Unbacks a replaced ring's memory; its mapping stays (see MappedRing).
void retire_ring(MappedRing *r) {
    if (r == nullptr) return;
    retired().push_back(r);
    wait_writers(r);
    const uint64_t keep = align_up(r->hdr()->header_size, 4096);
    madvise(r->base + keep, r->size - keep, MADV_REMOVE);
    r->fd.release();
}

// glibc's tid word of a thread (struct pthread's tid: the word the kernel clears when the
// thread ends, CLONE_CHILD_CLEARTID, that pthread_join waits on) lies at a fixed offset
// from its thread pointer. Learned once, from the thread that starts the tracer
// (PR_GET_TID_ADDRESS); kNoOffset if that failed.
constexpr long kNoOffset = -1;
std::atomic<long> g_tid_word_offset{kNoOffset};

void learn_tid_word_offset() {
    uint64_t word = 0;
    const auto tp = reinterpret_cast<uint64_t>(__builtin_thread_pointer());
    if (raw_syscall(SYS_prctl, PR_GET_TID_ADDRESS, reinterpret_cast<long>(&word)) != 0 || word <= tp ||
        word - tp >= 8192 || *reinterpret_cast<const int32_t *>(word) != raw_syscall(SYS_gettid))
        return;
    g_tid_word_offset.store(static_cast<long>(word - tp), std::memory_order_relaxed);
}

// The calling thread's tid word, 0 if unknown. No system call.
uint64_t tid_word() {
    const long off = g_tid_word_offset.load(std::memory_order_relaxed);
    return off == kNoOffset ? 0 : reinterpret_cast<uint64_t>(__builtin_thread_pointer()) + static_cast<uint64_t>(off);
}

// Whether the buffers of r are taken back from owners that ended (else they are given
// back in the exit destructor).
bool tracks_owners(const MappedRing *r) {
    return r->tid_words != nullptr && g_tid_word_offset.load(std::memory_order_relaxed) != kNoOffset;
}

void thread_exit(void *) {
    Writer &w = t_w;
    MappedRing *r = g_main.load(std::memory_order_acquire);
    if (w.buffer != nullptr && r != nullptr && w.gen == r->gen) {
        // Keep the thread's name for readers (ftrace's saved_cmdlines).
        char name[16] = {};
        raw_syscall(SYS_prctl, PR_GET_NAME, reinterpret_cast<long>(name));
        RingHeader *h = r->hdr();
        CommEntry &e = h->comms[h->comm_next.fetch_add(1, std::memory_order_relaxed) % kCommEntries];
        e.tid.store(0, std::memory_order_relaxed);
        std::memcpy(e.comm, name, sizeof e.comm);
        e.comm[15] = 0;
        e.tid.store(static_cast<int32_t>(raw_syscall(SYS_gettid)), std::memory_order_release);
        // The thread keeps its buffer to its end: glibc runs free, madvise and more after
        // the key destructors, and their events are the program's. Another thread takes the
        // buffer once this one has ended (claim()).
        if (tracks_owners(r)) return;
        w.buffer->owner.store(0, std::memory_order_release);
    }
    w.buffer = nullptr;
    w.exited = true;
}

// exit(): the exiting thread's name as it is now (it may have renamed itself since its
// first record) for a reader that formats after the process is gone. Other threads keep
// the name of their first record.
__attribute__((destructor)) void save_comm_at_exit() {
    Writer &w = t_w;
    MappedRing *r = g_main.load(std::memory_order_acquire);
    if (w.buffer != nullptr && r != nullptr && w.gen == r->gen) save_comm(w.buffer);
}

void after_fork_child() {
    // The child's hits in the C library's fork() up to here were kept out of the parent's
    // ring (agent.hpp, fork's window); from the end of this handler on they go to its own.
    struct WindowEnd {
        ~WindowEnd() { core::end_fork_window(); }
    } window_end;
    // The child's new buffers are the agent's work, not the program's: a probe on malloc
    // or memfd_create neither runs nor counts while they are made (it counted one hit the
    // ring could not hold: the buffers did not exist yet).
    const core::AgentWork quiet;
    // Its counters first, in memory of its own (they are shared memory too).
    counters_after_fork_child();
    // The child must not write into the parent's buffers (shared memory): new ones. It
    // lets go of the parent's first: a probe hit in what follows (making the ring
    // calls into the C library) would otherwise record there, under the child's pid.
    MappedRing *r = g_main.exchange(nullptr, std::memory_order_acq_rel);
    MappedRing *snap = g_snap.exchange(nullptr, std::memory_order_relaxed);
    t_w.buffer = nullptr;
    // The child's kprobe_profile counts its own hits, as its ring holds its own records:
    // what the parent counted before the fork stays the parent's.
    if (const uint8_t *table = g_profile.load(std::memory_order_acquire)) profile_table_zero(table);
    // The parent's memfds are not the child's business: its table has copies of those the
    // parent held in the program's table (closed), none of those of the control thread's.
    for (MappedRing *parents : {r, snap}) {
        if (parents == nullptr) continue;
        if (parents->fd.in_program_table()) {
            struct stat st {};
            const long fd = parents->fd.number();
            if (raw_syscall(SYS_fstat, fd, reinterpret_cast<long>(&st)) == 0 &&
                parents->fd.same_file(st.st_dev, st.st_ino))
                raw_syscall(SYS_close, fd);
        }
        parents->fd.forget();
    }
    if (r == nullptr) return;
    const RingHeader *h = r->hdr();
    MappedRing *own = map_ring(h->data_size / 1024, h->buffer_count);
    g_main.store(own, std::memory_order_release);
    // Another thread of the parent may have held them at the fork; it does not exist here.
    new (&g_mu) std::mutex;
    g_swap_busy.store(false, std::memory_order_relaxed);
    // This process serves no socket: `ukprobe run` takes the memfds from it while it
    // waits in the notice, and streams the ring. Once it has them (or wants none), the
    // child's copies go: a descriptor of ours in the program's table is the program's to
    // see and to inherit. Without that answer they stay, for a reader to come (`ukprobe
    // run` at the child's exit, or the control thread of an attach, which adopts them).
    // The parent's ring names the parent (whose agent's event table prints this ring).
    const long parent = h->pid > 0 ? h->pid : 0;
    if (own == nullptr) return;
    const long answer = notify_supervisor(kNoticeForkedRing | parent << kNoticeKindBits);
    if (answer == kNoticeDone) {
        own->fd.release();
        counters_release_fd();
    } else if (supervisor_gone(answer)) {
        // Nobody reads this ring: the events record nothing (their triggers still run).
        // Not `events/enable 0` here: disarming takes locks a thread of the parent may
        // have held at the fork.
        set_tracing_on(false);
    }
}

int init_locked() {
    if (!g_key_made) {
        if (pthread_key_create(&g_exit_key, thread_exit) != 0) return -EAGAIN;
        g_key_made = true;
        learn_tid_word_offset();
    }
    if (!g_atfork_done) {
        core::fork_window_ends_late();
        pthread_atfork(nullptr, nullptr, after_fork_child);
        g_atfork_done = true;
    }
    if (g_main.load(std::memory_order_relaxed) == nullptr) {
        // UKP_BUFFER_SIZE_KB: the size the first buffers are made with (the kernel's
        // trace_buf_size= boot parameter; `ukprobe run -b`).
        if (const char *kb = getenv("UKP_BUFFER_SIZE_KB"); kb != nullptr) {
            char *end = nullptr;
            const unsigned long long n = strtoull(kb, &end, 10);
            if (end != kb && *end == 0 && n > 0 && n <= kMaxKb) g_kb = n;
        }
        MappedRing *r = map_ring(g_kb, g_buffers);
        if (r == nullptr) return -ENOMEM;
        g_main.store(r, std::memory_order_release);
    }
    return 0;
}

// Whether the owner `owner` (its tid) of a buffer has ended: its tid word reads 0 (the
// kernel cleared it), or another thread's tid (the stack went to a new thread), or faults
// (the stack was unmapped). No system call.
bool owner_gone(uint64_t word, uint32_t owner) {
    uint32_t now = 0;
    if (ukp_safe_copy(&now, reinterpret_cast<const void *>(word), sizeof now) != 0) return true;
    return now != owner;
}

// A free buffer; failing that, one whose owner has ended. The buffer's owner becomes the
// caller's tid, read from its tid word (1 where owners are not tracked).
BufferHeader *claim(MappedRing *r, uint32_t *index) {
    const uint64_t word = tracks_owners(r) ? tid_word() : 0;
    const uint32_t me = word != 0 ? *reinterpret_cast<const uint32_t *>(word) : 1;
    const uint32_t n = r->hdr()->buffer_count;
    for (const bool reclaim : {false, true}) {
        for (uint32_t i = 0; i < n; ++i) {
            BufferHeader *s = r->buffer(i);
            uint32_t owner = s->owner.load(std::memory_order_acquire);
            if (owner == 0) {
                if (!s->owner.compare_exchange_strong(owner, me, std::memory_order_acq_rel)) continue;
            } else {
                // A word of 0 is a buffer being taken: the taker zeroes it first, so that
                // no other thread takes it at the same time.
                if (!reclaim || word == 0) continue;
                uint64_t was = r->tid_words[i].load(std::memory_order_acquire);
                if (was == 0 || !owner_gone(was, owner) ||
                    !r->tid_words[i].compare_exchange_strong(was, 0, std::memory_order_acq_rel) ||
                    !s->owner.compare_exchange_strong(owner, me, std::memory_order_acq_rel))
                    continue;
            }
            if (word != 0) r->tid_words[i].store(word, std::memory_order_release);
            *index = i;
            return s;
        }
    }
    return nullptr;
}

void count_drop(BufferHeader *s) {
    s->dropped.fetch_add(1, std::memory_order_relaxed);
    s->dropped_pending.fetch_add(1, std::memory_order_relaxed);
}

} // namespace

// ---- Hit path ----
//
// ring_reserve is the common case only: the thread's buffer already claimed, room for the
// record without evicting. What is not (a nested hit, claiming a buffer, a refused
// record, a full buffer, a clock segment due) is out of line and cold, so that the common
// path stays short and keeps its registers.

namespace {

// A nested reserve (a probe hit in a signal handler that interrupted this thread's own
// record): refused, counted as lost. Null.
__attribute__((noinline, cold)) uint8_t *refuse_nested(const Writer &w) {
    MappedRing *r = g_main.load(std::memory_order_acquire);
    if (w.buffer != nullptr && r != nullptr && w.gen == r->gen)
        count_drop(w.buffer);
    else if (r != nullptr)
        r->hdr()->lost_no_buffer.fetch_add(1, std::memory_order_relaxed);
    return nullptr;
}

// The thread's buffer in ring r, claimed at its first record there (or in a ring that
// replaced its buffer's), into w. False, the writer idle again, when there is no ring, or
// no buffer for the thread (counted as lost).
__attribute__((noinline, cold)) bool take_buffer(Writer &w, MappedRing *r, const char *comm) {
    if (r == nullptr) {
        w.busy = false;
        return false;
    }
    uint32_t index = 0;
    BufferHeader *s = w.exited && !tracks_owners(r) ? nullptr : claim(r, &index);
    if (s == nullptr) {
        r->hdr()->lost_no_buffer.fetch_add(1, std::memory_order_relaxed);
        w.busy = false;
        return false;
    }
    w.buffer = s;
    w.data = r->data(index);
    w.cap = r->cap;
    w.gen = r->gen;
    w.hdr = r->hdr();
    w.tsc = w.hdr->clock == kClockTsc;
    w.head_off = s->head.load(std::memory_order_relaxed) % r->cap;
    if (!w.hooked) {
        w.hooked = true;
        // Below PTHREAD_KEY_2NDLEVEL_SIZE keys glibc stores the value in the thread
        // descriptor: no allocation. (Calls into the C library from here go through
        // agent_call: this path is lean.)
        core::agent_call([] { pthread_setspecific(g_exit_key, reinterpret_cast<void *>(1)); });
    }
    // The caller's name for the thread (read once per thread, where the events layer
    // makes its own system calls); whose it is, the first commit says (common_pid).
    w.comm_pending = comm != nullptr;
    if (comm != nullptr) {
        s->comm_tid.store(0, std::memory_order_relaxed);
        std::atomic_thread_fence(std::memory_order_release); // 0 is seen before the name changes
        std::memcpy(s->comm, comm, sizeof s->comm);
        s->comm[sizeof s->comm - 1] = 0;
    }
    return true;
}

// The record being reserved in buffer s, refused (too big, or the buffer's records
// unreadable) and counted as dropped; the writer idle again. Null.
__attribute__((noinline, cold)) uint8_t *refuse_record(Writer &w, BufferHeader *s) {
    count_drop(s);
    s->busy.store(0, std::memory_order_release);
    w.busy = false;
    return nullptr;
}

// Overwrite mode: evicts the oldest records of buffer s (head h, at data offset off, tail
// t) until a record ending at `end` fits, and up to kEvictAhead bytes more (a 16th of a
// small buffer), in one compare-exchange (a reader may be consuming the same buffer): a
// full ring pays for one every few dozen records, not for every record. The kernel's ring
// buffer, too, overwrites a page at a time. False when the record is refused instead.
__attribute__((noinline, cold)) bool evict(Writer &w, BufferHeader *s, uint64_t h, uint64_t off, uint64_t end,
                                           uint64_t t) {
    const uint64_t cap = w.cap;
    while (end - t > cap) {
        if (t > h || h - t > cap) [[unlikely]] {
            // A tail past the head, or further behind it than the buffer holds: another
            // writer wrote here (nothing else does). The buffer's records cannot be told
            // apart any more: it starts empty, this record counted as lost. Evicting would
            // never make room.
            s->tail.compare_exchange_strong(t, h, std::memory_order_acq_rel, std::memory_order_relaxed);
            refuse_record(w, s);
            return false;
        }
        // must <= h: a record never needs more than the whole buffer (checked by the caller).
        const uint64_t must = end - cap, want = std::min(h, must + std::min(kEvictAhead, cap / 16));
        uint64_t nt = t, records = 0;
        while (nt < want) {
            const uint64_t back = h - nt; // <= cap
            const uint64_t at = off >= back ? off - back : off + cap - back;
            const auto *old = reinterpret_cast<const RecordHeader *>(w.data + at);
            const uint64_t len = old->len;
            if (len < 8 || len % 8 != 0 || nt + len > h) { // cannot happen unless memory was scribbled on
                refuse_record(w, s);
                return false;
            }
            if (nt >= must && nt + len > want) break; // the rest of the batch would overshoot
            records += old->kind == kRecordKind;
            nt += len;
        }
        if (s->tail.compare_exchange_weak(t, nt, std::memory_order_acq_rel, std::memory_order_acquire)) {
            if (records != 0)
                s->overrun.store(s->overrun.load(std::memory_order_relaxed) + records, std::memory_order_release);
            t = nt;
        }
    }
    return true;
}

// The TSC conversion's next segments (clock_extend), unless a debugger single-steps the
// thread (platform::single_stepped).
__attribute__((noinline, cold)) void extend_clock(RingHeader *hdr) {
    if (platform::single_stepped()) return;
    core::agent_call([hdr] { clock_extend(hdr); }); // the vDSO, libgcc's 128-bit division
}

} // namespace

uint8_t *ring_reserve(uint32_t size, const char *comm, int cpu) {
    if (!g_tracing_on.load(std::memory_order_relaxed)) return nullptr;
    Writer &w = t_w;
    if (w.busy) [[unlikely]]
        return refuse_nested(w);
    w.busy = true;
    std::atomic_signal_fence(std::memory_order_seq_cst);
    MappedRing *r = g_main.load(std::memory_order_acquire);
    if (r == nullptr || w.buffer == nullptr || w.gen != r->gen) [[unlikely]] {
        if (!take_buffer(w, r, comm)) return nullptr;
    }
    BufferHeader *s = w.buffer;
    s->busy.store(1, std::memory_order_relaxed);
    std::atomic_signal_fence(std::memory_order_seq_cst);
    const uint64_t need = align_up(kRecHdr + size, 8);
    const uint64_t cap = w.cap;
    const uint64_t h = s->head.load(std::memory_order_relaxed);
    const uint64_t off = w.head_off;
    const uint64_t pad = off + need > cap ? cap - off : 0;
    if (size > kMaxRecordSize || pad + need > cap) [[unlikely]]
        return refuse_record(w, s);
    const uint64_t end = h + pad + need;
    const uint64_t t = s->tail.load(std::memory_order_acquire);
    if (end - t > cap) [[unlikely]] {
        if (!evict(w, s, h, off, end, t)) return nullptr;
    }
    // Published before the data is overwritten: a reader that copied bytes this write
    // touches sees the new reserve_end afterwards and drops its copy (x86 keeps stores
    // in order; the fence keeps the compiler from moving the data stores up).
    s->reserve_end.store(end, std::memory_order_relaxed);
    std::atomic_signal_fence(std::memory_order_seq_cst);
    if (pad != 0) [[unlikely]] {
        // Records never wrap: a pad record fills the end of the data area.
        auto *p = reinterpret_cast<RecordHeader *>(w.data + off);
        p->len = static_cast<uint16_t>(pad);
        p->kind = kPadKind;
    }
    const uint64_t rec_off = pad != 0 ? 0 : off;
    auto *rh = reinterpret_cast<RecordHeader *>(w.data + rec_off);
    if (cpu < 0) cpu = platform::this_cpu(); // from rseq: no system call
    rh->cpu = static_cast<uint16_t>(cpu < 0 ? 0 : cpu);
    rh->kind = kRecordKind;
    rh->reserved = 0;
    if (w.tsc) {
        const uint64_t now = __rdtsc();
        rh->ts = now;
        if (now >= w.hdr->clock_next.load(std::memory_order_relaxed)) [[unlikely]]
            extend_clock(w.hdr);
    } else {
        uint64_t ns = 0;
        core::agent_call([&ns] { ns = now_ns(); }); // no invariant TSC: the vDSO's clock
        rh->ts = ns;
    }
    w.pend = rh;
    w.pend_pos = h + pad;
    w.pend_off = rec_off;
    w.pend_size = size;
    return reinterpret_cast<uint8_t *>(rh) + kRecHdr;
}

void ring_commit(uint8_t *rec, uint32_t used) {
    Writer &w = t_w;
    if (!w.busy || w.buffer == nullptr || rec != reinterpret_cast<uint8_t *>(w.pend) + kRecHdr) return;
    BufferHeader *s = w.buffer;
    if (used != 0) {
        used = std::min(used, w.pend_size);
        RecordHeader *rh = w.pend;
        rh->len = static_cast<uint16_t>(align_up(kRecHdr + used, 8));
        rh->size = static_cast<uint16_t>(used);
        uint32_t lost = s->dropped_pending.load(std::memory_order_relaxed);
        if (lost != 0) lost = s->dropped_pending.exchange(0, std::memory_order_relaxed);
        rh->dropped_before = lost;
        if (used >= kCommonSize) {
            int32_t pid;
            std::memcpy(&pid, rec + 4, 4);
            if (s->tid.load(std::memory_order_relaxed) != pid) s->tid.store(pid, std::memory_order_relaxed);
            if (w.comm_pending) {
                s->comm_tid.store(pid, std::memory_order_release);
                w.comm_pending = false;
            }
        }
        const uint64_t next = w.pend_off + rh->len;
        w.head_off = next == w.cap ? 0 : next;
        s->head.store(w.pend_pos + rh->len, std::memory_order_release);
    }
    s->busy.store(0, std::memory_order_release);
    std::atomic_signal_fence(std::memory_order_seq_cst);
    w.busy = false;
}

// ---- Control ----

long notify_supervisor(long kind) {
    // Made straight: the C library's wrapper may be probed.
    return raw_syscall(SYS_rt_sigprocmask, SIG_SETMASK, 0, 0, 8 /* the kernel's sigset_t */, kNoticeMagic, kind);
}

bool supervisor_gone(long answer) {
    if (answer == kNoticeDone || answer == kNoticeKeep) return false;
    const char *supervised = getenv("UKP_SUPERVISED");
    return supervised != nullptr && supervised[0] == '1' && supervised[1] == 0;
}

int ring_init() {
    std::lock_guard lock(g_mu);
    return init_locked();
}

void set_tracing_on(bool on) { g_tracing_on.store(on, std::memory_order_relaxed); }

uint64_t buffer_size_kb() {
    std::lock_guard lock(g_mu);
    return g_kb;
}

namespace {
void lock_swap();
void unlock_swap();
int replace_main_locked(uint64_t kb, uint32_t buffers) {
    if (int err = init_locked(); err != 0) return err;
    MappedRing *fresh = map_ring(kb, buffers);
    if (fresh == nullptr) return -ENOMEM;
    lock_swap();
    MappedRing *old = g_main.exchange(fresh, std::memory_order_acq_rel);
    MappedRing *snap = g_snap.exchange(nullptr, std::memory_order_acq_rel); // must match the new geometry
    unlock_swap();
    g_kb = kb;
    g_buffers = buffers;
    retire_ring(old);
    retire_ring(snap);
    return 0;
}
} // namespace

int set_buffer_size_kb(uint64_t kb) {
    if (kb == 0 || kb > kMaxKb) return -EINVAL;
    std::lock_guard lock(g_mu);
    return replace_main_locked(kb, g_buffers);
}

uint32_t ring_buffer_count() {
    std::lock_guard lock(g_mu);
    return g_buffers;
}

int set_ring_buffer_count(uint32_t n) {
    if (n == 0 || n > 65536) return -EINVAL;
    std::lock_guard lock(g_mu);
    return replace_main_locked(g_kb, n);
}

void ring_clear() {
    std::lock_guard lock(g_mu);
    if (MappedRing *r = g_main.load(std::memory_order_acquire)) ring_clear_view(r->view());
}

void ring_publish_profile(const uint8_t *table) {
    std::lock_guard lock(g_mu);
    g_profile.store(table, std::memory_order_release);
    for (const std::atomic<MappedRing *> *which : {&g_main, &g_snap})
        if (MappedRing *r = which->load(std::memory_order_acquire))
            r->hdr()->profile_addr.store(reinterpret_cast<uint64_t>(table), std::memory_order_release);
}

namespace {
bool try_lock_swap() {
    bool expected = false;
    return g_swap_busy.compare_exchange_strong(expected, true, std::memory_order_acquire);
}
void lock_swap() {
    while (!try_lock_swap()) sched_yield();
}
void unlock_swap() { g_swap_busy.store(false, std::memory_order_release); }

int snapshot_alloc_locked() {
    if (int err = init_locked(); err != 0) return err;
    if (g_snap.load(std::memory_order_acquire) != nullptr) return 0;
    MappedRing *main = g_main.load(std::memory_order_acquire);
    MappedRing *spare = map_ring(main->cap / 1024, main->hdr()->buffer_count);
    if (spare == nullptr) return -ENOMEM;
    g_snap.store(spare, std::memory_order_release);
    return 0;
}
} // namespace

int snapshot_alloc() {
    std::lock_guard lock(g_mu);
    return snapshot_alloc_locked();
}

bool snapshot_swap() {
    if (!try_lock_swap()) return false;
    MappedRing *spare = g_snap.load(std::memory_order_acquire);
    MappedRing *main = g_main.load(std::memory_order_acquire);
    if (spare == nullptr || main == nullptr) {
        unlock_swap();
        return false;
    }
    // The spare's buffers are free for the threads to claim again; writers still in the
    // old main finish their record there (it becomes part of the snapshot).
    for (uint32_t i = 0; i < spare->hdr()->buffer_count; ++i) {
        if (spare->tid_words != nullptr) spare->tid_words[i].store(0, std::memory_order_relaxed);
        spare->buffer(i)->owner.store(0, std::memory_order_relaxed);
    }
    g_main.store(spare, std::memory_order_release);
    g_snap.store(main, std::memory_order_release);
    unlock_swap();
    return true;
}

int snapshot_take() {
    std::lock_guard lock(g_mu);
    if (int err = snapshot_alloc_locked(); err != 0) return err;
    while (!snapshot_swap()) sched_yield(); // a probe hit's swap is under way
    return 0;
}

void snapshot_clear() {
    std::lock_guard lock(g_mu);
    if (MappedRing *r = g_snap.load(std::memory_order_acquire)) ring_clear_view(r->view());
}

void snapshot_free() {
    std::lock_guard lock(g_mu);
    lock_swap();
    MappedRing *r = g_snap.exchange(nullptr, std::memory_order_acq_rel);
    unlock_swap();
    retire_ring(r);
}

bool snapshot_allocated() { return g_snap.load(std::memory_order_acquire) != nullptr; }

int ring_memfd(size_t *size) {
    std::lock_guard lock(g_mu);
    if (init_locked() != 0) return -1;
    MappedRing *r = g_main.load(std::memory_order_acquire);
    if (size != nullptr) *size = r->size;
    return r->fd.number();
}

int ring_memfd_copy(size_t *size) {
    std::lock_guard lock(g_mu);
    if (int err = init_locked(); err != 0) return err;
    MappedRing *r = g_main.load(std::memory_order_acquire);
    if (size != nullptr) *size = r->size;
    // Under the lock: a resize retires (closes) the ring's own descriptor.
    return r->fd.copy();
}

int snapshot_memfd(size_t *size) {
    std::lock_guard lock(g_mu);
    MappedRing *r = g_snap.load(std::memory_order_acquire);
    if (r == nullptr) return -1;
    if (size != nullptr) *size = r->size;
    return r->fd.number();
}

int snapshot_memfd_copy(size_t *size) {
    std::lock_guard lock(g_mu);
    MappedRing *r = g_snap.load(std::memory_order_acquire);
    if (r == nullptr) return -ENOENT;
    if (size != nullptr) *size = r->size;
    return r->fd.copy();
}

int adopt_program_fds(pid_t from) {
    int err = 0;
    {
        std::lock_guard lock(g_mu);
        for (MappedRing *r : {g_main.load(std::memory_order_acquire), g_snap.load(std::memory_order_acquire)})
            if (r != nullptr && r->fd.in_program_table())
                if (const int rc = r->fd.adopt(from); rc != 0) err = rc;
    }
    if (const int rc = counters_adopt(from); rc != 0) err = rc;
    return err;
}

void close_adopted_program_fds() {
    {
        std::lock_guard lock(g_mu);
        for (MappedRing *r : {g_main.load(std::memory_order_acquire), g_snap.load(std::memory_order_acquire)})
            if (r != nullptr) r->fd.close_program_copy();
    }
    counters_close_adopted();
}

void ring_lock_views() {
    g_mu.lock();
    init_locked();
}
void ring_unlock_views() { g_mu.unlock(); }

RingView ring_main_view() {
    MappedRing *r = g_main.load(std::memory_order_acquire);
    return r != nullptr ? r->view() : RingView{};
}

RingView ring_snapshot_view() {
    MappedRing *r = g_snap.load(std::memory_order_acquire);
    return r != nullptr ? r->view() : RingView{};
}

} // namespace ukp::trace
