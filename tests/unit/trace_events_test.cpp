// The event files wired to filters, triggers and the ring: a filter decides what is
// recorded, a bad filter keeps the old one, triggers act on hits, symstr forms.
#include <gtest/gtest.h>

#include <dirent.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdint>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <ukprobes/kprobes.h>

#include "arch/x86_64/detour.hpp"
#include "jumps.h"
#include "platform/fork_mark.hpp"
#include "trace/counters.hpp"
#include "trace/events.hpp"
#include "trace_files.hpp"
#include "trace/profile_table.hpp"
#include "trace/ring.hpp"
#include "trace_target.h"

using namespace ukp::trace;
using namespace ukp::trace::test_files;

namespace {

long (*volatile g_triple)(long) = ttarget_triple;
long (*volatile g_pointer)(const char *) = ttarget_pointer;

size_t count_events(const std::string &name) {
    std::istringstream in(read("trace"));
    std::string line;
    size_t n = 0;
    while (std::getline(in, line))
        if (line[0] != '#' && line.find(" " + name + ": (") != std::string::npos) ++n;
    return n;
}

class TraceEvents : public ::testing::Test {
protected:
    void SetUp() override {
        ASSERT_EQ(file_write("events/enable", "0"), 0);
        for (const char *e : {"flt", "other"}) {
            std::string p = std::string("events/kprobes/") + e + "/trigger";
            std::string t;
            if (file_read(p, &t) == 0) file_write(p, "");
        }
        ASSERT_EQ(file_write("kprobe_events", ""), 0);
        ASSERT_EQ(file_write("trace", ""), 0);
        ASSERT_EQ(file_write("tracing_on", "1"), 0);
    }
    void TearDown() override {
        file_write("tracing_on", "1");
        file_write("events/enable", "0");
    }
};

TEST_F(TraceEvents, FilterDecidesWhatIsRecorded) {
    ASSERT_EQ(file_write("kprobe_events", "p:flt ttarget_triple x=%di:s64"), 0);
    EXPECT_EQ(read("events/kprobes/flt/filter"), "none\n");
    ASSERT_EQ(file_write("events/kprobes/flt/filter", "x > 10"), 0);
    ASSERT_EQ(file_write("events/kprobes/flt/enable", "1"), 0);
    g_triple(5);
    g_triple(20);
    g_triple(-3);
    EXPECT_EQ(count_events("flt"), 1u) << read("trace");
    EXPECT_NE(read("trace").find("x=20"), std::string::npos);
    // A bad filter is refused with a message; the old one stays.
    ASSERT_EQ(file_write("error_log", ""), 0);
    EXPECT_EQ(file_write("events/kprobes/flt/filter", "nosuchfield == 1"), -EINVAL);
    EXPECT_EQ(read("events/kprobes/flt/filter"), "x > 10\n");
    EXPECT_FALSE(read("error_log").empty());
    ASSERT_EQ(file_write("events/kprobes/flt/filter", "0"), 0);
    g_triple(1);
    EXPECT_EQ(count_events("flt"), 2u);
    char want[128];
    snprintf(want, sizeof want, "  %-44s %15d %15d\n", "flt", 4, 0);
    EXPECT_EQ(read("kprobe_profile"), want);
}

TEST_F(TraceEvents, TriggersActOnHits) {
    ASSERT_EQ(file_write("kprobe_events", "p:flt ttarget_triple x=%di:s64"), 0);
    ASSERT_EQ(file_append("kprobe_events", "p:other ttarget_pointer s=+0(%di):string"), 0);
    ASSERT_EQ(file_write("events/kprobes/flt/trigger", "enable_event:kprobes:other if x == 7"), 0);
    ASSERT_EQ(file_write("events/kprobes/flt/enable", "1"), 0);
    g_pointer(ttarget_greeting);
    EXPECT_EQ(count_events("other"), 0u);
    g_triple(7);
    EXPECT_EQ(read("events/kprobes/other/enable"), "1\n");
    g_pointer(ttarget_greeting);
    EXPECT_EQ(count_events("other"), 1u);
    EXPECT_NE(read("trace").find("s=\"hello\""), std::string::npos);

    ASSERT_EQ(file_append("events/kprobes/flt/trigger", "traceoff if x == 9"), 0);
    g_triple(9);
    EXPECT_EQ(read("tracing_on"), "0\n");
    ASSERT_EQ(file_write("events/kprobes/flt/trigger", "!traceoff if x == 9"), 0);
    ASSERT_EQ(file_write("events/kprobes/flt/trigger", "!enable_event:kprobes:other if x == 7"), 0);
    ASSERT_EQ(file_write("events/kprobes/other/enable", "0"), 0);
}

TEST_F(TraceEvents, HistogramFileShowsKeys) {
    ASSERT_EQ(file_write("kprobe_events", "p:flt ttarget_triple x=%di:s64"), 0);
    ASSERT_EQ(file_write("events/kprobes/flt/trigger", "hist:keys=x"), 0);
    g_triple(3);
    g_triple(3);
    g_triple(4);
    const std::string hist = read("events/kprobes/flt/hist");
    EXPECT_NE(hist.find("x:"), std::string::npos) << hist;
    EXPECT_NE(hist.find("hitcount:          2"), std::string::npos) << hist;
    // A disabled event with a trigger records nothing in the trace.
    EXPECT_EQ(count_events("flt"), 0u);
    ASSERT_EQ(file_write("events/kprobes/flt/trigger", "!hist:keys=x"), 0);
}

// The trigger file opened to truncate (`echo ... >`) drops the event's hist, enable_hist
// and disable_hist triggers first, as the kernel's; the others stay, and appending
// (`>>`) drops nothing. A hist error is logged at "hist:GRP:EVENT".
TEST_F(TraceEvents, TruncatingTheTriggerFileRemovesItsHistTriggers) {
    ASSERT_EQ(file_write("kprobe_events", "p:flt ttarget_triple x=%di:s64"), 0);
    ASSERT_EQ(file_append("kprobe_events", "p:other ttarget_triple y=%di:s64"), 0);
    ASSERT_EQ(file_write("events/kprobes/flt/trigger", "hist:keys=x"), 0);
    ASSERT_EQ(file_append("events/kprobes/flt/trigger", "hist:keys=common_pid"), 0);
    ASSERT_EQ(file_append("events/kprobes/flt/trigger", "traceoff if x == 1000"), 0);
    ASSERT_EQ(file_append("events/kprobes/flt/trigger", "enable_hist:kprobes:other"), 0);
    EXPECT_EQ(read("events/kprobes/flt/trigger"),
              "enable_hist:kprobes:other:unlimited\n"
              "traceoff:unlimited if x == 1000\n"
              "hist:keys=x:vals=hitcount:sort=hitcount:size=2048 [active]\n"
              "hist:keys=common_pid:vals=hitcount:sort=hitcount:size=2048 [active]\n");
    ASSERT_EQ(file_write("events/kprobes/flt/trigger", "hist:keys=x:vals=x"), 0);
    EXPECT_EQ(read("events/kprobes/flt/trigger"), "traceoff:unlimited if x == 1000\n"
                                                  "hist:keys=x:vals=hitcount,x:sort=hitcount:size=2048 [active]\n");
    g_triple(5);
    EXPECT_NE(read("events/kprobes/flt/hist").find("{ x:          5 } hitcount:          1  x:          5\n"),
              std::string::npos)
        << read("events/kprobes/flt/hist");
    ASSERT_EQ(file_write("error_log", ""), 0);
    EXPECT_EQ(file_write("events/kprobes/flt/trigger", "hist:keys=nosuch"), -EINVAL);
    expect_logged("hist:kprobes:flt", "Couldn't find field", "hist:keys=nosuch", 10);
    EXPECT_EQ(read("events/kprobes/flt/trigger"), "traceoff:unlimited if x == 1000\n");
    ASSERT_EQ(file_write("events/kprobes/flt/trigger", "!traceoff if x == 1000"), 0);
}

TEST_F(TraceEvents, TracePipeConsumes) {
    ASSERT_EQ(file_write("kprobe_events", "p:flt ttarget_triple x=%di:s64"), 0);
    ASSERT_EQ(file_write("events/kprobes/flt/enable", "1"), 0);
    g_triple(31);
    const std::string first = pipe_read(1000, 1 << 20);
    EXPECT_NE(first.find("flt: ("), std::string::npos) << first;
    EXPECT_NE(first.find("x=31\n"), std::string::npos) << first;
    EXPECT_EQ(pipe_read(0, 1 << 20), "");
}

TEST_F(TraceEvents, StacktraceTriggerRecordsTheUserStack) {
    ASSERT_EQ(file_write("kprobe_events", "p:flt ttarget_triple x=%di:s64"), 0);
    ASSERT_EQ(file_write("events/kprobes/flt/enable", "1"), 0);
    ASSERT_EQ(file_write("events/kprobes/flt/trigger", "stacktrace if x == 77"), 0);
    g_triple(76);
    g_triple(77);
    const std::string trace = read("trace");
    EXPECT_EQ(count_events("flt"), 2u) << trace;
    const size_t at = trace.find("<user stack trace>\n => ttarget_triple+0x");
    ASSERT_NE(at, std::string::npos) << trace;
    // The next frame is the caller of ttarget_triple: this test's body.
    EXPECT_NE(trace.find("\n => _ZN", at), std::string::npos) << trace;
    ASSERT_EQ(file_write("events/kprobes/flt/trigger", "!stacktrace if x == 77"), 0);
}

TEST_F(TraceEvents, ForkChildRecordsItsOwnThreadId) {
    ASSERT_EQ(file_write("kprobe_events", "p:flt ttarget_triple x=%di:s64"), 0);
    ASSERT_EQ(file_write("events/kprobes/flt/enable", "1"), 0);
    g_triple(1); // the parent's thread id is cached now
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
        file_write("trace", "");
        g_triple(2);
        std::string t;
        file_read("trace", &t);
        const std::string me = "-" + std::to_string(getpid()) + " ";
        _exit(t.find(me) != std::string::npos && t.find("x=2") != std::string::npos ? 0 : 1);
    }
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 0);
}

