// Hardware breakpoints (<ukprobes/hw_breakpoint.h>): the kernel's hw_breakpoint API over
// perf events of the process's own threads.
//
// Each breakpoint is one perf event per thread it covers (PERF_TYPE_BREAKPOINT, sigtrap,
// remove_on_exec): a hit makes the kernel send the thread a synchronous SIGTRAP with
// si_code TRAP_PERF and the event's sig_data, which the agent's SIGTRAP handler brings
// here. sig_data names a slot of a fixed table and the slot's generation, so a signal of a
// breakpoint removed meanwhile finds a slot that moved on and is dropped, never delivered
// to the program, which did not ask for it.
//
// A wide breakpoint has an event on every thread there is when it is registered, each
// with `inherit` and `inherit_thread`: threads started later get a copy from the one that
// starts them. A thread started while the list of threads is read may get both a copy and
// an event of its own; each event carries its own instance number in sig_data, and a
// thread runs the handler for the first instance it sees of a breakpoint only.
#include "core/core.hpp"
#include "core/grace.hpp"
#include "symbols/symbols.hpp"
#include "platform/held_fd.hpp"
#include "platform/high_fd.hpp"
#include "platform/raw_syscall.hpp"

#include <ukprobes/hw_breakpoint.h>

#include <fmt/core.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/resource.h>
#include <mutex>
#include <new>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <vector>

