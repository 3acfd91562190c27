// The trace ring buffer: exact counts under concurrent writers, overwrite and loss
// accounting, records never torn under concurrent readers, a reader in another process.
#include <gtest/gtest.h>

#include <pthread.h>
#include <signal.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <map>
#include <thread>
#include <vector>

#include "control/fd_passing.hpp"
#include "ring_records.hpp"
#include "trace/ring.hpp"

namespace ukp::trace {
namespace {

int32_t gettid_() { return static_cast<int32_t>(syscall(SYS_gettid)); }

using test::payload_size;
using test::write_record;

bool check_record(const std::vector<uint8_t> &rec, uint32_t *writer, uint32_t *seq) {
    return test::check_record(rec.data(), rec.size(), writer, seq);
}

std::vector<RingEntry> collect(RingCounts *c) {
    std::vector<RingEntry> out;
    with_ring_views([&](const RingView &main, const RingView &) { out = ring_collect(main, c); });
    return out;
}

bool consume(RingEntry *e) {
    bool got = false;
    with_ring_views([&](const RingView &main, const RingView &) { got = ring_consume(main, e); });
    return got;
}

using RingTest = test::FreshRing;

TEST_F(RingTest, RecordsComeBackInOrderWithTheirHeader) {
    const uint64_t before = [] {
        timespec t;
        clock_gettime(CLOCK_MONOTONIC, &t);
        return t.tv_sec * 1000000000ull + t.tv_nsec;
    }();
    for (uint32_t i = 0; i < 100; ++i) ASSERT_TRUE(write_record(0, i));
    const uint64_t after = [] {
        timespec t;
        clock_gettime(CLOCK_MONOTONIC, &t);
        return t.tv_sec * 1000000000ull + t.tv_nsec;
    }();
    RingCounts c;
    auto entries = collect(&c);
    ASSERT_EQ(entries.size(), 100u);
    EXPECT_EQ(c.entries, 100u);
    EXPECT_EQ(c.written, 100u);
    EXPECT_EQ(c.overrun, 0u);
    EXPECT_EQ(c.lost, 0u);
    const int ncpu = static_cast<int>(sysconf(_SC_NPROCESSORS_CONF));
    for (uint32_t i = 0; i < 100; ++i) {
        uint32_t w = 0, seq = 0;
        ASSERT_TRUE(check_record(entries[i].rec, &w, &seq)) << i;
        EXPECT_EQ(seq, i);
        // TSC timestamps are converted by interpolation: allow a few microseconds.
        EXPECT_GE(entries[i].ts + 5000, before);
        EXPECT_LE(entries[i].ts, after + 5000);
        if (i > 0) {
            EXPECT_GE(entries[i].ts, entries[i - 1].ts);
        }
        EXPECT_LT(static_cast<int>(entries[i].cpu), ncpu);
        EXPECT_EQ(entries[i].lost_before, 0u);
    }
}

TEST_F(RingTest, DiscardedAndShortenedRecords) {
    uint8_t *a = ring_reserve(100);
    ASSERT_NE(a, nullptr);
    ring_commit(a, 0); // a filter said no
    ASSERT_TRUE(write_record(0, 5));
    uint8_t *b = ring_reserve(1000);
    ASSERT_NE(b, nullptr);
    CommonHeader c{7, 0, 0, gettid_()};
    std::memcpy(b, &c, 8);
    uint32_t w = 0, seq = 6;
    std::memcpy(b + 8, &w, 4);
    std::memcpy(b + 12, &seq, 4);
    for (uint32_t k = 16; k < payload_size(6); ++k) b[k] = static_cast<uint8_t>(seq * 31 + k);
    ring_commit(b, payload_size(6)); // used < reserved
    RingCounts counts;
    auto e = collect(&counts);
    ASSERT_EQ(e.size(), 2u);
    uint32_t ww, s;
    EXPECT_TRUE(check_record(e[0].rec, &ww, &s));
    EXPECT_EQ(s, 5u);
    EXPECT_TRUE(check_record(e[1].rec, &ww, &s));
    EXPECT_EQ(s, 6u);
    EXPECT_EQ(counts.written, 2u);
}

TEST_F(RingTest, TooLargeRecordIsRefusedAndCounted) {
    EXPECT_EQ(ring_reserve(kMaxRecordSize + 1), nullptr);
    ASSERT_TRUE(write_record(0, 1));
    RingCounts c;
    auto e = collect(&c);
    ASSERT_EQ(e.size(), 1u);
    EXPECT_EQ(c.lost, 1u);
    EXPECT_EQ(c.written, 2u);
    EXPECT_EQ(e[0].lost_before, 1u); // shown before the next record of that thread
}

TEST_F(RingTest, LargestRecordsWrapTheBufferIntact) {
    ASSERT_EQ(set_buffer_size_kb(8), 0); // room for one record of kMaxRecordSize at a time
    for (uint32_t i = 0; i < 100; ++i) {
        uint8_t *rec = ring_reserve(kMaxRecordSize);
        ASSERT_NE(rec, nullptr) << i;
        CommonHeader c{9, 0, 0, gettid_()};
        std::memcpy(rec, &c, sizeof c);
        std::memset(rec + kCommonSize, static_cast<int>(i), kMaxRecordSize - kCommonSize);
        ring_commit(rec, kMaxRecordSize);
    }
    RingCounts c;
    auto e = collect(&c);
    ASSERT_EQ(e.size(), 1u);
    EXPECT_EQ(c.overrun, 99u);
    ASSERT_EQ(e[0].rec.size(), kMaxRecordSize);
    for (uint32_t k = kCommonSize; k < kMaxRecordSize; ++k) ASSERT_EQ(e[0].rec[k], 99) << k;
}

TEST_F(RingTest, TimestampsAreMonotonicClockNanoseconds) {
    auto mono = [] {
        timespec t;
        clock_gettime(CLOCK_MONOTONIC, &t);
        return t.tv_sec * 1000000000ull + t.tv_nsec;
    };
    const uint64_t m0 = mono();
    ASSERT_TRUE(write_record(0, 0));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ASSERT_TRUE(write_record(0, 1));
    const uint64_t m1 = mono();
    auto e = collect(nullptr);
    ASSERT_EQ(e.size(), 2u);
    EXPECT_GE(e[0].ts + 5000, m0);
    EXPECT_LE(e[1].ts, m1 + 5000);
    const int64_t gap = static_cast<int64_t>(e[1].ts - e[0].ts);
    EXPECT_GE(gap, 100000000 - 5000);
    EXPECT_LE(gap, static_cast<int64_t>(m1 - m0) + 5000);
}

// A record shows the same time at every read, however far apart the reads (the TSC
// conversion is a table that only grows, never a rate re-measured per read), and that
// time is the CLOCK_MONOTONIC of its writing, while the writes themselves extend the
// table over a few hundred milliseconds.
TEST_F(RingTest, TimestampsReadTheSameEveryTimeAndFollowTheClock) {
    auto mono = [] {
        timespec t;
        clock_gettime(CLOCK_MONOTONIC, &t);
        return t.tv_sec * 1000000000ull + t.tv_nsec;
    };
    ASSERT_EQ(set_buffer_size_kb(64), 0); // a fresh region: its table starts now
    std::vector<std::pair<uint64_t, uint64_t>> windows;
    const uint64_t start = mono();
    for (uint32_t i = 0; mono() - start < 300'000'000ull; ++i) {
        const uint64_t before = mono();
        ASSERT_TRUE(write_record(0, i));
        windows.emplace_back(before, mono());
        std::this_thread::sleep_for(std::chrono::microseconds(2000 + 97 * (i % 13)));
    }
    std::vector<uint64_t> first;
    for (int read = 0; read < 40; ++read) {
        const auto e = collect(nullptr);
        ASSERT_EQ(e.size(), windows.size());
        std::vector<uint64_t> ts;
        for (const RingEntry &r : e) ts.push_back(r.ts);
        if (read == 0) {
            first = ts;
        } else {
            ASSERT_EQ(ts, first) << "read " << read;
        }
        std::this_thread::sleep_for(std::chrono::microseconds(700));
    }
    for (size_t i = 0; i < first.size(); ++i) {
        EXPECT_GE(first[i] + 5000, windows[i].first) << i;
        EXPECT_LE(first[i], windows[i].second + 5000) << i;
        if (i > 0) {
            EXPECT_GT(first[i], first[i - 1]) << i;
        }
    }
    uint32_t segments = 0;
    with_ring_views([&](const RingView &main, const RingView &) {
        if (main.header()->clock == kClockTsc) segments = main.header()->clock_count.load();
    });
    if (segments != 0) {
        EXPECT_GE(segments, 7u); // 10 ms, then doubling spacings: 3 extensions
    }
}

TEST_F(RingTest, TracingOffRecordsNothingAndCountsNothing) {
    set_tracing_on(false);
    EXPECT_FALSE(tracing_on());
    EXPECT_EQ(ring_reserve(32), nullptr);
    set_tracing_on(true);
    RingCounts c;
    EXPECT_TRUE(collect(&c).empty());
    EXPECT_EQ(c.written, 0u);
}

TEST_F(RingTest, ConcurrentWritersExactCounts) {
    constexpr uint32_t kThreads = 16, kPer = 20000;
    ASSERT_EQ(set_buffer_size_kb(4096), 0);
    std::atomic<uint32_t> refused{0}, finished{0};
    std::vector<std::thread> ts;
    for (uint32_t t = 0; t < kThreads; ++t)
        ts.emplace_back([t, &refused, &finished] {
            for (uint32_t i = 0; i < kPer; ++i)
                if (!write_record(t, i)) refused.fetch_add(1);
            // Stay until all have written: a buffer released at exit would be reused,
            // and three threads' records would overflow one buffer.
            finished.fetch_add(1);
            while (finished.load() < kThreads) std::this_thread::yield();
        });
    for (auto &t : ts) t.join();
    EXPECT_EQ(refused.load(), 0u);
    RingCounts c;
    auto e = collect(&c);
    EXPECT_EQ(c.overrun, 0u);
    ASSERT_EQ(e.size(), size_t(kThreads) * kPer);
    EXPECT_EQ(c.written, uint64_t(kThreads) * kPer);
    std::vector<uint32_t> next(kThreads, 0);
    for (const auto &x : e) {
        uint32_t w = 0, seq = 0;
        ASSERT_TRUE(check_record(x.rec, &w, &seq));
        ASSERT_LT(w, kThreads);
        ASSERT_EQ(seq, next[w]) << "writer " << w;
        ++next[w];
    }
    for (uint32_t t = 0; t < kThreads; ++t) EXPECT_EQ(next[t], kPer);
}

// A merger hands out the records of every buffer in timestamp order, each once, the
// same as ring_collect lists them, with the storage of the entry it is given reused.
TEST_F(RingTest, AMergerConsumesEveryBufferInTimestampOrder) {
    constexpr uint32_t kThreads = 8, kPer = 5000;
    ASSERT_EQ(set_buffer_size_kb(4096), 0);
    std::atomic<uint32_t> finished{0};
    std::vector<std::thread> ts;
    for (uint32_t t = 0; t < kThreads; ++t)
        ts.emplace_back([t, &finished] {
            for (uint32_t i = 0; i < kPer; ++i) ASSERT_TRUE(write_record(t, i));
            finished.fetch_add(1);
            while (finished.load() < kThreads) std::this_thread::yield(); // buffers stay apart
        });
    for (auto &t : ts) t.join();
    RingCounts c;
    const std::vector<RingEntry> listed = collect(&c);
    ASSERT_EQ(listed.size(), size_t(kThreads) * kPer);
    std::vector<RingEntry> merged;
    with_ring_views([&](const RingView &main, const RingView &) {
        RingMerger m(main);
        RingEntry e;
        while (m.next(&e)) merged.push_back(e);
    });
    ASSERT_EQ(merged.size(), listed.size());
    std::vector<uint32_t> next(kThreads, 0);
    for (size_t i = 0; i < merged.size(); ++i) {
        if (i > 0) {
            ASSERT_LE(merged[i - 1].ts, merged[i].ts) << "record " << i;
        }
        EXPECT_EQ(merged[i].ts, listed[i].ts);
        uint32_t w = 0, seq = 0;
        ASSERT_TRUE(check_record(merged[i].rec, &w, &seq));
        ASSERT_EQ(seq, next[w]++) << "writer " << w;
    }
    RingEntry e;
    EXPECT_FALSE(consume(&e)); // all consumed
}

TEST_F(RingTest, OverwriteKeepsTheNewestAndCountsTheRest) {
    ASSERT_EQ(set_buffer_size_kb(8), 0);
    constexpr uint32_t kN = 10000;
    for (uint32_t i = 0; i < kN; ++i) ASSERT_TRUE(write_record(0, i));
    RingCounts c;
    auto e = collect(&c);
    ASSERT_FALSE(e.empty());
    EXPECT_LT(e.size(), kN);
    EXPECT_EQ(c.entries + c.overrun, kN);
    EXPECT_EQ(c.written, kN);
    EXPECT_EQ(c.lost, 0u);
    // A full ring evicts a little ahead (one compare-exchange per batch), never more than
    // a 16th of the buffer: what stays fills the rest but for one record.
    uint64_t kept = 0;
    for (const RingEntry &x : e) kept += (sizeof(RecordHeader) + x.rec.size() + 7) / 8 * 8;
    EXPECT_GE(kept, 8 * 1024 - 8 * 1024 / 16 - 2 * (sizeof(RecordHeader) + payload_size(kN - 1) + 8)) << e.size();
    for (size_t i = 0; i < e.size(); ++i) {
        uint32_t w = 0, seq = 0;
        ASSERT_TRUE(check_record(e[i].rec, &w, &seq));
        EXPECT_EQ(seq, kN - e.size() + i); // the newest, contiguous
    }
    // trace_pipe reports the overwritten ones before the first record it reads.
    RingEntry first;
    ASSERT_TRUE(consume(&first));
    EXPECT_EQ(first.lost_before, c.overrun);
    RingEntry second;
    ASSERT_TRUE(consume(&second));
    EXPECT_EQ(second.lost_before, 0u);
}

// A buffer whose tail passed its head (another writer wrote there: a child of a raw fork
// did, shared memory): the writer starts it empty and goes on, the record it was writing
// counted as lost. Before, eviction never made room: the writer spun for good.
TEST_F(RingTest, ABufferWhoseTailPassedItsHeadStartsEmptyInsteadOfHangingItsWriter) {
    ASSERT_EQ(set_buffer_size_kb(8), 0);
    for (uint32_t i = 0; i < 1000; ++i) ASSERT_TRUE(write_record(0, i)); // full: each record evicts
    const uint32_t me = static_cast<uint32_t>(gettid_());
    BufferHeader *mine = nullptr;
    with_ring_views([&](const RingView &main, const RingView &) {
        const RingHeader *h = main.header();
        for (uint32_t i = 0; h != nullptr && i < h->buffer_count; ++i)
            if (main.buffer(i)->owner.load() == me) mine = main.buffer(i);
    });
    ASSERT_NE(mine, nullptr);
    const uint64_t head = mine->head.load();
    mine->tail.store(head + 3 * 8192 + 64);
    EXPECT_FALSE(write_record(0, 1000)); // refused, counted
    for (uint32_t i = 1001; i < 1100; ++i) ASSERT_TRUE(write_record(0, i));
    RingCounts c;
    auto e = collect(&c);
    ASSERT_FALSE(e.empty());
    uint32_t w = 0, seq = 0;
    ASSERT_TRUE(check_record(e.back().rec, &w, &seq));
    EXPECT_EQ(seq, 1099u);
    ASSERT_TRUE(check_record(e.front().rec, &w, &seq));
    EXPECT_GE(seq, 1001u); // nothing from before: those bytes could not be told apart
    EXPECT_EQ(c.lost, 1u);
}

// `threads` writers of `per` records each, run to their end.
void write_concurrently(uint32_t threads, uint32_t per) {
    std::vector<std::thread> ts;
    for (uint32_t t = 0; t < threads; ++t)
        ts.emplace_back([t, per] {
            for (uint32_t i = 0; i < per; ++i) write_record(t, i);
        });
    for (auto &t : ts) t.join();
}

// A consumer of one record at a time until `done`: counts what it takes, the losses
// reported before them, and torn records (`bad`).
std::thread single_consumer(std::atomic<bool> &done, std::atomic<uint64_t> &bad, std::atomic<uint64_t> &taken,
                            std::atomic<uint64_t> &reported) {
    return std::thread([&] {
        while (!done.load()) {
            RingEntry e;
            if (consume(&e)) {
                uint32_t w = 0, seq = 0;
                if (!check_record(e.rec, &w, &seq)) bad.fetch_add(1);
                taken.fetch_add(1);
                reported.fetch_add(e.lost_before);
            }
        }
    });
}

TEST_F(RingTest, ConcurrentReadersNeverSeeTornRecords) {
    ASSERT_EQ(set_buffer_size_kb(16), 0); // small: the writers lap the readers constantly
    constexpr uint32_t kThreads = 4, kPer = 200000;
    std::atomic<bool> done{false};
    std::atomic<uint64_t> checked{0}, bad{0};
    std::thread reader([&] {
        while (!done.load()) {
            RingCounts c;
            for (const auto &x : collect(&c)) {
                uint32_t w = 0, seq = 0;
                if (!check_record(x.rec, &w, &seq)) bad.fetch_add(1);
                checked.fetch_add(1);
            }
        }
    });
    // A consumer too: every record it takes is whole; taken + lost + left == written.
    std::atomic<uint64_t> consumed{0}, reported_lost{0};
    std::thread consumer = single_consumer(done, bad, consumed, reported_lost);
    write_concurrently(kThreads, kPer);
    done = true;
    reader.join();
    consumer.join();
    EXPECT_EQ(bad.load(), 0u);
    EXPECT_GT(checked.load(), 0u);
    EXPECT_GT(consumed.load(), 0u);
    RingCounts c;
    auto left = collect(&c);
    // Drain what is left, collecting the last loss reports.
    RingEntry e;
    uint64_t drained = 0;
    while (consume(&e)) {
        ++drained;
        reported_lost.fetch_add(e.lost_before);
    }
    EXPECT_EQ(drained, left.size());
    EXPECT_EQ(c.overrun + consumed.load() + drained, uint64_t(kThreads) * kPer);
    // Losses after the last record of a buffer have no record to be shown before.
    EXPECT_LE(reported_lost.load(), c.overrun);
}

bool consume_batch(uint32_t slot, size_t max_bytes, RingBatch *b) {
    bool got = false;
    with_ring_views(
        [&](const RingView &main, const RingView &) { got = ring_consume_batch(main, slot, max_bytes, b); });
    return got;
}

uint32_t buffer_count() {
    uint32_t n = 0;
    with_ring_views([&](const RingView &main, const RingView &) { n = main.header()->buffer_count; });
    return n;
}

std::vector<uint8_t> batch_record(const RingBatch &b, const RingBatch::Record &r) {
    return {b.bytes.begin() + r.offset, b.bytes.begin() + r.offset + r.header.size};
}

TEST_F(RingTest, ABatchTakesABuffersRecordsInOrderAndReportsTheOverwrittenOnce) {
    ASSERT_EQ(set_buffer_size_kb(8), 0);
    constexpr uint32_t kN = 10000;
    for (uint32_t i = 0; i < kN; ++i) ASSERT_TRUE(write_record(0, i));
    RingCounts c;
    const size_t held = collect(&c).size();
    RingBatch b;
    std::vector<uint32_t> seqs;
    uint64_t lost = 0;
    int batches = 0;
    for (uint32_t s = 0; s < buffer_count(); ++s) {
        // Small batches (the least a batch copies is the largest record): each ends at a
        // whole record, the next starts there.
        while (consume_batch(s, 5000, &b)) {
            ++batches;
            EXPECT_LE(b.records.size(), 5000 / (sizeof(RecordHeader) + kCommonSize + 8) + 1);
            for (const RingBatch::Record &r : b.records) {
                lost += r.lost_before;
                if (r.header.kind != kRecordKind) continue;
                uint32_t w = 0, seq = 0;
                ASSERT_TRUE(check_record(batch_record(b, r), &w, &seq));
                seqs.push_back(seq);
            }
        }
    }
    ASSERT_EQ(seqs.size(), held);
    EXPECT_GE(batches, 2);
    for (size_t i = 0; i < seqs.size(); ++i) EXPECT_EQ(seqs[i], kN - held + i);
    EXPECT_EQ(lost, c.overrun);
    EXPECT_EQ(held + c.overrun, kN);
    EXPECT_FALSE(consume_batch(0, 1 << 20, &b));
}

TEST_F(RingTest, BatchesAndSingleConsumersUnderWritersThatLapThemTakeEachRecordOnceAndWhole) {
    ASSERT_EQ(set_buffer_size_kb(16), 0); // small: the writers lap the readers constantly
    constexpr uint32_t kThreads = 3, kPer = 200000;
    std::atomic<bool> done{false};
    std::atomic<uint64_t> bad{0}, batched{0}, single{0}, reported{0};
    std::thread batcher([&] {
        RingBatch b;
        while (!done.load()) {
            for (uint32_t s = 0; s < 8; ++s) {
                if (!consume_batch(s, 1 << 20, &b)) continue; // the whole buffer: long copies, lapped
                for (const RingBatch::Record &r : b.records) {
                    reported += r.lost_before;
                    if (r.header.kind != kRecordKind) continue;
                    uint32_t w = 0, seq = 0;
                    if (!check_record(batch_record(b, r), &w, &seq)) bad.fetch_add(1);
                    batched.fetch_add(1);
                }
            }
        }
    });
    std::thread consumer = single_consumer(done, bad, single, reported);
    write_concurrently(kThreads, kPer);
    done = true;
    batcher.join();
    consumer.join();
    RingCounts c;
    const size_t left = collect(&c).size();
    EXPECT_EQ(bad.load(), 0u);
    EXPECT_GT(batched.load(), 0u);
    EXPECT_EQ(c.overrun + batched.load() + single.load() + left, uint64_t(kThreads) * kPer);
    EXPECT_LE(reported.load(), c.overrun);
}

// A probe hit in a signal handler that interrupts the thread between reserve and commit.
std::atomic<int> g_nested_result{-1};
void nested_handler(int) {
    uint8_t *r = ring_reserve(32);
    g_nested_result = r == nullptr ? 0 : 1;
    if (r != nullptr) ring_commit(r, 0);
}

TEST_F(RingTest, NestedReservationInASignalHandlerIsRefusedAndCounted) {
    struct sigaction sa = {}, old = {};
    sa.sa_handler = nested_handler;
    sigaction(SIGUSR1, &sa, &old);
    ASSERT_TRUE(write_record(0, 0));
    const uint32_t size = payload_size(1);
    uint8_t *rec = ring_reserve(size);
    ASSERT_NE(rec, nullptr);
    pthread_kill(pthread_self(), SIGUSR1); // delivered before pthread_kill returns
    EXPECT_EQ(g_nested_result.load(), 0);
    CommonHeader c{7, 0, 0, gettid_()};
    std::memcpy(rec, &c, 8);
    uint32_t w = 0, seq = 1;
    std::memcpy(rec + 8, &w, 4);
    std::memcpy(rec + 12, &seq, 4);
    for (uint32_t k = 16; k < size; ++k) rec[k] = static_cast<uint8_t>(seq * 31 + k);
    ring_commit(rec, size);
    // Outside the window the handler records normally.
    pthread_kill(pthread_self(), SIGUSR1);
    EXPECT_EQ(g_nested_result.load(), 1);
    sigaction(SIGUSR1, &old, nullptr);
    RingCounts counts;
    auto e = collect(&counts);
    ASSERT_EQ(e.size(), 2u);
    EXPECT_EQ(counts.lost, 1u);
    EXPECT_EQ(counts.written, 3u);
    EXPECT_EQ(e[1].lost_before, 1u);
}

TEST_F(RingTest, ThreadsBeyondTheBuffersAreCountedAndBuffersComeBackAtExit) {
    ASSERT_EQ(set_ring_buffer_count(2), 0);
    std::atomic<int> stage{0};
    auto holder = [&](uint32_t id) {
        write_record(id, 0);
        stage.fetch_add(1);
        while (stage.load() < 10) std::this_thread::yield();
    };
    std::thread a(holder, 1), b(holder, 2);
    while (stage.load() < 2) std::this_thread::yield();
    bool third = true;
    std::thread c([&] { third = write_record(3, 0); });
    c.join();
    EXPECT_FALSE(third);
    RingCounts counts;
    collect(&counts);
    EXPECT_EQ(counts.lost, 1u);
    EXPECT_EQ(counts.written, 3u);
    stage = 10;
    a.join();
    b.join();
    // Their buffers were released at exit: new threads record, one after the other.
    for (uint32_t i = 0; i < 5; ++i) {
        bool ok = false;
        std::thread t([&] { ok = write_record(10 + i, 0); });
        t.join();
        EXPECT_TRUE(ok) << i;
    }
    auto e = collect(&counts);
    EXPECT_EQ(e.size(), 7u); // the old records stay in the reused buffers
    EXPECT_EQ(counts.lost, 1u);
}

// glibc runs free, madvise and more after the key destructors: a thread's records there
// go into the buffer it kept, which comes back to another thread once it has ended.
pthread_key_t g_late_key;
std::atomic<int> g_late_written{0};
void late_destructor(void *round) {
    // The ring's own destructor runs in the first round at the latest: write in the next.
    if (round == reinterpret_cast<void *>(1)) {
        pthread_setspecific(g_late_key, reinterpret_cast<void *>(2));
        return;
    }
    for (uint32_t i = 0; i < 3; ++i) g_late_written += write_record(20, i) ? 1 : 0;
}

TEST_F(RingTest, AThreadRecordsPastItsExitDestructorAndItsBufferComesBackOnceItEnds) {
    ASSERT_EQ(set_ring_buffer_count(1), 0);
    ASSERT_EQ(pthread_key_create(&g_late_key, late_destructor), 0);
    g_late_written = 0;
    std::thread t([&] {
        write_record(19, 0);
        pthread_setspecific(g_late_key, reinterpret_cast<void *>(1));
    });
    t.join();
    pthread_key_delete(g_late_key);
    EXPECT_EQ(g_late_written.load(), 3);
    // The one buffer: taken by the next thread, the ended one's records still in it.
    bool next = false;
    std::thread u([&] { next = write_record(21, 0); });
    u.join();
    EXPECT_TRUE(next);
    RingCounts counts;
    const std::vector<RingEntry> e = collect(&counts);
    EXPECT_EQ(counts.written, 5u);
    EXPECT_EQ(counts.lost, 0u);
    ASSERT_EQ(e.size(), 5u);
    std::vector<uint32_t> writers;
    for (const RingEntry &r : e) {
        uint32_t writer = 0, seq = 0;
        EXPECT_TRUE(check_record(r.rec, &writer, &seq));
        writers.push_back(writer);
    }
    EXPECT_EQ(writers, (std::vector<uint32_t>{19, 20, 20, 20, 21}));
}

// A thread that ends without its exit handler (a raw exit): the name ring_reserve was
// given at its first record names it; the first commit says whose it is (common_pid).
TEST_F(RingTest, ABufferKeepsTheNameItsOwnerGaveAtItsFirstRecord) {
    constexpr int32_t kGoneTid = 0x7fffffe0; // no such thread in /proc
    std::thread t([&] {
        const char comm[16] = "raw-exiter";
        uint8_t *rec = ring_reserve(kCommonSize, comm);
        ASSERT_NE(rec, nullptr);
        const CommonHeader c{7, 0, 0, kGoneTid};
        std::memcpy(rec, &c, sizeof c);
        ring_commit(rec, kCommonSize);
        // Later records do not write the name again.
        const char other[16] = "other";
        rec = ring_reserve(kCommonSize, other);
        ASSERT_NE(rec, nullptr);
        std::memcpy(rec, &c, sizeof c);
        ring_commit(rec, kCommonSize);
    });
    t.join();
    std::string name;
    with_ring_views([&](const RingView &main, const RingView &) { name = ring_thread_name(main, getpid(), kGoneTid); });
    EXPECT_EQ(name, "raw-exiter");
}

TEST_F(RingTest, ExitedThreadKeepsItsName) {
    int32_t tid = 0;
    std::thread t([&] {
        pthread_setname_np(pthread_self(), "ring-worker");
        tid = gettid_();
        write_record(0, 0);
    });
    t.join();
    std::string name;
    with_ring_views([&](const RingView &main, const RingView &) { name = ring_thread_name(main, getpid(), tid); });
    EXPECT_EQ(name, "ring-worker");
    with_ring_views(
        [&](const RingView &main, const RingView &) { name = ring_thread_name(main, getpid(), gettid_()); });
    char own[16] = {};
    pthread_getname_np(pthread_self(), own, sizeof own);
    EXPECT_EQ(name, own);
    with_ring_views(
        [&](const RingView &main, const RingView &) { name = ring_thread_name(main, getpid(), 0x7ffffff0); });
    EXPECT_EQ(name, "<...>");
}

TEST_F(RingTest, ClearEmptiesAndResetsCounts) {
    ASSERT_EQ(set_buffer_size_kb(8), 0);
    for (uint32_t i = 0; i < 1000; ++i) write_record(0, i);
    ring_clear();
    RingCounts c;
    EXPECT_TRUE(collect(&c).empty());
    EXPECT_EQ(c.written, 0u);
    EXPECT_EQ(c.overrun, 0u);
    write_record(0, 5000);
    auto e = collect(&c);
    ASSERT_EQ(e.size(), 1u);
    EXPECT_EQ(c.written, 1u);
    RingEntry x;
    ASSERT_TRUE(consume(&x));
    EXPECT_EQ(x.lost_before, 0u); // overruns before the clear are not reported
}

TEST_F(RingTest, ConsumingEmptiesAndTheCountsFollowTheKernel) {
    for (uint32_t i = 0; i < 10; ++i) write_record(0, i);
    RingEntry e;
    for (uint32_t i = 0; i < 4; ++i) {
        ASSERT_TRUE(consume(&e));
        uint32_t w = 0, seq = 0;
        ASSERT_TRUE(check_record(e.rec, &w, &seq));
        EXPECT_EQ(seq, i);
    }
    RingCounts c;
    EXPECT_EQ(collect(&c).size(), 6u);
    EXPECT_EQ(c.entries, 6u);
    EXPECT_EQ(c.written, 6u); // as ftrace: read entries leave entries-written too
}

TEST_F(RingTest, SnapshotSwapsTheBuffers) {
    EXPECT_FALSE(snapshot_allocated());
    for (uint32_t i = 0; i < 5; ++i) write_record(0, i);
    ASSERT_EQ(snapshot_take(), 0);
    EXPECT_TRUE(snapshot_allocated());
    for (uint32_t i = 5; i < 8; ++i) write_record(0, i);
    std::vector<RingEntry> main, snap;
    with_ring_views([&](const RingView &m, const RingView &s) {
        main = ring_collect(m, nullptr);
        snap = ring_collect(s, nullptr);
    });
    ASSERT_EQ(snap.size(), 5u);
    ASSERT_EQ(main.size(), 3u);
    uint32_t w = 0, seq = 0;
    ASSERT_TRUE(check_record(snap[4].rec, &w, &seq));
    EXPECT_EQ(seq, 4u);
    ASSERT_TRUE(check_record(main[0].rec, &w, &seq));
    EXPECT_EQ(seq, 5u);
    size_t sz = 0;
    EXPECT_GE(snapshot_memfd(&sz), 0);
    snapshot_clear();
    with_ring_views([&](const RingView &, const RingView &s) { snap = ring_collect(s, nullptr); });
    EXPECT_TRUE(snap.empty());
    EXPECT_TRUE(snapshot_allocated());
    snapshot_free();
    EXPECT_FALSE(snapshot_allocated());
    EXPECT_EQ(snapshot_memfd(&sz), -1);
}

TEST_F(RingTest, BufferSizeKb) {
    ASSERT_EQ(set_buffer_size_kb(101), 0);
    EXPECT_EQ(buffer_size_kb(), 101u);
    EXPECT_EQ(set_buffer_size_kb(0), -EINVAL);
    size_t size = 0;
    ASSERT_GE(ring_memfd(&size), 0);
    with_ring_views([&](const RingView &m, const RingView &) {
        ASSERT_NE(m.header(), nullptr);
        EXPECT_EQ(m.header()->data_size, 26u * 4096); // 101 KiB rounded up to pages
        EXPECT_EQ(m.size, size);
    });
}

// The CLI's case: another process receives the memfd over a unix socket, maps it and
// reads the records itself.
TEST_F(RingTest, AReaderInAnotherProcessReadsTheSameRecords) {
    for (uint32_t i = 0; i < 500; ++i) write_record(3, i);
    std::vector<RingEntry> ours = collect(nullptr);
    ASSERT_EQ(ours.size(), 500u);
    int sv[2];
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    size_t size = 0;
    const int fd = ring_memfd(&size);
    ASSERT_GE(fd, 0);
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
        close(sv[0]);
        char byte;
        int got = -1;
        if (control::recv_with_fd(sv[1], &byte, 1, &got) != 1) _exit(10);
        if (got < 0) _exit(11);
        void *p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, got, 0);
        if (p == MAP_FAILED) _exit(12);
        RingView v{static_cast<const uint8_t *>(p), size};
        if (v.header() == nullptr) _exit(13);
        RingCounts c;
        auto e = ring_collect(v, &c);
        if (e.size() != 500 || c.written != 500) _exit(14);
        for (uint32_t i = 0; i < 500; ++i) {
            uint32_t w = 0, seq = 0;
            if (!check_record(e[i].rec, &w, &seq) || seq != i || w != 3) _exit(15);
        }
        // It consumes the first 100: the parent sees them gone.
        for (int i = 0; i < 100; ++i) {
            RingEntry x;
            if (!ring_consume(v, &x)) _exit(16);
        }
        _exit(0);
    }
    close(sv[1]);
    char byte = 'x';
    const iovec iov{&byte, 1};
    ASSERT_EQ(control::send_with_fd(sv[0], &iov, 1, fd), 1);
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 0);
    close(sv[0]);
    RingCounts c;
    auto left = collect(&c);
    ASSERT_EQ(left.size(), 400u);
    uint32_t w = 0, seq = 0;
    ASSERT_TRUE(check_record(left[0].rec, &w, &seq));
    EXPECT_EQ(seq, 100u);
}

