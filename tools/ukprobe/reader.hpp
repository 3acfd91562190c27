// The trace read by the controller itself (docs/cli.md, "Protocol"): the agent passes
// the ring's memfd (Op::kOpenFd kTraceRingPath, and kSnapshotRingPath for the
// snapshot's) and its event table; ukprobe maps the rings and prints trace, trace_pipe
// and snapshot here, with the agent's own formatting code (src/trace/output.hpp,
// print.hpp), symbols from /proc/PID/maps and the ELF files, thread names from
// /proc/PID/task/TID/comm (else the names the ring saved). The traced process only
// writes records.
//
// An agent that serves neither (an older one), or a ring this build cannot read, is
// read as before: the agent formats (Op::kRead "trace", "trace_pipe", "snapshot"). So
// is every agent when UKPROBE_AGENT_FORMATS=1 is in the environment (for comparisons
// and tests).
#pragma once

#include "client.hpp"

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "symbols/symbols.hpp"
#include "trace/capture.hpp"
#include "trace/print.hpp"
#include "trace/output.hpp"
#include "trace/ring.hpp"

namespace ukprobe {

class TraceReader {
public:
    // `consume`: trace_pipe reads will be made (the ring is mapped writable: consumers
    // move its tails); otherwise it is mapped read-only. `client` must outlive the reader.
    TraceReader(Client &client, int pid, bool consume);
    // A ring taken from process `pid` itself (ring_fd, a descriptor of its memfd: a child
    // of fork() that serves no socket), consumed; printed with the event table of the
    // agent `events` is connected to (the image it was forked from: the same ids). The
    // reader takes ring_fd. Nothing is ever asked of that agent but its event table.
    // The table and the process's objects are read at the first read, while the process
    // surely lives; `known`, objects parsed for another process (a sibling forked from the
    // same one), spares parsing again those mapped at the same addresses.
    TraceReader(Client &events, int pid, int ring_fd, const ukp::sym::Registry *known = nullptr);
    ~TraceReader();
    TraceReader(const TraceReader &) = delete;
    TraceReader &operator=(const TraceReader &) = delete;

    // From now on pipe() and pipe_left() return capture blocks (trace/capture.hpp: the
    // records as the ring held them, with the event table, the objects and the thread
    // names printing them takes) instead of text: `ukprobe record`. Each reader is a
    // stream of its own.
    void capture();
    bool capturing() const { return capturer_ != nullptr; }

