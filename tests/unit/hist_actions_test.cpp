// Hist handlers onmax($VAR) and onchange($VAR) with the actions save(FIELD,...) and
// snapshot() (histogram.rst 2.2.3), on a probe whose arguments give the key, the tracked
// value and a string: the hist file's lines checked as the kernel prints them.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "null_trigger_host.hpp"
#include "trace/events.hpp"
#include "trace/hist_table.hpp"
#include "trace/trigger.hpp"
#include "trace_files.hpp"

#include <ukprobes/kprobes.h>

using namespace ukp::trace;
using namespace ukp::trace::test_files;

extern "C" __attribute__((noinline)) long uka_work(long key, unsigned long value, const char *name) {
    __asm__ volatile("" ::: "memory");
    return key + long(value) + (name != nullptr);
}

namespace {

long (*volatile g_work)(long, unsigned long, const char *) = uka_work;

constexpr const char *kEvent = "events/acts/work/";

// The kernel's entry lines: "{ key: N } hitcount: N" (the key an s64, printed %10llu).
std::string entry(long key, uint64_t hits) {
    char buf[128];
    std::snprintf(buf, sizeof buf, "{ key: %10" PRIu64 " } hitcount: %10" PRIu64, uint64_t(key), hits);
    return buf;
}
std::string num(const char *name, uint64_t v) {
    char buf[128];
    std::snprintf(buf, sizeof buf, "  %s: %10" PRIu64, name, v);
    return buf;
}
std::string str(const char *name, const char *s) {
    char buf[128];
    std::snprintf(buf, sizeof buf, "  %s: %-32s", name, s);
    return buf;
}
std::string track(const char *what, uint64_t v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "\n\t%s: %10" PRIu64, what, v);
    return buf;
}

// The hist file's entries and what follows them, without the header and the totals.
std::string body(const std::string &hist) {
    const size_t start = hist.find("#\n\n");
    const size_t end = hist.find("\nTotals:");
    EXPECT_NE(start, std::string::npos) << hist;
    EXPECT_NE(end, std::string::npos) << hist;
    if (start == std::string::npos || end == std::string::npos) return hist;
    return hist.substr(start + 3, end - start - 3);
}

class HistActions : public CleanTracer {
protected:
    void SetUp() override {
        CleanTracer::SetUp();
        ASSERT_EQ(file_append("dynamic_events", "p:acts/work uka_work key=%di:s64 value=%si:u64 name=+0(%dx):string"),
                  0)
            << read("error_log");
    }
    void TearDown() override {
        file_write("events/enable", "0");
        for (const std::string &t : installed) file_append((std::string(kEvent) + "trigger").c_str(), "!" + t);
        file_write("snapshot", "0");
        CleanTracer::TearDown();
    }
    int add_trigger(const std::string &t) {
        const int r = file_append((std::string(kEvent) + "trigger").c_str(), t);
        if (r == 0) installed.push_back(t);
        return r;
    }
    std::string hist() { return read((std::string(kEvent) + "hist").c_str()); }
    std::vector<std::string> installed;
};

TEST_F(HistActions, OnmaxSavesTheFieldsOfEachKeysLargestValue) {
    ASSERT_EQ(add_trigger("hist:keys=key:v=value:onmax($v).save(value,name,common_pid)"), 0) << read("error_log");
    // As the kernel's trigger file prints it: the action after size.
    EXPECT_EQ(read("events/acts/work/trigger"), "hist:keys=key:vals=hitcount:v=value:sort=hitcount:size=2048:"
                                                "onmax($v).save(value,name,common_pid) [active]\n");
    g_work(1, 5, "a5");
    g_work(1, 9, "a9");
    g_work(1, 7, "a7");
    g_work(2, 3, "b3");
    g_work(2, 3, "b3-again"); // not larger: the first 3 stays
    g_work(2, 1, "b1");
    g_work(2, 1, "b1");
    const uint64_t pid = uint64_t(getpid());
    const std::string want = entry(1, 3) + track("max", 9) + num("value", 9) + str("name", "a9") +
                             num("common_pid", pid) + "\n" + entry(2, 4) + track("max", 3) + num("value", 3) +
                             str("name", "b3") + num("common_pid", pid) + "\n";
    const std::string h = hist();
    EXPECT_EQ(body(h), want) << h;
    EXPECT_NE(h.find("# trigger info: hist:keys=key:vals=hitcount:v=value:sort=hitcount:size=2048:onmax($v).save("
                     "value,name,common_pid) [active]\n"),
              std::string::npos)
        << h;
    EXPECT_NE(h.find("\nTotals:\n    Hits: 7\n    Entries: 2\n    Dropped: 0\n"), std::string::npos) << h;
}

