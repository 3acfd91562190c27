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
        out.push_back({s.substr(start, e == std::string_view::npos ? std::string_view::npos : e - start),
                       base + int(start)});
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

// The field's value widened to 64 bits (sign-extended when signed), as the kernel's
// hist_field_s32() and friends.
uint64_t load_int(const uint8_t *p, uint32_t size, bool is_signed) {
    switch (size) {
    case 1: { uint8_t v; std::memcpy(&v, p, 1); return is_signed ? uint64_t(int64_t(int8_t(v))) : v; }
    case 2: { uint16_t v; std::memcpy(&v, p, 2); return is_signed ? uint64_t(int64_t(int16_t(v))) : v; }
    case 4: { uint32_t v; std::memcpy(&v, p, 4); return is_signed ? uint64_t(int64_t(int32_t(v))) : v; }
    default: { uint64_t v; std::memcpy(&v, p, 8); return v; }
    }
}

std::string column_text(const HistTrigger::Column &c) {
    std::string s = c.name;
    if (!c.modifier.empty()) s += "." + c.modifier;
    if (c.modifier == "buckets") s += "=" + std::to_string(c.buckets);
    return s;
}

} // namespace

HistTrigger::~HistTrigger() = default;

std::unique_ptr<HistTrigger> HistTrigger::parse(std::string_view spec, int spec_pos, std::unique_ptr<Filter> filter,
                                                const std::vector<Field> &fields, FilterError *err) {
    std::unique_ptr<HistTrigger> h(new HistTrigger());
    h->filter_ = std::move(filter);
    std::string_view keys_str, vals_str, sort_str;
    int keys_pos = 0, vals_pos = 0, sort_pos = 0;
    int bits = kMapBitsDefault;
    bool have_keys = false;
    for (auto [part, pos] : split(spec, ':', spec_pos)) {
        auto value_of = [p = part](std::string_view prefix) { return p.substr(prefix.size()); };
        if (part.starts_with("keys=") || part.starts_with("key=")) {
            const size_t eq = part.find('=') + 1;
            keys_str = part.substr(eq);
            keys_pos = pos + int(eq);
            have_keys = true;
        } else if (part.starts_with("values=") || part.starts_with("vals=") || part.starts_with("val=")) {
            const size_t eq = part.find('=') + 1;
            vals_str = part.substr(eq);
            vals_pos = pos + int(eq);
        } else if (part.starts_with("sort=")) {
            sort_str = value_of("sort=");
            sort_pos = pos + 5;
        } else if (part.starts_with("size=")) {
            const std::string num(value_of("size="));
            char *end = nullptr;
            errno = 0;
            const unsigned long long n = num.empty() ? 0 : strtoull(num.c_str(), &end, 0);
            if (num.empty() || errno || *end || num[0] == '-' || n == 0 || n > (1ull << 32))
                return fail(err, "Invalid size", pos + 5), nullptr;
            int b = 0;
            while ((1ull << b) < n) b++;
            if (b < kMapBitsMin || b > kMapBitsMax)
                return fail(err, "Invalid size (128..131072 entries)", pos + 5), nullptr;
            bits = b;
        } else if (part == "pause") {
            h->want_pause_ = true;
        } else if (part == "cont" || part == "continue") {
            h->want_cont_ = true;
        } else if (part == "clear") {
            h->want_clear_ = true;
        } else {
            return fail(err, "Unknown hist attribute", pos), nullptr;
        }
    }
    if (!have_keys || keys_str.empty()) return fail(err, "Missing keys=", spec_pos), nullptr;
    h->size_ = 1u << bits;

    auto find_field = [&](std::string_view name) -> const Field * {
        for (const Field &f : fields)
            if (f.name == name) return &f;
        return nullptr;
    };
    auto make_column = [&](std::string_view text, int pos, bool key, Column *c) -> bool {
        const size_t dot = text.find('.');
        const std::string_view name = text.substr(0, dot);
        std::string_view mod = dot == std::string_view::npos ? std::string_view() : text.substr(dot + 1);
        c->name = std::string(name);
        if (name == "common_cpu" || name == "cpu" || name == "CPU") {
            c->modifier = "cpu"; // internal marker, cleared below
        } else {
            const Field *f = find_field(name);
            if (!f) return fail(err, kFieldNotFound, pos);
            c->is_string = f->print == Print::kString;
            c->is_signed = f->is_signed;
            c->offset = f->offset;
            c->size = c->is_string ? 4 : f->size * (f->array_len ? f->array_len : 1);
            if (!c->is_string && c->size != 1 && c->size != 2 && c->size != 4 && c->size != 8)
                return fail(err, kFieldNotFound, pos);
        }
        const bool cpu = c->modifier == "cpu";
        c->modifier.clear();
        if (cpu) c->size = 0; // marks the CPU pseudo-field
        if (!key && c->is_string) return fail(err, kStringOperand, pos);
        if (mod.empty()) return true;
        const int mpos = pos + int(dot) + 1;
        if (mod == "hex" || mod == "sym" || mod == "sym-offset" || mod == "log2") {
            if (c->is_string) return fail(err, kBadModifier, mpos);
            if (!key && mod != "hex") return fail(err, kBadModifier, mpos);
            c->modifier = std::string(mod);
        } else if (mod == "execname") {
            if (!key || name != "common_pid") return fail(err, kBadModifier, mpos);
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
    };

    const auto key_parts = split(keys_str, ',', keys_pos);
    if (key_parts.size() > kMaxKeys) return fail(err, "Too many keys (max 3)", keys_pos), nullptr;
    for (auto [text, pos] : key_parts) {
        Column c;
        if (text.empty() || !make_column(text, pos, true, &c)) {
            if (text.empty()) fail(err, kFieldNotFound, pos);
            return nullptr;
        }
        static constexpr std::pair<const char *, Column::Mod> kMods[] = {
            {"hex", Column::kHex},           {"sym", Column::kSym},   {"sym-offset", Column::kSymOffset},
            {"execname", Column::kExecname}, {"log2", Column::kLog2}, {"buckets", Column::kBuckets}};
        for (auto [n, m] : kMods)
            if (c.modifier == n) c.mod = m;
        c.key_off = h->key_bytes_;
        c.key_len = c.is_string ? kMaxStringKey : 8;
        h->key_bytes_ += c.key_len;
        h->keys_.push_back(std::move(c));
    }
    Column hitcount;
    hitcount.name = "hitcount";
    h->vals_.push_back(hitcount);
    if (!vals_str.empty()) {
        bool seen_hitcount = false;
        for (auto [text, pos] : split(vals_str, ',', vals_pos)) {
            if (text == "hitcount" && !seen_hitcount) {
                seen_hitcount = true;
                continue;
            }
            Column c;
            if (text.empty()) return fail(err, kFieldNotFound, pos), nullptr;
            if (!make_column(text, pos, false, &c)) return nullptr;
            if (h->vals_.size() > kMaxVals) return fail(err, "Too many values (max 3)", pos), nullptr;
            c.key_off = uint32_t(h->vals_.size());
            h->vals_.push_back(std::move(c));
        }
    }

    if (!sort_str.empty() || sort_pos) {
        const auto parts = split(sort_str, ',', sort_pos);
        if (parts.size() > 2) return fail(err, kTooManySort, sort_pos), nullptr;
        for (auto [text, pos] : parts) {
            if (text.empty()) return fail(err, kEmptySortField, pos), nullptr;
            SortKey sk;
            std::string_view name = text;
            const size_t dot = text.find('.');
            if (dot != std::string_view::npos) {
                const std::string_view mod = text.substr(dot + 1);
                if (mod == "descending") sk.descending = true;
                else if (mod != "ascending") return fail(err, kInvalidSortModifier, pos + int(dot) + 1), nullptr;
                name = text.substr(0, dot);
            }
            if (name == "hitcount") {
                sk.column = -1;
                sk.text = "hitcount";
            } else {
                bool found = false;
                for (size_t k = 0; k < h->keys_.size() && !found; k++)
                    if (h->keys_[k].name == name) { sk.column = int(k); sk.is_key = true; found = true; }
                for (size_t v = 1; v < h->vals_.size() && !found; v++)
                    if (h->vals_[v].name == name) { sk.column = int(v); sk.is_key = false; found = true; }
                if (!found) return fail(err, kInvalidSortField, pos), nullptr;
                sk.text = column_text(sk.is_key ? h->keys_[size_t(sk.column)] : h->vals_[size_t(sk.column)]);
            }
            if (sk.descending) sk.text += ".descending";
            h->sort_.push_back(std::move(sk));
        }
    } else {
        SortKey sk;
        sk.text = "hitcount";
        h->sort_.push_back(sk);
    }
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
            v = load_int(rec + c.offset, c.size, c.is_signed);
        }
        if (c.mod == Column::kLog2) v = log2_bucket(v);
        else if (c.mod == Column::kBuckets) v = v / c.buckets * c.buckets;
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
        if (c.size == 0) v = uint64_t(int64_t(platform::this_cpu()));
        else if (uint64_t(c.offset) + c.size <= size) v = load_int(rec + c.offset, c.size, c.is_signed);
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

std::string HistTrigger::show(const Symbolizer &sym) const {
    std::lock_guard lk(mu_);
    const HistTable *t = table_.load(std::memory_order_acquire);
    std::string out = "# event histogram\n#\n# trigger info: " + spec_text() + "\n#\n\n";

    using Entry = HistTable::Published;
    std::vector<Entry> entries = t->published();
    auto key_u64 = [](const Entry &e, const Column &c) {
        uint64_t v;
        std::memcpy(&v, e.key + c.key_off, 8);
        return v;
    };
    // As the kernel's tracing_map_cmp_*: strings, or numbers by the field's signedness.
    auto cmp_key = [&](const Entry &a, const Entry &b, const Column &c) -> int {
        if (c.is_string)
            return strncmp(reinterpret_cast<const char *>(a.key + c.key_off),
                           reinterpret_cast<const char *>(b.key + c.key_off), kMaxStringKey);
        const uint64_t x = key_u64(a, c), y = key_u64(b, c);
        if (c.is_signed) return int64_t(x) < int64_t(y) ? -1 : int64_t(x) > int64_t(y);
        return x < y ? -1 : x > y;
    };
    auto cmp_sort = [&](const Entry &a, const Entry &b, const SortKey &sk) -> int {
        if (!sk.is_key) {
            const size_t i = sk.column < 0 ? 0 : size_t(sk.column);
            return a.sums[i] < b.sums[i] ? -1 : a.sums[i] > b.sums[i];
        }
        return cmp_key(a, b, keys_[size_t(sk.column)]);
    };
    std::sort(entries.begin(), entries.end(), [&](const Entry &a, const Entry &b) {
        for (const SortKey &sk : sort_) {
            int r = cmp_sort(a, b, sk);
            if (sk.descending) r = -r;
            if (r) return r < 0;
        }
        for (const Column &c : keys_) // ties: by the keys, for a stable order
            if (const int r = cmp_key(a, b, c)) return r < 0;
        return false;
    });

    char buf[512];
    for (const Entry &e : entries) {
        out += "{ ";
        for (size_t i = 0; i < keys_.size(); i++) {
            const Column &c = keys_[i];
            if (i) out += ", ";
            if (c.is_string) {
                std::snprintf(buf, sizeof buf, "%s: %-50s", c.name.c_str(),
                              std::string(reinterpret_cast<const char *>(e.key + c.key_off),
                                          strnlen(reinterpret_cast<const char *>(e.key + c.key_off), kMaxStringKey))
                                  .c_str());
                out += buf;
                continue;
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
                std::snprintf(buf, sizeof buf, off ? "%s: [%" PRIx64 "] %-55s" : "%s: [%" PRIx64 "] %-45s",
                              c.name.c_str(), v, s.c_str());
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
        out += " }";
        std::snprintf(buf, sizeof buf, " hitcount: %10" PRIu64, e.sums[0]);
        out += buf;
        for (size_t i = 1; i < vals_.size(); i++) {
            std::snprintf(buf, sizeof buf, vals_[i].modifier == "hex" ? "  %s: %10" PRIx64 : "  %s: %10" PRIu64,
                          vals_[i].name.c_str(), e.sums[i]);
            out += buf;
        }
        out += "\n";
    }
    std::snprintf(buf, sizeof buf, "\nTotals:\n    Hits: %" PRIu64 "\n    Entries: %zu\n    Dropped: %" PRIu64 "\n",
                  t->hits.load(), entries.size(), t->drops.load());
    out += buf;
    return out;
}

} // namespace ukp::trace
