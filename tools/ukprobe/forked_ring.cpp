#include "forked_ring.hpp"

#include "proc.hpp"
#include "ring_reads.hpp"
#include "platform/maps.hpp"

#include <poll.h>
#include <stdexcept>
#include <string_view>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace ukprobe {
namespace platform = ukp::platform;

namespace {

using Clock = std::chrono::steady_clock;

// How long a forked child's ring waits for its ancestor's event table (ForkedRing::open,
// drain_forked_ring).
constexpr int kForkedTableTimeoutMs = 1000;
// How often, at most, the counts of a child of fork() are read while it runs, when its
// stream wakes: they are copied out of it (a few microseconds, no request to its agent).
constexpr auto kForkedProfileInterval = std::chrono::milliseconds(50);

// Where a forked child's ring gets its event table: from the agent of `events_pid`
// (`events` connected to it), or, that agent gone, from `table_from`, the reader whose
// table it was (*borrow then names it, else null). False if from neither. The requests
// run on the thread that answers the seccomp notifications: should that agent's control
// thread wait in one now, its answer would never come. Bounded: the lines are lost then.
bool table_source(Client &events, int events_pid, const TraceReader *table_from, const TraceReader **borrow) {
    std::string why;
    *borrow = nullptr;
    if (events.connect(events_pid, &why) != 0) {
        if (table_from == nullptr || !table_from->has_events()) return false;
        *borrow = table_from;
    }
    events.set_timeout_ms(kForkedTableTimeoutMs);
    return true;
}

} // namespace

ForkedRing::ForkedRing(int pid, int events_pid, uint64_t seq, Output &out, RingWatch &watch)
    : RingStream(watch), pid_(pid), events_pid_(events_pid), seq_(seq), comm_(comm_of(pid)), out_(out) {}

ForkedRing::~ForkedRing() {
    if (thread_.joinable()) thread_.join();
    reader_.reset();
    if (pidfd_ >= 0) close(pidfd_);
}

ProfileBlock ForkedRing::profile() {
    std::lock_guard lock(mu_);
    return ProfileBlock{seq_, pid_, comm_, profile_, drain_done_ > 0 || final_, true};
}

void ForkedRing::join() {
    if (thread_.joinable()) thread_.join();
}

bool ForkedRing::open(const ukp::sym::Registry &known, const TraceReader *table_from) {
    pidfd_ = static_cast<int>(syscall(SYS_pidfd_open, pid_, 0));
    if (pidfd_ < 0) return false;
    const int ring = ring_of(pid_, pidfd_);
    if (ring < 0) return false;
    struct stat st {};
    if (fstat(ring, &st) == 0) ring_ino_ = st.st_ino;
    counts_.map(counters_of(pid_, pidfd_));
    const TraceReader *borrow = nullptr;
    if (!table_source(events_, events_pid_, table_from, &borrow)) {
        close(ring);
        return false;
    }
    reader_ = std::make_unique<TraceReader>(events_, pid_, ring, &known);
    if (borrow != nullptr) reader_->borrow_events(*borrow);
    if (out_.capture()) reader_->capture();
    try {
        reader_->entries(); // maps the ring, reads the event table and the process's objects
    } catch (const std::runtime_error &) {
        // The agent is gone, or did not answer in time.
    }
    return reader_->formats_locally();
}

void ForkedRing::start() {
    watch(*reader_);
    thread_ = std::thread([this] { loop(); });
}

bool ForkedRing::gone() const {
    pollfd p{pidfd_, POLLIN, 0};
    return poll(&p, 1, 0) == 1;
}

void ForkedRing::drain(bool exec, HoldPtr hold) {
    std::lock_guard lock(mu_);
    if (ended_ || finish_) return;
    exec_asked_ = exec_asked_ || exec;
    holds_.push_back(std::move(hold));
    ++drain_asked_;
    cv_.notify_all();
}

void ForkedRing::finish() {
    std::lock_guard lock(mu_);
    finish_ = true;
    cv_.notify_all();
}

bool ForkedRing::streaming() {
    std::lock_guard lock(mu_);
    return !ended_ && !finish_;
}

bool ForkedRing::ended() {
    std::lock_guard lock(mu_);
    return ended_;
}

void ForkedRing::read_profile(bool gone) {
    std::string why;
    std::string text = counts_.read(&why);
    profile_read_ = Clock::now();
    if (text.empty()) return;
    std::lock_guard lock(mu_);
    profile_ = std::move(text);
    final_ = final_ || gone;
}

bool ForkedRing::holds_ring() const {
    bool held = false;
    platform::for_each_mapping(pid_, [&](const platform::Mapping &m) {
        held = m.inode == ring_ino_ && m.path.find("/memfd:ukprobes-trace") != std::string_view::npos;
        return !held;
    });
    return held;
}

void ForkedRing::loop() {
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
            read_into(*reader_, out_, [&] { return read_some(*reader_, &again); });
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

std::optional<ProfileBlock> drain_forked_ring(int pid, int events_pid, Output &out, const TraceReader *table_from) {
    const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
    if (pidfd < 0) return std::nullopt;
    const int ring = ring_of(pid, pidfd);
    SharedCounts counts;
    if (ring >= 0) counts.map(counters_of(pid, pidfd));
    close(pidfd);
    if (ring < 0) return std::nullopt;
    Client events;
    const TraceReader *borrow = nullptr;
    if (!table_source(events, events_pid, table_from, &borrow)) {
        close(ring);
        return std::nullopt;
    }
    try {
        TraceReader reader(events, pid, ring);
        if (borrow != nullptr) reader.borrow_events(*borrow);
        if (out.capture()) reader.capture();
        drain_ring(reader, out, 0);
        std::string why;
        return ProfileBlock{0, pid, comm_of(pid), counts.read(&why), true, true};
    } catch (const std::runtime_error &) {
        // The ancestor is gone meanwhile: its event table with it.
    }
    return std::nullopt;
}

} // namespace ukprobe
