// The trace ring: binary records in shared memory (a memfd), one buffer per thread,
// written lock-free by probe hits and read by the trace files here or by a reader in
// another process that maps the memfd (docs/tracer-internals.md).
//
// The memfd holds a RingHeader, the buffer_count SlotHeaders side by side, then from
// data_offset the buffers' data, data_size bytes of records each, buffer_stride apart. The
// headers are together so that a reader looking at every buffer touches a few pages, not
// one per buffer (a page of a memfd first read is a page allocated). Everything in it is
// positions and sizes, no pointers, so any process can map it anywhere. A record in a
// buffer is a RecordHeader followed by the record of record.hpp (common_type first),
// padded to 8 bytes.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "trace/record.hpp"

namespace ukp::trace {

// ---- Hit path (a probe hit, in the calling thread's context) ----

// Lock-free, no allocation, no system call. Reserves room for a record of `size` bytes
// (<= kMaxRecordSize); null when there is no room (the loss is counted and shown by
// the reader, never silent) or tracing is off (not counted, as in ftrace). A nested call
// on the same thread (a probe hit in a signal handler that interrupted this thread
// between its reserve and commit) is refused and counted as lost. `comm`: the thread's
// name (16 bytes, NUL-terminated) as the caller keeps it, saved with the thread's buffer
// at its first record there (BufferHeader::comm); null saves none. `cpu`: the record's CPU
// if the caller read it already (platform::this_cpu, from the thread's rseq area), else
// negative.
uint8_t *ring_reserve(uint32_t size, const char *comm = nullptr, int cpu = -1);
// Publishes the record reserved at `rec`, `used` bytes of it (used <= size reserved);
// used == 0 discards it (a filter said no). Must follow every non-null ring_reserve.
void ring_commit(uint8_t *rec, uint32_t used);

// ---- Control (the tracefs files; not for the hit path) ----

// Maps the ring (idempotent). Call when the tracer starts: a thread's first record must
// find the ring mapped. 0 or -errno. The other functions call it too.
int ring_init();
extern std::atomic<bool> g_tracing_on; // tracing_on's flag (ring.cpp)
inline bool tracing_on() { return g_tracing_on.load(std::memory_order_relaxed); }
void set_tracing_on(bool on);
// Size of each per-thread buffer in KiB (the buffer_size_kb file). Setting it replaces
// the buffers (their records are dropped, as a resize may in ftrace). 0 or -errno.
uint64_t buffer_size_kb();
int set_buffer_size_kb(uint64_t kb);
// Number of per-thread buffers (threads that can record at once). Replaces the buffers.
uint32_t ring_buffer_count();
int set_ring_buffer_count(uint32_t n);
// Empties the buffers and resets their counters (writing to the trace file).
void ring_clear();
// Names the kprobe_profile counter table (profile_table.hpp) in the buffers' header, now
// and in every ring made later; null: none. The table stays valid until replaced. The
// child of a fork() sets the counters it lists to 0 before it makes its own buffers.
void ring_publish_profile(const uint8_t *table);

// The snapshot file: ftrace's semantics. take: allocate the spare buffers if needed and
// swap them with the main ones (writing 1); clear: empty the snapshot (any other
// number); free: release it (writing 0). 0 or -errno.
int snapshot_take();
// For the snapshot trigger: allocate the spare when the trigger is set (control side),
// then swap from the probe hit (lock-free, no system call; false, doing nothing, when
// no spare is allocated or another swap is under way).
int snapshot_alloc();
bool snapshot_swap();
void snapshot_clear();
void snapshot_free();
bool snapshot_allocated();

// ---- Notices to a supervisor (`ukprobe run`) ----

// A system call that changes nothing, rt_sigprocmask(SIG_SETMASK, NULL, NULL, 8), with
// kNoticeMagic in its fifth argument register and the kind in its sixth (both ignored by
// the kernel). `ukprobe run`'s seccomp filter hands exactly these to it, and lets every
// other rt_sigprocmask of the program run without a round trip.
inline constexpr long kNoticeMagic = 0x75707262; // "brpu"
// This process has buffers of its own (a child of fork()): the supervisor takes them now.
// The bits above kNoticeKindBits carry the pid of the process it was forked from (0 from
// an agent before they did): by the time the supervisor looks, that process may have
// exited and the child been given to another parent (a daemon forked by a program that
// exits at once).
inline constexpr long kNoticeForkedRing = 1;
inline constexpr int kNoticeKindBits = 8;
// The control thread listens: the supervisor connects while the caller waits, before main.
inline constexpr long kNoticeControlReady = 2;
// Given by a process started under `ukprobe run` before it applies UKP_EVENTS: is the
// supervisor still there? It answers kNoticeDone.
inline constexpr long kNoticeHello = 3;
// What a supervisor answers to kNoticeForkedRing once it holds the child's memfds, or
// wants none: the child closes its own (without a supervisor the call returns 0); and to
// kNoticeHello.
inline constexpr long kNoticeDone = 0x656e6f64; // "done"
// What it answers to kNoticeForkedRing when it takes the memfds later (at the child's
// exit): the child keeps them.
inline constexpr long kNoticeKeep = 0x7065656b; // "keep"
// Gives notice `kind`; the caller waits while a supervisor acts on it. The supervisor's
// answer, or 0.
long notify_supervisor(long kind);
// Whether this process was started under `ukprobe run` (UKP_SUPERVISED=1 in its
// environment) and the supervisor is gone: killed, its keeper lets every notice go on
// unanswered (the call returns 0), and nobody will read this process's trace.
bool supervisor_gone(long answer);

// ---- The shared layout, for a reader in another process ----

inline constexpr uint64_t kRingMagic = 0x31474e4952504b55ull; // "UKPRING1"
inline constexpr uint32_t kRingVersion = 5;
inline constexpr uint32_t kCommEntries = 256; // names of exited threads kept
inline constexpr uint32_t kClockMonotonicNs = 0, kClockTsc = 1;
inline constexpr uint32_t kClockSegments = 64;

// How TSC ticks from tsc0 on become CLOCK_MONOTONIC ns: ns0 + (ticks - tsc0) * mult / 2^32.
// A segment never changes once published, so a record reads the same every time.
struct ClockSegment {
    uint64_t tsc0;
    uint64_t ns0;
    uint64_t mult; // ns per tick, times 2^32
};

// TSC ticks `raw` in CLOCK_MONOTONIC ns by segment s (raw may be before s.tsc0).
inline uint64_t clock_convert(const ClockSegment &s, uint64_t raw) {
    const __int128 d = static_cast<__int128>(static_cast<int64_t>(raw - s.tsc0)) * static_cast<__int128>(s.mult);
    return s.ns0 + static_cast<uint64_t>(static_cast<int64_t>(d >> 32));
}

// A thread's name, saved when it exits (the reader's saved_cmdlines).
struct CommEntry {
    std::atomic<int32_t> tid; // 0 while being written
    char comm[16];            // NUL-terminated
};

// At offset 0 of the memfd.
struct RingHeader {
    uint64_t magic;                          // kRingMagic
    uint32_t version;                        // kRingVersion
    uint32_t header_size;                    // sizeof(RingHeader), rounded up: where BufferHeader 0 is
    uint32_t buffer_count;                   // number of per-thread buffers
    uint32_t buffer_header_size;             // sizeof(BufferHeader): from one BufferHeader to the next
    uint64_t buffer_stride;                  // bytes from one buffer's data to the next's
    uint64_t data_size;                      // bytes of records a buffer holds (a multiple of 8)
    int32_t pid;                             // the traced process (for /proc/PID/task/TID/comm)
    uint32_t generation;                     // distinct per ring of this process
    std::atomic<uint64_t> lost_no_buffer;    // records refused: every buffer in use, or the thread exiting
    uint64_t lost_no_slot_base;              // reader-owned: lost_no_buffer at the last clear
    std::atomic<uint64_t> lost_no_slot_seen; // consumers: lost_no_buffer as last reported (a LOST line)
    std::atomic<uint32_t> comm_next;         // next CommEntry to fill (mod kCommEntries)
    uint32_t clock;                          // what RecordHeader::ts counts: kClockMonotonicNs or kClockTsc
    CommEntry comms[kCommEntries];
    // kClockTsc: the conversion, a table of segments. segments[0] starts at a (TSC,
    // CLOCK_MONOTONIC) pair taken when the ring was made; a writer (or reader) whose
    // TSC passes clock_next adds one, at spacings that double, measuring the rate since
    // segments[0] and steering back towards CLOCK_MONOTONIC without a jump.
    std::atomic<uint32_t> clock_count; // segments published
    std::atomic<uint32_t> clock_busy;  // 1 while someone adds one (try-lock: never waited on)
    std::atomic<uint64_t> clock_next;  // TSC at which the next segment is due (~0: table full)
    uint64_t clock_mono0;              // CLOCK_MONOTONIC at segments[0].tsc0, as measured
    ClockSegment segments[kClockSegments];
    // Where the process keeps its kprobe_profile counter table (profile_table.hpp): its
    // address there, 0 when none. Readers take the counts from the counters' own memfd
    // (counters.hpp), which outlives the process; this stays for debuggers.
    std::atomic<uint64_t> profile_addr;
    uint64_t data_offset; // where buffer 0's data begins (page-aligned)
    // The inode of the traced process's pid namespace, 0 if unknown: `pid` and the
    // records' common_pid are numbers there (a reader in another one translates them).
    uint64_t pid_ns;
};

// One per-thread buffer. Positions are byte counts since the buffer was created; a
// position p lives at data offset p % data_size. Records never wrap: a pad record fills
// the end of the data area when the next record does not fit.
struct alignas(64) BufferHeader {
    std::atomic<uint32_t> owner; // 0 free, else the tid of the thread that claimed it
                                 // (CAS; 1 where the agent could not learn tids)
    std::atomic<int32_t> tid;    // common_pid of the last committed record
    std::atomic<uint32_t> busy;  // 1 between reserve and commit (writer-owned)
    uint32_t reserved0;
    std::atomic<uint64_t> head;            // end of the last committed record (writer-owned)
    std::atomic<uint64_t> reserve_end;     // end of the room being written: data at positions
                                           // below reserve_end - data_size may be overwritten
    std::atomic<uint64_t> overrun;         // records overwritten (evicted) by the writer
    std::atomic<uint64_t> dropped;         // records refused (nested, too large)
    std::atomic<uint32_t> dropped_pending; // refused since the last commit: goes into the
                                           // next record's dropped_before
    uint32_t reserved1;
    alignas(64) std::atomic<uint64_t> tail; // oldest unconsumed record: moved by the writer
                                            // (eviction) and by a consuming reader (CAS)
    alignas(64) uint64_t overrun_base;      // reader-owned: overrun at the last clear
    uint64_t dropped_base;                  // reader-owned: dropped at the last clear
    uint64_t overrun_seen;                  // reader-owned: overruns trace_pipe reported (readers
                                            // in several processes raise it with a CAS)
    // The owning thread's name, written when it claims the buffer (its first record in
    // this ring: the name ring_reserve was given) and again when the process exits
    // normally: the reader's name for a thread gone from /proc without its exit handler
    // (a process that exited or was killed, a thread ended by a raw exit). Zero in a
    // ring of an older agent.
    std::atomic<int32_t> comm_tid; // whose name comm holds; 0 while it is written
    char comm[16];                 // NUL-terminated
};
static_assert(sizeof(BufferHeader) == 192, "the layout readers of version 2 and later expect");

// In front of each record in a buffer.
struct RecordHeader {
    uint16_t len;            // bytes of header + record + padding (a multiple of 8)
    uint16_t kind;           // kRecordKind or kPadKind
    uint16_t size;           // bytes of the record (what ring_commit was given)
    uint16_t cpu;            // the CPU at the hit, from the thread's rseq area (platform::this_cpu)
    uint32_t dropped_before; // records this thread lost just before this one
    uint32_t reserved;
    uint64_t ts; // RingHeader::clock: CLOCK_MONOTONIC ns, or TSC ticks
};
static_assert(sizeof(RecordHeader) == 24);
// A record's timestamp in CLOCK_MONOTONIC ns (ring_collect and ring_consume convert).
uint64_t ring_time_ns(const RingHeader *h, uint64_t raw);
inline constexpr uint16_t kRecordKind = 1, kPadKind = 2;

// A mapped ring (ours, or one an outside reader mapped from the memfd).
struct RingView {
    const uint8_t *base = nullptr;
    size_t size = 0;
    // The header when the view holds a valid ring of this version, else null.
    const RingHeader *header() const;
    // Buffer i's header and data, in a view header() accepted.
    BufferHeader *buffer(uint32_t i) const; // readers move tail and their own fields
    const uint8_t *data(uint32_t i) const;
};

// The memfd of the main buffers and of the snapshot (-1 when none) and their sizes, for
// a reader in another process; changes when the buffers are replaced (resize, snapshot).
int ring_memfd(size_t *size);
// A descriptor of its own for the main buffers' memfd (close-on-exec; the caller closes
// it), or -errno: what the control socket passes to a controller.
int ring_memfd_copy(size_t *size);
int snapshot_memfd(size_t *size);
// A descriptor of its own for the snapshot buffers' memfd, as ring_memfd_copy; -ENOENT
// when no snapshot is allocated.
int snapshot_memfd_copy(size_t *size);

// The memfds of the buffers and of the counters, made on threads of the program, move to
// the table of the calling thread, which has a table of its own (the control thread's,
// platform/held_fd.hpp): reopened from that of `from`, a thread of the program. 0, or the
// last -errno (what could not be adopted stays where it was).
int adopt_program_fds(pid_t from);
// Then, on a thread of the program: the program's copies are closed.
void close_adopted_program_fds();

// ---- Reading (output.cpp and outside readers) ----

// One record copied out of a buffer.
struct RingEntry {
    uint64_t ts = 0; // CLOCK_MONOTONIC, nanoseconds
    uint32_t cpu = 0;
    uint32_t buffer = 0;
    uint64_t lost_before = 0; // events lost just before this one in its buffer
    std::vector<uint8_t> rec; // the record (common_type first), `size` bytes
};

struct RingCounts {
    uint64_t entries = 0; // records in the buffers (entries-in-buffer)
    uint64_t written = 0; // entries + overwritten + lost since the last clear
    uint64_t overrun = 0; // overwritten since the last clear
    uint64_t lost = 0;    // refused since the last clear (nesting, size, no buffer)
};

// Every valid record of the view in timestamp order, without consuming them. A record
// torn by a concurrent writer is left out (the writer counted it as overwritten).
// lost_before holds the refused records only (ftrace's trace file shows overruns in
// its header, not as LOST lines).
std::vector<RingEntry> ring_collect(const RingView &v, RingCounts *counts);
// Consumes the oldest record of the view into *out (lost_before: overwritten and refused
// records before it). False when the buffers are empty. Consumers in any number of
// processes may run at once: each record goes to exactly one of them (a CAS on tail).
// Looks at every buffer: to consume many records, use a RingMerger.
bool ring_consume(const RingView &v, RingEntry *out);
// The records refused without a buffer (lost_no_buffer: a thread past its exit destructor,
// every buffer in use) since a consumer last reported them; each is reported once, by the
// consumer that claims it (a LOST line of trace_pipe).
uint64_t ring_claim_lost_no_buffer(const RingView &v);

// Consumes records oldest first, as ring_consume does, at O(log n) a record for n
// buffers holding records: a heap of each buffer's oldest record, made once (a buffer
// that had none then is not looked at again; make a new merger to see it).
class RingMerger {
public:
    explicit RingMerger(const RingView &v);
    // The next record; false when the buffers seen are empty. *out's storage is reused.
    bool next(RingEntry *out);

private:
    struct Head {
        uint64_t ts;  // the record's raw timestamp
        uint64_t pos; // its position in the buffer
        uint32_t buffer;
        RecordHeader rh;
        std::vector<uint8_t> rec; // a copy of it
    };
    bool peek(uint32_t buffer, Head *h); // the buffer's oldest record
    void push(Head h);
    Head pop();

