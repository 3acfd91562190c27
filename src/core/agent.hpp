// What the core offers the layers above it (trace, control) besides the kernel's API
// (<ukprobes/kprobes.h>): how the agent marks its own work and its own handlers, and the
// optimizer's scopes. Nothing here names an architecture's type.
#pragma once

#include "core/checked_mutex.hpp"
#include "platform/vector_state.hpp"

#include <ukprobes/hw_breakpoint.h>

#include <ukprobes/kprobes.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace ukp::core {

// Marks the agent's own work on the calling thread: its control thread, its optimizer,
// the trace files read or written through the API. A probe hit there runs no handler and
// counts nothing: the program did not make that call (a probe on libc's open must not
// show the agent opening /proc/PID/comm to format the trace it is reading).
class AgentWork {
public:
    AgentWork();
    ~AgentWork();
    AgentWork(const AgentWork &) = delete;
    AgentWork &operator=(const AgentWork &) = delete;
};

// The same, begun and ended by two calls (for calls made from outside the agent).
void begin_agent_work();
void end_agent_work();

// fork()'s window: from the agent's last prepare handler to its first parent handler, and
// in the child until the tracer has given it a ring of its own, the forking thread's probe
// hits neither run nor count, as the agent's own work. Without it the child's hits in the
// C library's fork() (its locks' reset, _Fork's return) and in the other child handlers
// wrote into the parent's ring, which is shared memory, at the same time as the parent:
// the reader lost the parent's records unreported. The tracer ends the child's window
// (fork_window_ends_late before it registers its child handler, end_fork_window there).
void fork_window_ends_late();
void end_fork_window();

// Runs f() from inside a probe hit as the agent's own work, with the vector state saved:
// the calls into the C library the tracer's hit path makes for itself (a thread's name and
// id, once; the clock's next segments; a trigger's action) are not the program's, and a
// probe they meet counts no miss in kprobe_profile (kprobes.rst counts the program's).
template <class F>
void agent_call(F &&f) {
    platform::saving_vectors([&] {
        const AgentWork quiet;
        f();
    });
}

// The agent's own handlers (kretprobe's entry handler, the tracer's): every access they
// make to the program's memory goes through the fixup table (ukp_safe_copy), and the
// memory they write is the agent's, so the hit path calls them as it runs the rest of
// its own code, without the recovery point a user's handler runs under (a fault there
// is a bug of the agent, as one in the dispatcher is). Marked before a probe uses them;
// a probe takes the mark at its registration.
void mark_own_handler(const void *fn);
// Whether a handler's code is lean (true for none). Under registry_mutex(), as
// lean_dispatch_init(): the scan reads the code under the probes.
bool handler_is_lean(const void *fn);

// A scope in which probes are registered while the process may have no other thread (a
// process's start, before main): the optimizer thread is not started meanwhile, and at the
// end of the scope, if the caller is still the only thread, the queued points get their
// jumps at once, on the caller's thread, with no breakpoint window any thread could run
// into and no signal a tracer would see. Otherwise the optimizer thread takes them.
class OptimizeAtStart {
public:
    OptimizeAtStart();
    ~OptimizeAtStart();
    OptimizeAtStart(const OptimizeAtStart &) = delete;
    OptimizeAtStart &operator=(const OptimizeAtStart &) = delete;
};
// A scope in which the calling thread arms or disarms many probes (an event over many
// functions): each int3 goes in (or out) at once, and the cores are synchronized once, at
// the end of the scope, instead of after each (a membarrier interrupts every core that runs
// the process: 100 us and more in a VM). Meanwhile another core may still run a byte's old
// value, as it may between any write and its synchronization; at the end every core runs
// the new ones. Writes that must be seen before the next (a jump taken out) still
// synchronize each.
class ArmBatch {
public:
    ArmBatch();
    ~ArmBatch();
    ArmBatch(const ArmBatch &) = delete;
    ArmBatch &operator=(const ArmBatch &) = delete;
};

// Waits until every probe hit begun before the call has left its handlers (a grace
// period, as the kernel's synchronize_rcu()): after a disable, none of them acts later.
// Returns at once, false, when called from a handler.
bool wait_for_hits_in_flight();

// Disables many probes at once, as disable_kprobe() would one by one (an event over many
// functions): the points that go off their jumps come out together, with three
// synchronizations of the cores in all, not two a point (each a membarrier, which
// interrupts every core running the process), and nothing between the writes that calls
// the C library (every function of libc may be on its int3 then). results[i] is
// probes[i]'s: 0, or nonzero when it is left as it was, for the caller to disable alone
// (not registered, gone, fewer than two probes, or a write failed). Without the registry
// mutex. (Arming many at once is left one by one: with every int3 in before the
// optimizer's first pass, the agent's own libc calls trap until it is through, and the
// jumps came in four times later.)
void disable_together(const std::vector<kprobe *> &probes, std::vector<int> *results);

// Before probes go on many addresses (an event over a library): the jump optimizer's
// verdict for each decided ahead, the object's references built on one core while the
// functions are decoded on the others, and kept with the object's other tables on disk
// (the next process reads them); registering the probes then only builds their detours.
// Without the registry mutex. Nothing is registered or armed.
void plan_jumps(const std::vector<uint64_t> &addrs);

// Waits, at most `limit`, until the optimizer has been through the work queued before the
// call (ukp_optimizer_flush). False if the time ran out.
bool optimizer_flush_for(std::chrono::milliseconds limit);

// A wide breakpoint that probe hits place and lift (the set_wprobe and clear_wprobe
// triggers): prepared here, off the hit path, with attr's type and length, watching
// nothing; freed with unregister_hw_breakpoint(). ERR_PTR(-errno) on failure.
perf_event *prepare_placeable_breakpoint(const perf_event_attr &attr, perf_overflow_handler_t triggered, void *context);
// From a hit: watches addr on every thread (raw system calls, nothing allocated), at most
// 512 threads. 0; -EBUSY when it is placed (or another hit is placing it); -EINVAL for an
// address that is not a user-space one aligned to the length; the kernel's errors.
int place_breakpoint(perf_event *bp, uint64_t addr) noexcept;
// From a hit: watches nothing again. 0, or -ENOENT when it was not placed.
int lift_breakpoint(perf_event *bp) noexcept;
// The address it watches, or 0.
uint64_t placed_address(const perf_event *bp);

// Declares that addr starts an instruction, though no function symbol holds it (an SDT
// probe's site: <sys/sdt.h> puts a nop there, in a stripped program as anywhere):
// register_kprobe() takes it then, on the breakpoint path (a jump needs the function).
void declare_instruction_boundary(uint64_t addr);

// kprobes/list without the probes in `hidden` (sorted): those of an event over many
// functions, which the tracer sums up in a row of its own.
std::string kprobes_list_without(const std::vector<const kprobe *> &hidden);

// The registry mutex (registry.cpp): registration, arming, the optimizer's queues.
CheckedMutex &registry_mutex();

} // namespace ukp::core