// kprobe_profile as a reader in another process reads it (ukprobe run, for a child of
// fork() that serves no socket, or a process killed by a signal): from the memfd of the
// shared counters (counters.hpp), mapped.
std::string profile_from_memfd(int fd, std::string *why) {
    struct stat st {};
    if (fd < 0 || fstat(fd, &st) != 0) return "no counters";
    void *p = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return "not mapped";
    std::string text = read_profile(static_cast<const uint8_t *>(p), static_cast<size_t>(st.st_size), why);
    munmap(p, static_cast<size_t>(st.st_size));
    return text;
}

std::string profile_through_the_table(std::string *why) { return profile_from_memfd(counters_memfd_copy(), why); }

// The memfd of `pid`'s own shared counters, taken with pidfd_getfd (its parent may), or -1.
int counters_of_process(pid_t pid) {
    const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
    if (pidfd < 0) return -1;
    int found = -1;
    const std::string dir = "/proc/" + std::to_string(pid) + "/fd";
    DIR *d = opendir(dir.c_str());
    while (d != nullptr && found < 0) {
        const dirent *e = readdir(d);
        if (e == nullptr) break;
        char link[128] = {};
        if (readlink((dir + "/" + e->d_name).c_str(), link, sizeof link - 1) <= 0 ||
            strncmp(link, "/memfd:ukprobes-counters", 24) != 0)
            continue;
        const int fd = static_cast<int>(syscall(SYS_pidfd_getfd, pidfd, atoi(e->d_name), 0));
        CountersHeader h{};
        if (fd >= 0 && pread(fd, &h, offsetof(CountersHeader, table_seq), 0) > 0 && h.pid == pid)
            found = fd;
        else if (fd >= 0)
            close(fd);
    }
    if (d != nullptr) closedir(d);
    close(pidfd);
    return found;
}

