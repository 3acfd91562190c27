// Watch-probe events (w:, the kernel's wprobetrace.rst) in the tracer: definitions and
// what kprobe_events shows of them, the wprobe tracer's errors with their carets, records
// of every write with $addr and $value, enable and disable, filters, kprobes/list, removal
// giving the debug register back, and threads started later.
#include <gtest/gtest.h>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <linux/perf_event.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "trace/events.hpp"
#include "trace_files.hpp"

#include <ukprobes/kprobes.h>

using namespace ukp::trace;
using namespace ukp::trace::test_files;

extern "C" {
alignas(8) volatile long ukw_counter;
alignas(8) volatile long ukw_other[4];

__attribute__((noinline)) void ukw_bump(long by) { ukw_counter = ukw_counter + by; }

struct UkwObject {
    volatile long state; // every store a store
    volatile long other;
};
__attribute__((noinline)) void ukw_born(UkwObject *o) { asm volatile("" ::"r"(o) : "memory"); }
__attribute__((noinline)) void ukw_dies(UkwObject *o) { asm volatile("" ::"r"(o) : "memory"); }
}

namespace {

std::string hex(const volatile void *p) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "0x%" PRIxPTR, reinterpret_cast<uintptr_t>(p));
    return buf;
}

class TraceWatch : public ::testing::Test {
protected:
    void SetUp() override {
        // A guest may have no debug registers: then no breakpoint can be had at all.
        perf_event_attr attr{};
        attr.type = PERF_TYPE_BREAKPOINT;
        attr.size = sizeof attr;
        attr.bp_addr = reinterpret_cast<uintptr_t>(&ukw_other[3]);
        attr.bp_len = 8;
        attr.bp_type = 2; // HW_BREAKPOINT_W
        attr.sample_period = 1;
        attr.exclude_kernel = 1;
        const long fd = syscall(SYS_perf_event_open, &attr, 0, -1, -1, PERF_FLAG_FD_CLOEXEC);
        if (fd < 0) GTEST_SKIP() << "no hardware breakpoints on this machine: " << strerror(errno);
        // Or breakpoints that are never hit (no debug registers behind the PMU).
        ukw_other[3] = ukw_other[3] + 1;
        uint64_t writes = 0;
        const bool counted = read(static_cast<int>(fd), &writes, sizeof writes) == sizeof writes;
        close(static_cast<int>(fd));
        if (counted && writes == 0) GTEST_SKIP() << "this machine's hardware breakpoints are never hit";
        ASSERT_EQ(file_write("events/enable", "0"), 0);
        ASSERT_EQ(file_write("dynamic_events", ""), 0);
        ASSERT_EQ(file_write("trace", ""), 0);
        ASSERT_EQ(file_write("error_log", ""), 0);
    }
    void TearDown() override {
        file_write("events/enable", "0");
        for (const char *e : {"born", "dies"}) file_write(std::string("events/kprobes/") + e + "/trigger", "");
        file_write("dynamic_events", "");
    }
};

TEST_F(TraceWatch, EveryWriteIsARecordWithItsValueAndItsWriter) {
    ASSERT_EQ(file_append("dynamic_events", "w:cnt w@ukw_counter:8 value=$value:s64 where=$addr"), 0)
        << read("error_log");
    EXPECT_EQ(read("dynamic_events"), "w:wprobes/cnt w@ukw_counter:8 value=$value:s64 where=$addr\n");
    EXPECT_EQ(read("kprobe_events"), read("dynamic_events"));
    ukw_bump(1); // not enabled: nothing
    ASSERT_EQ(file_write("events/wprobes/cnt/enable", "1"), 0);
    ukw_counter = 0;
    for (int i = 1; i <= 5; ++i) ukw_bump(i);
    (void)ukw_counter; // a read is no write
    ukw_other[0] = 9;  // nor is a neighbour's write
    ASSERT_EQ(file_write("events/wprobes/cnt/enable", "0"), 0);
    ukw_bump(100);
    const auto lines = trace_lines("cnt");
    ASSERT_EQ(lines.size(), 6u) << read("trace");
    const long want[] = {0, 1, 3, 6, 10, 15};
    for (size_t i = 0; i < lines.size(); ++i) {
        SCOPED_TRACE(lines[i]);
        EXPECT_NE(lines[i].find(" value=" + std::to_string(want[i]) + " where=" + hex(&ukw_counter)),
                  std::string::npos);
        // The writer, as the kernel prints it: the instruction after the write.
        if (i > 0) {
            EXPECT_NE(lines[i].find("cnt: (ukw_bump+0x"), std::string::npos);
        }
    }
    const std::string profile = read("kprobe_profile");
    EXPECT_NE(profile.find("cnt"), std::string::npos);
    EXPECT_NE(profile.find(" 6 "), std::string::npos) << profile;
}

