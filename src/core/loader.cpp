// Objects that come and go: the dynamic linker's link-map hook, which keeps the symbols
// and the points in step with dlopen() and dlclose().
#include "core/core.hpp"
#include "core/kretprobe.hpp"
#include "core/registry_internal.hpp"

#include "symbols/symbols.hpp"
#include "text/text.hpp"

#include <link.h>
#include <csignal>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace ukp::core {

// The agent's probe on the dynamic linker's r_brk (_dl_debug_state), which the loader
// calls after mapping new objects and before running their constructors, and after
// unmapping objects (r_state RT_CONSISTENT both times), as debuggers use it.
kprobe g_link_map_probe;

namespace {

bool g_link_map_hooked = false;

// The loader's r_debug, from the main program's DT_DEBUG entry, as debuggers find it.
// Not `_r_debug`: a program's copy relocation of it is a snapshot from startup.
r_debug *g_loader_debug = nullptr;

int find_loader_debug(dl_phdr_info *info, size_t, void *) {
    for (int i = 0; i < info->dlpi_phnum; ++i) {
        if (info->dlpi_phdr[i].p_type != PT_DYNAMIC) continue;
        const auto *dyn = reinterpret_cast<const ElfW(Dyn) *>(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr);
        for (; dyn->d_tag != DT_NULL; ++dyn)
            if (dyn->d_tag == DT_DEBUG && dyn->d_un.d_ptr != 0)
                g_loader_debug = reinterpret_cast<r_debug *>(dyn->d_un.d_ptr);
    }
    return 1; // the first object is the main program
}

// The loader's event is handled on a stack of the agent's own. Re-reading the symbols and
// preparing the points of a new object takes about 15 KiB of stack (more under the
// sanitizers), more than a program's alternate signal stack may have (SIGSTKSZ is 8 KiB),
// and the int3's handler runs there (SA_ONSTACK): it would run off its end. One stack
// serves the process: the loader calls r_brk with its load lock held, one thread at a time.
constexpr size_t kLoaderStackSize = size_t{8} << 20; // reserved, touched only as used
uint8_t *g_loader_stack = nullptr;                   // its lowest page is a guard
} // namespace

std::atomic<bool> g_loader_stack_busy{false};

