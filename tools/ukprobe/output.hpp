// The output of `ukprobe run` and `record`: the trace of every process, merged by
// timestamp as well as a short delay allows, and written by a thread of its own: a slow
// reader of the output (a pipe to a pager) holds that thread, never the streams nor the
// thread that answers the traced processes.
//
// Each add() is a run: a stream's block of lines, in timestamp order as its ring gave
// them (RingMerger). A line waits kMergeDelay, and so does every line after it in time:
// the writer merges the runs old enough (a heap over their next lines), up to the
// earliest line of a run still waiting, and writes whole stretches of a run at once. No
// line is copied or allocated on its own.
//
// `capture` (ukprobe record): each add() is blocks of a capture file (trace/capture.hpp),
// written as they come after the file's header; the report merges them.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace ukprobe {

class Output {
public:
    Output(FILE *f, bool capture) : f_(f), capture_(capture), writer_([this] { write_loop(); }) {}
    ~Output() { finish(); }
    Output(const Output &) = delete;
    Output &operator=(const Output &) = delete;

    // Whether streams add capture blocks, not text.
    bool capture() const { return capture_; }

    void add(std::string text);

    // A buffer written out, for a stream's next read (TraceReader::give_buffer), or an
    // empty one.
    std::string spare();

    // The events the trace's "CPU:N [LOST M EVENTS]" lines counted so far.
    uint64_t lost();

    // Writes every line left and stops the writer.
    void finish();

private:
    struct Run {
        std::chrono::steady_clock::time_point arrived;
        uint64_t seq = 0;            // arrival order, for lines of equal timestamps
        std::string text;            // whole lines
        std::vector<uint32_t> start; // each line's offset, then the end of the text
        std::vector<uint64_t> ts;    // each line's timestamp
        uint64_t min_ts = 0;
        size_t next = 0; // the first line not written yet
    };
    using RunPtr = std::unique_ptr<Run>;

    // The lines of `runs` before `cutoff`, in timestamp order, as stretches of the runs'
    // texts (`pieces`); the runs written to the end move to `done` (the pieces point into
    // them), those with lines left stay in `runs`, in their order.
    static void merge(std::vector<RunPtr> &runs, uint64_t cutoff, std::vector<std::string_view> &pieces,
                      std::vector<RunPtr> &done);
    void write_loop();
    // The texts of `runs`, written out, kept for spare() (a few); `runs` emptied. Under mu_.
    void recycle(std::vector<RunPtr> &runs);
    // Writes `block` out and empties it (stdio passes a write this large straight on).
    void write_block(std::string &block);

    std::mutex mu_;
    std::condition_variable cv_;
    FILE *f_; // the writer's
    const bool capture_;
    bool stop_ = false;              // under mu_
    std::deque<RunPtr> runs_;        // under mu_: in arrival order
    std::vector<std::string> spare_; // under mu_: read buffers written out, for spare()
    uint64_t seq_ = 0;               // under mu_
    uint64_t lost_ = 0;              // under mu_
    std::thread writer_;             // last: starts once the rest is made
};

} // namespace ukprobe
