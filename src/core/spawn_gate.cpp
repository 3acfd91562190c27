// The spawn gate: no child of posix_spawn() meets a probe's int3 while it waits for its jmp.
//
// glibc runs the child of posix_spawn, posix_spawnp, system and popen (the four call one
// internal function) in the parent's memory, with every signal blocked by a raw system
// call and every handler reset to the default, until its execve. An int3 hit there is
// fatal: the kernel turns a blocked SIGTRAP into its default action. The jump path raises
// no signal, so what is left is the time an int3 stands in libc before the optimizer
// replaces it with the jmp (a definition made while the program runs; a point going back
// to its breakpoint on its way to another detour or out): a few milliseconds, in which a
// program spawning children in a loop lost hundreds of them.
//
// The gate is a kretprobe of the agent's on posix_spawn and posix_spawnp (both versions):
// its entry handler counts the spawns in flight, its return handler counts them out. An
// int3 goes into libc only with the gate closed and no spawn in flight; a spawn that comes
// while the gate is closed waits at the entry until the jumps are in place. Both waits are
// bounded (kMaxWait): an optimizer that cannot place a jump (a debugger attached, a thread
// that never answers) holds no spawn for longer than that, once per window. The bound is
// for those cases only, so it is generous: with both cores kept busy by other work, a
// bound of a second let an int3 in under a child that had not exec'd yet (one child of
// 374 killed in OptimizerTest.ChildrenOfPosixSpawnSurviveProbesComingAndGoing).
//
// Installed with the first probe in libc (not under the registry mutex: it registers
// probes). A spawn already past posix_spawn's entry then is not counted: for the first
// kMaxWait after installation, the drain also waits for threads standing in clone.
//
// A probe that would stay on its int3 for good is another matter: no gate helps, the child
// must never meet it. So the gate's installation also works out the spawn path: the code
// reachable from posix_spawn's entries (arch/x86_64/reach.hpp: direct jumps and calls,
// function pointers formed by lea, such as the child's function handed to clone and
// execve, and the GOT entries behind PLT entries, such as the memcpy an IFUNC chose),
// leaving out the paths that end the process (abort, __libc_fatal, ...). About 17 KB of
// code in glibc 2.36: the child's dup2, close, open, chdir, execve, execvpe's getenv and
// string functions, sigaction, _exit, and the parent's clone and mmap. A point there
// keeps its jmp with optimization off, and a probe that would keep one on its int3 (a
// post_handler, a jprobe, no detour, a point in its region) is refused with -EINVAL
// (optimizer.cpp, registry.cpp).
#include "core/core.hpp"

