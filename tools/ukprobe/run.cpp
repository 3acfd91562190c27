// ukprobe run. The program is a child of ukprobe with the agent preloaded (LD_PRELOAD),
// its events defined before main (UKP_EVENTS) and the control socket on (UKP_CONTROL=1).
//
// Seeing the end: once a process is gone its socket is gone, and the agent's destructor
// unlinks the socket path before exit_group. So the child installs, before exec, a seccomp
// filter that hands exit_group, execve(at), unlink(at) and the agents' notices (ring.hpp)
// to ukprobe (SECCOMP_RET_USER_NOTIF, inherited by every descendant). A process calling
// exit_group waits in the call while its stream empties its ring (mapped: reader.hpp) and
// reads kprobe_profile over the connection it already holds; then the call goes on
// (SECCOMP_USER_NOTIF_FLAG_CONTINUE: Hold). An unlink lets ukprobe connect to a process
// it has not reached yet before the socket path goes; an execve empties the ring of the
// image about to be replaced. No ptrace: probe hits (SIGTRAP) never stop.
//
// Seeing the children: they inherit the filter. A process whose agent's control thread
// listens gives notice before its main, and waits while ukprobe connects, checks
// error_log and sets filters and triggers. ukprobe is a subreaper: orphaned descendants
// stay in its tree. A child of fork() that has not exec'd serves no socket: it gives
// notice of its new ring, and while it waits there its ring is taken from it
// (pidfd_getfd) and streamed from then on (ForkedRing), emptied at its execve or
// exit_group, read to the end once it is gone. A ring not taken then is read when the
// process waits in execve or exit_group (drain_forked).
//
// Threads: the main one answers the notifications and signals and never waits for
// output; one per stream reads and formats a ring; one writes the merged trace (Output).
#include "run.hpp"

#include "client.hpp"
#include "reader.hpp"
#include "ring_watch.hpp"
#include "trace/capture.hpp"
#include "control/fd_passing.hpp"
#include "trace/counters.hpp"
#include "trace/profile_table.hpp"
#include "trace/ring.hpp"
#include "platform/elf_file.hpp"
#include "platform/maps.hpp"

#include <fmt/core.h>
#include <gelf.h>
#include <libelf.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <csignal>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <dirent.h>
#include <fcntl.h>
#include <fstream>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <map>
#include <memory>
#include <mutex>
#include <poll.h>
#include <sstream>
#include <queue>
#include <stdexcept>
#include <string_view>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <thread>
#include <tuple>
#include <unistd.h>

using ukp::control::Op;

namespace ukprobe {
namespace platform = ukp::platform;

std::string event_path(const std::string &event, const std::string &definitions) {
    std::string e = event;
    if (const size_t dot = e.find('.'); e.find('/') == std::string::npos && dot != std::string::npos) e[dot] = '/';
    if (e.find('/') != std::string::npos) return e;
    std::istringstream in(definitions);
    std::string line;
    while (std::getline(in, line)) {
        const std::string word = line.substr(0, line.find_first_of(" \t"));
        const size_t colon = word.find(':'), slash = word.find('/');
        if (colon == std::string::npos || slash == std::string::npos || slash < colon) continue;
        if (word.substr(slash + 1) == e) return word.substr(colon + 1);
    }
    return "kprobes/" + e;
}

namespace {

using Clock = std::chrono::steady_clock;

// How long a line waits before it is written, so that lines of other processes read a
// little later can still be put before it by timestamp.
constexpr auto kMergeDelay = std::chrono::milliseconds(200);
// How often the output is written, and in blocks of how many bytes.
constexpr auto kWriteInterval = std::chrono::milliseconds(50);
constexpr size_t kWriteBlock = 1 << 20;
constexpr size_t kSpareBuffers = 24; // read buffers kept for reuse: what 200 ms of a busy trace holds
// Longest wait for a process's ring to be emptied at its exit.
constexpr auto kDrainTimeout = std::chrono::seconds(5);
// How long a trace_pipe read waits for a record: also how long a stream takes to see a
// drain asked (a process waiting in exit_group) or its process gone.
constexpr int kPipeWaitMs = 5;
// How long a new socket is given to answer (Runner::agent_answers).
constexpr int kPingTimeoutMs = 50;
// How long a forked child's ring waits for its ancestor's event table (ForkedRing, drain_forked).
constexpr int kForkedTableTimeoutMs = 1000;
// How often, at most, kprobe_profile is read while a process runs, when its stream wakes
// (ring_watch.hpp: at least every RingStream::kStreamWaitMax). A process killed by a
// signal has its counts read after its death anyway, from the counters' memfd.
constexpr auto kProfileInterval = std::chrono::milliseconds(200);
// The same for a child of fork(), whose counters are copied out of it (a few microseconds,
// no request to its agent).
constexpr auto kForkedProfileInterval = std::chrono::milliseconds(50);

// The timestamp of a trace line ("  prog-42  [001] .....  12.345678: e: ..."), in
// nanoseconds: the first word after the CPU that is digits, '.', digits and ':'. 0 if it
// has none.
uint64_t line_timestamp(std::string_view line) {
    const size_t bracket = line.find("] ");
    if (bracket == std::string_view::npos) return 0;
    size_t i = bracket + 2;
    while (i < line.size()) {
        while (i < line.size() && line[i] == ' ') ++i;
        const size_t word = i;
        uint64_t sec = 0, frac = 0;
        int digits = 0, frac_digits = 0;
        while (i < line.size() && line[i] >= '0' && line[i] <= '9') sec = sec * 10 + uint64_t(line[i++] - '0'), ++digits;
        if (digits > 0 && i < line.size() && line[i] == '.') {
            ++i;
            while (i < line.size() && line[i] >= '0' && line[i] <= '9') {
                if (frac_digits < 9) frac = frac * 10 + uint64_t(line[i] - '0'), ++frac_digits;
                ++i;
            }
            if (frac_digits > 0 && i < line.size() && line[i] == ':') {
                for (; frac_digits < 9; ++frac_digits) frac *= 10;
                return sec * 1000000000ull + frac;
            }
        }
        i = line.find(' ', word);
        if (i == std::string_view::npos) return 0;
    }
    return 0;
}

// M of a "CPU:N [LOST M EVENTS]" line, else 0.
uint64_t lost_count(std::string_view line) {
    const size_t at = line.find("[LOST ");
    if (line.rfind("CPU:", 0) != 0 || at == std::string_view::npos) return 0;
    uint64_t n = 0;
    for (size_t i = at + 6; i < line.size() && line[i] >= '0' && line[i] <= '9'; ++i) n = n * 10 + uint64_t(line[i] - '0');
    return n;
}

// The trace of every process, merged by timestamp as well as a short delay allows, and
// written by a thread of its own: a slow reader of the output (a pipe to a pager) holds
// that thread, never the streams nor the thread that answers the traced processes.
//
// Each add() is a run: a stream's block of lines, in timestamp order as its ring gave
// them (RingMerger). A line waits kMergeDelay, and so does every line after it in time:
// the writer merges the runs old enough (a heap over their next lines), up to the
// earliest line of a run still waiting, and writes whole stretches of a run at once. No
// line is copied or allocated on its own.
//
// `capture` (ukprobe record): each add() is blocks of a capture file (trace/capture.hpp),
// written as they come after the file's header; the report merges them.
class Output {
public:
    Output(FILE *f, bool capture) : f_(f), capture_(capture), writer_([this] { write_loop(); }) {}
    ~Output() { finish(); }
    Output(const Output &) = delete;
    Output &operator=(const Output &) = delete;

    // Whether streams add capture blocks, not text.
    bool capture() const { return capture_; }