TEST_F(TraceEvents, TheCounterTableReadsAsKprobeProfileDoes) {
    ASSERT_EQ(file_write("kprobe_events", "p:flt ttarget_triple x=%di:s64"), 0);
    ASSERT_EQ(file_append("kprobe_events", "p:other ttarget_pointer s=+0(%di):string"), 0);
    ASSERT_EQ(file_append("kprobe_events", "r:back ttarget_triple"), 0);
    for (const char *e : {"flt", "other", "back"})
        ASSERT_EQ(file_write(std::string("events/kprobes/") + e + "/enable", "1"), 0);
    std::vector<std::thread> threads;
    for (int t = 0; t < 3; ++t)
        threads.emplace_back([t] {
            cpu_set_t one; // hits on every CPU: the hit count is kept per CPU
            CPU_ZERO(&one);
            CPU_SET(t % std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)), &one);
            pthread_setaffinity_np(pthread_self(), sizeof one, &one);
            for (int i = 0; i <= t; ++i) g_triple(i);
        });
    for (auto &t : threads) t.join();
    g_pointer(ttarget_greeting);
    g_pointer(reinterpret_cast<const char *>(8)); // a fault: a miss
    std::string why;
    const std::string table = profile_through_the_table(&why);
    const std::string file = read("kprobe_profile");
    EXPECT_EQ(table, file) << why;
    char want[256];
    snprintf(want, sizeof want, "  %-44s %15d %15d\n  %-44s %15d %15d\n  %-44s %15d %15d\n", "flt", 6, 0, "other", 2, 1,
             "back", 6, 0);
    EXPECT_EQ(file, want);
    // Removed events leave the table.
    for (const char *e : {"flt", "other", "back"})
        ASSERT_EQ(file_write(std::string("events/kprobes/") + e + "/enable", "0"), 0);
    ASSERT_EQ(file_append("kprobe_events", "-:other"), 0);
    EXPECT_EQ(profile_through_the_table(&why), read("kprobe_profile")) << why;
    EXPECT_EQ(read("kprobe_profile").find("other"), std::string::npos);
}

