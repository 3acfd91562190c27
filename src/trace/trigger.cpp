#include "trace/trigger.hpp"
#include "platform/vector_state.hpp"

#include <algorithm>
#include <cctype>
#include <climits>
#include <cerrno>
#include <cstdlib>

namespace ukp::trace {

namespace {

enum class Kind : uint8_t { kTraceOn, kTraceOff, kStacktrace, kSnapshot, kEnableEvent, kDisableEvent, kHist };

constexpr struct { const char *name; Kind kind; } kCommands[] = {
    {"traceon", Kind::kTraceOn},         {"traceoff", Kind::kTraceOff},
    {"snapshot", Kind::kSnapshot},       {"stacktrace", Kind::kStacktrace},
    {"enable_event", Kind::kEnableEvent}, {"disable_event", Kind::kDisableEvent},
    {"hist", Kind::kHist},
};

// The kernel's trigger types: traceon and traceoff share one, as do enable_event and
// disable_event (per target event); a second trigger of a type is -EEXIST.
int type_of(Kind k) {
    switch (k) {
    case Kind::kTraceOn:
    case Kind::kTraceOff: return 0;
    case Kind::kStacktrace: return 1;
    case Kind::kSnapshot: return 2;
    case Kind::kEnableEvent:
    case Kind::kDisableEvent: return 3;
    case Kind::kHist: return 4;
    }
    return -1;
}

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
    if (err) *err = {msg, pos};
    return rc;
}

} // namespace

struct Trigger {
    Kind kind;
    std::atomic<long> count{-1};          // remaining hits that act; -1: unlimited
    std::unique_ptr<Filter> filter;       // null: every hit (hist keeps its own)
    std::string system, event;            // enable_event/disable_event target
    std::atomic<bool> *flag = nullptr;    // the target's enable flag
    std::unique_ptr<HistTrigger> hist;    // kHist
    TriggerHost *host = nullptr;

    // Takes one from the count; false when it is used up.
    bool take() noexcept {
        long v = count.load(std::memory_order_relaxed);
        for (;;) {
            if (v == 0) return false;
            if (v < 0) return true;
            if (count.compare_exchange_weak(v, v - 1, std::memory_order_relaxed)) return true;
        }
    }

    std::string text() const {
        if (kind == Kind::kHist) return hist->spec_text();
        std::string s;
        for (const auto &c : kCommands)
            if (c.kind == kind) s = c.name;
        if (kind == Kind::kEnableEvent || kind == Kind::kDisableEvent) s += ":" + system + ":" + event;
        const long c = count.load(std::memory_order_relaxed);
        s += c < 0 ? ":unlimited" : ":count=" + std::to_string(c);
        if (filter) s += " if " + filter->text();
        return s;
    }
};

struct TriggerList {
    std::vector<Trigger *> items; // in the order the trigger file lists them
};

TriggerSet::TriggerSet() = default;
TriggerSet::~TriggerSet() = default;

void TriggerSet::set_symbolizer(Symbolizer sym) {
    std::lock_guard lk(mu_);
    sym_ = std::move(sym);
}

