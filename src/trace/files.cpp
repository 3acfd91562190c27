// The C entry points of <ukprobes/trace.h>, and the definitions of UKP_EVENTS applied
// at start-up.
#include <ukprobes/trace.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <mutex>
#include <string>

#include "core/agent.hpp"
#include "platform/agent_heap.hpp"

#include <ukprobes/kprobes.h>
#include "trace/events.hpp"
#include "trace/ring.hpp"

using ukp::core::AgentWork;

extern "C" int ukp_trace_read(const char *path, char **out) {
    if (path == nullptr || out == nullptr) return -EINVAL;
    const AgentWork quiet;
    std::string text;
    const int r = ukp::trace::file_read(path, &text);
    if (r != 0) return r;
    char *copy = static_cast<char *>(std::malloc(text.size() + 1));
    if (copy == nullptr) return -ENOMEM;
    std::memcpy(copy, text.c_str(), text.size() + 1);
    *out = copy;
    return 0;
}

extern "C" int ukp_trace_lean(void) {
    const AgentWork quiet;
    if (const int r = ukp_lean_dispatch(); r < 0) return r; // starts the agent
    std::lock_guard lock(ukp::core::registry_mutex());
    return ukp::trace::hit_handlers_lean() ? 1 : 0;
}

extern "C" int ukp_trace_pipe_read(int timeout_ms, unsigned long max_bytes, char **out) {
    if (out == nullptr || timeout_ms < 0) return -EINVAL;
    const AgentWork quiet;
    const std::string text = ukp::trace::pipe_read(timeout_ms, max_bytes);
    char *copy = static_cast<char *>(std::malloc(text.size() + 1));
    if (copy == nullptr) return -ENOMEM;
    std::memcpy(copy, text.c_str(), text.size() + 1);
    *out = copy;
    return 0;
}

extern "C" int ukp_trace_write(const char *path, const char *text) {
    if (path == nullptr || text == nullptr) return -EINVAL;
    const AgentWork quiet;
    return ukp::trace::file_write(path, text);
}

extern "C" int ukp_trace_append(const char *path, const char *text) {
    if (path == nullptr || text == nullptr) return -EINVAL;
    const AgentWork quiet;
    return ukp::trace::file_append(path, text);
}

namespace {

// UKP_NO_INHERIT=1 (`ukprobe run --no-follow`): this process is traced, the programs it
// starts are not. The agent takes itself out of LD_PRELOAD (entries separated by blanks
// or ':') and drops UKP_EVENTS, so that they do not reach a child's environment.
void drop_inheritance() {
    unsetenv("UKP_NO_INHERIT");
    unsetenv("UKP_EVENTS");
    const char *preload = std::getenv("LD_PRELOAD");
    Dl_info self{};
    char me[PATH_MAX], other[PATH_MAX];
    if (preload == nullptr || dladdr(reinterpret_cast<void *>(&drop_inheritance), &self) == 0 ||
        self.dli_fname == nullptr || realpath(self.dli_fname, me) == nullptr)
        return;
    std::string kept, entry;
    const std::string list = std::string(preload) + " ";
    for (char c : list) {
        if (c != ' ' && c != ':' && c != '\t') {
            entry += c;
            continue;
        }
        if (entry.empty()) continue;
        if (realpath(entry.c_str(), other) == nullptr || std::strcmp(other, me) != 0)
            kept += (kept.empty() ? "" : " ") + entry;
        entry.clear();
    }
    if (kept.empty())
        unsetenv("LD_PRELOAD");
    else
        setenv("LD_PRELOAD", kept.c_str(), 1);
}

__attribute__((constructor)) void apply_ukp_events() { ukp::trace::apply_environment(); }

} // namespace

namespace ukp::trace {

// How long the start of a process waits for its probes' jumps (apply_environment).
constexpr int kStartupOptimizeMs = 200;

// The kernel's kprobe_event= boot parameter: tracing covers the program from main on.
bool apply_environment() {
    static std::once_flag once;
    static bool traced = true;
    std::call_once(once, [] {
        const AgentWork quiet;
        // Started by a program under `ukprobe run` after ukprobe was killed (its keeper
        // lets the program go on): nobody will read this process's trace, nor that of
        // the programs it starts. It runs as without ukprobes: no events (an f: over a
        // whole library would cost every such process its definition), and its children
        // do not load the agent. An attach can still start the control thread.
        if (std::getenv("UKP_SUPERVISED") != nullptr && supervisor_gone(notify_supervisor(kNoticeHello))) {
            traced = false;
            drop_inheritance();
            unsetenv("UKP_SUPERVISED");
            unsetenv("UKP_CONTROL");
            return;
        }
        const char *spec = std::getenv("UKP_EVENTS");
        const char *no_inherit = std::getenv("UKP_NO_INHERIT");
        if (spec != nullptr && *spec != '\0') {
            // The jumps go in now, while the program has no thread of its own: until then
            // each probe is a breakpoint, and a hit where SIGTRAP is blocked or reset is
            // fatal (the child of posix_spawn, system and popen runs so, as do threads
            // that block every signal), and under a debugger each hit would stop the
            // program. Alone, the process gets them at once with no breakpoint window;
            // with other threads (another preloaded library's) the optimizer thread places
            // them, and the wait for it is bounded: a process that cannot optimize goes on.
            {
                const core::OptimizeAtStart alone;
                apply_startup_events(spec);
            }
            core::optimizer_flush_for(std::chrono::milliseconds(kStartupOptimizeMs));
            platform::release_spares();
        }
        if (no_inherit != nullptr && std::strcmp(no_inherit, "1") == 0) drop_inheritance();
    });
    return traced;
}

} // namespace ukp::trace
