// The hit path: what runs in the signal handlers when a probe is hit.
//
// Rules (docs/architecture.md, Glossary, "hit path"): no lock, no allocation, no system
// call, no exception between the trap and the return to the program. Everything used
// here was prepared at registration.
#include "core/core.hpp"
#include "core/grace.hpp"
#include "core/kretprobe.hpp"

#include "arch/x86_64/regs.hpp"
#include "platform/safe_access.hpp"
#include "arch/x86_64/trampoline.hpp"
#include "text/text.hpp"

#include <cerrno>
#include <vector>
#include <ctime>
#include <linux/membarrier.h>
#include <mutex>
#include <sched.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <type_traits>
#include <unistd.h>

extern "C" void ukp_optprobe_dispatch(ukp::core::Point *pt, pt_regs *regs, int ext_saved, pt_regs *at_hit);
extern "C" void ukp_kretprobe_dispatch(uint64_t ret_addr_field, pt_regs *regs, int ext_saved); // kretprobe.cpp

namespace ukp::core {

std::atomic<bool> g_kprobes_enabled{true};
std::atomic<bool> g_handlers_silenced __asm__("ukp_handlers_silenced"){false};
std::atomic<unsigned> g_copy_epoch{1};
thread_local unsigned t_decision_epoch __attribute__((tls_model("initial-exec")));

// ---- per-thread state ----------------------------------------------------------------

// Initial-exec TLS: reachable from a signal handler with a plain %fs-relative access.
// Named for trampolines.S, whose fast cases read it.
thread_local ThreadState t_state __asm__("ukp_thread_state")
    __attribute__((tls_model("initial-exec"), visibility("hidden")));

ThreadState &thread_state() { return t_state; }

AgentWork::AgentWork() { ++t_state.quiet; }
AgentWork::~AgentWork() { --t_state.quiet; }
void begin_agent_work() { ++t_state.quiet; }
void end_agent_work() { --t_state.quiet; }

// ---- read sections (grace.hpp) ------------------------------------------------------------

unsigned read_lock() { return read_lock_on(t_state); }
void read_unlock(unsigned idx) { read_unlock_on(t_state, idx); }
void read_unlock_own_cell() { read_unlock_on(t_state, kPrivateSection); }

// ---- the hit path --------------------------------------------------------------------

namespace {

// Runs one user handler under a recovery point. A fault inside it abandons it (the
// fault handler in on_fault() resumes here with 1), counts a miss, and asks the probe's
// fault_handler. Returns the handler's result, or -1 if it faulted. Nests: a guarded
// call inside a guarded call (a kretprobe's entry_handler) keeps the outer one armed.
template <typename Call>
__attribute__((noinline)) int run_guarded(kprobe *p, const Call &call);

// run_guarded() inside a guarded call: the outer recovery point is kept aside and put back.
template <typename Call>
__attribute__((noinline)) int run_guarded_nested(kprobe *p, const Call &call) {
    ThreadState &ts = t_state;
    const ukp_recovery outer = ts.recovery;
    ts.recovery_armed = false;
    const int r = run_guarded(p, call);
    ts.recovery = outer;
    ts.recovery_armed = true;
    return r;
}

template <typename Call>
__attribute__((noinline)) int run_guarded(kprobe *p, const Call &call) {
    ThreadState &ts = t_state;
    if (ts.recovery_armed) return run_guarded_nested(p, call);
    ts.recovery_armed = true;
    int r;
    if (ukp_recovery_save(&ts.recovery) == 0) {
        r = call();
    } else {
        count_missed(p);
        r = -1;
    }
    ts.recovery_armed = false;
    return r;
}

// call_guarded(), inlined into this file's hit path.
__attribute__((always_inline)) inline int guarded_handler_call(kprobe *p, void *fn, void *a, void *b, bool proven,
                                                               bool own) {
    const auto guarded = [&] {
        if (own) return ukp_call_handler(fn, a, b); // the agent's own: no recovery point
        return run_guarded(p, [&] { return ukp_call_handler(fn, a, b); });
    };
    if (proven) return guarded();
    int r = 0;
    outside_gpr(false, [&] { r = guarded(); });
    return r;
}

// A handler faulted: asks p->fault_handler, itself guarded. If it does not return 1,
// the registers go back to what they were at the hit (the program's behaviour without
// the probe); if it does, the registers stay as the handlers left them.
void handler_faulted(kprobe *p, pt_regs *regs, const pt_regs &at_hit) {
    const int trapnr = t_state.fault_trapnr;
    int handled = 0;
    if (p->fault_handler != nullptr) {
        handled = run_guarded(p, [&] { return p->fault_handler(p, regs, trapnr); });
        if (handled < 0) handled = 0;
    }
    if (handled != 1) *regs = at_hit;
}

// The registers at a hit on the jump path, from the trampoline's second copy (*at_hit: of
// its fields, the general registers, flags and sp are written) and what is the same at
// every hit: where a faulting handler of the first probe is rolled back to.
pt_regs registers_at_hit(const pt_regs &at_hit, uint64_t hit_ip, const pt_regs &regs) {
    pt_regs before = at_hit;
    before.orig_ax = ~0ul;
    before.ip = hit_ip;
    before.cs = regs.cs;
    before.ss = regs.ss;
    return before;
}

// Where a thread that a handler sent to ip goes on, decided now (the signal handler's
// t_decision_epoch): ip, or its copy when ip lies inside the region a jump replaces or
// is about to (a pre_handler or fault_handler that did the probed instruction's work and
// skipped it), as every path past the region's first byte goes (optimizer.cpp).
uint64_t resume_where_sent(const Point *pt, uint64_t ip) {
    t_decision_epoch = g_copy_epoch.load(std::memory_order_acquire);
    return into_copy(pt, ip);
}

// Sends the thread on with the probed instruction executed, and no handler run
// (recursion, disabled or unregistered probes, a late hit on a removed int3).
// Returns false if a branch's emulation faulted (*fault_addr says where).
bool execute_unprobed(const Point *pt, ucontext_t *uc, uint64_t *fault_addr) {
    t_decision_epoch = g_copy_epoch.load(std::memory_order_acquire);
    if (const uint64_t copy = pt->breakpoint_region_copy.load(std::memory_order_acquire); copy != 0) {
        arch::set_context_ip(uc, copy);
        return true;
    }
    if (pt->slot != 0) {
        arch::set_context_ip(uc, pt->boosted);
        return true;
    }
    pt_regs regs;
    arch::regs_from_context(uc, &regs);
    if (arch::emulate_branch(pt->insn, &regs, fault_addr) != 0) return false;
    regs.ip = into_copy(pt, regs.ip);
    arch::regs_to_context(&regs, uc);
    return true;
}

// The instruction run out of line faulted: fault handlers first, then the program gets
// the fault as if no probe were there (rip = the probed address).
void step_faulted(const Point *pt, int sig, siginfo_t *info, ucontext_t *uc, uint64_t real_ip, int trapnr) {
    // A later instruction of a copy (the memory read of a relocated `call *mem`, a far
    // [rip] access through a scratch register) faults after the copy moved rsp or saved a
    // register: those go back first, for the fault handlers and the program alike.
    const arch::FaultUndo *u = nullptr;
    uint64_t undone_orig = pt->addr; // the original instruction the undone copy stands for
    if (pt->slot != 0 && real_ip > pt->boosted && real_ip < pt->boosted + pt->boosted_len)
        u = pt->undo.find(real_ip - pt->boosted);
    else if (pt->slot != 0 && real_ip > pt->post && real_ip < pt->post + pt->boosted_len)
        u = pt->undo.find(real_ip - pt->post);
    else if (pt->detour != 0 && real_ip > pt->detour_code && real_ip < pt->detour_code + pt->layout.size)
        u = arch::detour_fault_undo(pt->layout, pt->detour_code, pt->addr, real_ip, &undone_orig);
    if (u != nullptr) arch::undo_copy_fault(*u, uc);
    const bool undone = u != nullptr;
    pt_regs regs;
    arch::regs_from_context(uc, &regs);
    regs.ip = pt->addr;
    const unsigned idx = read_lock();
    const ProbeList *list = pt->list.load(std::memory_order_acquire);
    ThreadState &ts = t_state;
    ++ts.depth;
    bool handled = false;
    for (uint32_t i = 0; list != nullptr && i < list->count && !handled; ++i) {
        kprobe *p = list->probes[i];
        if (probe_disabled(p) || p->fault_handler == nullptr) continue;
        pt_regs attempt = regs;
        const int r = run_guarded(p, [&] { return p->fault_handler(p, &attempt, trapnr); });
        if (r == 1) {
            regs = attempt;
            handled = true;
        }
    }
    --ts.depth;
    read_unlock(idx);
    if (handled) {
        regs.ip = resume_where_sent(pt, regs.ip); // skipping the faulting instruction, say
        arch::regs_to_context(&regs, uc);
        return;
    }
    // Faults in the first instruction of a copy are the original's, register for
    // register: show the program the original address. (A program handler that returns
    // without changing rip retries the instruction, through the probe, like the CPU would.)
    uint64_t orig = real_ip == pt->boosted || real_ip == pt->post ? pt->addr : undone ? undone_orig : 0;
    if (orig == 0) orig = copy_to_original(pt, real_ip); // an instruction of a region copy
    if (orig != 0) {
        arch::set_context_ip(uc, orig);
        // SIGILL, SIGFPE and a fetch fault name the instruction itself in si_addr: the
        // program must see its own instruction there too, not the agent's copy.
        if (reinterpret_cast<uint64_t>(info->si_addr) == real_ip) info->si_addr = reinterpret_cast<void *>(orig);
    }
    deliver_to_program(sig, info, uc);
}

void emulation_faulted(const Point *pt, ucontext_t *uc, uint64_t fault_addr) {
    siginfo_t info{};
    info.si_signo = SIGSEGV;
    info.si_code = SEGV_MAPERR;
    info.si_addr = reinterpret_cast<void *>(fault_addr);
    arch::set_context_ip(uc, pt->addr);
    uc->uc_mcontext.gregs[REG_TRAPNO] = 14;
    uc->uc_mcontext.gregs[REG_CR2] = static_cast<greg_t>(fault_addr);
    step_faulted(pt, SIGSEGV, &info, uc, pt->addr, 14);
}

void run_post_handlers(const ProbeList *list, pt_regs *regs) {
    for (uint32_t i = 0; i < list->count; ++i) {
        kprobe *p = list->probes[i];
        if (probe_disabled(p) || p->post_handler == nullptr) continue;
        const pt_regs at_entry = *regs;
        if (run_guarded(p, [&] {
                p->post_handler(p, regs, 0);
                return 0;
            }) < 0)
            handler_faulted(p, regs, at_entry);
    }
}

// A hit whose handlers do not run. From inside a handler, each enabled probe counts a
// miss (kprobes.rst); from inside the agent's own work (quiet), even under one of its
// handlers, nothing is counted: the program did not make that call.
__attribute__((always_inline)) inline void count_skipped_hit(const ThreadState &ts, const ProbeList *list) {
    if (ts.depth > 0 && ts.quiet == 0 && list != nullptr)
        for (uint32_t i = 0; i < list->count; ++i)
            if (!probe_disabled(list->probes[i])) count_missed(list->probes[i]);
}

bool any_post_handler(const ProbeList *list) {
    for (uint32_t i = 0; i < list->count; ++i)
        if (!probe_disabled(list->probes[i]) && list->probes[i]->post_handler != nullptr) return true;
    return false;
}

// Runs the pre_handlers of list from position `first` on; true if one asked to resume
// at the regs->ip it set. regs->ip is the probe address plus one on entry. ext_saved:
// whether the vector state is saved (see outside_gpr); lean handlers (ProbeList::lean)
// run without. *at_hit: regs as they were before any handler (of its fields, the general
// registers, flags and sp are read).
__attribute__((always_inline)) inline bool run_pre_handlers(Point *pt, const ProbeList *list, ucontext_t *uc,
                                                            pt_regs &regs, uint32_t first, bool ext_saved,
                                                            pt_regs *at_hit) {
    ThreadState &ts = t_state;
    const uint64_t hit_ip = pt->addr + 1;
    bool redirected = false;
    // Where a faulting handler is rolled back to: the registers at the hit while no handler
    // has run (*at_hit), else a copy taken before the handler.
    bool ran = first > 0;
    pt_regs before;
    ts.hit_context = uc;
    for (uint32_t i = first; i < list->count && !redirected; ++i) {
        kprobe *p = list->probes[i];
        if (probe_disabled(p) || p->pre_handler == nullptr) continue;
        if (ran) before = regs;
        ts.hit_point = pt;
        ts.hit_position = i;
        const int r = guarded_handler_call(p, reinterpret_cast<void *>(p->pre_handler), p, &regs,
                                           ext_saved || list->lean(i), list->own(i));
        if (r < 0) {
            if (!ran) before = registers_at_hit(*at_hit, hit_ip, regs);
            outside_gpr(ext_saved, [&] { handler_faulted(p, &regs, before); });
        } else if (r != 0 && regs.ip != hit_ip) {
            // "Changing Execution Path": a non-zero return resumes at regs->ip. A non-zero
            // return that left ip alone would resume inside the int3; run the instruction.
            redirected = true;
        }
        ran = true;
    }
    ts.hit_context = nullptr;
    return redirected;
}

// Runs the pre_handlers of list from position `first` on, then the probed instruction
// and the post_handlers, and sets the context to resume. regs->ip is the probe address
// plus one, as on the kernel's x86 int3 path. Called inside a read section.
void run_hit(Point *pt, const ProbeList *list, ucontext_t *uc, pt_regs &regs, uint32_t first) {
    ThreadState &ts = t_state;
    ++ts.depth;
    pt_regs at_hit = regs; // the breakpoint path's few ns are not worth the care the jump path's get
    const bool redirected = run_pre_handlers(pt, list, uc, regs, first, true, &at_hit);

    uint64_t fault_addr = 0;
    bool fault = false;
    if (redirected) {
        regs.ip = resume_where_sent(pt, regs.ip);
    } else {
        const bool post = any_post_handler(list);
        regs.ip = pt->addr;
        t_decision_epoch = g_copy_epoch.load(std::memory_order_acquire);
        const uint64_t copy = pt->breakpoint_region_copy.load(std::memory_order_acquire);
        if (pt->slot != 0) {
            // The copy runs after sigreturn; a post copy goes on to the post trampoline.
            regs.ip = post ? pt->post : copy != 0 ? copy : pt->boosted;
        } else if (arch::emulate_branch(pt->insn, &regs, &fault_addr) != 0) {
            fault = true;
        } else {
            if (post) run_post_handlers(list, &regs);
            regs.ip = into_copy(pt, regs.ip);
        }
    }
    --ts.depth;
    arch::regs_to_context(&regs, uc);
    if (fault) emulation_faulted(pt, uc, fault_addr);
}

void probe_hit(Point *pt, ucontext_t *uc) {
    ThreadState &ts = t_state;
    const unsigned idx = read_lock();
    const ProbeList *list = pt->list.load(std::memory_order_acquire);
    // (The kprobes/enabled knob works by disarming: a hit on a point disarmed meanwhile
    // still runs its handlers, as a hit already in flight does in the kernel.)
    if (ts.depth > 0 || ts.quiet > 0 || list == nullptr || g_handlers_silenced.load(std::memory_order_relaxed)) {
        count_skipped_hit(ts, list);
        uint64_t fault_addr = 0;
        const bool ok = execute_unprobed(pt, uc, &fault_addr); // decided inside the section
        read_unlock(idx);
        if (!ok) emulation_faulted(pt, uc, fault_addr);
        return;
    }
    pt_regs regs;
    arch::regs_from_context(uc, &regs);
    regs.ip = pt->addr + 1;
    run_hit(pt, list, uc, regs, 0);
    read_unlock(idx);
}

} // namespace

void resume_hit(Point *pt, ucontext_t *uc, pt_regs &regs, const kprobe *after) {
    const unsigned idx = read_lock();
    const ProbeList *list = pt->list.load(std::memory_order_acquire);
    if (list == nullptr) {
        arch::regs_to_context(&regs, uc);
        uint64_t fault_addr = 0;
        const bool ok = execute_unprobed(pt, uc, &fault_addr);
        read_unlock(idx);
        if (!ok) emulation_faulted(pt, uc, fault_addr);
        return;
    }
    uint32_t first = 0;
    for (uint32_t i = 0; i < list->count; ++i)
        if (list->probes[i] == after) first = i + 1;
    run_hit(pt, list, uc, regs, first);
    read_unlock(idx);
}

void on_breakpoint(siginfo_t *info, ucontext_t *uc) {
    if (info->si_code == kTrapPerf && on_hw_breakpoint(info, uc)) return;
    const uint64_t trap_addr = arch::context_ip(uc) - 1;
    if (info->si_code == SI_KERNEL && on_jprobe_return(trap_addr, uc)) return;
    // Only int3 traps (SI_KERNEL on x86-64) are candidates; single-steps and raise() are not.
    Point *pt = info->si_code == SI_KERNEL ? find_point(trap_addr) : nullptr;
    if (pt == nullptr) {
        deliver_to_program(SIGTRAP, info, uc);
        return;
    }
    probe_hit(pt, uc);
}

bool on_traced_trap(siginfo_t *info, ucontext_t *uc) {
    if (info->si_code != ILL_ILLOPN) return false;
    const uint64_t ip = arch::context_ip(uc);
    Point *pt = find_point(ip);
    // The byte is not looked at: as an int3's SIGTRAP, the fault may be handled after the
    // point got its jmp (a debugger held the thread). A probed instruction that raises
    // SIGILL itself (ud0, ud1, ud2) is the program's business.
    if (pt == nullptr || pt->insn.mnemonic == ZYDIS_MNEMONIC_UD0 || pt->insn.mnemonic == ZYDIS_MNEMONIC_UD1 ||
        pt->insn.mnemonic == ZYDIS_MNEMONIC_UD2)
        return false;
    arch::set_context_ip(uc, ip + 1); // as after an int3: the hit path's view
    probe_hit(pt, uc);
    return true;
}

int call_guarded(kprobe *p, void *fn, void *a, void *b, bool proven, bool own) {
    return guarded_handler_call(p, fn, a, b, proven, own);
}

} // namespace ukp::core