// A return event is a kretprobe: its jump leads to the kretprobe's own detour. Without
// $argN it has no entry_handler, and the detour's trampoline does its entry alone (the
// core's shortest way in); with $argN its entry handler saves them, through the usual
// trampoline, after which the stub calls the function. Both see their values.
TEST_F(TraceEvents, AReturnEventTakesTheKretprobesDetour) {
    const void *fn = reinterpret_cast<const void *>(ttarget_triple);
    ASSERT_EQ(file_write("kprobe_events", "r:back ttarget_triple ret=$retval:s64"), 0);
    ASSERT_EQ(file_write("events/kprobes/back/enable", "1"), 0);
    ukp_optimizer_flush();
    EXPECT_EQ(jumped_trampoline(fn), reinterpret_cast<uint64_t>(&ukp_kret_entry_trampoline));
    std::thread([] {
        for (long i = 0; i < 100; ++i) g_triple(i); // the thread's first by the usual way
    }).join();
    EXPECT_EQ(count_events("back"), 100u);
    EXPECT_NE(read("trace").find(" ret=297\n"), std::string::npos) << "ttarget_triple(99)";
    ASSERT_EQ(file_write("events/kprobes/back/enable", "0"), 0);

    ASSERT_EQ(file_write("kprobe_events", "r:args ttarget_triple x=$arg1:s64 ret=$retval:s64"), 0);
    ASSERT_EQ(file_write("events/kprobes/args/enable", "1"), 0);
    ukp_optimizer_flush();
    EXPECT_EQ(jumped_trampoline(fn), reinterpret_cast<uint64_t>(&ukp_kret_entry_trampoline));
    g_triple(7);
    EXPECT_NE(read("trace").find(" x=7 ret=21\n"), std::string::npos) << read("trace");
    ASSERT_EQ(file_write("events/kprobes/args/enable", "0"), 0);
}

// Shared counters as a process lays them out, in a buffer of this test: the header, then
// a table at kCountersFirstBlock, then one counter after it.
struct FakeCounters {
    alignas(64) uint8_t mem[8192] = {};
    CountersHeader *hdr() { return reinterpret_cast<CountersHeader *>(mem); }
    uint64_t *counter() { return reinterpret_cast<uint64_t *>(mem + 6144); }
    FakeCounters() {
        hdr()->magic = kCountersMagic;
        hdr()->version = kCountersVersion;
        hdr()->base = reinterpret_cast<uint64_t>(mem);
        hdr()->size = sizeof mem;
    }
    void publish(const std::vector<uint8_t> &t) {
        memcpy(mem + kCountersFirstBlock, t.data(), t.size());
        hdr()->table_off = kCountersFirstBlock;
        hdr()->table_size = t.size();
    }
};

