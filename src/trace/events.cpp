#include "trace/events.hpp"

#include <ukprobes/hw_breakpoint.h>
#include <ukprobes/kprobes.h>

#include <pthread.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cinttypes>
#include <fnmatch.h>
#include <fstream>
#include <map>
#include <set>
#include <mutex>
#include <optional>
#include <sstream>

#include "platform/fork_mark.hpp"
#include "platform/safe_access.hpp"
#include "platform/this_cpu.hpp"
#include "core/agent.hpp"
#include "platform/maps.hpp"
#include "symbols/symbols.hpp"
#include "trace/filter.hpp"
#include "trace/output.hpp"
#include "trace/print.hpp"
#include "trace/counters.hpp"
#include "trace/profile_table.hpp"
#include "trace/ring.hpp"
#include "trace/trigger.hpp"

namespace ukp::trace {

namespace {

constexpr uint16_t kFirstEventId = 2000;  // dynamic event ids, after the static ones
constexpr uint16_t kMaxSynthString = 256; // a synthetic string's bytes, NUL in: the kernel's STR_VAR_LEN_MAX
constexpr size_t kMaxActionFields = 16;   // a synthetic event's: what a hist action passes at most (hist.cpp)
constexpr uint32_t kScratchSize = 1024;   // a record built when the ring takes none
constexpr int kMaxUserStack = 16;         // frames a stacktrace trigger records
constexpr int kPipeWaitMs = 1000;         // a trace_pipe read waits this long for a record

// The thread's id and name, read once per thread (the name as it was at the first hit).
struct ThreadInfo {
    int32_t tid;
    char comm[16];
};
thread_local ThreadInfo t_info __attribute__((tls_model("initial-exec")));

const ThreadInfo &this_thread() {
    if (t_info.tid == 0) {
        // Once per thread, into the C library: with the vector state saved (a lean hit
        // path calls no C library code directly).
        core::agent_call([] {
            prctl(PR_GET_NAME, t_info.comm, 0, 0, 0);
            t_info.comm[15] = '\0';
            t_info.tid = static_cast<int32_t>(syscall(SYS_gettid));
        });
    }
    return t_info;
}

class ProbePoint;
class Event;

// A point's own argument programs, where its arguments are not where the event's first
// point has them (the sites of one SDT probe: a register at one, the stack at another).
// Laid out as the event's.
struct PointArgs {
    std::vector<FetchProgram> progs;
    std::vector<DirectStore> direct;
};

// What a kprobe hit leads to: standard layout, the kretprobe (and its kprobe) first.
struct Hook {
    struct kretprobe rp;
    ProbePoint *point;
};

// An object kept where kprobe_profile's readers find its counters (counters.hpp): the
// shared memory of the counters, else the heap.
template <typename T>
class SharedCounted {
public:
    SharedCounted() : p_(new (counters_alloc(sizeof(T))) T{}) {}
    ~SharedCounted() {
        p_->~T();
        counters_free(p_, sizeof(T));
    }
    SharedCounted(const SharedCounted &) = delete;
    SharedCounted &operator=(const SharedCounted &) = delete;
    T *operator->() const noexcept { return p_; }
    T &operator*() const noexcept { return *p_; }

private:
    T *const p_;
};

class ProbePoint {
public:
    SharedCounted<Hook> hook;            // what the core calls; hook->point is this (its nmissed counted)
    Event *event = nullptr;              // the event the hits are recorded for
    ProbeDef def;                        // as defined, for the kprobe_events file
    std::string symbol;                  // kept alive for hook->rp.kp.symbol_name
    bool registered = false;             // hook is registered with the core
    bool semaphore_held = false;         // this point counts in its SDT semaphore
    std::unique_ptr<PointArgs> own_args; // null: the event's
    // A w: event's breakpoint, on every thread, registered disarmed (the hook is unused);
    // null while it watches nothing (kNoWatchAddr).
    perf_event *watch = nullptr;
    perf_event_attr watch_attr{};
    // A w: event at -1 that set_wprobe and clear_wprobe triggers move: `watch` is then a
    // placeable breakpoint (core/agent.hpp).
    std::unique_ptr<WatchMover> mover;
};

// What a hit of a set_wprobe or clear_wprobe trigger does to a point: places or lifts its
// breakpoint, and soft-enables or soft-disables its event (the kernel's wprobe triggers).
class PointMover : public WatchMover {
public:
    explicit PointMover(ProbePoint &p) : p_(p) {}
    bool set(uint64_t addr) noexcept override;
    bool clear(uint64_t addr, bool any) noexcept override;

private:
    ProbePoint &p_;
};

// kprobe_profile's counts of one event. The hit count is kept per CPU as the kernel keeps
// nhit: hits on different CPUs do not write one cache line (nor the one the hit path reads
// the event's state from). CPUs 0-30 each have
// their own; the last is shared, with locked adds (platform::count_on_this_cpu).
struct EventCounts {
    static constexpr unsigned kShards = 32;
    struct alignas(64) Shard {
        std::atomic<uint64_t> n{0};
    };
    Shard hits[kShards];
    alignas(64) std::atomic<uint64_t> faults{0}; // hits whose fetches read a bad address
    std::atomic<uint64_t> too_big{0};            // hits dropped: their record passed kMaxEventSize

    void hit() noexcept { platform::count_on_this_cpu<kShards, sizeof(Shard)>(hits); }
    uint64_t load_hits() const noexcept {
        uint64_t n = 0;
        for (const Shard &s : hits) n += s.n.load(std::memory_order_relaxed);
        return n;
    }
    // Where they are, for the counter table (profile_table.hpp).
    void describe(ProfileTableBuilder &b) const {
        b.add_counter(&hits[0].n, sizeof(uint64_t), kShards, sizeof(Shard), false);
        b.add_counter(&faults, sizeof(uint64_t), 1, 0, true);
        b.add_counter(&too_big, sizeof(uint64_t), 1, 0, true);
    }
};

// The probes and records of one event; what printing takes (EventInfo: id, names,
// fields, print fmt) never changes once it is defined.
class Event : public EventInfo {
public:
    std::vector<FetchProgram> progs;                 // one per argument, in order
    std::vector<std::string> arg_names, arg_types;   // for comparing definitions
    std::vector<uint16_t> entry_args;                // $argN saved at entry (return probes)
    std::vector<DirectStore> direct;                 // every argument a register as it is: these
    uint32_t fixed_size = 0;                         // record bytes before the string data
    bool dynamic = false;                            // has string data (measured at each hit)
    std::unique_ptr<SymbolTable> symbols;            // for symstr arguments
    std::vector<std::unique_ptr<ProbePoint>> points; // one per definition line
    bool is_watch = false;                           // w: its points are breakpoints
    bool is_tracepoint = false;                      // t: its points are an SDT probe's sites
    bool is_functions = false;                       // f: on globs or a list: a point per function
    Event *source = nullptr;                         // e: the event whose records it takes
    std::string synth_text;                          // a synthetic event's definition ("u64 lat; pid_t pid")
    std::unique_ptr<SynthSink> sink;                 // a synthetic event: what hist actions fire
    // e: events on this event's records, fed by its hits (slots published with a store).
    static constexpr size_t kMaxAttached = 8;
    std::array<std::atomic<Event *>, kMaxAttached> attached{};
    std::atomic<uint32_t> nattached{0};
    size_t functions_passed = 0; // of those, how many could not be probed

    std::atomic<bool> enabled{false};             // the enable file (and enable_event triggers)
    bool trigger_target = false;                  // an enable_event/disable_event trigger names it
    SharedCounted<EventCounts> counts;            // kprobe_profile's: every armed hit, and the misses
    std::atomic<const Filter *> filter{nullptr};  // the filter file's; null: all pass
    std::vector<std::unique_ptr<Filter>> filters; // current and retired: a hit may still read one
    TriggerSet triggers;                          // the trigger file's

