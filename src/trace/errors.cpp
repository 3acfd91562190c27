#include "trace/errors.hpp"

#include <cstdio>
#include <ctime>

namespace ukp::trace {

namespace {
struct ErrorText {
    std::string_view id, message;
};
constexpr ErrorText kErrors[] = {
#define C(id, msg) {#id, msg},
    UKP_TRACE_ERRORS
#undef C
};
} // namespace

std::string_view error_id(Err e) { return kErrors[static_cast<size_t>(e)].id; }
std::string_view error_message(Err e) { return kErrors[static_cast<size_t>(e)].message; }

std::string format_error(std::string_view subsystem, std::string_view command, std::string_view message, int pos) {
    std::string s;
    s.append(subsystem).append(": error: ").append(message).append("\n  Command: ");
    s.append(command).append("\n");
    // The caret sits under the offending character: "  Command: " is 11 columns wide.
    s.append(11 + static_cast<size_t>(pos < 0 ? 0 : pos), ' ').append("^\n");
    return s;
}

void ErrorLog::add(std::string_view subsystem, std::string_view command, const ProbeError &e) {
    add_text(subsystem, command, error_message(e.err), e.pos);
}

void ErrorLog::add_text(std::string_view subsystem, std::string_view command, std::string_view message, int pos) {
    timespec ts{};
    clock_gettime(CLOCK_MONOTONIC, &ts);
    char stamp[48];
    std::snprintf(stamp, sizeof stamp, "[%5llu.%06ld] ", static_cast<unsigned long long>(ts.tv_sec), ts.tv_nsec / 1000);
    std::string entry = stamp + format_error(subsystem, command, message, pos);
    std::lock_guard lock(mu_);
    if (entries_.size() == kMaxEntries) entries_.erase(entries_.begin());
    entries_.push_back(std::move(entry));
}

std::string ErrorLog::text() const {
    std::lock_guard lock(mu_);
    std::string s;
    for (const auto &e : entries_) s += e;
    return s;
}

void ErrorLog::clear() {
    std::lock_guard lock(mu_);
    entries_.clear();
}

} // namespace ukp::trace