TEST_F(TraceEvents, TheCounterTableReaderRefusesWhatIsNoTable) {
    std::string why;
    EXPECT_EQ(read_profile(nullptr, 0, &why), "");
    EXPECT_EQ(why, "the process shares no counters");
    FakeCounters f;
    f.hdr()->version = 99;
    EXPECT_EQ(read_profile(f.mem, sizeof f.mem, &why), "");
    EXPECT_EQ(why, "the process's counters are not of this version");
    f.hdr()->version = kCountersVersion;
    EXPECT_EQ(read_profile(f.mem, sizeof f.mem, &why), "");
    EXPECT_EQ(why, "the process publishes no counter table");
    // A good one: a hit count of 5 in the shared memory.
    ProfileTableBuilder good;
    good.add_event("here");
    good.add_counter(f.counter(), 8, 1, 0, false);
    *f.counter() = 5;
    f.publish(good.finish());
    EXPECT_EQ(read_profile(f.mem, sizeof f.mem, &why), profile_line("here", 5, 0)) << why;
    // Mapped smaller than the process says it is.
    EXPECT_EQ(read_profile(f.mem, 4096, &why), "");
    EXPECT_EQ(why, "the process's counters are not of this version");
    // A table changing for ever (table_seq odd) is given up, not waited for.
    f.hdr()->table_seq = 1;
    EXPECT_EQ(read_profile(f.mem, sizeof f.mem, &why), "");
    EXPECT_EQ(why, "the process's counter table kept changing while it was read");
    f.hdr()->table_seq = 2;
    // Junk where the table is.
    const uint64_t junk[8] = {0x1234, 99, 7, 7};
    f.publish(
        std::vector<uint8_t>(reinterpret_cast<const uint8_t *>(junk), reinterpret_cast<const uint8_t *>(junk + 8)));
    EXPECT_EQ(read_profile(f.mem, sizeof f.mem, &why), "");
    EXPECT_EQ(why, "the process's counter table is not valid");
    // A table that lists a counter outside the shared memory (the heap: no room there), or
    // running past its end.
    for (const uint64_t at : {uint64_t{16}, reinterpret_cast<uint64_t>(f.mem) + sizeof f.mem - 8}) {
        ProfileTableBuilder b;
        b.add_event("gone");
        b.add_counter(reinterpret_cast<const void *>(at), 8, 2, 8, false);
        f.publish(b.finish());
        EXPECT_EQ(read_profile(f.mem, sizeof f.mem, &why), "");
        EXPECT_EQ(why, "the process keeps a counter outside its shared counters");
    }
}

// A child of fork() killed by a signal: its counts stay readable in the memfd its parent
// took from it, and are its own (the parent's do not move).
TEST_F(TraceEvents, AKilledChildsCountsOutliveIt) {
    ASSERT_EQ(file_write("kprobe_events", "p:flt ttarget_triple x=%di:s64"), 0);
    ASSERT_EQ(file_write("events/kprobes/flt/enable", "1"), 0);
    g_triple(1);
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
        for (int i = 0; i < 3; ++i) g_triple(i);
        raise(SIGSTOP);
        for (int i = 0; i < 4; ++i) g_triple(i);
        raise(SIGKILL);
        _exit(1);
    }
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, WUNTRACED), child);
    ASSERT_TRUE(WIFSTOPPED(status));
    const int fd = counters_of_process(child);
    kill(child, SIGCONT);
    ASSERT_EQ(waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFSIGNALED(status));
    ASSERT_GE(fd, 0);
    std::string why;
    EXPECT_EQ(profile_from_memfd(fd, &why), profile_line("flt", 7, 0)) << why;
    EXPECT_EQ(read("kprobe_profile"), profile_line("flt", 1, 0));
    EXPECT_EQ(profile_through_the_table(&why), profile_line("flt", 1, 0)) << why;
}

