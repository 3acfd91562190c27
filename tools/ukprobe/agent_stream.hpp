// The stream of a process whose agent `ukprobe run` is connected to: the connection, and
// a thread that reads the process's ring (trace_pipe) into the output until the process
// is gone or exec'd, emptying it whenever the process waits in exit_group or execve.
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
#include <string>
#include <thread>
#include <vector>

namespace ukprobe {

// The agent of one process: a connection, and a thread that reads trace_pipe on it.
class AgentStream final : RingStream {
public:
    AgentStream(int pid, uint64_t seq, Output &out, RingWatch &watch);
    ~AgentStream();

    int pid() const { return pid_; }
    const std::string &comm() const { return comm_; }

    // 0, or a negative errno (the socket is not there, or refuses).
    int connect();

    // Maps the agent's kprobe_profile counters (Op::kOpenFd kCountersPath): the counts of
    // a process killed by a signal, which never waits in exit_group to be asked for them.
    void share_counts();

    // The inode of the socket connected to: after an exec the new image's agent binds
    // another one under the same path.
    ino_t socket_ino() const { return socket_ino_; }

    // The image streamed from is gone (exited or exec'd), though the streaming thread,
    // waiting on the mapped ring, may not have noticed yet.
    bool image_gone() const { return client_.peer_closed(); }

    // The stream's reader: its event table, for the rings of children forked from this
    // image once the image is gone (TraceReader::borrow_events).
    const TraceReader &reader() const { return reader_; }

private:
    bool source_gone() const override { return image_gone(); }

public:
    // A request before the thread runs; a refusal is returned with its message.
    Reply ask(ukp::control::Op op, const std::string &path, const std::string &payload = {}) {
        return client_.request(op, path, payload);
    }

    // While the process waits in its notice: what its records need should it die before
    // the stream reads them (a process killed right after its start): its objects, the
    // ring mapped and the event table read. It throws as ask() does.
    void prepare();

    void start();

    // Files read with kprobe_profile when the process waits in exit_group or execve (a
    // question's hist: RunOptions::answers). Before start().
    void read_at_end(std::vector<std::string> paths) { answer_paths_ = std::move(paths); }

    // Empties the ring while the process waits in exit_group or execve (`hold`, dropped
    // once done); kprobe_profile is read afterwards. Returns at once.
    void drain(HoldPtr hold);

    bool ended();

    // Waits for the stream's end (the process is gone).
    void join();

    ProfileBlock profile();

private:
    void loop();

    const int pid_;
    const uint64_t seq_;     // the order processes were met in (their kprobe_profile's)
    const std::string comm_; // the program's name when connected
    ino_t socket_ino_ = 0;
    Output &out_;
    Client client_;
    TraceReader reader_{client_, pid_, true}; // trace_pipe, read and printed here
    SharedCounts counts_;                     // its kprobe_profile counters, mapped (share_counts)
    std::thread thread_;
    uint64_t drain_asked_ = 0;              // under mu_
    uint64_t drain_done_ = 0;               // under mu_
    std::vector<HoldPtr> holds_;            // under mu_: calls waiting for the next drain
    bool ended_ = false;                    // under mu_: the connection is gone
    std::string profile_;                   // under mu_: kprobe_profile at the last drain, or as last read
    std::vector<std::string> answer_paths_; // read_at_end's
    std::vector<std::string> answers_;      // under mu_: their texts at the last drain
    bool final_ = false;                    // under mu_: profile_ read from counts_ once the process was gone
    std::chrono::steady_clock::time_point profile_read_{}; // the streaming thread's last read of it
};

} // namespace ukprobe