    // The trace file's text (non-consuming).
    std::string trace();
    // trace_pipe: the records that come within timeout_ms, consumed, at most max_bytes
    // (a line that does not fit is kept for the next read). "" when none came. Throws
    // std::runtime_error when the agent is gone or refuses.
    std::string pipe(int timeout_ms, size_t max_bytes);
    // After the process is gone: what its ring mapped here still holds (the ring outlives
    // it), consumed, without asking the agent. "" when nothing is left, or no ring is mapped.
    std::string pipe_left(size_t max_bytes);
    // A buffer for the next read to fill (one that was written out: its pages are touched
    // already).
    void give_buffer(std::string buffer) { spare_ = std::move(buffer); }
    // The snapshot file's text, from the snapshot buffers' memfd (Op::kOpenFd
    // kSnapshotRingPath); an agent that does not serve it formats it.
    std::string snapshot();
    // Records in the buffers (the trace file's entries-in-buffer).
    uint64_t entries();
    // Whether a record is left to read: entries() != 0 without copying them.
    bool has_records();
    // The mapped ring's level (trace::ring_level: how full its fullest buffer is, what was
    // ever written); zeros when the agent formats.
    ukp::trace::RingLevel level() const;
    // Whether the mapped ring has a record (or a loss) to read; false when the agent
    // formats. Unlike has_records(), it never asks the agent.
    bool holds_records() const;
    // Whether the last read was formatted here (false: by the agent).
    bool formats_locally() const { return mapped_ != nullptr && !agent_formats_; }
    // Whether the next read will be formatted here: before the first read, maps the ring
    // if the agent serves it (one quick request; it throws as pipe() does when the agent
    // is gone).
    bool will_format_locally() { return formats_locally() || (map_ring() && !agent_formats_); }
    // The next read asks the agent which buffers it serves (a drain: the process is about
    // to end or exec, and may have replaced them since the last ask).
    void recheck_buffers() { served_checked_ = {}; }
    // Unmaps the ring (a process that is gone: its memory goes once nobody maps it).
    void unmap();
    // The agent is gone (its process died, or exec'd): the ring mapped stays readable
    // (ukprobe maps the memfd), and is read from now on without asking the agent
    // anything, as a ring taken from its process is: what the process recorded last,
    // after the stream's last read, is not lost with it.
    void agent_gone() { taken_ = agent_gone_ = true; }
    // Notes which objects the process maps now (cheap: nothing is parsed), for printing
    // its addresses should it be gone by the time its records are read.
    void remember_maps() { maps_ = ukp::sym::Registry::read_maps(pid_); }
    // The process's objects as last read (for another reader's `known`).
    const ukp::sym::Registry &symbols() const { return symbols_; }
    // For a ring taken from a process (the constructor with ring_fd) whose ancestor's agent
    // is gone (a daemon's worker: the program forked the daemon and exited): the event
    // table of `from`, the reader of the ring of a process between them, which read it
    // while the agent lived. Nothing is asked of the client from then on. Before the first
    // read; `from` reads no new table meanwhile (its agent is gone).
    void borrow_events(const TraceReader &from);
    // Whether an event table was read (or borrowed).
    bool has_events() const { return !events_.empty(); }

private:
    // A mapped memfd, kept while the agent serves the same one.
    struct Mapping {
        uint8_t *base = nullptr;
        size_t size = 0;
        dev_t dev = 0;
        ino_t ino = 0;
    };
    // Maps the agent's current buffers (they change when resized or swapped with a
    // snapshot); false when the agent must format instead.
    bool map_ring();
    // Maps the descriptor `fd` (taking it) into `m` unless m already maps that file.
    static bool map_fd(int fd, int prot, Mapping &m);
    static void unmap(Mapping &m);
    bool load_events();                              // the event table, again
    std::string agent_text(const std::string &path); // the agent's formatting; throws on a refusal
    const ukp::trace::EventInfo *find_event(uint16_t id);
    std::string symbolize(uint64_t addr, bool with_size);
    ukp::trace::EventPrinter printer();

    Client &client_;
    const int pid_;
    const bool consume_;
    bool agent_formats_ = false;   // for good: the agent does not serve the ring
    bool agent_snapshots_ = false; // for good: the agent does not serve the snapshot's
    int taken_fd_ = -1;            // the taken ring's descriptor, until mapped
    bool taken_ = false;           // the ring was taken from the process, not served
    bool agent_gone_ = false;      // the connection is lost: nothing more is asked
    uint8_t *mapped_ = nullptr;
    size_t size_ = 0;
    dev_t dev_ = 0;
    ino_t ino_ = 0;                                          // the memfd mapped (a new one means new buffers)
    std::chrono::steady_clock::time_point served_checked_{}; // map_ring's last ask
    Mapping snap_;                                           // the snapshot buffers, read-only
    std::map<uint16_t, ukp::trace::EventInfo> events_;
    bool events_fresh_ = false;            // loaded during this read: an unknown id stays unknown
    ukp::sym::Registry symbols_;           // the process's objects, from its maps
    bool symbols_fresh_ = false;           // likewise, re-read during this read
    ukp::sym::Registry::ProcessMaps maps_; // the process's maps as last read
    ukp::trace::SymbolTexts symbol_texts_; // symbolize's answers, until the objects are read again
    void refresh_symbols();
    // pipe() and pipe_left() in capture mode: the blocks of what the view holds.
    std::string capture_blocks(size_t max_bytes);
    ukp::trace::PipeReader pipe_;
    std::unique_ptr<ukp::trace::capture::Capturer> capturer_;
    std::string spare_;                                 // give_buffer's
    bool stream_written_ = false;                       // its kStream block
    std::string events_text_;                           // the event table as last read
    bool events_borrowed_ = false;                      // events_ is another reader's (borrow_events)
    std::string events_written_;                        // ... as last written
    std::string maps_written_;                          // the kMaps text as last written
    std::chrono::steady_clock::time_point maps_read_{}; // maps_ last read while capturing
};

} // namespace ukprobe