// The child of a fork() counts its own hits from 0, as its ring holds its own records:
// added up with its parent's, the counts are the kernel's (one for all processes).
TEST_F(TraceEvents, AForkedChildCountsItsOwnHits) {
    ASSERT_EQ(file_write("kprobe_events", "p:flt ttarget_triple x=%di:s64"), 0);
    ASSERT_EQ(file_write("events/kprobes/flt/enable", "1"), 0);
    g_triple(1);
    g_triple(2);
    char two[128], one[128], zero[128];
    snprintf(two, sizeof two, "  %-44s %15d %15d\n", "flt", 2, 0);
    snprintf(one, sizeof one, "  %-44s %15d %15d\n", "flt", 1, 0);
    snprintf(zero, sizeof zero, "  %-44s %15d %15d\n", "flt", 0, 0);
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
        std::string p, why;
        file_read("kprobe_profile", &p);
        if (p != zero) _exit(1);
        g_triple(3);
        file_read("kprobe_profile", &p);
        if (p != one) _exit(2);
        // Its own ring's header names the same table.
        if (profile_through_the_table(&why) != one) _exit(3);
        _exit(0);
    }
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 0);
    EXPECT_EQ(read("kprobe_profile"), two);
}

// A child made by a fork() that runs no handler (_Fork, the raw system call) shares the
// parent's ring and counters: its hits leave them alone, and the parent's trace stays
// exact. Before, they counted in the parent's kprobe_profile and wrote into its buffers,
// at the same time as the parent (a parent's writer spun for good in the buffer they
// left).
TEST_F(TraceEvents, AChildForkedWithoutTheHandlersLeavesTheParentsTraceAlone) {
    ASSERT_TRUE(ukp::platform::fork_mark_wiped_in_children());
    ASSERT_EQ(file_write("kprobe_events", "p:flt ttarget_triple x=%di:s64"), 0);
    ASSERT_EQ(file_write("events/kprobes/flt/enable", "1"), 0);
    long parents = 0;
    for (const bool raw : {false, true}) {
        const pid_t child = raw ? static_cast<pid_t>(syscall(SYS_fork)) : _Fork();
        ASSERT_GE(child, 0);
        if (child == 0) {
            // No handler ran: the mark is clear here, and set in the parent.
            if (ukp::platform::process_known()) _exit(1);
            for (int i = 0; i < 3000; ++i) g_triple(i);
            _exit(0);
        }
        for (int i = 0; i < 3000; ++i, ++parents) g_triple(i);
        int status = 0;
        ASSERT_EQ(waitpid(child, &status, 0), child);
        ASSERT_TRUE(WIFEXITED(status));
        EXPECT_EQ(WEXITSTATUS(status), 0);
    }
    EXPECT_TRUE(ukp::platform::process_known());
    EXPECT_EQ(read("kprobe_profile"), profile_line("flt", static_cast<int>(parents), 0));
    // The default buffers hold them all: every record is the parent's.
    EXPECT_EQ(count_events("flt"), static_cast<size_t>(parents));
    std::istringstream in(read("trace"));
    const std::string mine = "-" + std::to_string(getpid()) + " ";
    size_t others = 0;
    for (std::string line; std::getline(in, line);)
        if (line[0] != '#' && line.find(" flt: (") != std::string::npos && line.find(mine) == std::string::npos)
            ++others;
    EXPECT_EQ(others, 0u);
}

TEST_F(TraceEvents, ThreadsHitAtOnce) {
    ASSERT_EQ(file_write("kprobe_events", "p:flt ttarget_triple x=%di:s64 c=$comm"), 0);
    ASSERT_EQ(file_write("events/kprobes/flt/enable", "1"), 0);
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t)
        threads.emplace_back([t] {
            pthread_setname_np(pthread_self(), ("hitter" + std::to_string(t)).c_str());
            // On every CPU in turn: kprobe_profile's count is kept per CPU.
            cpu_set_t one;
            CPU_ZERO(&one);
            CPU_SET(t % std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)), &one);
            pthread_setaffinity_np(pthread_self(), sizeof one, &one);
            for (int i = 0; i < 500; ++i) g_triple(i);
        });
    for (auto &t : threads) t.join();
    char want[128];
    snprintf(want, sizeof want, "  %-44s %15d %15d\n", "flt", 2000, 0);
    EXPECT_EQ(read("kprobe_profile"), want);
    const std::string trace = read("trace");
    for (int t = 0; t < 4; ++t)
        EXPECT_NE(trace.find("x=499 c=\"hitter" + std::to_string(t) + "\""), std::string::npos) << t;
}

