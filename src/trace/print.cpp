#include "trace/print.hpp"

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "symbols/symbols.hpp"

namespace ukp::trace {

namespace {

// The symbol holding addr in any object (data symbols too), or null: the nearest sized
// symbol at or below addr that contains it (a few below are tried: zero-sized labels and
// local symbols may sit in between).
const sym::Symbol *symbol_holding(const std::vector<std::shared_ptr<const sym::Object>> &objects, uint64_t addr) {
    for (const auto &obj : objects) {
        const auto &v = obj->symbols();
        auto it =
            std::upper_bound(v.begin(), v.end(), addr, [](uint64_t a, const sym::Symbol &s) { return a < s.value; });
        const sym::Symbol *best = nullptr;
        for (int tries = 0; it != v.begin() && tries < 64; ++tries) {
            --it;
            if (it->size != 0 && addr - it->value < it->size) best = &*it; // the first at one address wins
            if (best != nullptr && it->value != best->value) break;
        }
        if (best != nullptr) return best;
    }
    return nullptr;
}

constexpr const char *kPrintNames[] = {"unsigned", "signed", "hex", "char", "string", "symbol", "stack"};

std::vector<std::string_view> split(std::string_view line, char sep) {
    std::vector<std::string_view> parts;
    size_t start = 0;
    for (;;) {
        const size_t at = line.find(sep, start);
        parts.push_back(line.substr(start, at == std::string_view::npos ? std::string_view::npos : at - start));
        if (at == std::string_view::npos) return parts;
        start = at + 1;
    }
}

bool to_u32(std::string_view s, uint32_t *v) {
    if (s.empty() || s.size() > 10 || s.find_first_not_of("0123456789") != std::string_view::npos) return false;
    const unsigned long long n = std::strtoull(std::string(s).c_str(), nullptr, 10);
    if (n > UINT32_MAX) return false;
    *v = static_cast<uint32_t>(n);
    return true;
}

} // namespace

std::string symbol_text(const std::vector<std::shared_ptr<const sym::Object>> &objects, uint64_t addr, bool with_size) {
    const sym::Symbol *s = symbol_holding(objects, addr);
    if (s == nullptr) return {};
    std::string out = s->name;
    if (with_size) {
        char buf[64];
        std::snprintf(buf, sizeof buf, "+0x%" PRIx64 "/0x%" PRIx64, addr - s->value, s->size);
        out += buf;
    }
    return out;
}

std::string hex_address(uint64_t addr) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "0x%" PRIx64, addr);
    return buf;
}

void print_field_value(const uint8_t *rec, uint32_t size, const Field &f, uint32_t index, const Symbolizer &sym,
                       std::string &out) {
    char buf[32];
    switch (f.print) {
    case Print::kString: {
        uint32_t len = 0;
        const char *s = load_string(rec, size, f, &len, index);
        if (s == nullptr) {
            out += "(fault)";
        } else {
            out += '"';
            out.append(s, strnlen(s, len));
            out += '"';
        }
        return;
    }
    case Print::kUnsigned: {
        const uint64_t v = load_integer(rec, f, index);
        std::snprintf(buf, sizeof buf, "%" PRIu64, v);
        break;
    }
    case Print::kSigned: {
        const uint64_t v = load_integer(rec, f, index);
        std::snprintf(buf, sizeof buf, "%" PRId64, static_cast<int64_t>(v));
        break;
    }
    case Print::kHex: {
        std::snprintf(buf, sizeof buf, "0x%" PRIx64, load_integer(rec, f, index));
        break;
    }
    case Print::kChar: // byte for byte as the kernel prints it, a NUL included
        out += '\'';
        out += static_cast<char>(load_integer(rec, f, index));
        out += '\'';
        return;
    case Print::kSymbol:
        out += sym(load_integer(rec, f, index), true);
        return;
    case Print::kStack: // the kernel's print_synth_event(): a line an address, to the first zero
        out += "STACK:";
        if (uint64_t(f.offset) + 4 <= size) {
            uint32_t loc = 0;
            std::memcpy(&loc, rec + f.offset, 4);
            const uint32_t off = loc & 0xffff, len = loc >> 16;
            for (uint32_t at = off; at + 8 <= off + len && at + 8 <= size; at += 8) {
                uint64_t a;
                std::memcpy(&a, rec + at, 8);
                if (a == 0) break;
                out += "\n=> " + sym(a, true);
            }
        }
        out += '\n';
        return;
    }
    out += buf;
}

