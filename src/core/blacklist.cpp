// The blacklist: where no probe may go (the agent's own code and entry points, and what
// ukp_blacklist_add() names).
#include "core/core.hpp"
#include "core/registry_internal.hpp"

#include "symbols/symbols.hpp"

#include <mutex>
#include <string>
#include <vector>

namespace ukp::core {
namespace {

struct BlacklistEntry {
    const void *addr;
    std::string name;
};

std::mutex &blacklist_mutex() {
    static std::mutex m;
    return m;
}
std::vector<BlacklistEntry> &blacklist_entries() {
    static std::vector<BlacklistEntry> v;
    return v;
}

// The agent's own C entry points: a probe in them would run the agent inside itself.
constexpr const char *kAgentFunctions[] = {
    "register_kprobe",
    "unregister_kprobe",
    "register_kprobes",
    "unregister_kprobes",
    "enable_kprobe",
    "disable_kprobe",
    "sigaction",
    "__sigaction",
    "signal",
    "bsd_signal",
    "sysv_signal",
    "__sysv_signal",
    "register_kretprobe",
    "unregister_kretprobe",
    "register_kretprobes",
    "unregister_kretprobes",
    "enable_kretprobe",
    "disable_kretprobe",
    "register_jprobe",
    "unregister_jprobe",
    "register_jprobes",
    "unregister_jprobes",
    "jprobe_return",
    "__cxa_begin_catch",
    "longjmp",
    "_longjmp",
    "siglongjmp",
    "__longjmp_chk",
    "backtrace",
    "_Unwind_Backtrace",
    "swapcontext",
    "setcontext",
    "sigaltstack",
};

// Whether obj holds the agent's code: libukprobes.so, or the program it is linked into.
bool holds_agent(const sym::Object &obj) { return obj.contains_exec(reinterpret_cast<uint64_t>(&register_kprobe)); }

} // namespace

bool agent_symbol(const sym::Object &obj, const std::string &name) {
    // Every hit returns through __restore_rt, and the trap handler saves errno before its
    // recursion guard is up: a probe in either would recurse without end.
    if (name == "__restore_rt" || name == "__errno_location") return obj.name.rfind("libc.so", 0) == 0;
    // Within the agent's object only: other objects may name things ukp_* or sigaction.
    if (!holds_agent(obj)) return false;
    if (name.rfind("_ZN3ukp", 0) == 0 || name.rfind("ukp_", 0) == 0) return true;
    for (const char *f : kAgentFunctions)
        if (name == f) return true;
    return false;
}

// The whole of libukprobes.so is the agent's; a program it is linked into is not.
bool is_agent_object(const sym::Object &obj) { return !obj.main_program && holds_agent(obj); }

bool is_blacklisted(const sym::Object &obj, const sym::Symbol *fn, uint64_t addr) {
    if (is_agent_object(obj)) return true;
    if (fn != nullptr && agent_symbol(obj, fn->name)) return true;
    std::lock_guard lock(blacklist_mutex());
    for (const BlacklistEntry &e : blacklist_entries()) {
        const auto a = reinterpret_cast<uint64_t>(e.addr);
        if (a == addr) return true;
        const sym::Symbol *f = obj.function_at(a);
        if (f != nullptr && f == fn) return true;
    }
    return false;
}

} // namespace ukp::core

extern "C" {

void ukp_blacklist_add(const void *addr, const char *name) {
    std::lock_guard lock(ukp::core::blacklist_mutex());
    ukp::core::blacklist_entries().push_back({addr, name != nullptr ? name : ""});
}

} // extern "C"