namespace ukp::core {
namespace {

// sig_data: a tag, the slot, the slot's generation, and the event's instance.
constexpr uint64_t kTag = 0xb7e5;
constexpr unsigned kSlotBits = 12, kGenerationBits = 16, kInstanceBits = 20;
constexpr unsigned kSlots = 1u << kSlotBits;
constexpr uint32_t kInstanceMask = (1u << kInstanceBits) - 1;

uint64_t sig_data(unsigned slot, uint32_t generation, uint32_t instance) {
    return kTag << 48 | uint64_t{slot} << (kGenerationBits + kInstanceBits) |
           uint64_t{generation & 0xffff} << kInstanceBits | (instance & kInstanceMask);
}

// The kernel's siginfo for TRAP_PERF (asm-generic/siginfo.h, _sigfault._perf): glibc's
// siginfo_t does not name these fields.
struct PerfSiginfo {
    int signo, errno_, code, pad;
    void *addr;
    unsigned long data;
    uint32_t type, flags;
};
static_assert(offsetof(PerfSiginfo, data) == 24 && offsetof(PerfSiginfo, type) == 32);

struct Instance {
    int fd;
    pid_t tid;
    uint64_t sig_data; // a modification must give it back unchanged
    pid_t holder;      // the agent thread whose own table holds fd (the control thread), or
                       // 0: the program's table
};

// Which table the calling thread's descriptors go to (Instance::holder).
pid_t table_of_caller() { return platform::has_own_fd_table() ? current_tid() : 0; }

// A placeable breakpoint's state (place_breakpoint, lift_breakpoint): changed by a CAS, so
// that of two hits at once one acts and the other finds it busy.
enum PlaceState : int { kUnplaced, kBusy, kPlaced, kGone };
// Threads a placeable breakpoint covers at most (its instances are reserved when it is
// prepared: a hit allocates nothing).
constexpr size_t kMaxPlacedThreads = 512;

// A breakpoint's part that is the agent's (perf_event::ukp_private).
struct Breakpoint {
    unsigned slot = 0;
    uint32_t generation = 0;
    bool wide = false;
    perf_event_attr opened{}; // as given to the kernel: a modification must match it
    std::vector<Instance> instances;
    uint32_t next_instance = 1;
    bool placeable = false;            // placed and lifted by probe hits
    std::atomic<int> state{kUnplaced}; // placeable ones
    int fd_floor = 0;                  // placeable ones: where their descriptors go (move_fd_high's)
};

struct Slot {
    std::atomic<perf_event *> event{nullptr};
    std::atomic<uint32_t> generation{0};
};
Slot g_slots[kSlots];
std::mutex g_mutex; // registration, modification, removal; taken around fork()

// Per thread, the instance of each breakpoint it answers to (the first it saw): as many
// entries as a thread has debug registers (the oldest goes first). Initial-exec TLS, which
// an agent loaded by `ukprobe attach` takes from the C library's small static reserve.
struct Seen {
    uint32_t key; // slot << 16 | generation, 0: free
    uint32_t instance;
};
constexpr unsigned kSeen = 4;
thread_local Seen t_seen[kSeen] __attribute__((tls_model("initial-exec")));
thread_local unsigned t_seen_next __attribute__((tls_model("initial-exec")));

// Whether this thread answers to `instance` of the breakpoint `key`.
bool answers_to(uint32_t key, uint32_t instance) {
    for (Seen &s : t_seen)
        if (s.key == key) return s.instance == instance;
    t_seen[t_seen_next++ % kSeen] = Seen{key, instance};
    return true;
}

int open_event(const perf_event_attr &attr, pid_t tid) {
    perf_event_attr a = attr;
    const long fd = syscall(SYS_perf_event_open, &a, tid, -1, -1, PERF_FLAG_FD_CLOEXEC);
    if (fd < 0) return errno == E2BIG ? -EOPNOTSUPP : -errno;
    return platform::move_fd_high(static_cast<int>(fd));
}

// The attributes the kernel gets for `attr`: a user-space breakpoint that signals the
// thread that hit it, and is gone at exec.
int kernel_attr(const perf_event_attr *attr, bool wide, perf_event_attr *out) {
    if (attr == nullptr || attr->type != PERF_TYPE_BREAKPOINT) return -EINVAL;
    const uint32_t type = attr->bp_type;
    if (type != HW_BREAKPOINT_R && type != HW_BREAKPOINT_W && type != HW_BREAKPOINT_RW && type != HW_BREAKPOINT_X)
        return -EINVAL;
    *out = perf_event_attr{};
    out->type = PERF_TYPE_BREAKPOINT;
    out->size = sizeof *out;
    out->bp_type = type;
    out->bp_addr = attr->bp_addr;
    out->bp_len = attr->bp_len;
    out->sample_period = 1;
    out->disabled = attr->disabled;
    out->pinned = attr->pinned;
    out->exclude_kernel = 1;
    out->exclude_hv = 1;
    out->sigtrap = 1;
    out->remove_on_exec = 1;
    out->inherit = wide;
    out->inherit_thread = wide;
    return 0;
}

// Whether `tid` is a thread of this process.
bool our_thread(pid_t tid) {
    char path[64];
    snprintf(path, sizeof path, "/proc/self/task/%d", static_cast<int>(tid));
    return access(path, F_OK) == 0;
}

// Calls f(tid) for each thread of the process, from /proc/self/task by raw system calls
// with nothing allocated (a probe hit calls it too); a non-zero answer of f stops it. 0,
// f's answer, or -errno.
template <typename F>
int for_each_thread(F &&f) {
    alignas(8) char buf[2048];
    const long dir =
        platform::raw_syscall(SYS_open, reinterpret_cast<long>("/proc/self/task"), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir < 0) return int(dir);
    int r = 0;
    for (long n;
         r == 0 && (n = platform::raw_syscall(SYS_getdents64, dir, reinterpret_cast<long>(buf), sizeof buf)) > 0;)
        for (long off = 0; r == 0 && off < n;) {
            const auto *d = reinterpret_cast<const struct dirent64 *>(buf + off);
            off += d->d_reclen;
            pid_t tid = 0;
            for (const char *c = d->d_name; *c >= '0' && *c <= '9'; ++c) tid = tid * 10 + (*c - '0');
            if (tid != 0) r = f(tid);
        }
    platform::raw_syscall(SYS_close, dir);
    return r;
}

// A descriptor of i's event the caller can use, or -errno: i's own when the caller's table
// holds it; from the control thread's own table, a copy of one in the program's
// (pidfd_getfd; *copy set: the caller closes it). The reverse cannot be reached: -EXDEV.
int usable_fd(const Instance &i, bool *copy) {
    *copy = false;
    if (i.holder == table_of_caller()) return i.fd;
    if (i.holder != 0) return -EXDEV;
    const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, getpid(), 0));
    if (pidfd < 0) return -errno;
    const int fd = static_cast<int>(syscall(SYS_pidfd_getfd, pidfd, i.fd, 0));
    const int err = errno;
    close(pidfd);
    if (fd < 0) return -err;
    *copy = true;
    return fd;
}