// Called by ukp_post_trampoline (trampolines.S) after a post copy ran the probed
// instruction: runs the post_handlers in user mode, with no second trap.
extern "C" __attribute__((used, visibility("hidden"))) void ukp_post_dispatch(ukp::core::Point *pt, pt_regs *regs) {
    using namespace ukp::core;
    const uint64_t next = pt->addr + pt->insn.len;
    regs->ip = next; // the copy ran; show the original's next address
    ThreadState &ts = thread_state();
    const unsigned idx = read_lock();
    const ProbeList *list = pt->list.load(std::memory_order_acquire);
    if (list != nullptr) {
        ++ts.depth;
        run_post_handlers(list, regs);
        --ts.depth;
    }
    // Decided last: the optimizer relies on no thread entering the region past its
    // first byte once the point runs its region copy.
    t_decision_epoch = g_copy_epoch.load(std::memory_order_acquire);
    if (regs->ip == next) regs->ip = into_copy(pt, next);
    read_unlock(idx);
}

namespace ukp::core {
namespace {

// The jump path's post_handlers (see ukp_optprobe_dispatch). regs->ip is the copy.
void run_late_post_handlers(Point *pt, const ProbeList *list, pt_regs *regs) {
    uint64_t fault_addr = 0;
    if (pt->slot != 0) {
        regs->ip = pt->post;
    } else if (arch::emulate_branch(pt->insn, regs, &fault_addr) == 0) {
        run_post_handlers(list, regs);
        regs->ip = into_copy(pt, regs->ip);
    }
    // else regs (ip at the copy) are unchanged: the copy faults the same way, as the
    // program would
}

} // namespace
} // namespace ukp::core

