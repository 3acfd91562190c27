// The ftrace event filter language, compiled once into a bounded program.
//
// A filter is a boolean expression over the event's fields and common_pid/common_comm:
// `field OP value` predicates (== != < <= > >= & on numbers; == != ~ on strings, `~`
// being the kernel's glob), joined with && || !, grouped with parentheses. compile_filter
// turns the text into a flat list of predicates with forward branch targets (the kernel's
// prog[] scheme): match() walks it once, with no recursion, allocation, lock or system call.
#pragma once

#include <cstdint>
#include <memory>
#include <cerrno>
#include <string>
#include <string_view>
#include <vector>

#include "trace/record.hpp"

namespace ukp::trace {

struct FilterError {
    std::string message; // the kernel's parse_error text ("Field not found")
    int pos = 0;         // offset in the filter text the caret points at
    int rc = -EINVAL;    // what the write returns: a hist trigger's division by zero is -EDOM
};

class Filter {
public:
    struct Program; // the compiled predicates, defined in filter.cpp

    Filter(std::string text, std::unique_ptr<const Program> prog);
    ~Filter();
    Filter(const Filter &) = delete;
    Filter &operator=(const Filter &) = delete;

    // Hit path: no allocation, no lock. comm: the hitting thread's name.
    bool match(const uint8_t *rec, uint32_t size, const char *comm) const noexcept;
    const std::string &text() const { return text_; } // as the filter file shows it

private:
    std::string text_;                    // the filter as written, trailing newline removed
    std::unique_ptr<const Program> prog_; // immutable after compile_filter
};

// fields: the event's fields, common ones included (common_fields() in record.hpp);
// common_comm is accepted too. Null + *err on a bad filter.
std::unique_ptr<Filter> compile_filter(std::string_view text, const std::vector<Field> &fields, FilterError *err);

// The filter file's content after a rejected write, as the kernel prints it: the text,
// a caret line under err.pos, and "parse_error: MESSAGE".
std::string filter_error_text(std::string_view text, const FilterError &err);

// The kernel's glob match (its glob_match(): *, ?, [...] with ranges and ! or ^ negation).
bool glob_match(const char *pat, size_t pat_len, const char *str, size_t str_len) noexcept;

} // namespace ukp::trace