// Ends an instance's event: its descriptor closed where the caller's table holds it;
// else disabled through a copy, its number left to the program's table; else (the control
// thread's) left until that table closes. Either way the slot moves on, so what it still
// signals is dropped.
void close_instance(const Instance &i) {
    bool copy = false;
    const int fd = usable_fd(i, &copy);
    if (fd < 0) return;
    if (!copy) {
        close(fd);
        return;
    }
    ioctl(fd, PERF_EVENT_IOC_DISABLE, 0);
    close(fd);
}

// Descriptors of the program's table that a thread with its own table could only
// disable: closed by a program thread, the one free_breakpoint() asks through the stop
// signal (opt_ask_program_thread), or else the next that registers, places or lifts a
// breakpoint. Each is checked to be a perf event still (the program may have closed the
// number and opened something else under it).
constexpr size_t kMaxDeferred = 1024;
// How long a detach waits for a program thread to close them (opt_ask_program_thread).
constexpr int kAskTimeoutMs = 400;
int g_deferred[kMaxDeferred];
std::atomic<size_t> g_deferred_count{0};
// Taken by a try-lock on the hit side (a hit may interrupt its own thread holding it: it
// leaves the closing to the next one), with a wait by the control thread, which never hits.
std::atomic_flag g_deferred_busy = ATOMIC_FLAG_INIT;

void defer_close(int fd) {
    while (g_deferred_busy.test_and_set(std::memory_order_acquire)) sched_yield();
    if (const size_t n = g_deferred_count.load(std::memory_order_relaxed); n < kMaxDeferred) {
        g_deferred[n] = fd;
        g_deferred_count.store(n + 1, std::memory_order_release);
    }
    g_deferred_busy.clear(std::memory_order_release);
}

// Whether fd of the caller's table is a perf event: /proc/self/fd/N reads
// "anon_inode:[perf_event]". Raw system calls: called from probe hits.
bool is_perf_event(int fd) {
    char path[40] = "/proc/self/fd/", link[32] = {};
    char *p = path + 14;
    char digits[12];
    int n = 0;
    for (unsigned v = static_cast<unsigned>(fd); n == 0 || v != 0; v /= 10) digits[n++] = char('0' + v % 10);
    while (n > 0) *p++ = digits[--n];
    *p = '\0';
    const long len = platform::raw_syscall(SYS_readlink, reinterpret_cast<long>(path), reinterpret_cast<long>(link),
                                           sizeof link - 1);
    static constexpr char kWant[] = "anon_inode:[perf_event]";
    if (len != long(sizeof kWant - 1)) return false;
    for (long i = 0; i < len; ++i)
        if (link[i] != kWant[i]) return false;
    return true;
}

// On a thread of the program's table: closes what defer_close() left.
void close_deferred() {
    if (platform::has_own_fd_table() || g_deferred_busy.test_and_set(std::memory_order_acquire)) return;
    for (size_t n = g_deferred_count.load(std::memory_order_relaxed); n > 0; --n) {
        const int fd = g_deferred[n - 1];
        if (is_perf_event(fd)) platform::raw_syscall(SYS_close, fd);
        g_deferred_count.store(n - 1, std::memory_order_release);
    }
    g_deferred_busy.clear(std::memory_order_release);
}

void close_instances(Breakpoint &b) {
    for (const Instance &i : b.instances) {
        close_instance(i);
        if (i.holder == 0 && table_of_caller() != 0) defer_close(i.fd);
    }
    b.instances.clear();
}

