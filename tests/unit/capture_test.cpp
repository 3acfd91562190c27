// The capture file of `ukprobe record` (trace/capture.hpp): records taken from this
// process's ring come back from the file whole, in timestamp order, with their threads'
// names; a thread that writes more than a capture takes does not starve the others.
#include <gtest/gtest.h>

#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "ring_records.hpp"
#include "trace/capture.hpp"
#include "trace/ring.hpp"

namespace ukp::trace {
namespace {

using test::write_record;

bool whole(const capture::Item &it, uint32_t *writer, uint32_t *seq) {
    return test::check_record(it.data, it.size, writer, seq);
}

// One capture of the main buffers into `blocks`.
size_t capture_once(capture::Capturer &c, std::string &blocks, size_t max_bytes) {
    size_t n = 0;
    with_ring_views([&](const RingView &main, const RingView &) { n = c.capture(main, blocks, max_bytes); });
    return n;
}

using CaptureTest = test::FreshRing;

TEST_F(CaptureTest, RecordsComeBackWholeInTimestampOrderWithTheirThreadsNames) {
    constexpr uint32_t kPer = 3000;
    std::vector<std::thread> ts;
    for (uint32_t w = 0; w < 3; ++w)
        ts.emplace_back([w] {
            const std::string name = "writer-" + std::to_string(w);
            pthread_setname_np(pthread_self(), name.c_str());
            for (uint32_t i = 0; i < kPer; ++i) ASSERT_TRUE(write_record(w, i));
        });
    for (auto &t : ts) t.join();
    capture::Capturer c(1, getpid());
    std::string file = capture::file_header();
    capture::append_block(file, capture::kStream, 1, std::to_string(getpid()) + "\tcapture_test\n");
    size_t taken = 0;
    while (const size_t n = capture_once(c, file, 64 << 10)) taken += n;
    EXPECT_EQ(taken, 3 * kPer);
    capture::File f;
    std::string why;
    ASSERT_EQ(capture::read_file(reinterpret_cast<const uint8_t *>(file.data()), file.size(), &f, &why), 0) << why;
    EXPECT_EQ(why, "");
    ASSERT_EQ(f.items.size(), 3 * kPer);
    std::vector<uint32_t> next(3, 0);
    std::set<int32_t> tids;
    for (size_t i = 0; i < f.items.size(); ++i) {
        const capture::Item &it = f.items[i];
        if (i > 0) {
            EXPECT_LE(f.items[i - 1].ts, it.ts);
        }
        uint32_t w = 0, seq = 0;
        ASSERT_EQ(it.kind, capture::kRecord);
        ASSERT_TRUE(whole(it, &w, &seq));
        ASSERT_LT(w, 3u);
        EXPECT_EQ(seq, next[w]++); // each writer's in its order
        CommonHeader h;
        std::memcpy(&h, it.data, sizeof h);
        tids.insert(h.pid);
    }
    ASSERT_EQ(f.streams.size(), 1u);
    const capture::Stream &s = f.streams.begin()->second;
    EXPECT_EQ(s.pid, getpid());
    EXPECT_EQ(s.comm, "capture_test");
    for (int32_t tid : tids) {
        ASSERT_EQ(s.names.count(tid), 1u) << tid;
        EXPECT_EQ(s.names.at(tid).rfind("writer-", 0), 0u) << s.names.at(tid);
    }
    // Cut short: read up to the last whole block, and said so.
    capture::File part;
    ASSERT_EQ(capture::read_file(reinterpret_cast<const uint8_t *>(file.data()), file.size() - 5, &part, &why), 0);
    EXPECT_NE(why.find("cut short"), std::string::npos);
    EXPECT_LT(part.items.size(), f.items.size());
    // Not a capture file.
    const std::string junk(64, 'x');
    EXPECT_EQ(capture::read_file(reinterpret_cast<const uint8_t *>(junk.data()), junk.size(), &part, &why), -EPROTO);
}

// A thread that wrote more than one capture takes, in a buffer read first, and another
// that wrote a little: the other's records come in the next capture, not once the first
// buffer is empty.
TEST_F(CaptureTest, ABusyBufferDoesNotStarveTheOthers) {
    // Both alive at once: a buffer each.
    std::atomic<int> step{0};
    std::thread busy([&] {
        write_record(0, 0);
        step = 1;
        while (step.load() != 2) std::this_thread::yield();
        for (uint32_t i = 1; i < 15000; ++i) write_record(0, i);
        step = 3;
        while (step.load() != 4) std::this_thread::yield();
    });
    std::thread quiet([&] {
        while (step.load() != 1) std::this_thread::yield();
        for (uint32_t i = 0; i < 10; ++i) write_record(1, i);
        step = 2;
        while (step.load() != 4) std::this_thread::yield();
    });
    while (step.load() != 3) std::this_thread::yield();
    capture::Capturer c(1, getpid());
    capture::File f;
    std::string file;
    size_t calls = 0, taken = 0;
    bool quiet_seen = false;
    while (!quiet_seen && calls < 100) {
        std::string blocks;
        const size_t n = capture_once(c, blocks, 4096);
        ASSERT_GT(n, 0u);
        taken += n;
        ++calls;
        file = capture::file_header();
        capture::append_block(file, capture::kStream, 1, "1\tx\n");
        file += blocks;
        std::string why;
        ASSERT_EQ(capture::read_file(reinterpret_cast<const uint8_t *>(file.data()), file.size(), &f, &why), 0);
        for (const capture::Item &it : f.items) {
            uint32_t w = 0, seq = 0;
            ASSERT_TRUE(whole(it, &w, &seq));
            quiet_seen = quiet_seen || w == 1;
        }
    }
    EXPECT_TRUE(quiet_seen);
    EXPECT_LE(calls, 2u);
    step = 4;
    busy.join();
    quiet.join();
    // What is left is still there, in order.
    std::string rest = capture::file_header();
    capture::append_block(rest, capture::kStream, 1, "1\tx\n");
    while (capture_once(c, rest, 1 << 20) != 0) {
    }
    std::string why;
    ASSERT_EQ(capture::read_file(reinterpret_cast<const uint8_t *>(rest.data()), rest.size(), &f, &why), 0);
    EXPECT_EQ(f.items.size() + taken, 15010u); // every record, once
}

} // namespace
} // namespace ukp::trace