// Called by ukp_optprobe_trampoline when an optimized probe's jump was taken: the
// breakpoint path's handler chain, without the trap. regs->ip is the probe address + 1,
// as on the int3 path; a pre_handler that changes it and returns non-zero is obeyed.
// Without the vector state saved (ext_saved 0) when ukp_lean_jump_path is set: then
// everything this calls either is lean or goes through outside_gpr(). *at_hit: the
// general registers, flags and sp at the hit, saved a second time by the trampoline.
extern "C" __attribute__((used, visibility("hidden"))) void ukp_optprobe_dispatch(ukp::core::Point *pt, pt_regs *regs,
                                                                                  int ext_saved, pt_regs *at_hit) {
    using namespace ukp::core;
    ThreadState &ts = thread_state();
    const uint64_t copy = pt->region_copy;
    const unsigned idx = read_lock_on(t_state);
    const ProbeList *list = pt->list.load(std::memory_order_acquire);
    if (ts.depth > 0 || ts.quiet > 0 || list == nullptr || g_handlers_silenced.load(std::memory_order_relaxed)) {
        count_skipped_hit(ts, list);
        read_unlock_on(t_state, idx);
        regs->ip = copy;
        return;
    }
    const uint64_t hit_ip = pt->addr + 1;
    regs->ip = hit_ip;
    ++ts.depth;
    if (pt->kret_code != 0) t_ret.stub_call_copy = copy; // a function's entry, reached by a call
    bool redirected;
    if (list->all_own_lean) {
        // The agent's own lean handlers (trace events, a kretprobe's entry), in order until
        // one sends the thread elsewhere: no recovery point, no copy of the registers to
        // roll back to, nothing for a jprobe to find.
        redirected = false;
        for (uint32_t i = 0; i < list->count && !redirected; ++i) {
            kprobe *p = list->probes[i];
            redirected = !probe_disabled(p) && p->pre_handler != nullptr &&
                         ukp_call_handler(reinterpret_cast<void *>(p->pre_handler), p, regs) != 0 && regs->ip != hit_ip;
        }
    } else {
        redirected = run_pre_handlers(pt, list, nullptr, *regs, 0, ext_saved != 0, at_hit);
    }
    if (redirected) {
        // Past the region's first byte is in the jump's bytes: the copy's instead. (Not
        // for the vector state: a walk of a few bytes' table, which the scan checks.)
        regs->ip = into_copy(pt, regs->ip);
    } else {
        regs->ip = copy;
        // A post_handler arrived while the jump was still in place: the first instruction
        // and the post_handlers run as on the breakpoint path.
        if (list->any_post && any_post_handler(list))
            outside_gpr(ext_saved != 0, [&] { run_late_post_handlers(pt, list, regs); });
    }
    if (pt->kret_code != 0) finish_kret_entry(regs);
    --ts.depth;
    read_unlock_on(t_state, idx);
}