    void add(std::string text) {
        if (text.empty()) return;
        auto run = std::make_unique<Run>();
        run->arrived = Clock::now();
        if (capture_) {
            const uint64_t lost = ukp::trace::capture::lost_in(text);
            run->text = std::move(text);
            {
                std::lock_guard lock(mu_);
                run->seq = seq_++;
                runs_.push_back(std::move(run));
                lost_ += lost;
            }
            cv_.notify_all(); // written at once: its buffer comes back for the next read
            return;
        }
        if (text.back() != '\n') text += '\n';
        run->text = std::move(text);
        const std::string_view all(run->text);
        uint64_t prev = 0, lost = 0;
        size_t untimed = 0; // lines before the first timestamp (a LOST line) take the next one's
        for (size_t pos = 0; pos < all.size();) {
            const size_t end = all.find('\n', pos) + 1;
            uint64_t ts = line_timestamp(all.substr(pos, end - pos));
            if (ts == 0) lost += lost_count(all.substr(pos, end - pos));
            if (ts == 0 && prev == 0) ++untimed;
            if (ts == 0) ts = prev;
            if (ts != 0 && prev == 0)
                for (size_t i = run->ts.size() - untimed; i < run->ts.size(); ++i) run->ts[i] = ts;
            prev = ts;
            run->start.push_back(static_cast<uint32_t>(pos));
            run->ts.push_back(ts);
            pos = end;
        }
        run->start.push_back(static_cast<uint32_t>(all.size()));
        run->min_ts = *std::min_element(run->ts.begin(), run->ts.end());
        std::lock_guard lock(mu_);
        run->seq = seq_++;
        runs_.push_back(std::move(run));
        lost_ += lost;
    }

    // A buffer written out, for a stream's next read (TraceReader::give_buffer), or an
    // empty one.
    std::string spare() {
        std::lock_guard lock(mu_);
        if (spare_.empty()) return {};
        std::string s = std::move(spare_.back());
        spare_.pop_back();
        return s;
    }

    // The events the trace's "CPU:N [LOST M EVENTS]" lines counted so far.
    uint64_t lost() {
        std::lock_guard lock(mu_);
        return lost_;
    }

    // Writes every line left and stops the writer.
    void finish() {
        {
            std::lock_guard lock(mu_);
            if (stop_) return;
            stop_ = true;
        }
        cv_.notify_all();
        writer_.join();
        if (f_ != nullptr) fflush(f_);
    }

private:
    struct Run {
        Clock::time_point arrived;
        uint64_t seq = 0;             // arrival order, for lines of equal timestamps
        std::string text;             // whole lines
        std::vector<uint32_t> start;  // each line's offset, then the end of the text
        std::vector<uint64_t> ts;     // each line's timestamp
        uint64_t min_ts = 0;
        size_t next = 0;              // the first line not written yet
    };
    using RunPtr = std::unique_ptr<Run>;

    // The lines of `runs` before `cutoff`, in timestamp order, as stretches of the runs'
    // texts (`pieces`); the runs written to the end move to `done` (the pieces point into
    // them), those with lines left stay in `runs`, in their order.
    static void merge(std::vector<RunPtr> &runs, uint64_t cutoff, std::vector<std::string_view> &pieces,
                      std::vector<RunPtr> &done) {
        // (next line's timestamp, seq, index): the smallest first.
        using Head = std::tuple<uint64_t, uint64_t, size_t>;
        std::priority_queue<Head, std::vector<Head>, std::greater<Head>> heads;
        for (size_t i = 0; i < runs.size(); ++i)
            if (runs[i]->next < runs[i]->ts.size()) heads.emplace(runs[i]->ts[runs[i]->next], runs[i]->seq, i);
        while (!heads.empty()) {
            const auto [ts, seq, i] = heads.top();
            heads.pop();
            if (ts >= cutoff) break;
            Run &r = *runs[i];
            // The stretch of this run that comes before every other run's next line.
            const uint64_t limit = heads.empty() ? cutoff : std::min(cutoff, std::get<0>(heads.top()) + 1);
            size_t end = r.next + 1;
            while (end < r.ts.size() && r.ts[end] < limit && r.ts[end] >= r.ts[end - 1]) ++end;
            pieces.emplace_back(r.text.data() + r.start[r.next], r.start[end] - r.start[r.next]);
            r.next = end;
            if (end < r.ts.size()) heads.emplace(r.ts[end], seq, i);
        }
        for (RunPtr &r : runs)
            if (r->next == r->ts.size()) done.push_back(std::move(r));
        std::erase_if(runs, [](const RunPtr &r) { return r == nullptr; });
    }

    void write_loop() {
        sigset_t all;
        sigfillset(&all);
        pthread_sigmask(SIG_BLOCK, &all, nullptr); // signals are ukprobe's main thread's (signalfd)
        std::vector<RunPtr> ready, done; // runs old enough (and what is left of them); runs written
        std::vector<std::string_view> pieces;
        std::string block;
        block.reserve(kWriteBlock + (64 << 10));
        if (capture_ && f_ != nullptr) {
            const std::string header = ukp::trace::capture::file_header();
            if (fwrite(header.data(), 1, header.size(), f_) != header.size()) f_ = nullptr;
        }
        std::unique_lock lock(mu_);
        for (;;) {
            const bool last = stop_;
            const Clock::time_point now = Clock::now();
            if (capture_) { // blocks: as they came, at once
                ready.assign(std::make_move_iterator(runs_.begin()), std::make_move_iterator(runs_.end()));
                runs_.clear();
                lock.unlock();
                for (const RunPtr &r : ready)
                    if (f_ != nullptr && fwrite(r->text.data(), 1, r->text.size(), f_) != r->text.size()) f_ = nullptr;
                if (!ready.empty() && f_ != nullptr && fflush(f_) != 0) f_ = nullptr;
                lock.lock();
                recycle(ready);
                if (last) return;
                cv_.wait_for(lock, kWriteInterval, [&] { return stop_ || !runs_.empty(); });
                continue;
            }
            while (!runs_.empty() && (last || now - runs_.front()->arrived >= kMergeDelay)) {
                ready.push_back(std::move(runs_.front()));
                runs_.pop_front();
            }
            // A line waits its delay, and so every line after it in time.
            uint64_t cutoff = ~0ull;
            for (const RunPtr &r : runs_) cutoff = std::min(cutoff, r->min_ts);
            lock.unlock();
            pieces.clear();
            if (!ready.empty()) merge(ready, last ? ~0ull : cutoff, pieces, done);
            // Gathered into blocks of kWriteBlock: the merge interleaves the streams' runs
            // in short stretches, and each write into a file's page cache has a cost of
            // its own beside the bytes'.
            for (std::string_view piece : pieces) {
                block.append(piece);
                if (block.size() >= kWriteBlock) write_block(block);
            }
            write_block(block);
            if (f_ != nullptr && fflush(f_) != 0) f_ = nullptr; // a closed pipe: the trace is dropped
            lock.lock();
            recycle(done);
            if (last) return;
            cv_.wait_for(lock, kWriteInterval, [&] { return stop_; });
        }
    }

    // The texts of `runs`, written out, kept for spare() (a few); `runs` emptied. Under mu_.
    void recycle(std::vector<RunPtr> &runs) {
        for (RunPtr &r : runs)
            if (spare_.size() < kSpareBuffers && r->text.capacity() >= kWriteBlock / 2) spare_.push_back(std::move(r->text));
        runs.clear();
    }

    // Writes `block` out and empties it (stdio passes a write this large straight on).
    void write_block(std::string &block) {
        if (!block.empty() && f_ != nullptr && fwrite(block.data(), 1, block.size(), f_) != block.size()) f_ = nullptr;
        block.clear();
    }

    std::mutex mu_;
    std::condition_variable cv_;
    FILE *f_;                // the writer's
    const bool capture_;
    bool stop_ = false;      // under mu_
    std::deque<RunPtr> runs_; // under mu_: in arrival order
    std::vector<std::string> spare_; // under mu_: read buffers written out, for spare()
    uint64_t seq_ = 0;       // under mu_
    uint64_t lost_ = 0;      // under mu_
    std::thread writer_;     // last: starts once the rest is made
};

// A system call waiting for ukprobe (a seccomp notification): let go once the last
// stream that empties a ring for it drops its share, or by expire() at the latest. The
// thread that answers notifications hands these out and goes on: it never waits for
// output.
class Hold {
public:
    Hold(int notify_fd, uint64_t id) : notify_fd_(notify_fd), id_(id), deadline_(Clock::now() + kDrainTimeout) {}
    ~Hold() { let_go(); }
    Hold(const Hold &) = delete;
    Hold &operator=(const Hold &) = delete;