// A reader looking at every buffer of a new ring (ukprobe does, for every process it
// follows) reads their headers only: a page of the memfd first read is a page allocated,
// so the headers lie side by side, before the data, and nothing of the data is touched.
TEST_F(RingTest, ReadingANewRingAllocatesItsHeadersOnly) {
    ASSERT_EQ(set_ring_buffer_count(256), 0);
    size_t size = 0;
    const int fd = ring_memfd_copy(&size);
    ASSERT_GE(fd, 0);
    void *p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ASSERT_NE(p, MAP_FAILED);
    const RingView v{static_cast<const uint8_t *>(p), size};
    const RingHeader *h = v.header();
    ASSERT_NE(h, nullptr);
    EXPECT_FALSE(ring_has_data(v));
    RingCounts c;
    EXPECT_TRUE(ring_collect(v, &c).empty());
    struct stat st {};
    ASSERT_EQ(fstat(fd, &st), 0);
    EXPECT_LE(static_cast<uint64_t>(st.st_blocks) * 512, h->data_offset)
        << "pages allocated by reading " << h->buffer_count << " empty buffers";
    EXPECT_LT(h->data_offset, 64u * 1024);
    munmap(p, size);
    close(fd);
}

// trace_pipe read by several controllers at once (ukprobe trace-pipe twice): readers in
// other processes consume from the shared memfd while threads write; each record goes
// to exactly one of them.
TEST_F(RingTest, ReadersInOtherProcessesConsumeEachRecordOnce) {
    constexpr uint32_t kWriters = 4, kPerWriter = 5000, kReaders = 2;
    struct Shared {
        std::atomic<int> done;                           // the writers have finished
        std::atomic<uint32_t> got[kReaders];             // records each reader consumed
        std::atomic<uint8_t> seen[kWriters][kPerWriter]; // times each record was consumed
        std::atomic<uint32_t> bad;                       // torn or malformed records
    };
    auto *sh =
        static_cast<Shared *>(mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
    ASSERT_NE(sh, MAP_FAILED);
    size_t size = 0;
    const int fd = ring_memfd_copy(&size);
    ASSERT_GE(fd, 0);
    pid_t readers[kReaders];
    for (uint32_t r = 0; r < kReaders; ++r) {
        readers[r] = fork();
        ASSERT_GE(readers[r], 0);
        if (readers[r] != 0) continue;
        void *p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED) _exit(12);
        const RingView v{static_cast<const uint8_t *>(p), size};
        for (;;) {
            const bool last = sh->done.load(); // read before the attempt: nothing comes after
            RingEntry e;
            if (!ring_consume(v, &e)) {
                if (last) _exit(0);
                continue;
            }
            uint32_t w = 0, seq = 0;
            if (!check_record(e.rec, &w, &seq) || w >= kWriters || seq >= kPerWriter) {
                sh->bad.fetch_add(1);
                continue;
            }
            sh->seen[w][seq].fetch_add(1);
            sh->got[r].fetch_add(1);
        }
    }
    close(fd);
    std::vector<std::thread> writers;
    for (uint32_t w = 0; w < kWriters; ++w)
        writers.emplace_back([w] {
            for (uint32_t i = 0; i < kPerWriter; ++i)
                if (!write_record(w, i)) return;
        });
    for (auto &t : writers) t.join();
    sh->done.store(1);
    for (pid_t r : readers) {
        int status = 0;
        ASSERT_EQ(waitpid(r, &status, 0), r);
        EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
    }
    EXPECT_EQ(sh->bad.load(), 0u);
    uint32_t twice = 0, never = 0;
    for (uint32_t w = 0; w < kWriters; ++w)
        for (uint32_t i = 0; i < kPerWriter; ++i) {
            twice += sh->seen[w][i].load() > 1;
            never += sh->seen[w][i].load() == 0;
        }
    EXPECT_EQ(twice, 0u);
    // Readers slowed down by a loaded machine may let writers overwrite records: each of
    // those is counted as an overrun, and no other record goes missing.
    RingCounts c;
    EXPECT_TRUE(collect(&c).empty());
    EXPECT_EQ(never, c.overrun);
    EXPECT_EQ(sh->got[0].load() + sh->got[1].load() + c.overrun, kWriters * kPerWriter);
    EXPECT_GT(sh->got[0].load() + sh->got[1].load(), 0u);
    munmap(sh, sizeof(Shared));
}