// Called by ukp_optprobe_trampoline's fast case when the handler answered 1 and sent the
// thread a few bytes past the probe address + 1, maybe inside the region its jump
// replaced: there it goes on in the copy, as in ukp_optprobe_dispatch. In the read
// section, with the vector state saved.
extern "C" __attribute__((used, visibility("hidden"))) void ukp_optprobe_into_copy(ukp::core::Point *pt,
                                                                                   pt_regs *regs) {
    regs->ip = ukp::core::into_copy(pt, regs->ip);
}

// Where ukp_optprobe_trampoline's fast case goes when the handler it called faulted (from
// ukp_optprobe_fast_recovery, with rsp at the frame again). The thread is inside its
// read section, at depth 1, as the C path would have it after run_guarded() came back
// with -1: the miss is counted, the probe's fault_handler asked, the registers rolled back
// unless it answered 1; then the section ends and the region copy runs. With the
// vector state saved.
extern "C" __attribute__((used, visibility("hidden"))) void ukp_optprobe_fast_fault(ukp::core::Point *pt, pt_regs *regs,
                                                                                    int, pt_regs *at_hit, kprobe *p) {
    using namespace ukp::core;
    count_missed(p);
    handler_faulted(p, regs, registers_at_hit(*at_hit, pt->addr + 1, *regs));
    regs->ip = pt->region_copy;
    --thread_state().depth;
    read_unlock_on(t_state, kPrivateSection);
}

