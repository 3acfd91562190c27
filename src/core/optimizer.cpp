// Jump optimization: replacing a probe's int3 with a 5-byte jmp to its detour.
//
// A point whose region passes the safety check (arch/x86_64/region.hpp) gets its detour
// when it is prepared, and from then on the breakpoint path runs the detour's region
// copy instead of the first instruction alone: no thread enters the region past its
// first byte any more. What remains are threads that were already there (preempted in
// the original code). The optimizer, a background thread started with the first
// candidate (as the kernel's optimizing workqueue), moves those out: it signals every
// thread that may be running or stopped inside a region, and each moves its own
// instruction pointer into the matching place in the region copy. Then it writes
// the jmp (bytes 1..4 under the int3, serialize, byte 0, serialize: docs/architecture.md,
// "Writing into live code").
//
// Unoptimizing needs no such care: the int3 goes back over the jmp's first byte, then
// the rest of the region; a thread inside the detour returns after the region, into
// original code. Detours are never freed.
//
// A region that one short branch elsewhere enters gets an island (arch/x86_64/island.hpp):
// its jmp is written into dead padding and the branch led to it before the threads are
// moved out, so that none arrives in the region by that path any more; the branch is put
// back after the region's bytes. A thread may then still be about to run the island's
// jmp: the island's bytes go back in a later pass of the optimizer, after the same
// signal to every running thread, which moves one found there to the jmp's target.
#include "core/core.hpp"
#include "core/fork.hpp"

#include "arch/x86_64/detour.hpp"
#include "arch/x86_64/region.hpp"
#include "arch/x86_64/trampoline.hpp"
#include "core/kretprobe.hpp"
#include "platform/agent_heap.hpp"
#include "platform/agent_threads.hpp"
#include "platform/disk_cache.hpp"
#include "platform/proc_tasks.hpp"
#include "text/text.hpp"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <dirent.h>
#include <new>
#include <fcntl.h>
#include <link.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <string>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <vector>