TEST_F(HistActions, OnchangeSavesOnEveryChangeOfTheValue) {
    ASSERT_EQ(add_trigger("hist:keys=key:v=value:onchange($v).save(name,$v)"), 0) << read("error_log");
    g_work(1, 4, "p");
    g_work(1, 4, "q"); // unchanged
    g_work(1, 6, "r");
    g_work(1, 4, "s"); // smaller, but a change
    g_work(1, 4, "t");
    // The tracked value starts at 0: a first 0 is no change, nothing is saved (the kernel
    // prints the string it never set as its null pointer).
    g_work(3, 0, "zero");
    // Sorted by hitcount, ascending.
    const std::string want = entry(3, 1) + track("changed", 0) + str("name", "(null)") + num("$v", 0) + "\n" +
                             entry(1, 5) + track("changed", 4) + str("name", "s") + num("$v", 4) + "\n";
    const std::string h = hist();
    EXPECT_EQ(body(h), want) << h;
}

TEST_F(HistActions, OnmaxSnapshotSwapsWhenTheLargestValueOfAllKeysRises) {
    ASSERT_EQ(add_trigger("hist:keys=key:v=value:onmax($v).snapshot()"), 0) << read("error_log");
    ASSERT_EQ(file_write("events/acts/work/enable", "1"), 0);
    g_work(1, 10, "first");
    g_work(2, 20, "second");
    g_work(1, 15, "third"); // key 1's largest, not the largest of all: no snapshot
    ASSERT_EQ(file_write("events/acts/work/enable", "0"), 0);
    const std::string snap = read("snapshot");
    EXPECT_NE(snap.find("value=20 name=\"second\""), std::string::npos) << snap;
    EXPECT_EQ(snap.find("value=15"), std::string::npos) << snap;
    EXPECT_NE(read("trace").find("value=15 name=\"third\""), std::string::npos) << read("trace");
    // snapshot() prints no line per entry, and what the snapshot was taken for at the end.
    const std::string want = entry(2, 1) + "\n" + entry(1, 2) +
                             "\n\nSnapshot taken (see tracing/snapshot).  Details:\n"
                             "\ttriggering value { onmax($v) }:         20\t"
                             "triggered by event with key: { key:          2 }\n";
    const std::string h = hist();
    EXPECT_EQ(body(h), want) << h;
    // One conditional snapshot for the trace: a second trigger's is refused, nothing logged.
    ASSERT_EQ(file_write("error_log", ""), 0);
    EXPECT_EQ(file_append("events/acts/work/trigger", "hist:keys=value:v=key:onchange($v).snapshot()"), -EBUSY);
    EXPECT_EQ(read("error_log"), "");
    EXPECT_EQ(read("events/acts/work/trigger"),
              "hist:keys=key:vals=hitcount:v=value:sort=hitcount:size=2048:onmax($v).snapshot() [active]\n");
}

TEST_F(HistActions, OnchangeSnapshotAndSaveTogether) {
    ASSERT_EQ(add_trigger("hist:keys=key:v=value:onchange($v).save(name):onchange($v).snapshot()"), 0)
        << read("error_log");
    ASSERT_EQ(file_write("events/acts/work/enable", "1"), 0);
    g_work(7, 1, "one");
    g_work(7, 1, "one-again");
    g_work(8, 2, "two");
    g_work(7, 3, "three");
    ASSERT_EQ(file_write("events/acts/work/enable", "0"), 0);
    EXPECT_NE(read("snapshot").find("value=3 name=\"three\""), std::string::npos) << read("snapshot");
    const std::string want = entry(8, 1) + track("changed", 2) + str("name", "two") + "\n" + entry(7, 3) +
                             track("changed", 3) + str("name", "three") +
                             "\n\nSnapshot taken (see tracing/snapshot).  Details:\n"
                             "\ttriggering value { onchange($v) }:          3\t"
                             "triggered by event with key: { key:          7 }\n";
    EXPECT_EQ(body(hist()), want) << hist();
}

TEST_F(HistActions, RemovingTheTriggerGivesUpTheSnapshot) {
    const std::string t = "hist:keys=key:v=value:onmax($v).save(name):onmax($v).snapshot()";
    ASSERT_EQ(file_append("events/acts/work/trigger", t), 0) << read("error_log");
    g_work(1, 1, "x");
    ASSERT_EQ(file_append("events/acts/work/trigger", "!" + t), 0) << read("error_log");
    EXPECT_EQ(read("events/acts/work/trigger"), "# Available triggers:\n"
                                                "# traceon traceoff snapshot stacktrace enable_event disable_event "
                                                "enable_hist disable_hist hist set_wprobe clear_wprobe\n");
    // Another trigger may have the snapshot now.
    ASSERT_EQ(add_trigger("hist:keys=value:w=key:onchange($w).snapshot()"), 0) << read("error_log");
    // pause and cont of the installed one are not a second snapshot().
    ASSERT_EQ(file_append("events/acts/work/trigger", "hist:keys=value:w=key:onchange($w).snapshot():pause"), 0);
    EXPECT_NE(read("events/acts/work/trigger").find("onchange($w).snapshot() [paused]"), std::string::npos);
    ASSERT_EQ(file_append("events/acts/work/trigger", "hist:keys=value:w=key:onchange($w).snapshot():cont"), 0);
}