namespace ukp::core {

bool on_fault(int sig, siginfo_t *info, ucontext_t *uc) {
    const uint64_t ip = arch::context_ip(uc);
    // A fault-safe access: resume at its fixup, which returns -EFAULT.
    if (const uint64_t fixup = platform::fixup_for(ip); fixup != 0) {
        arch::set_context_ip(uc, fixup);
        return true;
    }
    // Only synchronous faults count: a kill(SIGSEGV) is the program's business.
    if (info->si_code <= 0) return false;
    ThreadState &ts = t_state;
    if (ts.recovery_armed) {
        // A handler faulted: abandon it; run_guarded() sees 1 come back.
        ts.recovery_armed = false;
        ts.fault_trapnr = arch::trap_number(uc);
        arch::resume_at_recovery(uc, ts.recovery, 1);
        return true;
    }
    if (ts.fast_frame != nullptr) {
        // The same for a handler that ukp_optprobe_trampoline called itself: it goes on at
        // its recovery label, with the stack pointer at its frame.
        ukp_recovery rec{};
        rec.rsp = reinterpret_cast<uint64_t>(ts.fast_frame);
        rec.rip = reinterpret_cast<uint64_t>(&ukp_optprobe_fast_recovery);
        ts.fast_frame = nullptr;
        ts.fault_trapnr = arch::trap_number(uc);
        arch::resume_at_recovery(uc, rec, 1);
        return true;
    }
    const uint64_t slot = text::slot_containing(ip);
    if (slot == 0) return false;
    const auto *pt = *reinterpret_cast<Point *const *>(slot);
    if (pt == nullptr) return false;
    step_faulted(pt, sig, info, uc, ip, arch::trap_number(uc));
    return true;
}

} // namespace ukp::core