// Opens b's event on `tid`. 0, or -errno (-ESRCH: the thread is gone).
int add_instance(Breakpoint &b, pid_t tid) {
    perf_event_attr a = b.opened;
    const uint32_t instance = b.next_instance++;
    a.sig_data = sig_data(b.slot, b.generation, instance);
    const int fd = open_event(a, tid);
    if (fd < 0) return fd;
    b.instances.push_back(Instance{fd, tid, a.sig_data, table_of_caller()});
    return 0;
}

// Events on every thread: until a pass over /proc/self/task finds none without one.
// Events of b on every thread, opened by open(tid) (0; -ESRCH: the thread ended meanwhile;
// -errno): until a pass over the threads finds none without one.
template <typename Open>
int cover_threads(Breakpoint &b, Open open) {
    for (bool added = true; added;) {
        added = false;
        const int err = for_each_thread([&](pid_t tid) {
            for (const Instance &i : b.instances)
                if (i.tid == tid) return 0;
            const int e = open(tid);
            added |= e == 0;
            return e == -ESRCH ? 0 : e;
        });
        if (err != 0) return err;
    }
    return 0;
}

int cover_every_thread(Breakpoint &b) {
    return cover_threads(b, [&](pid_t tid) { return add_instance(b, tid); });
}

int take_slot(Breakpoint &b) {
    for (unsigned i = 0; i < kSlots; ++i) {
        if (g_slots[i].event.load(std::memory_order_relaxed) != nullptr) continue;
        b.slot = i;
        b.generation = (g_slots[i].generation.load(std::memory_order_relaxed) + 1) & 0xffff;
        if (b.generation == 0) b.generation = 1;
        g_slots[i].generation.store(b.generation, std::memory_order_relaxed);
        return 0;
    }
    return -ENOSPC;
}

// Whether the breakpoints the kernel gives are ever hit: a virtual machine may offer the
// breakpoint PMU with no debug registers behind it (Firecracker's guests: perf_event_open
// succeeds, and no write is ever counted), where a watch would stay silent for good.
// Looked at once, by a counting breakpoint on a word of the agent's own: 0, or -ENODEV.
int debug_registers_fire() {
    static std::atomic<int> verdict{0}; // 1: they fire (or could not be looked at), else -ENODEV
    if (const int v = verdict.load(std::memory_order_acquire); v != 0) return v > 0 ? 0 : v;
    static volatile uint64_t word;
    perf_event_attr a{};
    a.type = PERF_TYPE_BREAKPOINT;
    a.size = sizeof a;
    a.bp_addr = reinterpret_cast<uintptr_t>(&word);
    a.bp_len = HW_BREAKPOINT_LEN_8;
    a.bp_type = HW_BREAKPOINT_W;
    a.exclude_kernel = 1;
    a.exclude_hv = 1;
    const long fd = syscall(SYS_perf_event_open, &a, 0, -1, -1, PERF_FLAG_FD_CLOEXEC);
    if (fd < 0) return 0; // the registration gets the kernel's own error
    word = word + 1;
    uint64_t count = 0;
    const bool counted = read(static_cast<int>(fd), &count, sizeof count) == sizeof count;
    close(static_cast<int>(fd));
    const int v = counted && count == 0 ? -ENODEV : 1;
    verdict.store(v, std::memory_order_release);
    return v > 0 ? 0 : v;
}

