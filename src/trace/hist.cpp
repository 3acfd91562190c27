#include "trace/hist.hpp"
#include "trace/hist_table.hpp"
#include "trace/bytes.hpp"
#include "trace/fetch.hpp"
#include "trace/ring.hpp"
#include "platform/this_cpu.hpp"

#include "core/agent.hpp"
#include "platform/vector_state.hpp"

#include <cpuid.h>
#include <sched.h>
#include <time.h>
#include <x86intrin.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <unordered_map>
#include <mutex>

namespace ukp::trace {

namespace {

constexpr const char *kFieldNotFound = "Couldn't find field";
constexpr const char *kBadModifier = "Invalid field modifier";
constexpr const char *kInvalidSortModifier = "Invalid sort modifier";
constexpr const char *kEmptySortField = "Empty sort field";
constexpr const char *kTooManySort = "Too many sort fields (Max = 2)";
constexpr const char *kInvalidSortField = "Sort field must be a key or a val";
constexpr const char *kStringOperand = "String type can not be an operand in expression";
// A stack variable in an expression or as onmax()'s value (the kernel would take its
// address for a number): ukprobes' message.
constexpr const char *kStackOperand = "Stacktrace can not be an operand in expression";
constexpr uint32_t kMaxKeys = 3, kMaxVals = 3; // TRACING_MAP_KEYS_MAX, TRACING_MAP_VALS_MAX
constexpr uint32_t kMaxVars = 16;              // TRACING_MAP_VARS_MAX
constexpr size_t kMaxRefs = 16, kMaxActionParams = 16;
constexpr size_t kMaxOperands = 16; // of an expression (its depth is what the kernel limits)
constexpr int kMapBitsMin = 7, kMapBitsMax = 17, kMapBitsDefault = 11;

std::vector<std::pair<std::string_view, int>> split(std::string_view s, char sep, int base) {
    std::vector<std::pair<std::string_view, int>> out;
    size_t start = 0;
    for (;;) {
        const size_t e = s.find(sep, start);
        out.push_back(
            {s.substr(start, e == std::string_view::npos ? std::string_view::npos : e - start), base + int(start)});
        if (e == std::string_view::npos) break;
        start = e + 1;
    }
    return out;
}

bool fail(FilterError *err, const char *msg, int pos) {
    if (err) *err = {msg, pos};
    return false;
}

uint64_t log2_bucket(uint64_t v) {
    // ilog2(roundup_pow_of_two(v)), as the kernel's .log2
    if (v <= 1) return 0;
    return uint64_t(64 - __builtin_clzll(v - 1));
}

std::string column_text(const HistTrigger::Column &c) {
    std::string s = (c.var_pos >= 0 ? "$" : "") + c.name;
    if (!c.modifier.empty()) s += "." + c.modifier;
    if (c.modifier == "buckets") s += "=" + std::to_string(c.buckets);
    return s;
}

using Column = HistTrigger::Column;
using SortKey = HistTrigger::SortKey;

// A hist trigger's attributes as written: the text of its keys, values and sort, each with
// where it starts in what the user wrote, the table's size and the flags.
struct HistSpec {
    std::string_view keys, vals, sort;
    int keys_pos = 0, vals_pos = 0, sort_pos = 0;
    std::string_view name; // :name=NAME: a table shared by the triggers of that name
    int name_pos = 0;
    std::string_view clock = "global"; // :clock=CLOCK, of common_timestamp
    int clock_pos = 0;
    bool have_keys = false, have_sort = false;
    int bits = kMapBitsDefault; // log2 of the table's elements
    bool pause = false, cont = false, clear = false;
    bool no_hitcount = false; // :nohitcount (:NOHC): the hist file leaves the hitcount out
    std::vector<std::pair<std::string_view, int>> vars, actions; // "NAME=EXPR", "onmax(...)...", where each starts
};

// The table's bits for size=N (N rounded up to a power of two); false and *err when N is
// not a number or out of range.
bool parse_size(std::string_view text, int pos, int *bits, FilterError *err) {
    const std::string num(text);
    char *end = nullptr;
    errno = 0;
    const unsigned long long n = num.empty() ? 0 : strtoull(num.c_str(), &end, 0);
    if (num.empty() || errno || *end || num[0] == '-' || n == 0 || n > (1ull << 32))
        return fail(err, "Invalid size", pos);
    int b = 0;
    while ((1ull << b) < n) b++;
    if (b < kMapBitsMin || b > kMapBitsMax) return fail(err, "Invalid size (128..131072 entries)", pos);
    *bits = b;
    return true;
}

// The attributes of the part after "hist:", split at its colons; false and *err on one it
// does not know, a bad size, or no keys.
bool parse_attributes(std::string_view spec, int spec_pos, HistSpec *s, FilterError *err) {
    for (auto [part, pos] : split(spec, ':', spec_pos)) {
        if (part.starts_with("keys=") || part.starts_with("key=")) {
            const size_t eq = part.find('=') + 1;
            s->keys = part.substr(eq);
            s->keys_pos = pos + int(eq);
            s->have_keys = true;
        } else if (part.starts_with("values=") || part.starts_with("vals=") || part.starts_with("val=")) {
            const size_t eq = part.find('=') + 1;
            s->vals = part.substr(eq);
            s->vals_pos = pos + int(eq);
        } else if (part.starts_with("name=") && part.size() > 5) {
            s->name = part.substr(5);
            s->name_pos = pos + 5;
        } else if (part.starts_with("clock=")) {
            s->clock = part.substr(6);
            s->clock_pos = pos + 6;
        } else if (part.starts_with("sort=")) {
            s->sort = part.substr(5);
            s->sort_pos = pos + 5;
            s->have_sort = true;
        } else if (part.starts_with("size=")) {
            if (!parse_size(part.substr(5), pos + 5, &s->bits, err)) return false;
        } else if (part == "pause") {
            s->pause = true;
        } else if (part == "cont" || part == "continue") {
            s->cont = true;
        } else if (part == "clear") {
            s->clear = true;
        } else if (part == "nohitcount" || part == "NOHC") {
            s->no_hitcount = true;
        } else if (part.starts_with("onmatch(") || part.starts_with("onmax(") || part.starts_with("onchange(")) {
            s->actions.push_back({part, pos});
        } else if (const size_t eq = part.find('='); eq != std::string_view::npos && eq > 0) {
            for (auto [one, at] : split(part, ',', pos)) s->vars.push_back({one, at}); // a=x,b=y: two
        } else {
            return fail(err, "Unknown hist attribute", pos);
        }
    }
    if (!s->have_keys || s->keys.empty()) return fail(err, "Missing keys=", spec_pos);
    return true;
}

// The event field named `name`, or null.
const Field *find_field(const std::vector<Field> &fields, std::string_view name) {
    for (const Field &f : fields)
        if (f.name == name) return &f;
    return nullptr;
}

// Where a column's value is in a record: event field `name`, or the CPU pseudo-field (size
// 0); false and *err when there is no such field or its size is not one a column holds.
bool bind_field(std::string_view name, int pos, const std::vector<Field> &fields, Column *c, FilterError *err) {
    c->name = std::string(name);
    if (name == "common_timestamp") {
        c->timestamp = true; // size 0, as the CPU's: read at the hit
        return true;
    }
    if (name == "common_cpu" || name == "cpu" || name == "CPU") {
        c->size = 0; // marks the CPU pseudo-field
        return true;
    }
    if (name == "common_stacktrace" || name == "stacktrace") {
        c->name = "common_stacktrace"; // the kernel's name since 6.5 ("stacktrace" before)
        c->stack = true;
        return true;
    }
    const Field *f = find_field(fields, name);
    if (!f) return fail(err, kFieldNotFound, pos);
    if (f->print == Print::kStack) { // a synthetic event's stack: its __data_loc word
        c->stack = true;
        c->offset = f->offset;
        c->size = 4;
        return true;
    }
    c->is_string = f->print == Print::kString;
    c->is_signed = f->is_signed;
    c->offset = f->offset;
    c->size = c->is_string ? 4 : f->size * (f->array_len ? f->array_len : 1);
    if (!c->is_string && c->size != 1 && c->size != 2 && c->size != 4 && c->size != 8)
        return fail(err, kFieldNotFound, pos);
    return true;
}

// The column's modifier (the text after its '.', at mpos); false and *err when it is
// unknown or does not apply to the column.
bool apply_modifier(std::string_view mod, int mpos, bool key, Column *c, FilterError *err) {
    if (mod == "hex" || mod == "sym" || mod == "sym-offset" || mod == "log2") {
        if (c->is_string) return fail(err, kBadModifier, mpos);
        if (!key && mod != "hex") return fail(err, kBadModifier, mpos);
        c->modifier = std::string(mod);
    } else if (mod == "percent" || mod == "graph") { // of a value: its share of the column's total, a bar
        if (key || c->is_string) return fail(err, kBadModifier, mpos);
        c->modifier = std::string(mod);
    } else if (mod == "syscall") { // a key holding a system call's number: its name
        if (!key || c->is_string) return fail(err, kBadModifier, mpos);
        c->modifier = "syscall";
    } else if (mod == "execname") {
        if (!key || c->name != "common_pid") return fail(err, kBadModifier, mpos);
        c->modifier = "execname";
    } else if (mod.starts_with("buckets=") || mod.starts_with("bucket=")) {
        if (!key || c->is_string) return fail(err, kBadModifier, mpos);
        const std::string n(mod.substr(mod.find('=') + 1));
        char *end = nullptr;
        const unsigned long long b = n.empty() ? 0 : strtoull(n.c_str(), &end, 0);
        if (n.empty() || *end || b == 0) return fail(err, kBadModifier, mpos);
        c->modifier = "buckets";
        c->buckets = b;
    } else {
        return fail(err, kBadModifier, mpos);
    }
    return true;
}

// A key or value column from "field[.modifier]" at pos; false and *err when it names no
// field, or a modifier it cannot take.
bool make_column(std::string_view text, int pos, bool key, const std::vector<Field> &fields, Column *c,
                 FilterError *err) {
    const size_t dot = text.find('.');
    if (!bind_field(text.substr(0, dot), pos, fields, c, err)) return false;
    if (!key && c->is_string) return fail(err, kStringOperand, pos);
    if (c->stack && !key) return fail(err, kFieldNotFound, pos); // a key only
    const std::string_view mod = dot == std::string_view::npos ? std::string_view() : text.substr(dot + 1);
    if (mod.empty()) return true;
    // histogram.rst's `stack.stacktrace`: a stack field shown as a stack (common_stacktrace
    // is one already and takes no modifier).
    if (c->stack && c->size != 0 && mod == "stacktrace") {
        c->modifier = "stacktrace";
        return true;
    }
    if (c->stack) return fail(err, kBadModifier, pos + int(dot) + 1);
    if (c->timestamp && mod == "usecs") {
        c->usecs = true;
        c->modifier = "usecs";
        return true;
    }
    return apply_modifier(mod, pos + int(dot) + 1, key, c, err);
}

// `modifier` decoded for the hit path.
Column::Mod modifier_code(const std::string &modifier) {
    static constexpr std::pair<const char *, Column::Mod> kMods[] = {
        {"hex", Column::kHex},           {"sym", Column::kSym},    {"sym-offset", Column::kSymOffset},
        {"execname", Column::kExecname}, {"log2", Column::kLog2},  {"buckets", Column::kBuckets},
        {"percent", Column::kPercent},   {"graph", Column::kGraph}};
    for (auto [n, m] : kMods)
        if (modifier == n) return m;
    return Column::kNone;
}

// The keys of "keys=" at pos, packed one after another into *key_bytes of key; false and
// *err on a bad one or too many.
// A key $VAR[.modifier] names a variable of the same trigger that is a field as it is
// (histogram.rst's `keys=$saved_pid:saved_pid=pid`): the key is that field, as the kernel's
// local_field_var_ref() makes it. Any other variable: the kernel's INVALID_REF_KEY.
bool key_of_variable(std::string_view part, int at, const std::vector<std::pair<std::string_view, int>> &vars,
                     std::string *field, FilterError *err) {
    const size_t dot = part.find('.');
    const std::string_view name = part.substr(1, dot == std::string_view::npos ? std::string_view::npos : dot - 1);
    for (auto [v, vpos] : vars) {
        const size_t eq = v.find('=');
        if (v.substr(0, eq) != name) continue;
        const std::string_view expr = v.substr(eq + 1);
        if (expr.empty() || expr.find_first_of("$.+-*/") != std::string_view::npos || expr == "common_timestamp" ||
            expr == "common_stacktrace" || expr == "stacktrace")
            break;
        *field = std::string(expr) + std::string(dot == std::string_view::npos ? "" : part.substr(dot));
        return true;
    }
    return fail(err, "Using variable references in keys not supported", at);
}

bool parse_keys(std::string_view text, int pos, const std::vector<Field> &fields,
                const std::vector<std::pair<std::string_view, int>> &vars, std::vector<Column> *keys,
                uint32_t *key_bytes, FilterError *err) {
    const auto parts = split(text, ',', pos);
    if (parts.size() > kMaxKeys) return fail(err, "Too many keys (max 3)", pos);
    for (auto [part, at] : parts) {
        Column c;
        if (part.empty()) return fail(err, kFieldNotFound, at);
        std::string aliased;
        if (part[0] == '$') {
            if (!key_of_variable(part, at, vars, &aliased, err)) return false;
            part = aliased;
        }
        if (!make_column(part, at, true, fields, &c, err)) return false;
        c.mod = modifier_code(c.modifier);
        c.key_off = *key_bytes;
        c.key_len = c.is_string ? HistTrigger::kMaxStringKey : c.stack ? 8 * HistTrigger::kStackDepth : 8;
        *key_bytes += c.key_len;
        keys->push_back(std::move(c));
    }
    return true;
}

// The values: hitcount first, always, then the fields of "vals=" at pos, each sum's index
// in key_off; false and *err on a bad one or too many.
bool parse_vals(std::string_view text, int pos, const std::vector<Field> &fields, std::vector<Column> *vals,
                FilterError *err) {
    Column hitcount;
    hitcount.name = "hitcount";
    vals->push_back(hitcount);
    if (text.empty()) return true;
    bool seen_hitcount = false;
    for (auto [part, at] : split(text, ',', pos)) {
        if (part == "hitcount" && !seen_hitcount) {
            seen_hitcount = true;
            continue;
        }
        Column c;
        if (part.empty()) return fail(err, kFieldNotFound, at);
        if (part[0] == '$') { // a variable of the trigger, summed too: bound once the variables are parsed
            c.name = std::string(part.substr(1));
            c.var_pos = at;
        } else if (part.starts_with("hitcount.")) { // hitcount.percent, hitcount.graph: a column of its own
            c.name = "hitcount";
            c.hits = true;
            if (!apply_modifier(part.substr(9), at + 9, false, &c, err)) return false;
            if (c.modifier != "percent" && c.modifier != "graph") return fail(err, kBadModifier, at + 9);
        } else if (!make_column(part, at, false, fields, &c, err)) {
            return false;
        }
        if (vals->size() > kMaxVals) return fail(err, "Too many values (max 3)", at);
        c.mod = modifier_code(c.modifier);
        c.key_off = uint32_t(vals->size());
        vals->push_back(std::move(c));
    }
    return true;
}

// One sort key, "name[.descending|.ascending]" naming hitcount, a key or a value; false and
// *err when it names none of them or has another modifier.
bool parse_sort_key(std::string_view text, int pos, const std::vector<Column> &keys, const std::vector<Column> &vals,
                    SortKey *sk, FilterError *err) {
    if (text.empty()) return fail(err, kEmptySortField, pos);
    std::string_view name = text;
    const size_t dot = text.find('.');
    if (dot != std::string_view::npos) {
        const std::string_view mod = text.substr(dot + 1);
        if (mod == "descending")
            sk->descending = true;
        else if (mod != "ascending")
            return fail(err, kInvalidSortModifier, pos + int(dot) + 1);
        name = text.substr(0, dot);
    }
    if (name == "hitcount") {
        sk->column = -1;
        sk->text = "hitcount";
    } else {
        bool found = false;
        for (size_t k = 0; k < keys.size() && !found; k++)
            if (keys[k].name == name) {
                sk->column = int(k);
                sk->is_key = true;
                found = true;
            }
        for (size_t v = 1; v < vals.size() && !found; v++)
            if (vals[v].name == name) {
                sk->column = int(v);
                sk->is_key = false;
                found = true;
            }
        if (!found) return fail(err, kInvalidSortField, pos);
        sk->text = column_text(sk->is_key ? keys[size_t(sk->column)] : vals[size_t(sk->column)]);
    }
    if (sk->descending) sk->text += ".descending";
    return true;
}

// The sort keys of "sort=" (at most two), hitcount when there is none; false and *err on a
// bad one.
bool parse_sort(const HistSpec &s, const std::vector<Column> &keys, const std::vector<Column> &vals,
                std::vector<SortKey> *sort, FilterError *err) {
    if (!s.have_sort) {
        SortKey sk;
        sk.text = "hitcount";
        sort->push_back(sk);
        return true;
    }
    const auto parts = split(s.sort, ',', s.sort_pos);
    if (parts.size() > 2) return fail(err, kTooManySort, s.sort_pos);
    for (auto [text, pos] : parts) {
        SortKey sk;
        if (!parse_sort_key(text, pos, keys, vals, &sk, err)) return false;
        sort->push_back(std::move(sk));
    }
    return true;
}

} // namespace

namespace {

// ---- variables and actions ----

// The installed triggers' variables, by name: a $NAME in a trigger written later resolves
// here (histogram.rst's variables are global, qualified by GRP.EVENT when two share a name).
struct VarEntry {
    HistTrigger *owner;
    uint32_t index;
    std::string event; // "GRP.EVENT"
};
std::mutex &vars_mu() {
    static auto *mu = new std::mutex;
    return *mu;
}
std::multimap<std::string, VarEntry, std::less<>> &var_table() {
    static auto *t = new std::multimap<std::string, VarEntry, std::less<>>;
    return *t;
}

// The installed triggers of each :name=NAME, under vars_mu(): their shared tables, what they
// must have alike, and how many are installed (at none the name is free again).
struct NamedHist {
    std::shared_ptr<HistTables> tables;
    std::string signature;
    int installed = 0;
};
std::map<std::string, NamedHist, std::less<>> &named_hists() {
    static auto *t = new std::map<std::string, NamedHist, std::less<>>;
    return *t;
}

// The time a hit reads for common_timestamp, in CLOCK_MONOTONIC ns: from the TSC where it
// is invariant (the kernel's own clocksource reads it), scaled by a rate measured when the
// first trigger that needs it is written; else the vDSO's clock, whose code may use the
// vector registers (saved around it, at some 100 ns a hit).
struct TscScale {
    uint64_t tsc0, ns0, mult; // ns = ns0 + (tsc - tsc0) * mult / 2^32
};
std::atomic<const TscScale *> g_tsc_scale{nullptr};

uint64_t monotonic_ns() {
    timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return uint64_t(t.tv_sec) * 1000000000ull + uint64_t(t.tv_nsec);
}

// Off the hit path: measures the TSC's rate against CLOCK_MONOTONIC over 5 ms, once.
void measure_tsc_scale() {
    static std::once_flag once;
    std::call_once(once, [] {
        unsigned a, b, c, d;
        if (__get_cpuid(0x80000007, &a, &b, &c, &d) == 0 || (d & (1u << 8)) == 0) return; // not invariant
        const auto pair = [](uint64_t *tsc, uint64_t *ns) {
            uint64_t best = ~0ull;
            for (int i = 0; i < 5; ++i) {
                const uint64_t t0 = __rdtsc(), m = monotonic_ns(), t1 = __rdtsc();
                if (t1 - t0 < best) {
                    best = t1 - t0;
                    *tsc = t0 + (t1 - t0) / 2;
                    *ns = m;
                }
            }
        };
        uint64_t tsc0 = 0, ns0 = 0, tsc1 = 0, ns1 = 0;
        pair(&tsc0, &ns0);
        const timespec pause{0, 5 * 1000 * 1000};
        nanosleep(&pause, nullptr);
        pair(&tsc1, &ns1);
        if (tsc1 <= tsc0 || ns1 <= ns0) return;
        const auto mult = static_cast<uint64_t>((static_cast<unsigned __int128>(ns1 - ns0) << 32) / (tsc1 - tsc0));
        g_tsc_scale.store(new TscScale{tsc1, ns1, mult}, std::memory_order_release); // kept for good
    });
}

uint64_t clock_now_ns() noexcept {
    if (const TscScale *s = g_tsc_scale.load(std::memory_order_acquire); s != nullptr) {
        const uint64_t d = __rdtsc() - s->tsc0;
        return s->ns0 + static_cast<uint64_t>((static_cast<unsigned __int128>(d) * s->mult) >> 32);
    }
    uint64_t ns = 0;
    core::agent_call([&ns] { ns = monotonic_ns(); });
    return ns;
}

bool is_identifier(std::string_view s) {
    if (s.empty() || !(std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_')) return false;
    return std::all_of(s.begin(), s.end(),
                       [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; });
}

} // namespace

// The kernel keeps one per trace instance (tr->cond_snapshot): one trigger here has it.
struct HistTrigger::SnapshotState {
    std::atomic<uint64_t> value{0}; // the largest (last) value over every key
    std::atomic<uint64_t> seq{0};   // over words
    uint32_t key_words;
    // The triggering key's words, then its comm's two (.execname); words[...] = 1 once
    // a snapshot was taken.
    std::unique_ptr<std::atomic<uint64_t>[]> words;
    explicit SnapshotState(uint32_t key_bytes)
        : key_words(key_bytes / 8), words(new std::atomic<uint64_t>[key_bytes / 8 + 3]) {
        for (uint32_t i = 0; i < key_words + 3; ++i) words[i].store(0, std::memory_order_relaxed);
    }
};

// Parses one operand of an expression or an action's parameter list.
// The first operand of an expression deeper than the kernel's three levels of
// subexpressions, or -1. The kernel's tree: the rightmost + or - at the root, its left
// side the rest, * and / likewise within each product; an operand's level is its depth.
int too_deep(const std::vector<HistTrigger::Operand> &terms) {
    constexpr int kMaxLevel = 3;
    std::vector<std::pair<size_t, size_t>> products; // [first, end) of each
    for (size_t i = 0; i < terms.size(); ++i)
        if (i == 0 || terms[i].op == '+' || terms[i].op == '-')
            products.push_back({i, i + 1});
        else
            products.back().second = i + 1;
    // In a left-leaning chain of n, the first is n - 1 deep, the j-th (j >= 2) n - j + 1.
    const auto depth = [](size_t j, size_t n) { return int(n == 1 ? 0 : j == 0 ? n - 1 : n - j); };
    for (size_t p = 0; p < products.size(); ++p) {
        const int base = depth(p, products.size());
        const size_t m = products[p].second - products[p].first;
        for (size_t f = 0; f < m; ++f)
            if (base + depth(f, m) > kMaxLevel) return int(products[p].first + f);
    }
    return -1;
}

namespace {

// The value of operands joined by their operators, given each operand's value x[i]: a sum
// of products, * and / first, each left to right, unsigned; a division by zero gives -1,
// as the kernel's.
uint64_t sum_of_products(const HistTrigger::Operand *terms, size_t n, const uint64_t *x) noexcept {
    uint64_t sum = 0, product = 0;
    char sign = '+';
    for (size_t i = 0; i < n; ++i) {
        if (i == 0) {
            product = x[i];
        } else if (terms[i].op == '*') {
            product *= x[i];
        } else if (terms[i].op == '/') {
            product = x[i] == 0 ? ~uint64_t{0} : product / x[i];
        } else {
            sum = sign == '-' ? sum - product : sum + product;
            sign = terms[i].op;
            product = x[i];
        }
    }
    return sign == '-' ? sum - product : sum + product;
}

} // namespace

struct HistTrigger::OperandParser {
    HistTrigger &h;
    const std::vector<Field> &fields;
    FilterError *err;
    bool removing = false; // parse()'s

    // A variable holding a string or a stack is an operand only where `strings`.
    bool address_ok(const Operand &o, bool strings, int pos) {
        if (strings || (!o.string && !o.stack)) return true;
        return fail(err, o.stack ? kStackOperand : kStringOperand, pos);
    }

    // One operand; a string (a string field, a string variable) only where `strings`.
    bool operand(std::string_view text, int pos, Operand *o, bool strings = false) {
        if (text.empty()) return fail(err, "Malformed assignment", pos);
        // histogram.rst's fully-qualified names: GRP.EVENT.$VAR, a variable of that event's
        // trigger ($GRP.EVENT.VAR here too), and GRP.EVENT.FIELD of this event.
        if (const size_t q = text.find(".$"); q != std::string_view::npos && q > 0 && text[0] != '$') {
            const std::string ref = std::string(text.substr(0, q)) + "." + std::string(text.substr(q + 2));
            if (!var_ref(ref, pos, o)) return false;
            return address_ok(*o, strings, pos);
        }
        if (!h.event_.empty() && text.size() > h.event_.size() + 1 && text.starts_with(h.event_) &&
            text[h.event_.size()] == '.') {
            const size_t skip = h.event_.size() + 1;
            return operand(text.substr(skip), pos + int(skip), o, strings);
        }
        if (text[0] == '$') {
            if (!var_ref(text.substr(1), pos, o)) return false;
            return address_ok(*o, strings, pos);
        }
        if (std::isdigit(static_cast<unsigned char>(text[0]))) {
            const std::string n(text);
            char *end = nullptr;
            o->value = strtoull(n.c_str(), &end, 0);
            o->kind = Operand::kConst;
            return *end == '\0' || fail(err, "Malformed assignment", pos);
        }
        Column c;
        if (strings && text.find('.') == std::string_view::npos && bind_field(text, pos, fields, &c, nullptr) &&
            c.is_string) {
            o->kind = Operand::kString;
            o->string = true;
            o->field = std::move(c);
            return true;
        }
        if (!make_column(text, pos, false, fields, &c, err)) return false;
        if (c.timestamp) {
            o->kind = Operand::kTimestamp;
            o->usecs = c.usecs;
            h.needs_ts_ = true;
            return true;
        }
        o->kind = Operand::kField;
        o->field = std::move(c);
        return true;
    }

    // $NAME: one of this trigger's variables defined before, else an installed trigger's
    // ($GRP.EVENT.NAME when the name is not unique).
    bool var_ref(std::string_view name, int pos, Operand *o) {
        for (uint32_t i = 0; i < h.vars_.size(); ++i)
            if (h.vars_[i].name == name) {
                o->kind = Operand::kOwnVar;
                o->index = i;
                o->string = h.vars_[i].is_string;
                o->stack = h.vars_[i].is_stack;
                return true;
            }
        std::string_view event;
        if (const size_t dot = name.rfind('.'); dot != std::string_view::npos) {
            event = name.substr(0, dot);
            name = name.substr(dot + 1);
        }
        std::lock_guard lock(vars_mu());
        const VarEntry *found = nullptr;
        int matches = 0;
        auto [lo, hi] = var_table().equal_range(name);
        for (auto it = lo; it != hi; ++it)
            if (event.empty() || it->second.event == event) {
                found = &it->second;
                ++matches;
            }
        if (found == nullptr) return fail(err, "Couldn't find variable", pos);
        if (matches > 1)
            return fail(
                err, "Variable name not unique, need to use fully qualified name (subsys.event.var) for variable", pos);
        o->kind = Operand::kRef;
        o->string = found->owner->vars_[found->index].is_string;
        o->stack = found->owner->vars_[found->index].is_stack;
        for (uint32_t i = 0; i < h.refs_.size(); ++i)
            if (h.refs_[i].owner == found->owner && h.refs_[i].index == found->index) {
                o->index = i;
                return true;
            }
        if (h.refs_.size() >= kMaxRefs) return fail(err, "Too many variables defined", pos);
        h.refs_.push_back({found->owner, found->index});
        o->index = uint32_t(h.refs_.size() - 1);
        return true;
    }

    // What a variable holding an address is assigned: a string field (a string variable; a
    // string is no operand of an expression), common_stacktrace (the hit's user stack:
    // histogram.rst's "Variables can even hold stacktraces"), or $VAR of either (block_lat's
    // `s=$st`: the same address). False for anything else, with nothing logged.
    bool address_operand(std::string_view expr, int at, Operand *o) {
        if (expr.find_first_of(".$+-*/") == std::string_view::npos &&
            bind_field(expr, at, fields, &o->field, nullptr) && o->field.is_string) {
            o->kind = Operand::kString;
            o->string = true;
            return true;
        }
        *o = Operand{};
        if (expr == "common_stacktrace" || expr == "stacktrace") {
            o->kind = Operand::kStack;
            o->stack = true;
            return true;
        }
        if (expr[0] != '$' || expr.find_first_of("+-*/") != std::string_view::npos) return false;
        FilterError *const saved = err;
        err = nullptr; // a variable that is neither is parsed again as an expression, with its errors
        const bool found = operand(expr, at, o, true);
        err = saved;
        return found && (o->string || o->stack);
    }

    // NAME=OPERAND[(+|-|*|/)OPERAND...]: * and / before + and -, each left to right, as the
    // kernel's expressions.
    bool var(std::string_view part, int pos) {
        const size_t eq = part.find('=');
        const std::string_view name = part.substr(0, eq), expr = part.substr(eq + 1);
        if (!is_identifier(name) || expr.empty()) return fail(err, "Malformed assignment", pos);
        for (const Var &v : h.vars_)
            if (v.name == name) return fail(err, "Variable already defined", pos);
        if (h.vars_.size() >= kMaxVars) return fail(err, "Too many variables defined", pos);
        Var v;
        v.name = std::string(name);
        v.text = std::string(expr);
        const int at = pos + int(eq) + 1;
        if (Operand o; address_operand(expr, at, &o)) {
            v.is_string = o.string;
            v.is_stack = o.stack;
            v.terms.push_back(std::move(o));
            h.vars_.push_back(std::move(v));
            return true;
        }
        // -(EXPR), the whole expression negated: the kernel's unary minus, which takes its
        // parentheses and goes nowhere but first.
        std::string_view body = expr;
        int body_at = at;
        if (expr.starts_with("-(") && expr.ends_with(")") && expr.find('(', 2) == std::string_view::npos) {
            body = expr.substr(2, expr.size() - 3);
            body_at = at + 2;
            v.negate = true;
        } else if (const size_t u = expr.find("-("); u != std::string_view::npos) {
            return fail(err, "Unary minus not supported in sub-expressions", at + int(u));
        }
        size_t start = 0;
        char op = '+';
        std::vector<int> starts; // each operand's, for the depth's error
        for (size_t i = 0; i <= body.size(); ++i) {
            if (i < body.size() && std::string_view("+-*/").find(body[i]) == std::string_view::npos) continue;
            if (v.terms.size() == kMaxOperands)
                return fail(err, "Too many subexpressions (3 max)", body_at + int(start));
            Operand o;
            if (!operand(body.substr(start, i - start), body_at + int(start), &o)) return false;
            o.op = op;
            v.terms.push_back(std::move(o));
            starts.push_back(body_at + int(start));
            if (i < body.size()) op = body[i];
            start = i + 1;
        }
        if (const int deep = too_deep(v.terms); deep >= 0)
            return fail(err, "Too many subexpressions (3 max)", starts[size_t(deep)]);
        // A constant divisor of 0 is refused where the product it divides starts, and the
        // operands must agree on common_timestamp's unit, each (a variable: its first
        // operand's) in microseconds or not: the kernel's parse_expr() and
        // check_expr_operands() (which compare every pair an operator joins, so every one).
        for (size_t i = 0, product = 0; i < v.terms.size(); ++i) {
            const Operand &o = v.terms[i];
            if (o.op == '+' || o.op == '-') product = i;
            if (o.op == '/' && o.kind == Operand::kConst && o.value == 0) {
                fail(err, "Division by zero", starts[product]);
                if (err) err->rc = -EDOM; // as the kernel's parse_expr()
                return false;
            }
            if (in_usecs(o) != in_usecs(v.terms.front()))
                return fail(err, "Timestamp units in expression don't match", 0);
        }
        // Numbers alone are worked out now, and the trigger file shows the result
        // (`x=1+2` as `x=3`), as the kernel folds its constants.
        const bool numbers =
            std::all_of(v.terms.begin(), v.terms.end(), [](const Operand &o) { return o.kind == Operand::kConst; });
        if (numbers && v.terms.size() > 1 && !v.negate) {
            uint64_t x[kMaxOperands];
            for (size_t i = 0; i < v.terms.size(); ++i) x[i] = v.terms[i].value;
            Operand folded;
            folded.kind = Operand::kConst;
            folded.value = sum_of_products(v.terms.data(), v.terms.size(), x);
            v.terms.assign(1, folded);
            v.text = std::to_string(folded.value);
        }
        h.vars_.push_back(std::move(v));
        return true;
    }

    // Whether operand o counts common_timestamp in microseconds: .usecs, or a variable whose
    // first operand does.
    bool in_usecs(const Operand &o) const {
        switch (o.kind) {
        case Operand::kTimestamp:
            return o.usecs;
        case Operand::kOwnVar:
            return h.var_in_usecs(o.index);
        case Operand::kRef:
            return h.refs_[o.index].owner->var_in_usecs(h.refs_[o.index].index);
        default:
            return false;
        }
    }

    // onmatch(GRP.EVENT), onmax($VAR) or onchange($VAR), then .trace(SYNTH,ARGS),
    // .SYNTH(ARGS), and for onmax and onchange .save(FIELD,...) or .snapshot().
    bool action(std::string_view part, int pos, HistHost *host) {
        Action a;
        a.text = std::string(part);
        const size_t open = part.find('(');
        const std::string_view handler = part.substr(0, open);
        a.handler = handler == "onmax" ? Action::kOnMax : handler == "onchange" ? Action::kOnChange : Action::kOnMatch;
        const size_t close = part.find(')');
        if (close == std::string_view::npos) return fail(err, "No closing paren found", pos);
        const std::string_view inner = part.substr(open + 1, close - open - 1);
        const int inner_pos = pos + int(open) + 1;
        if (a.handler == Action::kOnMatch) {
            // The kernel's onmatch_parse(): no '.', a missing subsystem; no such event, the
            // caret under the event's name.
            const size_t dot = inner.find('.');
            if (dot == std::string_view::npos) return fail(err, "Missing subsystem", inner_pos);
            if (dot == 0 || dot + 1 == inner.size() || host == nullptr ||
                !host->event_exists(inner.substr(0, dot), inner.substr(dot + 1)))
                return fail(err, "Invalid subsystem or event name", inner_pos + int(dot) + 1);
            a.match_group = std::string(inner.substr(0, dot));
            a.match_event = std::string(inner.substr(dot + 1));
        } else if (!track_var(inner, inner_pos, &a)) {
            return false;
        }
        std::string_view rest = part.substr(close + 1);
        const int rest_pos = pos + int(close) + 1;
        if (rest.size() < 2 || rest[0] != '.') return fail(err, "No action found", rest_pos);
        const size_t fn_open = rest.find('(');
        if (fn_open == std::string_view::npos) return fail(err, "No action found", rest_pos);
        std::string_view fn = rest.substr(1, fn_open - 1);
        if (fn == "save" || fn == "snapshot") {
            if (a.handler == Action::kOnMatch) return fail(err, "Handler doesn't support action", rest_pos + 1);
            if (rest.back() != ')') return fail(err, "No closing paren found", rest_pos + int(fn_open) + 1);
            if (fn == "snapshot") {
                a.kind = Action::kSnapshot; // what it is given is ignored, as by the kernel
            } else {
                a.kind = Action::kSave;
                for (const Action &o : h.actions_)
                    if (o.kind == Action::kSave)
                        return fail(err, "Can't have more than one save() action per hist", pos);
                if (!save_params(rest.substr(fn_open + 1, rest.size() - fn_open - 2), rest_pos + int(fn_open) + 1, &a))
                    return false;
            }
            h.actions_.push_back(std::move(a));
            return true;
        }
        if (rest.back() != ')') return fail(err, "No action found", rest_pos);
        std::string_view params = rest.substr(fn_open + 1, rest.size() - fn_open - 2);
        int params_pos = rest_pos + int(fn_open) + 1;
        if (fn == "trace") { // trace(SYNTH,ARGS)
            const size_t comma = params.find(',');
            fn = params.substr(0, comma);
            params = comma == std::string_view::npos ? std::string_view() : params.substr(comma + 1);
            params_pos += comma == std::string_view::npos ? 0 : int(comma) + 1;
        }
        a.synth = host != nullptr ? host->synthetic_event(fn) : nullptr;
        if (a.synth == nullptr) return fail(err, "Couldn't find synthetic event", rest_pos + 1);
        for (size_t start = 0; !params.empty() && start <= params.size();) {
            const size_t comma = std::min(params.find(',', start), params.size());
            if (a.args.size() == kMaxActionParams) return fail(err, "Too many action params", params_pos + int(start));
            Operand o;
            const std::string_view param = params.substr(start, comma - start);
            bool matched = false;
            if (!matching_field(param, params_pos + int(start), a, host, &o, &matched)) return false;
            if (!matched && !operand(param, params_pos + int(start), &o, true)) return false;
            // A string to a string field, a number to a number field, as the kernel's
            // check_synth_field() wants them.
            if (a.args.size() < a.synth->field_count() && (o.string != a.synth->field_is_string(a.args.size()) ||
                                                           o.stack != a.synth->field_is_stack(a.args.size())))
                return fail(err, "Param type doesn't match synthetic event field type", params_pos + int(start));
            a.args.push_back(std::move(o));
            start = comma + 1;
        }
        if (a.args.size() != a.synth->field_count())
            return fail(err, "Param count doesn't match synthetic event field count", params_pos);
        h.actions_.push_back(std::move(a));
        return true;
    }

    // An onmatch() parameter that is a field of the matching event: GRP.EVENT.FIELD, or FIELD
    // alone where this trigger's event has no field of that name, as the kernel's
    // trace_action_create_field_var() takes one. Made the kernel's way: variable
    // synthetic_FIELD of a trigger written on that event (HistHost::field_var_hist), read
    // as any other trigger's variable. *matched false: text is no such field.
    bool matching_field(std::string_view text, int pos, const Action &a, HistHost *host, Operand *o, bool *matched) {
        *matched = false;
        if (a.handler != Action::kOnMatch || text.empty() || text[0] == '$' ||
            std::isdigit(static_cast<unsigned char>(text[0])))
            return true;
        const std::string event = a.match_group + "." + a.match_event;
        if (event == h.event_) return true; // its own event: a field as any other
        std::string_view field;
        Column c;
        if (text.size() > event.size() + 1 && text.starts_with(event) && text[event.size()] == '.')
            field = text.substr(event.size() + 1);
        else if (text.find('.') == std::string_view::npos && !bind_field(text, pos, fields, &c, nullptr))
            field = text;
        if (field.empty() || field[0] == '$' || field.find('.') != std::string_view::npos) return true;
        *matched = true;
        std::string cmd, message;
        const std::string var = event + "." + field_var_name(field);
        if (removing) { // "!hist:...": its text names the trigger; the variable may be gone with it
            FilterError *const saved = err;
            err = nullptr;
            if (!var_ref(var, pos, o)) { // of the type the field wants: only the text counts here
                const size_t i = a.args.size();
                o->kind = Operand::kConst;
                o->string = a.synth != nullptr && i < a.synth->field_count() && a.synth->field_is_string(i);
                o->stack = a.synth != nullptr && i < a.synth->field_count() && a.synth->field_is_stack(i);
            }
            err = saved;
            return true;
        }
        if (host == nullptr || host->field_var_hist(a.match_group, a.match_event, field, h, false, &cmd, &message) != 0)
            return fail(err, message.empty() ? "Matching event histogram not found" : message.c_str(), pos);
        const auto same = [&](const FieldHist &f) {
            return f.group == a.match_group && f.event == a.match_event && f.cmd == cmd;
        };
        if (std::none_of(h.field_hists_.begin(), h.field_hists_.end(), same))
            h.field_hists_.push_back({a.match_group, a.match_event, cmd});
        return var_ref(var, pos, o);
    }

    // onmax(X), onchange(X): X must be one of this trigger's variables, as the kernel's
    // track_data_create() finds it (not another trigger's).
    bool track_var(std::string_view text, int pos, Action *a) {
        if (text.empty() || text[0] != '$') return fail(err, "For onmax(x) or onchange(x), x must be a variable", pos);
        for (uint32_t i = 0; i < h.vars_.size(); ++i)
            if (h.vars_[i].name == text.substr(1)) {
                if (h.vars_[i].is_string) return fail(err, kStringOperand, pos + 1);
                if (h.vars_[i].is_stack) return fail(err, kStackOperand, pos + 1);
                a->var = i;
                a->var_text = std::string(text);
                return true;
            }
        return fail(err, "Couldn't find onmax or onchange variable", pos + 1);
    }

    // save()'s FIELD,...: each a field of the event (a string too), common_pid and the
    // other common fields, common_timestamp[.usecs], common_comm, or $VAR of this trigger.
    bool save_params(std::string_view params, int pos, Action *a) {
        uint32_t words = 0;
        for (auto [text, at] : split(params, ',', pos)) {
            // The kernel's parse_action_params() refuses a name under two characters.
            if (text.size() < 2) return fail(err, "Invalid action param", at);
            if (a->saved.size() == kMaxActionParams) return fail(err, "Too many action params", at);
            Saved sv;
            sv.name = std::string(text);
            if (!saved_value(text, &sv)) return fail(err, "Couldn't create field variable", at);
            sv.word = words;
            sv.words = sv.kind == Saved::kString ? kMaxStringKey / 8 : sv.kind == Saved::kComm ? 2 : 1;
            words += sv.words;
            a->saved.push_back(std::move(sv));
        }
        return true;
    }

    bool saved_value(std::string_view text, Saved *sv) {
        if (text[0] == '$') {
            for (uint32_t i = 0; i < h.vars_.size(); ++i)
                if (h.vars_[i].name == text.substr(1)) {
                    // the string field itself is saved instead; a stack is not kept
                    if (h.vars_[i].is_string || h.vars_[i].is_stack) return false;
                    sv->value.kind = Operand::kOwnVar;
                    sv->value.index = i;
                    return true;
                }
            return false;
        }
        if (text == "common_comm" || text == "comm") {
            sv->kind = Saved::kComm;
            return true;
        }
        const size_t dot = text.find('.');
        const std::string_view mod = dot == std::string_view::npos ? std::string_view() : text.substr(dot + 1);
        Column c;
        if (!bind_field(text.substr(0, dot), 0, fields, &c, nullptr)) return false;
        if (c.timestamp) {
            if (!mod.empty() && mod != "usecs") return false;
            sv->value.kind = Operand::kTimestamp;
            sv->value.usecs = !mod.empty();
            h.needs_ts_ = true;
            return true;
        }
        if (!mod.empty()) return false;
        sv->kind = c.is_string ? Saved::kString : Saved::kNumber;
        sv->value.kind = Operand::kField;
        sv->value.field = std::move(c);
        return true;
    }
};

namespace {

std::string join_tail(const std::vector<HistTrigger::Var> &vars, const std::vector<HistTrigger::Action> &actions,
                      bool actions_part) {
    std::string s;
    if (!actions_part) // one attribute, the variables joined by commas, as the kernel prints them
        for (const auto &v : vars) s += (s.empty() ? ":" : ",") + v.name + "=" + v.text;
    else
        for (const auto &a : actions) s += ":" + a.text;
    return s;
}

} // namespace

std::unique_ptr<HistTrigger> HistTrigger::parse(std::string_view spec, int spec_pos, std::unique_ptr<Filter> filter,
                                                const std::vector<Field> &fields, FilterError *err, HistHost *host,
                                                std::string event, bool removing) {
    HistSpec s;
    if (!parse_attributes(spec, spec_pos, &s, err)) return nullptr;
    std::unique_ptr<HistTrigger> h(new HistTrigger());
    h->event_ = std::move(event);
    h->host_ = host;
    // A trigger refused after its field variables were written takes them out: nothing is
    // half-applied.
    struct DropOnRefusal {
        HistTrigger *h;
        ~DropOnRefusal() {
            if (h != nullptr) h->drop_field_hists();
        }
    } refusal{h.get()};
    h->filter_ = std::move(filter);
    h->want_pause_ = s.pause;
    h->want_cont_ = s.cont;
    h->want_clear_ = s.clear;
    h->size_ = 1u << s.bits;
    if (!parse_keys(s.keys, s.keys_pos, fields, s.vars, &h->keys_, &h->key_bytes_, err)) return nullptr;
    if (!parse_vals(s.vals, s.vals_pos, fields, &h->vals_, err)) return nullptr;
    // The kernel's HIST_ERR_NEED_NOHC_VAL, its caret at the command's start.
    if (s.no_hitcount && h->vals_.size() == 1) {
        fail(err, "Non-hitcount value is required for 'nohitcount'", 0);
        return nullptr;
    }
    h->no_hitcount_ = s.no_hitcount;
    if (!parse_sort(s, h->keys_, h->vals_, &h->sort_, err)) return nullptr;
    for (const Column &c : h->vals_) h->needs_ts_ |= c.timestamp;
    for (const Column &c : h->keys_) {
        h->needs_ts_ |= c.timestamp;
        if (c.name == "common_pid" && c.mod != Column::kBuckets && c.mod != Column::kLog2)
            h->pid_key_off_ = int32_t(c.key_off);
    }
    OperandParser p{*h, fields, err, removing};
    for (auto [part, pos] : s.vars)
        if (!p.var(part, pos)) return nullptr;
    // vals=$VAR (histogram.rst's `vals=$ts0,$b:ts0=common_timestamp,b=field1`): the
    // variable's value at each hit is summed as well; it may be assigned after its use.
    for (Column &c : h->vals_) {
        if (c.var_pos < 0) continue;
        for (uint32_t i = 0; i < h->vars_.size(); ++i)
            if (h->vars_[i].name == c.name && !h->vars_[i].is_string && !h->vars_[i].is_stack) c.var = int32_t(i);
        if (c.var < 0) {
            fail(err, "Couldn't find variable", c.var_pos);
            return nullptr;
        }
    }
    for (auto [part, pos] : s.actions)
        if (!p.action(part, pos, host)) return nullptr;
    // The words of onmax and onchange in an element, past the variables: the tracked value,
    // then for save() a sequence word and the saved words.
    for (Action &a : h->actions_) {
        if (a.handler == Action::kOnMatch) continue;
        a.slot = uint32_t(h->vars_.size()) + h->action_words_;
        h->action_words_ += 1;
        if (a.kind == Action::kSave) h->action_words_ += 1 + a.saved.back().word + a.saved.back().words;
        if (a.kind == Action::kSnapshot && !h->snap_) h->snap_ = std::make_unique<SnapshotState>(h->key_bytes_);
    }
    for (Var &v : h->vars_) // the words of those that copy a string or a stack at the hit
        if (v.terms[0].kind == Operand::kString || v.terms[0].kind == Operand::kStack) {
            v.str_word = uint32_t(h->vars_.size()) + h->action_words_ + h->string_words_;
            h->string_words_ += v.is_stack ? kStackDepth : kMaxStringKey / 8;
        }
    if (h->needs_ts_) measure_tsc_scale();
    h->paused_.store(h->want_pause_, std::memory_order_relaxed);
    // The trace clocks whose common_timestamp is this tracer's, CLOCK_MONOTONIC in ns (the
    // kernel's global, local, mono and perf are all nanosecond clocks that only go up);
    // another would change the clock of every event's records, as tracing_set_clock() does.
    if (s.clock != "global" && s.clock != "local" && s.clock != "mono" && s.clock != "perf") {
        fail(err, "Couldn't set trace_clock", s.clock_pos);
        return nullptr;
    }
    h->clock_ = std::string(s.clock);
    h->name_ = std::string(s.name);
    if (!h->name_.empty()) {
        std::lock_guard lock(vars_mu());
        if (auto it = named_hists().find(h->name_); it != named_hists().end()) {
            if (it->second.signature != h->signature()) {
                fail(err, "Named hist trigger doesn't match existing named trigger (includes variables)", s.name_pos);
                return nullptr;
            }
            h->tables_ = it->second.tables; // the first one's, its size too
            h->size_ = h->tables_->cur.load(std::memory_order_acquire)->n_elts;
        }
    }
    if (!h->tables_) {
        h->tables_ = std::make_shared<HistTables>();
        h->tables_->all.push_back(h->new_table());
        h->tables_->cur.store(h->tables_->all.back().get(), std::memory_order_release);
    }
    refusal.h = nullptr;
    return h;
}

namespace {

// A string's bytes into words (the last one zero-padded; what follows it is not read).
void store_string(std::atomic<uint64_t> *words, const char *str, size_t n) noexcept {
    for (size_t i = 0; i <= n; i += 8) {
        uint64_t w = 0;
        copy_bytes(&w, str + i, std::min<size_t>(8, n - i));
        words[i / 8].store(w, std::memory_order_relaxed);
    }
}

// The string field c of a record (its __data_loc word at c.offset): the string, "" when
// the record has none, and its length *n, at most kMaxStringKey - 1 (what a string
// variable, a saved field and a synthetic event's string keep: STR_VAR_LEN_MAX).
const char *record_string(const HistTrigger::Column &c, const uint8_t *rec, uint32_t size, size_t *n) noexcept {
    uint32_t loc = 0;
    if (uint64_t(c.offset) + 4 <= size) copy_bytes(&loc, rec + c.offset, 4);
    const uint32_t off = loc & 0xffff, len = loc >> 16;
    *n = 0;
    if (len == 0 || off + len > size) return "";
    const char *str = reinterpret_cast<const char *>(rec + off);
    *n = bounded_strlen(str, std::min<uint32_t>(len - 1, HistTrigger::kMaxStringKey - 1));
    return str;
}

} // namespace

std::unique_ptr<HistTable> HistTrigger::new_table() const {
    return std::make_unique<HistTable>(size_, key_bytes_, uint32_t(vals_.size()),
                                       uint32_t(vars_.size()) + action_words_ + string_words_);
}

uint64_t HistTrigger::operand_value(const Operand &o, const uint8_t *rec, uint32_t size, uint64_t ts,
                                    const uint64_t *own, const uint64_t *refs) const noexcept {
    switch (o.kind) {
    case Operand::kField:
        if (o.field.size == 0) return uint64_t(int64_t(platform::this_cpu()));
        if (uint64_t(o.field.offset) + o.field.size > size) return 0;
        return load_widened(rec + o.field.offset, o.field.size, o.field.is_signed);
    case Operand::kTimestamp:
        return o.usecs ? ts / 1000 : ts;
    case Operand::kOwnVar:
        return own[o.index];
    case Operand::kRef:
        return refs[o.index];
    case Operand::kConst:
        return o.value;
    case Operand::kString: {
        size_t n = 0;
        return reinterpret_cast<uint64_t>(record_string(o.field, rec, size, &n));
    }
    case Operand::kStack: // only a variable's one operand, taken at the hit (update)
        return 0;
    }
    return 0;
}

namespace {

// v added to a sum: with a locked add, or, when only the calling thread ever writes the
// element (owned), as a load and a store, a fifth of the cost. A hit inside a hit (a
// signal handler's) runs no handler, so nothing comes between the two.
inline void add_to(std::atomic<uint64_t> &sum, uint64_t v, bool owned) noexcept {
    if (owned)
        sum.store(sum.load(std::memory_order_relaxed) + v, std::memory_order_relaxed);
    else
        sum.fetch_add(v, std::memory_order_relaxed);
}

} // namespace

void HistTrigger::update(const uint8_t *rec, uint32_t size, const char *comm, const struct pt_regs *regs) noexcept {
    if (paused_.load(std::memory_order_acquire)) return;
    HistTable *t = tables_->cur.load(std::memory_order_acquire);
    const uint64_t ts = needs_ts_ ? clock_now_ns() : 0;
    uint8_t key[kMaxKeys * kMaxStringKey];
    zero_bytes(key, key_bytes_);
    for (const Column &c : keys_) {
        uint8_t *slot = key + c.key_off;
        if (c.stack && c.size != 0) { // a stack field: its addresses, to the first zero
            uint32_t loc = 0;
            if (uint64_t(c.offset) + 4 <= size) std::memcpy(&loc, rec + c.offset, 4);
            const uint32_t off = loc & 0xffff, n = std::min<uint32_t>(loc >> 16, 8 * kStackDepth) & ~7u;
            if (off + n <= size) copy_bytes(slot, reinterpret_cast<const char *>(rec + off), n);
            continue;
        }
        if (c.stack) { // the addresses, the rest of the slot zero (key zeroed above)
            uint64_t frames[kStackDepth];
            const int n = regs != nullptr ? user_stack(*regs, frames, int(kStackDepth)) : 0;
            copy_bytes(slot, reinterpret_cast<const char *>(frames), 8 * size_t(n));
            continue;
        }
        if (c.is_string) {
            if (uint64_t(c.offset) + 4 > size) continue;
            uint32_t loc;
            std::memcpy(&loc, rec + c.offset, 4);
            const uint32_t off = loc & 0xffff, n = loc >> 16;
            if (n == 0 || off + n > size) continue;
            const char *s = reinterpret_cast<const char *>(rec + off);
            copy_bytes(slot, s, bounded_strlen(s, std::min<uint32_t>(n - 1, kMaxStringKey - 1)));
            continue;
        }
        uint64_t v = 0;
        if (c.timestamp) {
            v = c.usecs ? ts / 1000 : ts;
        } else if (c.size == 0) {
            v = uint64_t(int64_t(platform::this_cpu())); // from rseq: no system call
        } else if (uint64_t(c.offset) + c.size <= size) {
            v = load_widened(rec + c.offset, c.size, c.is_signed);
        }
        if (c.mod == Column::kLog2)
            v = log2_bucket(v);
        else if (c.mod == Column::kBuckets)
            v = v / c.buckets * c.buckets;
        std::memcpy(slot, &v, 8);
    }
    // Other triggers' variables for this key: each must be set (it is read once), or the
    // hit changes nothing here, as the kernel's resolve_var_refs() decides.
    const uint32_t hash = t->hash_of(key);
    uint64_t refs[kMaxRefs];
    for (size_t i = 0; i < refs_.size(); ++i)
        if (!refs_[i].owner->take_var(key, hash, key_bytes_, refs_[i].index, pid_key_off_, &refs[i])) return;
    const int64_t el = t->find_or_insert(key, comm, hash);
    if (el < 0) return;
    // The variables first: a value may sum one (vals=$VAR).
    uint64_t own[kMaxVars];
    for (size_t i = 0; i < vars_.size(); ++i) {
        const size_t slot = size_t(el) * t->n_vars + i;
        if (vars_[i].terms[0].kind == Operand::kStack) { // the stack into the element's words, zero after
            uint64_t frames[kStackDepth] = {};
            if (regs != nullptr) user_stack(*regs, frames, int(kStackDepth));
            std::atomic<uint64_t> *words = &t->vars[size_t(el) * t->n_vars + vars_[i].str_word];
            for (uint32_t k = 0; k < kStackDepth; ++k) words[k].store(frames[k], std::memory_order_relaxed);
            own[i] = reinterpret_cast<uint64_t>(words);
            t->vars[slot].store(own[i], std::memory_order_relaxed);
            t->var_set[slot].store(1, std::memory_order_release);
            continue;
        }
        if (vars_[i].terms[0].kind ==
            Operand::kString) { // the string into the element's words, their address the value
            size_t n = 0;
            const char *str = record_string(vars_[i].terms[0].field, rec, size, &n);
            std::atomic<uint64_t> *words = &t->vars[size_t(el) * t->n_vars + vars_[i].str_word];
            store_string(words, str, n);
            own[i] = reinterpret_cast<uint64_t>(words);
            t->vars[slot].store(own[i], std::memory_order_relaxed);
            t->var_set[slot].store(1, std::memory_order_release);
            continue;
        }
        const std::vector<Operand> &terms = vars_[i].terms;
        uint64_t x[kMaxOperands];
        for (size_t k = 0; k < terms.size(); ++k) x[k] = operand_value(terms[k], rec, size, ts, own, refs);
        const uint64_t total = sum_of_products(terms.data(), terms.size(), x);
        const uint64_t v = vars_[i].negate ? 0 - total : total;
        own[i] = v;
        t->vars[slot].store(v, std::memory_order_relaxed);
        t->var_set[slot].store(1, std::memory_order_release);
    }
    std::atomic<uint64_t> *sums = &t->sums[size_t(el) * t->n_vals];
    const bool owned = pid_key_off_ >= 0;
    add_to(sums[0], 1, owned);
    for (size_t i = 1; i < vals_.size(); i++) {
        const Column &c = vals_[i];
        uint64_t v = 0;
        if (c.hits)
            v = 1;
        else if (c.var >= 0)
            v = own[c.var];
        else if (c.timestamp)
            v = c.usecs ? ts / 1000 : ts;
        else if (c.size == 0)
            v = uint64_t(int64_t(platform::this_cpu()));
        else if (uint64_t(c.offset) + c.size <= size)
            v = load_widened(rec + c.offset, c.size, c.is_signed);
        add_to(sums[i], v, owned);
    }
    for (const Action &a : actions_) {
        if (a.handler != Action::kOnMatch) {
            const uint64_t v = own[a.var];
            if (!track(a, t, el, v)) continue;
            if (a.kind == Action::kSave) {
                save(a, t, el, v, rec, size, comm, ts, own, refs);
                continue;
            }
            if (a.kind == Action::kSnapshot) {
                snapshot(a, key, comm, v);
                continue;
            }
        }
        uint64_t values[kMaxActionParams];
        for (size_t i = 0; i < a.args.size(); ++i) values[i] = operand_value(a.args[i], rec, size, ts, own, refs);
        a.synth->fire(values, a.args.size(), regs);
    }
}

namespace {

// Whether v raises (onmax) or changes (onchange) the tracked value cur: the kernel's
// check_track_val_max() and check_track_val_changed(), unsigned as there.
bool tracks(HistTrigger::Action::Handler handler, uint64_t cur, uint64_t v) noexcept {
    return handler == HistTrigger::Action::kOnMax ? v > cur : v != cur;
}

// A seqlock's write side without a lock: the sequence word goes odd while one writer
// writes. A writer that finds another one writing waits a little, as find_or_insert()
// does for a bucket being filled in, then gives up (that one may have been preempted).
bool begin_write(std::atomic<uint64_t> &seq, uint64_t *s) noexcept {
    uint64_t cur = seq.load(std::memory_order_relaxed);
    for (uint32_t waits = 0;;) {
        if ((cur & 1) == 0 && seq.compare_exchange_weak(cur, cur + 1, std::memory_order_acquire))
            break; // acquire: the words written next stay after the odd word
        if (++waits > HistTable::kPendingWaits) return false;
        __builtin_ia32_pause();
        cur = seq.load(std::memory_order_relaxed);
    }
    *s = cur + 1;
    return true;
}

void end_write(std::atomic<uint64_t> &seq, uint64_t s) noexcept { seq.store(s + 1, std::memory_order_release); }

// Reads words [0, n) written under seq into out, whole (no writer in between); after many
// tries (a writer preempted for long) as they are.
void read_words(const std::atomic<uint64_t> &seq, const std::atomic<uint64_t> *words, size_t n, uint64_t *out) {
    for (int tries = 0;; ++tries) {
        const uint64_t s1 = seq.load(std::memory_order_acquire);
        for (size_t i = 0; i < n; ++i) out[i] = words[i].load(std::memory_order_relaxed);
        std::atomic_thread_fence(std::memory_order_acquire);
        if (((s1 & 1) == 0 && seq.load(std::memory_order_relaxed) == s1) || tries == 10000) return;
        sched_yield();
    }
}

} // namespace

bool HistTrigger::track(const Action &a, HistTable *t, int64_t el, uint64_t v) const noexcept {
    std::atomic<uint64_t> &tracked = t->vars[size_t(el) * t->n_vars + a.slot];
    uint64_t cur = tracked.load(std::memory_order_relaxed);
    do {
        if (!tracks(a.handler, cur, v)) return false;
    } while (!tracked.compare_exchange_weak(cur, v, std::memory_order_acq_rel));
    return true;
}

void HistTrigger::save(const Action &a, HistTable *t, int64_t el, uint64_t v, const uint8_t *rec, uint32_t size,
                       const char *comm, uint64_t ts, const uint64_t *own, const uint64_t *refs) const noexcept {
    std::atomic<uint64_t> *w = &t->vars[size_t(el) * t->n_vars + a.slot];
    uint64_t s;
    if (!begin_write(w[1], &s)) return;
    // A hit that raised the value further (changed it again) since: its fields are the
    // ones to keep, whether it saved them already or is about to.
    if (w[0].load(std::memory_order_relaxed) == v) {
        std::atomic<uint64_t> *saved = w + 2;
        for (const Saved &sv : a.saved) {
            std::atomic<uint64_t> *dst = saved + sv.word;
            if (sv.kind == Saved::kComm) {
                store_string(dst, comm ? comm : "", comm ? bounded_strlen(comm, 15) : 0);
            } else if (sv.kind == Saved::kString) {
                size_t n = 0;
                const char *str = record_string(sv.value.field, rec, size, &n);
                store_string(dst, str, n);
            } else {
                dst->store(operand_value(sv.value, rec, size, ts, own, refs), std::memory_order_relaxed);
            }
        }
    }
    end_write(w[1], s);
}

namespace {
std::atomic<const HistTrigger *> g_snapshot_owner{nullptr}; // the trigger with a snapshot() action
} // namespace

void HistTrigger::snapshot(const Action &a, const uint8_t *key, const char *comm, uint64_t v) const noexcept {
    SnapshotState &st = *snap_;
    uint64_t cur = st.value.load(std::memory_order_relaxed);
    do {
        if (!tracks(a.handler, cur, v)) return;
    } while (!st.value.compare_exchange_weak(cur, v, std::memory_order_acq_rel));
    uint64_t s;
    if (begin_write(st.seq, &s)) {
        if (st.value.load(std::memory_order_relaxed) == v) {
            for (uint32_t i = 0; i < st.key_words; ++i) {
                uint64_t w;
                copy_bytes(&w, key + size_t(i) * 8, 8);
                st.words[i].store(w, std::memory_order_relaxed);
            }
            store_string(&st.words[st.key_words], comm ? comm : "", comm ? bounded_strlen(comm, 15) : 0);
            st.words[st.key_words + 2].store(1, std::memory_order_relaxed);
        }
        end_write(st.seq, s);
    }
    // Lock-free; the spare buffers were allocated when the trigger was installed. A swap
    // already under way (another hit's) stands for this one.
    snapshot_swap();
}

int HistTrigger::claim_snapshot() {
    if (!snap_) return 0;
    int n = 0;
    for (const Action &a : actions_) n += a.kind == Action::kSnapshot;
    if (n > 1) return -EBUSY; // the second one finds the first one's, as in the kernel
    const HistTrigger *none = nullptr;
    if (!g_snapshot_owner.compare_exchange_strong(none, this) && none != this) return -EBUSY;
    if (const int r = snapshot_alloc(); r != 0) {
        g_snapshot_owner.store(nullptr);
        return r;
    }
    return 0;
}

HistTrigger::~HistTrigger() {
    // The agent keeps every trigger for good; a test's or a fuzzer's goes: not findable then.
    const HistTrigger *self = this;
    g_snapshot_owner.compare_exchange_strong(self, nullptr);
    std::lock_guard lock(vars_mu());
    if (published_) leave_name();
    for (auto it = var_table().begin(); it != var_table().end();)
        it = it->second.owner == this ? var_table().erase(it) : std::next(it);
}

void HistTrigger::leave_name() {
    if (name_.empty()) return;
    if (auto it = named_hists().find(name_); it != named_hists().end() && --it->second.installed == 0)
        named_hists().erase(it); // the tables stay with the triggers that had them
}

bool HistTrigger::var_in_usecs(uint32_t index) const {
    const Operand &o = vars_[index].terms.front();
    if (o.kind == Operand::kTimestamp) return o.usecs;
    if (o.kind == Operand::kOwnVar && o.index != index) return var_in_usecs(o.index);
    if (o.kind == Operand::kRef) return refs_[o.index].owner->var_in_usecs(refs_[o.index].index);
    return false;
}

std::string HistTrigger::signature() const {
    std::string s;
    for (const auto *cols : {&keys_, &vals_}) {
        for (const Column &c : *cols)
            s += column_text(c) + "@" + std::to_string(c.offset) + "/" + std::to_string(c.size) +
                 (c.is_signed ? "s" : "u") + (c.is_string ? "S," : ",");
        s += ";";
    }
    for (const SortKey &k : sort_) s += k.text + ",";
    return s + join_tail(vars_, actions_, false) + join_tail(vars_, actions_, true);
}

bool HistTrigger::take_var(const uint8_t *key, uint32_t hash, uint32_t key_bytes, uint32_t index, int32_t pid_key_off,
                           uint64_t *value) const noexcept {
    const HistTable *t = tables_->cur.load(std::memory_order_acquire);
    const int64_t el = t->find(key, t->key_bytes == key_bytes ? hash : t->hash_of(key));
    if (el < 0) return false;
    const size_t slot = size_t(el) * t->n_vars + index;
    // Both keys hold the calling thread's id at one place: the element is its alone.
    if (pid_key_off >= 0 && pid_key_off == pid_key_off_) {
        if (t->var_set[slot].load(std::memory_order_acquire) == 0) return false;
        t->var_set[slot].store(0, std::memory_order_relaxed);
    } else if (t->var_set[slot].exchange(0, std::memory_order_acq_rel) == 0) {
        return false;
    }
    *value = t->vars[slot].load(std::memory_order_relaxed);
    return true;
}

void HistTrigger::publish_vars() {
    std::lock_guard lock(vars_mu());
    if (published_) return;
    published_ = true;
    if (!name_.empty()) {
        NamedHist &n = named_hists()[name_];
        if (n.installed++ == 0) n = NamedHist{tables_, signature(), 1};
    }
    for (uint32_t i = 0; i < vars_.size(); ++i) var_table().insert({vars_[i].name, VarEntry{this, i, event_}});
    for (const Ref &r : refs_) r.owner->users_.fetch_add(1, std::memory_order_relaxed);
    for (const Action &a : actions_)
        if (a.synth) a.synth->users.fetch_add(1, std::memory_order_relaxed);
}

bool HistTrigger::retract_vars() {
    std::lock_guard lock(vars_mu());
    if (!published_) return true;
    if (users_.load(std::memory_order_relaxed) > 0) return false;
    leave_name();
    for (auto it = var_table().begin(); it != var_table().end();)
        it = it->second.owner == this ? var_table().erase(it) : std::next(it);
    for (const Ref &r : refs_) r.owner->users_.fetch_sub(1, std::memory_order_relaxed);
    for (const Action &a : actions_)
        if (a.synth) a.synth->users.fetch_sub(1, std::memory_order_relaxed);
    const HistTrigger *self = this;
    g_snapshot_owner.compare_exchange_strong(self, nullptr); // the kernel's tracing_snapshot_cond_disable()
    published_ = false;
    return true;
}

std::string HistTrigger::spec_text() const {
    std::string s = "hist:";
    if (!name_.empty()) s += "name=" + name_ + ":";
    s += "keys=";
    // Appended piece by piece: GCC 12 warns falsely (-Wrestrict) about `"," + string` at -O3.
    for (size_t i = 0; i < keys_.size(); i++) {
        if (i) s += ',';
        s += column_text(keys_[i]);
    }
    s += ":vals=";
    if (!no_hitcount_) s += "hitcount";
    for (size_t i = 1; i < vals_.size(); i++) {
        if (i > 1 || !no_hitcount_) s += ',';
        s += column_text(vals_[i]);
    }
    s += join_tail(vars_, actions_, false);
    s += ":sort=";
    for (size_t i = 0; i < sort_.size(); i++) s += (i ? "," : "") + sort_[i].text;
    s += ":size=" + std::to_string(size_);
    if (needs_ts_) s += ":clock=" + clock_; // the kernel's, for a trigger that reads the time
    if (no_hitcount_) s += ":nohitcount";
    s += join_tail(vars_, actions_, true);
    if (filter_) s += " if " + filter_->text();
    s += paused() ? " [paused]" : " [active]";
    return s;
}

bool HistTrigger::keys_like(const HistTrigger &target) const {
    if (keys_.size() != target.keys_.size()) return false;
    for (size_t i = 0; i < keys_.size(); ++i) {
        const Column &a = keys_[i], &b = target.keys_[i];
        if (a.key_len != b.key_len || a.is_signed != b.is_signed || a.is_string != b.is_string || a.stack != b.stack)
            return false;
    }
    return true;
}

std::string HistTrigger::field_var_name(std::string_view field) { return "synthetic_" + std::string(field); }

std::string HistTrigger::field_var_spec(std::string_view field) const {
    std::string s = "keys=";
    for (size_t i = 0; i < keys_.size(); ++i) {
        if (i) s += ',';
        s += keys_[i].name;
    }
    s += ":" + field_var_name(field) + "=" + std::string(field);
    if (filter_) s += " if " + filter_->text();
    return s;
}

bool HistTrigger::has_var(std::string_view event, std::string_view name) {
    std::lock_guard lock(vars_mu());
    auto [lo, hi] = var_table().equal_range(name);
    for (auto it = lo; it != hi; ++it)
        if (it->second.event == event) return true;
    return false;
}

void HistTrigger::drop_field_hists() {
    if (host_ == nullptr) return;
    for (const FieldHist &f : field_hists_) host_->drop_field_var_hist(f.group, f.event, f.cmd);
    field_hists_.clear();
}

bool HistTrigger::same_as(const HistTrigger &o) const {
    auto cols = [](const std::vector<Column> &v) {
        std::string s;
        for (const Column &c : v) s += column_text(c) + ",";
        return s;
    };
    auto sorts = [](const std::vector<SortKey> &v) {
        std::string s;
        for (const SortKey &k : v) s += k.text + ",";
        return s;
    };
    const std::string f1 = filter_ ? filter_->text() : "", f2 = o.filter_ ? o.filter_->text() : "";
    return name_ == o.name_ && cols(keys_) == cols(o.keys_) && cols(vals_) == cols(o.vals_) &&
           sorts(sort_) == sorts(o.sort_) && size_ == o.size_ && f1 == f2 &&
           join_tail(vars_, actions_, false) == join_tail(o.vars_, o.actions_, false) &&
           join_tail(vars_, actions_, true) == join_tail(o.vars_, o.actions_, true);
}

void HistTrigger::clear() {
    std::lock_guard lk(tables_->mu);
    tables_->all.push_back(new_table());
    // A hit still inside the old table finishes there; the old table is kept, not freed.
    tables_->cur.store(tables_->all.back().get(), std::memory_order_release);
}

uint64_t HistTrigger::hits() const { return tables_->cur.load(std::memory_order_acquire)->hits(); }
uint64_t HistTrigger::drops() const { return tables_->cur.load(std::memory_order_acquire)->drops.load(); }

namespace {

using Entry = HistTable::Published;

uint64_t key_u64(const Entry &e, const Column &c) {
    uint64_t v;
    std::memcpy(&v, e.key + c.key_off, 8);
    return v;
}

// <0, 0 or >0 as a's key c is below, equal to or above b's: as the kernel's
// tracing_map_cmp_*, strings, or numbers by the field's signedness.
int compare_key(const Entry &a, const Entry &b, const Column &c) {
    if (c.stack) return std::memcmp(a.key + c.key_off, b.key + c.key_off, c.key_len);
    if (c.is_string)
        return strncmp(reinterpret_cast<const char *>(a.key + c.key_off),
                       reinterpret_cast<const char *>(b.key + c.key_off), HistTrigger::kMaxStringKey);
    const uint64_t x = key_u64(a, c), y = key_u64(b, c);
    if (c.is_signed) return int64_t(x) < int64_t(y) ? -1 : int64_t(x) > int64_t(y);
    return x < y ? -1 : x > y;
}

// compare_key's answer for sort key sk, ascending (a sum, or a key).
int compare_sort(const Entry &a, const Entry &b, const SortKey &sk, const std::vector<Column> &keys) {
    if (!sk.is_key) {
        const size_t i = sk.column < 0 ? 0 : size_t(sk.column);
        return a.sums[i] < b.sums[i] ? -1 : a.sums[i] > b.sums[i];
    }
    return compare_key(a, b, keys[size_t(sk.column)]);
}

// The entries in the trigger's sort order, ties by the keys.
void sort_entries(std::vector<Entry> &entries, const std::vector<Column> &keys, const std::vector<SortKey> &sort) {
    std::sort(entries.begin(), entries.end(), [&](const Entry &a, const Entry &b) {
        for (const SortKey &sk : sort) {
            int r = compare_sort(a, b, sk, keys);
            if (sk.descending) r = -r;
            if (r) return r < 0;
        }
        for (const Column &c : keys) // ties: by the keys, for a stable order
            if (const int r = compare_key(a, b, c)) return r < 0;
        return false;
    });
}

// Appends "name: value" of key c of entry e, the value as its modifier prints it.
// The name of system call nr on this architecture, as the kernel's .syscall prints it.
const char *syscall_name(uint64_t nr) {
    static constexpr std::pair<uint64_t, const char *> kNames[] = {
#include "trace/syscall_names.inc"
    };
    for (const auto &[n, name] : kNames)
        if (n == nr) return name;
    return "unknown_syscall";
}

void append_key(const Entry &e, const Column &c, const Symbolizer &sym, std::string &out) {
    char buf[512];
    if (c.is_string) {
        const char *s = reinterpret_cast<const char *>(e.key + c.key_off);
        std::snprintf(buf, sizeof buf, "%s: %-50s", c.name.c_str(),
                      std::string(s, strnlen(s, HistTrigger::kMaxStringKey)).c_str());
        out += buf;
        return;
    }
    const uint64_t v = key_u64(e, c);
    if (c.modifier == "hex") {
        std::snprintf(buf, sizeof buf, "%s: %" PRIx64, c.name.c_str(), v);
    } else if (c.modifier == "sym" || c.modifier == "sym-offset") {
        const bool off = c.modifier == "sym-offset";
        std::string s = sym ? sym(v, off) : std::string();
        if (s.empty()) {
            char hex[32];
            std::snprintf(hex, sizeof hex, "0x%" PRIx64, v);
            s = hex;
        }
        std::snprintf(buf, sizeof buf, off ? "%s: [%" PRIx64 "] %-55s" : "%s: [%" PRIx64 "] %-45s", c.name.c_str(), v,
                      s.c_str());
    } else if (c.modifier == "execname") {
        std::snprintf(buf, sizeof buf, "%s: %-16s[%10" PRIu64 "]", c.name.c_str(), e.comm, v);
    } else if (c.modifier == "syscall") {
        std::snprintf(buf, sizeof buf, "%s: %-30s[%3" PRIu64 "]", c.name.c_str(), syscall_name(v), v);
    } else if (c.modifier == "log2") {
        std::snprintf(buf, sizeof buf, "%s: ~ 2^%-2" PRIu64, c.name.c_str(), v);
    } else if (c.modifier == "buckets") {
        std::snprintf(buf, sizeof buf, "%s: ~ %" PRIu64 "-%" PRIu64, c.name.c_str(), v, v + c.buckets - 1);
    } else {
        std::snprintf(buf, sizeof buf, "%s: %10" PRIu64, c.name.c_str(), v);
    }
    out += buf;
}

// Appends "{ keys }" of entry e. A stack is a line per address, as the kernel prints one.
void append_keys(const Entry &e, const std::vector<Column> &keys, const Symbolizer &sym, std::string &out) {
    out += "{ ";
    bool multiline = false;
    for (size_t i = 0; i < keys.size(); i++) {
        if (i) out += ", ";
        if (!keys[i].stack) {
            append_key(e, keys[i], sym, out);
            continue;
        }
        // A stack field shown with .stacktrace: its first address on the line of its name, as
        // the kernel's hist_trigger_print_key() prints one.
        out += keys[i].name + (keys[i].modifier == "stacktrace" ? ".stacktrace" : ":\n");
        for (uint32_t f = 0; f < HistTrigger::kStackDepth; ++f) {
            uint64_t a;
            std::memcpy(&a, e.key + keys[i].key_off + 8 * f, 8);
            if (a == 0) break;
            out += std::string(9, ' ') + sym(a, true) + "\n";
        }
        multiline = true;
    }
    out += multiline ? "}" : " }";
}

// val's share of total in hundredths of a percent, as the kernel's __get_percentage(); -1
// when it cannot say (a value with no total).
int64_t hundredths_of_percent(uint64_t val, uint64_t total) {
    if (total == 0) return val != 0 ? -1 : 0;
    if (val < UINT64_MAX / 10000) return int64_t(val * 10000 / total);
    total /= 10000;
    return total == 0 ? -1 : int64_t(val / total);
}

// The per-column total and largest value over the entries, for .percent and .graph.
struct ColumnStats {
    std::vector<uint64_t> total, max;
};

ColumnStats column_stats(const std::vector<Entry> &entries, size_t n_vals) {
    ColumnStats st{std::vector<uint64_t>(n_vals), std::vector<uint64_t>(n_vals)};
    for (const Entry &e : entries)
        for (size_t i = 0; i < n_vals; i++) {
            st.total[i] += e.sums[i];
            st.max[i] = std::max(st.max[i], e.sums[i]);
        }
    return st;
}

// One value of an entry's line: "  NAME: N" (hex with .hex), "  NAME (%):  PP.PP" of the
// column's total, or "  NAME: ####" a bar of 20 characters against the largest.
void append_value(const Column &c, uint64_t v, uint64_t total, uint64_t max, std::string &out) {
    char buf[512];
    if (c.mod == Column::kPercent) {
        const int64_t pc = hundredths_of_percent(v, total);
        if (pc < 0)
            std::snprintf(buf, sizeof buf, "  %s (%%):[ERROR]", c.name.c_str());
        else
            std::snprintf(buf, sizeof buf, "  %s (%%): %3u.%02u", c.name.c_str(), unsigned(pc / 100),
                          unsigned(pc % 100));
    } else if (c.mod == Column::kGraph) {
        constexpr int kBar = 20;
        const int64_t pc = hundredths_of_percent(v, max);
        std::string bar = pc < 0 ? "[ERROR]" : std::string(size_t(pc * kBar / 10000), '#');
        if (pc >= 0) bar.resize(kBar, ' ');
        std::snprintf(buf, sizeof buf, "  %s: %20s", c.name.c_str(), bar.c_str());
    } else {
        std::snprintf(buf, sizeof buf, c.mod == Column::kHex ? "  %s: %10" PRIx64 : "  %s: %10" PRIu64, c.name.c_str(),
                      v);
    }
    out += buf;
}

// Appends entry e's line, without its newline: "{ keys } hitcount: N  value: N..." (no
// hitcount with `no_hitcount`).
void append_entry(const Entry &e, const std::vector<Column> &keys, const std::vector<Column> &vals, bool no_hitcount,
                  const ColumnStats &st, const Symbolizer &sym, std::string &out) {
    char buf[512];
    append_keys(e, keys, sym, out);
    if (!no_hitcount) {
        std::snprintf(buf, sizeof buf, " hitcount: %10" PRIu64, e.sums[0]);
        out += buf;
    }
    for (size_t i = 1; i < vals.size(); i++) append_value(vals[i], e.sums[i], st.total[i], st.max[i], out);
}

// The string in words (at most n of them), NUL-terminated.
std::string words_string(const uint64_t *words, size_t n) {
    std::string s(reinterpret_cast<const char *>(words), n * 8);
    return s.substr(0, s.find('\0'));
}

} // namespace

// The lines the kernel's print_actions() appends to an entry: per onmax/onchange action
// but snapshot(), "\n\tmax: N" ("changed: N"), then save()'s "  NAME: N" of each field.
// elts: the entry's elements (more than one when a passed-over bucket made its key twice:
// the one with the largest value, for onmax, is shown).
std::string HistTrigger::action_lines(const HistTable &t, const std::vector<uint32_t> &elts) const {
    std::string out;
    char buf[512];
    for (const Action &a : actions_) {
        if (a.handler == Action::kOnMatch || a.kind == Action::kSnapshot) continue;
        uint32_t el = elts[0];
        for (uint32_t e : elts)
            if (a.handler == Action::kOnMax &&
                t.vars[size_t(e) * t.n_vars + a.slot].load() > t.vars[size_t(el) * t.n_vars + a.slot].load())
                el = e;
        const std::atomic<uint64_t> *w = &t.vars[size_t(el) * t.n_vars + a.slot];
        std::snprintf(buf, sizeof buf, "\n\t%s: %10" PRIu64, a.handler == Action::kOnMax ? "max" : "changed",
                      w[0].load(std::memory_order_relaxed));
        out += buf;
        if (a.kind != Action::kSave) continue;
        const uint32_t n = a.saved.back().word + a.saved.back().words;
        std::vector<uint64_t> saved(n);
        const uint64_t seq = w[1].load(std::memory_order_acquire);
        read_words(w[1], w + 2, n, saved.data());
        for (const Saved &sv : a.saved) {
            if (sv.kind == Saved::kNumber) {
                std::snprintf(buf, sizeof buf, "  %s: %10" PRIu64, sv.name.c_str(), saved[sv.word]);
            } else {
                // Never saved: the kernel prints its null string pointer so.
                const std::string str = seq == 0 ? "(null)" : words_string(&saved[sv.word], sv.words);
                std::snprintf(buf, sizeof buf, "  %s: %-32s", sv.name.c_str(), str.c_str());
            }
            out += buf;
        }
    }
    return out;
}

// The kernel's track_data_snapshot_print(): what the last snapshot() was taken for.
std::string HistTrigger::snapshot_lines(const Symbolizer &sym) const {
    if (!snap_) return {};
    const SnapshotState &st = *snap_;
    std::vector<uint64_t> words(st.key_words + 3);
    read_words(st.seq, st.words.get(), words.size(), words.data());
    if (words[st.key_words + 2] == 0) return {};
    const Action *a = nullptr;
    for (const Action &x : actions_)
        if (x.kind == Action::kSnapshot) a = &x;
    char buf[512];
    std::snprintf(buf, sizeof buf,
                  "\nSnapshot taken (see tracing/snapshot).  Details:\n\ttriggering value { %s(%s) }: %10" PRIu64
                  "\ttriggered by event with key: ",
                  a->handler == Action::kOnMax ? "onmax" : "onchange", a->var_text.c_str(),
                  st.value.load(std::memory_order_relaxed));
    std::string out = buf;
    char comm[17] = {};
    std::memcpy(comm, &words[st.key_words], 16);
    const Entry e{reinterpret_cast<const uint8_t *>(words.data()), comm, {}};
    append_keys(e, keys_, sym, out);
    return out + "\n";
}

std::string HistTrigger::show(const Symbolizer &sym) const {
    std::lock_guard lk(tables_->mu);
    const HistTable *t = tables_->cur.load(std::memory_order_acquire);
    std::string out = "# event histogram\n#\n# trigger info: " + spec_text() + "\n#\n\n";
    std::vector<Entry> entries = t->published();
    sort_entries(entries, keys_, sort_);
    // The elements of each key, for the actions' words: a key may have two (published()).
    std::unordered_map<std::string, std::vector<uint32_t>> elts;
    if (action_words_ > 0)
        for (uint32_t b = 0; b < t->n_buckets; b++)
            if (const uint32_t e = t->bucket_elt[b].load(std::memory_order_acquire))
                elts[std::string(reinterpret_cast<const char *>(t->keys.get()) + size_t(e - 1) * key_bytes_,
                                 key_bytes_)]
                    .push_back(e - 1);
    const ColumnStats st = column_stats(entries, vals_.size());
    for (const Entry &e : entries) {
        append_entry(e, keys_, vals_, no_hitcount_, st, sym, out);
        if (action_words_ > 0)
            out += action_lines(*t, elts[std::string(reinterpret_cast<const char *>(e.key), key_bytes_)]);
        out += "\n";
    }
    out += snapshot_lines(sym);
    char buf[512];
    std::snprintf(buf, sizeof buf, "\nTotals:\n    Hits: %" PRIu64 "\n    Entries: %zu\n    Dropped: %" PRIu64 "\n",
                  t->hits(), entries.size(), t->drops.load());
    out += buf;
    return out;
}

} // namespace ukp::trace
