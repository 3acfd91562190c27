// The rings of children of fork() that have not exec'd, in `ukprobe run`. Such a child's
// agent (copied) serves no socket: its ring's memfd is taken from the process (pidfd_getfd)
// and printed with the event table of the agent it was forked from (the same ids).
#pragma once

#include "client.hpp"
#include "memfds.hpp"
#include "output.hpp"
#include "profiles.hpp"
#include "reader.hpp"
#include "ring_watch.hpp"
#include "supervisor.hpp"

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace ukprobe {

// The ring of a child of fork() that has not exec'd: its agent (copied) serves no socket,
// so the memfd is taken from the process at its notice (ring.cpp's after_fork_child) and
// streamed by a thread of its own, printed with the event table of the agent it was forked
// from (the same ids), until the process is gone: exited, killed (ukprobe holds the
// memfd: the records outlive the process) or exec'd.
class ForkedRing final : RingStream {
public:
    ForkedRing(int pid, int events_pid, uint64_t seq, Output &out, RingWatch &watch);
    ~ForkedRing();

    int pid() const { return pid_; }
    int events_pid() const { return events_pid_; }

    // kprobe_profile of the process (its agent serves no socket: from its shared counters),
    // read at its exit_group or execve or once it was gone, else as last read while it
    // ran (`final` false).
    ProfileBlock profile();

    // Waits for the stream's end (the process is gone).
    void join();

    // Takes the ring, the event table and the process's objects (`known`: objects parsed
    // before, TraceReader), while the process waits in its notice; false if the ring or
    // the table is not to be had (the ring is then read at the process's exit:
    // drain_forked_ring). The table is asked of the agent of events_pid; once that agent is
    // gone, it is the one `table_from` read while it lived (a daemon and its workers,
    // forked by a program that has exited: TraceReader::borrow_events).
    bool open(const ukp::sym::Registry &known, const TraceReader *table_from = nullptr);

    // The reader of the ring (its event table, for a descendant's: open()).
    const TraceReader *reader() const { return reader_.get(); }

    // The process's objects, as open() read them. Before start().
    const ukp::sym::Registry &symbols() const { return reader_->symbols(); }

    void start();

    // Whether the process is gone (its pidfd reads as ready once it has exited).
    bool gone() const;

private:
    bool source_gone() const override { return gone(); }

public:
    // Empties the ring while the process waits in exit_group or execve (`hold`, dropped
    // once done; `exec`: the stream ends once the image is replaced). Returns at once.
    void drain(bool exec, HoldPtr hold);

    // The process runs another image now (its agent is streamed): the ring was emptied at
    // the execve, nothing writes it any more. The stream ends after a last read. An image
    // without an agent is noticed by the stream itself (holds_ring).
    void finish();

    // Whether the stream goes on (drain() waits for it).
    bool streaming();

    bool ended();

private:
    // `gone`: the process is; these are its last counts.
    void read_profile(bool gone = false);

    // Whether the process still has the ring mapped: an execve that succeeded replaced
    // its memory, one that failed did not. (Its descriptor says nothing: the process
    // closes it once ukprobe holds a copy, ring.cpp's after_fork_child.)
    bool holds_ring() const;

    void loop();

    const int pid_;
    const int events_pid_;   // the process whose agent gave the event table
    const uint64_t seq_;     // the order processes were met in (their kprobe_profile's)
    const std::string comm_; // the program's name when taken
    Output &out_;
    int pidfd_ = -1;                      // the process, ready to read once it is gone
    ino_t ring_ino_ = 0;                  // the ring's file (holds_ring)
    Client events_;                       // to events_pid_'s agent: its event table only
    std::unique_ptr<TraceReader> reader_; // the taken ring, read and printed here
    SharedCounts counts_;                 // its kprobe_profile counters, taken with the ring
    std::thread thread_;
    uint64_t drain_asked_ = 0;   // under mu_
    uint64_t drain_done_ = 0;    // under mu_
    std::vector<HoldPtr> holds_; // under mu_: calls waiting for the next drain
    bool finish_ = false;        // under mu_: the process exec'd; a last read, then the end
    bool exec_asked_ = false;    // under mu_: a drain at an execve came (it may have failed)
    bool ended_ = false;         // under mu_: the stream is over
    std::string profile_;        // under mu_: kprobe_profile at the last drain, or as last read
    bool final_ = false;         // under mu_: profile_ read once the process was gone
    std::chrono::steady_clock::time_point profile_read_{}; // the streaming thread's last read of it
};

// A child of fork() whose ring was not taken at its notice waits in exit_group or execve:
// its ring is taken now, emptied into `out` and printed with the event table of the agent
// of `events_pid`, its ancestor (or, that agent gone, the one `table_from` read, as for
// ForkedRing::open). Its kprobe_profile, `seq` left for the caller to give; nothing when
// the ring or the table is not to be had.
std::optional<ProfileBlock> drain_forked_ring(int pid, int events_pid, Output &out,
                                              const TraceReader *table_from = nullptr);

} // namespace ukprobe