TEST_F(TraceWatch, DefaultNamesAndTheAddressForm) {
    ASSERT_EQ(file_append("dynamic_events", "w w@ukw_counter:8"), 0) << read("error_log");
    ASSERT_EQ(file_append("dynamic_events", "w:g/at " + hex(&ukw_other[1]) + ":4 v=$value:u32"), -EINVAL);
    ASSERT_EQ(file_append("dynamic_events", "w:g/at @" + hex(&ukw_other[1]) + ":4 v=$value:u32"), 0)
        << read("error_log");
    ASSERT_EQ(file_append("dynamic_events", "w:unset rw@-1:8 a=$addr"), 0) << read("error_log");
    ASSERT_EQ(file_append("dynamic_events", "w:plus w@ukw_other+16:8"), 0) << read("error_log");
    EXPECT_EQ(read("dynamic_events"), "w:wprobes/ukw_counter w@ukw_counter:8\n"
                                      "w:g/at rw@" +
                                          hex(&ukw_other[1]) +
                                          ":4 v=$value:u32\n"
                                          "w:wprobes/unset rw@-1:8 a=$addr\n"
                                          "w:wprobes/plus w@ukw_other+16:8\n");
    ASSERT_EQ(file_write("events/enable", "1"), 0);
    ukw_other[1] = 7;        // rw: the write
    long sum = ukw_other[1]; // and the read
    ukw_other[2] = 3;        // plus: ukw_other+16
    ASSERT_EQ(file_write("events/enable", "0"), 0);
    EXPECT_EQ(trace_lines("at").size(), 2u) << read("trace");
    EXPECT_EQ(trace_lines("plus").size(), 1u) << read("trace");
    EXPECT_EQ(trace_lines("unset").size(), 0u);
    EXPECT_NE(trace_lines("at")[0].find(" v=7"), std::string::npos) << trace_lines("at")[0];
    (void)sum;
}

// Each rejected line: the wprobe tracer's message and caret, and nothing changed.
TEST_F(TraceWatch, TheWprobeTracersErrorsWithTheirCarets) {
    ASSERT_EQ(file_append("dynamic_events", "w:keep w@ukw_counter:8"), 0);
    const std::string before = read("dynamic_events");
    const std::string misaligned = "w:e w@" + hex(&ukw_other[0]) + "+2:4";
    struct Case {
        std::string line;
        size_t caret;
        const char *message;
    } cases[] = {
        {"w:e ukw_counter", 4, "Access memory address requires @"},
        {"w:e x@ukw_counter", 4, "Bad memory access type"},
        {"w:e w@ukw_counter:3", 18, "This memory access length is not supported"},
        {"w:e w@ukw_counter:16", 18, "This memory access length is not supported"},
        {"w:e w@no_such_variable:8", 6, "Invalid access memory address"},
        {"w:e w@ukw_counter+x:8", 17, "Invalid probed address or symbol"},
        {"w:e w@ukw_other+2:4", 6, "Invalid access memory address"},
        {"w:e w@0xffffffff81000000:8", 6, "Invalid access memory address"},
        {"w1:e w@ukw_counter", 1, "Maxactive is only for function exit"},
        {"w:e w@ukw_counter:8 $retval", 20, "$retval is not available on probe"},
        {"w:e w@ukw_counter:8 $arg1", 20, "$arg* can be used only on function entry or exit"},
        {"w:e w@ukw_counter:8 $addrx", 20, "Invalid $-variable specified"},
        {"w:keep w@ukw_counter:8 x=$value", 23, "Argument type or name is different from existing probe"},
    };
    (void)misaligned;
    for (const Case &c : cases) {
        SCOPED_TRACE(c.line);
        ASSERT_EQ(file_write("error_log", ""), 0);
        EXPECT_NE(file_append("dynamic_events", c.line), 0);
        EXPECT_EQ(read("dynamic_events"), before);
        const std::string log = read("error_log");
        const std::string want = "wprobe: error: " + std::string(c.message) + "\n  Command: " + c.line + "\n" +
                                 std::string(11 + c.caret, ' ') + "^\n";
        const size_t close = log.find("] ");
        ASSERT_NE(close, std::string::npos) << log;
        EXPECT_EQ(log.substr(close + 2), want);
    }
    // $value and $addr are a watch's: a kprobe has neither.
    ASSERT_EQ(file_write("error_log", ""), 0);
    EXPECT_NE(file_append("kprobe_events", "p:k ukw_bump v=$value"), 0);
    EXPECT_NE(read("error_log").find("trace_kprobe: error: Invalid $-variable specified"), std::string::npos);
}

