#include "agent_stream.hpp"

#include "proc.hpp"
#include "ring_reads.hpp"

#include <stdexcept>
#include <sys/stat.h>
#include <unistd.h>

using ukp::control::Op;

namespace ukprobe {

namespace {

using Clock = std::chrono::steady_clock;

// How often, at most, kprobe_profile is read while a process runs, when its stream wakes
// (ring_watch.hpp: at least every RingStream::kStreamWaitMax). A process killed by a
// signal has its counts read after its death anyway, from the counters' memfd.
constexpr auto kProfileInterval = std::chrono::milliseconds(200);

} // namespace

AgentStream::AgentStream(int pid, uint64_t seq, Output &out, RingWatch &watch)
    : RingStream(watch), pid_(pid), seq_(seq), comm_(comm_of(pid)), out_(out) {
    if (out.capture()) reader_.capture();
}

AgentStream::~AgentStream() {
    if (thread_.joinable()) thread_.join();
}

int AgentStream::connect() {
    struct stat st {};
    if (stat(agent_socket_path(pid_, static_cast<unsigned>(geteuid())).c_str(), &st) == 0) socket_ino_ = st.st_ino;
    std::string why;
    if (int err = client_.connect(pid_, &why); err != 0) return err;
    // Should ukprobe die, the agent disables the events nobody reads any more.
    client_.request(Op::kSupervised);
    return 0;
}

void AgentStream::share_counts() {
    const Reply r = client_.request(Op::kOpenFd, ukp::control::kCountersPath);
    if (r.status >= 0)
        counts_.map(r.fd);
    else if (r.fd >= 0)
        close(r.fd);
}

void AgentStream::prepare() {
    reader_.remember_maps();
    reader_.will_format_locally();
}

void AgentStream::start() {
    watch(reader_);
    thread_ = std::thread([this] { loop(); });
}

void AgentStream::drain(HoldPtr hold) {
    std::lock_guard lock(mu_);
    if (ended_) return;
    holds_.push_back(std::move(hold));
    ++drain_asked_;
    cv_.notify_all(); // the streaming thread may be waiting for a record
}

bool AgentStream::ended() {
    std::lock_guard lock(mu_);
    return ended_;
}

void AgentStream::join() {
    if (thread_.joinable()) thread_.join();
}

ProfileBlock AgentStream::profile() {
    std::lock_guard lock(mu_);
    return ProfileBlock{seq_, pid_, comm_, profile_, drain_done_ > 0 || final_, false, answers_};
}

void AgentStream::loop() {
    try {
        for (;;) {
            uint64_t asked;
            std::vector<HoldPtr> held; // let go once the ring is empty
            {
                std::lock_guard lock(mu_);
                asked = drain_asked_;
                held.swap(holds_);
            }
            if (asked > drain_done_) {
                while_reading([&] { drain_ring(reader_, out_, kPipeWaitMs); }); // the process is held
                const Reply p = client_.request(Op::kRead, "kprobe_profile");
                std::vector<std::string> answers;
                for (const std::string &path : answer_paths_) {
                    const Reply a = client_.request(Op::kRead, path);
                    answers.push_back(a.status >= 0 ? a.payload : "");
                }
                std::lock_guard lock(mu_);
                if (p.status >= 0) profile_ = p.payload;
                answers_ = std::move(answers);
                drain_done_ = asked;
                continue;
            }
            // The watch woke the stream for it, and a read of the mapped ring asks
            // the agent nothing that would fail: the end, as a failed request is.
            if (image_gone()) throw std::runtime_error("the process is gone");
            // What is there now. Then, for a ring mapped here, a wait for the watch
            // (ring_watch.hpp), cut short by a drain asked (the process waits for it
            // in exit_group or execve). Served by the agent, trace_pipe's read itself
            // waits.
            bool again = false;
            read_into(reader_, out_, [&] { return read_some(reader_, &again); });
            // The counts so far, for a process that dies of a signal (no exit_group).
            if (Clock::now() - profile_read_ >= kProfileInterval) {
                const Reply p = client_.request(Op::kRead, "kprobe_profile");
                profile_read_ = Clock::now();
                std::lock_guard lock(mu_);
                if (p.status >= 0 && drain_done_ == 0) profile_ = p.payload;
            }
            if (!again && reader_.formats_locally()) {
                std::unique_lock lock(mu_);
                wait_for_look(lock, [&] { return drain_asked_ != asked; });
            }
        }
    } catch (const std::runtime_error &) {
        // The process is gone (or exec'd): its sockets closed. What it recorded after
        // the last read is still in the ring mapped here: a process killed by a
        // signal never waits in exit_group for a drain.
        unwatch();
        reader_.agent_gone();
        try {
            drain_ring(reader_, out_, 0);
        } catch (const std::runtime_error &) {
        }
        // Nor was it asked for its counts: they are read where it left them.
        std::string why, text = counts_.read(&why);
        std::lock_guard lock(mu_);
        if (drain_done_ == 0 && !text.empty()) {
            profile_ = std::move(text);
            final_ = true;
        }
    }
    reader_.unmap();
    std::lock_guard lock(mu_);
    ended_ = true;
    holds_.clear();
}

} // namespace ukprobe
