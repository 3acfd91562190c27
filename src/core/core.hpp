// The probe core: probe points, their handlers, arming, and the hit path.
#pragma once

#include <ukprobes/kprobes.h>

#include "arch/x86_64/detour.hpp"
#include "arch/x86_64/full_blocks.hpp"
#include "arch/x86_64/insn.hpp"
#include "arch/x86_64/island.hpp"
#include "arch/x86_64/reach.hpp"
#include "arch/x86_64/region.hpp"
#include "arch/x86_64/regs.hpp"
#include "platform/safe_access.hpp"
#include "arch/x86_64/trampoline.hpp"
#include "arch/x86_64/vector_use.hpp"
#include "core/agent.hpp"
#include "core/checked_mutex.hpp"
#include "core/trampolines.hpp"
#include "platform/vector_state.hpp"

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <signal.h>
#include <initializer_list>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

// On the hit path's functions: hidden, so that calls to them inside the library are direct
// (no PLT) and may be inlined; nothing outside the library calls them.
#define UKP_HOT __attribute__((visibility("hidden")))

namespace ukp::sym {
class Registry;
}

namespace ukp::core {

// The probes registered at one address, in registration order. Immutable once
// published: a change publishes a new list and retires the old one after a grace period.
// ProbeList::fast: what the jump path's trampoline does itself (trampolines.S).
enum FastCase : uint8_t {
    kFastNone = 0,    // nothing: the C dispatcher decides
    kFastGuarded = 1, // one user probe: called under a recovery point of its own
    kFastOwn = 2,     // one of the agent's own handlers: called as it is
};

// A reader cell's word (ReaderCell::word): the depth of the owner's read sections in the
// low 16 bits, the count of its outermost sections above (hit.cpp, "grace periods").
inline constexpr uint64_t kSectionDepthMask = 0xffff;
inline constexpr uint64_t kSectionOne = kSectionDepthMask + 1;

struct ProbeList {
    uint32_t count = 0;
    // Bit i: probes[i]'s pre_handler is lean (the scan, arch::scan_vector_use), so the
    // jump path calls it without saving the vector state. Probes past the 64th are not
    // looked at: they run with it saved.
    uint64_t lean_mask = 0;
    // Bit i: probes[i]'s pre_handler is the agent's own (handler_is_own): called without
    // a recovery point. Probes past the 64th are guarded.
    uint64_t own_mask = 0;
    bool any_post = false; // a probe has a post_handler (enabled or not)
    // kFastGuarded or kFastOwn: one probe, without a post_handler, whose pre_handler is
    // lean, so that the jump path's trampoline calls it itself (a user's under a recovery
    // point of its own, the agent's own as it is); else kFastNone.
    uint8_t fast = kFastNone;
    // Every probe the agent's own and lean, none with a post_handler (kFastOwn's one, or an
    // event's entry and another's return probe on one function): the jump path's
    // dispatcher calls them as they are, with no recovery point or copy of the registers.
    bool all_own_lean = false;
    // One probe, a kretprobe without an entry_handler: its RetPool, for the kretprobe's
    // own trampoline (ukp_kret_entry_trampoline), which then reads no more of the probe
    // than its flags; else null.
    void *kret_pool = nullptr;
    kprobe *probes[1]; // really `count` entries (allocated with room for them)