    // watch_addr: a watch event's address ($addr); own: the point's programs, if not the event's.
    void hit(const pt_regs *regs, const uint64_t *entry, uint64_t ip, uint64_t ret_addr, uint64_t watch_addr = 0,
             const PointArgs *own = nullptr) noexcept;
    // An e: event's hit: the record `src` of its source event, just made.
    void eprobe_hit(const uint8_t *src, uint32_t src_size, const pt_regs *regs, const ThreadInfo &me, int cpu) noexcept;
    // A synthetic event's: a hist action's values, one per field.
    void synth_hit(const uint64_t *values, size_t n, const pt_regs *regs) noexcept;
    uint64_t misses() const;
    // Whether its probes must be armed: for itself, or for an e: event on it.
    bool armed_wanted() const {
        if (enabled.load() || trigger_target || !triggers.empty()) return true;
        for (const auto &a : attached)
            if (const Event *e = a.load(std::memory_order_acquire); e != nullptr && e->armed_wanted()) return true;
        return false;
    }

private:
    // Whether a hit has anything to do: a record, triggers, e: events to feed.
    bool hit_wanted() const noexcept {
        return (enabled.load(std::memory_order_acquire) && tracing_on()) || !triggers.empty() ||
               nattached.load(std::memory_order_acquire) != 0;
    }
    // The record of a hit (ip and ret_addr go into a probe's own fields; an e: event has
    // none), into the ring, to the triggers and to the e: events on this one.
    void emit(const HitContext &ctx, const ThreadInfo &me, const PointArgs *own, int cpu, uint64_t ip,
              uint64_t ret_addr) noexcept;
};

void put_header(uint8_t *rec, uint16_t id, int32_t tid) {
    CommonHeader h{id, 0, 0, tid};
    __builtin_memcpy(rec, &h, sizeof h);
}

void Event::hit(const pt_regs *regs, const uint64_t *entry, uint64_t ip, uint64_t ret_addr, uint64_t watch_addr,
                const PointArgs *own) noexcept {
    // A child of a fork() that ran no handler has the parent's ring and counters, shared
    // memory: its hits are nobody's to see (fork_mark.hpp).
    if (!platform::process_known()) [[unlikely]]
        return;
    const int cpu = platform::this_cpu(); // from rseq: no system call; the record's too
    counts->hit();
    if (!hit_wanted()) return;
    const ThreadInfo &me = this_thread();
    emit(HitContext{regs, entry, ret_addr, me.comm, watch_addr}, me, own, cpu, ip, ret_addr);
}

void Event::eprobe_hit(const uint8_t *src, uint32_t src_size, const pt_regs *regs, const ThreadInfo &me,
                       int cpu) noexcept {
    counts->hit();
    if (!hit_wanted()) return;
    HitContext ctx{regs, nullptr, 0, me.comm, 0};
    ctx.rec = src;
    ctx.rec_size = src_size;
    emit(ctx, me, nullptr, cpu, 0, 0);
}

void Event::synth_hit(const uint64_t *values, size_t n, const pt_regs *regs) noexcept {
    static const pt_regs kNoRegs{};
    const int cpu = platform::this_cpu();
    counts->hit();
    if (!hit_wanted()) return;
    const ThreadInfo &me = this_thread();
    HitContext ctx{regs != nullptr ? regs : &kNoRegs, nullptr, 0, me.comm, 0};
    ctx.rec = reinterpret_cast<const uint8_t *>(values); // each field's program reads its value here
    ctx.rec_size = static_cast<uint32_t>(n * 8);
    emit(ctx, me, nullptr, cpu, 0, 0);
}

// What hist actions fire: a synthetic event.
class SynthEvent : public SynthSink {
public:
    explicit SynthEvent(Event *e) : e_(e) {}
    size_t field_count() const override { return e_->progs.size(); }
    bool field_is_string(size_t i) const override { return e_->progs[i].store == Store::kString; }
    bool field_is_stack(size_t i) const override { return e_->progs[i].store == Store::kStack; }
    Event *event() const { return e_; }

private:
    Event *e_;
};

void Event::emit(const HitContext &ctx, const ThreadInfo &me, const PointArgs *own, int cpu, uint64_t ip,
                 uint64_t ret_addr) noexcept {
    const std::vector<FetchProgram> &progs = own != nullptr ? own->progs : this->progs;
    const std::vector<DirectStore> &direct = own != nullptr ? own->direct : this->direct;
    const bool record = enabled.load(std::memory_order_acquire) && tracing_on();
    const bool feeds = nattached.load(std::memory_order_acquire) != 0;
    // The strings are measured first and the record reserved at its size, as the kernel
    // does; one its ring could not take is dropped, triggers and all, as the kernel drops
    // it (and counted here, as a miss).
    StringStash stash; // short strings read while measuring, stored from here
    const uint32_t size = dynamic ? fixed_size + measure_fetch(progs.data(), static_cast<uint32_t>(progs.size()), ctx,
                                                               symbols.get(), &stash)
                                  : fixed_size;
    if (size > kMaxEventSize) {
        counts->too_big.fetch_add(1, std::memory_order_relaxed);
        return;
    }
    uint8_t *rec = record ? ring_reserve(size, me.comm, cpu) : nullptr;
    alignas(8) uint8_t scratch[kScratchSize];
    uint8_t *buf = rec;
    uint32_t cap = size;
    if (rec == nullptr) {
        // Without a place in the ring the triggers (and e: events) still see the record
        // (traceon must work while tracing is off).
        if ((triggers.empty() && !feeds) || fixed_size > kScratchSize) return;
        buf = scratch;
        cap = std::min(size, kScratchSize);
    }
    put_header(buf, id, me.tid);
    // Constant sizes: a call to memcpy here could hit a probe on memcpy.
    if (source == nullptr && !synthetic) __builtin_memcpy(buf + kCommonSize, &ip, 8);
    if (is_return) __builtin_memcpy(buf + kCommonSize + 8, &ret_addr, 8);
    uint32_t nfault = 0;
    uint32_t used = fixed_size;
    if (!direct.empty())
        run_direct(direct.data(), static_cast<uint32_t>(direct.size()), ctx.regs, buf);
    else
        used = run_fetch(progs.data(), static_cast<uint32_t>(progs.size()), ctx, symbols.get(), buf, fixed_size, cap,
                         &nfault, &stash);
    if (nfault != 0) counts->faults.fetch_add(1, std::memory_order_relaxed);
    if (rec != nullptr) {
        const Filter *f = filter.load(std::memory_order_acquire);
        const bool match = f == nullptr || f->match(rec, used, me.comm);
        ring_commit(rec, match ? used : 0);
    }
    if (!triggers.empty()) triggers.fire(buf, used, me.comm, *ctx.regs);
    if (feeds)
        for (const auto &a : attached)
            if (Event *e = a.load(std::memory_order_acquire); e != nullptr) e->eprobe_hit(buf, used, ctx.regs, me, cpu);
}

uint64_t Event::misses() const {
    uint64_t n = counts->faults.load(std::memory_order_relaxed) + counts->too_big.load(std::memory_order_relaxed);
    for (const auto &p : points) {
        if (p->watch != nullptr) n += p->watch->nmissed;
        n += p->hook->rp.kp.nmissed;
        if (is_return) n += static_cast<uint64_t>(p->hook->rp.nmissed);
    }
    return n;
}

// The hit handlers: a probe reaches its event through its kprobe, with no lookup.
int on_kprobe(struct kprobe *kp, struct pt_regs *regs) {
    Hook *h = reinterpret_cast<Hook *>(kp);
    // The probe's address, as the kernel records it (regs->ip may already be past the int3).
    h->point->event->hit(regs, nullptr, reinterpret_cast<uint64_t>(kp->addr), 0, 0, h->point->own_args.get());
    return 0;
}

uint64_t entry_value(const pt_regs *regs, uint16_t n) {
    static constexpr int kArgRegs[6] = {14, 13, 12, 11, 9, 8}; // di si dx cx r8 r9
    if (n < 6) return reinterpret_cast<const unsigned long *>(regs)[kArgRegs[n]];
    uint64_t v = 0;
    if (ukp_safe_copy(&v, reinterpret_cast<const void *>(regs->sp + 8ull * (n - 5)), 8) != 0) return 0;
    return v;
}

int on_entry(struct kretprobe_instance *ri, struct pt_regs *regs) {
    Hook *h = reinterpret_cast<Hook *>(ri->rp);
    Event *e = h->point->event;
    if (!e->enabled.load(std::memory_order_relaxed) && e->triggers.empty()) return 1;
    auto *saved = reinterpret_cast<uint64_t *>(ri->data);
    for (size_t i = 0; i < e->entry_args.size(); ++i) saved[i] = entry_value(regs, e->entry_args[i]);
    return 0;
}

int on_return(struct kretprobe_instance *ri, struct pt_regs *regs) {
    Hook *h = reinterpret_cast<Hook *>(ri->rp);
    h->point->event->hit(regs, reinterpret_cast<const uint64_t *>(ri->data),
                         reinterpret_cast<uint64_t>(h->point->hook->rp.kp.addr),
                         reinterpret_cast<uint64_t>(ri->ret_addr));
    return 0;
}

bool PointMover::set(uint64_t addr) noexcept {
    if (core::place_breakpoint(p_.watch, addr) != 0) return false;
    p_.event->enabled.store(true, std::memory_order_release);
    return true;
}

bool PointMover::clear(uint64_t addr, bool any) noexcept {
    const uint64_t now = core::placed_address(p_.watch);
    if (now == 0 || (!any && now != addr)) return false;
    p_.event->enabled.store(false, std::memory_order_release);
    return core::lift_breakpoint(p_.watch) == 0;
}

// A watch event's breakpoint: the access is done, regs->ip is the next instruction.
void on_watch(struct perf_event *bp, struct perf_sample_data *data, struct pt_regs *regs) {
    auto *p = static_cast<ProbePoint *>(bp->overflow_handler_context);
    p->event->hit(regs, nullptr, regs->ip, 0, data->addr);
}

// The handlers above, as the core sees them.
std::array<const void *, 3> hit_handlers() {
    return {reinterpret_cast<const void *>(&on_kprobe), reinterpret_cast<const void *>(&on_entry),
            reinterpret_cast<const void *>(&on_return)};
}

// --- printing --------------------------------------------------------------------------

// A synthetic event's print fmt, as the kernel's __set_synth_event_print_fmt() writes it:
// each field with synth_field_fmt()'s conversion for its declared type, ", " between them.
std::string synth_print_fmt(const Event &e) {
    static constexpr std::pair<const char *, const char *> kFmts[] = {{"s64", "%lld"}, {"u64", "%llu"},
                                                                      {"s32", "%d"},   {"u32", "%u"},
                                                                      {"s16", "%d"},   {"u16", "%u"},
                                                                      {"s8", "%d"},    {"u8", "%u"},
                                                                      {"char", "%d"},  {"unsigned char", "%u"},
                                                                      {"int", "%d"},   {"unsigned int", "%u"},
                                                                      {"long", "%ld"}, {"unsigned long", "%lu"},
                                                                      {"bool", "%d"},  {"pid_t", "%d"},
                                                                      {"gfp_t", "%x"}};
    std::string fmt, args;
    for (size_t i = 4; i < e.fields.size(); ++i) {
        const Field &f = e.fields[i];
        const char *one = "%llu";
        for (auto [type, conv] : kFmts)
            if (f.c_type == type) one = conv;
        if (f.print == Print::kString || f.print == Print::kStack) one = "%s";
        fmt += (i > 4 ? ", " : "") + f.name + "=" + one;
        args += f.print == Print::kString  ? ", __get_str(" + f.name + ")"
                : f.print == Print::kStack ? ", __get_stacktrace(" + f.name + ")"
                                           : ", REC->" + f.name;
    }
    return "\"" + fmt + "\"" + args;
}

std::string print_fmt_of(const Event &e) {
    if (e.synthetic) return synth_print_fmt(e);
    // An e: event names the event it is on where a probe's address goes.
    std::string fmt = !e.attached_to.empty() ? "(" + e.attached_to + ")" : e.is_return ? "(%lx <- %lx)" : "(%lx)";
    std::string args = !e.attached_to.empty() ? ""
                       : e.is_return          ? "REC->__probe_func, REC->__probe_ret_ip"
                                              : "REC->__probe_ip";
    for (size_t i = 0; i < e.progs.size(); ++i) {
        const ArgType &t = e.progs[i].type;
        const std::string &n = e.arg_names[i];
        std::string one;
        switch (t.kind) {
        case Kind::kUnsigned:
            one = t.size == 8 ? "%Lu" : "%u";
            break;
        case Kind::kSigned:
            one = t.size == 8 ? "%Ld" : "%d";
            break;
        case Kind::kHex:
            one = t.size == 8 ? "0x%Lx" : "0x%x";
            break;
        case Kind::kChar:
            one = "'%c'";
            break;
        case Kind::kSymbol:
            one = "%pS";
            break;
        case Kind::kString:
        case Kind::kSymStr:
        case Kind::kStack: // a synthetic event's only (synth_print_fmt)
            one = "\\\"%s\\\"";
            break;
        }
        const bool str = t.kind == Kind::kString || t.kind == Kind::kSymStr;
        fmt += " " + n + "=";
        if (t.array_len == 0) {
            fmt += one;
            args += str ? ", __get_str(" + n + ")" : ", REC->" + n;
        } else {
            fmt += "{";
            for (uint32_t k = 0; k < t.array_len; ++k) {
                fmt += (k ? "," : "") + one;
                const std::string el = n + "[" + std::to_string(k) + "]";
                args += str ? ", __get_str(" + el + ")" : ", REC->" + el;
            }
            fmt += "}";
        }
    }
    if (!e.attached_to.empty()) return "\"" + fmt + "\"" + args; // args: ", REC->..." or none
    return "\"" + fmt + "\", " + args;
}

std::string format_text(const Event &e) {
    std::string s = "name: " + e.name + "\nID: " + std::to_string(e.id) + "\nformat:\n";
    bool common = true;
    char buf[512];
    for (const Field &f : e.fields) {
        if (common && !f.common) {
            s += "\n";
            common = false;
        }
        const bool str = f.print == Print::kString;
        std::string decl = f.c_type + " " + f.name;
        uint32_t size = f.size;
        if (f.array_len > 0) {
            size = f.size * f.array_len;
            if (!str) decl += "[]";
        }
        std::snprintf(buf, sizeof buf, "\tfield:%s;\toffset:%u;\tsize:%u;\tsigned:%d;\n", decl.c_str(), f.offset, size,
                      f.is_signed ? 1 : 0);
        s += buf;
    }
    s += "\nprint fmt: " + e.print_fmt + "\n";
    return s;
}

// --- the tracer ------------------------------------------------------------------------

// Symbols and mappings of the process, for the parser.
class ProcessResolver : public Resolver {
public:
    sym::Registry symbols;

