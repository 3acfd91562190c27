// How `ukprobe run` and `record` learn that a ring has something to read. A traced
// thread writes its records without a system call (the hit path makes none), so nothing
// can wake a reader: the rings are polled. One thread, the watch, looks at every ring the
// streams map and wakes a stream only when its ring is worth a read; a stream's own
// thread sleeps otherwise. On the VMs this runs on, a thread's wakeup costs more than
// reading the records it finds: streams that each looked every 5 ms took an eighth of a
// core beside a busy server, most of it in the scheduler.
//
// A look wakes a stream when the fullest of its ring's buffers holds a sixteenth of a
// buffer or a read's worth (1 MiB), whichever is less, when records have waited
// kReadLatency since its last read (a slow writer is read a few times a second, well
// within run's merge delay), or when its process is gone. A read that took all of its
// 1 MiB or left that much is followed by another at once. The watch's own pace follows
// the writers: it looks again in the time the fastest ring (its rate measured from look
// to look) takes to gather twice what wakes its stream, between kWatchMin and kWatchMax.
// A burst after a quiet spell is seen within kWatchMax; one that fills a buffer faster
// than that (with the default 1408 KiB a thread, about 1,500,000 records a second) loses
// its first records to the buffer's wrap, counted.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "reader.hpp"

namespace ukprobe {

class RingStream;

class RingWatch {
public:
    RingWatch();
    ~RingWatch();
    RingWatch(const RingWatch &) = delete;
    RingWatch &operator=(const RingWatch &) = delete;

    void add(RingStream *s);
    // After it returns the watch never touches `s` again.
    void remove(RingStream *s);

private:
    void loop();

    std::mutex mu_; // held through a round of looks
    std::condition_variable cv_;
    std::vector<RingStream *> streams_; // under mu_
    bool stop_ = false;                 // under mu_
    std::thread thread_;                // last: starts once the rest is made
};

// A stream's side of the watch: the lock and condition its thread waits on, and its ring
// as the watch looks at it.
class RingStream {
public:
    // The watch's look (on its thread): wakes the stream if its ring is worth a read.
    // Returns how soon this ring wants the next look.
    std::chrono::microseconds look(std::chrono::steady_clock::time_point now);

protected:
    explicit RingStream(RingWatch &watch) : watch_(watch) {}
    ~RingStream() = default;
    RingStream(const RingStream &) = delete;
    RingStream &operator=(const RingStream &) = delete;

    // Whether the process the ring is from is gone (or exec'd): its stream has a last read
    // to make. Called by the watch, so cheap and safe beside the stream's thread.
    virtual bool source_gone() const = 0;

    // The watch looks at `reader` from now on (before the stream's thread starts).
    void watch(TraceReader &reader);
    // ... and no more: before the reader is unmapped or destroyed.
    void unwatch();
    // Runs fn() as a read: the watch does not look at the ring meanwhile (a read may map
    // it again). For the stream's reads other than read_some's.
    template <typename Fn>
    void while_reading(Fn fn) {
        std::lock_guard reading(reading_);
        fn();
    }
    // One read of what the ring holds (TraceReader::pipe, without waiting, 1 MiB at
    // most); *again: read again at once (the read was a full one, or a buffer still holds
    // what a look would wake the stream for).
    std::string read_some(TraceReader &reader, bool *again);
    // Waits, mu_ held by `lock`, for a look that found the ring worth reading, for `stop`
    // (checked under mu_; a drain asked), or kStreamWaitMax at the longest.
    template <typename Stop>
    void wait_for_look(std::unique_lock<std::mutex> &lock, Stop stop) {
        cv_.wait_for(lock, kStreamWaitMax, [&] { return due_ || stop(); });
        due_ = false;
    }

    // Its thread waits on cv_ under mu_; whoever asks it something notifies cv_.
    std::mutex mu_;
    std::condition_variable cv_;

    // The longest a stream sleeps without a look calling it (a process's counters are
    // read that often; its end is seen by the watch).
    static constexpr auto kStreamWaitMax = std::chrono::seconds(1);

private:
    RingWatch &watch_;
    std::mutex reading_;             // held around a read of the ring (which may map it again)
    TraceReader *watched_ = nullptr; // under reading_
    bool due_ = false;               // under mu_: a look found the ring worth reading
    std::atomic<std::chrono::steady_clock::rep> last_read_{0};
    // The watch's: what the ring had ever been written at its last look, and when.
    uint64_t written_ = 0;
    std::chrono::steady_clock::time_point looked_{};
};

} // namespace ukprobe