    // Lets the call go if its time is up; whether it is gone.
    bool expire(Clock::time_point now) {
        if (now >= deadline_) let_go();
        return gone_.load();
    }

    // The call goes on unchanged (once).
    void let_go() {
        if (gone_.exchange(true)) return;
        seccomp_notif_resp resp;
        memset(&resp, 0, sizeof resp);
        resp.id = id_;
        resp.flags = SECCOMP_USER_NOTIF_FLAG_CONTINUE;
        ioctl(notify_fd_, SECCOMP_IOCTL_NOTIF_SEND, &resp); // ENOENT: the caller was killed meanwhile
    }

private:
    const int notify_fd_;
    const uint64_t id_;
    const Clock::time_point deadline_;
    std::atomic<bool> gone_{false};
};
using HoldPtr = std::shared_ptr<Hold>;

// Empties a ring whose process is held or gone: reads until it counts no entry left,
// what the process's other threads still write meanwhile included. `wait_ms`: how long
// each read waits for a record.
void drain_ring(TraceReader &reader, Output &out, int wait_ms) {
    reader.recheck_buffers();
    for (int i = 0; i < 1000 && reader.has_records(); ++i) {
        reader.give_buffer(out.spare());
        out.add(reader.pipe(wait_ms, 1 << 20));
    }
}

std::string comm_of(int pid) {
    std::ifstream in(fmt::format("/proc/{}/comm", pid));
    std::string s;
    std::getline(in, s);
    return s;
}

// A process's kprobe_profile counters, mapped from the memfd it shares them in
// (src/trace/counters.hpp): read as the process left them, alive or gone.
class SharedCounts {
public:
    SharedCounts() = default;
    ~SharedCounts() { unmap(); }
    SharedCounts(const SharedCounts &) = delete;
    SharedCounts &operator=(const SharedCounts &) = delete;

    // Maps the memfd `fd` (taking it); false if it cannot.
    bool map(int fd) {
        unmap();
        struct stat st{};
        if (fd < 0) return false;
        if (fstat(fd, &st) != 0 || st.st_size <= 0) {
            close(fd);
            return false;
        }
        void *p = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_SHARED | MAP_NORESERVE, fd, 0);
        close(fd);
        if (p == MAP_FAILED) return false;
        base_ = static_cast<const uint8_t *>(p);
        size_ = static_cast<size_t>(st.st_size);
        return true;
    }
    // kprobe_profile's text; empty (and *why) when not mapped or not valid.
    std::string read(std::string *why) const { return ukp::trace::read_profile(base_, size_, why); }

private:
    void unmap() {
        if (base_ != nullptr) munmap(const_cast<uint8_t *>(base_), size_);
        base_ = nullptr;
        size_ = 0;
    }
    const uint8_t *base_ = nullptr;
    size_t size_ = 0;
};

// kprobe_profile of one process image, printed when everything ends.
struct ProfileBlock {
    uint64_t seq;      // the order processes were met in
    int pid;
    std::string comm;
    std::string text;  // the file's lines; empty if never read
    bool final;        // read at its exit_group or execve, not as last read while it ran
    bool forked;       // a child of fork() that had not exec'd
};

// The agent of one process: a connection, and a thread that reads trace_pipe on it.
class Agent final : RingStream {
public:
    Agent(int pid, uint64_t seq, Output &out, RingWatch &watch)
        : RingStream(watch), pid_(pid), seq_(seq), comm_(comm_of(pid)), out_(out) {
        if (out.capture()) reader_.capture();
    }
    ~Agent() {
        if (thread_.joinable()) thread_.join();
    }

    int pid() const { return pid_; }
    const std::string &comm() const { return comm_; }

    // 0, or a negative errno (the socket is not there, or refuses).
    int connect() {
        struct stat st{};
        if (stat(ukp::control::socket_path(static_cast<unsigned>(geteuid()), pid_).c_str(), &st) == 0)
            socket_ino_ = st.st_ino;
        std::string why;
        return client_.connect(pid_, &why);
    }

    // Maps the agent's kprobe_profile counters (Op::kOpenFd kCountersPath): the counts of
    // a process killed by a signal, which never waits in exit_group to be asked for them.
    void share_counts() {
        const Reply r = client_.request(Op::kOpenFd, ukp::control::kCountersPath);
        if (r.status >= 0) counts_.map(r.fd);
        else if (r.fd >= 0) close(r.fd);
    }

    // The inode of the socket connected to: after an exec the new image's agent binds
    // another one under the same path.
    ino_t socket_ino() const { return socket_ino_; }

    // The image streamed from is gone (exited or exec'd), though the streaming thread,
    // waiting on the mapped ring, may not have noticed yet.
    bool image_gone() const { return client_.peer_closed(); }

private:
    bool source_gone() const override { return image_gone(); }

public:
    // A request before the thread runs; a refusal is returned with its message.
    Reply ask(Op op, const std::string &path, const std::string &payload = {}) {
        return client_.request(op, path, payload);
    }

    // While the process waits in its notice: what its records need should it die before
    // the stream reads them (a process killed right after its start): its objects, the
    // ring mapped and the event table read. It throws as ask() does.
    void prepare() {
        reader_.remember_maps();
        reader_.will_format_locally();
    }

    void start() {
        watch(reader_);
        thread_ = std::thread([this] { loop(); });
    }

    // Empties the ring while the process waits in exit_group or execve (`hold`, dropped
    // once done); kprobe_profile is read afterwards. Returns at once.
    void drain(HoldPtr hold) {
        std::lock_guard lock(mu_);
        if (ended_) return;
        holds_.push_back(std::move(hold));
        ++drain_asked_;
        cv_.notify_all(); // the streaming thread may be waiting for a record
    }

    bool ended() {
        std::lock_guard lock(mu_);
        return ended_;
    }

    // Waits for the stream's end (the process is gone).
    void join() {
        if (thread_.joinable()) thread_.join();
    }