    int resolve_code(std::string_view spec, uint64_t offset, uint64_t *addr) override {
        return symbols.resolve(spec, offset, addr);
    }
    int resolve_data(std::string_view spec, uint64_t *addr) override { return symbols.resolve(spec, 0, addr); }
    int resolve_file_offset(std::string_view path, uint64_t offset, uint64_t *addr, char perm) override {
        char real[PATH_MAX];
        const std::string p(path);
        const bool have_real = realpath(p.c_str(), real) != nullptr;
        bool seen = false;
        uint64_t fallback = 0; // for 'x': a mapping without exec, used if no exec one has it
        uint64_t found = 0;
        platform::for_each_mapping(0, [&](const platform::Mapping &m) {
            if (m.path != p && !(have_real && m.path == real)) return true;
            seen = true;
            const bool perm_ok = perm == 0 || (perm == 'x' && m.executable()) || (perm == 'w' && m.writable());
            if (offset >= m.offset && offset < m.offset + (m.end - m.start)) {
                if (perm_ok) {
                    found = m.start + (offset - m.offset);
                    return false;
                }
                if (perm == 'x' && fallback == 0) fallback = m.start + (offset - m.offset);
            }
            return true;
        });
        if (found != 0) {
            *addr = found;
            return 0;
        }
        if (fallback != 0) {
            *addr = fallback;
            return 0;
        }
        return seen ? -ERANGE : -ENOENT;
    }
    int resolve_sdt(std::string_view module, std::string_view provider, std::string_view name,
                    std::vector<SdtSite> *sites) override {
        for (const sym::Object *obj : symbols.objects_named(module))
            for (const sym::SdtProbe &p : sym::sdt_probes(*obj))
                if (p.provider == provider && p.name == name) sites->push_back({p.pc, p.semaphore, p.args});
        return sites->empty() ? -ENOENT : 0;
    }
    int resolve_functions(std::string_view spec, std::vector<Function> *out) override {
        const std::string_view module = sym::Registry::module_of(spec);
        const std::string_view list = module.empty() ? spec : spec.substr(module.size() + 1);
        std::vector<std::string> take, skip;
        for (size_t start = 0; start <= list.size();) {
            const size_t comma = std::min(list.find(',', start), list.size());
            const std::string_view pat = list.substr(start, comma - start);
            if (!pat.empty()) (pat[0] == '!' ? skip : take).emplace_back(pat.substr(pat[0] == '!' ? 1 : 0));
            start = comma + 1;
        }
        std::vector<const sym::Object *> objs;
        for (const sym::Object *o : symbols.objects_named(module))
            if (!module.empty() || o->main_program) objs.push_back(o);
        if (objs.empty()) return -ENOENT;
        const auto matches = [](const std::vector<std::string> &pats, const std::string &name) {
            return std::any_of(pats.begin(), pats.end(),
                               [&](const std::string &p) { return fnmatch(p.c_str(), name.c_str(), 0) == 0; });
        };
        std::set<uint64_t> seen; // aliases of one function: the first name that matches
        for (const sym::Object *o : objs)
            for (const sym::Symbol &sy : o->symbols()) {
                // An ifunc's symbol is its resolver, which runs once: not what a user means.
                if (!sy.function || sy.ifunc || sy.value == 0 || !matches(take, sy.name) || matches(skip, sy.name))
                    continue;
                if (seen.insert(sy.value).second) out->push_back({sy.value, sy.name});
            }
        return 0;
    }
    // An event's fields, for e: definitions (Tracer sets it: the events are its).
    std::function<const std::vector<Field> *(std::string_view group, std::string_view event)> fields_of;
    int event_fields(std::string_view group, std::string_view event, std::vector<Field> *out) override {
        const std::vector<Field> *f = fields_of ? fields_of(group, event) : nullptr;
        if (f == nullptr) return -ENOENT;
        *out = *f;
        return 0;
    }
    // The addresses an event's probes are at, for e: typecasts (Tracer sets it).
    std::function<std::vector<uint64_t>(std::string_view group, std::string_view event)> addrs_of;
    std::shared_ptr<const sym::StructTypes> struct_types(std::string_view group, std::string_view event) override {
        std::vector<std::string> paths;
        const auto add = [&](const sym::Object *o) {
            const std::string path = o->path.empty() ? "/proc/self/exe" : o->path;
            if (std::find(paths.begin(), paths.end(), path) == paths.end()) paths.push_back(path);
        };
        for (uint64_t addr : addrs_of ? addrs_of(group, event) : std::vector<uint64_t>{})
            if (const sym::Registry::Location loc = symbols.locate(addr); loc.object != nullptr) add(loc.object);
        for (const sym::Object *o : symbols.objects_named(""))
            if (o->main_program) add(o);
        return sym::struct_types(paths);
    }
    bool module_pending(std::string_view spec) override {
        const std::string_view m = sym::Registry::module_of(spec);
        return !m.empty() && !symbols.has_module(m);
    }
    std::shared_ptr<const sym::FunctionTypes> function_types(uint64_t addr) override {
        const sym::Registry::Location loc = symbols.locate(addr);
        if (loc.object == nullptr || loc.object->path.empty()) return nullptr;
        return sym::function_types(loc.object->path, addr - loc.object->bias);
    }
    bool function_entry(uint64_t addr) override {
        const sym::Registry::Location loc = symbols.locate(addr);
        return loc.symbol != nullptr && loc.symbol->function && loc.symbol->value == addr;
    }
};

class Tracer : public TriggerHost {
public:
    std::mutex mu; // definitions, enabling, file reads
    ProcessResolver resolver;
    std::vector<std::unique_ptr<Event>> events;    // in definition order
    std::vector<std::unique_ptr<Event>> graveyard; // removed: records and hits may still name them
    std::map<uint16_t, Event *> by_id;             // live and removed, for printing
    uint16_t next_id = kFirstEventId;
    ErrorLog errors;

    Event *find(std::string_view group, std::string_view name) {
        for (auto &e : events)
            if (e->name == name && (group.empty() || e->group == group)) return e.get();
        return nullptr;
    }
    int define(std::string_view line, char separator, bool enable);
    // Logs error e at offset off of word `word` of a definition's command.
    void log_error(const std::string &command, Err e, int word, int off);
    // 0 when def may add a probe point to e (same type and arguments, a point e has not
    // got); else -EEXIST, logged.
    int check_joins(const Event &e, const ProbeDef &def);
    // A new event of def, its record laid out; null and *r (-E2BIG, logged) when the record
    // is too big.
    std::unique_ptr<Event> make_event(const ProbeDef &def, int *r);
    // def's probe point registered with the core, disabled: 0, or the core's error (logged).
    // `quiet`: a failure leaves no error_log entry (a function of a glob, passed over).
    int register_point(ProbePoint &point, const ProbeDef &def, bool quiet = false);
    // def's breakpoint, on every thread, disarmed: 0, or the error (logged).
    int register_watch(ProbePoint &point, const ProbeDef &def);
    int remove(Event *e);
    // An e: event on the event its definition names (parsed: it exists).
    int define_eprobe(std::unique_ptr<ProbeDef> def, bool enable);
    void publish_profile();
    int set_enabled(Event *e, bool on);
    void arm(Event *e);
    void arm_as(Event *e, bool want); // arms or disarms its points as `want` says