TEST_F(TraceWatch, KprobesListShowsTheBreakpointAndItsState) {
    ASSERT_EQ(file_append("dynamic_events", "w:cnt w@ukw_counter:8"), 0) << read("error_log");
    auto list = [] {
        char *text = ukp_kprobes_list(); // the control socket's kprobes/list
        std::string s = text != nullptr ? text : "";
        free(text);
        return s;
    };
    auto row = [&] {
        std::istringstream in(list());
        for (std::string line; std::getline(in, line);)
            if (line.find("  w  ukw_counter+0x0  ") != std::string::npos) return line;
        return std::string();
    };
    const std::string addr = hex(&ukw_counter).substr(2);
    std::string r = row();
    ASSERT_FALSE(r.empty()) << list();
    EXPECT_EQ(r.substr(0, 16), std::string(16 - addr.size(), '0') + addr);
    EXPECT_NE(r.find(" w:8 [DISABLED]"), std::string::npos) << r;
    ASSERT_EQ(file_write("events/wprobes/cnt/enable", "1"), 0);
    r = row();
    EXPECT_NE(r.find(" w:8"), std::string::npos) << r;
    EXPECT_EQ(r.find("[DISABLED]"), std::string::npos) << r;
    ASSERT_EQ(file_write("events/wprobes/cnt/enable", "0"), 0);
    ASSERT_EQ(file_append("dynamic_events", "-:wprobes/cnt"), 0);
    EXPECT_TRUE(row().empty()) << list();
}

TEST_F(TraceWatch, AFifthWatchFailsAndARemovalGivesTheRegisterBack) {
    for (int i = 0; i < 4; ++i) {
        const std::string line = "w:w" + std::to_string(i) + " w@ukw_other+" + std::to_string(8 * i) + ":8";
        ASSERT_EQ(file_append("dynamic_events", line), 0) << line << read("error_log");
    }
    const std::string before = read("dynamic_events");
    EXPECT_EQ(file_append("dynamic_events", "w:w4 w@ukw_counter:8"), -ENOSPC);
    EXPECT_EQ(read("dynamic_events"), before);
    EXPECT_NE(read("error_log")
                  .find("wprobe: error: A thread has no debug register left (four each: the program's or "
                        "a debugger's hold them)"),
              std::string::npos)
        << read("error_log");
    ASSERT_EQ(file_append("dynamic_events", "-:wprobes/w2"), 0);
    EXPECT_EQ(file_append("dynamic_events", "w:w4 w@ukw_counter:8"), 0) << read("error_log");
}