    bool lean(uint32_t i) const { return i < 64 && ((lean_mask >> i) & 1) != 0; }
    bool own(uint32_t i) const { return i < 64 && ((own_mask >> i) & 1) != 0; }
};

// One probed address. Created at the first registration there and kept for the life of
// the process (or of its object): its out-of-line slot may be executing on some thread
// long after the last probe is gone, and a late int3 hit must still find it.
struct Point {
    uint64_t addr = 0;
    arch::BranchInsn insn;                  // the original instruction, as far as emulating it needs
    uint8_t orig_byte = 0;                  // what the int3 replaced
    uint64_t slot = 0;                      // out-of-line slot (text::kSlotSize bytes), 0 for branches
    uint64_t boosted = 0;                   // copy that runs the instruction and jumps back
    uint64_t post = 0;                      // copy that runs the instruction, then the post trampoline
    uint8_t boosted_len = 0;                // bytes of the instruction's copy in `boosted`, before its jump back
    arch::FaultUndos undo;                  // faults past the first instruction of `boosted`/`post`
    std::atomic<ProbeList *> list{nullptr}; // null when no probe is registered
    uint64_t region_copy = 0;               // the detour's region copy (detour_code + layout.copy), 0 without one
    bool armed = false;                     // int3 in place; changed under the registry mutex
    // Times the int3 was taken out (under the registry mutex): threads may then run into the
    // region through the original code, so the optimizer that looked for them before one
    // of these looks again (optimizer.cpp).
    uint64_t disarms = 0;
    // Jump optimization (optimizer.cpp). The detour is built when the point is prepared,
    // if the region check passes, and kept for the life of the process; or, where the
    // object's reference table is not built yet, by the optimizer thread once it is
    // (verdict_due meanwhile, under the registry mutex).
    uint64_t detour = 0;       // its slot (text::kSlotSize bytes, the Point * first), or 0
    uint64_t detour_code = 0;  // the detour's entry (detour + 16)
    arch::DetourLayout layout; // where the region copy is in it
    // The kretprobe detour's entry (arch::emit_kret_detour), after the detour in the same
    // slot, or 0 where it does not fit (or the entry is not a function's, reached by a
    // call): the jmp leads there while an enabled kretprobe is among the point's probes
    // (opt_target). It resumes at region_copy, or at the stub that calls it.
    uint64_t kret_code = 0;
    // Its call's return site, where the trampolines return to, or 0: from there the
    // detour jumps through the word 8 below the program's stack pointer, so that
    // ukp_optprobe_trampoline, entered through it, resumes anywhere by a `ret`.
    uint64_t kret_back = 0;
    uint64_t jump_target = 0;  // where the jmp in place leads (optimized)
    uint8_t dcr_orig[16] = {}; // the region's original bytes (layout.dcr_len of them)
    // The detour's region copy while the breakpoint path runs it instead of the
    // first instruction alone (so no thread ever enters the region past its first byte);
    // 0 while another probe is inside the region; the optimizer gives it back (its strict
    // pass) when that probe is gone.
    std::atomic<uint64_t> breakpoint_region_copy{0};
    bool optimized = false;   // the jmp is in place; changed under the registry mutex
    bool queued = false;      // waiting for the optimizer; under the registry mutex
    bool verdict_due = false; // its jump verdict waits for its object's reference table (optimizer.cpp)
    bool copy_fresh = false;  // breakpoint_region_copy came back: threads may still be on the old path in
    // An island (arch/x86_64/island.hpp): the region is entered by one short branch
    // elsewhere, which is led to a jmp in dead padding before the region gets its jmp.
    // Under the registry mutex.
    arch::Island island;
    uint64_t island_to = 0;                     // the detour's copy of island.target; 0: no island
    uint8_t island_jmp[arch::kIslandSize] = {}; // the island's code: jmp island_to
    bool island_live = false;                   // the branch leads to the island
    bool island_written = false;                // the island's bytes are in place (until the optimizer retires them)
    bool in_window = false; // an int3 in libc on its way to a jmp: the spawn gate is closed (spawn_gate.cpp)
    // In a function glibc's spawn child may run: never an int3 for good (spawn_gate.cpp).
    bool spawn_path = false;
    std::string object_name; // for kprobes/list
    std::string symbol;      // "sym", for kprobes/list
    uint64_t symbol_offset = 0;
};

// Lock-free address -> Point lookup for the hit path. Inserts happen under the registry
// mutex; entries are never removed.
UKP_HOT Point *find_point(uint64_t addr);
void insert_point(uint64_t addr, Point *p);

// Read-side critical sections around every use of a ProbeList or kprobe by a hit, and
// the writer's wait for all sections that began before a change. A thread marks its
// sections in a word of its own, with plain stores: the writer makes every running
// thread execute a memory barrier (membarrier) before it reads those words, so the hit
// path takes no lock, runs no locked instruction and makes no system call. Without
// membarrier, and for threads beyond the reader cells, two shared counters (SRCU-like).
UKP_HOT unsigned read_lock();
UKP_HOT void read_unlock(unsigned idx);
// Ends a section that a trampoline's fast case began in the thread's own reader cell.
void read_unlock_own_cell();
// Waits until every read section begun before the call has ended. Returns false,
// without waiting, when called from inside a probe handler.
bool synchronize();
// Registers the process for membarrier's private expedited barrier (once, before the
// first probe). Without it, all threads use the shared counters.
void grace_init();
// Decides, once, whether the jump path's and the return path's dispatchers run without
// saving the vector state: each only if the scan proves its code lean (not under the
// sanitizers, whose checks call out through the PLT). lean_dispatch_scan() tells what a
// scan found.
void lean_dispatch_init();
enum class Dispatcher { kOptprobe, kKretprobe };
const arch::VectorScan &lean_dispatch_scan(Dispatcher which);
bool handler_is_own(const void *fn);
// How many threads can have a reader cell for their read sections at once.
constexpr size_t kReaderCells = 1024;
// Reader cells held now (by live threads, or by dead ones the next synchronize() has not
// reclaimed yet); for tests.
size_t reader_cells_in_use();

// A thread's reader cell (hit.cpp, "grace periods"): where it marks its read sections,
// and where its return trampoline keeps one free return-probe instance for its next call
// (kretprobe.cpp, "spare instances"). Static memory, never freed: a reader cell outlives
// its thread, which lets other threads look into it at any time.
struct alignas(64) ReaderCell {
    // The depth of the owner's read sections in the low 16 bits, and above them the count
    // of its outermost sections.
    std::atomic<uint64_t> word{0};
    // The owner's ThreadState in the low 48 bits (0: free), and above them a count of the
    // claims, so that a reclaiming writer cannot free a claim newer than the one it judged.
    std::atomic<uint64_t> claim{0};
    void *spare = nullptr;                   // a free RetInstance, valid while spare_pool is set
    std::atomic<void *> spare_pool{nullptr}; // its RetPool, or null: no spare
    std::atomic<uint32_t> spare_lock{0};     // 1 while a thread other than the owner handles the spare
};

// The reader cells ever claimed: a stealing thread looks through them (kretprobe.cpp).
ReaderCell *claimed_cells(size_t *n);
// The calling thread's own reader cell, or null (none yet, or the shared counters').
ReaderCell *own_cell();
// Whether threads mark their sections in reader cells of their own (membarrier is there).
bool private_cells();
// Whether the word of a reader cell shows its owner inside a read section.
bool cell_in_section(uint64_t word);
// Makes every running thread of the process execute a full memory barrier (membarrier);
// false, doing nothing, when the process has no private reader cells (membarrier missing).
bool barrier_everywhere();

// Per-thread state of the hit path (initial-exec TLS: no allocation, no lock).

struct ThreadState {
    int depth; // > 0 while this thread runs probe handlers
    int quiet; // > 0 while it does the agent's own work (AgentWork)
    // While ukp_optprobe_trampoline's fast case runs a user's pre_handler: its frame, where
    // a fault in the handler resumes (at ukp_optprobe_fast_recovery); else null. Beside
    // depth, which the fast case writes with it.
    pt_regs *fast_frame;
    bool recovery_armed;   // a handler is running under `recovery`
    ukp_recovery recovery; // where a faulting handler is abandoned to
    int fault_trapnr;      // trap number of that fault
    // The hit whose pre_handlers run, for handlers that need more than pt_regs (jprobes).
    ucontext_t *hit_context;
    Point *hit_point;
    uint32_t hit_position; // the running handler's probe's position in the point's list
    ReaderCell *reader;    // where its read sections are marked (hit.cpp); null before the first
    ReaderCell *claiming;  // the reader cell it is claiming, while it claims one
};
UKP_HOT ThreadState &thread_state();

// ---- jump optimization (optimizer.cpp) ------------------------------------------------
// All but the last three are called with the registry mutex held.

// Builds pt's detour if a jump may replace the region at pt->addr in fn
// [fn_start, fn_start + fn_size) of the object loaded at `bias`; no error if not. Where
// the verdict needs the object's reference table and it is not built yet (a second for a
// large program), the point waits for it on its int3 and the optimizer thread builds the
// table and decides, as the kernel's optimizer comes after a probe's registration:
// except at a process's start (OptimizeAtStart), under a tracer (an int3 would stop the
// program in its debugger), and in libc (the spawn path needs its jumps at once).
void opt_prepare(Point *pt, uint64_t fn_start, uint64_t fn_size, uint64_t bias,
                 const std::vector<uint64_t> &other_symbols);
// opt_prepare for the point pt, its function looked up (registry.cpp).
void prepare_jump(Point *pt);
// Whether an object is loaded at bias, as the symbol tables know (registry.cpp).
bool object_loaded_at(uint64_t bias);
// pt's probes, arming or the knobs changed: unoptimizes it if it no longer qualifies,
// queues it for the optimizer if it does. With `disarming`, it is about to lose its int3.
void opt_update(Point *pt, bool disarming = false);
// A point is about to be armed at addr: no optimized region or region copy may cover it.
void opt_before_arming(uint64_t addr);
// Puts the region's bytes back (int3 at the first byte). 0 or -errno.
int opt_unoptimize(Point *pt);
// Takes many optimized points off their jumps and out of the code at once (their probes
// disabled): their int3s, one synchronization of the cores, their regions' bytes, another,
// their first bytes, a third. A point a write failed for is left armed, optimized or not,
// for update_arming. Under the registry mutex.
void opt_disarm_many(const std::vector<Point *> &pts);
// The code of an optimized region, and the bytes of islands, original bytes in place, for
// read_original.
void opt_overlay(uint64_t addr, uint8_t *buf, size_t n);
// Whether pt may have its jmp now (its probes, the knobs, the points around it).
bool opt_qualifies(const Point *pt);
// What /proc/self/task/TID/syscall says of thread tid: false while it runs (or if it is
// gone); else *nr is the system call it stands in (-1 when stopped outside one) and *pc
// its user instruction pointer.
bool task_syscall(int tid, long *nr, uint64_t *pc);
// pt's object was unloaded: its island (and the branch to it) went with the mapping.
void opt_forget_island(Point *pt);
// Before fork(), under the registry mutex and the agent's fork gates: a tables thread
// that has ended is joined (fork.hpp).
void opt_before_fork();
// After fork() in the child: the optimizer thread did not come along.
void opt_after_fork_child();
// The bytes of islands whose branch went back are put back at once: the caller is the
// process's only thread (a child after fork()), at none of them.
void opt_restore_islands_alone();
// Builds, if not yet done, the reference table of the object whose code holds addr (what
// opt_prepare checks regions against; a second or so for libc), where opt_prepare would
// not leave it to the optimizer thread. Without the registry mutex.
void opt_warm(uint64_t addr);
// The references of the object that holds addr (built once per object), or null.
std::shared_ptr<const arch::ObjectRefs> opt_object_refs(uint64_t addr);

// ---- the optimizer's verdicts, decided ahead and kept (plans.cpp) ----------------------
// Whether a jmp may replace the region at a point, as opt_prepare decides it from the
// decode of the point's function and its object's references; kept by object, in memory
// and on disk, for the bytes it was decided from. Offsets are from the object's load bias.
struct RegionPlan {
    uint64_t fn_offset = 0, fn_size = 0, offset = 0; // the function, the point
    uint64_t code_sum = 0;                           // platform::cache_checksum of what read_function_code read
    uint8_t jump = 0;                                // kNoJump, kJump, or kAtRegistration
    uint8_t start_jumped = 0;                        // arch::FunctionMap::start_jumped
    uint8_t n_insns = 0;                             // the region's instructions, by their offsets from the point
    uint8_t insn_offset[arch::kMaxDcrInsns] = {};