#include "arch/x86_64/reach.hpp"
#include "platform/proc_tasks.hpp"

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace ukp::core {

namespace {

constexpr int64_t kMaxWait = 5ll * 1000 * 1000 * 1000; // ns
constexpr int kGates = 4;

std::atomic<int> g_spawning{0}; // spawns between posix_spawn's entry and its return
std::atomic<bool> g_closed{false};
std::atomic<int64_t> g_deadline{0}; // a spawn waits for a closed gate until then (monotonic ns)
std::atomic<int> g_state{0};        // 0: not installed, 1: installing, 2: installed
int64_t g_installed_at = 0;
int g_window = 0; // points with an int3 in libc on their way to a jmp (registry mutex)
// When the drain last found no thread in clone (registry mutex; 0: never). Within
// kCloneLookFresh of that, the next point's drain does not look again: an event over
// every function of libc armed its points in a tenth of a second, most of it this look (a
// directory and a file per thread, each libc call of it trapping on the int3s already
// in), once per point. The look is for the spawns that were past posix_spawn's entry when
// the gate was installed, which the gate does not count, and whether a window closed and
// another opened since tells nothing of them: the look holds across windows. (Disabling
// that event, each point opens a window of its own on its way back through its int3: a
// look per point was 3,700 of them, 67 ms.)
int64_t g_no_clone_at = 0;
bool g_looks_over = false; // kMaxWait since the installation have passed (registry mutex)
std::atomic<long> g_clone_looks{0};
constexpr int64_t kCloneLookFresh = 1000 * 1000; // ns
kretprobe g_gates[kGates];
arch::Reach g_path; // the spawn path, written once before g_path_ready
std::atomic<bool> g_path_ready{false};
std::atomic<bool> g_path_enforced{true};
thread_local bool t_installing = false;

int64_t now_ns() {
    timespec t{};
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000l + t.tv_nsec;
}

// The same by a straight system call, for the drain: libc's clock_gettime may be one of
// the functions being armed.
int64_t now_ns_raw() {
    timespec t{};
    platform::raw_syscall(SYS_clock_gettime, CLOCK_MONOTONIC, reinterpret_cast<long>(&t));
    return t.tv_sec * 1000000000l + t.tv_nsec;
}

void pause_ms() {
    const timespec ms{0, 1000 * 1000};
    nanosleep(&ms, nullptr);
}

int gate_enter(kretprobe_instance *, pt_regs *) {
    const int saved_errno = errno;
    for (;;) {
        g_spawning.fetch_add(1, std::memory_order_seq_cst);
        if (!g_closed.load(std::memory_order_seq_cst) || now_ns() > g_deadline.load(std::memory_order_relaxed)) break;
        g_spawning.fetch_sub(1, std::memory_order_seq_cst);
        pause_ms();
    }
    errno = saved_errno;
    return 0;
}

int gate_leave(kretprobe_instance *, pt_regs *) {
    g_spawning.fetch_sub(1, std::memory_order_seq_cst);
    return 0;
}

// Some thread of the process (not the caller) stands in clone, clone3 or vfork.
// Straight system calls (platform/proc_tasks.hpp): it looks while libc is being armed.
bool thread_in_clone() {
    const long self = platform::raw_syscall(SYS_gettid);
    bool found = false;
    platform::for_each_thread([&](int tid) {
        long nr = -1;
        uint64_t pc = 0;
        if (tid != self && task_syscall(tid, &nr, &pc)) found = nr == SYS_clone || nr == SYS_clone3 || nr == SYS_vfork;
        return !found;
    });
    return found;
}

bool in_libc(const Point *pt) { return pt->object_name.rfind("libc.so", 0) == 0; }

// Another thread installs the gate: its spawn path decides how the caller's probe is
// placed, so the caller waits for it (the installer's own registrations do not).
void wait_for_installer() {
    for (int i = 0; i < 5000 && !t_installing && g_state.load(std::memory_order_acquire) == 1; ++i) pause_ms();
}

} // namespace

arch::Reach reachable_in(uint64_t in_object, const std::vector<uint64_t> &entries, int max_depth) {
    const auto refs = opt_object_refs(in_object);
    if (refs == nullptr) return {};
    const std::vector<uint64_t> stops = functions_named(
        in_object, {"abort", "__assert_fail", "__libc_fatal", "__fortify_fail", "__chk_fail", "__stack_chk_fail"});
    std::lock_guard lock(registry_mutex());
    return arch::reachable_code(*refs, entries, stops, original_code_reader(), memory_reader(), max_depth);
}

bool is_spawn_gate(const kprobe *p) {
    for (const kretprobe &g : g_gates)
        if (p == &g.kp) return true;
    return false;
}

bool on_spawn_path(uint64_t addr) { return g_path_ready.load(std::memory_order_acquire) && g_path.contains(addr); }

bool spawn_path_enforced() { return g_path_enforced.load(std::memory_order_relaxed); }

void set_spawn_path_enforced(bool on) { g_path_enforced.store(on, std::memory_order_relaxed); }

bool spawn_path_known() { return g_path_ready.load(std::memory_order_acquire) && !g_path.code.empty(); }

void spawn_gate_install(uint64_t addr) {
    UKP_ASSERT_REGISTRY_NOT_HELD();
    if (g_state.load(std::memory_order_acquire) != 0) {
        wait_for_installer();
        return;
    }
    Dl_info info{};
    if (dladdr(reinterpret_cast<void *>(addr), &info) == 0 || info.dli_fname == nullptr) return;
    const char *base = strrchr(info.dli_fname, '/');
    if (strncmp(base != nullptr ? base + 1 : info.dli_fname, "libc.so", 7) != 0) return;
    int expected = 0;
    if (!g_state.compare_exchange_strong(expected, 1)) {
        wait_for_installer();
        return;
    }
    // posix_spawn and posix_spawnp, today's and the versions of glibc 2.2.5 (they differ
    // in how they read the file actions, and all four call the same function). From the
    // agent's symbol tables: dlopen() would call the loader's r_brk, where a debugger
    // stops, and dlsym() might find a program's own posix_spawn first.
    const std::vector<uint64_t> entries = functions_named(addr, {"posix_spawn", "posix_spawnp"});
    t_installing = true;
    g_path = reachable_in(addr, entries);                // the spawn path: the child's code included
    g_path_ready.store(true, std::memory_order_release); // before the gate's own points
    g_installed_at = now_ns();
    for (size_t i = 0; i < entries.size() && i < kGates; ++i) {
        kretprobe &g = g_gates[i];
        g.kp.addr = reinterpret_cast<kprobe_opcode_t *>(entries[i]);
        g.entry_handler = gate_enter;
        g.handler = gate_leave;
        g.maxactive = 64;
        if (register_kretprobe(&g) != 0) g.kp.addr = nullptr;
    }
    t_installing = false;
    g_state.store(2, std::memory_order_release);
    // With optimization off, the thread that places the spawn path's jmps.
    optimizer_start();
}

void spawn_gate_close(Point *pt) {
    UKP_ASSERT_REGISTRY_HELD();
    if (pt->in_window || !in_libc(pt) || g_state.load(std::memory_order_acquire) != 2) return;
    pt->in_window = true;
    const bool opening = g_window++ == 0;
    // The usual case past the first kMaxWait, with the gate already closed: no spawn in
    // flight, nothing to read the clock for (a system call a point, in an event over libc).
    if (!opening && g_looks_over && g_spawning.load(std::memory_order_seq_cst) == 0) return;
    const int64_t start = now_ns_raw();
    if (opening) {
        g_deadline.store(start + kMaxWait, std::memory_order_relaxed);
        g_closed.store(true, std::memory_order_seq_cst);
    }
    if (start - g_installed_at >= kMaxWait) g_looks_over = true;
    // The spawns in flight end (their children exec'd or exited) before the int3 goes in.
    // Those in flight when the gate was installed are not counted: for kMaxWait after it,
    // a thread in clone is one.
    for (int64_t now = start;; now = now_ns_raw()) {
        if (g_spawning.load(std::memory_order_seq_cst) == 0) {
            if (g_looks_over) break;
            if (g_no_clone_at != 0 && now - g_no_clone_at < kCloneLookFresh) break;
            g_clone_looks.fetch_add(1, std::memory_order_relaxed);
            if (!thread_in_clone()) {
                g_no_clone_at = now;
                break;
            }
        }
        if (now - start > kMaxWait) break;
        pause_ms();
    }
}

long spawn_gate_clone_looks() { return g_clone_looks.load(std::memory_order_relaxed); }

void spawn_gate_update(Point *pt) {
    UKP_ASSERT_REGISTRY_HELD();
    if (!pt->in_window) return;
    // Still on its way to a jmp: the int3 stands and the optimizer will replace it.
    if (pt->armed && !pt->optimized && opt_qualifies(pt)) return;
    pt->in_window = false;
    if (--g_window == 0) g_closed.store(false, std::memory_order_seq_cst);
}

void spawn_gate_after_fork_child() {
    // A spawn in flight on another thread of the parent is not in the child.
    g_spawning.store(0, std::memory_order_relaxed);
}

} // namespace ukp::core