TEST_F(TraceWatch, FiltersAndThreadsStartedLater) {
    ASSERT_EQ(file_append("dynamic_events", "w:cnt w@ukw_counter:8 value=$value:s64"), 0) << read("error_log");
    ASSERT_EQ(file_write("events/wprobes/cnt/filter", "value >= 100"), 0);
    ASSERT_EQ(file_write("events/wprobes/cnt/enable", "1"), 0);
    ukw_counter = 0;
    std::thread([] {
        for (int i = 0; i < 4; ++i) ukw_bump(50);
    }).join();
    ASSERT_EQ(file_write("events/wprobes/cnt/enable", "0"), 0);
    const auto lines = trace_lines("cnt");
    ASSERT_EQ(lines.size(), 3u) << read("trace");
    EXPECT_NE(lines[0].find(" value=100"), std::string::npos) << lines[0];
    EXPECT_NE(lines[2].find(" value=200"), std::string::npos) << lines[2];
}

// wprobetrace.rst's recipe, for a heap object: a watch at -1, set_wprobe on the event of
// its birth (its field holding the object's address), clear_wprobe on the event of its end.
// Only the writes of the object watched between the two are recorded, each once.
TEST_F(TraceWatch, SetWprobeFollowsAHeapObjectUntilItsEnd) {
    ASSERT_EQ(file_append("dynamic_events", "w:watch w@-1:8 address=$addr value=+0($addr):s64"), 0)
        << read("error_log");
    ASSERT_EQ(file_append("dynamic_events", "p:born ukw_born obj=%di:x64"), 0) << read("error_log");
    ASSERT_EQ(file_append("dynamic_events", "p:dies ukw_dies obj=%di:x64"), 0) << read("error_log");
    ASSERT_EQ(file_write("events/kprobes/born/trigger", "set_wprobe:watch:obj"), 0);
    ASSERT_EQ(file_write("events/kprobes/dies/trigger", "clear_wprobe:watch:obj"), 0);
    EXPECT_EQ(read("events/kprobes/born/trigger"), "set_wprobe:watch:obj+0\n");
    // Busy while its trigger moves it: not enabled by hand, not removed.
    ASSERT_EQ(file_write("events/kprobes/born/enable", "1"), 0);
    ASSERT_EQ(file_write("events/kprobes/dies/enable", "1"), 0);
    auto *a = new UkwObject{};
    auto *b = new UkwObject{};
    auto listed = [](const volatile void *p) {
        char *text = ukp_kprobes_list();
        const std::string addr = hex(p).substr(2);
        const bool found =
            std::string(text).find(std::string(16 - addr.size(), '0') + addr + "  w  ") != std::string::npos;
        free(text);
        return found;
    };
    EXPECT_FALSE(listed(&a->state)); // a watch at -1 watches nothing: no row
    ukw_born(a);
    EXPECT_TRUE(listed(&a->state));
    a->state = 1;
    b->state = 100; // not watched
    a->state = 2;
    a->other = 9; // the next word
    ukw_dies(b);  // not the watched one
    a->state = 3;
    EXPECT_EQ(file_append("dynamic_events", "-:wprobes/watch"), -EBUSY);
    ukw_dies(a);
    EXPECT_FALSE(listed(&a->state));
    a->state = 4; // no longer watched
    ukw_born(b);
    b->state = 101;
    ukw_dies(b);
    b->state = 102;
    ASSERT_EQ(file_write("events/kprobes/born/enable", "0"), 0);
    ASSERT_EQ(file_write("events/kprobes/dies/enable", "0"), 0);
    const auto lines = trace_lines("watch");
    ASSERT_EQ(lines.size(), 4u) << read("trace");
    const std::string want[] = {" address=" + hex(&a->state) + " value=1", " address=" + hex(&a->state) + " value=2",
                                " address=" + hex(&a->state) + " value=3", " address=" + hex(&b->state) + " value=101"};
    for (size_t i = 0; i < 4; ++i) EXPECT_NE(lines[i].find(want[i]), std::string::npos) << lines[i];
    // Removing the triggers stops the watch and lets the event go.
    ASSERT_EQ(file_write("events/kprobes/born/trigger", "!set_wprobe:watch:obj"), 0);
    ASSERT_EQ(file_write("events/kprobes/dies/trigger", "!clear_wprobe:watch:obj"), 0);
    EXPECT_EQ(file_append("dynamic_events", "-:wprobes/watch"), 0);
    delete a;
    delete b;
}

} // namespace
