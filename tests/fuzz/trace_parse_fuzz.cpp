// The kprobe_events definition language (src/trace/parse.hpp): parse_definition() on
// arbitrary lines, against a resolver that knows every name.
//
// Input: one option byte (bit 0: the process-start form, words separated by commas),
// then the line (up to a newline).
// Checks: no crash or out-of-bounds access (ASan), only the documented return codes, a
// rejected line says where (inside the command), an accepted one parses again from the
// line the kprobe_events file shows for it, to the same line.
#include "symbols/dwarf.hpp"
#include "trace/parse.hpp"
#include "trace/record.hpp"

#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>

namespace {

#define CHECK(cond)                                                                                                    \
    do {                                                                                                               \
        if (!(cond)) {                                                                                                 \
            std::fprintf(stderr, "trace_parse_fuzz: %s:%d: %s\n", __FILE__, __LINE__, #cond);                          \
            std::abort();                                                                                              \
        }                                                                                                              \
    } while (0)

uint64_t fnv(std::string_view s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (char c : s) h = (h ^ static_cast<uint8_t>(c)) * 0x100000001b3ull;
    return h;
}

// Names a symbol table or a file system could hold: printable, no blank (a separator),
// and (for symbols) no leading digit.
bool plausible_symbol(std::string_view spec) {
    const size_t colon = spec.rfind(':'); // "MOD:sym"
    const std::string_view sym = colon == std::string_view::npos ? spec : spec.substr(colon + 1);
    return !sym.empty() && !std::isdigit(static_cast<unsigned char>(sym[0]));
}

bool plausible_name(std::string_view s) {
    for (char c : s) {
        if (c <= ' ' || c > '~' || c == ',') return false;
    }
    return s.find("nosuch") == std::string_view::npos;
}

// Every plausible symbol exists (at an address derived from its name) except those
// containing "nosuch"; every such file is mapped for its first MiB.
struct AnyResolver : ukp::trace::Resolver {
    int resolve_code(std::string_view spec, uint64_t offset, uint64_t *addr) override {
        if (spec.empty()) return -EINVAL;
        if (!plausible_name(spec) || !plausible_symbol(spec)) return -ENOENT;
        *addr = 0x400000 + (fnv(spec) & 0xffff0) + offset;
        return 0;
    }
    int resolve_data(std::string_view spec, uint64_t *addr) override {
        if (!plausible_name(spec) || !plausible_symbol(spec)) return -ENOENT;
        *addr = 0x600000 + (fnv(spec) & 0xfff8);
        return 0;
    }
    int resolve_file_offset(std::string_view path, uint64_t offset, uint64_t *addr, char perm) override {
        if (perm == 'w' && offset < 0x1000) return -ERANGE;          // the first page: code only
        if (!plausible_name(path) || path[0] != '/') return -ENOENT; // as /proc/PID/maps names them
        if (offset >= 0x100000) return -ERANGE;
        *addr = 0x500000 + offset;
        return 0;
    }
    bool function_entry(uint64_t addr) override { return (addr & 0xf) == 0; }
    bool module_pending(std::string_view spec) override { return spec.starts_with("later:"); }
    // One event for e: definitions, kprobes.src: an address p, a number n, a string s, an
    // array a of three.
    int event_fields(std::string_view group, std::string_view event, std::vector<ukp::trace::Field> *out) override {
        using ukp::trace::Print;
        if (group != "kprobes" || event != "src") return -ENOENT;
        *out = ukp::trace::common_fields();
        const uint32_t at = ukp::trace::kCommonSize + 8;
        out->push_back({"p", "u64", at, 8, false, Print::kHex, 0, false});
        out->push_back({"n", "u32", at + 8, 4, false, Print::kUnsigned, 0, false});
        out->push_back({"s", "__data_loc char[]", at + 12, 4, false, Print::kString, 0, false});
        out->push_back({"a", "u64", at + 16, 8, false, Print::kHex, 3, false});
        return 0;
    }
    // Every struct but those named "nosuch...": each member ("nosuch..." aside) 8 bytes
    // further, a u32, or a char * when named "str..."; "->" after one is taken as a pointer.
    struct AnyStructs : ukp::sym::StructTypes {
        ukp::sym::AccessFail access(std::string_view type_name, std::string_view base, std::string_view expr,
                                    ukp::sym::TypedAccess *out, size_t *pos) const override {
            using ukp::sym::AccessFail;
            if (type_name.starts_with("nosuch")) return AccessFail::kNoType;
            std::string fetch(base);
            size_t at = 0, members = 0;
            while (at < expr.size()) {
                const bool arrow = expr.substr(at, 2) == "->";
                if (!arrow && expr[at] != '.') {
                    *pos = at;
                    return expr[at] == '-' ? AccessFail::kBadHyphen : AccessFail::kNoField;
                }
                const size_t from = at + (arrow ? 2 : 1);
                size_t n = 0;
                while (from + n < expr.size() &&
                       (std::isalnum(static_cast<unsigned char>(expr[from + n])) != 0 || expr[from + n] == '_'))
                    ++n;
                const std::string_view name = expr.substr(from, n);
                if (n == 0 || name.starts_with("nosuch")) {
                    *pos = from;
                    return AccessFail::kNoField;
                }
                fetch = "+8(" + fetch + ")";
                out->name = std::string(name);
                at = from + n;
                ++members;
            }
            if (members == 0) {
                *pos = expr.size();
                return AccessFail::kNoField;
            }
            out->fetch = fetch;
            out->stringable = out->name.starts_with("str");
            out->type = out->stringable ? "x64" : "u32";
            out->string_fetch = "+0(" + fetch + ")";
            return AccessFail::kNone;
        }
    };
    std::shared_ptr<const ukp::sym::StructTypes> struct_types(std::string_view, std::string_view) override {
        return std::make_shared<AnyStructs>();
    }
};

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    using namespace ukp::trace;
    if (size < 1) return 0;
    const char sep = (data[0] & 1) ? ',' : ' ';
    std::string_view line(reinterpret_cast<const char *>(data + 1), size - 1);
    line = line.substr(0, line.find('\n'));

    AnyResolver resolver;
    ProbeDef def;
    ProbeError err;
    const int rc = parse_definition(line, resolver, &def, &err, sep);
    CHECK(rc == 0 || rc == -EINVAL);
    if (rc != 0) {
        CHECK(!error_id(err.err).empty() && !error_message(err.err).empty());
        CHECK(err.pos >= 0 && static_cast<size_t>(err.pos) <= line.size() + 1);
        return 0;
    }
    if (def.remove) return 0; // "-:EVENT" removes; the kprobe_events file never shows it
    CHECK(is_good_name(def.event) && !def.group.empty() && def.event.size() < kMaxEventNameLen);
    for (char ch : def.group) CHECK(std::isalnum(static_cast<unsigned char>(ch)) || ch == '_');
    const std::string shown = def.show();
    ProbeDef again;
    ProbeError err2;
    if (parse_definition(shown, resolver, &again, &err2) != 0) {
        std::fprintf(stderr, "trace_parse_fuzz: \"%.*s\" shows as \"%s\", which is rejected: %s at %d\n",
                     static_cast<int>(line.size()), line.data(), shown.c_str(), std::string(error_id(err2.err)).c_str(),
                     err2.pos);
        std::abort();
    }
    if (again.show() != shown) {
        std::fprintf(stderr, "trace_parse_fuzz: \"%s\" parses back as \"%s\"\n", shown.c_str(), again.show().c_str());
        std::abort();
    }
    CHECK(again.addr == def.addr && again.args.size() == def.args.size());
    return 0;
}