TEST_F(HistActions, ErrorsAreTheKernels) {
    struct Case {
        const char *trigger, *message;
        int caret; // in the trigger as written
    } cases[] = {
        {"hist:keys=key:v=value:onmax(v).save(name)", "For onmax(x) or onchange(x), x must be a variable", 28},
        {"hist:keys=key:v=value:onmax($nosuch).save(name)", "Couldn't find onmax or onchange variable", 29},
        {"hist:keys=key:v=value:onchange($v).save(nosuch)", "Couldn't create field variable", 40},
        {"hist:keys=key:v=value:onmax($v).save(a,name)", "Invalid action param", 37},
        {"hist:keys=key:v=value:onmax($v).save(name):onmax($v).save(key)",
         "Can't have more than one save() action per hist", 43},
        {"hist:keys=key:v=value:onmax($v).snapshot(", "No closing paren found", 41},
        {"hist:keys=key:v=value:onmax($v).save(name", "No closing paren found", 37},
        {"hist:keys=key:v=value:onmax($v)", "No action found", 31},
        {"hist:keys=key:v=value:onmax($v", "No closing paren found", 22},
        {"hist:keys=key:v=value:onmatch(acts.work).save(name)", "Handler doesn't support action", 41},
        {"hist:keys=key:v=value:onmax($v).nosuch(name)", "Couldn't find synthetic event", 32},
    };
    for (const Case &c : cases) {
        SCOPED_TRACE(c.trigger);
        ASSERT_EQ(file_write("error_log", ""), 0);
        EXPECT_EQ(file_append("events/acts/work/trigger", c.trigger), -EINVAL);
        expect_logged("hist:acts:work", c.message, c.trigger, size_t(c.caret));
    }
    // Nothing was installed, no snapshot claimed.
    EXPECT_EQ(read("events/acts/work/trigger").rfind("# Available triggers:", 0), 0u);
    EXPECT_EQ(add_trigger("hist:keys=key:v=value:onmax($v).snapshot()"), 0) << read("error_log");
}

// Threads raising one key's largest value at once: the largest wins, exactly, and the
// fields saved are those of one hit of the key (a value and its double, saved together),
// never a mix. They are the largest one's but when its hit found another hit of the key
// still writing, preempted, and gave up (docs/tracer.md): not checked, a thread here may be.
TEST(HistActionsThreads, TheSavedFieldsAreThoseOfTheLargestValue) {
    test_hosts::NullHost host;
    std::vector<Field> fields = common_fields();
    fields.push_back({"k", "u64", 8, 8, false, Print::kUnsigned});
    fields.push_back({"aa", "u64", 16, 8, false, Print::kUnsigned});
    fields.push_back({"bb", "u64", 24, 8, false, Print::kUnsigned});
    TriggerSet set;
    set.set_owner("g.e");
    FilterError err;
    ASSERT_EQ(set.write("hist:keys=k:v=aa:onmax($v).save(aa,bb)", fields, host, &err), 0) << err.message;
    constexpr int kThreads = 8, kHits = 20000;
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t)
        threads.emplace_back([&, t] {
            struct pt_regs regs {};
            uint8_t rec[32] = {};
            for (int i = 0; i < kHits; ++i) {
                const uint64_t k = uint64_t(i % 4), a = uint64_t(i) * kThreads + uint64_t(t), b = a * 2;
                __builtin_memcpy(rec + 8, &k, 8);
                __builtin_memcpy(rec + 16, &a, 8);
                __builtin_memcpy(rec + 24, &b, 8);
                set.fire(rec, sizeof rec, "hitter", regs);
            }
        });
    for (auto &th : threads) th.join();
    const std::string h = set.hist_text();
    for (uint64_t k = 0; k < 4; ++k) {
        SCOPED_TRACE(k);
        char head[128];
        std::snprintf(head, sizeof head, "{ k: %10" PRIu64 " } hitcount: %10d\n\tmax: ", k, kThreads * kHits / 4);
        const size_t at = h.find(head);
        ASSERT_NE(at, std::string::npos) << head << h;
        uint64_t max = 0, aa = 0, bb = 0;
        ASSERT_EQ(std::sscanf(h.c_str() + at + std::strlen(head), "%" SCNu64 "  aa: %" SCNu64 "  bb: %" SCNu64, &max,
                              &aa, &bb),
                  3)
            << h;
        // The largest aa of key k: the last i with i % 4 == k, from the last thread.
        EXPECT_EQ(max, (uint64_t(kHits) - 4 + k) * kThreads + kThreads - 1) << h;
        EXPECT_EQ(bb, aa * 2) << h;
        EXPECT_EQ(aa / kThreads % 4, k) << h;
        EXPECT_LE(aa, max) << h;
    }
}

} // namespace