    static constexpr uint8_t kNoJump = 0; // the point stays on its int3
    static constexpr uint8_t kJump = 1;   // a jmp may replace the region
    // Only with an island, if one can be planned: that is decided at the registration
    // (arch::plan_island reads code under the registry mutex).
    static constexpr uint8_t kAtRegistration = 2;
};
// Functions above this size are not decoded for a jump.
inline constexpr uint64_t kMaxPlannedFunction = 64u << 20;
// The function's original bytes, and the padding after it (up to arch::kMaxTail, fewer
// where unreadable): what a verdict is decided from. Under the registry mutex.
bool read_function_code(uint64_t fn_start, uint64_t fn_size, std::vector<uint8_t> *code);
// What the check of a region needs besides the object's references: the function decoded
// whole, and the further addresses execution may enter it at (the other symbols inside it,
// its landing pads). pads_known false: its landing pads could not be read (no jump then).
struct JumpFacts {
    arch::FunctionMap f;
    std::vector<uint64_t> entries;
    bool pads_known = false;
};
JumpFacts jump_facts(uint64_t fn_start, uint64_t fn_size, const std::vector<uint8_t> &code, uint64_t eh_frame_hdr,
                     const std::vector<uint64_t> &other_symbols);
// The PT_GNU_EH_FRAME of the object loaded at bias (0 if none), and its file's name in
// *path ("" for the main program; null if no object is loaded there).
uint64_t eh_frame_hdr_of(uint64_t bias, const char **path);
// The verdict of check c for a point at addr in fn_start.. (not one that needs an island).
RegionPlan plan_of(const arch::OptimizeCheck &c, bool start_jumped, uint64_t bias, uint64_t fn_start, uint64_t fn_size,
                   uint64_t addr, uint64_t code_sum);
// The kept verdict for a point at addr in fn_start.. of the object at bias, decided from
// code whose checksum is code_sum. Takes plans_mutex().
bool find_plan(uint64_t bias, uint64_t addr, uint64_t fn_start, uint64_t fn_size, uint64_t code_sum, RegionPlan *out);
void keep_plan(uint64_t bias, const RegionPlan &plan);
// The verdicts of the object that was loaded at bias go (it was unloaded).
void forget_plans(uint64_t bias);
// How many objects' verdicts this process read from the disk, and how many verdicts
// plan_jumps() decided (for tests and benchmarks).
struct PlanStats {
    uint64_t objects_loaded = 0;
    uint64_t decided = 0;
};
PlanStats plan_stats();
// The verdicts' lock: never held while the registry mutex is taken; held around fork().
std::mutex &plans_mutex();
// Whether pt, with p put on it, would leave a spawn-path point on its int3 for good: pt's
// own (p has a post_handler or is a jprobe, pt has no detour, another point lies in its
// region or island), or another's whose region or island pt's bytes meet. Under the
// registry mutex.
bool opt_breaks_spawn_path(const Point *pt, const kprobe *p);
// Starts the optimizer thread if optimization is on and it is not running. Call it only
// without the registry mutex: pthread_create waits for the dynamic linker's lock, which a
// dlopen() in another thread holds while its link-map hook waits for the registry mutex.
void optimizer_start();
// Inside an OptimizeAtStart scope whose caller is the process's only thread: arms pt with
// its jmp in one write (no int3 first), if the point qualifies for one. False, nothing
// written, otherwise. Under the registry mutex.
bool opt_arm_alone(Point *pt);
// Where a thread that reached `ip` (inside pt's region) goes on, in the region copy;
// ip itself when the breakpoint path does not run the copy. Async-signal-safe.
uint64_t into_copy(const Point *pt, uint64_t ip);
// The original address of the region instruction whose copy starts at ip, or 0.
uint64_t copy_to_original(const Point *pt, uint64_t ip);

// ---- the spawn gate (spawn_gate.cpp) ----------------------------------------------------
// Installs the gate if addr lies in libc and it is not there yet. Not under the registry mutex.
void spawn_gate_install(uint64_t addr);
// The entries of the functions of those names (every version) in the object that holds
// in_object (registry.cpp). Not under the registry mutex.
std::vector<uint64_t> functions_named(uint64_t in_object, std::initializer_list<std::string_view> names);
bool is_spawn_gate(const kprobe *p);
// Before an int3 goes into pt's first byte (arming, or unoptimizing): closes the gate and
// waits (at most 5 s) for the spawns in flight. Under the registry mutex.
void spawn_gate_close(Point *pt);
// How many times the gate has looked for a thread in clone (for tests).
long spawn_gate_clone_looks();
// After pt's state changed: opens the gate when no int3 in libc waits for its jmp any more.
// Under the registry mutex.
void spawn_gate_update(Point *pt);
void spawn_gate_after_fork_child();
// Whether addr lies in a function that glibc's posix_spawn (and so system and popen) may
// run, its child included, with every signal blocked. False until the gate is installed.
bool on_spawn_path(uint64_t addr);
// Whether the optimizer is needed though optimization is off: spawn-path points take
// their jmps whatever the knob says.
bool spawn_path_known();
// Whether registrations that would leave a spawn-path point on its int3 are refused (on;
// off only for tests of the mechanisms the rule keeps away from libc's string functions).
bool spawn_path_enforced();
void set_spawn_path_enforced(bool on);

// ---- glibc's full blocks (full_blocks.cpp) -----------------------------------------------
// With addr in libc or the loader, once per process: the sets glibc blocks with raw system
// calls around clone, at a thread's exit and in pthread_kill leave the agent's signals out.
// Not under the registry mutex.
void open_full_blocks(uint64_t addr);
// The bytes it changed, with the files' (for ukp_verify). Under the registry mutex.
void full_block_bytes(std::vector<std::pair<uint64_t, uint8_t>> *out);
// The blocks it changed.
std::vector<arch::FullBlock> opened_full_blocks();

// Writes text and name on standard error, a line, and aborts (no allocation, no stdio).
[[noreturn]] void die_naming(const char *text, const char *name);
// For a function that runs under the registry mutex: checked in UKP_CHECKS builds.
#define UKP_ASSERT_REGISTRY_HELD() ::ukp::core::registry_mutex().assert_held(__func__)
// For a function that runs without it (it takes it, or waits for a thread that does).
#define UKP_ASSERT_REGISTRY_NOT_HELD() ::ukp::core::registry_mutex().assert_not_held(__func__)
std::map<uint64_t, Point *> &all_points();
int read_original_code(uint64_t addr, uint8_t *buf, size_t n);
// Readers for arch's analyses: code as the files have it (the bytes under our int3s and
// jmps put back; under the registry mutex), and memory as it is (fault-safe).
arch::ReadFn original_code_reader();
arch::ReadFn memory_reader();
// The code of the object holding in_object reachable from `entries` (arch/x86_64/reach.hpp),
// leaving out the paths that end the process (abort, __libc_fatal, ...); max_depth as
// there. Takes the registry mutex (spawn_gate.cpp).
arch::Reach reachable_in(uint64_t in_object, const std::vector<uint64_t> &entries, int max_depth = -1);
// The bytes islands own (their jmps, their branches' displacements), with what the files
// have there, for ukp_verify. Under the registry mutex.
void island_bytes(std::vector<std::pair<uint64_t, uint8_t>> *out);

extern std::atomic<bool> g_opt_enabled; // debug.kprobes_optimization
// ArmBatch scopes open, on all threads: while one is, points come in quick succession.
extern std::atomic<int> g_arm_batches;
// In the child of fork(): only the forking thread's scopes came along.
void arm_batches_after_fork_child();

// > 0 while this thread runs the agent's signal handler (signals.cpp), whose code lies
// between __start_ukp_trap_text and __stop_ukp_trap_text.
extern thread_local int t_in_agent_handler __attribute__((tls_model("initial-exec")));

// Raised each time region copies come back (optimizer.cpp). The hit paths record in
// t_decision_epoch the value under which they chose where the thread resumes
// (kNoDecision: none yet in this signal handler), so that the optimizer can tell a thread
// still bound for an old path from one that will take the copy.
extern std::atomic<unsigned> g_copy_epoch;
extern thread_local unsigned t_decision_epoch __attribute__((tls_model("initial-exec")));
inline constexpr unsigned kNoDecision = ~0u;

// Global knobs (kprobes/enabled).
extern std::atomic<bool> g_kprobes_enabled;
// Set in a child of fork() under UKP_FORK_REMOVE: no handler runs there any more. Named
// for trampolines.S, whose fast cases read it.
extern std::atomic<bool> g_handlers_silenced __asm__("ukp_handlers_silenced") UKP_HOT;

// Takes the signals the agent needs delivered (SIGTRAP, SIGSEGV, SIGBUS, SIGFPE, SIGILL)
// out of a mask the program asked for: blocked, they would kill the process (sigmask.cpp).
// The optimizer's stop signal too: blocked, it would wait for the program's signalfd or
// sigwaitinfo, which would take it for one of its own.
void strip_agent_signals(sigset_t *set);
// The optimizer's stop signal (a real-time signal the program leaves alone), 0 before
// the first pass that needs one or when none is left (optimizer.cpp).
int opt_stop_signal();
// Has one program thread run hw_breakpoints_close_deferred_in_handler() (sent the stop
// signal with a value of its own), trying threads one after another until done() holds
// or `timeout_ms` passes. Only threads the signal cannot change: running, in user space,
// or blocked in a system call the kernel restarts after a handler (a read, a futex wait
// without timeout), never one that would return EINTR or a short write. Whether done()
// held. Not under the registry mutex.
bool opt_ask_program_thread(bool (*done)(), int timeout_ms);

// Installs the agent's signal handlers, or puts them back if something displaced them
// (recording what it finds as the program's). 0 or -errno.
int install_signal_handlers();

// Goes on with a hit whose chain a jprobe interrupted: the pre_handlers after `after`,
// then the instruction and the post_handlers (jprobe.cpp calls it from jprobe_return).
void resume_hit(Point *pt, ucontext_t *uc, pt_regs &regs, const kprobe *after);
// Whether trap_addr is jprobe_return()'s breakpoint; if so, handles it (jprobe.cpp).
bool on_jprobe_return(uint64_t trap_addr, ucontext_t *uc);

// Hit path entry points, called from the signal handlers.
void on_breakpoint(siginfo_t *info, ucontext_t *uc);
// A SIGILL of a point armed with kTracedTrap: handled as its int3 would be (true).
bool on_traced_trap(siginfo_t *info, ucontext_t *uc);
bool on_fault(int sig, siginfo_t *info, ucontext_t *uc); // true if it was ours

// The byte a point is armed with. int3, but under a tracer (a debugger) an instruction
// that is invalid in 64-bit mode (push es): a debugger stops at its SIGILL as at an
// int3's SIGTRAP, but passes it on when the program is continued, and a SIGILL it drops
// (detach) comes again, as the instruction did not complete; a SIGTRAP the debugger
// drops leaves the thread past the int3, inside the instruction.
inline constexpr uint8_t kTracedTrap = 0x06;
uint8_t arming_byte();
// arming_byte(), or within an ArmBatch scope of this thread the one it took at its start
// (each asking reads /proc/self/status).
uint8_t batch_arming_byte();

// Gives a signal to the program as if ukprobes were not there: its own handler, or the
// default action. `uc` is the context the program should see; `replayable` says that
// resuming `uc` re-executes the program's own faulting instruction.
void deliver_to_program(int sig, siginfo_t *info, ucontext_t *uc, bool replayable = false);

// Runs fn(a, b), a handler of p taking two pointers, under a recovery point: a fault
// inside it abandons it and returns -1. With the vector state saved around it unless
// `proven` (fn lean, or the state saved already). An `own` handler (handler_is_own) runs
// without the recovery point.
UKP_HOT int call_guarded(kprobe *p, void *fn, void *a, void *b, bool proven, bool own);

// Runs f() with the vector state saved around it, unless the caller says it is saved
// already (the breakpoint path: the kernel saved it in the signal frame). On the jump and
// return paths, whose dispatchers run without that state saved when they are lean
// (lean_dispatch_init), every call of code that is not lean goes through here. Both ways
// go through a call helper, so the scan of a dispatcher's code (vector_use.hpp) does not
// follow into f.
template <typename F>
void outside_gpr(bool ext_saved, F &&f) {
    if (ext_saved)
        ukp_call_handler(reinterpret_cast<void *>(&platform::closure_thunk<std::remove_reference_t<F>>), &f, nullptr);
    else
        platform::saving_vectors(f);
}

// The thread id of the calling thread, cached per thread.
UKP_HOT int current_tid();
// In the child of fork(): the thread that forked has another id there.
void forget_tid_after_fork();
// In the child of fork(), after grace_after_fork_child(): when the child has no reader
// cells of its own (membarrier refused), the spare return-probe instances go back to
// their pools.
void spares_after_fork_child();

// Registry services for the other probe types (registry.cpp).
// The agent made ready for a first registration (signal handlers, fork hooks). 0 or -errno.
int prepare_agent();
// The address of "sym" or "MOD:sym" (functions and data), or 0.
uint64_t symbol_address(const char *name);
bool is_registered(const kprobe *p);
// Resolves p's address as register_kprobe() would; *entry says whether it is the first
// instruction of a function.
int resolve_probe(const kprobe *p, uint64_t *addr, bool *entry);
// p names "OBJECT:sym" of an object not loaded yet: register_kprobe() accepts it as pending.
bool waits_for_object(const kprobe *p);
// 'k', 'r' or 'j' for kprobes/list (kretprobe.cpp).
char probe_type(const kprobe *p);
// p's RetPool if p is a kretprobe without an entry_handler, else null (kretprobe.cpp).
void *kret_pool_without_entry_handler(const kprobe *p);

// Whether a tracer (a debugger, strace) is attached to the process (optimizer.cpp).
bool process_traced();

// ---- hardware breakpoints (hw_breakpoint.cpp) -----------------------------------------
// si_code of a perf event's SIGTRAP (TRAP_PERF of asm-generic/siginfo.h; glibc 2.36 has no name for it).
constexpr int kTrapPerf = 6;
// A SIGTRAP of a perf event (kTrapPerf): runs the breakpoint's handler; false if it is not
// one of the agent's breakpoints (the program's own perf event).
bool on_hw_breakpoint(siginfo_t *info, ucontext_t *uc);
// Around fork(), from fork.cpp's handlers: the breakpoints' mutex is taken in the prepare
// handler; in the child, wide breakpoints get events of the child's own (the policy
// UKP_FORK_KEEP) or go inert (UKP_FORK_REMOVE), those of one thread go inert.
// kprobes/list's rows for the breakpoints: "ADDRESS  w  SYM+0xOFF  OBJECT TYPE:LEN [DISABLED]".
std::string hw_breakpoints_list_text(const sym::Registry *symbols);
void hw_breakpoints_before_fork();
void hw_breakpoints_after_fork_parent();
void hw_breakpoints_after_fork_child(bool keep);
// In the optimizer's stop signal's handler, on a program thread asked by
// opt_ask_program_thread(): closes the breakpoint descriptors of the program's table
// that a thread with a table of its own could only disable.
void hw_breakpoints_close_deferred_in_handler();
// Whether no such descriptor waits to be closed.
bool hw_breakpoints_none_deferred();

// The addresses and original bytes of the armed int3s, the jmps and the islands, for
// ukp_verify (registry.cpp). Under the registry mutex.
std::vector<std::pair<uint64_t, uint8_t>> armed_bytes();

// kprobes/list text, and the kprobes/enabled knob (registry.cpp).
std::string list_text(const std::vector<const kprobe *> &hidden = {});
int set_enabled(bool on);

inline bool probe_disabled(const kprobe *p) {
    return __atomic_load_n(&p->flags, __ATOMIC_RELAXED) & (KPROBE_FLAG_DISABLED | KPROBE_FLAG_GONE);
}
inline void count_missed(kprobe *p) { __atomic_fetch_add(&p->nmissed, 1, __ATOMIC_RELAXED); }

} // namespace ukp::core
