// The C entry points of <ukprobes/trace.h>, and the definitions of UKP_EVENTS applied
// at start-up.
#include <ukprobes/trace.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

#include "trace/events.hpp"

extern "C" int ukp_trace_read(const char *path, char **out) {
    if (path == nullptr || out == nullptr) return -EINVAL;
    std::string text;
    const int r = ukp::trace::file_read(path, &text);
    if (r != 0) return r;
    char *copy = static_cast<char *>(std::malloc(text.size() + 1));
    if (copy == nullptr) return -ENOMEM;
    std::memcpy(copy, text.c_str(), text.size() + 1);
    *out = copy;
    return 0;
}

extern "C" int ukp_trace_pipe_read(int timeout_ms, unsigned long max_bytes, char **out) {
    if (out == nullptr || timeout_ms < 0) return -EINVAL;
    const std::string text = ukp::trace::pipe_read(timeout_ms, max_bytes);
    char *copy = static_cast<char *>(std::malloc(text.size() + 1));
    if (copy == nullptr) return -ENOMEM;
    std::memcpy(copy, text.c_str(), text.size() + 1);
    *out = copy;
    return 0;
}

extern "C" int ukp_trace_write(const char *path, const char *text) {
    if (path == nullptr || text == nullptr) return -EINVAL;
    return ukp::trace::file_write(path, text);
}

extern "C" int ukp_trace_append(const char *path, const char *text) {
    if (path == nullptr || text == nullptr) return -EINVAL;
    return ukp::trace::file_append(path, text);
}

namespace {

// The kernel's kprobe_event= boot parameter: tracing covers the program from main on.
__attribute__((constructor)) void apply_ukp_events() {
    const char *spec = std::getenv("UKP_EVENTS");
    if (spec == nullptr || *spec == '\0') return;
    ukp::trace::apply_startup_events(spec);
}

} // namespace