    RingView v_;
    const RingHeader *h_;
    std::vector<Head> heap_; // min-heap on ts
};
// The oldest records of one buffer, consumed at once (ring_consume_batch): for a reader
// that wants them in bulk and merges buffers itself (ukprobe record), one copy and one
// CAS on tail instead of a heap step per record.
struct RingBatch {
    struct Record {
        RecordHeader header;    // ts raw (ring_time_ns converts), cpu, size
        uint32_t offset;        // of the record (common_type first) in bytes
        uint64_t lost_before;   // overwritten and refused records just before it
    };                          // (header.kind 0: no record, a loss alone)
    std::vector<uint8_t> bytes; // the buffer's bytes, copied (at its start; it may be longer)
    std::vector<Record> records;
};
// Consumes the oldest records of buffer `buffer`, about max_bytes of them (at least one
// whole record), into *out. False when the buffer is empty (or its writer keeps
// overwriting it faster than it is read: the next call tries again). Safe with other
// consumers, as ring_consume: each record goes to one of them.
bool ring_consume_batch(const RingView &v, uint32_t buffer, size_t max_bytes, RingBatch *out);

// Whether the view has an unconsumed record.
bool ring_has_data(const RingView &v);
// What a reader that polls paces itself by: how full the view's fullest buffer is (its
// unconsumed bytes over what it holds, 0 to 1), the bytes its buffers were ever written
// (their heads' sum: the rate is its change) and what one buffer holds.
struct RingLevel {
    double fill = 0;
    uint64_t written = 0;
    uint64_t buffer_bytes = 0;
};
RingLevel ring_level(const RingView &v);
// Empties the buffers of a view and resets its counters (a reader can do it too).
void ring_clear_view(const RingView &v);

// Runs fn with the views of the main and snapshot buffers while they cannot be
// replaced (in-process readers).
template <typename Fn>
void with_ring_views(Fn &&fn);
void ring_lock_views();
void ring_unlock_views();
RingView ring_main_view();     // only between ring_lock_views and ring_unlock_views
RingView ring_snapshot_view(); // idem; empty when no snapshot is allocated

template <typename Fn>
void with_ring_views(Fn &&fn) {
    ring_lock_views();
    fn(ring_main_view(), ring_snapshot_view());
    ring_unlock_views();
}

// The name of thread `tid` of process `pid` as the reader shows it: its name in /proc,
// else one the view saved (an exited thread's, or a buffer owner's), else "<...>"
// (ftrace's unknown).
std::string ring_thread_name(const RingView &v, int32_t pid, int32_t tid);

} // namespace ukp::trace
