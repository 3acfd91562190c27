// fork(): the agent's locks taken around it, and the child's probes (ukp_set_fork_policy).
#include "core/agent.hpp"
#include "core/core.hpp"
#include "core/registry_internal.hpp"

#include "core/fork.hpp"
#include "core/jit_debug.hpp"
#include "core/kretprobe.hpp"
#include "platform/agent_threads.hpp"
#include "platform/fork_mark.hpp"
#include "text/text.hpp"

#include <atomic>
#include <mutex>
#include <new>
#include <pthread.h>

namespace ukp::core {
namespace {

std::atomic<int> g_fork_policy{UKP_FORK_KEEP};
std::mutex g_control_gate, g_optimizer_gate, g_tables_gate; // fork.hpp

// Around fork(): the agent's threads are let finish what they do, then the registry mutex
// is taken, so that the child never inherits a lock held by a thread it does not have.
// The agent's locking around fork() is not the program's: a probe on the lock functions
// neither runs nor counts (AgentWork).
// A process made by a fork() that ran no handler (platform/fork_mark.hpp: bwrap's
// raw clone(), _Fork()) has none of the agent's threads, but their gates as they were at
// that instant: the control thread holds its own while it serves a request, and `ukprobe
// run` reads the trace all the time. Its first fork() waited for ever there. At that
// fork, a gate it cannot take is made anew: only the agent's threads take them, and
// those of its parent are not here. (An agent thread started in that process since, and
// working at that instant, would lose its gate's exclusion once.)
void renew_gates_after_a_raw_fork() {
    if (platform::process_known() || platform::g_fork_mark.renewed.exchange(1) != 0) return;
    for (std::mutex *gate : {&g_control_gate, &g_optimizer_gate, &g_tables_gate}) {
        if (gate->try_lock())
            gate->unlock();
        else
            new (gate) std::mutex;
    }
}

void before_fork() {
    const AgentWork quiet;
    renew_gates_after_a_raw_fork();
    g_control_gate.lock();
    g_optimizer_gate.lock();
    g_tables_gate.lock();
    registry_mutex().lock();
    opt_before_fork();
    plans_mutex().lock();
    hw_breakpoints_before_fork();
}
void after_fork_parent() {
    const AgentWork quiet;
    hw_breakpoints_after_fork_parent();
    plans_mutex().unlock();
    registry_mutex().unlock();
    g_tables_gate.unlock();
    g_optimizer_gate.unlock();
    g_control_gate.unlock();
}
void after_fork_child() {
    const AgentWork quiet;
    opt_after_fork_child(); // first: the parent's optimizer is not here to wait for
    platform::agent_threads_after_fork_child();
    arm_batches_after_fork_child();
    hw_breakpoints_after_fork_child(g_fork_policy.load() == UKP_FORK_KEEP);
    if (g_fork_policy.load() == UKP_FORK_REMOVE) {
        g_kprobes_enabled.store(false);
        g_handlers_silenced.store(true);
        for (auto &[addr, pt] : points()) {
            if (pt->optimized && opt_unoptimize(pt) != 0) continue;
            if (!pt->armed) continue;
            // The child's own copy of the page: the parent keeps its int3.
            if (text::poke_byte(addr, pt->orig_byte) == 0) {
                pt->armed = false;
                ++pt->disarms;
            }
        }
    }
    // The child's only thread is here, at no island: retired islands go back at once.
    opt_restore_islands_alone();
    spawn_gate_after_fork_child();
    forget_tid_after_fork();
    grace_after_fork_child();
    spares_after_fork_child();
    g_loader_stack_busy.store(false); // a thread that was on its way there is not in the child
    plans_mutex().unlock();
    registry_mutex().unlock();
    g_tables_gate.unlock();
    g_optimizer_gate.unlock();
    g_control_gate.unlock();
}

// fork()'s window (agent.hpp). Registered at load, before the program's handlers and the
// agent's others: its prepare handler runs last, its parent and child handlers first.
std::atomic<bool> g_window_ends_late{false};
thread_local bool t_in_window __attribute__((tls_model("initial-exec")));
void window_begin() {
    begin_agent_work();
    t_in_window = true;
}
void window_end_parent() { end_fork_window(); }
void window_end_child() {
    if (!g_window_ends_late.load(std::memory_order_acquire)) end_fork_window();
}
__attribute__((constructor(101))) void hook_fork_window() {
    pthread_atfork(window_begin, window_end_parent, window_end_child);
}

} // namespace

void fork_window_ends_late() { g_window_ends_late.store(true, std::memory_order_release); }

void end_fork_window() {
    if (!t_in_window) return;
    t_in_window = false;
    end_agent_work();
}

void hook_fork() {
    static std::once_flag once;
    std::call_once(once, [] {
        // The prepare handlers run in the reverse order of registration: the lower layers'
        // first here, so that theirs run after ours, as their locks nest inside ours.
        text::init();
        jit::hook_fork();
        pthread_atfork(before_fork, after_fork_parent, after_fork_child);
    });
}

namespace {
std::mutex &gate_mutex(ForkGate gate) {
    switch (gate) {
    case ForkGate::kControl:
        return g_control_gate;
    case ForkGate::kOptimizer:
        return g_optimizer_gate;
    case ForkGate::kTables:
        break;
    }
    return g_tables_gate;
}
} // namespace

ForkQuiet::ForkQuiet(ForkGate gate) : mutex_(gate_mutex(gate)) { mutex_.lock(); }
ForkQuiet::~ForkQuiet() { mutex_.unlock(); }

} // namespace ukp::core

extern "C" {

int ukp_set_fork_policy(int policy) {
    if (policy != UKP_FORK_KEEP && policy != UKP_FORK_REMOVE) return -EINVAL;
    ukp::core::g_fork_policy.store(policy);
    return 0;
}

} // extern "C"