namespace {

void map_loader_stack() {
    void *m = mmap(nullptr, kLoaderStackSize, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
    if (m == MAP_FAILED) return; // the event is then handled where it happens
    mprotect(m, static_cast<size_t>(getpagesize()), PROT_NONE);
    g_loader_stack = static_cast<uint8_t *>(m);
    note_stack(reinterpret_cast<uint64_t>(m), kLoaderStackSize); // for the kretprobes' frame order
}

int raw_sigmask(int how, const sigset_t *set, sigset_t *old) {
    return static_cast<int>(syscall(SYS_rt_sigprocmask, how, set, old, _NSIG / 8));
}

struct LoaderCall {
    sigset_t mask; // the handler's, with every signal blocked around the switches
    stack_t old_altstack;
    bool swapped;
};

void sync_objects_on_loader_stack(void *arg) {
    auto *call = static_cast<LoaderCall *>(arg);
    // The handler's frames on the alternate stack are live: a signal that asks for the
    // alternate stack must land here instead, below the current frame (sp is on the
    // alternate stack then). Allowed: sp is not on the old one any more.
    stack_t ours{};
    ours.ss_sp = g_loader_stack;
    ours.ss_size = kLoaderStackSize;
    call->swapped = syscall(SYS_sigaltstack, &ours, &call->old_altstack) == 0;
    raw_sigmask(SIG_SETMASK, &call->mask, nullptr);
    {
        std::lock_guard lock(registry_mutex());
        sync_objects_locked();
    }
    sigset_t all;
    sigfillset(&all);
    raw_sigmask(SIG_BLOCK, &all, nullptr);
}

int on_link_map_event(kprobe *, pt_regs *) {
    if (g_loader_debug->r_state != r_debug::RT_CONSISTENT) return 0;
    const AgentWork quiet; // what it calls (malloc, open) are not the program's calls
    if (g_loader_stack == nullptr || g_loader_stack_busy.exchange(true, std::memory_order_acquire)) {
        std::lock_guard lock(registry_mutex());
        sync_objects_locked();
        return 0;
    }
    // No signal between the switches: one would find sp on neither stack and put its frame
    // at the top of the alternate stack, over the live ones.
    LoaderCall call{};
    sigset_t all;
    sigfillset(&all);
    raw_sigmask(SIG_BLOCK, &all, &call.mask);
    ukp_call_on_stack(sync_objects_on_loader_stack, &call, g_loader_stack + kLoaderStackSize);
    if (call.swapped) syscall(SYS_sigaltstack, &call.old_altstack, nullptr);
    raw_sigmask(SIG_SETMASK, &call.mask, nullptr);
    g_loader_stack_busy.store(false, std::memory_order_release);
    return 0;
}

// An object was unloaded: its points go (their memory is gone with it; a late hit on
// the address finds no point), and their probes stay registered as [GONE].
void retire_points_of(const sym::Object &gone) {
    for (auto it = points().begin(); it != points().end();) {
        Point *pt = it->second;
        if (!gone.contains_exec(it->first)) {
            ++it;
            continue;
        }
        pt->armed = false; // the int3 went with the mapping
        pt->optimized = false;
        opt_forget_island(pt); // and the island with it
        insert_point(it->first, nullptr);
        if (ProbeList *list = pt->list.exchange(nullptr, std::memory_order_acq_rel); list != nullptr) {
            for (uint32_t i = 0; i < list->count; ++i) {
                kprobe *p = list->probes[i];
                __atomic_or_fetch(&p->flags, KPROBE_FLAG_GONE, __ATOMIC_RELAXED);
                p->ukp_private = nullptr;
                registered()[p] = nullptr;
            }
            // Freed after a grace period, which cannot be waited for from inside a hit.
            deferred_lists().push_back(list);
        }
        // The Point itself is kept: a hit that began before may still be reading it.
        retired_points().push_back(pt);
        it = points().erase(it);
    }
}

} // namespace

// Re-reads the loaded objects; retires the points of unloaded ones; arms the probes
// waiting for objects that are now loaded.
void sync_objects_locked() {
    UKP_ASSERT_REGISTRY_HELD();
    std::vector<std::shared_ptr<const sym::Object>> before = g_symbols->objects();
    g_symbols->refresh();
    const auto &after = g_symbols->objects();
    for (const auto &old : before) {
        const bool still = std::any_of(after.begin(), after.end(),
                                       [&](const auto &o) { return o->path == old->path && o->bias == old->bias; });
        if (!still) {
            retire_points_of(*old);
            arch::forget_object_refs(old->bias);
            forget_plans(old->bias);
        }
    }
    std::vector<kprobe *> waiting;
    for (const auto &[p, pt] : registered())
        if (pt == nullptr && p->symbol_name != nullptr) waiting.push_back(const_cast<kprobe *>(p));
    for (kprobe *p : waiting) {
        uint64_t addr = 0;
        // New objects are not relocated yet when the loader calls us: no ifunc resolver
        // may run; such a probe waits for the next change of the link map.
        if (g_symbols->resolve(p->symbol_name, p->offset, &addr, agent_definition, false) != 0) continue;
        // A return probe registered before its object was loaded: only on a function's entry
        // that returns once.
        if (probe_type(p) == 'r' && !return_probe_allowed_locked(addr)) continue;
        attach_to_point(p, addr); // a probe that cannot go there stays [GONE]
    }
}

void hook_link_map_locked() {
    UKP_ASSERT_REGISTRY_HELD();
    if (g_link_map_hooked) return;
    g_link_map_hooked = true;
    dl_iterate_phdr(find_loader_debug, nullptr);
    if (g_loader_debug == nullptr) g_loader_debug = &_r_debug; // a main program without DT_DEBUG
    if (g_loader_debug->r_brk == 0) return;
    map_loader_stack();
    g_link_map_probe.addr = reinterpret_cast<kprobe_opcode_t *>(g_loader_debug->r_brk);
    g_link_map_probe.pre_handler = on_link_map_event;
    if (attach_to_point(&g_link_map_probe, g_loader_debug->r_brk) != 0) g_link_map_probe.addr = nullptr;
}

} // namespace ukp::core