// Writing 0 to enable waits for the hits already in the event's handler (as the kernel's
// disable_trace_kprobe waits for a grace period): each is recorded, and kprobe_profile
// and the trace agree after every disable. More threads than CPUs call the function
// without a pause, so that some are preempted inside the handler when enable goes to 0:
// before, such a hit was counted after the flag went down and recorded nothing.
TEST_F(TraceEvents, DisablingLetsTheHitsInFlightFinishRecorded) {
    ASSERT_EQ(file_write("kprobe_events", "p:flt ttarget_triple x=%di:s64"), 0);
    std::atomic<bool> stop{false};
    std::vector<std::thread> threads;
    const long cpus = std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
    for (long t = 0; t < 3 * cpus; ++t)
        threads.emplace_back([&stop] {
            for (long i = 0; !stop.load(std::memory_order_relaxed); ++i) g_triple(i);
        });
    const auto header_written = [](const std::string &trace) -> uint64_t {
        const std::string key = "# entries-in-buffer/entries-written: ";
        const size_t at = trace.find(key);
        if (at == std::string::npos) return UINT64_MAX;
        return std::strtoull(trace.c_str() + trace.find('/', at + key.size()) + 1, nullptr, 10);
    };
    int disagreed = 0;
    std::string first;
    uint64_t hits = 0;
    for (int round = 0; round < 20; ++round) {
        ASSERT_EQ(file_write("events/kprobes/flt/enable", "1"), 0);
        usleep(2000);
        ASSERT_EQ(file_write("events/kprobes/flt/enable", "0"), 0);
        const std::string profile = read("kprobe_profile");
        hits = std::strtoull(profile.c_str() + profile.find("flt") + 3, nullptr, 10);
        const uint64_t written = header_written(read("trace"));
        if (written != hits && disagreed++ == 0)
            first = "round " + std::to_string(round) + ": " + std::to_string(hits) + " hits, " +
                    std::to_string(written) + " written";
    }
    stop = true;
    for (auto &t : threads) t.join();
    EXPECT_EQ(disagreed, 0) << first;
    EXPECT_GT(hits, 0u);
}

TEST_F(TraceEvents, SnapshotTriggerSwapsFromTheHit) {
    ASSERT_EQ(file_write("kprobe_events", "p:flt ttarget_triple x=%di:s64"), 0);
    ASSERT_EQ(file_write("events/kprobes/flt/enable", "1"), 0);
    ASSERT_EQ(file_write("events/kprobes/flt/trigger", "snapshot if x == 55"), 0);
    g_triple(54);
    g_triple(55);
    const std::string snap = read("snapshot");
    EXPECT_NE(snap.find("x=54"), std::string::npos) << snap;
    ASSERT_EQ(file_write("events/kprobes/flt/trigger", "!snapshot if x == 55"), 0);
    ASSERT_EQ(file_write("snapshot", "0"), 0);
}

TEST_F(TraceEvents, DynamicEventsAndUnknownFiles) {
    ASSERT_EQ(file_write("dynamic_events", "p:dyn ttarget_triple"), 0);
    EXPECT_EQ(read("dynamic_events"), "p:kprobes/dyn ttarget_triple\n");
    std::string out;
    EXPECT_EQ(file_read("events/kprobes/dyn/nosuch", &out), -ENOENT);
    EXPECT_EQ(file_read("nosuch", &out), -ENOENT);
    EXPECT_EQ(file_write("events/kprobes/dyn/enable", "2"), -EINVAL);
    EXPECT_EQ(file_append("dynamic_events", "-:dyn"), 0);
    EXPECT_EQ(read("kprobe_events"), "");
}

TEST_F(TraceEvents, AvailableEventsListsGroupAndName) {
    EXPECT_EQ(read("available_events"), "");
    ASSERT_EQ(file_append("kprobe_events", "p:grp_a/one ttarget_triple\nr:two ttarget_triple"), 0);
    // A second probe point of an event is not a second event.
    ASSERT_EQ(file_append("kprobe_events", "p:grp_a/one ttarget_pointer"), 0);
    EXPECT_EQ(read("available_events"), "grp_a:one\nkprobes:two\n");
    EXPECT_EQ(file_write("available_events", "x"), -EACCES);
    ASSERT_EQ(file_append("kprobe_events", "-:grp_a/one"), 0);
    EXPECT_EQ(read("available_events"), "kprobes:two\n");
}

} // namespace
