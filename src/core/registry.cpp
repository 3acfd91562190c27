// Registration: where a probe goes, preparing its point, arming and disarming.
// Everything here runs under one mutex, off the hit path.
#include "core/core.hpp"
#include "core/fork.hpp"
#include "core/registry_internal.hpp"
#include "core/jit_debug.hpp"
#include "core/kretprobe.hpp"

#include "arch/x86_64/insn.hpp"
#include "arch/x86_64/region.hpp"
#include "arch/x86_64/trampoline.hpp"
#include "symbols/symbols.hpp"
#include "platform/high_fd.hpp"
#include "text/text.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <link.h>
#include <pthread.h>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <map>
#include <set>
#include <mutex>
#include <new>
#include <string>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <memory>
#include <unordered_map>
#include <vector>

namespace ukp::core {

CheckedMutex g_mutex;
sym::Registry *g_symbols = nullptr; // created on first use
// Every point prepared, by address.
std::map<uint64_t, Point *> &points() {
    UKP_ASSERT_REGISTRY_HELD();
    static auto *value = new std::map<uint64_t, Point *>(); // never destroyed: probes outlive static destructors
    return *value;
}
// Points of unloaded objects, kept for late hits.
std::vector<Point *> &retired_points() {
    UKP_ASSERT_REGISTRY_HELD();
    static auto *value = new std::vector<Point *>(); // never destroyed: probes outlive static destructors
    return *value;
}
// Registered probes and their points; null for a probe whose object is not loaded.
std::unordered_map<const kprobe *, Point *> &registered() {
    static auto *value =
        new std::unordered_map<const kprobe *, Point *>(); // never destroyed: probes outlive static destructors
    return *value;
}
// Lists retired where no grace period can be waited for (inside a hit): freed after the
// next one.
std::vector<ProbeList *> &deferred_lists() {
    static auto *value = new std::vector<ProbeList *>(); // never destroyed: probes outlive static destructors
    return *value;
}

namespace {

// ---- points ----------------------------------------------------------------------------

// Reads code as it was before any probe: the bytes under our int3s are put back.
int read_original(uint64_t addr, uint8_t *buf, size_t n) {
    if (ukp_safe_copy(buf, reinterpret_cast<const void *>(addr), n) != 0) return -EFAULT;
    for (auto it = points().lower_bound(addr); it != points().end() && it->first < addr + n; ++it)
        if (it->second->armed) buf[it->first - addr] = it->second->orig_byte;
    opt_overlay(addr, buf, n);
    return 0;
}

// Addresses known to start an instruction without a function symbol around them: SDT probe
// sites (declare_instruction_boundary). Under the registry mutex.
std::set<uint64_t> &known_boundaries() {
    static auto *value = new std::set<uint64_t>(); // never destroyed, as the points
    return *value;
}

// Checks that addr starts an instruction, by decoding from the start of the code that
// contains it (its function, or its PLT section), and decodes that instruction. Outside
// any, only a declared boundary is one.
int decode_at_boundary(const sym::Object &obj, const sym::Symbol *fn, uint64_t addr, arch::Insn *out) {
    uint64_t start = 0, end = 0;
    if (fn != nullptr && fn->size > 0) {
        start = fn->value;
        end = fn->value + fn->size;
    } else {
        for (auto [lo, hi] : obj.plt_ranges())
            if (addr >= lo && addr < hi) start = lo, end = hi;
    }
    if (start == 0 && known_boundaries().count(addr) != 0) start = addr, end = addr + 16;
    if (start == 0) return -EILSEQ; // no known code around it: cannot prove a boundary
    uint64_t pc = start;
    uint8_t buf[16];
    while (pc < addr) {
        const size_t avail = static_cast<size_t>(std::min<uint64_t>(sizeof buf, end - pc));
        if (read_original(pc, buf, avail) != 0) return -EILSEQ;
        arch::Insn insn;
        if (arch::decode(pc, buf, avail, &insn) != 0) return -EILSEQ;
        pc += insn.len;
    }
    if (pc != addr) return -EILSEQ;
    const size_t avail = static_cast<size_t>(std::min<uint64_t>(sizeof buf, end - addr));
    if (read_original(addr, buf, avail) != 0) return -EILSEQ;
    return arch::decode(addr, buf, avail, out) == 0 ? 0 : -EILSEQ;
}

// Builds the out-of-line copies: [Point*][pad][boosted copy][post copy]. The boosted
// copy jumps back after the instruction; the post copy goes on to the post trampoline.
int build_slot(Point *pt, const arch::Insn &insn) {
    const arch::Flow flow = insn.flow;
    if (flow == arch::Flow::kUnsupported) return -EOPNOTSUPP;
    if (flow != arch::Flow::kSequential && flow != arch::Flow::kSyscall)
        return 0; // branches are emulated on the hit path: no copy to run
    const uint64_t slot = text::alloc_slot(pt->addr);
    if (slot == 0) return -ENOMEM;
    uint8_t code[text::kSlotSize];
    std::memset(code, 0xcc, sizeof code);
    std::memcpy(code, &pt, sizeof pt);
    size_t at = 16;
    int n = arch::relocate(insn, slot + at, code + at, sizeof code - at, arch::Exit::kNone);
    if (n < 0) return n;
    pt->boosted_len = static_cast<uint8_t>(n);
    n = arch::relocate(insn, slot + at, code + at, sizeof code - at, arch::Exit::kJumpBack, nullptr, &pt->undo);
    if (n < 0) return n;
    const uint64_t boosted = slot + at;
    at += static_cast<size_t>(n);
    const uint64_t post = slot + at;
    arch::FaultUndos post_undo;
    n = arch::relocate(insn, post, code + at, sizeof code - at, arch::Exit::kNone, nullptr, &post_undo);
    if (n < 0) return n;
    // step_faulted looks both copies up in one table: the instruction part is the same.
    if (post_undo.count != pt->undo.count) return -EOPNOTSUPP;
    for (uint8_t i = 0; i < post_undo.count; ++i)
        if (post_undo.at[i].offset != pt->undo.at[i].offset) return -EOPNOTSUPP;
    at += static_cast<size_t>(n);
    n = arch::emit_post_exit(slot + at, reinterpret_cast<uint64_t>(pt),
                             reinterpret_cast<uint64_t>(&ukp_post_trampoline), code + at, sizeof code - at);
    if (n < 0) return n;
    at += static_cast<size_t>(n);
    if (int err = text::write(slot, code, at); err != 0) return err;
    pt->slot = slot;
    pt->boosted = boosted;
    pt->post = post;
    return 0;
}

int prepare_point(uint64_t addr, Point **out) {
    if (auto it = points().find(addr); it != points().end()) {
        *out = it->second;
        return 0;
    }
    const sym::Object *obj = g_symbols->object_at(addr);
    if (obj == nullptr) return -EILSEQ; // not in the executable code of a loaded object
    const sym::Symbol *fn = obj->function_at(addr);
    if (is_blacklisted(*obj, fn, addr)) return -EINVAL;
    auto pt = std::make_unique<Point>();
    pt->addr = addr;
    arch::Insn insn; // the whole decode is needed only here
    if (int err = decode_at_boundary(*obj, fn, addr, &insn); err != 0) return err;
    if (read_original(addr, &pt->orig_byte, 1) != 0) return -EILSEQ;
    if (int err = build_slot(pt.get(), insn); err != 0) return err;
    pt->insn = arch::summarize(insn);
    pt->object_name = obj->name;
    pt->spawn_path = on_spawn_path(addr);
    if (fn != nullptr && fn->size > 0) opt_prepare(pt.get(), fn->value, fn->size, obj->bias, symbols_inside(*obj, *fn));
    const sym::Registry::Location loc = g_symbols->locate(addr);
    if (loc.symbol != nullptr) {
        pt->symbol = loc.symbol->name;
        pt->symbol_offset = loc.offset;
    }
    Point *p = pt.release();
    points().emplace(addr, p);
    insert_point(addr, p);
    *out = p;
    return 0;
}

namespace {
// The agent keeps the symbol tables it parses beside its reference tables: set before
// its other constructors, UKP_EVENTS being applied in one (trace/files.cpp).
__attribute__((constructor(101))) void keep_symbol_tables() { sym::set_table_store(sym::disk_table_store()); }
} // namespace

bool wants_arming(const Point *pt) {
    const ProbeList *list = pt->list.load(std::memory_order_relaxed);
    const bool enabled = g_kprobes_enabled.load(std::memory_order_relaxed);
    for (uint32_t i = 0; list != nullptr && i < list->count; ++i) {
        // The agent's own link-map hook is not subject to the kprobes/enabled knob.
        if (list->probes[i] == &g_link_map_probe) return true;
        if (enabled && !probe_disabled(list->probes[i])) return true;
    }
    return false;
}

// ArmBatch scopes open on this thread, and whether one of them wrote a byte since the
// cores were last synchronized.
thread_local int t_arm_batch = 0;
thread_local bool t_arm_sync_due = false;
thread_local uint8_t t_batch_byte = 0;              // arming_byte() when the outermost scope began
thread_local bool t_batch_handlers_checked = false; // ensure_initialized()'s, in the outermost scope

// Puts the int3 in or takes it out, as the point's probes and the global knob say.
int update_arming(Point *pt) {
    const bool want = wants_arming(pt);
    if (want == pt->armed) {
        opt_update(pt);
        return 0;
    }
    if (want) opt_before_arming(pt->addr);
    if (want && opt_arm_alone(pt)) return 0;
    if (!want && pt->optimized) {
        if (int err = opt_unoptimize(pt); err != 0) return err;
    }
    if (want) spawn_gate_close(pt);
    const uint8_t byte = !want ? pt->orig_byte : batch_arming_byte();
    const int err = t_arm_batch > 0 ? text::write(pt->addr, &byte, 1) : text::poke_byte(pt->addr, byte);
    t_arm_sync_due |= t_arm_batch > 0 && err == 0;
    if (err == 0) {
        pt->armed = want;
        pt->disarms += want ? 0 : 1;
    }
    opt_update(pt);
    spawn_gate_update(pt);
    return err;
}

ProbeList *make_list(const ProbeList *from, const kprobe *drop, kprobe *add) {
    const uint32_t n = from != nullptr ? from->count : 0;
    const size_t cap = n + 1;
    void *mem = std::malloc(sizeof(ProbeList) + cap * sizeof(kprobe *));
    if (mem == nullptr) return nullptr;
    auto *list = new (mem) ProbeList;
    list->count = 0;
    const auto put = [list](kprobe *p, bool lean, bool own) {
        if (lean && list->count < 64) list->lean_mask |= uint64_t{1} << list->count;
        if (own && list->count < 64) list->own_mask |= uint64_t{1} << list->count;
        list->any_post = list->any_post || p->post_handler != nullptr;
        list->probes[list->count++] = p;
    };
    for (uint32_t i = 0; i < n; ++i)
        if (from->probes[i] != drop) put(from->probes[i], from->lean(i), from->own(i));
    if (add != nullptr) {
        const auto *fn = reinterpret_cast<const void *>(add->pre_handler);
        put(add, handler_is_lean(fn), handler_is_own(fn));
    }
    // Not a kretprobe's entry (with an entry_handler, else its own trampoline does it):
    // ukp_optprobe_dispatch then has its stub call the function, whose return costs less
    // than the fast case saves.
    if (list->count == 1 && !list->any_post && list->lean(0) && list->probes[0]->pre_handler != nullptr &&
        probe_type(list->probes[0]) != 'r')
        list->fast = list->own(0) ? kFastOwn : kFastGuarded;
    const uint64_t all = list->count >= 64 ? ~uint64_t{0} : (uint64_t{1} << list->count) - 1;
    list->all_own_lean = list->count <= 64 && !list->any_post && (list->own_mask & list->lean_mask & all) == all;
    if (list->count == 1 && !list->any_post) list->kret_pool = kret_pool_without_entry_handler(list->probes[0]);
    return list;
}

// Publishes a new list for pt; the old one goes to `retired`, freed after a grace period.
void publish_list(Point *pt, ProbeList *list, std::vector<ProbeList *> &retired) {
    if (list != nullptr && list->count == 0) {
        std::free(list);
        list = nullptr;
    }
    ProbeList *old = pt->list.exchange(list, std::memory_order_acq_rel);
    if (old != nullptr) retired.push_back(old);
}

void free_retired(std::vector<ProbeList *> &retired) {
    if (retired.empty()) return;
    // Called from a handler, the wait cannot finish: keep the lists rather than free
    // memory that a hit on another thread may still read.
    if (!synchronize()) return;
    for (ProbeList *l : retired) std::free(l);
    retired.clear();
}

// The membarrier registrations (grace periods: grace_init; code patching: text) and the
// growth of the descriptor table to the agent's high numbers (platform/high_fd.hpp) each cost
// the kernel an RCU grace period (milliseconds) once the process has a second thread,
// and nothing while it has one: done at load, before the agent starts its threads and,
// under LD_PRELOAD, before the program starts any. Done later, these three waits were
// about half of a short program's start with one libc event.
__attribute__((constructor(101))) void prepare_while_single_threaded() {
    grace_init();
    text::register_membarrier();
    platform::grow_fd_table();
}

int ensure_initialized() {
    grace_init(); // before the first probe: its hits may take reader cells
    lean_dispatch_init();
    // The handlers are checked at each registration (the program may have put its own
    // back), once in an ArmBatch scope (an event over a library: thousands).
    if (t_arm_batch == 0 || !t_batch_handlers_checked) {
        if (int err = install_signal_handlers(); err != 0) return err;
        t_batch_handlers_checked = t_arm_batch > 0;
    }
    // Whether this thread can write code, told once: text::init() opens /proc/self/mem to
    // see (a registration per function of a library would open it once per function), and
    // every write registers again what a child of fork() needs.
    static thread_local bool t_text_ready = false;
    if (!t_text_ready) {
        if (int err = text::init(); err != 0) return err;
        t_text_ready = true;
    }
    if (g_symbols == nullptr) g_symbols = new (std::nothrow) sym::Registry();
    if (g_symbols == nullptr) return -ENOMEM;
    g_symbols->refresh();
    hook_link_map_locked();
    hook_fork();
    return 0;
}

} // namespace

// An unqualified name means the program's function, not the agent's interposer of it
// ("sigaction", "longjmp", "backtrace", ...).
bool agent_definition(const sym::Object &obj, const sym::Symbol &symbol) {
    return is_agent_object(obj) || agent_symbol(obj, symbol.name);
}

namespace {

int resolve_address(const kprobe *p, uint64_t *addr) {
    if ((p->symbol_name != nullptr) == (p->addr != nullptr)) return -EINVAL;
    if (p->symbol_name != nullptr) return g_symbols->resolve(p->symbol_name, p->offset, addr, agent_definition);
    *addr = reinterpret_cast<uint64_t>(p->addr) + p->offset;
    return 0;
}

} // namespace

// Puts p on the point at addr (preparing it if needed) and arms it. 0 or -errno, with
// nothing changed on failure.
int attach_to_point(kprobe *p, uint64_t addr) {
    Point *pt = nullptr;
    if (int err = prepare_point(addr, &pt); err != 0) return err;
    // Where glibc's spawn child may run, a probe that stays on its int3 kills the child.
    if (opt_breaks_spawn_path(pt, p)) return -EINVAL;
    ProbeList *list = make_list(pt->list.load(std::memory_order_relaxed), nullptr, p);
    if (list == nullptr) return -ENOMEM;
    p->addr = reinterpret_cast<kprobe_opcode_t *>(addr);
    p->opcode = pt->orig_byte;
    // Atomic: the tracer sets KPROBE_FLAG_DISABLED of a waiting probe without the mutex.
    __atomic_and_fetch(&p->flags, ~static_cast<unsigned>(KPROBE_FLAG_GONE | KPROBE_FLAG_OPTIMIZED), __ATOMIC_SEQ_CST);
    p->ukp_private = pt;
    std::vector<ProbeList *> retired;
    publish_list(pt, list, retired);
    if (int err = update_arming(pt); err != 0) {
        publish_list(pt, make_list(pt->list.load(std::memory_order_relaxed), p, nullptr), retired);
        free_retired(retired);
        p->ukp_private = nullptr;
        return err;
    }
    registered()[p] = pt;
    free_retired(retired);
    return 0;
}

// "MOD:sym" whose MOD is not loaded: accepted, armed when MOD is loaded (as the kernel
// arms probe events on a module when it loads).
// Whether addr is the first instruction of a function (where a return probe goes).
bool function_entry_locked(uint64_t addr) {
    UKP_ASSERT_REGISTRY_HELD();
    const sym::Object *obj = g_symbols->object_at(addr);
    const sym::Symbol *fn = obj != nullptr ? obj->function_at(addr) : nullptr;
    return fn != nullptr && fn->value == addr;
}

namespace {

// Functions that return more than once from one call: setjmp's family (again at each
// longjmp to what it saved), getcontext (at each setcontext to it), vfork (in the child,
// then in the parent, on one stack). The return address they return to the second time
// is the one they saw at entry: a return probe's stub, entered again after its instance
// was given back, by then maybe another call's. No return probe goes there (the kernel's
// uretprobe kills the process with SIGILL at such a return).
constexpr const char *kReturnsTwice[] = {"setjmp",      "_setjmp",      "__setjmp",     "sigsetjmp",
                                         "__sigsetjmp", "getcontext",   "__getcontext", "vfork",
                                         "__vfork",     "__libc_vfork", "savectx"};

bool returns_twice_locked(uint64_t addr) {
    UKP_ASSERT_REGISTRY_HELD();
    const sym::Object *obj = g_symbols->object_at(addr);
    if (obj == nullptr) return false;
    const std::vector<sym::Symbol> &symbols = obj->symbols(); // by address: every name there
    auto it = std::lower_bound(symbols.begin(), symbols.end(), addr,
                               [](const sym::Symbol &s, uint64_t a) { return s.value < a; });
    for (; it != symbols.end() && it->value == addr; ++it)
        for (const char *name : kReturnsTwice)
            if (it->name == name) return true;
    return false;
}

} // namespace

bool return_probe_allowed_locked(uint64_t addr) { return function_entry_locked(addr) && !returns_twice_locked(addr); }

namespace {

bool may_wait_for_object(const kprobe *p) {
    if (p->symbol_name == nullptr || p->addr != nullptr) return false;
    const std::string_view module = sym::Registry::module_of(p->symbol_name);
    return !module.empty() && !g_symbols->has_module(module);
}

int register_locked(kprobe *p) {
    UKP_ASSERT_REGISTRY_HELD();
    if (registered().count(p) != 0) return -EINVAL; // already registered
    if (int err = ensure_initialized(); err != 0) return err;
    uint64_t addr = 0;
    const int err = resolve_address(p, &addr);
    if (err == -ENOENT && may_wait_for_object(p)) {
        p->flags |= KPROBE_FLAG_GONE;
        p->ukp_private = nullptr;
        registered().emplace(p, nullptr);
        return 0;
    }
    if (err != 0) return err;
    if (probe_type(p) == 'r' && !return_probe_allowed_locked(addr)) return -EINVAL;
    return attach_to_point(p, addr);
}

// Takes p off its point; the caller waits for the grace period before p may be reused.
bool unregister_locked(kprobe *p, std::vector<ProbeList *> &retired) {
    UKP_ASSERT_REGISTRY_HELD();
    auto it = registered().find(p);
    if (it == registered().end()) {
        p->addr = nullptr; // as the kernel does for a probe it does not know
        return false;
    }
    Point *pt = it->second;
    registered().erase(it);
    p->ukp_private = nullptr;
    if (pt == nullptr) return true; // its object is not loaded: nothing is armed
    publish_list(pt, make_list(pt->list.load(std::memory_order_relaxed), p, nullptr), retired);
    update_arming(pt); // a failed write leaves the int3 in: a hit with no list just runs the copy
    return true;
}

int set_disabled(kprobe *p, bool disabled) {
    std::lock_guard lock(g_mutex);
    auto it = registered().find(p);
    if (it == registered().end()) return -EINVAL;
    if (p->flags & KPROBE_FLAG_GONE) return -EINVAL;
    const unsigned before = p->flags;
    if (disabled)
        __atomic_or_fetch(&p->flags, KPROBE_FLAG_DISABLED, __ATOMIC_RELAXED);
    else
        __atomic_and_fetch(&p->flags, ~static_cast<unsigned>(KPROBE_FLAG_DISABLED), __ATOMIC_RELAXED);
    const int err = update_arming(it->second);
    if (err != 0) __atomic_store_n(&p->flags, before, __ATOMIC_RELAXED);
    return err;
}

} // namespace

CheckedMutex &registry_mutex() { return g_mutex; }

void disable_together(const std::vector<kprobe *> &probes, std::vector<int> *results) {
    results->assign(probes.size(), -EAGAIN);
    if (probes.size() < 2) return;
    std::lock_guard lock(g_mutex);
    std::unordered_map<const Point *, std::vector<size_t>> of_point; // the probes of each point
    std::vector<Point *> pts;
    for (size_t i = 0; i < probes.size(); ++i) {
        kprobe *p = probes[i];
        const auto it = registered().find(p);
        if (it == registered().end() || it->second == nullptr || (p->flags & KPROBE_FLAG_GONE) != 0) continue;
        __atomic_or_fetch(&p->flags, KPROBE_FLAG_DISABLED, __ATOMIC_RELAXED);
        auto &mine = of_point[it->second];
        if (mine.empty()) pts.push_back(it->second);
        mine.push_back(i);
    }
    std::vector<Point *> jumped;
    for (Point *pt : pts)
        if (pt->armed && pt->optimized && !wants_arming(pt)) jumped.push_back(pt);
    opt_disarm_many(jumped);
    // The points on their int3s one at a time (each a byte, synchronized with the batch).
    // A point that failed keeps its probes enabled: their own disable_kprobe reports it.
    for (Point *pt : pts) {
        const int err = update_arming(pt);
        for (size_t i : of_point[pt]) {
            (*results)[i] = err;
            if (err != 0)
                __atomic_and_fetch(&probes[i]->flags, ~static_cast<unsigned>(KPROBE_FLAG_DISABLED), __ATOMIC_RELAXED);
        }
    }
}

std::atomic<int> g_arm_batches{0};

void arm_batches_after_fork_child() { g_arm_batches.store(t_arm_batch > 0 ? 1 : 0); }

uint8_t batch_arming_byte() { return t_arm_batch > 0 ? t_batch_byte : arming_byte(); }

ArmBatch::ArmBatch() {
    // Asked once: whether a tracer is attached is read from /proc, through libc, whose
    // functions may be the very ones being armed.
    if (t_arm_batch++ == 0) {
        t_batch_byte = arming_byte();
        g_arm_batches.fetch_add(1, std::memory_order_relaxed);
    }
    text::begin_write_batch();
}

ArmBatch::~ArmBatch() {
    text::end_write_batch();
    if (--t_arm_batch == 0) {
        t_batch_handlers_checked = false;
        g_arm_batches.fetch_sub(1, std::memory_order_relaxed);
    }
    if (t_arm_batch > 0 || !t_arm_sync_due) return;
    t_arm_sync_due = false;
    text::sync_cores();
}

std::string kprobes_list_without(const std::vector<const kprobe *> &hidden) { return list_text(hidden); }

void CheckedMutex::not_held(const char *where) {
    die_naming("ukprobes: a lock rule is broken: the mutex is not held in ", where);
}

void CheckedMutex::held(const char *where) {
    die_naming("ukprobes: a lock rule is broken: the mutex is held in ", where);
}

void die_naming(const char *text, const char *name) {
    ssize_t ignored = ::write(2, text, __builtin_strlen(text));
    ignored = ::write(2, name, __builtin_strlen(name));
    ignored = ::write(2, "\n", 1);
    (void)ignored;
    abort();
}

bool is_agent_probe(const kprobe *p) { return p == &g_link_map_probe; }
std::map<uint64_t, Point *> &all_points() { return points(); }
int read_original_code(uint64_t addr, uint8_t *buf, size_t n) { return read_original(addr, buf, n); }

arch::ReadFn original_code_reader() {
    return [](uint64_t a, void *out, size_t n) { return read_original(a, static_cast<uint8_t *>(out), n) == 0; };
}

arch::ReadFn memory_reader() {
    return
        [](uint64_t a, void *out, size_t n) { return ukp_safe_copy(out, reinterpret_cast<const void *>(a), n) == 0; };
}

bool is_registered(const kprobe *p) {
    std::lock_guard lock(g_mutex);
    return registered().count(p) != 0;
}

int resolve_probe(const kprobe *p, uint64_t *addr, bool *entry) {
    std::lock_guard lock(g_mutex);
    if (int err = ensure_initialized(); err != 0) return err;
    if (int err = resolve_address(p, addr); err != 0) return err;
    *entry = function_entry_locked(*addr);
    return 0;
}

bool waits_for_object(const kprobe *p) {
    std::lock_guard lock(g_mutex);
    return ensure_initialized() == 0 && may_wait_for_object(p);
}

std::vector<std::pair<uint64_t, uint8_t>> armed_bytes() {
    UKP_ASSERT_REGISTRY_HELD();
    std::vector<std::pair<uint64_t, uint8_t>> out;
    for (const auto &[addr, pt] : points()) {
        if (pt->optimized) {
            // An optimized point owns its whole region (the jmp and what follows it).
            for (size_t i = 0; i < pt->layout.dcr_len; ++i) out.emplace_back(addr + i, pt->dcr_orig[i]);
        } else if (pt->armed) {
            out.emplace_back(addr, pt->orig_byte);
        }
    }
    island_bytes(&out);
    // glibc's full blocks (full_blocks.cpp): a point's region may hold one of their bytes,
    // whose original is the file's, not the one the point found.
    std::vector<std::pair<uint64_t, uint8_t>> opened;
    full_block_bytes(&opened);
    for (const auto &[addr, byte] : opened)
        std::erase_if(out, [addr = addr](const std::pair<uint64_t, uint8_t> &b) { return b.first == addr; });
    out.insert(out.end(), opened.begin(), opened.end());
    std::sort(out.begin(), out.end());
    return out;
}

std::string list_text(const std::vector<const kprobe *> &hidden) {
    std::lock_guard lock(g_mutex);
    std::string out;
    const auto row = [&](uint64_t addr, const kprobe *p, const std::string &where, const std::string &object) {
        const bool gone = p->flags & KPROBE_FLAG_GONE;
        out += fmt::format("{:016x}  {}  {}  {} {}{}{}\n", addr, probe_type(p), where, object, gone ? "[GONE]" : "",
                           (p->flags & KPROBE_FLAG_DISABLED) && !gone ? "[DISABLED]" : "",
                           (p->flags & KPROBE_FLAG_OPTIMIZED) ? "[OPTIMIZED]" : "");
    };
    for (const auto &[addr, pt] : points()) {
        const ProbeList *list = pt->list.load(std::memory_order_relaxed);
        for (uint32_t i = 0; list != nullptr && i < list->count; ++i) {
            if (list->probes[i] == &g_link_map_probe || is_spawn_gate(list->probes[i])) continue; // the agent's own
            if (std::binary_search(hidden.begin(), hidden.end(), list->probes[i])) continue;
            row(addr, list->probes[i],
                pt->symbol.empty() ? fmt::format("0x{:x}", addr)
                                   : fmt::format("{}+0x{:x}", pt->symbol, pt->symbol_offset),
                pt->object_name);
        }
    }
    // Probes whose object is not loaded: the address they had (0 if never loaded).
    for (const auto &[p, pt] : registered()) {
        if (pt != nullptr || std::binary_search(hidden.begin(), hidden.end(), p)) continue;
        const std::string_view spec = p->symbol_name != nullptr ? p->symbol_name : "";
        const std::string_view module = sym::Registry::module_of(spec);
        const std::string_view name = module.empty() ? spec : spec.substr(module.size() + 1);
        row(reinterpret_cast<uint64_t>(p->addr), p, fmt::format("{}+0x{:x}", name, p->offset), std::string(module));
    }
    return out + hw_breakpoints_list_text(g_symbols);
}

int set_enabled(bool on) {
    std::lock_guard lock(g_mutex);
    if (g_kprobes_enabled.load() == on) return 0;
    g_kprobes_enabled.store(on);
    if (!on) { // the jumps out together (opt_disarm_many), the int3s one at a time
        std::vector<Point *> jumped;
        for (auto &[addr, pt] : points())
            if (pt->armed && pt->optimized && !wants_arming(pt)) jumped.push_back(pt);
        opt_disarm_many(jumped);
    }
    int result = 0;
    for (auto &[addr, pt] : points())
        if (int err = update_arming(pt); err != 0 && result == 0) result = err;
    return result;
}

// The first probe in an object has the object's reference table built (opt_warm): here,
// before the registration takes the registry mutex for good, so that other registrations,
// the loader's events and the optimizer do not wait a second for it.
std::vector<uint64_t> functions_named(uint64_t in_object, std::initializer_list<std::string_view> names) {
    UKP_ASSERT_REGISTRY_NOT_HELD();
    std::vector<uint64_t> out;
    std::lock_guard lock(g_mutex);
    if (ensure_initialized() != 0) return out;
    for (const auto &obj : g_symbols->objects()) {
        if (!obj->contains_exec(in_object)) continue;
        for (const sym::Symbol &s : obj->symbols())
            if (s.function && !s.ifunc && std::find(names.begin(), names.end(), s.name) != names.end())
                out.push_back(s.value);
    }
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    return out;
}

void declare_instruction_boundary(uint64_t addr) {
    std::lock_guard lock(g_mutex);
    known_boundaries().insert(addr);
}

int prepare_agent() {
    std::lock_guard lock(g_mutex);
    return ensure_initialized();
}

uint64_t symbol_address(const char *name) {
    if (name == nullptr) return 0;
    std::lock_guard lock(g_mutex);
    if (ensure_initialized() != 0) return 0;
    uint64_t addr = 0;
    return g_symbols->resolve(name, 0, &addr, agent_definition) == 0 ? addr : 0;
}

std::vector<uint64_t> symbols_inside(const sym::Object &obj, const sym::Symbol &fn) {
    std::vector<uint64_t> inner;
    const auto &syms = obj.symbols();
    auto it = std::upper_bound(syms.begin(), syms.end(), fn.value,
                               [](uint64_t v, const sym::Symbol &s) { return v < s.value; });
    for (; it != syms.end() && it->value < fn.value + fn.size; ++it) inner.push_back(it->value);
    return inner;
}

void prepare_jump(Point *pt) {
    UKP_ASSERT_REGISTRY_HELD();
    const sym::Object *obj = g_symbols->object_at(pt->addr);
    const sym::Symbol *fn = obj != nullptr ? obj->function_at(pt->addr) : nullptr;
    if (fn != nullptr && fn->size > 0) opt_prepare(pt, fn->value, fn->size, obj->bias, symbols_inside(*obj, *fn));
}

bool object_loaded_at(uint64_t bias) {
    UKP_ASSERT_REGISTRY_HELD();
    if (g_symbols == nullptr) return false;
    const auto &objects = g_symbols->objects();
    return std::any_of(objects.begin(), objects.end(), [bias](const auto &o) { return o->bias == bias; });
}

void warm_object_refs(const kprobe *p) {
    uint64_t addr = 0;
    {
        std::lock_guard lock(g_mutex);
        if (ensure_initialized() != 0 || resolve_address(p, &addr) != 0) return;
    }
    opt_warm(addr);
    open_full_blocks(addr);
    spawn_gate_install(addr);
}

} // namespace ukp::core