    ProfileBlock profile() {
        std::lock_guard lock(mu_);
        return ProfileBlock{seq_, pid_, comm_, profile_, drain_done_ > 0 || final_, false};
    }

private:
    void loop() {
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
                    std::lock_guard lock(mu_);
                    if (p.status >= 0) profile_ = p.payload;
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
                reader_.give_buffer(out_.spare());
                out_.add(read_some(reader_, &again));
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

    const int pid_;
    const uint64_t seq_;     // the order processes were met in (their kprobe_profile's)
    const std::string comm_; // the program's name when connected
    ino_t socket_ino_ = 0;
    Output &out_;
    Client client_;
    TraceReader reader_{client_, pid_, true}; // trace_pipe, read and printed here
    SharedCounts counts_; // its kprobe_profile counters, mapped (share_counts)
    std::thread thread_;
    uint64_t drain_asked_ = 0; // under mu_
    uint64_t drain_done_ = 0;  // under mu_
    std::vector<HoldPtr> holds_; // under mu_: calls waiting for the next drain
    bool ended_ = false;       // under mu_: the connection is gone
    std::string profile_;      // under mu_: kprobe_profile at the last drain, or as last read
    bool final_ = false;       // under mu_: profile_ read from counts_ once the process was gone
    Clock::time_point profile_read_{}; // the streaming thread's last read of it
};

// A memfd of the agent of `pid` whose name starts with `prefix`, taken from the process
// (pidfd_getfd through `pidfd`: ukprobe is its ancestor), for which `own` says the process
// is `pid` itself (a child of fork() also holds its parent's); -1 if none. *number, when
// given, is its descriptor there.
template <typename Own>
int memfd_of(int pid, int pidfd, const char *prefix, Own own, int *number = nullptr) {
    int found = -1;
    const std::string dir = fmt::format("/proc/{}/fd", pid);
    if (DIR *d = opendir(dir.c_str())) {
        while (const dirent *e = readdir(d)) {
            char link[128] = {};
            const std::string path = dir + "/" + e->d_name;
            if (readlink(path.c_str(), link, sizeof link - 1) <= 0 || strncmp(link, prefix, strlen(prefix)) != 0)
                continue;
            const int fd = static_cast<int>(syscall(SYS_pidfd_getfd, pidfd, atoi(e->d_name), 0));
            if (fd < 0) continue;
            if (own(fd)) {
                found = fd;
                if (number != nullptr) *number = atoi(e->d_name);
                break;
            }
            close(fd);
        }
        closedir(d);
    }
    return found;
}

// The memfd of `pid`'s own ring (memfd_of).
int ring_of(int pid, int pidfd, int *number = nullptr) {
    return memfd_of(
        pid, pidfd, "/memfd:ukprobes-trace",
        [pid](int fd) {
            ukp::trace::RingHeader h{};
            return pread(fd, &h, sizeof h, 0) == static_cast<ssize_t>(sizeof h) && h.magic == ukp::trace::kRingMagic &&
                   h.pid == pid;
        },
        number);
}

// The memfd of `pid`'s own kprobe_profile counters (memfd_of).
int counters_of(int pid, int pidfd) {
    return memfd_of(pid, pidfd, "/memfd:ukprobes-counters", [pid](int fd) {
        ukp::trace::CountersHeader h{};
        constexpr size_t kFixed = offsetof(ukp::trace::CountersHeader, table_seq);
        return pread(fd, &h, kFixed, 0) == static_cast<ssize_t>(kFixed) && h.magic == ukp::trace::kCountersMagic &&
               h.pid == pid;
    });
}

// The ring of a child of fork() that has not exec'd: its agent (copied) serves no socket,
// so the memfd is taken from the process at its notice (ring.cpp's after_fork_child) and
// streamed by a thread of its own, printed with the event table of the agent it was forked
// from (the same ids), until the process is gone: exited, killed (ukprobe holds the
// memfd: the records outlive the process) or exec'd.
class ForkedRing final : RingStream {
public:
    ForkedRing(int pid, int events_pid, uint64_t seq, Output &out, RingWatch &watch)
        : RingStream(watch), pid_(pid), events_pid_(events_pid), seq_(seq), comm_(comm_of(pid)), out_(out) {}
    ~ForkedRing() {
        if (thread_.joinable()) thread_.join();
        reader_.reset();
        if (pidfd_ >= 0) close(pidfd_);
    }

    int pid() const { return pid_; }
    int events_pid() const { return events_pid_; }

    // kprobe_profile of the process (its agent serves no socket: from its shared counters),
    // read at its exit_group or execve or once it was gone, else as last read while it
    // ran (`final` false).
    ProfileBlock profile() {
        std::lock_guard lock(mu_);
        return ProfileBlock{seq_, pid_, comm_, profile_, drain_done_ > 0 || final_, true};
    }

    // Waits for the stream's end (the process is gone).
    void join() {
        if (thread_.joinable()) thread_.join();
    }

    // Takes the ring, the event table and the process's objects (`known`: objects parsed
    // before, TraceReader), while the process waits in its notice; false if the ring or
    // the table is not to be had (the ring is then read at the process's exit:
    // drain_forked).
    bool open(const ukp::sym::Registry &known) {
        pidfd_ = static_cast<int>(syscall(SYS_pidfd_open, pid_, 0));
        if (pidfd_ < 0) return false;
        const int ring = ring_of(pid_, pidfd_);
        if (ring < 0) return false;
        struct stat st{};
        if (fstat(ring, &st) == 0) ring_ino_ = st.st_ino;
        counts_.map(counters_of(pid_, pidfd_));
        std::string why;
        if (events_.connect(events_pid_, &why) != 0) {
            close(ring);
            return false;
        }
        // This runs on the thread that answers the seccomp notifications: should the
        // agent's control thread wait in one now, its answer never comes. Bounded.
        events_.set_timeout_ms(kForkedTableTimeoutMs);
        reader_ = std::make_unique<TraceReader>(events_, pid_, ring, &known);
        if (out_.capture()) reader_->capture();
        try {
            reader_->entries(); // maps the ring, reads the event table and the process's objects
        } catch (const std::runtime_error &) {
            // The agent is gone, or did not answer in time.
        }
        return reader_->formats_locally();
    }

    // The process's objects, as open() read them. Before start().
    const ukp::sym::Registry &symbols() const { return reader_->symbols(); }

    void start() {
        watch(*reader_);
        thread_ = std::thread([this] { loop(); });
    }

    // Whether the process is gone (its pidfd reads as ready once it has exited).
    bool gone() const {
        pollfd p{pidfd_, POLLIN, 0};
        return poll(&p, 1, 0) == 1;
    }

private:
    bool source_gone() const override { return gone(); }

public:
    // Empties the ring while the process waits in exit_group or execve (`hold`, dropped
    // once done; `exec`: the stream ends once the image is replaced). Returns at once.
    void drain(bool exec, HoldPtr hold) {
        std::lock_guard lock(mu_);
        if (ended_ || finish_) return;
        exec_asked_ = exec_asked_ || exec;
        holds_.push_back(std::move(hold));
        ++drain_asked_;
        cv_.notify_all();
    }

    // The process runs another image now (its agent is streamed): the ring was emptied at
    // the execve, nothing writes it any more. The stream ends after a last read. An image
    // without an agent is noticed by the stream itself (holds_ring).
    void finish() {
        std::lock_guard lock(mu_);
        finish_ = true;
        cv_.notify_all();
    }

    // Whether the stream goes on (drain() waits for it).
    bool streaming() {
        std::lock_guard lock(mu_);
        return !ended_ && !finish_;
    }

    bool ended() {
        std::lock_guard lock(mu_);
        return ended_;
    }

private:
    // `gone`: the process is; these are its last counts.
    void read_profile(bool gone = false) {
        std::string why;
        std::string text = counts_.read(&why);
        profile_read_ = Clock::now();
        if (text.empty()) return;
        std::lock_guard lock(mu_);
        profile_ = std::move(text);
        final_ = final_ || gone;
    }

    // Whether the process still has the ring mapped: an execve that succeeded replaced
    // its memory, one that failed did not. (Its descriptor says nothing: the process
    // closes it once ukprobe holds a copy, ring.cpp's after_fork_child.)
    bool holds_ring() const {
        bool held = false;
        platform::for_each_mapping(pid_, [&](const platform::Mapping &m) {
            held = m.inode == ring_ino_ && m.path.find("/memfd:ukprobes-trace") != std::string_view::npos;
            return !held;
        });
        return held;
    }

    void loop() {
        try {
            for (;;) {
                uint64_t asked;
                bool finish, exec;
                std::vector<HoldPtr> held; // let go once the ring is empty
                {
                    std::lock_guard lock(mu_);
                    asked = drain_asked_;
                    finish = finish_;
                    exec = exec_asked_;
                    held.swap(holds_);
                }
                // Checked before the read: what a process recorded before it died (or
                // exec'd) is in the ring by then, and read below.
                const bool gone = this->gone();
                finish = finish || (exec && asked == drain_done_ && !holds_ring());
                if (gone || finish || asked > drain_done_) {
                    while_reading([&] { drain_ring(*reader_, out_, gone ? 0 : kPipeWaitMs); }); // held or gone
                    if (gone && drain_done_ == 0) read_profile(true); // killed: never held in exit_group
                    if (gone || finish) break;
                    read_profile(); // it waits in exit_group or execve: its last counts
                    std::lock_guard lock(mu_);
                    drain_done_ = asked;
                    continue;
                }
                // The counts so far, for a process that dies of a signal (no exit_group).
                if (asked == 0 && Clock::now() - profile_read_ >= kForkedProfileInterval) read_profile();
                bool again = false;
                reader_->give_buffer(out_.spare());
                out_.add(read_some(*reader_, &again));
                if (again) continue;
                // A wait for the watch (ring_watch.hpp: it also sees the process gone),
                // cut short by a drain asked (the process waits for it) or the end of the
                // image.
                std::unique_lock lock(mu_);
                wait_for_look(lock, [&] { return drain_asked_ != asked || finish_; });
            }
        } catch (const std::runtime_error &) {
            // An event the table read did not have, and the agent it came from is gone.
        }
        unwatch();
        reader_->unmap();
        std::lock_guard lock(mu_);
        ended_ = true;
        holds_.clear();
    }