// Lets the calling thread make write and exit only; any other system call kills the
// process. (Strict mode would also disable rdtsc, which the vDSO's clock_gettime uses.)
bool allow_only_write_and_exit() {
    sock_filter code[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_write, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_exit, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
    };
    sock_fprog prog{static_cast<unsigned short>(sizeof code / sizeof code[0]), code};
    return prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 && prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) == 0;
}

// The hot path makes no system call, a thread's first record included: a thread that
// may only write and exit records 1000 events.
TEST_F(RingTest, NoSystemCallOnTheHotPathEvenForAThreadsFirstRecord) {
    int fds[2];
    ASSERT_EQ(pipe(fds), 0);
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
        std::thread t([&] {
            const int out = fds[1];
            if (!allow_only_write_and_exit()) syscall(SYS_exit, 0);
            uint32_t ok = 0;
            for (uint32_t i = 0; i < 1000; ++i) {
                uint8_t *rec = ring_reserve(payload_size(i));
                if (rec == nullptr) continue;
                CommonHeader c{7, 0, 0, 1};
                std::memcpy(rec, &c, sizeof c);
                std::memcpy(rec + 8, &ok, 4);
                std::memcpy(rec + 12, &i, 4);
                ring_commit(rec, payload_size(i));
                ++ok;
            }
            ssize_t n = write(out, &ok, sizeof ok);
            (void)n;
            syscall(SYS_exit, 0); // only the thread: glibc's exit path would make other calls
        });
        t.join();
        _exit(0);
    }
    close(fds[1]);
    uint32_t ok = 0;
    const ssize_t n = read(fds[0], &ok, sizeof ok);
    close(fds[0]);
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    EXPECT_TRUE(WIFEXITED(status)) << "killed by signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    EXPECT_EQ(n, static_cast<ssize_t>(sizeof ok));
    EXPECT_EQ(ok, 1000u);
}

TEST_F(RingTest, AForkedChildWritesIntoItsOwnBuffers) {
    write_record(0, 1);
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
        for (uint32_t i = 0; i < 50; ++i) write_record(1, i);
        RingCounts c;
        auto e = collect(&c);
        _exit(e.size() == 50 ? 0 : 1);
    }
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    EXPECT_EQ(collect(nullptr).size(), 1u); // the parent's buffers are untouched
}

} // namespace
} // namespace ukp::trace