// ---- the C API -------------------------------------------------------------------------

using namespace ukp::core;

extern "C" {

int register_kprobe(struct kprobe *p) {
    if (p == nullptr) return -EINVAL;
    optimizer_start(); // never under g_mutex
    warm_object_refs(p);
    std::lock_guard lock(g_mutex);
    return register_locked(p);
}

void unregister_kprobes(struct kprobe **kps, int num) {
    if (kps == nullptr || num <= 0) return;
    std::vector<ProbeList *> retired;
    {
        std::lock_guard lock(g_mutex);
        for (int i = 0; i < num; ++i)
            if (kps[i] != nullptr) unregister_locked(kps[i], retired);
        // Lists retired earlier inside a hit are as safe to free after this grace period.
        retired.insert(retired.end(), deferred_lists().begin(), deferred_lists().end());
        deferred_lists().clear();
    }
    // One grace period for the whole batch: afterwards no handler of these probes runs.
    if (!synchronize()) {
        std::lock_guard lock(g_mutex);
        deferred_lists().insert(deferred_lists().end(), retired.begin(), retired.end());
        return;
    }
    for (ProbeList *l : retired) std::free(l);
}

void unregister_kprobe(struct kprobe *p) { unregister_kprobes(&p, 1); }

int register_kprobes(struct kprobe **kps, int num) {
    if (kps == nullptr || num <= 0) return -EINVAL;
    for (int i = 0; i < num; ++i) {
        const int err = kps[i] == nullptr ? -EINVAL : register_kprobe(kps[i]);
        if (err != 0) {
            if (i > 0) unregister_kprobes(kps, i);
            return err;
        }
    }
    return 0;
}

int disable_kprobe(struct kprobe *p) { return p == nullptr ? -EINVAL : set_disabled(p, true); }

int enable_kprobe(struct kprobe *p) { return p == nullptr ? -EINVAL : set_disabled(p, false); }

char *ukp_kprobes_list(void) {
    const std::string text = list_text();
    char *out = static_cast<char *>(std::malloc(text.size() + 1));
    if (out == nullptr) {
        errno = ENOMEM;
        return nullptr;
    }
    std::memcpy(out, text.c_str(), text.size() + 1);
    return out;
}

int ukp_kprobes_enabled(void) { return g_kprobes_enabled.load() ? 1 : 0; }

int ukp_lean_dispatch(void) {
    std::lock_guard lock(g_mutex);
    if (int err = ensure_initialized(); err != 0) return err;
    return (ukp_lean_jump_path != 0 ? UKP_LEAN_KPROBE : 0) | (ukp_lean_return_path != 0 ? UKP_LEAN_KRETPROBE : 0);
}

int ukp_set_kprobes_enabled(int on) { return set_enabled(on != 0); }

unsigned long kallsyms_lookup_name(const char *name) { return symbol_address(name); }

} // extern "C"