void print_record(const uint8_t *rec, uint32_t size, const EventLookup &find, const Symbolizer &sym, std::string &out) {
    if (size < kCommonSize) return;
    CommonHeader h;
    std::memcpy(&h, rec, sizeof h);
    if (h.type == kStackEventId) {
        out += "<user stack trace>";
        for (uint32_t off = kCommonSize; off + 8 <= size; off += 8) {
            uint64_t a;
            std::memcpy(&a, rec + off, 8);
            out += "\n => " + sym(a, true);
        }
        return;
    }
    const EventInfo *e = find(h.type);
    if (e == nullptr) {
        out += "Unknown event " + std::to_string(h.type);
        return;
    }
    if (e->synthetic) { // histogram.rst: "wakeup_latency: lat=5 pid=1234"
        out += e->name + ":";
        for (size_t i = 4; i < e->fields.size(); ++i) {
            const Field &f = e->fields[i];
            if (f.offset + f.size > size) break;
            // After a stack's last line the next field starts the line, as the kernel's.
            if (out.empty() || out.back() != '\n') out += ' ';
            out += f.name + "=";
            uint32_t len = 0;
            const char *str = f.print == Print::kString ? load_string(rec, size, f, &len, 0) : nullptr;
            if (str != nullptr) // a string bare, as the kernel's print_synth_event() prints it
                out.append(str, strnlen(str, len));
            else
                print_field_value(rec, size, f, 0, sym, out);
        }
        return;
    }
    out += e->name + ": (";
    uint64_t a = 0, b = 0;
    if (size >= kCommonSize + 8) std::memcpy(&a, rec + kCommonSize, 8);
    if (e->is_return && size >= kCommonSize + 16) std::memcpy(&b, rec + kCommonSize + 8, 8);
    if (!e->attached_to.empty())
        out += e->attached_to; // eprobetrace.rst: the event it is on
    else if (e->is_return)
        out += sym(b, true) + " <- " + sym(a, false);
    else
        out += sym(a, true);
    out += ")";
    // After the common and the probe's own fields.
    const size_t first = !e->attached_to.empty() ? 4 : e->is_return ? 6 : 5;
    for (size_t i = first; i < e->fields.size(); ++i) {
        const Field &f = e->fields[i];
        const uint32_t n = f.array_len > 0 ? f.array_len : 1;
        if (f.offset + f.size * n > size) break;
        out += " " + f.name + "=";
        if (f.array_len > 0) out += "{";
        for (uint32_t k = 0; k < n; ++k) {
            if (k) out += ",";
            print_field_value(rec, size, f, k, sym, out);
        }
        if (f.array_len > 0) out += "}";
    }
}

std::string event_table_text(const std::vector<const EventInfo *> &events) {
    std::string s = "ukprobes-event-table " + std::to_string(kEventTableVersion) + "\n";
    for (const EventInfo *e : events) {
        const std::string kind = e->synthetic              ? "s"
                                 : !e->attached_to.empty() ? "e:" + e->attached_to
                                 : e->is_return            ? "r"
                                                           : "p";
        s += "event\t" + std::to_string(e->id) + "\t" + e->group + "\t" + e->name + "\t" + kind + "\n";
        for (const Field &f : e->fields) {
            s += "field\t" + f.name + "\t" + f.c_type + "\t" + std::to_string(f.offset) + "\t" +
                 std::to_string(f.size) + "\t" + (f.is_signed ? "1" : "0") + "\t" +
                 kPrintNames[static_cast<int>(f.print)] + "\t" + std::to_string(f.array_len) + "\t" +
                 (f.common ? "1" : "0") + "\n";
        }
        s += "fmt\t" + e->print_fmt + "\n";
    }
    return s;
}

int parse_event_table(std::string_view text, std::map<uint16_t, EventInfo> *out, std::string *why) {
    const std::vector<std::string_view> lines = split(text, '\n');
    const std::string first = "ukprobes-event-table " + std::to_string(kEventTableVersion);
    // Version 1 is version 2 without event probes: the captures written before still read.
    if (lines.empty() || (lines[0] != first && lines[0] != "ukprobes-event-table 1")) {
        *why = "event table: expected '" + first + "', got '" + std::string(lines.empty() ? "" : lines[0]) + "'";
        return -EPROTO;
    }
    EventInfo *cur = nullptr;
    for (size_t n = 1; n < lines.size(); ++n) {
        if (lines[n].empty()) continue;
        const std::vector<std::string_view> w = split(lines[n], '\t');
        bool ok = false;
        if (w[0] == "event" && w.size() == 5 &&
            (w[4] == "p" || w[4] == "r" || w[4] == "s" || w[4].substr(0, 2) == "e:")) {
            uint32_t id = 0;
            if ((ok = to_u32(w[1], &id) && id <= UINT16_MAX)) {
                cur = &(*out)[static_cast<uint16_t>(id)];
                *cur =
                    EventInfo{static_cast<uint16_t>(id), std::string(w[2]), std::string(w[3]), w[4] == "r", {}, {}, {}};
                if (w[4][0] == 'e') cur->attached_to = std::string(w[4].substr(2));
                cur->synthetic = w[4] == "s";
            }
        } else if (w[0] == "field" && w.size() == 9 && cur != nullptr) {
            Field f;
            f.name = w[1];
            f.c_type = w[2];
            const auto print = std::find(std::begin(kPrintNames), std::end(kPrintNames), w[6]);
            ok = to_u32(w[3], &f.offset) && to_u32(w[4], &f.size) && to_u32(w[7], &f.array_len) &&
                 (w[5] == "0" || w[5] == "1") && (w[8] == "0" || w[8] == "1") && print != std::end(kPrintNames);
            if (ok) {
                f.is_signed = w[5] == "1";
                f.common = w[8] == "1";
                f.print = static_cast<Print>(print - std::begin(kPrintNames));
                cur->fields.push_back(std::move(f));
            }
        } else if (w[0] == "fmt" && cur != nullptr) {
            cur->print_fmt = std::string(lines[n].substr(4));
            ok = true;
        }
        if (!ok) {
            *why = "event table line " + std::to_string(n + 1) + " not understood: " + std::string(lines[n]);
            return -EPROTO;
        }
    }
    return 0;
}

} // namespace ukp::trace
