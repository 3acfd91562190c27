#include "trace/trigger.hpp"
#include "core/agent.hpp"
#include "platform/vector_state.hpp"

#include <algorithm>
#include <cctype>
#include <climits>
#include <cerrno>
#include <cstdlib>

namespace ukp::trace {

namespace {

// What a trigger does on a hit: fire()'s switch, not a call through the command table (an
// indirect call would end the scan that proves the hit path lean).
enum class Kind : uint8_t {
    kTraceOn,
    kTraceOff,
    kStacktrace,
    kSnapshot,
    kEnableEvent,
    kDisableEvent,
    kEnableHist,
    kDisableHist,
    kHist,
    kSetWatch,
    kClearWatch
};

// What a command's reg and unreg did to the list, when not a negative errno.
constexpr int kUnchanged = 0, kChanged = 1;

// One trigger command, as the kernel's struct event_command: adding a command is one entry
// of kCommands (and its action on a hit, a case of fire()).
struct Command {
    const char *name;
    Kind kind;
    // The kernel's trigger type: traceon and traceoff share one, as do enable_event and
    // disable_event (per target event); a second trigger of a type is -EEXIST.
    uint8_t type;
    // Whether what follows the command is always its parameter; else text that does not
    // start with a digit is the filter.
    bool param_required;
    // Parses the parameter (at pos in what was written) into t and takes the filter (null:
    // none); 0, or -EINVAL with *err.
    int (*parse)(Trigger &t, std::string_view param, int pos, std::unique_ptr<Filter> filter,
                 const std::vector<Field> &fields, FilterError *err);
    // Whether installed trigger o, of t's type, is the one t names (what "!" removes).
    bool (*same)(const Trigger &o, const Trigger &t);
    // Puts t into items, `same` being the installed trigger it names (or null); kChanged,
    // kUnchanged, or a negative errno with *err (pos: where the command starts).
    int (*reg)(Trigger *t, Trigger *same, std::vector<Trigger *> &items, int pos, FilterError *err);
    // Takes `same` (or null) out of items: kChanged or kUnchanged.
    int (*unreg)(Trigger *same, std::vector<Trigger *> &items);
    // The trigger file's line of t, without its newline.
    std::string (*print)(const Trigger &t);
};

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

std::string_view trim(std::string_view s) {
    while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
    while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
    return s;
}

// kstrtoul with base 0.
bool parse_count(std::string_view s, long *out) {
    if (s.empty() || !isdigit((unsigned char)s[0])) return false;
    const std::string num(s);
    char *end = nullptr;
    errno = 0;
    const unsigned long long v = strtoull(num.c_str(), &end, 0);
    if (errno || *end || v > uint64_t(LONG_MAX)) return false;
    *out = long(v);
    return true;
}

int fail(FilterError *err, int rc, const char *msg, int pos) {
    if (err) *err = {msg, pos, rc};
    return rc;
}

} // namespace

struct Trigger {
    const Command *cmd = nullptr;      // its command's entry in kCommands
    Kind kind;                         // cmd->kind, where fire() reads it
    std::atomic<long> count{-1};       // remaining hits that act; -1: unlimited
    std::unique_ptr<Filter> filter;    // null: every hit (hist keeps its own)
    std::string system, event;         // enable_event/disable_event target
    std::atomic<bool> *flag = nullptr; // the target's enable flag
    TriggerSet *hist_target = nullptr; // enable_hist/disable_hist: the target's triggers
    std::unique_ptr<HistTrigger> hist; // kHist
    TriggerHost *host = nullptr;
    std::string owner;           // the event whose trigger file holds it: "GRP.EVENT"
    bool removing = false;       // written as "!COMMAND..."
    WatchMover *mover = nullptr; // kSetWatch, kClearWatch: the w: event (`event`) they move
    std::string field;           // the record's field holding the address ("" for a clear of any)
    uint32_t field_offset = 0;   // where it is in the record (8 bytes)
    int64_t adjust = 0;          // FIELD+|-ADJUST

