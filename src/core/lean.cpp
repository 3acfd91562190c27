// Lean paths: whether the jump path's and the return path's dispatchers, and a handler,
// leave the vector state alone (the scan, arch/x86_64/vector_use.hpp), so that their
// trampolines need not save it.
#include "core/core.hpp"

#include <atomic>
#include <cstdlib>
#include <iterator>
#include <mutex>

extern "C" void ukp_optprobe_dispatch(ukp::core::Point *pt, pt_regs *regs, int ext_saved, pt_regs *at_hit);
extern "C" void ukp_kretprobe_dispatch(uint64_t ret_addr_field, pt_regs *regs, int ext_saved); // kretprobe.cpp

extern "C" {
__attribute__((visibility("hidden"))) uint8_t ukp_lean_jump_path = 0;
__attribute__((visibility("hidden"))) uint8_t ukp_lean_return_path = 0;
}

namespace ukp::core {

namespace {
arch::VectorScan g_lean_dispatch_scans[2];

// The scan of the code as it was before the probes (read_original_code: under the
// registry mutex), with the call helpers, where the agent's calls of code that is not lean
// go, as stops (outside_gpr: a call helper either saves the state or is given lean code).
arch::VectorScan scan_with_stops(const void *fn) {
    const uint64_t stops[] = {reinterpret_cast<uint64_t>(&ukp_call_handler),
                              reinterpret_cast<uint64_t>(&ukp_call_saving_vectors)};
    return arch::scan_vector_use(reinterpret_cast<uint64_t>(fn), stops, std::size(stops), 20000, read_original_code);
}
} // namespace

void lean_dispatch_init() {
    static std::once_flag once;
    std::call_once(once, [] {
        const struct {
            const void *fn;
            uint8_t *flag;
        } dispatchers[] = {{reinterpret_cast<const void *>(&ukp_optprobe_dispatch), &ukp_lean_jump_path},
                           {reinterpret_cast<const void *>(&ukp_kretprobe_dispatch), &ukp_lean_return_path}};
        for (size_t i = 0; i < std::size(dispatchers); ++i) {
            g_lean_dispatch_scans[i] = scan_with_stops(dispatchers[i].fn);
            __atomic_store_n(dispatchers[i].flag, g_lean_dispatch_scans[i].clean ? 1 : 0, __ATOMIC_RELEASE);
        }
    });
}

const arch::VectorScan &lean_dispatch_scan(Dispatcher which) {
    return g_lean_dispatch_scans[which == Dispatcher::kOptprobe ? 0 : 1];
}

namespace {
constexpr size_t kOwnHandlers = 8;
std::atomic<const void *> g_own_handlers[kOwnHandlers];
// handler_is_lean()'s verdict on each once asked: 0 not yet, 1 lean, 2 not.
std::atomic<uint8_t> g_own_verdicts[kOwnHandlers];

// fn's index in g_own_handlers, or -1.
int own_index(const void *fn) {
    if (fn == nullptr) return -1;
    for (size_t i = 0; i < kOwnHandlers; ++i)
        if (g_own_handlers[i].load(std::memory_order_acquire) == fn) return static_cast<int>(i);
    return -1;
}
} // namespace

// The agent's own handlers (the tracer's, for every event) are scanned once: their code
// neither changes nor goes. Any other function is scanned at every question, as another
// library may have been loaded where its own was.
bool handler_is_lean(const void *fn) {
    if (fn == nullptr) return true;
    const int own = own_index(fn);
    if (own < 0) return scan_with_stops(fn).clean;
    uint8_t verdict = g_own_verdicts[own].load(std::memory_order_acquire);
    if (verdict == 0) {
        verdict = scan_with_stops(fn).clean ? 1 : 2;
        g_own_verdicts[own].store(verdict, std::memory_order_release);
    }
    return verdict == 1;
}

void mark_own_handler(const void *fn) {
    for (auto &slot : g_own_handlers) {
        const void *expected = nullptr;
        if (slot.compare_exchange_strong(expected, fn) || expected == fn) return;
    }
    std::abort(); // more of the agent's own handlers than kOwnHandlers: a build mistake
}

bool handler_is_own(const void *fn) { return own_index(fn) >= 0; }

} // namespace ukp::core