    const int pid_;
    const int events_pid_; // the process whose agent gave the event table
    const uint64_t seq_;   // the order processes were met in (their kprobe_profile's)
    const std::string comm_; // the program's name when taken
    Output &out_;
    int pidfd_ = -1;       // the process, ready to read once it is gone
    ino_t ring_ino_ = 0;   // the ring's file (holds_ring)
    Client events_;        // to events_pid_'s agent: its event table only
    std::unique_ptr<TraceReader> reader_; // the taken ring, read and printed here
    SharedCounts counts_;  // its kprobe_profile counters, taken with the ring
    std::thread thread_;
    uint64_t drain_asked_ = 0; // under mu_
    uint64_t drain_done_ = 0;  // under mu_
    std::vector<HoldPtr> holds_; // under mu_: calls waiting for the next drain
    bool finish_ = false;      // under mu_: the process exec'd; a last read, then the end
    bool exec_asked_ = false;  // under mu_: a drain at an execve came (it may have failed)
    bool ended_ = false;       // under mu_: the stream is over
    std::string profile_;      // under mu_: kprobe_profile at the last drain, or as last read
    bool final_ = false;       // under mu_: profile_ read once the process was gone
    Clock::time_point profile_read_{}; // the streaming thread's last read of it
};

// UKP_EVENTS: definitions separated by ';', their words by ','.
std::string startup_events(const std::vector<std::string> &defs) {
    std::string spec;
    for (const std::string &d : defs) {
        if (d.find_first_of(";,") != std::string::npos)
            throw std::runtime_error(fmt::format("definition '{}': ';' and ',' cannot be passed in UKP_EVENTS", d));
        std::istringstream words(d);
        std::string w, def;
        while (words >> w) def += (def.empty() ? "" : ",") + w;
        if (def.empty()) continue;
        spec += (spec.empty() ? "" : ";") + def;
    }
    return spec;
}

std::pair<std::string, std::string> split_assignment(const std::string &s, const char *what) {
    const size_t eq = s.find('=');
    if (eq == std::string::npos || eq == 0)
        throw std::runtime_error(fmt::format("--{} '{}': give EVENT={}", what, s,
                                             std::string(what) == "filter" ? "EXPR" : "TRIGGER"));
    return {s.substr(0, eq), s.substr(eq + 1)};
}

int parent_of(int pid) {
    std::ifstream in(fmt::format("/proc/{}/stat", pid));
    std::string stat;
    std::getline(in, stat);
    const size_t paren = stat.rfind(')');
    if (paren == std::string::npos) return -1;
    int ppid = -1;
    char state = 0;
    if (sscanf(stat.c_str() + paren + 1, " %c %d", &state, &ppid) != 2) return -1;
    return ppid;
}

int tgid_of(int tid) {
    std::ifstream in(fmt::format("/proc/{}/status", tid));
    std::string line;
    while (std::getline(in, line))
        if (line.rfind("Tgid:", 0) == 0) return atoi(line.c_str() + 5);
    return -1;
}

// Whether `pid` descends from this process.
bool descends_from_us(int pid) {
    const int self = getpid();
    for (int i = 0; i < 256 && pid > 1; ++i) {
        pid = parent_of(pid);
        if (pid == self) return true;
    }
    return false;
}

// The seccomp filter of the child and its descendants. exit_group, execve(at), unlink(at)
// and the agents' notices (ring.hpp: an rt_sigprocmask that changes nothing) wait for
// ukprobe; every other call runs as usual, the program's own rt_sigprocmask included.
// An agent whose control thread listens gives notice before main, and waits while
// ukprobe connects and sets the filters and triggers.
int install_filter() {
    constexpr uint32_t kNotify = SECCOMP_RET_USER_NOTIF, kAllow = SECCOMP_RET_ALLOW;
    sock_filter code[] = {
        /* 0 */ BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, arch)),
        /* 1 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
        /* 2 */ BPF_STMT(BPF_RET | BPF_K, kAllow),
        /* 3 */ BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
        /* 4 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_exit_group, 7, 0),
        /* 5 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_execve, 6, 0),
        /* 6 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_execveat, 5, 0),
        /* 7 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_unlink, 4, 0),
        /* 8 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_unlinkat, 3, 0),
        /* 9 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_rt_sigprocmask, 0, 3),
        // The low word of args[4] (little-endian): an agent's notice, or the program's own call.
        /* 10 */ BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, args[4])),
        /* 11 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, static_cast<uint32_t>(ukp::trace::kNoticeMagic), 0, 1),
        /* 12 */ BPF_STMT(BPF_RET | BPF_K, kNotify),
        /* 13 */ BPF_STMT(BPF_RET | BPF_K, kAllow),
    };
    sock_fprog prog{static_cast<unsigned short>(sizeof code / sizeof code[0]), code};
    int fd = static_cast<int>(syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_NEW_LISTENER, &prog));
    if (fd < 0 && errno == EACCES) {
        // Without CAP_SYS_ADMIN a filter needs no_new_privs (set-uid programs then run
        // without their privileges).
        if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return -1;
        fd = static_cast<int>(syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_NEW_LISTENER, &prog));
    }
    return fd;
}

// A ping to the agent of `pid` sent, or -1: its socket may be bound and listening before
// its control thread exists, and a request would then wait forever on a process ukprobe
// holds. The answer comes on the descriptor returned (Runner::agent_answers).
int send_ping(int pid) {
    const std::string path = ukp::control::socket_path(static_cast<unsigned>(geteuid()), pid);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    if (path.size() >= sizeof addr.sun_path) return -1;
    memcpy(addr.sun_path, path.c_str(), path.size() + 1);
    const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    const ukp::control::RequestHeader h{ukp::control::kMagic, ukp::control::kVersion,
                                        static_cast<uint16_t>(Op::kPing), 0, 0};
    if (::connect(fd, reinterpret_cast<sockaddr *>(&addr), sizeof addr) != 0 ||
        send(fd, &h, sizeof h, MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof h)) {
        close(fd);
        return -1;
    }
    return fd;
}

// Whether an execve(2) the process waits in will fail for want of its file: a shell or
// execvp() tries every directory of PATH in turn, and ukprobe need not empty a ring for
// each miss. Reads the path from the process's memory (nothing else may change it: the
// caller waits in the call); anything unclear answers false, and the ring is emptied.
bool exec_file_missing(const seccomp_notif &req) {
    if (req.data.nr != __NR_execve) return false;
    const auto pid = static_cast<pid_t>(req.pid);
    std::string path;
    uint64_t at = req.data.args[0];
    constexpr uint64_t kPage = 4096;
    while (path.size() < PATH_MAX) {
        char chunk[kPage];
        const size_t n = kPage - at % kPage; // up to the end of the page: the next may be unmapped
        const iovec local{chunk, n};
        const iovec remote{reinterpret_cast<void *>(at), n};
        if (process_vm_readv(pid, &local, 1, &remote, 1, 0) != static_cast<ssize_t>(n)) return false;
        const void *nul = memchr(chunk, '\0', n);
        path.append(chunk, nul != nullptr ? static_cast<const char *>(nul) - chunk : n);
        if (nul != nullptr) break;
        at += n;
    }
    if (path.empty() || path.size() >= PATH_MAX) return false;
    // As the process sees it: its root for an absolute path, its working directory else.
    const std::string proc = "/proc/" + std::to_string(pid) + (path[0] == '/' ? "/root" : "/cwd/");
    struct stat st{};
    return stat((proc + path).c_str(), &st) != 0 && (errno == ENOENT || errno == ENOTDIR);
}