perf_event *register_breakpoint(perf_event_attr *attr, perf_overflow_handler_t triggered, void *context, pid_t tid,
                                bool wide) {
    if (triggered == nullptr) return static_cast<perf_event *>(ERR_PTR(-EINVAL));
    // A debugger takes every SIGTRAP its tracee gets, the perf signals too (gdb keeps them):
    // the handler would never run.
    if (process_traced()) return static_cast<perf_event *>(ERR_PTR(-EBUSY));
    if (int err = debug_registers_fire(); err != 0) return static_cast<perf_event *>(ERR_PTR(err));
    if (int err = prepare_agent(); err != 0) return static_cast<perf_event *>(ERR_PTR(err));
    auto *b = new (std::nothrow) Breakpoint;
    auto *ev = new (std::nothrow) perf_event{};
    if (b == nullptr || ev == nullptr) {
        delete b;
        delete ev;
        return static_cast<perf_event *>(ERR_PTR(-ENOMEM));
    }
    b->wide = wide;
    int err = kernel_attr(attr, wide, &b->opened);
    if (err == 0 && !wide && tid == 0) tid = current_tid();
    if (err == 0 && !wide && !our_thread(tid)) err = -ESRCH;
    std::lock_guard lock(g_mutex);
    close_deferred();
    if (err == 0) err = take_slot(*b);
    if (err == 0) err = wide ? cover_every_thread(*b) : add_instance(*b, tid);
    if (err != 0) {
        close_instances(*b); // nothing half-applied
        delete b;
        delete ev;
        return static_cast<perf_event *>(ERR_PTR(err));
    }
    ev->attr = *attr;
    ev->overflow_handler = triggered;
    ev->overflow_handler_context = context;
    ev->tid = wide ? 0 : tid;
    ev->self = ev;
    ev->ukp_private = b;
    g_slots[b->slot].event.store(ev, std::memory_order_release);
    return ev;
}

Breakpoint *breakpoint_of(const perf_event *ev) {
    return ev == nullptr || IS_ERR(ev) ? nullptr : static_cast<Breakpoint *>(ev->ukp_private);
}

// The fields a modification may change (the kernel's hw_breakpoint_copy_attr()).
void copy_modifiable(const perf_event_attr &from, perf_event_attr *to) {
    to->bp_addr = from.bp_addr;
    to->bp_type = from.bp_type;
    to->bp_len = from.bp_len;
    to->disabled = from.disabled;
}

int modify_instances(Breakpoint &b, const perf_event_attr &next) {
    // The kernel compares every other field with the event's own, sig_data included.
    auto modify = [](const Instance &i, perf_event_attr a) {
        a.sig_data = i.sig_data;
        bool copy = false;
        const int fd = usable_fd(i, &copy);
        if (fd < 0) return fd;
        const int r = ioctl(fd, PERF_EVENT_IOC_MODIFY_ATTRIBUTES, &a) == 0 ? 0 : -errno;
        if (copy) close(fd);
        return r;
    };
    for (size_t k = 0; k < b.instances.size(); ++k) {
        const int err = modify(b.instances[k], next);
        if (err == 0 || err == -ESRCH) continue;                         // ESRCH: a thread that ended
        for (size_t j = 0; j < k; ++j) modify(b.instances[j], b.opened); // back as they were
        return err;
    }
    return 0;
}

void free_breakpoint(perf_event *ev) {
    Breakpoint *b = breakpoint_of(ev);
    if (b == nullptr) return;
    if (b->placeable) {
        // A hit placing or lifting it finishes first; none starts afterwards.
        for (int st = b->state.load(); st == kBusy || !b->state.compare_exchange_weak(st, kGone); st = b->state.load())
            if (st == kBusy) sched_yield();
    }
    {
        std::lock_guard lock(g_mutex);
        close_instances(*b);
        Slot &s = g_slots[b->slot];
        s.event.store(nullptr, std::memory_order_release);
        s.generation.store((b->generation + 1) & 0xffff, std::memory_order_release);
    }
    // Removed from a table of its own (the control thread's detach), events that hits placed
    // were only disabled: a program thread closes them, so none stays in the program's table.
    if (table_of_caller() != 0 && !hw_breakpoints_none_deferred())
        opt_ask_program_thread(hw_breakpoints_none_deferred, kAskTimeoutMs);
    // A thread in the handler now has its read section: once it is over, nothing uses ev.
    if (synchronize()) {
        delete b;
        delete ev;
    }
}

