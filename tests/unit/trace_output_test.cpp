// The trace text against this machine's kernel (tests/data/ring/kernel_*.txt were read
// from tracefs with uprobe_events on Linux 6.18), from hand-made records, and the
// trace / trace_pipe / snapshot files over the real ring.
#include <gtest/gtest.h>

#include <pthread.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>
#include <thread>

#include "trace/output.hpp"
#include "trace/ring.hpp"

namespace ukp::trace {
namespace {

std::string data_file(const char *name) {
    std::string path = __FILE__;
    path = path.substr(0, path.rfind('/')) + "/../data/ring/" + name;
    std::ifstream f(path);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

std::string with_cpus(std::string text) {
    const std::string from = "#P:2", to = "#P:" + std::to_string(online_cpus());
    if (auto at = text.find(from); at != std::string::npos) text.replace(at, from.size(), to);
    return text;
}

// The trivial event printer of these tests: the record holds the event's text after the
// common header.
void print_text(const uint8_t *rec, uint32_t size, std::string &out) {
    out.append(reinterpret_cast<const char *>(rec) + kCommonSize, size - kCommonSize);
}

std::vector<uint8_t> text_record(int32_t pid, uint8_t flags, uint8_t pc, const std::string &text) {
    std::vector<uint8_t> rec(kCommonSize + text.size());
    CommonHeader c{1, flags, pc, pid};
    std::memcpy(rec.data(), &c, sizeof c);
    std::memcpy(rec.data() + kCommonSize, text.data(), text.size());
    return rec;
}

// A region built by hand in the shared layout, as a writer in any process would leave it.
class FakeRing {
public:
    FakeRing(uint32_t slots, uint64_t data_size) {
        header_size_ = (sizeof(RingHeader) + 63) / 64 * 64;
        data_offset_ = header_size_ + slots * sizeof(BufferHeader);
        stride_ = data_size;
        size_ = data_offset_ + slots * stride_;
        base_ =
            static_cast<uint8_t *>(mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
        auto *h = reinterpret_cast<RingHeader *>(base_);
        h->magic = kRingMagic;
        h->version = kRingVersion;
        h->header_size = static_cast<uint32_t>(header_size_);
        h->buffer_count = slots;
        h->buffer_header_size = sizeof(BufferHeader);
        h->buffer_stride = stride_;
        h->data_size = data_size;
        h->data_offset = data_offset_;
        h->pid = getpid();
    }
    ~FakeRing() { munmap(base_, size_); }
    RingView view() const { return RingView{base_, size_}; }
    RingHeader *header() { return reinterpret_cast<RingHeader *>(base_); }
    BufferHeader *buffer(uint32_t i) { return view().buffer(i); }
    void add(uint32_t slot_index, uint16_t cpu, uint64_t ts, const std::vector<uint8_t> &rec,
             uint32_t dropped_before = 0) {
        BufferHeader *s = buffer(slot_index);
        uint8_t *data = base_ + data_offset_ + slot_index * stride_;
        const uint64_t pos = s->head.load();
        RecordHeader rh{};
        rh.len = static_cast<uint16_t>((sizeof(RecordHeader) + rec.size() + 7) / 8 * 8);
        rh.kind = kRecordKind;
        rh.size = static_cast<uint16_t>(rec.size());
        rh.cpu = cpu;
        rh.dropped_before = dropped_before;
        rh.ts = ts;
        std::memcpy(data + pos, &rh, sizeof rh);
        std::memcpy(data + pos + sizeof rh, rec.data(), rec.size());
        s->head.store(pos + rh.len);
        s->reserve_end.store(pos + rh.len);
    }
    void name(int32_t tid, const char *comm) {
        CommEntry &e = header()->comms[header()->comm_next.fetch_add(1) % kCommEntries];
        std::strncpy(e.comm, comm, 15);
        e.tid.store(tid);
    }

private:
    uint8_t *base_ = nullptr;
    size_t size_ = 0, header_size_ = 0, data_offset_ = 0, stride_ = 0;
};

struct KernelLine {
    int32_t pid;
    uint16_t cpu;
    uint64_t ts;
    std::string event;
};

// "            prog-13582   [001] DBZff  2525.606026: tgt: ..." -> its parts.
KernelLine parse_kernel_line(const std::string &line) {
    KernelLine k{};
    const size_t dash = line.find('-');
    k.pid = std::stoi(line.substr(dash + 1));
    const size_t br = line.find('[');
    k.cpu = static_cast<uint16_t>(std::stoi(line.substr(br + 1)));
    const size_t colon = line.find(": ", br);
    const size_t sp = line.rfind(' ', colon);
    const std::string ts = line.substr(sp + 1, colon - sp - 1);
    const size_t dot = ts.find('.');
    k.ts = std::stoull(ts.substr(0, dot)) * 1000000000ull + std::stoull(ts.substr(dot + 1)) * 1000ull;
    k.event = line.substr(colon + 2);
    return k;
}

std::vector<std::string> lines_of(const std::string &text) {
    std::vector<std::string> out;
    std::istringstream in(text);
    for (std::string l; std::getline(in, l);) out.push_back(l);
    return out;
}

TEST(TraceText, HeaderIsTheKernels) {
    const std::string kernel = data_file("kernel_header_empty.txt");
    ASSERT_FALSE(kernel.empty());
    EXPECT_EQ(trace_header(0, 0, 2), kernel);
}

TEST(TraceText, FlagsColumnsAsTheKernelPrintsThem) {
    auto flags = [](uint8_t f, uint8_t pc) { return trace_line_prefix("t", 1, 0, f, pc, 0).substr(31, 5); };
    EXPECT_EQ(flags(0, 0), ".....");       // what user-space records hold
    EXPECT_EQ(flags(0xff, 0xff), "DBZff"); // what 6.18's uprobe events hold
    EXPECT_EQ(flags(0x01, 0), "d....");
    EXPECT_EQ(flags(0x80, 0), "b....");
    EXPECT_EQ(flags(0x04 | 0x20, 0), ".N...");
    EXPECT_EQ(flags(0x04, 0), ".n...");
    EXPECT_EQ(flags(0x02, 0), ".l...");
    EXPECT_EQ(flags(0x08, 0), "..h..");
    EXPECT_EQ(flags(0x08 | 0x10, 0), "..H..");
    EXPECT_EQ(flags(0x40, 0), "..z..");
    EXPECT_EQ(flags(0, 0x21), "...12");
}

TEST(TraceText, LinePrefixWidths) {
    EXPECT_EQ(trace_line_prefix("<...>", 1447, 1, 0, 0, 1038282286875000ull),
              "           <...>-1447    [001] ..... 1038282.286875: ");
    EXPECT_EQ(trace_line_prefix("a-very-long-nam", 12345678, 123, 0, 0, 5000499),
              " a-very-long-nam-12345678 [123] .....     0.005000: ");
    EXPECT_EQ(trace_line_prefix("x", 1, 0, 0, 0, 5000500), "               x-1       [000] .....     0.005001: ");
}

// The prefix is formatted by hand (a line per record): it matches printf's, the format the
// kernel's trace uses, for names, pids, CPUs and times at and past every field's width.
TEST(TraceText, LinePrefixIsPrintfs) {
    const std::vector<std::string> comms = {
        "", "x", "<...>", "fifteen-chars-x", "sixteen-chars-xy", "a-name-longer-than-16"};
    const std::vector<int32_t> pids = {0, 1, -1, 1234567, 12345678, INT32_MAX, INT32_MIN};
    const std::vector<uint32_t> cpus = {0, 7, 99, 999, 1000, UINT32_MAX};
    const std::vector<uint64_t> times = {0, 499, 500, 999999, 5000500, 99999999999999ull, UINT64_MAX - 1000};
    int checked = 0;
    for (const std::string &comm : comms)
        for (int32_t pid : pids)
            for (uint32_t cpu : cpus)
                for (uint64_t ts : times) {
                    const uint64_t usecs = (ts + 500) / 1000;
                    char want[160];
                    std::snprintf(want, sizeof want, "%16s-%-7d [%03u] %s %5llu.%06llu: ", comm.c_str(), pid, cpu,
                                  ".....", static_cast<unsigned long long>(usecs / 1000000),
                                  static_cast<unsigned long long>(usecs % 1000000));
                    ASSERT_EQ(trace_line_prefix(comm, pid, cpu, 0, 0, ts), want);
                    ++checked;
                }
    EXPECT_EQ(checked, 6 * 7 * 6 * 7);
}

TEST(TraceText, HandMadeRecordsPrintAsTheKernelsUprobeTrace) {
    const std::string kernel = data_file("kernel_trace_uprobe.txt");
    const auto lines = lines_of(kernel);
    ASSERT_GT(lines.size(), 12u);
    FakeRing ring(4, 1 << 16);
    for (size_t i = 12; i < lines.size(); ++i) {
        const KernelLine k = parse_kernel_line(lines[i]);
        ring.add(static_cast<uint32_t>(i % 2), k.cpu, k.ts, text_record(k.pid, 0xff, 0xff, k.event));
        ring.name(k.pid, "prog");
    }
    EXPECT_EQ(trace_text_of(ring.view(), print_text), with_cpus(kernel));
}

TEST(TraceText, TracePipeShowsOverrunsAsTheKernelDoes) {
    const std::string kernel = data_file("kernel_trace_pipe_lost.txt");
    const auto lines = lines_of(kernel);
    ASSERT_GE(lines.size(), 3u);
    ASSERT_EQ(lines[0], "CPU:1 [LOST 3774 EVENTS]");
    FakeRing ring(2, 1 << 16);
    for (size_t i = 1; i < 3; ++i) {
        const KernelLine k = parse_kernel_line(lines[i]);
        ring.add(1, k.cpu, k.ts, text_record(k.pid, 0xff, 0xff, k.event));
        ring.name(k.pid, "prog");
    }
    ring.buffer(1)->overrun.store(3774);
    // trace shows the overruns in its header only, as the kernel's does.
    const std::string trace = trace_text_of(ring.view(), print_text);
    EXPECT_NE(trace.find("# entries-in-buffer/entries-written: 2/3776   #P:"), std::string::npos);
    EXPECT_EQ(trace.find("LOST"), std::string::npos);
    const std::string pipe = trace_pipe_text_of(ring.view(), print_text, 1 << 20);
    EXPECT_EQ(pipe, lines[0] + "\n" + lines[1] + "\n" + lines[2] + "\n");
    // Consumed: nothing left, and nothing reported twice.
    EXPECT_EQ(trace_pipe_text_of(ring.view(), print_text, 1 << 20), "");
    EXPECT_NE(trace_text_of(ring.view(), print_text).find("entries-written: 0/3774 "), std::string::npos);
}

TEST(TraceText, RefusedRecordsShowAsLostLinesInTrace) {
    FakeRing ring(2, 1 << 16);
    ring.add(0, 1, 1000000000, text_record(7, 0, 0, "ev: a"));
    ring.add(0, 0, 2000000000, text_record(7, 0, 0, "ev: b"), 5);
    ring.buffer(0)->dropped.store(5);
    ring.name(7, "w");
    const std::string text = trace_text_of(ring.view(), print_text);
    const std::string body = text.substr(trace_header(2, 7, online_cpus()).size());
    EXPECT_EQ(text.substr(0, trace_header(2, 7, online_cpus()).size()), trace_header(2, 7, online_cpus()));
    EXPECT_EQ(body, "               w-7       [001] .....     1.000000: ev: a\n"
                    "CPU:0 [LOST 5 EVENTS]\n"
                    "               w-7       [000] .....     2.000000: ev: b\n");
}

TEST(TraceText, RecordsOfSeveralBuffersMergeByTime) {
    FakeRing ring(3, 1 << 16);
    ring.add(0, 0, 3000, text_record(1, 0, 0, "e: 3"));
    ring.add(1, 1, 1000, text_record(2, 0, 0, "e: 1"));
    ring.add(2, 0, 2000, text_record(3, 0, 0, "e: 2"));
    ring.add(1, 1, 4000, text_record(2, 0, 0, "e: 4"));
    const auto lines = lines_of(trace_text_of(ring.view(), print_text));
    ASSERT_EQ(lines.size(), 16u);
    for (int i = 0; i < 4; ++i)
        EXPECT_EQ(lines[12 + i].substr(lines[12 + i].size() - 4), "e: " + std::to_string(i + 1));
}

TEST(TraceText, SnapshotTextOfAViewFollowsTheKernel) {
    FakeRing ring(1, 1 << 16);
    const std::string freed = snapshot_text_of(ring.view(), false, print_text);
    EXPECT_EQ(freed, "# tracer: nop\n#\n#\n# * Snapshot is freed *\n#\n"
                     "# Snapshot commands:\n"
                     "# echo 0 > snapshot : Clears and frees snapshot buffer\n"
                     "# echo 1 > snapshot : Allocates snapshot buffer, if not already allocated.\n"
                     "#                      Takes a snapshot of the main buffer.\n"
                     "# echo 2 > snapshot : Clears snapshot buffer (but does not allocate or free)\n"
                     "#                      (Doesn't have to be '2' works with any number that\n"
                     "#                       is not a '0' or '1')\n");
    const std::string empty = snapshot_text_of(ring.view(), true, print_text);
    EXPECT_NE(empty.find("# * Snapshot is allocated *"), std::string::npos);
    ring.add(0, 0, 1000, text_record(1, 0, 0, "e: 1"));
    const std::string full = snapshot_text_of(ring.view(), true, print_text);
    EXPECT_EQ(full.substr(0, trace_header(1, 1, online_cpus()).size()), trace_header(1, 1, online_cpus()));
}

// ---- Over the real ring ----

int32_t gettid_() { return static_cast<int32_t>(syscall(SYS_gettid)); }

void write_text(const std::string &text) {
    const auto rec = text_record(gettid_(), 0, 0, text);
    uint8_t *p = ring_reserve(static_cast<uint32_t>(rec.size()));
    ASSERT_NE(p, nullptr);
    std::memcpy(p, rec.data(), rec.size());
    ring_commit(p, static_cast<uint32_t>(rec.size()));
}

std::string own_name() {
    char n[16] = {};
    pthread_getname_np(pthread_self(), n, sizeof n);
    return n;
}

class TraceFiles : public ::testing::Test {
protected:
    void SetUp() override {
        ASSERT_EQ(ring_init(), 0);
        set_tracing_on(true);
        snapshot_free();
        ASSERT_EQ(set_buffer_size_kb(64), 0);
        while (!trace_pipe_read(print_text, 0, 1 << 20).empty()) {
        }
    }
};

TEST_F(TraceFiles, TraceIsNonConsumingAndClearable) {
    write_text("ev: one");
    write_text("ev: two");
    const std::string a = trace_text(print_text);
    EXPECT_EQ(a, trace_text(print_text));
    const auto lines = lines_of(a);
    ASSERT_EQ(lines.size(), 14u);
    EXPECT_EQ(lines[2], "# entries-in-buffer/entries-written: 2/2   #P:" + std::to_string(online_cpus()));
    char prefix[64];
    std::snprintf(prefix, sizeof prefix, "%16s-%-7d [", own_name().c_str(), gettid_());
    EXPECT_EQ(lines[12].substr(0, std::strlen(prefix)), prefix);
    EXPECT_EQ(lines[12].substr(lines[12].size() - 9), ": ev: one");
    EXPECT_EQ(lines[13].substr(lines[13].size() - 9), ": ev: two");
    ring_clear();
    EXPECT_EQ(trace_text(print_text), trace_header(0, 0, online_cpus()));
}

TEST_F(TraceFiles, TracePipeConsumesAndBlocks) {
    write_text("ev: first");
    write_text("ev: second");
    const std::string got = trace_pipe_read(print_text, 1000, 1 << 20);
    const auto lines = lines_of(got);
    ASSERT_EQ(lines.size(), 2u);
    EXPECT_EQ(got.find("# tracer"), std::string::npos); // no header
    EXPECT_EQ(lines[1].substr(lines[1].size() - 12), ": ev: second");
    EXPECT_NE(trace_text(print_text).find("entries-written: 0/0 "), std::string::npos);

    // Empty: waits for the timeout, returns nothing.
    auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(trace_pipe_read(print_text, 100, 1 << 20), "");
    EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(100));

    // A record that arrives while it waits wakes it (by polling) well before the timeout.
    std::thread late([] {
        std::this_thread::sleep_for(std::chrono::milliseconds(150));
        write_text("ev: late");
    });
    t0 = std::chrono::steady_clock::now();
    const std::string l = trace_pipe_read(print_text, 5000, 1 << 20);
    const auto waited = std::chrono::steady_clock::now() - t0;
    late.join();
    EXPECT_NE(l.find(": ev: late\n"), std::string::npos);
    EXPECT_GE(waited, std::chrono::milliseconds(140));
    EXPECT_LT(waited, std::chrono::milliseconds(2000));
}

TEST_F(TraceFiles, TracePipeKeepsWhatDoesNotFitForTheNextRead) {
    write_text("ev: aaaa");
    write_text("ev: bbbb");
    const std::string all = trace_text(print_text);
    const auto lines = lines_of(all);
    ASSERT_EQ(lines.size(), 14u);
    const size_t one = lines[12].size() + 1;
    EXPECT_EQ(trace_pipe_read(print_text, 0, one + 5), lines[12] + "\n");
    EXPECT_EQ(trace_pipe_read(print_text, 0, 10), lines[13].substr(0, 10));
    EXPECT_EQ(trace_pipe_read(print_text, 0, 1 << 20), lines[13].substr(10) + "\n");
    EXPECT_EQ(trace_pipe_read(print_text, 0, 1 << 20), "");
}

TEST_F(TraceFiles, SnapshotFile) {
    EXPECT_NE(snapshot_text(print_text).find("# * Snapshot is freed *"), std::string::npos);
    write_text("ev: before");
    ASSERT_EQ(snapshot_take(), 0);
    write_text("ev: after");
    const std::string snap = snapshot_text(print_text);
    EXPECT_NE(snap.find("entries-written: 1/1 "), std::string::npos);
    EXPECT_NE(snap.find(": ev: before\n"), std::string::npos);
    EXPECT_EQ(snap.find("ev: after"), std::string::npos);
    const std::string trace = trace_text(print_text);
    EXPECT_NE(trace.find(": ev: after\n"), std::string::npos);
    EXPECT_EQ(trace.find("ev: before"), std::string::npos);
    snapshot_clear();
    EXPECT_NE(snapshot_text(print_text).find("# * Snapshot is allocated *"), std::string::npos);
    snapshot_free();
}

} // namespace
} // namespace ukp::trace
