// The trace text: ftrace's `trace`, `trace_pipe` and `snapshot` files, byte for byte as
// this machine's kernel prints them (Linux 6.18, the nop tracer, default options).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "trace/ring.hpp"

namespace ukp::trace {

// Prints one event's part of a trace line after "TIMESTAMP: " — "EVENT: (SYM+OFF/SIZE) a=1"
// — given its record; supplied by trace-def's events. No newline: the caller adds it.
using EventPrinter = std::function<void(const uint8_t *rec, uint32_t size, std::string &out)>;

// ---- This process's own buffers (the agent: the file API, ukp_trace_read) ----

// The trace file: non-consuming, with the header.
std::string trace_text(const EventPrinter &);
// trace_pipe: consuming; blocks up to timeout_ms for the first record (polling: a writer
// cannot wake a reader without a system call); no header. At most max_bytes are
// returned; a line that does not fit is kept for the next read, as in ftrace.
std::string trace_pipe_read(const EventPrinter &, int timeout_ms, size_t max_bytes);
// The snapshot file: the snapshot's records with the header, or ftrace's help text
// when it is empty or not allocated.
std::string snapshot_text(const EventPrinter &);
// Records the three above have printed in this process: a reader in another process
// (the CLI) that formats for itself leaves it unchanged.
uint64_t records_formatted();

// ---- Any mapped ring (the agent's, or one the CLI mapped from the memfd) ----

std::string trace_text_of(const RingView &, const EventPrinter &);
std::string snapshot_text_of(const RingView &, bool allocated, const EventPrinter &);
// trace_pipe without waiting: consumes records of the view while the text is shorter
// than max_bytes (whole lines: the last one may end past max_bytes).
std::string trace_pipe_text_of(const RingView &, const EventPrinter &, size_t max_bytes);
// The trace (snapshot) file for records already collected from view v (whose saved
// thread names it shows).
std::string trace_text_from(const RingView &v, const std::vector<RingEntry> &, const RingCounts &,
                            const EventPrinter &);
std::string snapshot_text_from(const RingView &v, bool allocated, const std::vector<RingEntry> &, const RingCounts &,
                               const EventPrinter &);

// One trace_pipe reader: trace_pipe_read's semantics over any view. Not thread-safe.
class PipeReader {
public:
    // Runs its argument with the view while the view cannot be replaced.
    using WithView = std::function<void(const std::function<void(const RingView &)> &)>;
    // The lines go into `buffer` (emptied first): one a caller had written out keeps its
    // capacity, and a read of a megabyte neither grows a string step by step nor touches
    // fresh pages.
    std::string read(const WithView &, const EventPrinter &, int timeout_ms, size_t max_bytes, std::string buffer = {});

private:
    std::string left_; // the rest of a line that did not fit the last read
};

// The names of threads of a view's process, each looked up once (ring_thread_name).
// A process in another pid namespace than the reader's (a container, `bwrap
// --unshare-pid`) records its threads by its own numbers: they are shown as the reader's
// namespace numbers them, as the kernel shows a container's tasks by their global pid,
// while the thread lives (one gone already keeps its own number, and the name the ring
// saved).
class ThreadNames {
public:
    explicit ThreadNames(const RingView &v);
    const std::string &of(int32_t tid) { return lookup(tid).name; }
    // The thread's id as the reader's pid namespace numbers it.
    int32_t pid_of(int32_t tid) { return lookup(tid).pid; }

private:
    struct Thread {
        std::string name;
        int32_t pid;
    };
    const Thread &lookup(int32_t tid);
    RingView v_;
    int32_t pid_;
    int32_t outer_ = 0; // the process's number here, if it is in another pid namespace
    std::unordered_map<int32_t, Thread> cache_;
};

// The process that process `seen_by` (numbered here) numbers `pid`, as this pid namespace
// numbers it: `pid` itself when both share a namespace, 0 if it is not seen from here.
int32_t pid_here(int32_t seen_by, int32_t pid);

// One record's trace line ("TASK-PID [CPU] FLAGS TS: EVENT..."), after a LOST line when
// records were lost before it.
void append_entry(const RingEntry &, ThreadNames &, const EventPrinter &, std::string &out);

// Pieces, exposed for tests and other readers.
// "# tracer: nop" ... the column legend, with the entries line.
std::string trace_header(uint64_t entries, uint64_t written, int cpus);
// "            TASK-PID     [CPU] FLAGS  SECS.USECS: " for one record.
std::string trace_line_prefix(const std::string &comm, int32_t pid, uint32_t cpu, uint8_t flags, uint8_t preempt_count,
                              uint64_t ts_ns);
// The same, appended to `out` (a reader formats a line per record: no snprintf, no string).
void append_trace_line_prefix(std::string &out, const std::string &comm, int32_t pid, uint32_t cpu, uint8_t flags,
                              uint8_t preempt_count, uint64_t ts_ns);
// "CPU:N [LOST M EVENTS]\n"
std::string lost_events_line(uint32_t cpu, uint64_t lost);
// The number of online CPUs, as "#P:" shows it.
int online_cpus();

} // namespace ukp::trace