// Opens b's events, at its address, on every thread, from a probe hit: raw system calls, no
// allocation (b's instances were reserved), its descriptors moved to b's floor. 0 or -errno.
int cover_threads_from_hit(Breakpoint &b) {
    return cover_threads(b, [&](pid_t tid) {
        if (b.instances.size() >= b.instances.capacity()) return 0; // past the reserve: not covered
        perf_event_attr a = b.opened;
        a.sig_data = sig_data(b.slot, b.generation, b.next_instance++);
        long fd =
            platform::raw_syscall(SYS_perf_event_open, reinterpret_cast<long>(&a), tid, -1, -1, PERF_FLAG_FD_CLOEXEC);
        if (fd < 0) return int(fd == -E2BIG ? -EOPNOTSUPP : fd);
        const long high = platform::raw_syscall(SYS_fcntl, fd, F_DUPFD_CLOEXEC, b.fd_floor);
        if (high >= 0) {
            platform::raw_syscall(SYS_close, fd);
            fd = high;
        }
        b.instances.push_back(Instance{int(fd), tid, a.sig_data, 0});
        return 0;
    });
}

// Closes b's events from a hit, its slot's generation moved on first: what they signal
// meanwhile is dropped.
void uncover_from_hit(Breakpoint &b) {
    b.generation = (b.generation + 1) & 0xffff;
    if (b.generation == 0) b.generation = 1;
    g_slots[b.slot].generation.store(b.generation, std::memory_order_release);
    for (const Instance &i : b.instances) platform::raw_syscall(SYS_close, i.fd);
    b.instances.clear(); // keeps its storage
}

} // namespace

perf_event *prepare_placeable_breakpoint(const perf_event_attr &attr, perf_overflow_handler_t triggered,
                                         void *context) {
    if (triggered == nullptr) return static_cast<perf_event *>(ERR_PTR(-EINVAL));
    if (process_traced()) return static_cast<perf_event *>(ERR_PTR(-EBUSY));
    if (int err = debug_registers_fire(); err != 0) return static_cast<perf_event *>(ERR_PTR(err));
    if (int err = prepare_agent(); err != 0) return static_cast<perf_event *>(ERR_PTR(err));
    auto *b = new (std::nothrow) Breakpoint;
    auto *ev = new (std::nothrow) perf_event{};
    int err = b == nullptr || ev == nullptr ? -ENOMEM : kernel_attr(&attr, true, &b->opened);
    if (err == 0) {
        b->wide = true;
        b->placeable = true;
        b->opened.disabled = 0;
        b->instances.reserve(kMaxPlacedThreads);
        rlimit lim{};
        b->fd_floor = getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY
                          ? int(std::min<rlim_t>(lim.rlim_cur / 2, 512))
                          : 512;
        std::lock_guard lock(g_mutex);
        err = take_slot(*b);
        if (err == 0) {
            ev->attr = attr;
            ev->overflow_handler = triggered;
            ev->overflow_handler_context = context;
            ev->self = ev;
            ev->ukp_private = b;
            g_slots[b->slot].event.store(ev, std::memory_order_release);
        }
    }
    if (err != 0) {
        delete b;
        delete ev;
        return static_cast<perf_event *>(ERR_PTR(err));
    }
    return ev;
}

int place_breakpoint(perf_event *bp, uint64_t addr) noexcept {
    Breakpoint *b = breakpoint_of(bp);
    if (b == nullptr || !b->placeable) return -EINVAL;
    if (addr == 0 || addr >= (uint64_t{1} << 47) || addr % b->opened.bp_len != 0) return -EINVAL;
    int st = kUnplaced;
    if (!b->state.compare_exchange_strong(st, kBusy, std::memory_order_acquire)) return -EBUSY;
    close_deferred();
    b->opened.bp_addr = addr;
    bp->attr.bp_addr = addr; // what the handler reports
    const int err = cover_threads_from_hit(*b);
    if (err != 0) uncover_from_hit(*b);
    b->state.store(err == 0 ? kPlaced : kUnplaced, std::memory_order_release);
    return err;
}

