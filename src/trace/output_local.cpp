// The trace, trace_pipe and snapshot files over this process's own buffers (the agent's
// file API). A reader in another process maps the memfd and uses output.hpp's *_of.
#include <atomic>
#include <mutex>

#include "trace/output.hpp"

namespace ukp::trace {

namespace {

std::atomic<uint64_t> g_formatted{0};

// The printer, counting the records it prints (records_formatted).
EventPrinter counting(const EventPrinter &print) {
    return [&print](const uint8_t *rec, uint32_t size, std::string &out) {
        g_formatted.fetch_add(1, std::memory_order_relaxed);
        print(rec, size, out);
    };
}

std::mutex g_pipe_mu; // one trace_pipe reader of this process at a time
PipeReader g_pipe;    // under g_pipe_mu

} // namespace

uint64_t records_formatted() { return g_formatted.load(std::memory_order_relaxed); }

std::string trace_text(const EventPrinter &print) {
    // Records are copied under the lock and printed after it: a printer may call back.
    std::vector<RingEntry> entries;
    RingCounts counts;
    RingView view;
    with_ring_views([&](const RingView &main, const RingView &) {
        entries = ring_collect(main, &counts);
        view = main; // rings stay mapped for the process's life
    });
    return trace_text_from(view, entries, counts, counting(print));
}

std::string snapshot_text(const EventPrinter &print) {
    std::vector<RingEntry> entries;
    RingCounts counts;
    RingView view;
    bool allocated = false;
    with_ring_views([&](const RingView &, const RingView &snap) {
        allocated = snap.base != nullptr;
        if (allocated) entries = ring_collect(snap, &counts);
        view = snap;
    });
    return snapshot_text_from(view, allocated, entries, counts, counting(print));
}

std::string trace_pipe_read(const EventPrinter &print, int timeout_ms, size_t max_bytes) {
    std::lock_guard pipe_lock(g_pipe_mu);
    const PipeReader::WithView main_view = [](const std::function<void(const RingView &)> &fn) {
        with_ring_views([&](const RingView &main, const RingView &) { fn(main); });
    };
    return g_pipe.read(main_view, counting(print), timeout_ms, max_bytes);
}

} // namespace ukp::trace