    // Takes one from the count; false when it is used up.
    bool take() noexcept {
        long v = count.load(std::memory_order_relaxed);
        for (;;) {
            if (v == 0) return false;
            if (v < 0) return true;
            if (count.compare_exchange_weak(v, v - 1, std::memory_order_relaxed)) return true;
        }
    }

    std::string text() const { return cmd->print(*this); }
};

struct TriggerList {
    std::vector<Trigger *> items; // in the order the trigger file lists them
};

namespace {

// ---- The commands' operations ----

// "N[:...]", the count of traceon, traceoff, snapshot and stacktrace; empty: unlimited.
int parse_count_param(Trigger &t, std::string_view param, int pos, std::unique_ptr<Filter> filter,
                      const std::vector<Field> &, FilterError *err) {
    if (!param.empty()) {
        long n;
        if (!parse_count(param.substr(0, param.find(':')), &n)) return fail(err, -EINVAL, "Invalid count", pos);
        t.count.store(n);
    }
    t.filter = std::move(filter);
    return 0;
}

// "SYSTEM:EVENT[:N]" of enable_event and disable_event: the target's enable flag, looked up
// now (the host arms the target), and the count; of enable_hist and disable_hist: the
// target's triggers, and the count.
int parse_event_param(Trigger &t, std::string_view param, int pos, std::unique_ptr<Filter> filter,
                      const std::vector<Field> &, FilterError *err) {
    const size_t c1 = param.find(':');
    if (c1 == std::string_view::npos) return fail(err, -EINVAL, "Expecting SYSTEM:EVENT", pos);
    t.system = std::string(param.substr(0, c1));
    std::string_view after = param.substr(c1 + 1);
    const size_t c2 = after.find(':');
    t.event = std::string(after.substr(0, c2));
    if (t.system.empty() || t.event.empty()) return fail(err, -EINVAL, "Expecting SYSTEM:EVENT", pos);
    if (c2 != std::string_view::npos) {
        std::string_view num = after.substr(c2 + 1);
        num = num.substr(0, num.find(':'));
        long n;
        if (!parse_count(num, &n)) return fail(err, -EINVAL, "Invalid count", pos + int(c1 + 1 + c2 + 1));
        t.count.store(n);
    }
    if (t.kind == Kind::kEnableHist || t.kind == Kind::kDisableHist) {
        t.hist_target = t.host->event_triggers(t.system, t.event);
        if (!t.hist_target) return fail(err, -EINVAL, "No such event", pos);
    } else {
        t.flag = t.host->event_enable_flag(t.system, t.event);
        if (!t.flag) return fail(err, -EINVAL, "No such event", pos);
    }
    t.filter = std::move(filter);
    return 0;
}

// "keys=...[:...]": the hist trigger, which keeps the filter itself.
int parse_hist_param(Trigger &t, std::string_view param, int pos, std::unique_ptr<Filter> filter,
                     const std::vector<Field> &fields, FilterError *err) {
    FilterError herr;
    t.hist = HistTrigger::parse(param, pos, std::move(filter), fields, &herr, t.host, t.owner, t.removing);
    if (!t.hist) return fail(err, herr.rc, herr.message.c_str(), herr.pos);
    return 0;
}

// "EVENT:FIELD[+|-ADJUST][:COUNT]" of set_wprobe, "EVENT[:FIELD[+|-ADJUST][:COUNT]]" of
// clear_wprobe (wprobetrace.rst): the w: event, and the record's field (an address) that
// names what to watch.
int parse_watch_param(Trigger &t, std::string_view param, int pos, std::unique_ptr<Filter> filter,
                      const std::vector<Field> &fields, FilterError *err) {
    const bool set = t.kind == Kind::kSetWatch;
    const size_t c1 = param.find(':');
    t.event = std::string(param.substr(0, c1));
    if (t.event.empty()) return fail(err, -EINVAL, "Expecting EVENT", pos);
    if (c1 != std::string_view::npos) {
        std::string_view rest = param.substr(c1 + 1);
        const size_t c2 = rest.find(':');
        std::string_view field = rest.substr(0, c2);
        const int field_pos = pos + int(c1 + 1);
        const size_t pm = field.find_first_of("+-");
        if (pm != std::string_view::npos) {
            const std::string num(field.substr(pm));
            char *end = nullptr;
            errno = 0;
            t.adjust = strtoll(num.c_str(), &end, 0);
            if (errno || *end || num.size() < 2) return fail(err, -EINVAL, "Invalid adjustment", field_pos + int(pm));
            field = field.substr(0, pm);
        }
        const Field *f = nullptr;
        for (const Field &x : fields)
            if (x.name == field) f = &x;
        if (f == nullptr) return fail(err, -ENOENT, "No such field", field_pos);
        if (f->size != 8 || f->array_len != 0) return fail(err, -ENOEXEC, "The field is not an address", field_pos);
        t.field = std::string(field);
        t.field_offset = f->offset;
        if (c2 != std::string_view::npos) {
            long n;
            if (!parse_count(rest.substr(c2 + 1), &n))
                return fail(err, -EINVAL, "Invalid count", field_pos + int(c2 + 1));
            t.count.store(n);
        }
    } else if (set) {
        return fail(err, -EINVAL, "Expecting EVENT:FIELD", pos);
    }
    int r = 0;
    t.mover = t.host->watch_mover(t.event, set && !t.removing, &r);
    if (t.mover == nullptr)
        return fail(err, r,
                    r == -EBUSY    ? "The watch event is enabled"
                    : r == -ENOENT ? "No such watch event"
                                   : "The watch event has an address",
                    pos);
    t.filter = std::move(filter);
    return 0;
}

// Any trigger of the type is the one: traceon and traceoff, stacktrace, snapshot.
bool same_type(const Trigger &, const Trigger &) { return true; }

// The one with the same target event: enable_event and disable_event, enable_hist and
// disable_hist.
bool same_target(const Trigger &o, const Trigger &t) { return o.flag == t.flag && o.hist_target == t.hist_target; }

// The one moving the same w: event: set_wprobe, clear_wprobe.
bool same_watch(const Trigger &o, const Trigger &t) { return o.mover == t.mover; }

// The one with the same keys, values, sort and filter: hist.
bool same_hist(const Trigger &o, const Trigger &t) { return o.hist->same_as(*t.hist); }

// Prepends t, as the kernel does; -EEXIST when it names an installed trigger.
int register_trigger(Trigger *t, Trigger *same, std::vector<Trigger *> &items, int pos, FilterError *err) {
    if (same) return fail(err, -EEXIST, "Trigger already exists", pos);
    items.insert(items.begin(), t);
    return kChanged;
}

// Appends t; when it names an installed one, its pause, cont or clear act on that one
// instead (-EEXIST with none of them).
int register_hist(Trigger *t, Trigger *same, std::vector<Trigger *> &items, int pos, FilterError *err) {
    HistTrigger &h = *t->hist;
    if (same) {
        HistTrigger &old = *same->hist;
        if (h.pause_flag())
            old.set_paused(true);
        else if (h.cont_flag())
            old.set_paused(false);
        if (h.clear_flag()) old.clear();
        if (!h.pause_flag() && !h.cont_flag() && !h.clear_flag())
            return fail(err, -EEXIST, "Hist trigger already exists", pos);
        return kUnchanged;
    }
    if (h.cont_flag() || h.clear_flag())
        return fail(err, -ENOENT, "Can't clear or continue a nonexistent hist trigger", pos);
    // A snapshot() action's conditional snapshot: -EBUSY (nothing logged, as by the kernel)
    // while another trigger has it.
    if (const int r = h.claim_snapshot(); r != 0) return fail(err, r, "", pos);
    items.push_back(t); // the kernel appends hist triggers, prepends the others
    return kChanged;
}

int unregister_trigger(Trigger *same, std::vector<Trigger *> &items) {
    if (!same) return kUnchanged;
    // The trigger itself stays in triggers_: a hit may still run it.
    items.erase(std::find(items.begin(), items.end(), same));
    return kChanged;
}

// As unregister_trigger; the w: event stops watching, as the kernel's trigger takes its
// wprobe out of soft mode.
int unregister_watch(Trigger *same, std::vector<Trigger *> &items) {
    const int r = unregister_trigger(same, items);
    if (r == kChanged) same->mover->clear(0, true);
    return r;
}

// ":count=N" or ":unlimited", then " if FILTER" when it has one.
std::string count_and_filter(const Trigger &t) {
    const long c = t.count.load(std::memory_order_relaxed);
    std::string s = c < 0 ? ":unlimited" : ":count=" + std::to_string(c);
    if (t.filter) s += " if " + t.filter->text();
    return s;
}

std::string print_counted(const Trigger &t) { return t.cmd->name + count_and_filter(t); }

std::string print_event_target(const Trigger &t) {
    return t.cmd->name + (":" + t.system + ":" + t.event) + count_and_filter(t);
}

std::string print_hist(const Trigger &t) { return t.hist->spec_text(); }

// The kernel's "set_wprobe:EVENT:FIELD+ADJUST", "clear_wprobe:EVENT[:FIELD+ADJUST]".
std::string print_watch(const Trigger &t) {
    std::string s = t.cmd->name + (":" + t.event);
    if (!t.field.empty()) s += ":" + t.field + (t.adjust < 0 ? "" : "+") + std::to_string(t.adjust);
    const long c = t.count.load(std::memory_order_relaxed);
    if (c >= 0) s += ":count=" + std::to_string(c);
    if (t.filter) s += " if " + t.filter->text();
    return s;
}

// In the order the trigger file lists them when there is no trigger.
constexpr Command kCommands[] = {
    // name, kind, type, param_required, parse, same, reg, unreg, print
    {"traceon", Kind::kTraceOn, 0, false, parse_count_param, same_type, register_trigger, unregister_trigger,
     print_counted},
    {"traceoff", Kind::kTraceOff, 0, false, parse_count_param, same_type, register_trigger, unregister_trigger,
     print_counted},
    {"snapshot", Kind::kSnapshot, 2, false, parse_count_param, same_type, register_trigger, unregister_trigger,
     print_counted},
    {"stacktrace", Kind::kStacktrace, 1, false, parse_count_param, same_type, register_trigger, unregister_trigger,
     print_counted},
    {"enable_event", Kind::kEnableEvent, 3, true, parse_event_param, same_target, register_trigger, unregister_trigger,
     print_event_target},
    {"disable_event", Kind::kDisableEvent, 3, true, parse_event_param, same_target, register_trigger,
     unregister_trigger, print_event_target},
    {"enable_hist", Kind::kEnableHist, 7, true, parse_event_param, same_target, register_trigger, unregister_trigger,
     print_event_target},
    {"disable_hist", Kind::kDisableHist, 7, true, parse_event_param, same_target, register_trigger, unregister_trigger,
     print_event_target},
    {"hist", Kind::kHist, 4, true, parse_hist_param, same_hist, register_hist, unregister_trigger, print_hist},
    {"set_wprobe", Kind::kSetWatch, 5, true, parse_watch_param, same_watch, register_trigger, unregister_watch,
     print_watch},
    {"clear_wprobe", Kind::kClearWatch, 6, true, parse_watch_param, same_watch, register_trigger, unregister_watch,
     print_watch},
};

// ---- A written trigger line ----

// "[!]COMMAND[:PARAM] [if FILTER]" taken apart, with where each part starts in what was
// written (for the caret of an error).
struct TriggerLine {
    const Command *cmd = nullptr;
    bool remove = false;   // "!COMMAND"
    int cmd_pos = 0;       // where the command's name starts
    std::string_view rest; // what follows the command and its separator
    int rest_pos = 0;
    std::string_view param, filter; // rest taken apart: the parameter, and "if FILTER"
    int filter_pos = 0;
};

// The command of a line and what follows it; -EINVAL with *err when the line is empty or
// names no command.
int split_command(std::string_view text, TriggerLine *l, FilterError *err) {
    size_t lead = 0;
    while (lead < text.size() && is_space(text[lead])) lead++;
    std::string_view s = trim(text);
    int base = int(lead); // offset of s in text, for error positions
    if (s.empty()) return fail(err, -EINVAL, "Empty trigger", 0);
    l->remove = s[0] == '!';
    if (l->remove) {
        s.remove_prefix(1);
        base++;
    }

    size_t cmd_end = 0;
    while (cmd_end < s.size() && s[cmd_end] != ':' && !is_space(s[cmd_end])) cmd_end++;
    const std::string_view name = s.substr(0, cmd_end);
    for (const Command &c : kCommands)
        if (name == c.name) l->cmd = &c;
    if (!l->cmd) return fail(err, -EINVAL, "Unknown trigger command", base);
    l->cmd_pos = base;
    // What follows the command and its one separator, leading blanks skipped.
    size_t rest_at = cmd_end < s.size() ? cmd_end + 1 : cmd_end;
    while (rest_at < s.size() && is_space(s[rest_at])) rest_at++;
    l->rest = s.substr(rest_at);
    l->rest_pos = base + int(rest_at);
    return 0;
}

// The parameter and the filter of what follows the command, separated as the kernel does:
// without a required parameter, text that does not start with a digit is the filter.
// -EINVAL with *err when a required parameter is missing.
int split_param(TriggerLine *l, FilterError *err) {
    const std::string_view rest = l->rest;
    l->filter_pos = l->rest_pos;
    if (!rest.empty()) {
        if (!l->cmd->param_required && !isdigit((unsigned char)rest[0])) {
            l->filter = rest;
        } else {
            size_t sp = 0;
            while (sp < rest.size() && !is_space(rest[sp])) sp++;
            l->param = rest.substr(0, sp);
            size_t f = sp;
            while (f < rest.size() && is_space(rest[f])) f++;
            l->filter = rest.substr(f);
            l->filter_pos = l->rest_pos + int(f);
        }
    }
    if (l->cmd->param_required && l->param.empty()) return fail(err, -EINVAL, "Missing trigger parameter", l->rest_pos);
    return 0;
}

// The line's "if FILTER" compiled against the event's fields into *out (null when there is
// none); -EINVAL with *err, its caret in the line, on a bad one.
int compile_trigger_filter(const TriggerLine &l, const std::vector<Field> &fields, std::unique_ptr<Filter> *out,
                           FilterError *err) {
    const std::string_view part = l.filter;
    if (part.empty()) return 0;
    size_t w = 0;
    while (w < part.size() && !is_space(part[w])) w++;
    if (part.substr(0, w) != "if" || w == part.size()) return fail(err, -EINVAL, "Expecting 'if FILTER'", l.filter_pos);
    const std::string_view ftext = part.substr(w + 1); // the kernel splits at one blank
    FilterError ferr;
    *out = compile_filter(ftext, fields, &ferr);
    if (!*out) {
        const int at = l.filter_pos + int(w) + 1;
        return fail(err, -EINVAL, ferr.message.empty() ? "Error in filter" : ferr.message.c_str(),
                    at + (ferr.pos < 0 ? 0 : ferr.pos));
    }
    return 0;
}

} // namespace

TriggerSet::TriggerSet() = default;
TriggerSet::~TriggerSet() = default;

void TriggerSet::set_owner(std::string event) {
    std::lock_guard lk(mu_);
    owner_ = std::move(event);
}

void TriggerSet::set_symbolizer(Symbolizer sym) {
    std::lock_guard lk(mu_);
    sym_ = std::move(sym);
}

int TriggerSet::write(std::string_view text, const std::vector<Field> &fields, TriggerHost &host, FilterError *err) {
    TriggerLine l;
    if (int r = split_command(text, &l, err)) return r;
    if (int r = split_param(&l, err)) return r;
    std::unique_ptr<Filter> filter;
    if (int r = compile_trigger_filter(l, fields, &filter, err)) return r;
    auto t = std::make_unique<Trigger>();
    t->cmd = l.cmd;
    t->kind = l.cmd->kind;
    t->host = &host;
    t->owner = owner_;
    t->removing = l.remove;
    if (int r = l.cmd->parse(*t, l.param, l.rest_pos, std::move(filter), fields, err)) return r;
    return install(std::move(t), l.remove, l.cmd_pos, err);
}

int TriggerSet::install(std::unique_ptr<Trigger> t, bool remove, int pos, FilterError *err) {
    std::lock_guard lk(mu_);
    std::vector<Trigger *> items;
    if (const TriggerList *cur = cur_.load(std::memory_order_relaxed)) items = cur->items;
    const Command &cmd = *t->cmd;
    Trigger *same = nullptr;
    for (Trigger *o : items)
        if (o->cmd->type == cmd.type && cmd.same(*o, *t)) {
            same = o;
            break;
        }
    // A hist trigger whose variables another one reads stays (the kernel's -EBUSY).
    if (remove && same != nullptr && same->kind == Kind::kHist && !same->hist->retract_vars())
        return fail(err, -EBUSY, "Variable is still referenced by another hist trigger", pos);
    const int r = remove ? cmd.unreg(same, items) : cmd.reg(t.get(), same, items, pos, err);
    if (r != kChanged) {
        // A hist trigger refused here (-EEXIST) takes out what it wrote on other events.
        if (!remove && t->kind == Kind::kHist) t->hist->drop_field_hists();
        return r;
    }
    if (!remove && t->kind == Kind::kHist) t->hist->publish_vars();
    if (!remove) triggers_.push_back(std::move(t));
    publish(std::move(items));
    // The field variables' triggers it wrote on other events go with it (other triggers
    // are written one at a time: the tracer's mutex is held).
    if (remove && same->kind == Kind::kHist) same->hist->drop_field_hists();
    return 0;
}

void TriggerSet::publish(std::vector<Trigger *> items) {
    auto list = std::make_unique<TriggerList>();
    list->items = std::move(items);
    // Readers may still walk the old list: it is kept in lists_, never freed before *this.
    cur_.store(list->items.empty() ? nullptr : list.get(), std::memory_order_release);
    lists_.push_back(std::move(list));
}

void TriggerSet::remove_hists() {
    std::lock_guard lk(mu_);
    const TriggerList *cur = cur_.load(std::memory_order_relaxed);
    if (!cur) return;
    auto dropped = [](const Trigger *t) {
        return t->kind == Kind::kHist || t->kind == Kind::kEnableHist || t->kind == Kind::kDisableHist;
    };
    for (Trigger *t : cur->items)
        if (t->kind == Kind::kHist && t->hist->referenced()) return; // the kernel's hist_file_check_refs()
    std::vector<Trigger *> items;
    for (Trigger *t : cur->items) {
        if (!dropped(t)) {
            items.push_back(t);
            continue;
        }
        if (t->kind == Kind::kHist) t->hist->retract_vars(); // it stays in triggers_: a hit may still run it
    }
    if (items.size() == cur->items.size()) return;
    std::vector<Trigger *> gone;
    for (Trigger *t : cur->items)
        if (t->kind == Kind::kHist) gone.push_back(t);
    publish(std::move(items));
    for (Trigger *t : gone) t->hist->drop_field_hists();
}

const HistTrigger *TriggerSet::hist_like(const HistTrigger &target) const {
    std::lock_guard lk(mu_);
    if (const TriggerList *cur = cur_.load(std::memory_order_relaxed))
        for (const Trigger *t : cur->items)
            if (t->kind == Kind::kHist && t->hist->keys_like(target)) return t->hist.get();
    return nullptr;
}

std::string TriggerSet::text() const {
    std::lock_guard lk(mu_);
    const TriggerList *cur = cur_.load(std::memory_order_relaxed);
    if (!cur) {
        std::string s = "# Available triggers:\n#";
        for (const Command &c : kCommands) s += std::string(" ") + c.name;
        return s + "\n";
    }
    std::string out;
    for (const Trigger *t : cur->items) out += t->text() + "\n";
    return out;
}

std::string TriggerSet::hist_text() const {
    std::lock_guard lk(mu_);
    const TriggerList *cur = cur_.load(std::memory_order_relaxed);
    std::string out;
    if (!cur) return out;
    int n = 0;
    for (const Trigger *t : cur->items) {
        if (t->kind != Kind::kHist) continue;
        if (n++) out += "\n\n";
        out += t->hist->show(sym_);
    }
    return out;
}

// On the hit path, lean with the rest of it (arch/x86_64/vector_use.hpp): the
// host's actions are calls through a virtual table, which the scan does not follow, so
// they run with the vector state saved. They are rare (an effective traceon, a
// stacktrace, a snapshot); filters and histograms are not.
void TriggerSet::fire(const uint8_t *rec, uint32_t size, const char *comm, const struct pt_regs &regs) noexcept {
    const TriggerList *cur = cur_.load(std::memory_order_acquire);
    if (!cur) return;
    for (Trigger *t : cur->items) {
        if (t->kind == Kind::kHist) {
            const Filter *f = t->hist->filter();
            if (f && !f->match(rec, size, comm)) continue;
            t->hist->update(rec, size, comm, &regs);
            continue;
        }
        if (t->filter && !t->filter->match(rec, size, comm)) continue;
        switch (t->kind) {
        case Kind::kTraceOn:
        case Kind::kTraceOff: {
            const bool on = t->kind == Kind::kTraceOn;
            bool is_on = false;
            core::agent_call([&] { is_on = t->host->tracing_is_on(); });
            if (is_on == on) break; // the kernel counts only effective hits
            if (t->take()) core::agent_call([&] { t->host->set_tracing_on(on); });
            break;
        }
        case Kind::kStacktrace:
            if (t->take()) core::agent_call([&] { t->host->record_stacktrace(regs); });
            break;
        case Kind::kSnapshot:
            if (t->take()) core::agent_call([&] { t->host->take_snapshot(); });
            break;
        case Kind::kEnableEvent:
        case Kind::kDisableEvent: {
            const bool on = t->kind == Kind::kEnableEvent;
            if (t->flag->load(std::memory_order_relaxed) == on) break;
            if (t->take()) t->flag->store(on, std::memory_order_release);
            break;
        }
        case Kind::kEnableHist:
        case Kind::kDisableHist:
            // Every hit acts, whatever the target's state (the kernel's hist_enable_trigger()).
            if (t->take()) t->hist_target->pause_hists(t->kind == Kind::kDisableHist);
            break;
        case Kind::kSetWatch:
        case Kind::kClearWatch: {
            if (t->count.load(std::memory_order_relaxed) == 0) break;
            uint64_t addr = 0;
            if (!t->field.empty() && t->field_offset + 8 <= size) __builtin_memcpy(&addr, rec + t->field_offset, 8);
            addr += static_cast<uint64_t>(t->adjust);
            bool acted = false;
            core::agent_call([&] {
                acted = t->kind == Kind::kSetWatch ? t->mover->set(addr) : t->mover->clear(addr, t->field.empty());
            });
            if (acted) t->take();
            break;
        }
        case Kind::kHist:
            break;
        }
    }
}

void TriggerSet::pause_hists(bool paused) noexcept {
    const TriggerList *cur = cur_.load(std::memory_order_acquire);
    if (!cur) return;
    for (Trigger *t : cur->items)
        if (t->kind == Kind::kHist) t->hist->set_paused(paused);
}

} // namespace ukp::trace
