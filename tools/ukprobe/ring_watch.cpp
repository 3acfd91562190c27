#include "ring_watch.hpp"

#include <pthread.h>
#include <signal.h>

#include <algorithm>

namespace ukprobe {

namespace {

using Clock = std::chrono::steady_clock;

// The watch's pace (ring_watch.hpp). At kWatchMax a thread fills a sixteenth of the
// default 1408 KiB buffer at about 90,000 records a second, its whole buffer at about
// 1,500,000.
constexpr auto kWatchMin = std::chrono::milliseconds(2);
constexpr auto kWatchMax = std::chrono::milliseconds(20);
// The longest records wait in a ring a look saw them in: well under run's merge delay
// (200 ms), so a line read that late is still merged in its place.
constexpr auto kReadLatency = std::chrono::milliseconds(50);
// What a read takes at most (bytes of text or of capture blocks).
constexpr size_t kReadBlock = 1 << 20;

// What the fullest buffer must hold for a look to wake its stream, and what is left after
// a read for another to follow at once: a sixteenth of a buffer, or a read's worth where
// that is less (a 256 MiB buffer of `record` would otherwise wait for 16 MiB, while a
// burst runs, and leave them to the end).
double wake_bytes(const ukp::trace::RingLevel &level) {
    return std::min(static_cast<double>(level.buffer_bytes) / 16, static_cast<double>(kReadBlock));
}

bool worth_a_read(const ukp::trace::RingLevel &level) {
    return level.buffer_bytes > 0 && level.fill * static_cast<double>(level.buffer_bytes) >= wake_bytes(level);
}

} // namespace

RingWatch::RingWatch() : thread_([this] { loop(); }) {}

RingWatch::~RingWatch() {
    {
        std::lock_guard lock(mu_);
        stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
}

void RingWatch::add(RingStream *s) {
    std::lock_guard lock(mu_);
    streams_.push_back(s);
}

void RingWatch::remove(RingStream *s) {
    std::lock_guard lock(mu_);
    std::erase(streams_, s);
}

void RingWatch::loop() {
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, nullptr); // signals are ukprobe's main thread's (signalfd)
    std::unique_lock lock(mu_);
    std::chrono::microseconds wait = kWatchMax;
    while (!stop_) {
        cv_.wait_for(lock, wait, [&] { return stop_; });
        const Clock::time_point now = Clock::now();
        wait = kWatchMax;
        for (RingStream *s : streams_) wait = std::min(wait, s->look(now));
    }
}

std::chrono::microseconds RingStream::look(Clock::time_point now) {
    std::chrono::microseconds next = kWatchMax;
    bool wake = source_gone();
    if (!wake) {
        // A stream reading now (or mapping its ring again) is awake: it is looked at soon.
        std::unique_lock reading(reading_, std::try_to_lock);
        if (!reading.owns_lock()) return kWatchMin;
        if (watched_ == nullptr || !watched_->formats_locally()) return kWatchMax;
        const ukp::trace::RingLevel level = watched_->level();
        // The rate since the last look: the next comes before the ring has twice what wakes
        // its stream.
        if (looked_ != Clock::time_point{} && level.written > written_) {
            const double per_us =
                static_cast<double>(level.written - written_) /
                static_cast<double>(std::chrono::duration_cast<std::chrono::microseconds>(now - looked_).count() + 1);
            const double twice_us = 2 * wake_bytes(level) / per_us;
            next = std::clamp(std::chrono::microseconds(static_cast<int64_t>(twice_us)),
                              std::chrono::microseconds(kWatchMin), std::chrono::microseconds(kWatchMax));
        }
        written_ = level.written;
        looked_ = now;
        const auto since = now - Clock::time_point(Clock::duration(last_read_.load(std::memory_order_relaxed)));
        wake = worth_a_read(level) || (since >= kReadLatency && watched_->holds_records());
    }
    if (!wake) return next;
    {
        std::lock_guard lock(mu_);
        due_ = true;
    }
    cv_.notify_all();
    return next;
}

void RingStream::watch(TraceReader &reader) {
    {
        std::lock_guard reading(reading_);
        watched_ = &reader;
    }
    watch_.add(this);
}

void RingStream::unwatch() {
    watch_.remove(this);
    std::lock_guard reading(reading_);
    watched_ = nullptr;
}

std::string RingStream::read_some(TraceReader &reader, bool *again) {
    std::lock_guard reading(reading_);
    last_read_.store(Clock::now().time_since_epoch().count(), std::memory_order_relaxed);
    std::string text = reader.pipe(0, kReadBlock);
    // A read takes 1 MiB at most: a backlog is read 1 MiB after another, down to less
    // than a look would wake the stream for.
    *again = text.size() >= kReadBlock / 2 || worth_a_read(reader.level());
    return text;
}

} // namespace ukprobe
