#include "output.hpp"

#include "trace/capture.hpp"

#include <algorithm>
#include <csignal>
#include <functional>
#include <queue>
#include <tuple>

namespace ukprobe {

namespace {

using Clock = std::chrono::steady_clock;

// How long a line waits before it is written, so that lines of other processes read a
// little later can still be put before it by timestamp.
constexpr auto kMergeDelay = std::chrono::milliseconds(200);
// How often the output is written, and in blocks of how many bytes.
constexpr auto kWriteInterval = std::chrono::milliseconds(50);
constexpr size_t kWriteBlock = 1 << 20;
constexpr size_t kSpareBuffers = 24; // read buffers kept for reuse: what 200 ms of a busy trace holds

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
        while (i < line.size() && line[i] >= '0' && line[i] <= '9')
            sec = sec * 10 + uint64_t(line[i++] - '0'), ++digits;
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
    for (size_t i = at + 6; i < line.size() && line[i] >= '0' && line[i] <= '9'; ++i)
        n = n * 10 + uint64_t(line[i] - '0');
    return n;
}

} // namespace

void Output::add(std::string text) {
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

std::string Output::spare() {
    std::lock_guard lock(mu_);
    if (spare_.empty()) return {};
    std::string s = std::move(spare_.back());
    spare_.pop_back();
    return s;
}

uint64_t Output::lost() {
    std::lock_guard lock(mu_);
    return lost_;
}

void Output::finish() {
    {
        std::lock_guard lock(mu_);
        if (stop_) return;
        stop_ = true;
    }
    cv_.notify_all();
    writer_.join();
    if (f_ != nullptr) fflush(f_);
}

void Output::merge(std::vector<RunPtr> &runs, uint64_t cutoff, std::vector<std::string_view> &pieces,
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

void Output::write_loop() {
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, nullptr); // signals are ukprobe's main thread's (signalfd)
    std::vector<RunPtr> ready, done;           // runs old enough (and what is left of them); runs written
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

void Output::recycle(std::vector<RunPtr> &runs) {
    for (RunPtr &r : runs)
        if (spare_.size() < kSpareBuffers && r->text.capacity() >= kWriteBlock / 2)
            spare_.push_back(std::move(r->text));
    runs.clear();
}

void Output::write_block(std::string &block) {
    if (!block.empty() && f_ != nullptr && fwrite(block.data(), 1, block.size(), f_) != block.size()) f_ = nullptr;
    block.clear();
}

} // namespace ukprobe