int lift_breakpoint(perf_event *bp) noexcept {
    Breakpoint *b = breakpoint_of(bp);
    if (b == nullptr || !b->placeable) return -EINVAL;
    int st = kPlaced;
    if (!b->state.compare_exchange_strong(st, kBusy, std::memory_order_acquire)) return -ENOENT;
    const bool own_table = table_of_caller() != 0;
    if (!own_table) {
        uncover_from_hit(*b); // a hit's (clear_wprobe), on a program thread: its table
        close_deferred();
    } else {
        // The control thread's (a set_wprobe or clear_wprobe trigger removed, a detach): the
        // events a hit placed are in the program's table, where the numbers mean nothing
        // here (closing them would close the control thread's own descriptors). Disabled
        // through a copy, then closed by a program thread.
        b->generation = (b->generation + 1) & 0xffff;
        if (b->generation == 0) b->generation = 1;
        g_slots[b->slot].generation.store(b->generation, std::memory_order_release);
        for (const Instance &i : b->instances) {
            close_instance(i);
            if (i.holder == 0) defer_close(i.fd);
        }
        b->instances.clear(); // keeps its storage
    }
    b->state.store(kUnplaced, std::memory_order_release);
    if (own_table && !hw_breakpoints_none_deferred())
        opt_ask_program_thread(hw_breakpoints_none_deferred, kAskTimeoutMs);
    return 0;
}

uint64_t placed_address(const perf_event *bp) {
    const Breakpoint *b = breakpoint_of(bp);
    return b != nullptr && b->placeable && b->state.load(std::memory_order_acquire) == kPlaced ? bp->attr.bp_addr : 0;
}

bool on_hw_breakpoint(siginfo_t *info, ucontext_t *uc) {
    const auto *p = reinterpret_cast<const PerfSiginfo *>(info);
    if (p->type != PERF_TYPE_BREAKPOINT || (p->data >> 48) != kTag) return false;
    const unsigned slot = (p->data >> (kGenerationBits + kInstanceBits)) & (kSlots - 1);
    const uint32_t generation = (p->data >> kInstanceBits) & 0xffff;
    const uint32_t instance = p->data & kInstanceMask;
    ThreadState &ts = thread_state();
    const unsigned idx = read_lock();
    const Slot &s = g_slots[slot];
    perf_event *ev = s.event.load(std::memory_order_acquire);
    // A breakpoint removed, or another instance of it on this thread: nothing to run.
    if (ev != nullptr && s.generation.load(std::memory_order_relaxed) == generation &&
        answers_to(slot << 16 | generation, instance)) {
        if (ts.depth > 0 || ts.quiet > 0 || g_handlers_silenced.load(std::memory_order_relaxed)) {
            __atomic_fetch_add(&ev->nmissed, 1, __ATOMIC_RELAXED);
        } else {
            pt_regs regs;
            arch::regs_from_context(uc, &regs);
            perf_sample_data data{ev->attr.bp_addr, 1};
            ++ts.depth;
            ev->overflow_handler(ev, &data, &regs);
            --ts.depth;
            arch::regs_to_context(&regs, uc);
        }
    }
    read_unlock(idx);
    return true;
}

void hw_breakpoints_close_deferred_in_handler() { close_deferred(); }

bool hw_breakpoints_none_deferred() { return g_deferred_count.load(std::memory_order_acquire) == 0; }

