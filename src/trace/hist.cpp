#include "trace/hist.hpp"
#include "trace/hist_table.hpp"
#include "trace/bytes.hpp"
#include "platform/this_cpu.hpp"

#include <sched.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>

namespace ukp::trace {

namespace {

constexpr const char *kFieldNotFound = "Couldn't find field";
constexpr const char *kBadModifier = "Invalid field modifier";
constexpr const char *kInvalidSortModifier = "Invalid sort modifier";
constexpr const char *kEmptySortField = "Empty sort field";
constexpr const char *kTooManySort = "Too many sort fields (Max = 2)";
constexpr const char *kInvalidSortField = "Sort field must be a key or a val";
constexpr const char *kStringOperand = "String type can not be an operand in expression";
constexpr uint32_t kMaxKeys = 3, kMaxVals = 3; // TRACING_MAP_KEYS_MAX, TRACING_MAP_VALS_MAX
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
    std::string s = c.name;
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
    bool have_keys = false, have_sort = false;
    int bits = kMapBitsDefault; // log2 of the table's elements
    bool pause = false, cont = false, clear = false;
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
    if (name == "common_cpu" || name == "cpu" || name == "CPU") {
        c->size = 0; // marks the CPU pseudo-field
        return true;
    }
    const Field *f = find_field(fields, name);
    if (!f) return fail(err, kFieldNotFound, pos);
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
    const std::string_view mod = dot == std::string_view::npos ? std::string_view() : text.substr(dot + 1);
    if (mod.empty()) return true;
    return apply_modifier(mod, pos + int(dot) + 1, key, c, err);
}

// `modifier` decoded for the hit path.
Column::Mod modifier_code(const std::string &modifier) {
    static constexpr std::pair<const char *, Column::Mod> kMods[] = {
        {"hex", Column::kHex},           {"sym", Column::kSym},   {"sym-offset", Column::kSymOffset},
        {"execname", Column::kExecname}, {"log2", Column::kLog2}, {"buckets", Column::kBuckets}};
    for (auto [n, m] : kMods)
        if (modifier == n) return m;
    return Column::kNone;
}

// The keys of "keys=" at pos, packed one after another into *key_bytes of key; false and
// *err on a bad one or too many.
bool parse_keys(std::string_view text, int pos, const std::vector<Field> &fields, std::vector<Column> *keys,
                uint32_t *key_bytes, FilterError *err) {
    const auto parts = split(text, ',', pos);
    if (parts.size() > kMaxKeys) return fail(err, "Too many keys (max 3)", pos);
    for (auto [part, at] : parts) {
        Column c;
        if (part.empty()) return fail(err, kFieldNotFound, at);
        if (!make_column(part, at, true, fields, &c, err)) return false;
        c.mod = modifier_code(c.modifier);
        c.key_off = *key_bytes;
        c.key_len = c.is_string ? HistTrigger::kMaxStringKey : 8;
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
        if (!make_column(part, at, false, fields, &c, err)) return false;
        if (vals->size() > kMaxVals) return fail(err, "Too many values (max 3)", at);
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

HistTrigger::~HistTrigger() = default;

std::unique_ptr<HistTrigger> HistTrigger::parse(std::string_view spec, int spec_pos, std::unique_ptr<Filter> filter,
                                                const std::vector<Field> &fields, FilterError *err) {
    HistSpec s;
    if (!parse_attributes(spec, spec_pos, &s, err)) return nullptr;
    std::unique_ptr<HistTrigger> h(new HistTrigger());
    h->filter_ = std::move(filter);
    h->want_pause_ = s.pause;
    h->want_cont_ = s.cont;
    h->want_clear_ = s.clear;
    h->size_ = 1u << s.bits;
    if (!parse_keys(s.keys, s.keys_pos, fields, &h->keys_, &h->key_bytes_, err)) return nullptr;
    if (!parse_vals(s.vals, s.vals_pos, fields, &h->vals_, err)) return nullptr;
    if (!parse_sort(s, h->keys_, h->vals_, &h->sort_, err)) return nullptr;
    h->paused_.store(h->want_pause_, std::memory_order_relaxed);
    h->tables_.push_back(std::make_unique<HistTable>(h->size_, h->key_bytes_, uint32_t(h->vals_.size())));
    h->table_.store(h->tables_.back().get(), std::memory_order_release);
    return h;
}

void HistTrigger::update(const uint8_t *rec, uint32_t size, const char *comm) noexcept {
    if (paused_.load(std::memory_order_acquire)) return;
    HistTable *t = table_.load(std::memory_order_acquire);
    uint8_t key[kMaxKeys * kMaxStringKey];
    zero_bytes(key, key_bytes_);
    for (const Column &c : keys_) {
        uint8_t *slot = key + c.key_off;
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
        if (c.size == 0) {
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
    const int64_t el = t->find_or_insert(key, comm);
    if (el < 0) return;
    t->hits.fetch_add(1, std::memory_order_relaxed); // the kernel's map->hits leaves drops out
    std::atomic<uint64_t> *sums = &t->sums[size_t(el) * t->n_vals];
    sums[0].fetch_add(1, std::memory_order_relaxed);
    for (size_t i = 1; i < vals_.size(); i++) {
        const Column &c = vals_[i];
        uint64_t v = 0;
        if (c.size == 0)
            v = uint64_t(int64_t(platform::this_cpu()));
        else if (uint64_t(c.offset) + c.size <= size)
            v = load_widened(rec + c.offset, c.size, c.is_signed);
        sums[i].fetch_add(v, std::memory_order_relaxed);
    }
}

std::string HistTrigger::spec_text() const {
    std::string s = "hist:keys=";
    // Appended piece by piece: GCC 12 warns falsely (-Wrestrict) about `"," + string` at -O3.
    for (size_t i = 0; i < keys_.size(); i++) {
        if (i) s += ',';
        s += column_text(keys_[i]);
    }
    s += ":vals=hitcount";
    for (size_t i = 1; i < vals_.size(); i++) {
        s += ',';
        s += column_text(vals_[i]);
    }
    s += ":sort=";
    for (size_t i = 0; i < sort_.size(); i++) s += (i ? "," : "") + sort_[i].text;
    s += ":size=" + std::to_string(size_);
    if (filter_) s += " if " + filter_->text();
    s += paused() ? " [paused]" : " [active]";
    return s;
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
    return cols(keys_) == cols(o.keys_) && cols(vals_) == cols(o.vals_) && sorts(sort_) == sorts(o.sort_) &&
           size_ == o.size_ && f1 == f2;
}

void HistTrigger::clear() {
    std::lock_guard lk(mu_);
    tables_.push_back(std::make_unique<HistTable>(size_, key_bytes_, uint32_t(vals_.size())));
    // A hit still inside the old table finishes there; the old table is kept, not freed.
    table_.store(tables_.back().get(), std::memory_order_release);
}

uint64_t HistTrigger::hits() const { return table_.load(std::memory_order_acquire)->hits.load(); }
uint64_t HistTrigger::drops() const { return table_.load(std::memory_order_acquire)->drops.load(); }

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
    } else if (c.modifier == "log2") {
        std::snprintf(buf, sizeof buf, "%s: ~ 2^%-2" PRIu64, c.name.c_str(), v);
    } else if (c.modifier == "buckets") {
        std::snprintf(buf, sizeof buf, "%s: ~ %" PRIu64 "-%" PRIu64, c.name.c_str(), v, v + c.buckets - 1);
    } else {
        std::snprintf(buf, sizeof buf, "%s: %10" PRIu64, c.name.c_str(), v);
    }
    out += buf;
}

// Appends entry e's line: "{ keys } hitcount: N  value: N...".
void append_entry(const Entry &e, const std::vector<Column> &keys, const std::vector<Column> &vals,
                  const Symbolizer &sym, std::string &out) {
    char buf[512];
    out += "{ ";
    for (size_t i = 0; i < keys.size(); i++) {
        if (i) out += ", ";
        append_key(e, keys[i], sym, out);
    }
    out += " }";
    std::snprintf(buf, sizeof buf, " hitcount: %10" PRIu64, e.sums[0]);
    out += buf;
    for (size_t i = 1; i < vals.size(); i++) {
        std::snprintf(buf, sizeof buf, vals[i].modifier == "hex" ? "  %s: %10" PRIx64 : "  %s: %10" PRIu64,
                      vals[i].name.c_str(), e.sums[i]);
        out += buf;
    }
    out += "\n";
}

} // namespace

std::string HistTrigger::show(const Symbolizer &sym) const {
    std::lock_guard lk(mu_);
    const HistTable *t = table_.load(std::memory_order_acquire);
    std::string out = "# event histogram\n#\n# trigger info: " + spec_text() + "\n#\n\n";
    std::vector<Entry> entries = t->published();
    sort_entries(entries, keys_, sort_);
    for (const Entry &e : entries) append_entry(e, keys_, vals_, sym, out);
    char buf[512];
    std::snprintf(buf, sizeof buf, "\nTotals:\n    Hits: %" PRIu64 "\n    Entries: %zu\n    Dropped: %" PRIu64 "\n",
                  t->hits.load(), entries.size(), t->drops.load());
    out += buf;
    return out;
}

} // namespace ukp::trace