    // TriggerHost
    void set_tracing_on(bool on) override { ukp::trace::set_tracing_on(on); }
    bool tracing_is_on() const override { return ukp::trace::tracing_on(); }
    // From a probe hit: the swap is lock-free; the spare was allocated when the trigger
    // was written.
    void take_snapshot() override { snapshot_swap(); }
    SynthSink *synthetic_event(std::string_view name) override {
        Event *e = find("synthetic", name);
        return e != nullptr ? e->sink.get() : nullptr;
    }
    bool event_exists(std::string_view group, std::string_view event) override { return find(group, event) != nullptr; }
    int field_var_hist(std::string_view group, std::string_view event, std::string_view field,
                       const HistTrigger &target, bool find_only, std::string *cmd, std::string *message) override {
        // Called from a trigger write, with mu held by the file API.
        Event *e = find(group, event);
        const HistTrigger *like = e != nullptr ? e->triggers.hist_like(target) : nullptr;
        if (like == nullptr) {
            *message = e == nullptr ? "Event file not found" : "Matching event histogram not found";
            return -EINVAL;
        }
        *cmd = like->field_var_spec(field);
        if (find_only || HistTrigger::has_var(e->group + "." + e->name, HistTrigger::field_var_name(field))) return 0;
        FilterError err;
        if (e->triggers.write("hist:" + *cmd, e->fields, *this, &err) != 0) {
            *message = "Couldn't create histogram for field";
            return -EINVAL;
        }
        arm(e);
        return 0;
    }
    void drop_field_var_hist(std::string_view group, std::string_view event, const std::string &cmd) override {
        Event *e = find(group, event);
        if (e == nullptr) return;
        FilterError err;
        if (e->triggers.write("!hist:" + cmd, e->fields, *this, &err) == 0) arm(e);
    }
    // A synthetic_events line, "NAME TYPE FIELD[; TYPE FIELD]..." ("!NAME" removes it), or
    // dynamic_events' "s:[synthetic/]NAME ..." (`dynamic`). 0 or -errno, logged.
    int define_synthetic(std::string_view line, bool dynamic);
    std::atomic<bool> *event_enable_flag(std::string_view system, std::string_view event) override {
        // Called from a trigger write, with mu held by the file API.
        Event *e = find(system, event);
        if (e == nullptr) return nullptr;
        e->trigger_target = true;
        arm(e);
        return &e->enabled;
    }
    TriggerSet *event_triggers(std::string_view system, std::string_view event) override {
        // Called from a trigger write, with mu held by the file API. A removed event's
        // triggers stay (graveyard): a hit may still reach them.
        Event *e = find(system, event);
        return e != nullptr ? &e->triggers : nullptr;
    }
    void record_stacktrace(const struct pt_regs &regs) override;
    WatchMover *watch_mover(std::string_view event, bool for_set, int *err) override;
};

// The child of a fork is a new thread with a new id: forget the parent's.
void forget_thread_after_fork() { t_info.tid = 0; }

Tracer &tracer() {
    static Tracer *t = [] {
        pthread_atfork(nullptr, nullptr, forget_thread_after_fork);
        // The hit handlers read the program's memory only through ukp_safe_copy and
        // write only the agent's: the core calls them unguarded (core.hpp).
        for (const void *fn : hit_handlers()) core::mark_own_handler(fn);
        auto *t = new Tracer; // never destroyed: probes may fire during exit
        t->resolver.fields_of = [t](std::string_view group, std::string_view event) -> const std::vector<Field> * {
            const Event *e = t->find(group, event); // under t->mu, as every definition
            return e != nullptr ? &e->fields : nullptr;
        };
        t->resolver.addrs_of = [t](std::string_view group, std::string_view event) {
            std::vector<uint64_t> addrs;
            for (const Event *e = t->find(group, event); e != nullptr; e = e->source) // an e: event's: its source's
                for (const auto &p : e->points)
                    if (p->registered && p->hook->rp.kp.addr != nullptr)
                        addrs.push_back(reinterpret_cast<uint64_t>(p->hook->rp.kp.addr));
            return addrs;
        };
        return t;
    }();
    return *t;
}

WatchMover *Tracer::watch_mover(std::string_view event, bool for_set, int *err) {
    // Called from a trigger write, with mu held by the file API.
    Event *e = find(kDefaultWatchGroup, event);
    if (e == nullptr || !e->is_watch) {
        *err = -ENOENT;
        return nullptr;
    }
    ProbePoint &p = *e->points.front();
    if (e->points.size() != 1 || p.def.addr != kNoWatchAddr || p.def.where != Where::kAddress) {
        *err = -EINVAL;
        return nullptr;
    }
    // Enabled or not (ukprobe run enables every event it is given): a watch at -1 records
    // only while a trigger has placed it. The kernel wants it disabled (-EBUSY).
    (void)for_set;
    if (p.mover == nullptr) {
        perf_event_attr attr;
        hw_breakpoint_init(&attr);
        attr.bp_len = p.def.watch.len;
        attr.bp_type = p.def.watch.type;
        perf_event *bp = core::prepare_placeable_breakpoint(attr, on_watch, &p);
        if (IS_ERR(bp)) {
            *err = int(PTR_ERR(bp));
            return nullptr;
        }
        p.watch = bp;
        p.mover = std::make_unique<PointMover>(p);
    }
    return p.mover.get();
}

void Tracer::record_stacktrace(const struct pt_regs &regs) {
    // The user stack by the frame-pointer chain, every read fault-safe.
    constexpr uint32_t kSize = kCommonSize + 8 * kMaxUserStack;
    uint8_t *rec = tracing_on() ? ring_reserve(kSize, this_thread().comm) : nullptr;
    if (rec == nullptr) return;
    put_header(rec, kStackEventId, this_thread().tid);
    uint64_t frames[kMaxUserStack] = {};
    const int n = user_stack(regs, frames, kMaxUserStack);
    __builtin_memcpy(rec + kCommonSize, frames, sizeof frames);
    ring_commit(rec, kCommonSize + 8u * static_cast<uint32_t>(n));
}

std::string type_key(const ArgType &t) {
    return std::to_string(int(t.kind)) + "/" + std::to_string(t.size) + "/" + std::to_string(t.array_len) + "/" +
           t.name;
}

bool same_point(const ProbeDef &a, const ProbeDef &b) {
    return a.addr == b.addr && a.is_return == b.is_return && a.is_watch == b.is_watch;
}

void set_point_armed(ProbePoint &p, bool is_return, bool want);

void Tracer::arm(Event *e) { arm_as(e, e->armed_wanted()); }

void Tracer::arm_as(Event *e, bool want) {
    if (e->source != nullptr) { // an e: event has no probes: its source's serve it
        arm(e->source);
        return;
    }
    const core::ArmBatch batch; // one synchronization of the cores for all its points
    // Many points disabled: together by the core; what it left, w: events and enabling, one
    // by one.
    std::vector<char> done(e->points.size(), 0);
    if (!want) {
        std::vector<kprobe *> probes;
        std::vector<size_t> of; // the index in e->points of each
        for (size_t i = 0; i < e->points.size(); ++i) {
            const ProbePoint &p = *e->points[i];
            if (!p.registered || p.def.is_watch) continue;
            probes.push_back(&p.hook->rp.kp);
            of.push_back(i);
        }
        std::vector<int> together;
        core::disable_together(probes, &together);
        for (size_t i = 0; i < of.size(); ++i) done[of[i]] = together[i] == 0;
    }
    for (size_t i = 0; i < e->points.size(); ++i) {
        auto &p = e->points[i];
        if (!p->registered) continue;
        if (p->def.ref_ctr_addr != 0 && p->semaphore_held != want) {
            // An SDT semaphore counts the tracers attached: the program's guarded probe
            // sites run only while it is non-zero (the kernel's uprobe ref_ctr_offset).
            auto *ctr = reinterpret_cast<uint16_t *>(p->def.ref_ctr_addr);
            __atomic_add_fetch(ctr, want ? 1 : uint16_t(-1), __ATOMIC_RELAXED);
            p->semaphore_held = want;
        }
        if (done[i] == 0) set_point_armed(*p, e->is_return, want);
    }
}

// The core enables and disables only probes whose object is loaded (-EINVAL otherwise, as
// the kernel's enable_kprobe on a gone probe); a probe waiting for its object (not loaded
// yet, or unloaded by dlclose) is armed when the object loads as its KPROBE_FLAG_DISABLED
// says. The kernel's trace_kprobe keeps the event's state and sets that flag from it when
// it registers the probe of a module that comes: the same is done here.
void set_point_armed(ProbePoint &p, bool is_return, bool want) {
    if (p.def.is_watch) {
        if (p.watch == nullptr || p.mover != nullptr) return; // moved by triggers alone
        p.watch_attr.disabled = want ? 0 : 1;
        modify_user_hw_breakpoint(p.watch, &p.watch_attr);
        return;
    }
    kprobe &kp = p.hook->rp.kp;
    const int r = is_return ? (want ? enable_kretprobe(&p.hook->rp) : disable_kretprobe(&p.hook->rp))
                            : (want ? enable_kprobe(&kp) : disable_kprobe(&kp));
    if (r == 0 || (__atomic_load_n(&kp.flags, __ATOMIC_SEQ_CST) & KPROBE_FLAG_GONE) == 0) return;
    if (p.def.where != Where::kSymbol) return; // given by address: never armed again
    if (!is_return) {
        // Registered anew with the flag as wanted (the flag of a registered probe is the
        // core's), as trace_kprobe registers it again: armed at once if the object came
        // meanwhile, else when it comes.
        unregister_kprobe(&kp);
        kp.addr = nullptr; // a gone probe keeps the address it had: by name again
        kp.flags = want ? 0u : unsigned(KPROBE_FLAG_DISABLED);
        if (register_kprobe(&kp) != 0) p.registered = false;
        return;
    }
    // A kretprobe is not registered anew (that would make its instance pool anew): its
    // flag is set in place. If the object loaded since the answer above,
    // the core armed it by the old flag: it is asked again. (The core clears GONE with an
    // atomic operation, so neither write is lost.)
    if (want)
        __atomic_and_fetch(&kp.flags, ~unsigned(KPROBE_FLAG_DISABLED), __ATOMIC_SEQ_CST);
    else
        __atomic_or_fetch(&kp.flags, unsigned(KPROBE_FLAG_DISABLED), __ATOMIC_SEQ_CST);
    if ((__atomic_load_n(&kp.flags, __ATOMIC_SEQ_CST) & KPROBE_FLAG_GONE) == 0)
        want ? enable_kretprobe(&p.hook->rp) : disable_kretprobe(&p.hook->rp);
}

// The common fields and the probe's own: __probe_ip, or __probe_func and __probe_ret_ip.
std::vector<Field> probe_fields(bool is_return) {
    std::vector<Field> fields = common_fields();
    if (is_return) {
        fields.push_back({"__probe_func", "unsigned long", kCommonSize, 8, false, Print::kHex, 0, false});
        fields.push_back({"__probe_ret_ip", "unsigned long", kCommonSize + 8, 8, false, Print::kHex, 0, false});
    } else {
        fields.push_back({"__probe_ip", "unsigned long", kCommonSize, 8, false, Print::kHex, 0, false});
    }
    return fields;
}

// The process's symbols with an address, by address: what symstr arguments print.
std::unique_ptr<SymbolTable> symbol_table(const sym::Registry &symbols) {
    auto t = std::make_unique<SymbolTable>();
    for (const auto &obj : symbols.objects())
        for (const sym::Symbol &s : obj->symbols()) {
            if (s.value == 0) continue;
            t->entries.push_back({s.value, s.size, static_cast<uint32_t>(t->names.size())});
            t->names += s.name;
            t->names += '\0';
        }
    std::stable_sort(t->entries.begin(), t->entries.end(),
                     [](const auto &a, const auto &b) { return a.start < b.start; });
    return t;
}

// Who reports a definition's error in error_log: the kernel's kprobe tracer, its wprobe
// tracer for a w: line, its fprobe tracer for f: and t: lines, its eprobe one for e:.
const char *log_source(const std::string &command) {
    // fprobetrace's parser takes both f: and t: lines.
    return command[0] == 'w'                        ? "wprobe"
           : command[0] == 'f' || command[0] == 't' ? "trace_fprobe"
           : command[0] == 'e'                      ? "event_probe"
                                                    : "trace_kprobe";
}

void Tracer::log_error(const std::string &command, Err e, int word, int off) {
    // Position of word `word` in the command.
    int pos = 0, w = 0;
    for (size_t i = 0; i < command.size() && w < word; ++i)
        if (command[i] == ' ') {
            ++w;
            pos = int(i) + 1;
        }
    errors.add(log_source(command), command, ProbeError{e, pos + off, true});
}

int Tracer::check_joins(const Event &e, const ProbeDef &def) {
    if (e.is_return != def.is_return || e.is_watch != def.is_watch) {
        log_error(def.command, Err::DIFF_PROBE_TYPE, 0, 0);
        return -EEXIST;
    }
    const size_t na = e.arg_names.size(), nb = def.args.size();
    for (size_t i = 0; i < std::max(na, nb); ++i) {
        if (i >= na || i >= nb || e.arg_names[i] != def.args[i].name ||
            e.arg_types[i] != type_key(def.args[i].prog.type)) {
            log_error(def.command, Err::DIFF_ARG_TYPE, int(i) + 2, 0);
            return -EEXIST;
        }
    }
    for (auto &p : e.points)
        if (same_point(p->def, def)) {
            log_error(def.command, Err::SAME_PROBE, 0, 0);
            return -EEXIST;
        }
    return 0;
}

std::unique_ptr<Event> Tracer::make_event(const ProbeDef &def, int *r) {
    auto e = std::make_unique<Event>();
    e->group = def.group;
    e->name = def.event;
    e->is_return = def.is_return;
    e->is_watch = def.is_watch;
    e->is_tracepoint = def.is_tracepoint;
    e->is_functions = def.is_function && !def.functions.empty();
    e->entry_args = def.entry_args;
    for (auto &a : def.args) {
        e->progs.push_back(a.prog);
        e->arg_names.push_back(a.name);
        e->arg_types.push_back(type_key(a.prog.type));
    }
    if (def.is_eprobe) e->attached_to = def.symbol;
    e->synthetic = def.is_synthetic;
    const bool bare = def.is_eprobe || def.is_synthetic; // no probe field
    e->fields = bare ? common_fields() : probe_fields(e->is_return);
    const uint32_t base = bare ? kCommonSize : kCommonSize + (e->is_return ? 16u : 8u);
    e->fixed_size = layout_fields(e->progs, e->arg_names, base, &e->fields);
    e->direct = direct_stores(e->progs);
    if (e->fixed_size > kMaxEventSize) {
        log_error(def.command, Err::EVENT_TOO_BIG, 0, 0);
        *r = -E2BIG;
        return nullptr;
    }
    bool symstr = false;
    for (auto &p : e->progs) {
        e->dynamic |= p.type.kind == Kind::kString || p.type.kind == Kind::kSymStr || p.type.kind == Kind::kStack;
        symstr |= p.type.kind == Kind::kSymStr;
    }
    if (symstr) e->symbols = symbol_table(resolver.symbols);
    e->print_fmt = print_fmt_of(*e);
    e->triggers.set_symbolizer([](uint64_t a, bool off) { return symbolize(a, off); });
    e->triggers.set_owner(e->group + "." + e->name);
    return e;
}

// A point's programs for def's arguments, laid out as e's.
std::unique_ptr<PointArgs> point_args(const Event &e, const ProbeDef &def) {
    auto own = std::make_unique<PointArgs>();
    for (const ArgDef &a : def.args) own->progs.push_back(a.prog);
    layout_fields(own->progs, e.arg_names, kCommonSize + 8u, nullptr);
    own->direct = direct_stores(own->progs);
    return own;
}

int Tracer::register_watch(ProbePoint &point, const ProbeDef &def) {
    if (def.addr == kNoWatchAddr) return 0;
    perf_event_attr &attr = point.watch_attr;
    hw_breakpoint_init(&attr);
    attr.bp_addr = def.addr;
    attr.bp_len = def.watch.len;
    attr.bp_type = def.watch.type;
    attr.disabled = 1;
    perf_event **wide = register_wide_hw_breakpoint(&attr, on_watch, &point);
    if (IS_ERR(wide)) {
        const long r = PTR_ERR(wide);
        log_error(def.command,
                  r == -ENOSPC                   ? Err::NO_DEBUG_REG
                  : r == -EBUSY                  ? Err::WATCH_TRACED
                  : r == -ENOENT || r == -ENODEV ? Err::NO_HW_BREAKPOINT
                                                 : Err::FAIL_REG_PROBE,
                  1, 0);
        return int(r);
    }
    point.watch = *wide;
    return 0;
}

int Tracer::register_point(ProbePoint &point, const ProbeDef &def, bool quiet) {
    if (def.is_watch) return register_watch(point, def);
    kprobe &kp = point.hook->rp.kp;
    if (def.where == Where::kSymbol) {
        point.symbol = def.symbol;
        kp.symbol_name = point.symbol.c_str();
        kp.offset = static_cast<unsigned>(def.offset);
    } else {
        kp.addr = reinterpret_cast<kprobe_opcode_t *>(def.addr);
    }
    kp.flags = KPROBE_FLAG_DISABLED;
    int r;
    if (def.is_return) {
        point.hook->rp.handler = on_return;
        // Only for $argN: a kretprobe without one is entered by the core's shortest path
        // (an armed but disabled event then takes an instance, and its return is counted
        // as its entry would be: Event::hit).
        point.hook->rp.entry_handler = def.entry_args.empty() ? nullptr : on_entry;
        point.hook->rp.maxactive = def.maxactive;
        point.hook->rp.data_size = 8 * std::max<size_t>(1, def.entry_args.size());
        r = register_kretprobe(&point.hook->rp);
    } else {
        kp.pre_handler = on_kprobe;
        r = register_kprobe(&kp);
    }
    if (quiet)
        ;
    else if (r == -EILSEQ)
        log_error(def.command, Err::BAD_INSN_BNDRY, 1, 0);
    else if (r == -ENOENT)
        log_error(def.command, Err::BAD_PROBE_ADDR, 1, 0);
    else if (r != 0 && r != -ENOMEM && r != -EEXIST)
        log_error(def.command, Err::FAIL_REG_PROBE, 1, 0);
    return r;
}

// A synthetic field's type, as histogram.rst's synthetic events take them.
bool synth_type(std::string_view name, ArgType *t) {
    static constexpr struct {
        const char *name;
        Kind kind;
        uint8_t size;
    } kTypes[] = {{"u8", Kind::kUnsigned, 1},  {"s8", Kind::kSigned, 1},
                  {"u16", Kind::kUnsigned, 2}, {"s16", Kind::kSigned, 2},
                  {"u32", Kind::kUnsigned, 4}, {"s32", Kind::kSigned, 4},
                  {"u64", Kind::kUnsigned, 8}, {"s64", Kind::kSigned, 8},
                  {"int", Kind::kSigned, 4},   {"unsigned int", Kind::kUnsigned, 4},
                  {"long", Kind::kSigned, 8},  {"unsigned long", Kind::kUnsigned, 8},
                  {"pid_t", Kind::kSigned, 4}, {"bool", Kind::kUnsigned, 1},
                  {"char", Kind::kSigned, 1},  {"unsigned char", Kind::kUnsigned, 1},
                  {"gfp_t", Kind::kHex, 4}};
    for (const auto &k : kTypes)
        if (name == k.name) {
            t->kind = k.kind;
            t->size = k.size;
            t->name = k.name;
            return true;
        }
    return false;
}

int Tracer::define_synthetic(std::string_view line, bool dynamic) {
    const std::string command(line);
    const auto log = [&](const char *msg, size_t pos) {
        errors.add_text("synthetic_events", command, msg, int(pos));
        return -EINVAL;
    };
    size_t at = 0;
    if (dynamic) {
        at = 2;
        if (line.substr(at, 10) == "synthetic/") at += 10;
    }
    const bool remove = !dynamic && line.substr(0, 1) == "!";
    at += remove ? 1 : 0;
    const size_t name_end = std::min(line.find(' ', at), line.size());
    const std::string name(line.substr(at, name_end - at));
    if (!is_good_name(name)) return log("Illegal name", at);
    if (remove) {
        Event *e = find("synthetic", name);
        if (e == nullptr) return -ENOENT;
        return this->remove(e);
    }
    if (find("synthetic", name) != nullptr) return log("Event already exists", at);
    ProbeDef def;
    def.group = "synthetic";
    def.event = name;
    def.command = command;
    std::string text;
    std::vector<std::string> c_types;
    for (size_t start = name_end; start < line.size();) {
        const size_t semi = std::min(line.find(';', start), line.size());
        std::string_view f = line.substr(start, semi - start);
        const size_t lead = f.find_first_not_of(' ');
        if (lead == std::string_view::npos) {
            start = semi + 1;
            continue;
        }
        const size_t f_at = start + lead;
        f = f.substr(lead);
        while (!f.empty() && f.back() == ' ') f.remove_suffix(1);
        const size_t sp = f.rfind(' ');
        if (sp == std::string_view::npos) return log("Incomplete type", f_at);
        std::string type(f.substr(0, sp));
        while (!type.empty() && type.back() == ' ') type.pop_back();
        std::string field(f.substr(sp + 1));
        ArgDef a;
        // A string: `char NAME[N]` or `char NAME[]`, as histogram.rst's `char comm[16]`.
        // Either is kept as the kernel keeps a synthetic string, up to STR_VAR_LEN_MAX
        // bytes (N does not cut it there either), in the record a __data_loc string.
        const std::string declared = type + " " + field;
        // A stack: a type with "long[" (`unsigned long[] stack`, `long stack[]`), as the
        // kernel's synth_field_is_stack(); in the record a __data_loc array of addresses.
        const size_t field_bracket = field.find('[');
        const std::string full_type = field_bracket == std::string::npos ? type : type + field.substr(field_bracket);
        if (const size_t lb = full_type.find("long["); lb != std::string::npos) {
            const std::string_view n = std::string_view(full_type).substr(lb + 5);
            if (n.empty() || n.back() != ']' || n.find_first_not_of("0123456789") != n.size() - 1)
                return log("Invalid type", f_at);
            if (field_bracket != std::string::npos) field.resize(field_bracket);
            a.prog.type.kind = Kind::kStack;
            a.prog.type.size = 4;
            a.prog.type.name = full_type;
        } else if (const size_t bracket = field.find('['); bracket != std::string::npos) {
            const std::string_view len = std::string_view(field).substr(bracket + 1);
            const std::string_view size = len.substr(0, len.empty() ? 0 : len.size() - 1); // "16" of "16]", "" of "]"
            const bool digits = !len.empty() && len.back() == ']' && size.size() <= 3 &&
                                size.find_first_not_of("0123456789") == std::string_view::npos;
            const unsigned long n = digits && !size.empty() ? std::stoul(std::string(size)) : 0;
            if (type != "char" || !digits || n > kMaxSynthString || (!size.empty() && n == 0))
                return log("Invalid type", f_at);
            field.resize(bracket);
            a.prog.type.kind = Kind::kString;
            a.prog.type.size = 4;
            a.prog.type.name = "string";
            a.prog.max_string = kMaxSynthString;
        } else if (!synth_type(type, &a.prog.type)) {
            return log("Invalid type", f_at);
        }
        if (!is_good_name(field)) return log("Invalid field", f_at + sp + 1);
        for (const ArgDef &o : def.args)
            if (o.name == field) return log("Invalid field", f_at + sp + 1);
        if (def.args.size() == kMaxActionFields) return log("Too many fields", f_at);
        a.name = field;
        // The value the hist action passes, 8 bytes each, stored at the field's type (a
        // string's: its address, the string copied from there).
        a.prog.ops[0] = FetchOp{Op::kField, false, 8, int64_t(8 * def.args.size())};
        a.prog.nops = 1;
        a.prog.store = a.prog.type.kind == Kind::kString  ? Store::kString
                       : a.prog.type.kind == Kind::kStack ? Store::kStack
                                                          : Store::kRaw;
        text += (text.empty() ? "" : "; ") + declared;
        // A string's and a stack's stay as the layout makes them: __data_loc TYPE.
        c_types.push_back(a.prog.type.kind == Kind::kString || a.prog.type.kind == Kind::kStack ? std::string() : type);
        def.args.push_back(std::move(a));
        start = semi + 1;
    }
    if (def.args.empty()) return log("Command must be of the form: <name> field[;field] ...", name_end);
    if (next_id == UINT16_MAX) return -ENOSPC;
    int r = 0;
    def.is_synthetic = true;
    std::unique_ptr<Event> e = make_event(def, &r);
    if (e == nullptr) return r;
    for (size_t i = 0; i < c_types.size(); ++i)
        if (!c_types[i].empty()) e->fields[4 + i].c_type = c_types[i];
    // Each field in a u64 slot of its own, as the kernel's synth_event_define_fields() lays
    // them out (a string's and a stack's slot holds their __data_loc word).
    uint32_t slot = kCommonSize;
    for (size_t i = 0; i < e->progs.size(); ++i, slot += 8) e->progs[i].offset = e->fields[4 + i].offset = slot;
    e->fixed_size = slot;
    e->print_fmt = print_fmt_of(*e);
    e->synth_text = text;
    e->sink = std::make_unique<SynthEvent>(e.get());
    e->id = next_id++;
    by_id[e->id] = e.get();
    events.push_back(std::move(e));
    publish_profile();
    return 0;
}

int Tracer::define_eprobe(std::unique_ptr<ProbeDef> def, bool enable) {
    if (find(def->group, def->event) != nullptr) {
        log_error(def->command, Err::EVENT_EXIST, 0, 0);
        return -EEXIST;
    }
    const size_t dot = def->symbol.find('.');
    Event *src = find(std::string_view(def->symbol).substr(0, dot), std::string_view(def->symbol).substr(dot + 1));
    size_t slot = Event::kMaxAttached;
    for (size_t i = 0; src != nullptr && i < Event::kMaxAttached && slot == Event::kMaxAttached; ++i)
        if (src->attached[i].load() == nullptr) slot = i;
    if (src == nullptr || slot == Event::kMaxAttached || next_id == UINT16_MAX) {
        log_error(def->command, src == nullptr ? Err::BAD_ATTACH_EVENT : Err::FAIL_REG_PROBE, 1, 0);
        return src == nullptr ? -ENOENT : -ENOSPC;
    }
    int r = 0;
    std::unique_ptr<Event> fresh = make_event(*def, &r);
    if (fresh == nullptr) return r;
    fresh->source = src;
    // No probe of its own: a point holds the definition, for dynamic_events.
    auto point = std::make_unique<ProbePoint>();
    point->event = fresh.get();
    point->hook->point = point.get();
    point->def = std::move(*def);
    fresh->points.push_back(std::move(point));
    Event *e = fresh.get();
    e->id = next_id++;
    by_id[e->id] = e;
    events.push_back(std::move(fresh));
    // Its source's hits feed it from here on: it is whole before it is published.
    src->attached[slot].store(e, std::memory_order_release);
    src->nattached.fetch_add(1, std::memory_order_release);
    publish_profile();
    if (enable) return set_enabled(e, true);
    arm(e);
    return 0;
}

// Unregisters the registered probes of `points` (not watches) in one call: one grace
// period for them all (an event over a library has thousands).
void unregister_points(const std::vector<std::unique_ptr<ProbePoint>> &points, bool is_return) {
    std::vector<kprobe *> kps;
    std::vector<kretprobe *> rps;
    for (const auto &p : points) {
        if (!p->registered || p->def.is_watch) continue;
        if (is_return)
            rps.push_back(&p->hook->rp);
        else
            kps.push_back(&p->hook->rp.kp);
        p->registered = false;
    }
    if (!kps.empty()) unregister_kprobes(kps.data(), static_cast<int>(kps.size()));
    if (!rps.empty()) unregister_kretprobes(rps.data(), static_cast<int>(rps.size()));
}

int Tracer::define(std::string_view line, char separator, bool enable) {
    if (line.substr(0, 2) == "s:" && separator == ' ') return define_synthetic(line, true);
    resolver.symbols.refresh();
    auto def = std::make_unique<ProbeDef>();
    ProbeError err;
    int r = parse_definition(line, resolver, def.get(), &err, separator);
    if (r != 0) {
        if (err.logged) errors.add(log_source(def->command), def->command, err);
        return r;
    }
    if (def->remove) {
        Event *e = find(def->group, def->event);
        if (e == nullptr) return -ENOENT;
        return remove(e);
    }
    if (def->is_eprobe) return define_eprobe(std::move(def), enable);
    Event *e = find(def->group, def->event);
    std::unique_ptr<Event> fresh;
    const bool many = def->is_tracepoint || !def->functions.empty();
    if (e != nullptr && (many || e->is_tracepoint || e->is_functions || e->synthetic || e->source != nullptr)) {
        // A tracepoint's event has its sites, a glob's its functions, an e: or synthetic
        // event no probe: nothing joins it, and it joins nothing.
        log_error(def->command, Err::EVENT_EXIST, 0, 0);
        return -EEXIST;
    }
    if (e != nullptr) {
        // Another probe point under an existing event: its arguments must agree.
        if ((r = check_joins(*e, *def)) != 0) return r;
    } else {
        // The ids are checked before the probe is registered: nothing is half-applied.
        if (next_id == UINT16_MAX) {
            log_error(def->command, Err::FAIL_REG_PROBE, 0, 0);
            return -ENOSPC;
        }
        fresh = make_event(*def, &r);
        if (fresh == nullptr) return r;
        e = fresh.get();
    }

    // One point; or one per site of a tracepoint (each with its own arguments' programs),
    // or per function of a glob (a function that cannot be probed is passed over, as the
    // kernel's fprobe passes over what ftrace cannot hook).
    std::vector<std::unique_ptr<ProbePoint>> made;
    std::vector<Resolver::Function> functions = std::move(def->functions);
    const size_t npoints = def->is_tracepoint ? def->sites.size() : std::max<size_t>(1, functions.size());
    if (npoints > 1) {
        // Their jump verdicts decided ahead, on two cores (the registrations then find them).
        std::vector<uint64_t> addrs;
        for (size_t i = 0; i < npoints; ++i)
            addrs.push_back(def->is_tracepoint ? def->sites[i].addr : functions[i].addr);
        core::plan_jumps(addrs);
    }
    std::optional<core::ArmBatch> batch; // many points: their code written as one batch
    if (npoints > 1) batch.emplace();
    size_t passed = 0;
    for (size_t i = 0; i < npoints; ++i) {
        auto point = std::make_unique<ProbePoint>();
        point->event = e;
        point->hook->point = point.get();
        if (i > 0 || !functions.empty()) {
            point->def = *def;
            if (i > 0 && def->is_tracepoint) {
                point->def.addr = def->sites[i].addr;
                point->def.ref_ctr_addr = def->sites[i].semaphore;
                point->def.args = def->site_args[i - 1];
                point->own_args = point_args(*e, point->def);
            }
        }
        if (!functions.empty()) {
            point->def.addr = functions[i].addr;
            point->def.symbol = std::move(functions[i].name);
        }
        // An SDT site is a nop the assembler put there: an instruction's start even where no
        // symbol tells the function around it (a stripped program).
        if (def->is_tracepoint) core::declare_instruction_boundary(def->sites[i].addr);
        const ProbeDef &pdef = i > 0 || !functions.empty() ? point->def : *def;
        r = register_point(*point, pdef, !functions.empty());
        if (r != 0 && !functions.empty() && r != -ENOMEM) {
            ++passed;
            continue;
        }
        if (r != 0) {
            unregister_points(made, e->is_return); // nothing half-applied
            return r;
        }
        point->registered = true;
        made.push_back(std::move(point));
    }
    if (made.empty()) { // no function of the glob could be probed
        log_error(def->command, Err::FAIL_REG_PROBE, 1, 0);
        return r;
    }
    if (!functions.empty()) {
        // The definition's text stays the event's (the first point's), with the glob.
        def->addr = made[0]->def.addr;
        e->functions_passed += passed;
    }
    made[0]->def = std::move(*def);
    for (auto &m : made) e->points.push_back(std::move(m));
    if (fresh) {
        fresh->id = next_id++;
        by_id[fresh->id] = fresh.get();
        events.push_back(std::move(fresh));
    }
    publish_profile();
    if (enable) return set_enabled(e, true);
    arm(e);
    return 0;
}

int Tracer::remove(Event *e) {
    // In use: enabled, with triggers, with e: events on it, fired by a hist action (the
    // kernel's -EBUSY).
    if (e->enabled.load() || !e->triggers.empty() || e->nattached.load() != 0 ||
        (e->sink != nullptr && e->sink->users.load() != 0))
        return -EBUSY;
    if (Event *src = e->source; src != nullptr) {
        for (auto &a : src->attached)
            if (a.load() == e) a.store(nullptr, std::memory_order_release);
        src->nattached.fetch_sub(1, std::memory_order_release);
        arm(src); // it may not be wanted any more
    }
    for (auto &p : e->points) {
        if (!p->registered) continue;
        if (p->semaphore_held) {
            __atomic_sub_fetch(reinterpret_cast<uint16_t *>(p->def.ref_ctr_addr), 1, __ATOMIC_RELAXED);
            p->semaphore_held = false;
        }
        if (e->is_watch) {
            if (p->watch != nullptr) unregister_hw_breakpoint(p->watch);
            p->watch = nullptr;
            p->registered = false;
        }
    }
    unregister_points(e->points, e->is_return);
    auto it = std::find_if(events.begin(), events.end(), [&](auto &x) { return x.get() == e; });
    graveyard.push_back(std::move(*it));
    events.erase(it);
    publish_profile();
    return 0;
}

// What kprobe_profile sums (profile_text), as addresses: the table a child of fork()
// gives `ukprobe run`, which cannot ask it (it serves no socket).
void Tracer::publish_profile() {
    ProfileTableBuilder b;
    for (const auto &e : events) {
        b.add_event(e->name);
        e->counts->describe(b);
        for (const auto &p : e->points) {
            b.add_counter(&p->hook->rp.kp.nmissed, sizeof p->hook->rp.kp.nmissed, 1, 0, true);
            if (e->is_return) b.add_counter(&p->hook->rp.nmissed, sizeof p->hook->rp.nmissed, 1, 0, true);
        }
    }
    ring_publish_profile(counters_publish_table(b.finish()));
}

int Tracer::set_enabled(Event *e, bool on) {
    if (on) {
        if (int r = ring_init(); r != 0) return r;
        e->enabled.store(true); // then armed: no hit before its flag
        arm(e);
        return 0;
    }
    // Off: the points first, then the hits already in the handler finish (recorded), then
    // the flag, as the kernel's disable_trace_kprobe waits for a grace period. A hit
    // counted in kprobe_profile after the flag went down would record nothing: the
    // profile and the trace must agree. (An e: event's source asks the flag: it goes
    // first.)
    if (e->source != nullptr) {
        e->enabled.store(false);
        arm(e);
        return 0;
    }
    arm_as(e, e->trigger_target || !e->triggers.empty());
    core::wait_for_hits_in_flight();
    e->enabled.store(false);
    return 0;
}

// --- values ----------------------------------------------------------------------------

} // namespace

void SynthSink::fire(const uint64_t *values, size_t n, const struct pt_regs *regs) noexcept {
    static_cast<SynthEvent *>(this)->event()->synth_hit(values, n, regs);
}

std::string symbolize(uint64_t addr, bool with_size) {
    static std::mutex mu;
    static sym::Registry *reg = new sym::Registry; // never destroyed: printers run at exit
    static auto *texts = new SymbolTexts;
    std::lock_guard lock(mu);
    if (const std::string *known = texts->find(addr, with_size)) return *known;
    if (reg->objects().empty()) reg->refresh();
    std::string text = symbol_text(reg->objects(), addr, with_size);
    if (text.empty()) {
        reg->refresh(); // an object loaded since
        texts->clear();
        text = symbol_text(reg->objects(), addr, with_size);
    }
    if (text.empty()) return hex_address(addr);
    texts->keep(addr, with_size, text);
    return text;
}

void print_event(const uint8_t *rec, uint32_t size, std::string &out) {
    const EventLookup find = [](uint16_t id) -> const EventInfo * {
        Tracer &t = tracer();
        std::lock_guard lock(t.mu);
        auto it = t.by_id.find(id);
        // Events are never freed (removed ones stay in the graveyard).
        return it != t.by_id.end() ? it->second : nullptr;
    };
    print_record(rec, size, find, symbolize, out);
}

std::string kprobes_list_text() {
    std::vector<const kprobe *> hidden;
    std::string rows;
    {
        Tracer &t = tracer();
        std::lock_guard lock(t.mu);
        for (const auto &e : t.events) {
            if (!e->is_functions) continue;
            size_t n = 0, optimized = 0;
            for (const auto &p : e->points) {
                if (!p->registered) continue;
                const kprobe &kp = p->hook->rp.kp;
                hidden.push_back(&kp);
                ++n;
                optimized += (__atomic_load_n(&kp.flags, __ATOMIC_RELAXED) & KPROBE_FLAG_OPTIMIZED) != 0;
            }
            const ProbeDef &def = e->points.front()->def;
            char addr[24];
            std::snprintf(addr, sizeof addr, "%016" PRIx64, def.addr);
            rows += std::string(addr) + "  f  " + def.symbol + (e->is_return ? "%return" : "") + "  " + e->group + "/" +
                    e->name + " " + std::to_string(n) + " functions, " + std::to_string(optimized) + " [OPTIMIZED]";
            if (e->functions_passed != 0) rows += ", " + std::to_string(e->functions_passed) + " passed over";
            rows += e->armed_wanted() ? "\n" : " [DISABLED]\n";
        }
    }
    std::sort(hidden.begin(), hidden.end());
    return core::kprobes_list_without(hidden) + rows;
}

std::vector<Field> event_fields(std::string_view group, std::string_view event) {
    Tracer &t = tracer();
    std::lock_guard lock(t.mu);
    Event *e = t.find(group, event);
    return e != nullptr ? e->fields : std::vector<Field>{};
}

// --- files -----------------------------------------------------------------------------

namespace {

std::string strip(std::string_view s) {
    while (!s.empty() && (s.back() == '\n' || s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
    return std::string(s);
}

// Lines of a definitions file, comments removed.
int write_definitions(Tracer &t, std::string_view text, bool truncate) {
    if (truncate) {
        for (auto &e : t.events)
            if (e->enabled.load() || !e->triggers.empty()) return -EBUSY;
        while (!t.events.empty())
            if (t.remove(t.events.back().get()) != 0) return -EBUSY; // e: events go before their sources
    }
    size_t start = 0;
    while (start <= text.size()) {
        size_t nl = text.find('\n', start);
        if (nl == std::string_view::npos) nl = text.size();
        std::string_view line = text.substr(start, nl - start);
        const size_t hash = line.find('#');
        if (hash != std::string_view::npos) line = line.substr(0, hash);
        const std::string l = strip(line);
        if (!l.empty()) {
            if (int r = t.define(l, ' ', false); r != 0) return r;
        }
        start = nl + 1;
    }
    return 0;
}

std::string definitions_text(Tracer &t) {
    std::string s;
    for (auto &e : t.events) {
        if (e->synthetic) s += "s:synthetic/" + e->name + " " + e->synth_text + "\n";
        for (auto &p : e->points) {
            s += p->def.show() + "\n";
            if (e->is_tracepoint || e->is_functions) break; // one line for all its sites
        }
    }
    return s;
}

// The synthetic_events file: "NAME TYPE FIELD; TYPE FIELD" a line.
std::string synthetic_text(Tracer &t) {
    std::string s;
    for (auto &e : t.events)
        if (e->synthetic) s += e->name + " " + e->synth_text + "\n";
    return s;
}

// Lines written to synthetic_events; a truncating write first removes every synthetic
// event (-EBUSY, nothing removed, while one is in use).
int write_synthetic(Tracer &t, std::string_view text, bool truncate) {
    if (truncate) {
        for (auto &e : t.events)
            if (e->synthetic &&
                (e->enabled.load() || !e->triggers.empty() || e->sink->users.load() != 0 || e->nattached.load() != 0))
                return -EBUSY;
        for (size_t i = t.events.size(); i-- > 0;)
            if (t.events[i]->synthetic) t.remove(t.events[i].get());
    }
    for (size_t start = 0; start <= text.size();) {
        const size_t nl = std::min(text.find('\n', start), text.size());
        const std::string l = strip(text.substr(start, nl - start));
        if (!l.empty())
            if (int r = t.define_synthetic(l, false); r != 0) return r;
        start = nl + 1;
    }
    return 0;
}

// Every event records may name, removed ones too, in id order.
std::string event_table_locked(Tracer &t) {
    std::vector<const EventInfo *> all;
    for (const auto &[id, e] : t.by_id) all.push_back(e);
    return event_table_text(all);
}

std::string profile_text(Tracer &t) {
    std::string s;
    for (auto &e : t.events) s += profile_line(e->name, e->counts->load_hits(), e->misses());
    return s;
}

struct EventPath {
    std::string group, event, file; // event empty: events/GRP/file; group empty: events/file
};

bool split_event_path(std::string_view path, EventPath *p) {
    if (path.substr(0, 7) != "events/") return false;
    std::vector<std::string> parts;
    std::string_view rest = path.substr(7);
    while (!rest.empty()) {
        const size_t slash = rest.find('/');
        parts.emplace_back(rest.substr(0, slash));
        if (slash == std::string_view::npos) break;
        rest = rest.substr(slash + 1);
    }
    if (parts.size() == 1) {
        p->file = parts[0];
        return true;
    }
    if (parts.size() == 2) {
        p->group = parts[0];
        p->file = parts[1];
        return true;
    }
    if (parts.size() == 3) {
        p->group = parts[0];
        p->event = parts[1];
        p->file = parts[2];
        return true;
    }
    return false;
}

std::string normalize(std::string_view path) {
    while (!path.empty() && path.front() == '/') path.remove_prefix(1);
    for (std::string_view root : {"sys/kernel/tracing/", "sys/kernel/debug/tracing/"})
        if (path.substr(0, root.size()) == root) path.remove_prefix(root.size());
    return std::string(path);
}

// mode: 0 read, 1 truncating write, 2 append (file_op's).
int event_file(Tracer &t, const EventPath &p, std::string_view text, int mode, std::string *out) {
    const bool write = mode != 0;
    std::vector<Event *> targets;
    for (auto &e : t.events)
        if ((p.group.empty() || e->group == p.group) && (p.event.empty() || e->name == p.event))
            targets.push_back(e.get());
    if (!p.group.empty() && targets.empty()) return -ENOENT;
    if (p.file == "enable") {
        if (!write) {
            bool any_on = false, any_off = false;
            for (Event *e : targets) (e->enabled.load() ? any_on : any_off) = true;
            *out = any_on && any_off ? "X\n" : any_on ? "1\n" : "0\n";
            return 0;
        }
        const std::string v = strip(text);
        if (v != "0" && v != "1") return -EINVAL;
        for (Event *e : targets)
            if (int r = t.set_enabled(e, v == "1"); r != 0) return r;
        return 0;
    }
    if (p.event.empty()) return -ENOENT;
    Event *e = targets.front();
    if (p.file == "id") {
        if (write) return -EACCES;
        *out = std::to_string(e->id) + "\n";
        return 0;
    }
    if (p.file == "format") {
        if (write) return -EACCES;
        *out = format_text(*e);
        return 0;
    }
    if (p.file == "filter") {
        if (!write) {
            const Filter *f = e->filter.load();
            *out = f != nullptr ? f->text() + "\n" : "none\n";
            return 0;
        }
        const std::string v = strip(text);
        if (v.empty() || v == "0") {
            e->filter.store(nullptr);
            return 0;
        }
        FilterError err;
        std::unique_ptr<Filter> f = compile_filter(v, e->fields, &err);
        if (f == nullptr) {
            t.errors.add_text("event filter parse error", v, err.message, err.pos);
            return -EINVAL;
        }
        e->filter.store(f.get());
        e->filters.push_back(std::move(f));
        return 0;
    }
    if (p.file == "trigger") {
        if (!write) {
            *out = e->triggers.text();
            return 0;
        }
        // Opened to truncate, the file drops the event's hist, enable_hist and disable_hist
        // triggers first, as the kernel's hist_unreg_all() and hist_enable_unreg_all() (not
        // while another trigger reads a variable of one of them).
        if (mode == 1) e->triggers.remove_hists();
        FilterError err;
        const std::string cmd = strip(text);
        if (cmd.rfind("snapshot", 0) == 0) {
            // The snapshot trigger swaps buffers from the hit: the spare must exist first.
            if (int r = snapshot_alloc(); r != 0) return r;
        }
        const int r = e->triggers.write(cmd, e->fields, t, &err);
        // A hist trigger's error is logged at "hist:GRP:EVENT", as the kernel's hist_err().
        std::string_view command = cmd;
        while (!command.empty() && (command[0] == '!' || command[0] == ' ' || command[0] == '\t'))
            command.remove_prefix(1);
        const std::string where = command.starts_with("hist:") || command.starts_with("hist ") || command == "hist"
                                      ? "hist:" + e->group + ":" + e->name
                                      : "event trigger parse error";
        if (r != 0 && !err.message.empty()) t.errors.add_text(where, cmd, err.message, err.pos);
        t.arm(e);
        return r;
    }
    if (p.file == "hist") {
        if (write) return -EACCES;
        *out = e->triggers.hist_text();
        return 0;
    }
    return -ENOENT;
}

int file_op(std::string_view raw_path, std::string_view text, int mode, std::string *out) {
    // mode: 0 read, 1 truncating write, 2 append
    Tracer &t = tracer();
    const std::string path = normalize(raw_path);
    const bool write = mode != 0;
    if (path == "trace" || path == "trace_pipe" || path == "snapshot") {
        if (path == "trace") {
            if (write) {
                ring_clear();
                return 0;
            }
            *out = trace_text(print_event);
            return 0;
        }
        if (path == "trace_pipe") {
            if (write) return -EACCES;
            *out = trace_pipe_read(print_event, kPipeWaitMs, 1 << 20);
            return 0;
        }
        if (!write) {
            *out = snapshot_text(print_event);
            return 0;
        }
        const std::string v = strip(text);
        if (v == "0")
            snapshot_free();
        else if (v == "1")
            return snapshot_take();
        else if (v == "2")
            snapshot_clear();
        else
            return -EINVAL;
        return 0;
    }
    std::lock_guard lock(t.mu);
    if (path == "kprobe_events" || path == "dynamic_events") {
        if (!write) {
            *out = definitions_text(t);
            return 0;
        }
        return write_definitions(t, text, mode == 1);
    }
    if (path == "synthetic_events") {
        if (!write) {
            *out = synthetic_text(t);
            return 0;
        }
        return write_synthetic(t, text, mode == 1);
    }
    if (path == "kprobe_profile") {
        if (write) return -EACCES;
        *out = profile_text(t);
        return 0;
    }
    if (path == "event_table") {
        // What a reader in another process needs to print records (print.hpp).
        if (write) return -EACCES;
        *out = event_table_locked(t);
        return 0;
    }
    if (path == "records_formatted") {
        // Records this process printed as trace text (the CLI formats its own: docs/cli.md).
        if (write) return -EACCES;
        *out = std::to_string(records_formatted()) + "\n";
        return 0;
    }
    if (path == "available_events") {
        // "GRP:EVENT" a line, as tracefs lists them: what events/ holds (ukprobe mount's readdir).
        if (write) return -EACCES;
        for (auto &e : t.events) *out += e->group + ":" + e->name + "\n";
        return 0;
    }
    if (path == "available_tracepoints") {
        // The SDT probes of the loaded objects, as a t: definition names them:
        // "MOD:PROVIDER:NAME", once however many sites it has.
        if (write) return -EACCES;
        t.resolver.symbols.refresh();
        std::set<std::string> seen;
        for (const sym::Object *obj : t.resolver.symbols.objects_named(""))
            for (const sym::SdtProbe &p : sym::sdt_probes(*obj)) {
                std::string line = obj->name + ":" + p.provider + ":" + p.name + "\n";
                if (seen.insert(line).second) *out += line;
            }
        return 0;
    }
    if (path == "error_log") {
        if (write) {
            t.errors.clear();
            return 0;
        }
        *out = t.errors.text();
        return 0;
    }
    if (path == "tracing_on") {
        if (!write) {
            *out = tracing_on() ? "1\n" : "0\n";
            return 0;
        }
        const std::string v = strip(text);
        char *end = nullptr;
        const long n = std::strtol(v.c_str(), &end, 10);
        if (v.empty() || *end != '\0') return -EINVAL;
        set_tracing_on(n != 0);
        return 0;
    }
    if (path == "buffer_size_kb") {
        if (!write) {
            *out = std::to_string(buffer_size_kb()) + "\n";
            return 0;
        }
        const std::string v = strip(text);
        char *end = nullptr;
        const unsigned long long n = std::strtoull(v.c_str(), &end, 10);
        if (v.empty() || *end != '\0' || n == 0) return -EINVAL;
        return set_buffer_size_kb(n);
    }
    EventPath ep;
    if (split_event_path(path, &ep)) return event_file(t, ep, text, mode, out);
    return -ENOENT;
}

} // namespace

int file_read(std::string_view path, std::string *out) {
    out->clear();
    return file_op(path, {}, 0, out);
}

int file_write(std::string_view path, std::string_view text) {
    std::string ignored;
    return file_op(path, text, 1, &ignored);
}

int file_append(std::string_view path, std::string_view text) {
    std::string ignored;
    return file_op(path, text, 2, &ignored);
}

std::string pipe_read(int timeout_ms, size_t max_bytes) { return trace_pipe_read(print_event, timeout_ms, max_bytes); }

int apply_startup_events(std::string_view spec) {
    Tracer &t = tracer();
    std::lock_guard lock(t.mu);
    int first = 0;
    size_t start = 0;
    while (start <= spec.size()) {
        size_t semi = spec.find(';', start);
        if (semi == std::string_view::npos) semi = spec.size();
        const std::string def = strip(spec.substr(start, semi - start));
        if (!def.empty()) {
            const int r = t.define(def, ',', true);
            if (r != 0 && first == 0) first = r;
        }
        start = semi + 1;
    }
    return first;
}

bool hit_handlers_lean() {
    for (const void *fn : hit_handlers())
        if (!core::handler_is_lean(fn)) return false;
    return true;
}

} // namespace ukp::trace