namespace ukp::core {

// On by default, as in the kernel (CONFIG_OPTPROBES); UKP_KPROBES_OPTIMIZATION=0 starts
// the process with it off, ukp_set_kprobes_optimization() turns it off and on.
std::atomic<bool> g_opt_enabled{[] {
    const char *env = getenv("UKP_KPROBES_OPTIMIZATION");
    return env == nullptr || env[0] != '0';
}()};

bool is_agent_probe(const kprobe *p); // registry.cpp

namespace {

constexpr size_t kDetourOffset = 16; // the slot starts with the Point *, for on_fault()
// The signal that asks a thread to leave the regions about to be replaced: a real-time
// signal the program leaves at its default, chosen at the first pass that needs one
// (ensure_stop_handler), 0 before.
std::atomic<int> g_stop_signal{0}; // written by the optimizer thread only
int stop_signal() { return g_stop_signal.load(std::memory_order_relaxed); }
constexpr size_t kMaxBatch = 1024;
constexpr size_t kMaxRetired = 64; // islands retired in one pass
// How long the optimizer waits for threads to answer before trying again later.
constexpr long kStopTimeoutNs = 200l * 1000 * 1000;

// ---- the optimizer thread's state (under the registry mutex) ----
std::vector<Point *> &pending() {
    UKP_ASSERT_REGISTRY_HELD();
    static auto *value = new std::vector<Point *>(); // never destroyed: the thread outlives static destructors
    return *value;
}
// Points whose island's branch was put back, the island's bytes still in place.
std::vector<Point *> &retiring() {
    UKP_ASSERT_REGISTRY_HELD();
    static auto *value = new std::vector<Point *>();
    return *value;
}
// Points whose jump verdict waits for their object's reference table (opt_prepare).
std::vector<Point *> &awaiting() {
    UKP_ASSERT_REGISTRY_HELD();
    static auto *value = new std::vector<Point *>();
    return *value;
}
// Every point that has an island (a few: glibc's memmove variants).
std::vector<Point *> &island_points() {
    UKP_ASSERT_REGISTRY_HELD();
    static auto *value = new std::vector<Point *>();
    return *value;
}
// The condition variables the agent's threads wait on with the registry mutex. A child of
// fork() makes new ones (renew_after_fork): condition_variable_any waits holding a mutex
// of its own between letting the registry mutex go and sleeping, and an optimizer thread
// caught there by a fork leaves that mutex taken in the child, whose own optimizer would
// then wait for it for ever, the registry mutex in hand. The parent's stay reachable
// (`before`): leak checkers see no leak.
struct AgentCv {
    std::condition_variable_any cv;
    AgentCv *before = nullptr;
};
AgentCv *&work_cv_of() {
    static AgentCv *value = new AgentCv();
    return value;
}
AgentCv *&done_cv_of() {
    static AgentCv *value = new AgentCv();
    return value;
}
std::condition_variable_any &work_cv() { return work_cv_of()->cv; }
std::condition_variable_any &done_cv() { return done_cv_of()->cv; }
void renew_after_fork(AgentCv *&cv) {
    auto *fresh = new AgentCv();
    fresh->before = cv;
    cv = fresh;
}
std::atomic<bool> g_thread_started{false};
std::atomic<bool> g_thread_starting{false}; // one thread at a time starts it (no mutex: fork)
std::atomic<int> g_start_held{0};           // OptimizeAtStart scopes open: the thread is not started
bool g_alone = false;                       // inside the outermost of them, the caller is the process's only thread
uint64_t g_requested = 0;                   // work items queued so far
uint64_t g_handled = 0;                     // work items the optimizer has been through
bool g_busy = false;                        // a pass is running (the mutex is dropped while threads answer)
bool g_building = false;                    // the tables thread builds what awaiting() waits for
bool g_built = false;                       // it ended: the optimizer thread joins it, looks at its queues again
bool g_exiting = false;                     // the program exits: no more tables (exit_handler_for_tables)
std::atomic<bool> g_stop_building{false};   // the same, read by a table's build without the mutex
pthread_t g_tables;                         // the tables thread, while g_building or g_built
std::atomic<int> g_tables_entered{0};       // it holds its fork gate (start_tables_thread waits: a futex)
uint64_t g_stop_taken = 0;                  // bit N: the program took signal N over from the optimizer

// ---- what the stop signal's handler reads (lock-free) ----
Point *g_stop_points[kMaxBatch];
std::atomic<size_t> g_stop_count{0};
std::atomic<int> g_stop_gen{0};
std::atomic<int> g_acks{0};
// Which thread answered: entry i (the i-th signalled) holds the pass's generation.
constexpr size_t kAckSlots = 4096;
std::atomic<int> g_acked[kAckSlots];
// What a stop signal carries: its pass's generation and the thread's entry.
uint64_t stop_value(int gen, size_t slot) { return (static_cast<uint64_t>(static_cast<uint32_t>(gen)) << 32) | slot; }
// The batch brings back region copies (after a probe inside a region went away): threads
// that may still be on their way into a region must be found, or the batch waits.
std::atomic<bool> g_stop_strict{false};
// Islands being retired: a thread at one goes on at its jmp's target.
struct RetiredIsland {
    uint64_t at, to;
};
RetiredIsland g_stop_islands[kMaxRetired];
std::atomic<size_t> g_stop_island_count{0};
std::atomic<bool> g_stop_busy{false};
std::atomic<unsigned> g_strict_epoch{0}; // the g_copy_epoch value the copies came back under
uint64_t g_restorer = 0;                 // the signal restorer (__restore_rt) the kernel returns through

bool in_region(const Point *pt, uint64_t ip) { return ip > pt->addr && ip < pt->addr + pt->layout.dcr_len; }

bool in_island(const RetiredIsland &r, uint64_t ip) { return ip >= r.at && ip < r.at + arch::kIslandSize; }

extern "C" char __start_ukp_trap_text[], __stop_ukp_trap_text[];

// Whether a thread at ip may still resume into a region by a path decided before the
// region copy came back: out of the agent's signal handler (sigreturn to an instruction
// copy that jumps back into the region), out of the post trampoline, or from inside the
// one-instruction copy itself. Async-signal-safe.
bool on_the_way_in(uint64_t ip) {
    const unsigned decided = t_decision_epoch;
    // Chose its path with the copy in place, or has chosen none yet: it takes the copy.
    if (decided == kNoDecision || decided >= g_strict_epoch.load(std::memory_order_acquire)) return false;
    if (t_in_agent_handler > 0) return true;
    const auto in = [ip](const void *lo, const void *hi) {
        return ip >= reinterpret_cast<uint64_t>(lo) && ip < reinterpret_cast<uint64_t>(hi);
    };
    return in(__start_ukp_trap_text, __stop_ukp_trap_text) ||
           in(reinterpret_cast<const void *>(&ukp_post_trampoline), ukp_post_trampoline_end) ||
           (g_restorer != 0 && ip >= g_restorer && ip < g_restorer + 16);
}

// What a stop signal carries when it asks for a chore (opt_ask_program_thread), not a
// pass's answer: no generation reaches it.
constexpr uint64_t kChoreValue = ~uint64_t{0};

void stop_handler(int, siginfo_t *info, void *ctx) {
    const int saved_errno = errno;
    if (info->si_code == SI_QUEUE && reinterpret_cast<uint64_t>(info->si_value.sival_ptr) == kChoreValue) {
        hw_breakpoints_close_deferred_in_handler();
        errno = saved_errno;
        return;
    }
    auto *uc = static_cast<ucontext_t *>(ctx);
    const uint64_t ip = arch::context_ip(uc);
    const size_t n = g_stop_count.load(std::memory_order_acquire);
    const bool strict = g_stop_strict.load(std::memory_order_acquire);
    bool busy = strict && on_the_way_in(ip);
    for (size_t i = 0; i < n && i < kMaxBatch; ++i) {
        const Point *pt = g_stop_points[i];
        if (pt == nullptr) continue;
        if (in_region(pt, ip)) {
            if (const uint64_t to = into_copy(pt, ip); to != ip) arch::set_context_ip(uc, to);
        } else if (strict && pt->slot != 0 && ip >= pt->boosted && ip <= pt->boosted + pt->boosted_len) {
            // In the first instruction's copy: before it, or at its jump back into the region.
            const uint64_t orig = ip == pt->boosted                     ? pt->addr
                                  : ip == pt->boosted + pt->boosted_len ? pt->addr + pt->insn.len
                                                                        : 0;
            const uint64_t to = orig != 0 ? arch::detour_copy_of(pt->layout, pt->detour_code, pt->addr, orig) : 0;
            if (to != 0 && pt->breakpoint_region_copy.load(std::memory_order_acquire) != 0)
                arch::set_context_ip(uc, to);
            else
                busy = true;
        }
    }
    const size_t islands = g_stop_island_count.load(std::memory_order_acquire);
    for (size_t i = 0; i < islands && i < kMaxRetired; ++i)
        if (in_island(g_stop_islands[i], ip)) arch::set_context_ip(uc, g_stop_islands[i].to);
    if (busy) g_stop_busy.store(true, std::memory_order_release);
    const auto value = reinterpret_cast<uint64_t>(info->si_value.sival_ptr);
    const int gen = g_stop_gen.load(std::memory_order_acquire);
    if (info->si_code == SI_QUEUE && value >> 32 == static_cast<uint32_t>(gen)) {
        if (const size_t slot = value & 0xffffffffu; slot < kAckSlots)
            g_acked[slot].store(gen, std::memory_order_release);
        g_acks.fetch_add(1, std::memory_order_release);
    }
    errno = saved_errno;
}

// The restorer of the agent's SIGTRAP handler, from the kernel (the interposed sigaction
// shows the program's view).
uint64_t find_restorer() {
    struct {
        uint64_t handler, flags, restorer, mask;
    } kact{};
    if (syscall(SYS_rt_sigaction, SIGTRAP, nullptr, &kact, sizeof kact.mask) != 0) return 0;
    return kact.restorer;
}

// Makes sure the optimizer has a stop signal with its handler: the first real-time signal
// from SIGRTMAX-2 down that the program leaves at its default (the JVM takes SIGRTMAX-2
// for interrupting blocked I/O; SIGRTMAX and SIGRTMAX-1 are the ones applications most
// often pick, SIGRTMIN and SIGRTMIN+1 too). A program that installs its own handler on
// the chosen one keeps it, and the next pass chooses another. False when every candidate
// is the program's: the passes are silent then (move_threads_out).
bool ensure_stop_handler() {
    if (g_restorer == 0) g_restorer = find_restorer();
    struct sigaction cur {};
    if (const int sig = stop_signal(); sig != 0) {
        if (sigaction(sig, nullptr, &cur) != 0) return false;
        if ((cur.sa_flags & SA_SIGINFO) && cur.sa_sigaction == stop_handler) return true;
        g_stop_taken |= uint64_t{1} << sig; // the program's now: left to it
        g_stop_signal.store(0, std::memory_order_relaxed);
    }
    for (int sig = SIGRTMAX - 2; sig >= SIGRTMIN + 2; --sig) {
        if ((g_stop_taken >> sig) & 1) continue;
        if (sigaction(sig, nullptr, &cur) != 0 || cur.sa_handler != SIG_DFL) continue;
        struct sigaction act {};
        act.sa_sigaction = stop_handler;
        sigemptyset(&act.sa_mask);
        act.sa_flags = SA_SIGINFO | SA_RESTART | SA_ONSTACK;
        if (sigaction(sig, &act, nullptr) != 0) continue;
        g_stop_signal.store(sig, std::memory_order_relaxed);
        return true;
    }
    return false;
}

// The text after "\nFIELD" in a status file of /proc ("TracerPid:", "SigBlk:"), up to
// `size` bytes of it in `out`; false when the file cannot be read or has no such line.
bool status_field(const char *path, const char *field, char *out, size_t size) {
    const int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    char text[4096];
    const ssize_t n = read(fd, text, sizeof text - 1);
    close(fd);
    if (n <= 0) return false;
    text[n] = '\0';
    char line[32];
    snprintf(line, sizeof line, "\n%s", field);
    const char *at = strstr(text, line);
    if (at == nullptr) return false;
    snprintf(out, size, "%s", at + strlen(line));
    return true;
}

// The number after `field` ("TracerPid:", "Threads:") in /proc/self/status; `otherwise`
// when the file cannot be read or has no such line.
long status_number(const char *field, long otherwise) {
    char value[32];
    return status_field("/proc/self/status", field, value, sizeof value) ? strtol(value, nullptr, 10) : otherwise;
}

// Whether thread `tid` blocks signal `sig` (its SigBlk in /proc/self/task/TID/status).
// Unknown: no.
bool blocks_signal(int tid, int sig) {
    char text[4096];
    if (sig < 1 || sig > 64 || platform::read_task_file(tid, "status", text, sizeof text) <= 0) return false;
    const char *at = platform::find_text(text, "\nSigBlk:");
    if (at == nullptr) return false;
    at += 8;
    while (*at == ' ' || *at == '\t') ++at;
    return ((platform::parse_hex(&at) >> (sig - 1)) & 1) != 0;
}

// A tracer (core.hpp's process_traced()) would see every stop signal (gdb stops the program
// at each by default) and, holding threads stopped, keep them from answering: the optimizer
// sends none then (move_threads_out's silent pass).
bool traced() { return process_traced(); }

// Makes sure no thread is inside (past the first byte of) the regions of batch[0..n),
// nor in the islands of retired[0..m): signals the threads that run, or stand inside one,
// and waits for their answer. 0, or -EAGAIN when some thread did not answer in time.
// Silent (a tracer is attached): no signal is sent; 0 only if every other thread is seen
// blocked or preempted outside every region, else -EAGAIN (a strict pass needs the answers:
// -EAGAIN). Called without the mutex.
int move_threads_out(Point *const *batch, size_t n, bool strict, const RetiredIsland *retired, size_t m, bool silent) {
    g_stop_strict.store(strict, std::memory_order_release);
    g_stop_busy.store(false, std::memory_order_release);
    g_stop_count.store(0, std::memory_order_release);
    g_stop_island_count.store(0, std::memory_order_release);
    for (size_t i = 0; i < n; ++i) g_stop_points[i] = batch[i];
    for (size_t i = 0; i < m; ++i) g_stop_islands[i] = retired[i];
    g_stop_count.store(n, std::memory_order_release);
    g_stop_island_count.store(m, std::memory_order_release);
    const int gen = g_stop_gen.fetch_add(1, std::memory_order_acq_rel) + 1;
    g_acks.store(0, std::memory_order_release);
    const int self = static_cast<int>(platform::raw_syscall(SYS_gettid));
    const pid_t pid = getpid();
    // Blocked or preempted outside every region: such a thread cannot get into one any more
    // (the int3s are in place), unless a strict pass looks for threads on their way in.
    const auto outside = [&](int tid) {
        uint64_t pc = 0;
        long nr = -1;
        if (strict || !task_syscall(tid, &nr, &pc)) return false;
        for (size_t i = 0; i < n; ++i)
            if (in_region(batch[i], pc)) return false;
        for (size_t i = 0; i < m; ++i)
            if (in_island(retired[i], pc)) return false;
        return true;
    };
    std::vector<int> signalled; // and, after them, those that block the signal
    std::vector<int> blocking;
    bool seen_inside = false; // by a silent pass
    const bool listed = platform::for_each_thread([&](int tid) {
        if (tid == self || outside(tid)) return true;
        if (silent) {
            seen_inside = true;
            return false;
        }
        // A thread that blocks the signal (it had it blocked before the agent chose it, or
        // glibc's raw masks) is not sent one: it would stay pending, and the program's
        // signalfd or sigwaitinfo would take it. It is done once seen outside, below.
        if (blocks_signal(tid, stop_signal())) {
            blocking.push_back(tid);
            return true;
        }
        siginfo_t info{};
        info.si_signo = stop_signal();
        info.si_code = SI_QUEUE;
        info.si_pid = pid;
        info.si_uid = getuid();
        info.si_value.sival_ptr = reinterpret_cast<void *>(stop_value(gen, signalled.size()));
        if (syscall(SYS_rt_tgsigqueueinfo, pid, tid, stop_signal(), &info) == 0) signalled.push_back(tid);
        return true;
    });
    if (!listed) return -ENOENT;
    if (seen_inside) return -EAGAIN;
    const int sent = static_cast<int>(signalled.size());
    if (strict && !blocking.empty()) return -EAGAIN; // a strict pass needs every answer
    signalled.insert(signalled.end(), blocking.begin(), blocking.end());
    // A thread that blocks the signal (glibc does, briefly, around fork() and the child of
    // posix_spawn) answers late: it is done too once seen blocked outside every region, or
    // gone. Looked at every millisecond.
    std::vector<bool> seen(signalled.size(), false);
    const auto all_done = [&] {
        if (signalled.size() > kAckSlots) return blocking.empty() && g_acks.load(std::memory_order_acquire) >= sent;
        bool done = true;
        for (size_t i = 0; i < signalled.size(); ++i) {
            if (seen[i] || (static_cast<int>(i) < sent && g_acked[i].load(std::memory_order_acquire) == gen)) continue;
            char path[64];
            snprintf(path, sizeof path, "/proc/self/task/%d", signalled[i]);
            seen[i] = outside(signalled[i]) || access(path, F_OK) != 0;
            done = done && seen[i];
        }
        return done;
    };
    timespec start{}, looked{};
    clock_gettime(CLOCK_MONOTONIC, &start);
    looked = start;
    const auto since = [](const timespec &a, const timespec &b) {
        return (b.tv_sec - a.tv_sec) * 1000000000l + (b.tv_nsec - a.tv_nsec);
    };
    while (!blocking.empty() || g_acks.load(std::memory_order_acquire) < sent) {
        timespec now{};
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (since(looked, now) > 1000 * 1000) {
            if (all_done()) break;
            looked = now;
        }
        if (since(start, now) > kStopTimeoutNs) return -EAGAIN; // a thread that blocks the signal
        sched_yield();
    }
    return g_stop_busy.load(std::memory_order_acquire) ? -EBUSY : 0;
}

bool other_point_inside(const Point *pt, uint64_t addr, size_t len) {
    auto &pts = all_points();
    for (auto it = pts.upper_bound(addr); it != pts.end() && it->first < addr + len; ++it)
        if (it->second != pt && (it->second->armed || it->second->list.load(std::memory_order_relaxed) != nullptr))
            return true;
    return false;
}

// The bytes a point's probes change or copy: its region when it has a detour (the
// breakpoint path runs the region's copy), else its first byte.
uint64_t footprint_end(const Point *q) { return q->addr + (q->detour != 0 ? q->layout.dcr_len : 1); }

bool meets(uint64_t lo, uint64_t hi, uint64_t lo2, uint64_t hi2) { return lo < hi2 && lo2 < hi; }

// Whether [lo, hi) meets what pt's island owns: its branch (another copy of it would still
// lead into the region) and its jmp.
bool meets_island(const Point *pt, uint64_t lo, uint64_t hi) {
    const arch::Island &is = pt->island;
    return meets(lo, hi, is.source, is.source + 2) || meets(lo, hi, is.at, is.at + arch::kIslandSize);
}

bool in_use(const Point *q) { return q->armed || q->list.load(std::memory_order_relaxed) != nullptr; }

// Another point in use whose footprint meets an island of pt, or one with an island whose
// bytes pt's footprint meets: the two cannot both be in place.
bool island_in_the_way(const Point *pt) {
    for (const Point *other : island_points()) {
        if (other == pt) continue;
        if (in_use(other) && meets_island(other, pt->addr, footprint_end(pt))) return true;
    }
    if (pt->island_to == 0) return false;
    const arch::Island &is = pt->island;
    const uint64_t lo = std::min(is.source, is.at), hi = std::max(is.source + 2, is.at + arch::kIslandSize);
    auto &pts = all_points();
    for (auto it = pts.lower_bound(lo >= 16 ? lo - 15 : 0); it != pts.end() && it->first < hi; ++it)
        if (it->second != pt && in_use(it->second) && meets_island(pt, it->first, footprint_end(it->second)))
            return true;
    return false;
}

// Leads pt's branch to its island (written first). 0 or -errno. Under the registry mutex.
int island_raise(Point *pt) {
    if (pt->island_to == 0 || pt->island_live) return 0;
    if (!pt->island_written) {
        if (int err = text::write(pt->island.at, pt->island_jmp, sizeof pt->island_jmp); err != 0) return err;
        pt->island_written = true;
        // Every core sees the island before any can take the branch there.
        text::sync_cores();
    }
    if (int err = text::write(pt->island.source + 1, &pt->island.island_disp, 1); err != 0) return err;
    text::sync_cores();
    pt->island_live = true;
    return 0;
}

// Puts pt's branch back (the region's bytes must be the original ones by then); the
// island's bytes go back in a later pass. Under the registry mutex.
void island_lower(Point *pt) {
    if (!pt->island_live || pt->optimized) return;
    if (text::write(pt->island.source + 1, &pt->island.source_disp, 1) != 0) return;
    text::sync_cores();
    pt->island_live = false;
    if (std::find(retiring().begin(), retiring().end(), pt) == retiring().end()) {
        retiring().push_back(pt);
        ++g_requested;
        work_cv().notify_one();
    }
}

// Puts back the bytes of islands whose branch went back, when no thread can be at one.
// Under the registry mutex.
void restore_islands(const std::vector<Point *> &retired) {
    bool any = false;
    for (Point *pt : retired) {
        if (pt->island_live || !pt->island_written) continue; // raised again meanwhile
        if (text::write(pt->island.at, pt->island.orig, sizeof pt->island.orig) == 0) {
            pt->island_written = false;
            any = true;
        }
    }
    if (any) text::sync_cores();
}

bool qualifies(const Point *pt) {
    // A spawn-path point keeps its jmp with optimization off: an int3 there kills the
    // children of posix_spawn (spawn_gate.cpp).
    if (!g_opt_enabled.load(std::memory_order_relaxed) && !pt->spawn_path) return false;
    if (!pt->armed || pt->detour == 0) return false;
    if (!g_kprobes_enabled.load(std::memory_order_relaxed) || g_handlers_silenced.load(std::memory_order_relaxed))
        return false;
    const ProbeList *list = pt->list.load(std::memory_order_relaxed);
    if (list == nullptr) return false;
    for (uint32_t i = 0; i < list->count; ++i) {
        const kprobe *p = list->probes[i];
        // A post_handler keeps the breakpoint path; a jprobe needs the signal context. (Even
        // while disabled: enabling one would otherwise leave a hit or two on the jump. A
        // disabled probe alone does not count: every path skips it, and the point is armed
        // only while another one is enabled, as the kernel optimizes an aggregate probe.)
        if (p->post_handler != nullptr || is_jprobe(p) || is_agent_probe(p)) return false;
    }
    return !other_point_inside(pt, pt->addr, pt->layout.dcr_len) && !island_in_the_way(pt);
}

void set_flags(const Point *pt) {
    const ProbeList *list = pt->list.load(std::memory_order_relaxed);
    for (uint32_t i = 0; list != nullptr && i < list->count; ++i) {
        kprobe *p = list->probes[i];
        if (pt->optimized)
            __atomic_or_fetch(&p->flags, KPROBE_FLAG_OPTIMIZED, __ATOMIC_RELAXED);
        else
            __atomic_and_fetch(&p->flags, ~static_cast<unsigned>(KPROBE_FLAG_OPTIMIZED), __ATOMIC_RELAXED);
    }
}

// Where pt's jmp should lead: its kretprobe detour while an enabled kretprobe is among
// its probes, else its detour (set_disabled's update_arming asks again). Either is right
// for any probes at the point; this one is the faster. Through the kretprobe detour,
// ukp_kret_entry_trampoline does the usual case of a lone kretprobe itself, and in the
// others ukp_optprobe_dispatch has the kretprobe's stub call the function
// (finish_kret_entry), so that its return is predicted: the detour's jump through the red
// zone lets the trampoline go to the stub by a `ret`.
uint64_t opt_target(const Point *pt) {
    const ProbeList *list = pt->list.load(std::memory_order_relaxed);
    if (pt->kret_code == 0 || list == nullptr) return pt->detour_code;
    for (uint32_t i = 0; i < list->count; ++i) {
        const kprobe *p = list->probes[i];
        if (probe_type(p) == 'r' && (p->flags & (KPROBE_FLAG_DISABLED | KPROBE_FLAG_GONE)) == 0) return pt->kret_code;
    }
    return pt->detour_code;
}

// Writes the jmps of batch[0..n) (whose int3s are in place): the tails, then the heads.
void write_jumps(Point *const *batch, size_t n) {
    std::vector<bool> ok(n, false);
    for (size_t i = 0; i < n; ++i) {
        uint8_t jmp[5];
        Point *pt = batch[i];
        if (pt->island_to != 0 && !pt->island_live) continue; // its branch still leads into the region
        pt->jump_target = opt_target(pt);
        if (!arch::encode_jmp_rel32(pt->addr, pt->jump_target, jmp)) continue;
        ok[i] = text::write(pt->addr + 1, jmp + 1, 4) == 0;
    }
    // Every core must see the tails before any can see the jmp's first byte.
    text::sync_cores();
    for (size_t i = 0; i < n; ++i) {
        if (!ok[i]) continue;
        Point *pt = batch[i];
        const uint8_t e9 = 0xe9;
        if (text::write(pt->addr, &e9, 1) == 0) {
            pt->optimized = true;
            set_flags(pt);
        }
    }
    text::sync_cores();
    for (size_t i = 0; i < n; ++i) spawn_gate_update(batch[i]);
}

// How many threads the process has, 0 if unknown.
int thread_count() { return static_cast<int>(status_number("Threads:", 0)); }

// The optimizer's pass for a process whose only thread is the caller: no other thread can
// be inside a region or on its way into one, so none is signalled (a tracer sees nothing)
// and the jumps are written at once. The caller stands in agent code, outside every region.
// Under the registry mutex.
void optimize_pending_alone() {
    std::vector<Point *> batch;
    for (Point *pt : pending()) {
        pt->queued = false;
        auto it = all_points().find(pt->addr);
        if (it == all_points().end() || it->second != pt || pt->optimized || !qualifies(pt)) continue;
        if (pt->breakpoint_region_copy.load(std::memory_order_relaxed) == 0)
            pt->breakpoint_region_copy.store(pt->region_copy, std::memory_order_release);
        pt->copy_fresh = false;
        if (island_raise(pt) == 0) batch.push_back(pt);
    }
    pending().clear();
    write_jumps(batch.data(), batch.size());
    g_handled = g_requested;
    done_cv().notify_all();
}

struct ObjectLookup {
    uint64_t addr;
    uint64_t bias = 0;
    std::string path; // "" for the main program
    bool found = false;
};

int find_object_of(dl_phdr_info *info, size_t, void *data) {
    auto *l = static_cast<ObjectLookup *>(data);
    for (int i = 0; i < info->dlpi_phnum; ++i) {
        const ElfW(Phdr) &ph = info->dlpi_phdr[i];
        const uint64_t lo = info->dlpi_addr + ph.p_vaddr;
        if (ph.p_type == PT_LOAD && (ph.p_flags & PF_X) && l->addr >= lo && l->addr - lo < ph.p_memsz) {
            l->bias = info->dlpi_addr;
            l->path = info->dlpi_name != nullptr ? info->dlpi_name : "";
            l->found = true;
            return 1;
        }
    }
    return 0;
}

// The file and load bias of the object whose code holds addr; false if none.
bool object_of(uint64_t addr, std::string *file, uint64_t *bias) {
    ObjectLookup l{addr};
    dl_iterate_phdr(find_object_of, &l);
    if (!l.found) return false;
    *file = l.path.empty() ? "/proc/self/exe" : l.path;
    *bias = l.bias;
    return true;
}

bool safe_read(uint64_t addr, void *out, size_t n) {
    return ukp_safe_copy(out, reinterpret_cast<const void *>(addr), n) == 0;
}

thread_local bool t_deciding = false; // the tables thread decides the awaited verdicts

// Whether pt's jump verdict may wait for the tables thread to build its object's
// reference table (opt_prepare in core.hpp). Under the registry mutex.
bool verdict_may_wait(const Point *pt) {
    if (t_deciding || g_exiting || !g_opt_enabled.load(std::memory_order_relaxed) ||
        g_start_held.load(std::memory_order_acquire) > 0 || pt->spawn_path || pt->object_name.rfind("libc.so", 0) == 0)
        return false;
    return !traced();
}

void await_verdict(Point *pt) {
    if (pt->verdict_due) return;
    pt->verdict_due = true;
    awaiting().push_back(pt);
    ++g_requested;
    work_cv().notify_one();
}

// Builds the reference tables that the points of awaiting() wait for, without the mutex
// (a second for a large program: the registrations, the loader's events and the program
// go on meanwhile), then decides their verdicts: those that get a detour are queued.
// Under `gate` (the tables' fork gate, taken before the mutex), let go while it waits for
// the program's threads.
void decide_awaiting(std::unique_lock<CheckedMutex> &lock, const ForkQuiet &gate) {
    std::vector<Point *> points;
    points.swap(awaiting());
    std::vector<uint64_t> where;
    for (const Point *pt : points) where.push_back(pt->addr);
    lock.unlock();
    std::vector<uint64_t> built; // the objects' biases
    for (uint64_t addr : where) {
        std::string file;
        uint64_t bias = 0;
        if (!object_of(addr, &file, &bias) || std::find(built.begin(), built.end(), bias) != built.end()) continue;
        arch::object_refs(file, bias, safe_read, &g_stop_building);
        built.push_back(bias);
    }
    lock.lock();
    if (g_exiting) return; // the program's exit handlers run: the agent's state goes away
    // An object unloaded meanwhile had its table dropped before this one was kept.
    for (uint64_t bias : built)
        if (!object_loaded_at(bias)) arch::forget_object_refs(bias);
    t_deciding = true;
    std::vector<Point *> prepared;
    for (Point *pt : points) {
        if (!pt->verdict_due) continue;
        pt->verdict_due = false;
        // Gone meanwhile (its object unloaded): the Point is kept, not its place.
        if (auto it = all_points().find(pt->addr); it == all_points().end() || it->second != pt) continue;
        prepare_jump(pt);
        prepared.push_back(pt);
    }
    t_deciding = false;
    if (prepared.empty()) return;
    // Hits on these int3s until now took the one-instruction copy, which jumps back into
    // the region; from here on they take the region copy. Those that chose before end
    // their choice (a read section) before the optimizer may look for threads, so that its
    // pass, a millisecond or more later, finds such a thread in the region (and sends it
    // to the copy). Left: one preempted between its choice and the region for the whole
    // pass. A strict pass would look for it too, but never ends while a program thread
    // blocks the stop signal (servers reading signals through a signalfd), and under load
    // often found a thread entering the agent's handler for a new hit as on its way in.
    lock.unlock();
    {
        const ForkQuiet::Unlocked waiting(gate); // a thread in a handler may fork: fork.hpp
        synchronize();
    }
    lock.lock();
    if (g_exiting) return;
    for (Point *pt : prepared)
        if (auto it = all_points().find(pt->addr); it != all_points().end() && it->second == pt) opt_update(pt);
}

// The optimizer thread's setup (and the tables thread's): its signals and its descriptor
// table.
void enter_optimizer_thread() {
    // Asynchronous signals are the program's threads' business; the traps and faults of
    // probes it hits (in libc) must stay deliverable, or the kernel kills the process.
    sigset_t async;
    sigfillset(&async);
    for (int sig : {SIGTRAP, SIGSEGV, SIGBUS, SIGFPE, SIGILL}) sigdelset(&async, sig);
    pthread_sigmask(SIG_BLOCK, &async, nullptr);
    // The files it reads (/proc/self/task, /proc/self/status, object files) would take
    // the lowest free numbers of the program's table for a moment, the ones a program
    // opening right then expects. Without a table of its own it goes on with the
    // process's, as before.
    text::use_own_fd_table();
    prctl(PR_SET_NAME, "ukp-optimizer"); // as `ps -L` and /proc/PID/task/TID/comm show it
}

// The tables thread: builds the reference tables the points of awaiting() wait for and
// decides their verdicts, beside the optimizer thread, which goes on placing jumps
// meanwhile (the spawn path's among them: a gate stays closed until they are in). Started
// by the optimizer thread, without the mutex; ends when nothing awaits, and is joined.
//
// Its work is inside its fork gate (fork.hpp: it allocates, reads ELF files, takes the
// loader's lock), from before its first lock to its last. Its start and its end, where
// the C library and a sanitizer's runtime allocate for the thread, are covered too: the
// optimizer starts it under its own gate and waits until it holds this one, and joins it
// under its gate (or a fork's prepare handler does, opt_before_fork).
void tables_thread() {
    const AgentWork quiet;
    enter_optimizer_thread();
    prctl(PR_SET_NAME, "ukp-tables");
    const ForkQuiet busy(ForkGate::kTables);
    g_tables_entered.store(1);
    g_tables_entered.notify_one();
    std::unique_lock lock(registry_mutex());
    while (!g_exiting && !awaiting().empty()) decide_awaiting(lock, busy);
    g_building = false;
    g_built = true;
    work_cv().notify_one();
    done_cv().notify_all(); // an exit waiting for it
}

// Joins the tables thread, once it has ended (g_built), and keeps its stack for the next.
// Under the optimizer's fork gate, or in the prepare handler of a fork().
void join_tables_thread() {
    pthread_join(g_tables, nullptr);
    platform::release_agent_thread(g_tables);
}

// Run by exit() before the destructors of the agent's state that the tables thread uses
// (registered once that state exists, when the first tables thread starts): a table
// being built is given up (its sweep looks at g_stop_building every 64 KiB of code), so
// that a program exiting within a second of a registration does not wait for the rest
// of it, and nothing more is decided.
void exit_handler_for_tables() {
    g_stop_building.store(true);
    std::unique_lock lock(registry_mutex());
    g_exiting = true;
    for (Point *pt : awaiting()) pt->verdict_due = false;
    awaiting().clear();
    done_cv().wait(lock, [] { return !g_building; });
}

// Starts the tables thread for what awaiting() holds; on this thread if none can be had.
void start_tables_thread(std::unique_lock<CheckedMutex> &lock) {
    static const bool at_exit = std::atexit(exit_handler_for_tables) == 0;
    (void)at_exit;
    g_building = true;
    lock.unlock();
    {
        // A fork waits until the new thread's start is over and it holds its own gate.
        const ForkQuiet starting(ForkGate::kOptimizer);
        g_tables_entered.store(0);
        const bool started = platform::start_agent_thread(
                                 &g_tables,
                                 [](void *) -> void * {
                                     tables_thread();
                                     return nullptr;
                                 },
                                 nullptr) == 0;
        if (started) {
            g_tables_entered.wait(0);
            lock.lock();
            return;
        }
    }
    {
        const ForkQuiet busy(ForkGate::kTables); // before the mutex, as the prepare handler takes them
        lock.lock();
        while (!awaiting().empty()) decide_awaiting(lock, busy);
        g_building = false;
        lock.unlock();
    }
    lock.lock();
}

// One pass's work, taken from the queues.
struct Pass {
    std::vector<Point *> batch;    // points to get their jmp
    std::vector<uint64_t> disarms; // each one's count when the threads were looked for
    std::vector<Point *> retired;  // points whose island goes back
    std::vector<RetiredIsland> islands;
};

// Takes a pass's work off the queues (at most kMaxBatch points and kMaxRetired islands;
// the rest waits for the next pass). Under the registry mutex.
Pass take_work() {
    UKP_ASSERT_REGISTRY_HELD();
    Pass pass;
    std::vector<Point *> later;
    for (Point *pt : pending()) {
        if (pass.batch.size() == kMaxBatch) { // the next pass's, still queued
            later.push_back(pt);
            continue;
        }
        pt->queued = false;
        auto it = all_points().find(pt->addr);
        if (it == all_points().end() || it->second != pt) continue; // its object is gone
        // A point whose region copy was taken away by a probe inside the region (gone
        // now) comes back through the strict pass below.
        if (!pt->optimized && qualifies(pt)) {
            pass.batch.push_back(pt);
            pass.disarms.push_back(pt->disarms);
        } else {
            spawn_gate_update(pt);
        }
    }
    pending().swap(later);
    // `later` holds the points that were queued now, and below gets the islands left for
    // the next pass: of both, those whose island is written but not live are retiring.
    for (Point *pt : retiring()) {
        if (pass.retired.size() == kMaxRetired) {
            later.push_back(pt);
        } else if (pt->island_written && !pt->island_live) {
            pass.retired.push_back(pt);
            pass.islands.push_back({pt->island.at, pt->island_to});
        }
    }
    retiring().clear();
    for (Point *pt : later)
        if (pt->island_written && !pt->island_live) retiring().push_back(pt);
    return pass;
}

// Leads the branches into the pass's regions to their islands, and gives back the region
// copies dropped for a probe inside a region (gone now): from here on no new path leads
// into the regions. Whether a copy came back (the pass is strict). Under the registry mutex.
bool prepare_regions(Pass &pass) {
    size_t kept = 0;
    for (size_t i = 0; i < pass.batch.size(); ++i) {
        if (island_raise(pass.batch[i]) != 0) continue;
        pass.batch[kept] = pass.batch[i];
        pass.disarms[kept++] = pass.disarms[i];
    }
    pass.batch.resize(kept);
    pass.disarms.resize(kept);
    bool strict = false;
    for (Point *pt : pass.batch) {
        if (pt->breakpoint_region_copy.load(std::memory_order_relaxed) == 0) {
            pt->breakpoint_region_copy.store(pt->region_copy, std::memory_order_release);
            pt->copy_fresh = true;
        }
        strict = strict || pt->copy_fresh;
    }
    return strict;
}

// Once every thread was seen outside the regions: the jmps of the points that still
// qualify go in, and the retired islands go back. False when a point must be looked for
// again. Under the registry mutex.
bool finish_pass(Pass &pass) {
    UKP_ASSERT_REGISTRY_HELD();
    bool retry = false;
    // The registry may have changed while the threads answered: check again.
    std::vector<Point *> still;
    for (size_t i = 0; i < pass.batch.size(); ++i) {
        Point *pt = pass.batch[i];
        auto it = all_points().find(pt->addr);
        // A probe armed inside the region meanwhile took the copy away (only this
        // thread gives it back): threads may be in the region by the old path.
        if (it == all_points().end() || it->second != pt || pt->optimized || !qualifies(pt) ||
            pt->breakpoint_region_copy.load(std::memory_order_relaxed) == 0)
            continue;
        // Disarmed meanwhile (unregistered, then registered again): a thread may
        // have run into the region through the original code after it answered.
        // Looked for again.
        if (pt->disarms != pass.disarms[i]) {
            retry = true;
            continue;
        }
        still.push_back(pt);
    }
    for (Point *pt : pass.batch) pt->copy_fresh = false;
    write_jumps(still.data(), still.size());
    for (Point *pt : pass.batch) spawn_gate_update(pt); // those that will not have a jmp
    restore_islands(pass.retired);
    pass.retired.clear();
    return !retry;
}

// Queues a pass's points and islands again, for a later pass. Under the registry mutex.
void requeue(const Pass &pass) {
    UKP_ASSERT_REGISTRY_HELD();
    for (Point *pt : pass.batch) {
        if (!pt->queued) {
            pt->queued = true;
            pending().push_back(pt);
        }
    }
    for (Point *pt : pass.retired)
        if (std::find(retiring().begin(), retiring().end(), pt) == retiring().end()) retiring().push_back(pt);
}

void worker() {
    const AgentWork quiet; // its reads of /proc are not the program's calls
    enter_optimizer_thread();
    std::unique_lock lock(registry_mutex());
    const auto has_work = [] {
        return !pending().empty() || !retiring().empty() || (!awaiting().empty() && !g_building) || g_built;
    };
    for (;;) {
        if (!has_work()) platform::release_spares(); // idle: platform/agent_heap.hpp
        work_cv().wait(lock, has_work);
        if (g_built) {
            // Its end allocates too: joined under the gate (taken before the mutex), or by
            // a fork that came first (opt_before_fork).
            lock.unlock();
            {
                const ForkQuiet joining(ForkGate::kOptimizer);
                lock.lock();
                const bool ended = g_built;
                g_built = false;
                lock.unlock();
                if (ended) join_tables_thread();
            }
            lock.lock();
        }
        if (!awaiting().empty() && !g_building) start_tables_thread(lock);
        if (g_arm_batches.load(std::memory_order_relaxed) > 0) {
            // Points come one after another (an event armed over a library): each pass
            // stops every thread, the arming one too, so a pass gathers what a millisecond
            // brings, as the kernel's optimizer waits a few jiffies.
            lock.unlock();
            const timespec gather{0, 1000 * 1000};
            nanosleep(&gather, nullptr);
            lock.lock();
        }
        const uint64_t target = g_requested;
        Pass pass = take_work();
        bool retry = false;
        // Under a tracer, or with no signal left to the optimizer, no signal: the jumps go
        // in when every thread is seen outside.
        const bool work = !pass.batch.empty() || !pass.retired.empty();
        const bool silent = work && (traced() || !ensure_stop_handler());
        if (work) {
            const bool strict = prepare_regions(pass);
            g_busy = true;
            if (strict)
                g_strict_epoch.store(g_copy_epoch.fetch_add(1, std::memory_order_acq_rel) + 1,
                                     std::memory_order_release);
            lock.unlock();
            // Hits that chose the one-instruction copy before have finished choosing.
            if (strict) synchronize();
            int err;
            {
                const ForkQuiet busy(ForkGate::kOptimizer); // it allocates: fork.hpp
                err = move_threads_out(pass.batch.data(), pass.batch.size(), strict, pass.islands.data(),
                                       pass.islands.size(), silent);
            }
            lock.lock();
            g_busy = false;
            retry = err != 0 || !finish_pass(pass);
        }
        // The work asked so far is done once no point of it waits for a later pass.
        if (pending().empty() && retiring().empty() && awaiting().empty() && !g_building) g_handled = target;
        done_cv().notify_all();
        if (retry) {
            lock.unlock();
            const timespec pause{0, 20 * 1000 * 1000};
            nanosleep(&pause, nullptr);
            lock.lock();
            requeue(pass);
        }
    }
}

void enqueue(Point *pt) {
    if (pt->queued) return;
    pt->queued = true;
    pending().push_back(pt);
    ++g_requested;
    // The thread is started by optimizer_start(), outside the registry mutex; the work
    // waits in pending() until then.
    work_cv().notify_one();
}

} // namespace

namespace {

// /proc/self/task/TID/syscall into text (NUL-terminated): "running", or "nr arg1 .. arg6
// sp pc" in a system call, "-1 sp pc" otherwise. False when it cannot be read.
bool read_task_syscall(int tid, char (&text)[256]) {
    return platform::read_task_file(tid, "syscall", text, sizeof text) > 0;
}

} // namespace

bool task_syscall(int tid, long *nr, uint64_t *pc) {
    char text[256];
    if (!read_task_syscall(tid, text)) return false;
    if (platform::starts_with(text, "running")) return false;
    // "nr arg1 .. arg6 sp pc" in a system call, "-1 sp pc" otherwise: pc is last.
    const char *last = nullptr;
    for (const char *c = text; *c != '\0'; ++c)
        if (*c == ' ') last = c;
    if (last == nullptr) return false;
    const char *at = text;
    *nr = platform::parse_decimal(&at);
    at = last + 1;
    *pc = platform::parse_hex(&at);
    return true;
}

namespace {

// Whether a signal handler run on thread `tid` now leaves what the thread does unchanged:
// it runs, or is in user space, or (`blocked_too`) waits in a system call the kernel
// restarts after a SA_RESTART handler with nothing transferred yet: a read of any kind,
// accept, wait4/waitid, a futex wait without timeout. Not a write (it may return short),
// nor a sleep, poll or timed wait (EINTR).
bool untouched_by_signal(int tid, bool blocked_too) {
    char text[256];
    if (!read_task_syscall(tid, text)) return false;
    if (platform::starts_with(text, "running")) return true;
    const char *at = text;
    const long nr = platform::parse_decimal(&at);
    if (nr == -1) return true;
    if (!blocked_too) return false;
    uint64_t args[6] = {};
    for (uint64_t &a : args) {
        while (*at == ' ') ++at;
        a = platform::parse_hex(&at);
    }
    switch (nr) {
    case SYS_read:
    case SYS_readv:
    case SYS_pread64:
    case SYS_recvfrom:
    case SYS_recvmsg:
    case SYS_accept:
    case SYS_accept4:
    case SYS_wait4:
    case SYS_waitid:
        return true;
    case SYS_futex: {
        const uint64_t op = args[1] & 0x7f; // without FUTEX_PRIVATE_FLAG, FUTEX_CLOCK_REALTIME
        return (op == 0 /* FUTEX_WAIT */ || op == 9 /* FUTEX_WAIT_BITSET */) && args[3] == 0;
    }
    default:
        return false;
    }
}

} // namespace

bool opt_ask_program_thread(bool (*done)(), int timeout_ms) {
    UKP_ASSERT_REGISTRY_NOT_HELD();
    int sig = 0;
    {
        std::lock_guard lock(registry_mutex()); // the stop signal is the optimizer's to choose
        if (traced() || !ensure_stop_handler()) return done();
        sig = stop_signal();
    }
    const pid_t pid = getpid();
    const int self = static_cast<int>(syscall(SYS_gettid));
    const auto now_ms = [] {
        timespec t{};
        clock_gettime(CLOCK_MONOTONIC, &t);
        return t.tv_sec * 1000l + t.tv_nsec / 1000000;
    };
    const long start = now_ms();
    std::vector<int> asked; // each thread once: one that cannot close (a table of its own) stays so
    // The first half of the time only threads that run or are in user space; then blocked ones too.
    for (long t = start; !done() && t - start < timeout_ms; t = now_ms()) {
        const bool blocked_too = t - start >= timeout_ms / 2;
        int chosen = 0;
        platform::for_each_thread([&](int tid) {
            if (tid == self || std::find(asked.begin(), asked.end(), tid) != asked.end()) return true;
            if (blocks_signal(tid, sig) || !untouched_by_signal(tid, blocked_too)) return true;
            chosen = tid;
            return false;
        });
        if (chosen == 0) {
            const timespec pause{0, 1000 * 1000};
            nanosleep(&pause, nullptr);
            continue;
        }
        asked.push_back(chosen);
        siginfo_t info{};
        info.si_signo = sig;
        info.si_code = SI_QUEUE;
        info.si_pid = pid;
        info.si_uid = getuid();
        info.si_value.sival_ptr = reinterpret_cast<void *>(kChoreValue);
        if (syscall(SYS_rt_tgsigqueueinfo, pid, chosen, sig, &info) != 0) continue;
        // A thread that runs takes it at once; one in a system call when the call restarts.
        for (int i = 0; i < 20 && !done(); ++i) {
            const timespec pause{0, 1000 * 1000};
            nanosleep(&pause, nullptr);
        }
    }
    return done();
}

std::shared_ptr<const arch::ObjectRefs> opt_object_refs(uint64_t addr) {
    std::string file;
    uint64_t bias = 0;
    return object_of(addr, &file, &bias) ? arch::object_refs(file, bias, safe_read) : nullptr;
}

void opt_warm(uint64_t addr) {
    UKP_ASSERT_REGISTRY_NOT_HELD();
    if (!g_opt_enabled.load(std::memory_order_relaxed)) return;
    std::string file;
    uint64_t bias = 0;
    if (!object_of(addr, &file, &bias)) return;
    bool known = false;
    arch::object_refs_if_known(file, bias, safe_read, &known);
    // Left to the tables thread where the verdicts may wait for it (verdict_may_wait;
    // libc's is built by the spawn gate).
    if (known || (g_start_held.load(std::memory_order_acquire) == 0 && !traced())) return;
    arch::object_refs(file, bias, safe_read);
}

void opt_prepare(Point *pt, uint64_t fn_start, uint64_t fn_size, uint64_t bias,
                 const std::vector<uint64_t> &other_symbols) {
    std::vector<uint8_t> code; // with the padding after the function: a region may run into it
    if (!read_function_code(fn_start, fn_size, &code)) return;
    const uint64_t code_sum = platform::cache_checksum(code.data(), code.size());
    RegionPlan plan;
    arch::OptimizeCheck c;
    arch::Island island;
    bool by_island = false;
    if (find_plan(bias, pt->addr, fn_start, fn_size, code_sum, &plan) &&
        plan.jump != RegionPlan::kAtRegistration) { // decided ahead (plan_jumps)
        if (plan.jump == RegionPlan::kNoJump) return;
        c.ok = true;
        for (uint8_t i = 0; i < plan.n_insns; ++i) c.insns.push_back(pt->addr + plan.insn_offset[i]);
    } else {
        const char *path = nullptr;
        const uint64_t eh_hdr = eh_frame_hdr_of(bias, &path);
        // What the whole object references (built once per object): without it, only the
        // per-function checks apply. Not built yet: built by the optimizer thread, where
        // the point may wait for it on its int3 (opt_prepare in core.hpp).
        std::shared_ptr<const arch::ObjectRefs> refs;
        if (path != nullptr) {
            const std::string file = *path ? path : "/proc/self/exe";
            bool known = false;
            refs = arch::object_refs_if_known(file, bias, safe_read, &known);
            if (!known) {
                if (verdict_may_wait(pt)) {
                    await_verdict(pt);
                    return;
                }
                refs = arch::object_refs(file, bias, safe_read);
            }
        }
        const JumpFacts facts = jump_facts(fn_start, fn_size, code, eh_hdr, other_symbols);
        if (!facts.pads_known) {
            keep_plan(bias, plan_of(c, false, bias, fn_start, fn_size, pt->addr, code_sum));
            return;
        }
        c = arch::check_region(facts.f, pt->addr, facts.entries, 5, refs.get());
        // A region one short branch enters may still have a jmp, with an island.
        const arch::ReadFn original = [](uint64_t addr, void *out, size_t n) {
            return read_original_code(addr, static_cast<uint8_t *>(out), n) == 0;
        };
        by_island = !c.ok && refs != nullptr && arch::plan_island(c, pt->addr, *refs, original, &island);
        plan = plan_of(c, facts.f.start_jumped, bias, fn_start, fn_size, pt->addr, code_sum);
        if (!c.ok && refs != nullptr && !c.entered_by.empty()) plan.jump = RegionPlan::kAtRegistration;
        keep_plan(bias, plan);
    }
    if ((!c.ok && !by_island) || c.insns.size() > arch::kMaxDcrInsns || c.dcr_len > sizeof pt->dcr_orig) return;
    arch::Insn dcr[arch::kMaxDcrInsns];
    for (size_t i = 0; i < c.insns.size(); ++i) {
        const uint64_t off = c.insns[i] - fn_start;
        if (arch::decode(c.insns[i], code.data() + off, code.size() - off, &dcr[i]) != 0) return;
    }
    const uint64_t slot = text::alloc_slot(pt->addr);
    if (slot == 0) return;
    uint8_t buf[text::kSlotSize];
    std::memset(buf, 0xcc, sizeof buf);
    std::memcpy(buf, &pt, sizeof pt);
    arch::DetourLayout layout;
    if (arch::emit_detour(slot + kDetourOffset, reinterpret_cast<uint64_t>(pt), dcr, c.insns.size(),
                          buf + kDetourOffset, sizeof buf - kDetourOffset, &layout) != 0)
        return;
    uint8_t jmp[5];
    if (!arch::encode_jmp_rel32(pt->addr, slot + kDetourOffset, jmp)) return; // slot out of reach
    uint64_t island_to = 0;
    uint8_t island_jmp[arch::kIslandSize];
    if (by_island) {
        island_to = arch::detour_copy_of(layout, slot + kDetourOffset, pt->addr, island.target);
        if (island_to == 0 || !arch::encode_jmp_rel32(island.at, island_to, island_jmp)) return;
    }
    // The kretprobe detour after it, if it fits, at a function's entry: any point there
    // gets one, since a point's probes change after it is prepared. Not where the function
    // jumps back to its entry: the kretprobe trampoline writes into the red zone below the
    // entry's stack pointer, dead only when the entry is reached by a call.
    const size_t kret_at = (kDetourOffset + layout.size + 15) & ~size_t{15};
    int kret_size = -ENOSPC;
    size_t kret_back = 0;
    if (kret_at < sizeof buf && pt->addr == fn_start && plan.start_jumped == 0)
        kret_size = arch::emit_kret_detour(slot + kret_at, reinterpret_cast<uint64_t>(pt), buf + kret_at,
                                           sizeof buf - kret_at, &kret_back);
    const size_t used = kret_size > 0 ? kret_at + static_cast<size_t>(kret_size) : kDetourOffset + layout.size;
    if (text::write(slot, buf, used) != 0) return;
    pt->detour = slot;
    pt->detour_code = slot + kDetourOffset;
    pt->kret_code = kret_size > 0 ? slot + kret_at : 0;
    pt->kret_back = kret_size > 0 ? slot + kret_at + kret_back : 0;
    pt->region_copy = pt->detour_code + layout.copy;
    pt->layout = layout;
    std::memcpy(pt->dcr_orig, code.data() + (pt->addr - fn_start), layout.dcr_len);
    if (by_island) {
        pt->island = island;
        pt->island_to = island_to;
        std::memcpy(pt->island_jmp, island_jmp, sizeof island_jmp);
        island_points().push_back(pt);
    }
    // With another probe inside the region, the breakpoint path must reach it.
    if (!other_point_inside(pt, pt->addr, layout.dcr_len))
        pt->breakpoint_region_copy.store(pt->region_copy, std::memory_order_release);
}

void opt_update(Point *pt, bool) {
    const bool q = qualifies(pt);
    if (!q) island_lower(pt); // once the jmp is gone (opt_unoptimize lowers it too)
    if (pt->optimized && !q) {
        opt_unoptimize(pt);
    } else if (pt->optimized && opt_target(pt) != pt->jump_target) {
        // The probes changed kind (a kretprobe alone, or not any more): the jmp goes to the
        // other detour by way of the breakpoint, as any optimization does.
        if (opt_unoptimize(pt) == 0) enqueue(pt);
    } else if (!pt->optimized && q) {
        enqueue(pt);
    }
    set_flags(pt);
    spawn_gate_update(pt);
    if (pt->armed) return;
    // A probe inside another point's region went away: that one may qualify again.
    auto &pts = all_points();
    for (auto it = pts.lower_bound(pt->addr >= 16 ? pt->addr - 15 : 0); it != pts.end() && it->first < pt->addr; ++it) {
        Point *outer = it->second;
        if (outer->detour != 0 && in_region(outer, pt->addr) && !outer->optimized && qualifies(outer)) enqueue(outer);
    }
    // Or one in the way of an island.
    for (Point *other : island_points())
        if (other != pt && meets_island(other, pt->addr, footprint_end(pt)) && !other->optimized && qualifies(other))
            enqueue(other);
}

void opt_before_arming(uint64_t addr) {
    auto &pts = all_points();
    for (auto it = pts.lower_bound(addr >= 16 ? addr - 15 : 0); it != pts.end() && it->first < addr; ++it) {
        Point *pt = it->second;
        if (pt->detour == 0 || !in_region(pt, addr)) continue;
        if (pt->optimized) opt_unoptimize(pt);
        // The optimizer brings the copy back when the region is free again (and every
        // thread on the way into the region is accounted for).
        pt->breakpoint_region_copy.store(0, std::memory_order_release);
    }
    // A point at an island's branch or in its bytes (or whose region copy holds the
    // branch) takes them back: the island's branch goes back as its jmp does.
    auto self = pts.find(addr);
    const uint64_t end = self != pts.end() ? footprint_end(self->second) : addr + 1;
    for (Point *pt : island_points()) {
        if (pt->addr == addr || !meets_island(pt, addr, end)) continue;
        if (pt->optimized) opt_unoptimize(pt);
        island_lower(pt);
    }
}

int opt_unoptimize(Point *pt) {
    if (!pt->optimized) return 0;
    spawn_gate_close(pt);
    // The int3 first: from then on no thread takes the jmp, and none is inside its bytes.
    if (int err = text::poke_byte(pt->addr, batch_arming_byte()); err != 0) return err;
    if (int err = text::write(pt->addr + 1, pt->dcr_orig + 1, 4); err != 0) return err;
    text::sync_cores();
    pt->optimized = false;
    set_flags(pt);
    // The region is the original code again: the branch may lead there again.
    island_lower(pt);
    return 0;
}

void opt_disarm_many(const std::vector<Point *> &pts) {
    if (pts.empty()) return;
    for (Point *pt : pts) spawn_gate_close(pt);
    // Each phase's writes through text::write_many: between them the program's libc calls
    // and the agent's own trap on the int3s of every point at once.
    const uint8_t int3 = batch_arming_byte();
    std::vector<text::Piece> pieces;
    for (Point *pt : pts) pieces.push_back({pt->addr, &int3, 1});
    std::unique_ptr<bool[]> ok(new bool[pts.size()]);
    const auto write_phase = [&](std::vector<Point *> *them) {
        text::write_many(pieces.data(), pieces.size(), ok.get());
        std::vector<Point *> done;
        done.reserve(them->size());
        for (size_t i = 0; i < them->size(); ++i)
            if (ok[i]) done.push_back((*them)[i]);
        *them = std::move(done);
        text::sync_cores();
    };
    std::vector<Point *> going(pts);
    write_phase(&going); // no core takes these jmps from here on
    pieces.clear();
    for (Point *pt : going) pieces.push_back({pt->addr + 1, pt->dcr_orig + 1, 4});
    write_phase(&going);
    for (Point *pt : going) {
        pt->optimized = false;
        set_flags(pt);
    }
    pieces.clear();
    for (Point *pt : going) pieces.push_back({pt->addr, &pt->orig_byte, 1});
    write_phase(&going);
    for (Point *pt : going) {
        pt->armed = false;
        ++pt->disarms;
    }
    for (Point *pt : pts) {
        island_lower(pt);
        spawn_gate_update(pt);
    }
}

void opt_overlay(uint64_t addr, uint8_t *buf, size_t n) {
    auto &pts = all_points();
    for (auto it = pts.lower_bound(addr >= 16 ? addr - 15 : 0); it != pts.end() && it->first < addr + n; ++it) {
        const Point *pt = it->second;
        if (!pt->optimized) continue;
        for (size_t i = 1; i < 5; ++i) { // byte 0 is the armed int3's, put back by the caller
            const uint64_t a = pt->addr + i;
            if (a >= addr && a < addr + n) buf[a - addr] = pt->dcr_orig[i];
        }
        if (pt->addr >= addr && pt->addr < addr + n) buf[pt->addr - addr] = pt->dcr_orig[0];
    }
    const auto put = [&](uint64_t at, uint8_t byte) {
        if (at >= addr && at < addr + n) buf[at - addr] = byte;
    };
    for (const Point *pt : island_points()) {
        if (pt->island_live) put(pt->island.source + 1, pt->island.source_disp);
        for (size_t i = 0; pt->island_written && i < arch::kIslandSize; ++i) put(pt->island.at + i, pt->island.orig[i]);
    }
}

void island_bytes(std::vector<std::pair<uint64_t, uint8_t>> *out) {
    for (const Point *pt : island_points()) {
        if (pt->island_live) out->emplace_back(pt->island.source + 1, pt->island.source_disp);
        for (size_t i = 0; pt->island_written && i < arch::kIslandSize; ++i)
            out->emplace_back(pt->island.at + i, pt->island.orig[i]);
    }
}

void opt_before_fork() {
    UKP_ASSERT_REGISTRY_HELD();
    // The tables thread has ended its work and the optimizer has not joined it yet: it may
    // still be in its end (the C library's, a sanitizer's), allocating.
    if (g_built) {
        g_built = false;
        join_tables_thread();
    }
}

void opt_after_fork_child() {
    // The parent's worker may have been waiting on them: it is not here to leave.
    renew_after_fork(work_cv_of());
    renew_after_fork(done_cv_of());
    g_thread_started = false;
    g_thread_starting = false;
    g_busy = false;
    pending().clear();
    // Nor the tables thread: the points that waited for it keep their int3, as the queued.
    g_building = g_built = false;
    awaiting().clear();
    for (auto &[addr, pt] : all_points()) pt->queued = pt->verdict_due = false;
    g_handled = g_requested;
}

bool opt_qualifies(const Point *pt) { return qualifies(pt); }

int opt_stop_signal() { return stop_signal(); }

uint8_t arming_byte() { return traced() ? kTracedTrap : uint8_t{BREAKPOINT_INSTRUCTION}; }

bool opt_breaks_spawn_path(const Point *pt, const kprobe *p) {
    if (!spawn_path_enforced()) return false;
    if (pt->spawn_path && (p->post_handler != nullptr || is_jprobe(p) || pt->detour == 0 ||
                           other_point_inside(pt, pt->addr, pt->layout.dcr_len) || island_in_the_way(pt)))
        return true;
    auto &pts = all_points();
    for (auto it = pts.lower_bound(pt->addr >= 16 ? pt->addr - 15 : 0); it != pts.end() && it->first < pt->addr; ++it) {
        const Point *q = it->second;
        if (q->spawn_path && in_use(q) && q->detour != 0 && pt->addr < q->addr + q->layout.dcr_len) return true;
    }
    for (const Point *other : island_points())
        if (other != pt && other->spawn_path && in_use(other) && meets_island(other, pt->addr, footprint_end(pt)))
            return true;
    return false;
}

void opt_forget_island(Point *pt) {
    if (pt->island_to == 0) return;
    pt->island_live = pt->island_written = false;
    pt->island_to = 0;
    std::erase(island_points(), pt);
    std::erase(retiring(), pt);
}

void opt_restore_islands_alone() {
    restore_islands(retiring());
    retiring().clear();
    g_handled = g_requested;
}

uint64_t into_copy(const Point *pt, uint64_t ip) {
    if (pt->breakpoint_region_copy.load(std::memory_order_acquire) == 0 || !in_region(pt, ip)) return ip;
    const uint64_t to = arch::detour_copy_of(pt->layout, pt->detour_code, pt->addr, ip);
    return to != 0 ? to : ip;
}

uint64_t copy_to_original(const Point *pt, uint64_t ip) {
    if (pt->detour == 0) return 0;
    return arch::detour_orig_of(pt->layout, pt->detour_code, pt->addr, ip);
}

void optimizer_start() {
    UKP_ASSERT_REGISTRY_NOT_HELD();
    if ((!g_opt_enabled.load(std::memory_order_relaxed) && !spawn_path_known()) ||
        g_thread_started.load(std::memory_order_acquire) || g_start_held.load(std::memory_order_acquire) > 0)
        return;
    bool expected = false;
    if (!g_thread_starting.compare_exchange_strong(expected, true)) return;
    // Detached: it lives as long as the process (probes outlive static destructors).
    pthread_t thread;
    if (platform::start_agent_thread(
            &thread,
            [](void *) -> void * {
                worker();
                return nullptr;
            },
            nullptr) != 0) {
        g_thread_starting.store(false, std::memory_order_release); // no thread to be had: asked again later
        return;
    }
    pthread_detach(thread);
    g_thread_started.store(true, std::memory_order_release);
}

int set_optimization(bool on) {
    if (on) {
        g_opt_enabled.store(true);
        optimizer_start(); // before the registry mutex, see optimizer_start()
    }
    std::lock_guard lock(registry_mutex());
    g_opt_enabled.store(on);
    int result = 0;
    for (auto &[addr, pt] : all_points()) {
        if (!on && pt->optimized && !pt->spawn_path) {
            if (int err = opt_unoptimize(pt); err != 0 && result == 0) result = err;
        }
        opt_update(pt);
    }
    return result;
}

OptimizeAtStart::OptimizeAtStart() {
    if (g_start_held.fetch_add(1, std::memory_order_acq_rel) > 0) return;
    std::lock_guard lock(registry_mutex());
    g_alone = g_opt_enabled.load(std::memory_order_relaxed) && !g_thread_started.load(std::memory_order_acquire) &&
              thread_count() == 1;
}

bool opt_arm_alone(Point *pt) {
    if (!g_alone || pt->armed || pt->detour == 0) return false;
    pt->armed = true; // as qualifies() and opt_target() see the point once armed
    uint8_t jmp[5];
    const bool ok = qualifies(pt) && arch::encode_jmp_rel32(pt->addr, opt_target(pt), jmp);
    pt->armed = false;
    if (!ok) return false;
    if (pt->breakpoint_region_copy.load(std::memory_order_relaxed) == 0)
        pt->breakpoint_region_copy.store(pt->region_copy, std::memory_order_release);
    pt->copy_fresh = false;
    if (island_raise(pt) != 0) return false;
    // One write: no other thread can run these bytes, and the caller is in agent code.
    if (text::write(pt->addr, jmp, sizeof jmp) != 0) return false;
    text::sync_cores();
    pt->armed = true;
    pt->jump_target = opt_target(pt);
    pt->optimized = true;
    set_flags(pt);
    return true;
}

OptimizeAtStart::~OptimizeAtStart() {
    bool left = false;
    {
        std::lock_guard lock(registry_mutex());
        if (g_start_held.load(std::memory_order_acquire) == 1) { // the outermost scope
            // Points armed before the scope, or re-queued in it, are as safe to jump now.
            if (g_alone && !pending().empty()) optimize_pending_alone();
            left = !pending().empty();
            g_alone = false;
        }
    }
    g_start_held.fetch_sub(1, std::memory_order_acq_rel);
    if (left) optimizer_start(); // another thread runs (or the count is unknown): the usual way
}

void optimizer_flush() {
    std::unique_lock lock(registry_mutex());
    if (!g_thread_started) return;
    const uint64_t target = g_requested;
    done_cv().wait(lock, [&] { return g_handled >= target && !g_busy; });
}

bool optimizer_flush_for(std::chrono::milliseconds limit) {
    std::unique_lock lock(registry_mutex());
    if (!g_thread_started) return true;
    const uint64_t target = g_requested;
    return done_cv().wait_for(lock, limit, [&] { return g_handled >= target && !g_busy; });
}

bool process_traced() { return status_number("TracerPid:", 0) != 0; }

} // namespace ukp::core

extern "C" {

int ukp_set_kprobes_optimization(int on) { return ukp::core::set_optimization(on != 0); }

int ukp_kprobes_optimization(void) { return ukp::core::g_opt_enabled.load() ? 1 : 0; }

void ukp_optimizer_flush(void) { ukp::core::optimizer_flush(); }

} // extern "C"