// An agent's notice (ring.hpp) of `kind`.
bool notice(const seccomp_notif &req, long kind) {
    return req.data.nr == __NR_rt_sigprocmask && req.data.args[1] == 0 && req.data.args[2] == 0 &&
           req.data.args[4] == static_cast<uint64_t>(ukp::trace::kNoticeMagic) &&
           req.data.args[5] == static_cast<uint64_t>(kind);
}

// The counts as each process image left them, apart from the trace (stderr, as a second
// file), in the order the processes were met: the program's first image always, any other
// only if it counted something (a shell loop of `sleep` runs a hundred images that hit
// nothing; a shell forks for every command, and most children exec before any hit). Then,
// when more than one process was printed, the sums by event name: kprobe_profile as the
// kernel keeps it, for all of them at once, and the events the trace counted LOST.
void print_profiles(std::vector<ProfileBlock> blocks, uint64_t lost) {
    std::stable_sort(blocks.begin(), blocks.end(), [](const auto &a, const auto &b) { return a.seq < b.seq; });
    struct Sum {
        std::string name;
        uint64_t hits = 0, misses = 0;
    };
    std::vector<Sum> sums;
    size_t printed = 0, silent = 0;
    for (const ProfileBlock &b : blocks) {
        if (b.text.empty()) continue; // never read
        std::vector<Sum> lines;
        std::istringstream in(b.text);
        for (Sum one; in >> one.name >> one.hits >> one.misses;) lines.push_back(one);
        const bool counted = std::any_of(lines.begin(), lines.end(), [](const Sum &x) { return x.hits + x.misses != 0; });
        if (!counted && &b != &blocks.front()) {
            ++silent;
            continue;
        }
        fmt::print(stderr, "# kprobe_profile: process {} ({}){}{}\n{}", b.pid, b.comm, b.forked ? ", forked" : "",
                   b.final ? "" : ", as last read before it ended", b.text);
        ++printed;
        for (const Sum &x : lines) {
            auto it = std::find_if(sums.begin(), sums.end(), [&](const Sum &y) { return y.name == x.name; });
            if (it == sums.end()) it = sums.insert(sums.end(), Sum{x.name});
            it->hits += x.hits;
            it->misses += x.misses;
        }
    }
    if (printed >= 2) {
        std::string total;
        for (const Sum &x : sums) total += ukp::trace::profile_line(x.name, x.hits, x.misses);
        fmt::print(stderr, "# kprobe_profile: all {} processes{}\n{}", printed,
                   silent != 0 ? fmt::format(" ({} more counted nothing)", silent) : "", total);
    }
    if (lost != 0) fmt::print(stderr, "# lost: {} events (the trace's LOST lines)\n", lost);
}

class Runner {
public:
    explicit Runner(const RunOptions &o) : o_(o) {}
    int run();

private:
    [[noreturn]] void child(int fd_sock, int err_pipe, const sigset_t &old_mask);
    void on_socket(int pid);
    bool new_agent_in(int pid);
    int events_source(int pid);
    bool take_forked(int pid);
    void drain_forked(int pid);
    void on_notification();
    void handle(const seccomp_notif &req);
    void let_go(uint64_t id);
    void answer(uint64_t id, long value);
    bool agent_answers(int pid);
    void on_signals();
    void kill_program(int sig);

    const RunOptions &o_;
    FILE *file_ = nullptr;
    std::unique_ptr<Output> out_;
    std::unique_ptr<RingWatch> watch_; // the streams' rings, looked at for them
    int child_ = -1;
    int child_status_ = -1; // wait status once the child is gone
    int notify_fd_ = -1, signal_fd_ = -1;
    std::deque<seccomp_notif> deferred_; // received while waiting for a ping's answer
    std::vector<std::weak_ptr<Hold>> holds_; // calls held for the streams, let go by kDrainTimeout
    std::vector<std::unique_ptr<Agent>> agents_; // every agent connected, in order
    std::map<int, Agent *> by_pid_;               // the latest agent of each process
    std::vector<std::unique_ptr<ForkedRing>> forked_; // rings of forked children, until they end
    std::map<int, ForkedRing *> forked_by_pid_;       // the latest of each process
    ukp::sym::Registry forked_symbols_; // the objects of the last forked child taken: its
                                        // siblings have the same ones at the same addresses
    std::vector<ProfileBlock> forked_profiles_; // of forked children whose stream ended
    uint64_t next_seq_ = 0;
    bool failed_ = false;                         // the program's definitions were refused
};

void Runner::child(int fd_sock, int err_pipe, const sigset_t &old_mask) {
    // The program dies with ukprobe: without its supervisor exit_group would fail (ENOSYS).
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    auto die = [&](int err) {
        const int e = err;
        (void)!write(err_pipe, &e, sizeof e);
        _exit(127);
    };
    const int nfd = install_filter();
    if (nfd < 0) die(errno);
    const char byte = 0;
    const iovec one{const_cast<char *>(&byte), 1};
    if (ukp::control::send_with_fd(fd_sock, &one, 1, nfd) != 1) die(errno);
    close(nfd);
    close(fd_sock);
    std::string preload = o_.agent;
    if (const char *old = getenv("LD_PRELOAD"); old != nullptr && *old != 0) preload += std::string(" ") + old;
    setenv("LD_PRELOAD", preload.c_str(), 1);
    setenv("UKP_EVENTS", startup_events(o_.definitions).c_str(), 1);
    setenv("UKP_CONTROL", "1", 1);
    if (o_.buffer_size_kb != 0) setenv("UKP_BUFFER_SIZE_KB", std::to_string(o_.buffer_size_kb).c_str(), 1);
    if (!o_.follow) setenv("UKP_NO_INHERIT", "1", 1);
    // The agents keep the reference tables of the objects they probe there (refs_cache.cpp):
    // each exec'd process after the first skips decoding libc again. One given is kept
    // (empty: none).
    if (const std::string dir = refs_cache_dir(); !dir.empty()) setenv("UKP_CACHE_DIR", dir.c_str(), 0);
    signal(SIGPIPE, SIG_DFL);
    sigprocmask(SIG_SETMASK, &old_mask, nullptr);
    std::vector<char *> argv;
    for (const std::string &a : o_.argv) argv.push_back(const_cast<char *>(a.c_str()));
    argv.push_back(nullptr);
    execvp(argv[0], argv.data());
    die(errno);
    _exit(127);
}

