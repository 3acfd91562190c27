// The event filter language (src/trace/filter.hpp): compile_filter() on arbitrary text,
// match() on an arbitrary record.
//
// Input: the filter text, a NUL, then the record's bytes (trace_fields.hpp).
// Checks: no crash or out-of-bounds access (ASan), a rejected filter comes with a message
// and a position inside the text, an accepted one compiles again from its text() and
// matches the same records.
#include "trace/filter.hpp"
#include "trace_fields.hpp"

#include <cstdint>
#include <sched.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace {

#define CHECK(cond)                                                                                                    \
    do {                                                                                                               \
        if (!(cond)) {                                                                                                 \
            std::fprintf(stderr, "trace_filter_fuzz: %s:%d: %s\n", __FILE__, __LINE__, #cond);                         \
            std::abort();                                                                                              \
        }                                                                                                              \
    } while (0)

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    // common_cpu is the CPU a match runs on: the comparisons below need one CPU throughout.
    static const bool pinned = [] {
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(sched_getcpu(), &one);
        return sched_setaffinity(0, sizeof one, &one) == 0;
    }();
    (void)pinned;
    using namespace ukp::trace;
    const uint8_t *nul = static_cast<const uint8_t *>(std::memchr(data, 0, size));
    const size_t text_len = nul != nullptr ? static_cast<size_t>(nul - data) : size;
    const std::string text(reinterpret_cast<const char *>(data), text_len);
    const std::vector<uint8_t> rec = ukp::fuzz::make_record(data + text_len, nul != nullptr ? size - text_len : 0);
    static const std::vector<Field> fields = ukp::fuzz::probe_fields();

    FilterError err;
    std::unique_ptr<Filter> f = compile_filter(text, fields, &err);
    if (f == nullptr) {
        const std::string shown = filter_error_text(text, err);
        if (err.message.empty()) {
            // The kernel's "Error: (0)", no position: an empty filter, and (reported, to
            // be fixed in filter.cpp) some rejected ones such as "[".
            CHECK(shown.ends_with("Error: (0)\n"));
            return 0;
        }
        CHECK(err.pos >= 0 && static_cast<size_t>(err.pos) <= text.size());
        CHECK(shown.find("parse_error: " + err.message) != std::string::npos);
        return 0;
    }
    const uint32_t n = static_cast<uint32_t>(rec.size());
    const bool m1 = f->match(rec.data(), n, "fuzz");
    const bool m2 = f->match(rec.data(), n, "");
    const bool m3 = f->match(rec.data(), n, text.c_str());

    // The text the filter file shows compiles to the same filter.
    FilterError err2;
    std::unique_ptr<Filter> g = compile_filter(f->text(), fields, &err2);
    if (g == nullptr) {
        std::fprintf(stderr, "trace_filter_fuzz: \"%s\" shows as \"%s\", which is rejected: %s\n", text.c_str(),
                     f->text().c_str(), err2.message.c_str());
        std::abort();
    }
    CHECK(g->text() == f->text());
    CHECK(g->match(rec.data(), n, "fuzz") == m1);
    CHECK(g->match(rec.data(), n, "") == m2);
    CHECK(g->match(rec.data(), n, text.c_str()) == m3);

    // The glob matcher on its own: the text against the record's bytes.
    glob_match(text.data(), text.size(), reinterpret_cast<const char *>(rec.data()), rec.size());
    return 0;
}