int TriggerSet::write(std::string_view text, const std::vector<Field> &fields, TriggerHost &host,
                      FilterError *err) {
    size_t lead = 0;
    while (lead < text.size() && is_space(text[lead])) lead++;
    std::string_view s = trim(text);
    int base = int(lead); // offset of s in text, for error positions
    if (s.empty()) return fail(err, -EINVAL, "Empty trigger", 0);
    const bool remove = s[0] == '!';
    if (remove) { s.remove_prefix(1); base++; }

    size_t cmd_end = 0;
    while (cmd_end < s.size() && s[cmd_end] != ':' && !is_space(s[cmd_end])) cmd_end++;
    const std::string_view cmd = s.substr(0, cmd_end);
    const Kind *kind = nullptr;
    for (const auto &c : kCommands)
        if (cmd == c.name) kind = &c.kind;
    if (!kind) return fail(err, -EINVAL, "Unknown trigger command", base);
    // What follows the command and its one separator, leading blanks skipped.
    size_t rest_at = cmd_end < s.size() ? cmd_end + 1 : cmd_end;
    while (rest_at < s.size() && is_space(s[rest_at])) rest_at++;
    std::string_view rest = s.substr(rest_at);
    const int rest_pos = base + int(rest_at);

    // Separate the parameter from "if FILTER" as the kernel does: without a required
    // parameter, text that does not start with a digit is the filter.
    const bool param_required = *kind == Kind::kEnableEvent || *kind == Kind::kDisableEvent || *kind == Kind::kHist;
    std::string_view param, filter_part;
    int filter_pos = rest_pos;
    if (!rest.empty()) {
        if (!param_required && !isdigit((unsigned char)rest[0])) {
            filter_part = rest;
        } else {
            size_t sp = 0;
            while (sp < rest.size() && !is_space(rest[sp])) sp++;
            param = rest.substr(0, sp);
            size_t f = sp;
            while (f < rest.size() && is_space(rest[f])) f++;
            filter_part = rest.substr(f);
            filter_pos = rest_pos + int(f);
        }
    }
    if (param_required && param.empty()) return fail(err, -EINVAL, "Missing trigger parameter", rest_pos);

    std::unique_ptr<Filter> filter;
    if (!filter_part.empty()) {
        size_t w = 0;
        while (w < filter_part.size() && !is_space(filter_part[w])) w++;
        if (filter_part.substr(0, w) != "if" || w == filter_part.size())
            return fail(err, -EINVAL, "Expecting 'if FILTER'", filter_pos);
        const std::string_view ftext = filter_part.substr(w + 1); // the kernel splits at one blank
        {
            FilterError ferr;
            filter = compile_filter(ftext, fields, &ferr);
            if (!filter) {
                const int at = filter_pos + int(w) + 1;
                return fail(err, -EINVAL, ferr.message.empty() ? "Error in filter" : ferr.message.c_str(),
                            at + (ferr.pos < 0 ? 0 : ferr.pos));
            }
        }
    }

    auto t = std::make_unique<Trigger>();
    t->kind = *kind;
    t->host = &host;
    if (*kind == Kind::kEnableEvent || *kind == Kind::kDisableEvent) {
        const size_t c1 = param.find(':');
        if (c1 == std::string_view::npos) return fail(err, -EINVAL, "Expecting SYSTEM:EVENT", rest_pos);
        t->system = std::string(param.substr(0, c1));
        std::string_view after = param.substr(c1 + 1);
        const size_t c2 = after.find(':');
        t->event = std::string(after.substr(0, c2));
        if (t->system.empty() || t->event.empty()) return fail(err, -EINVAL, "Expecting SYSTEM:EVENT", rest_pos);
        if (c2 != std::string_view::npos) {
            std::string_view num = after.substr(c2 + 1);
            num = num.substr(0, num.find(':'));
            long n;
            if (!parse_count(num, &n))
                return fail(err, -EINVAL, "Invalid count", rest_pos + int(c1 + 1 + c2 + 1));
            t->count.store(n);
        }
        t->flag = host.event_enable_flag(t->system, t->event);
        if (!t->flag) return fail(err, -EINVAL, "No such event", rest_pos);
    } else if (*kind == Kind::kHist) {
        FilterError herr;
        t->hist = HistTrigger::parse(param, rest_pos, std::move(filter), fields, &herr);
        if (!t->hist) return fail(err, -EINVAL, herr.message.c_str(), herr.pos);
    } else if (!param.empty()) {
        long n;
        if (!parse_count(param.substr(0, param.find(':')), &n)) return fail(err, -EINVAL, "Invalid count", rest_pos);
        t->count.store(n);
    }
    if (*kind != Kind::kHist) t->filter = std::move(filter);

    std::lock_guard lk(mu_);
    std::vector<Trigger *> items;
    if (const TriggerList *cur = cur_.load(std::memory_order_relaxed)) items = cur->items;

    auto same_slot = [&](const Trigger *o) {
        if (type_of(o->kind) != type_of(t->kind)) return false;
        if (t->kind == Kind::kEnableEvent || t->kind == Kind::kDisableEvent) return o->flag == t->flag;
        if (t->kind == Kind::kHist) return o->hist->same_as(*t->hist);
        return true;
    };
    auto it = std::find_if(items.begin(), items.end(), same_slot);

    if (remove) {
        if (it == items.end()) return 0;
        items.erase(it); // the trigger itself stays in triggers_: a hit may still run it
    } else if (t->kind == Kind::kHist) {
        HistTrigger &h = *t->hist;
        if (it != items.end()) {
            HistTrigger &old = *(*it)->hist;
            if (h.pause_flag()) old.set_paused(true);
            else if (h.cont_flag()) old.set_paused(false);
            if (h.clear_flag()) old.clear();
            if (!h.pause_flag() && !h.cont_flag() && !h.clear_flag())
                return fail(err, -EEXIST, "Hist trigger already exists", base);
            return 0;
        }
        if (h.cont_flag() || h.clear_flag())
            return fail(err, -ENOENT, "Can't clear or continue a nonexistent hist trigger", base);
        items.push_back(t.get()); // the kernel appends hist triggers, prepends the others
        triggers_.push_back(std::move(t));
    } else {
        if (it != items.end()) return fail(err, -EEXIST, "Trigger already exists", base);
        items.insert(items.begin(), t.get());
        triggers_.push_back(std::move(t));
    }
    auto list = std::make_unique<TriggerList>();
    list->items = std::move(items);
    // Readers may still walk the old list: it is kept in lists_, never freed before *this.
    cur_.store(list->items.empty() ? nullptr : list.get(), std::memory_order_release);
    lists_.push_back(std::move(list));
    return 0;
}

std::string TriggerSet::text() const {
    std::lock_guard lk(mu_);
    const TriggerList *cur = cur_.load(std::memory_order_relaxed);
    if (!cur) return "# Available triggers:\n# traceon traceoff snapshot stacktrace enable_event disable_event hist\n";
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
            t->hist->update(rec, size, comm);
            continue;
        }
        if (t->filter && !t->filter->match(rec, size, comm)) continue;
        switch (t->kind) {
        case Kind::kTraceOn:
        case Kind::kTraceOff: {
            const bool on = t->kind == Kind::kTraceOn;
            bool is_on = false;
            platform::saving_vectors([&] { is_on = t->host->tracing_is_on(); });
            if (is_on == on) break; // the kernel counts only effective hits
            if (t->take()) platform::saving_vectors([&] { t->host->set_tracing_on(on); });
            break;
        }
        case Kind::kStacktrace:
            if (t->take()) platform::saving_vectors([&] { t->host->record_stacktrace(regs); });
            break;
        case Kind::kSnapshot:
            if (t->take()) platform::saving_vectors([&] { t->host->take_snapshot(); });
            break;
        case Kind::kEnableEvent:
        case Kind::kDisableEvent: {
            const bool on = t->kind == Kind::kEnableEvent;
            if (t->flag->load(std::memory_order_relaxed) == on) break;
            if (t->take()) t->flag->store(on, std::memory_order_release);
            break;
        }
        case Kind::kHist: break;
        }
    }
}

} // namespace ukp::trace