// A new socket: connect if it is the program's or a descendant's (when followed), set
// the filters and triggers, check that every definition was taken, stream.
void Runner::on_socket(int pid) {
    if (!new_agent_in(pid)) return;
    if (pid != child_ && (!o_.follow || !descends_from_us(pid))) return;
    auto agent = std::make_unique<Agent>(pid, next_seq_++, *out_, *watch_);
    if (agent->connect() != 0) return;
    try {
        agent->share_counts();
        const Reply defs = agent->ask(Op::kRead, "kprobe_events");
        const Reply log = agent->ask(Op::kRead, "error_log");
        if (log.status >= 0 && !log.payload.empty()) {
            std::string text = log.payload;
            while (!text.empty() && text.back() == '\n') text.pop_back();
            fmt::print(stderr, "ukprobe: process {} ({}) rejected a definition:\n{}\n", pid, agent->comm(), text);
            if (pid == child_) {
                failed_ = true;
                kill_program(SIGKILL);
                return;
            }
        }
        // A definition the agent refused without an error_log entry (one it could not
        // parse: "p:bad") would otherwise go unnoticed: the events defined are counted.
        size_t given = 0, defined = 0;
        for (const std::string &d : o_.definitions) given += d.find_first_not_of(" \t") != std::string::npos;
        std::istringstream lines(defs.payload);
        for (std::string line; std::getline(lines, line);) defined += !line.empty();
        if (defs.status >= 0 && (log.status < 0 || log.payload.empty()) && defined < given) {
            fmt::print(stderr, "ukprobe: process {} ({}) defined {} of the {} definitions given (kprobe_events):\n{}",
                       pid, agent->comm(), defined, given, defs.payload);
            if (pid == child_) {
                failed_ = true;
                kill_program(SIGKILL);
                return;
            }
        }
        auto apply = [&](const std::vector<std::string> &list, const char *what, const char *file, Op op) {
            for (const std::string &s : list) {
                const auto [event, text] = split_assignment(s, what);
                const std::string path = "events/" + event_path(event, defs.payload) + "/" + file;
                const Reply r = agent->ask(op, path, text);
                if (r.status >= 0) continue;
                fmt::print(stderr, "ukprobe: {}\n", refusal(r, op, path, pid));
                if (pid == child_) {
                    failed_ = true;
                    kill_program(SIGKILL);
                    return false;
                }
            }
            return true;
        };
        if (!apply(o_.filters, "filter", "filter", Op::kWrite)) return;
        if (!apply(o_.triggers, "trigger", "trigger", Op::kAppend)) return;
        agent->prepare();
    } catch (const std::runtime_error &) {
        return; // gone meanwhile
    }
    agent->start();
    if (o_.verbose) fmt::print(stderr, "ukprobe: process {} ({}) reached\n", pid, agent->comm());
    if (auto it = forked_by_pid_.find(pid); it != forked_by_pid_.end()) it->second->finish();
    by_pid_[pid] = agent.get();
    agents_.push_back(std::move(agent));
}

// Whether an agent listens in `pid` that ukprobe does not stream from yet (a new process,
// or a new image after an exec: its socket is another one under the same path, which the
// file system may give the inode number of the old one, freed by the new agent's unlink).
bool Runner::new_agent_in(int pid) {
    struct stat st{};
    if (stat(ukp::control::socket_path(static_cast<unsigned>(geteuid()), pid).c_str(), &st) != 0) return false;
    const auto it = by_pid_.find(pid);
    return it == by_pid_.end() || it->second->ended() || it->second->image_gone() ||
           it->second->socket_ino() != st.st_ino;
}

void Runner::on_notification() {
    seccomp_notif req;
    memset(&req, 0, sizeof req); // the kernel wants it zeroed
    if (ioctl(notify_fd_, SECCOMP_IOCTL_NOTIF_RECV, &req) != 0) return;
    handle(req);
    while (!deferred_.empty()) {
        req = deferred_.front();
        deferred_.pop_front();
        handle(req);
    }
}

// Whether the agent of `pid` answers a ping in time. Notifications that come meanwhile
// wait their turn in deferred_.
bool Runner::agent_answers(int pid) {
    const int fd = send_ping(pid);
    if (fd < 0) return false;
    bool ok = false;
    const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(kPingTimeoutMs);
    for (;;) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now());
        if (left.count() < 0) break;
        pollfd fds[2] = {{fd, POLLIN, 0}, {notify_fd_, POLLIN, 0}};
        if (poll(fds, 2, static_cast<int>(left.count())) <= 0) break;
        if (fds[0].revents != 0) {
            ukp::control::ReplyHeader rh{};
            ok = recv(fd, &rh, sizeof rh, MSG_WAITALL) == static_cast<ssize_t>(sizeof rh) &&
                 rh.magic == ukp::control::kMagic;
            break;
        }
        seccomp_notif req;
        memset(&req, 0, sizeof req);
        if (ioctl(notify_fd_, SECCOMP_IOCTL_NOTIF_RECV, &req) == 0) deferred_.push_back(req);
    }
    close(fd);
    if (o_.verbose && !ok) fmt::print(stderr, "ukprobe: process {} did not answer a ping in {} ms\n", pid, kPingTimeoutMs);
    return ok;
}

void Runner::handle(const seccomp_notif &req) {
    const int tgid = tgid_of(static_cast<int>(req.pid));
    const int nr = req.data.nr;
    if (tgid > 0) {
        if (notice(req, ukp::trace::kNoticeForkedRing)) {
            // A child of fork() with buffers of its own. Once ukprobe holds them (or
            // wants none), the child closes its descriptors for them.
            if (take_forked(tgid)) {
                answer(req.id, ukp::trace::kNoticeDone);
                return;
            }
        } else if (notice(req, ukp::trace::kNoticeControlReady)) {
            // An agent's control thread listens: connect while it waits, before main.
            if (new_agent_in(tgid) && agent_answers(tgid)) on_socket(tgid);
        } else if (nr == __NR_rt_sigprocmask) {
            // Matched by the filter by chance (a program's own call with that word in r8).
        } else if (nr == __NR_unlink || nr == __NR_unlinkat) {
            // An agent's destructor about to remove its socket: connect while it waits.
            if (new_agent_in(tgid) && agent_answers(tgid)) on_socket(tgid);
        } else if (!exec_file_missing(req)) {
            // exit_group, execve, execveat: the call goes on once the streams of the
            // image have emptied its rings (a child that exec'd into an agent has two).
            auto hold = std::make_shared<Hold>(notify_fd_, req.id);
            bool streamed = false;
            if (auto it = forked_by_pid_.find(tgid); it != forked_by_pid_.end() && it->second->streaming()) {
                it->second->drain(nr != __NR_exit_group, hold);
                streamed = true;
            }
            if (auto it = by_pid_.find(tgid); it != by_pid_.end() && !it->second->ended()) {
                it->second->drain(hold);
                streamed = true;
            }
            if (!streamed) drain_forked(tgid);
            holds_.push_back(hold);
            return;
        }
    }
    let_go(req.id);
}

// The waiting system call returns `value` without running.
void Runner::answer(uint64_t id, long value) {
    seccomp_notif_resp resp;
    memset(&resp, 0, sizeof resp);
    resp.id = id;
    resp.val = value;
    ioctl(notify_fd_, SECCOMP_IOCTL_NOTIF_SEND, &resp); // ENOENT: the caller was killed meanwhile
}

// The waiting system call goes on unchanged.
void Runner::let_go(uint64_t id) {
    seccomp_notif_resp resp;
    memset(&resp, 0, sizeof resp);
    resp.id = id;
    resp.flags = SECCOMP_USER_NOTIF_FLAG_CONTINUE;
    ioctl(notify_fd_, SECCOMP_IOCTL_NOTIF_SEND, &resp); // ENOENT: the caller was killed meanwhile
}

// The process whose agent has the event table of `pid`, a child of fork() that has not
// exec'd: the nearest ancestor ukprobe streams from (the image it was forked from), or
// that of a forked ancestor. 0 if none.
int Runner::events_source(int pid) {
    for (int p = parent_of(pid), i = 0; p > 1 && i < 256; p = parent_of(p), ++i) {
        if (auto it = by_pid_.find(p); it != by_pid_.end() && !it->second->ended() && !it->second->image_gone())
            return p;
        if (auto it = forked_by_pid_.find(p); it != forked_by_pid_.end() && it->second->streaming())
            return it->second->events_pid();
    }
    return 0;
}

// A child of fork() gave notice of its own ring (it waits meanwhile): streamed from now on.
bool Runner::take_forked(int pid) {
    if (!o_.follow) return true;
    if (auto it = forked_by_pid_.find(pid); it != forked_by_pid_.end() && !it->second->gone()) return false;
    const int source = events_source(pid);
    if (source <= 0) return true; // no event table to print it with, now or at its exit
    auto ring = std::make_unique<ForkedRing>(pid, source, next_seq_++, *out_, *watch_);
    if (!ring->open(forked_symbols_)) return false; // drain_forked tries again at its exit
    forked_symbols_ = ring->symbols();
    ring->start();
    forked_by_pid_[pid] = ring.get();
    forked_.push_back(std::move(ring));
    return true;
}