std::string hw_breakpoints_list_text(const sym::Registry *symbols) {
    static constexpr const char *kAccess[] = {"", "r", "w", "rw", "x"};
    std::string out;
    std::lock_guard lock(g_mutex);
    for (const Slot &s : g_slots) {
        const perf_event *ev = s.event.load(std::memory_order_relaxed);
        if (ev == nullptr) continue;
        const Breakpoint *b = breakpoint_of(ev);
        if (b->placeable && b->state.load(std::memory_order_acquire) != kPlaced) continue; // watches nothing
        const uint64_t addr = ev->attr.bp_addr;
        std::string where = fmt::format("0x{:x}", addr), object;
        for (size_t i = 0; symbols != nullptr && i < symbols->objects().size() && object.empty(); ++i) {
            const sym::Object &obj = *symbols->objects()[i];
            for (const sym::Symbol &sy : obj.symbols())
                if (sy.value <= addr && addr < sy.value + std::max<uint64_t>(sy.size, 1)) {
                    where = fmt::format("{}+0x{:x}", sy.name, addr - sy.value);
                    object = obj.name;
                    break;
                }
        }
        const uint32_t type = ev->attr.bp_type;
        out += fmt::format("{:016x}  w  {}  {} {}:{}{}\n", addr, where, object, type <= 4 ? kAccess[type] : "?",
                           ev->attr.bp_len, ev->attr.disabled ? " [DISABLED]" : "");
    }
    return out;
}

void hw_breakpoints_before_fork() { g_mutex.lock(); }
void hw_breakpoints_after_fork_parent() { g_mutex.unlock(); }

void hw_breakpoints_after_fork_child(bool keep) {
    const auto tid = static_cast<pid_t>(platform::raw_syscall(SYS_gettid));
    for (Slot &s : g_slots) {
        perf_event *ev = s.event.load(std::memory_order_relaxed);
        Breakpoint *b = breakpoint_of(ev);
        if (b == nullptr) continue;
        // The parent's events: the child's copies of their descriptors (those of the
        // program's table, which the child's is a copy of) keep them alive.
        for (const Instance &i : b->instances)
            if (i.holder == 0) platform::raw_syscall(SYS_close, i.fd);
        b->instances.clear(); // keeps its storage: no allocation here
        if (!b->wide || !keep) continue;
        if (b->placeable && b->state.load(std::memory_order_relaxed) != kPlaced) continue;
        perf_event_attr a = b->opened;
        a.sig_data = sig_data(b->slot, b->generation, b->next_instance++);
        const long fd =
            platform::raw_syscall(SYS_perf_event_open, reinterpret_cast<long>(&a), tid, -1, -1, PERF_FLAG_FD_CLOEXEC);
        if (fd >= 0) b->instances.push_back(Instance{static_cast<int>(fd), tid, a.sig_data, 0});
    }
    for (Seen &seen : t_seen) seen = Seen{};
    g_mutex.unlock();
}

} // namespace ukp::core

// ---- the C API -------------------------------------------------------------------------

using namespace ukp::core;

extern "C" {

struct perf_event *register_user_hw_breakpoint(struct perf_event_attr *attr, perf_overflow_handler_t triggered,
                                               void *context, pid_t tid) {
    return register_breakpoint(attr, triggered, context, tid, false);
}

struct perf_event **register_wide_hw_breakpoint(struct perf_event_attr *attr, perf_overflow_handler_t triggered,
                                                void *context) {
    perf_event *ev = register_breakpoint(attr, triggered, context, 0, true);
    return IS_ERR(ev) ? reinterpret_cast<perf_event **>(ev) : &ev->self;
}

int modify_user_hw_breakpoint(struct perf_event *bp, struct perf_event_attr *attr) {
    Breakpoint *b = breakpoint_of(bp);
    if (b == nullptr || attr == nullptr || b->placeable) return -EINVAL;
    perf_event_attr wanted;
    if (int err = kernel_attr(attr, b->wide, &wanted); err != 0) return err;
    std::lock_guard lock(g_mutex);
    perf_event_attr next = b->opened;
    copy_modifiable(wanted, &next);
    if (int err = modify_instances(*b, next); err != 0) return err;
    b->opened = next;
    copy_modifiable(*attr, &bp->attr);
    return 0;
}

void unregister_hw_breakpoint(struct perf_event *bp) { free_breakpoint(bp); }

void unregister_wide_hw_breakpoint(struct perf_event **cpu_events) {
    if (cpu_events != nullptr && !IS_ERR(cpu_events)) free_breakpoint(*cpu_events);
}

int hw_breakpoint_slots(int type) { return type == TYPE_INST || type == TYPE_DATA ? 4 : 0; }

} // extern "C"