// A child of fork() whose ring ukprobe did not take at its notice waits in exit_group or
// execve: its ring is taken now and printed with the event table of its ancestor.
void Runner::drain_forked(int pid) {
    if (!o_.follow) return;
    const int source = events_source(pid);
    if (source <= 0) return;
    const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
    if (pidfd < 0) return;
    const int ring = ring_of(pid, pidfd);
    SharedCounts counts;
    if (ring >= 0) counts.map(counters_of(pid, pidfd));
    close(pidfd);
    if (ring < 0) return;
    Client events;
    std::string why;
    if (events.connect(source, &why) != 0) {
        close(ring);
        return;
    }
    // This thread answers the seccomp notifications: should the ancestor's control thread
    // wait in one now, its answer never comes. Bounded, its lines are lost instead.
    events.set_timeout_ms(kForkedTableTimeoutMs);
    try {
        TraceReader reader(events, pid, ring);
        if (out_->capture()) reader.capture();
        drain_ring(reader, *out_, 0);
        std::string why;
        forked_profiles_.push_back(ProfileBlock{next_seq_++, pid, comm_of(pid),
                                                counts.read(&why), true, true});
    } catch (const std::runtime_error &) {
        // The ancestor is gone meanwhile: its event table with it.
    }
}

void Runner::kill_program(int sig) {
    if (child_ > 0 && child_status_ < 0) kill(child_, sig);
}

void Runner::on_signals() {
    signalfd_siginfo si;
    while (read(signal_fd_, &si, sizeof si) == static_cast<ssize_t>(sizeof si)) {
        if (si.ssi_signo == SIGCHLD) continue; // reaped below
        // From the terminal the signal went to the whole foreground group, the program
        // too; sent to ukprobe alone, it is passed on, as a shell does for its job.
        if (si.ssi_code != SI_KERNEL) kill_program(static_cast<int>(si.ssi_signo));
    }
}

// Why the agent cannot be preloaded into `prog` (as execvp would find it), or "": the
// dynamic loader is what reads LD_PRELOAD, so a static program runs without the agent,
// and a set-user-ID or set-group-ID program that changes the caller's credentials runs
// in secure mode, where the loader ignores it.
std::string untraceable(const std::string &prog) {
    std::string path = prog;
    if (prog.find('/') == std::string::npos) {
        path.clear();
        const char *env = getenv("PATH");
        std::istringstream dirs(env != nullptr ? env : "/usr/local/bin:/usr/bin:/bin");
        for (std::string dir; std::getline(dirs, dir, ':');) {
            const std::string candidate = (dir.empty() ? "." : dir) + "/" + prog;
            if (access(candidate.c_str(), X_OK) == 0) {
                path = candidate;
                break;
            }
        }
        if (path.empty()) return ""; // execvp says why
    }
    struct stat st{};
    if (stat(path.c_str(), &st) != 0) return "";
    if (((st.st_mode & S_ISUID) != 0 && st.st_uid != geteuid()) || ((st.st_mode & S_ISGID) != 0 && st.st_gid != getegid()))
        return "set-user-ID or set-group-ID: the dynamic loader ignores LD_PRELOAD there, so the agent is not loaded";
    platform::ElfFile elf;
    if (elf.open(path) && !elf.has_interpreter())
        return "statically linked: no dynamic loader reads LD_PRELOAD, so the agent is not loaded";
    return "";
}

int Runner::run() {
    if (o_.argv.empty()) throw std::runtime_error("run: which program? give -- PROG ARGS...");
    startup_events(o_.definitions); // refuses what UKP_EVENTS cannot carry
    for (const std::string &f : o_.filters) split_assignment(f, "filter");
    for (const std::string &t : o_.triggers) split_assignment(t, "trigger");
    if (const std::string why = untraceable(o_.argv[0]); !why.empty())
        fmt::print(stderr, "ukprobe: {} is {}; it runs untraced (the programs it starts are traced)\n", o_.argv[0], why);
    if (!o_.output.empty()) {
        file_ = fopen(o_.output.c_str(), "we");
        if (file_ == nullptr) throw std::runtime_error(fmt::format("cannot write {}: {}", o_.output, strerror(errno)));
    }
    out_ = std::make_unique<Output>(file_ != nullptr ? file_ : stdout, o_.capture);
    watch_ = std::make_unique<RingWatch>();

    // Signals arrive through a descriptor; agent threads start with them blocked.
    sigset_t mask, old_mask;
    sigemptyset(&mask);
    for (int s : {SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGQUIT}) sigaddset(&mask, s);
    sigprocmask(SIG_BLOCK, &mask, &old_mask);
    signal_fd_ = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
    signal(SIGPIPE, SIG_IGN);
    // Orphaned descendants come to ukprobe: they stay in its tree and are waited for.
    prctl(PR_SET_CHILD_SUBREAPER, 1);

    int sv[2], errp[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0 || pipe2(errp, O_CLOEXEC) != 0)
        throw std::runtime_error(fmt::format("run: {}", strerror(errno)));
    fflush(nullptr);
    child_ = fork();
    if (child_ < 0) throw std::runtime_error(fmt::format("fork: {}", strerror(errno)));
    if (child_ == 0) {
        close(sv[0]);
        close(errp[0]);
        child(sv[1], errp[1], old_mask);
    }
    close(sv[1]);
    close(errp[1]);
    char byte = 0;
    if (ukp::control::recv_with_fd(sv[0], &byte, 1, &notify_fd_) != 1) notify_fd_ = -1;
    close(sv[0]);
    int err_fd = errp[0];
    std::string exec_error;

    for (;;) {
        pollfd fds[3] = {{notify_fd_, POLLIN, 0}, {signal_fd_, POLLIN, 0}, {err_fd, POLLIN, 0}};
        const int n = poll(fds, err_fd >= 0 ? 3 : 2, 100);
        if (n < 0 && errno != EINTR) break;
        if (fds[0].revents & POLLIN) on_notification();
        if (err_fd >= 0 && (fds[2].revents & (POLLIN | POLLHUP))) {
            int e = 0;
            if (read(err_fd, &e, sizeof e) == static_cast<ssize_t>(sizeof e))
                exec_error = fmt::format("cannot run {}: {}", o_.argv[0], strerror(e));
            close(err_fd);
            err_fd = -1;
        }
        if (fds[1].revents & POLLIN) on_signals();
        // Reap: the program, and descendants left to ukprobe.
        int status = 0, pid;
        while ((pid = waitpid(-1, &status, WNOHANG | __WALL)) > 0)
            if (pid == child_) child_status_ = status;
        const bool none_left = pid < 0 && errno == ECHILD;
        // Streams of forked children that ended go (a program may fork many).
        std::erase_if(forked_, [&](const std::unique_ptr<ForkedRing> &f) {
            if (!f->ended()) return false;
            if (auto it = forked_by_pid_.find(f->pid()); it != forked_by_pid_.end() && it->second == f.get())
                forked_by_pid_.erase(it);
            forked_profiles_.push_back(f->profile());
            return true;
        });
        const Clock::time_point now = Clock::now();
        std::erase_if(holds_, [now](const std::weak_ptr<Hold> &w) {
            const HoldPtr h = w.lock();
            return h == nullptr || h->expire(now);
        });
        if (child_status_ >= 0 && none_left) break;
    }
    // Every process is gone: the streams end by themselves.
    for (auto &a : agents_) a->join();
    for (auto &f : forked_) {
        f->join();
        forked_profiles_.push_back(f->profile());
    }
    forked_.clear();
    out_->finish();
    if (file_ != nullptr) fclose(file_);
    std::vector<ProfileBlock> blocks = std::move(forked_profiles_);
    for (auto &a : agents_) blocks.push_back(a->profile());
    print_profiles(std::move(blocks), out_->lost());
    if (!exec_error.empty()) {
        fmt::print(stderr, "ukprobe: {}\n", exec_error);
        return 127; // as a shell
    }
    if (failed_) return 1;
    return WIFEXITED(child_status_) ? WEXITSTATUS(child_status_) : 128 + WTERMSIG(child_status_);
}

} // namespace

int run_program(const RunOptions &o) {
    Runner r(o);
    return r.run();
}

} // namespace ukprobe
