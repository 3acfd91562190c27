// Hist variables, actions and synthetic events (histogram.rst): the kernel's
// wakeup-latency recipe written for a function's entry and exit events gives the latency
// histogram of that function.
#include <gtest/gtest.h>
#include <ukprobes/kprobes.h>

#include <time.h>

#include <cerrno>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "trace/events.hpp"
#include "trace_files.hpp"

using namespace ukp::trace;
using namespace ukp::trace::test_files;

// Sleeps usecs, all of them: a sleep the agent's optimizer interrupts (EINTR, reference.md,
// "Jump optimization", Limits) goes on for the rest, as careful programs do.
extern "C" __attribute__((noinline)) int ukh_sleep(long usecs) {
    struct timespec t = {0, usecs * 1000};
    int r;
    while ((r = nanosleep(&t, &t)) == -1 && errno == EINTR) {
    }
    return r;
}

extern "C" __attribute__((noinline)) long ukh_values(long a, long b) {
    asm volatile("" ::: "memory");
    return a + b;
}

extern "C" __attribute__((noinline)) long ukh_caller_a(long v) {
    long r = ukh_values(v, 1);
    asm volatile("" : "+r"(r)::"memory");
    return r;
}
extern "C" __attribute__((noinline)) long ukh_caller_b(long v) {
    long r = ukh_values(v, 2);
    asm volatile("" : "+r"(r)::"memory");
    return r;
}

namespace {

int (*volatile g_sleep)(long) = ukh_sleep;
long (*volatile g_values)(long, long) = ukh_values;

// The recipe's triggers: the time kept at the entry, the latency computed at the exit and
// passed to the synthetic event sleep_latency, and the synthetic event's histogram.
const std::string kEntryTrigger = "hist:keys=common_pid:ts0=common_timestamp.usecs";
const std::string kExitTrigger = "hist:keys=common_pid:lat=common_timestamp.usecs-$ts0:"
                                 "onmatch(fprobes.ukh_sleep__entry).sleep_latency($lat,common_pid)";
const std::string kLatencyTrigger = "hist:keys=lat.buckets=1000000:sort=lat";

class HistVars : public CleanTracer {
protected:
    void SetUp() override {
        CleanTracer::SetUp();
        ASSERT_EQ(file_append("dynamic_events", "f ukh_sleep"), 0) << read("error_log");
        ASSERT_EQ(file_append("dynamic_events", "f ukh_sleep%return"), 0) << read("error_log");
    }
    void TearDown() override {
        file_write("events/enable", "0");
        file_write("events/synthetic/sleep_latency/trigger", "!" + kLatencyTrigger);
        file_write("events/fprobes/ukh_sleep__exit/trigger", "!" + kExitTrigger);
        file_write("events/fprobes/ukh_sleep__entry/trigger", "!" + kEntryTrigger);
        CleanTracer::TearDown();
    }
    // The entry's and the exit's triggers (the synthetic event defined first).
    static void install_entry_and_exit() {
        ASSERT_EQ(file_write("events/fprobes/ukh_sleep__entry/trigger", kEntryTrigger), 0) << read("error_log");
        ASSERT_EQ(file_write("events/fprobes/ukh_sleep__exit/trigger", kExitTrigger), 0) << read("error_log");
    }
};

// histogram.rst's wakeup_latency recipe with the event names changed: a synthetic event,
// a variable on the entry, the latency computed on the exit and passed on by onmatch, a
// histogram of the synthetic event.
TEST_F(HistVars, TheWakeupLatencyRecipeOnAFunctionsEntryAndExit) {
    ASSERT_EQ(file_append("synthetic_events", "sleep_latency u64 lat; pid_t pid"), 0) << read("error_log");
    EXPECT_EQ(read("synthetic_events"), "sleep_latency u64 lat; pid_t pid\n");
    const std::string format = read("events/synthetic/sleep_latency/format");
    EXPECT_NE(format.find("field:u64 lat;"), std::string::npos) << format;
    EXPECT_NE(format.find("field:pid_t pid;"), std::string::npos) << format;
    // The kernel's layout: each field in a u64 slot; its print fmt, synth_field_fmt()'s.
    EXPECT_NE(format.find("field:u64 lat;\toffset:8;\tsize:8;\tsigned:0;"), std::string::npos) << format;
    EXPECT_NE(format.find("field:pid_t pid;\toffset:16;\tsize:4;\tsigned:1;"), std::string::npos) << format;
    EXPECT_NE(format.find("print fmt: \"lat=%llu, pid=%d\", REC->lat, REC->pid"), std::string::npos) << format;
    ASSERT_NO_FATAL_FAILURE(install_entry_and_exit());
    EXPECT_EQ(read("events/fprobes/ukh_sleep__exit/trigger"),
              "hist:keys=common_pid:vals=hitcount:lat=common_timestamp.usecs-$ts0:sort=hitcount:size=2048:clock=global:"
              "onmatch(fprobes.ukh_sleep__entry).sleep_latency($lat,common_pid) [active]\n");
    // Buckets of a second: whatever the machine's load, every sleep here is in the first.
    ASSERT_EQ(file_write("events/synthetic/sleep_latency/trigger", kLatencyTrigger), 0) << read("error_log");
    ASSERT_EQ(file_write("events/synthetic/sleep_latency/enable", "1"), 0);
    // The entry's probe and the exit's on the jump path: both handlers called from it.
    ukp_optimizer_flush();
    char *list = ukp_kprobes_list();
    const std::string probes = list != nullptr ? list : "";
    std::free(list);
    EXPECT_EQ(lines_with(probes, "ukh_sleep+0x0").size(), 2u) << probes;
    EXPECT_EQ(lines_with(probes, "[OPTIMIZED]").size(), 2u) << probes;
    for (int i = 0; i < 3; ++i) g_sleep(2000);
    g_sleep(20000);
    ASSERT_EQ(file_write("events/synthetic/sleep_latency/enable", "0"), 0);
    const std::string hist = read("events/synthetic/sleep_latency/hist");
    EXPECT_EQ(lines_with(hist, "{ lat: ~ 0-999999 } hitcount:          4").size(), 1u) << hist;
    // The synthetic event's records: the latency (at least the sleep's) and the thread.
    const auto recs = lines_with(read("trace"), " sleep_latency: lat=");
    ASSERT_EQ(recs.size(), 4u) << read("trace");
    const std::string pid = " pid=" + std::to_string(gettid());
    for (size_t i = 0; i < recs.size(); ++i) {
        EXPECT_NE(recs[i].find(pid), std::string::npos) << recs[i];
        const unsigned long lat = std::stoul(recs[i].substr(recs[i].find("lat=") + 4));
        EXPECT_GE(lat, i < 3 ? 2000u : 20000u) << recs[i];
        EXPECT_LT(lat, 1000000u) << recs[i];
    }
    // The exit's histogram counts the exits whose entry was seen.
    EXPECT_NE(read("events/fprobes/ukh_sleep__exit/hist").find("hitcount:          4"), std::string::npos);
    // The entry's trigger file opened to truncate takes nothing out while the exit's
    // trigger reads its variable (the kernel's hist_file_check_refs()): the write that
    // follows names the trigger that is still there.
    EXPECT_EQ(file_write("events/fprobes/ukh_sleep__entry/trigger", "hist:keys=common_pid:ts0=common_timestamp.usecs"),
              -EEXIST);
    EXPECT_NE(read("events/fprobes/ukh_sleep__entry/trigger").find(":ts0=common_timestamp.usecs:"), std::string::npos);
}

// The recipe with four threads at once: each thread's calls meet only its own elements of
// the tables keyed by common_pid (written without locked adds, hist_table.hpp), and every
// call is counted, once, in each table.
TEST_F(HistVars, EveryCallOfManyThreadsIsCountedOnceInEachTable) {
    ASSERT_EQ(file_append("synthetic_events", "sleep_latency u64 lat; pid_t pid"), 0) << read("error_log");
    ASSERT_NO_FATAL_FAILURE(install_entry_and_exit());
    ASSERT_EQ(file_write("events/synthetic/sleep_latency/trigger", kLatencyTrigger), 0) << read("error_log");
    constexpr int kThreads = 4, kCalls = 20000;
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t)
        threads.emplace_back([] {
            for (int i = 0; i < kCalls; ++i) g_sleep(0);
        });
    for (auto &t : threads) t.join();
    const std::string calls = "hitcount:      " + std::to_string(kCalls);
    for (const char *ev : {"ukh_sleep__entry", "ukh_sleep__exit"}) {
        const std::string hist = read((std::string("events/fprobes/") + ev + "/hist").c_str());
        const auto lines = lines_with(hist, "{ common_pid: ");
        EXPECT_EQ(lines.size(), size_t(kThreads)) << hist;
        for (const std::string &l : lines) EXPECT_TRUE(l.ends_with(calls)) << l;
        EXPECT_NE(hist.find("Hits: " + std::to_string(kThreads * kCalls) + "\n"), std::string::npos) << hist;
    }
    const std::string lat = read("events/synthetic/sleep_latency/hist");
    EXPECT_NE(lat.find("hitcount:      " + std::to_string(kThreads * kCalls) + "\n"), std::string::npos) << lat;
}

// histogram.rst's wakeup_latency example as it is written there, event and field names
// changed: the entry keyed by $saved_pid (a variable that is a field: the key is the
// field), the exit passing the entry's $saved_pid on with its own field.
TEST_F(HistVars, TheWakeupLatencyExampleWithAKeyNamedByAVariable) {
    ASSERT_EQ(file_append("synthetic_events", "wakeup_latency u64 lat; pid_t pid; int prio"), 0) << read("error_log");
    const std::string entry = "hist:keys=$saved_pid:saved_pid=common_pid:ts0=common_timestamp.usecs";
    const std::string exit = "hist:keys=common_pid:wakeup_lat=common_timestamp.usecs-$ts0:"
                             "onmatch(fprobes.ukh_sleep__entry).wakeup_latency($wakeup_lat,$saved_pid,common_pid)";
    ASSERT_EQ(file_write("events/fprobes/ukh_sleep__entry/trigger", entry), 0) << read("error_log");
    EXPECT_EQ(read("events/fprobes/ukh_sleep__entry/trigger"),
              "hist:keys=common_pid:vals=hitcount:saved_pid=common_pid,ts0=common_timestamp.usecs:sort=hitcount:"
              "size=2048:clock=global [active]\n");
    ASSERT_EQ(file_write("events/fprobes/ukh_sleep__exit/trigger", exit), 0) << read("error_log");
    ASSERT_EQ(
        file_write("events/synthetic/wakeup_latency/trigger", "hist:keys=pid,prio,lat.buckets=1000000:sort=pid,lat"), 0)
        << read("error_log");
    for (int i = 0; i < 3; ++i) g_sleep(100);
    const std::string tid = std::to_string(gettid()), pad(10 - tid.size(), ' ');
    const std::string hist = read("events/synthetic/wakeup_latency/hist");
    EXPECT_EQ(
        lines_with(hist, "{ pid: " + pad + tid + ", prio: " + pad + tid + ", lat: ~ 0-999999 } hitcount:          3")
            .size(),
        1u)
        << hist;
    ASSERT_EQ(
        file_write("events/synthetic/wakeup_latency/trigger", "!hist:keys=pid,prio,lat.buckets=1000000:sort=pid,lat"),
        0);
    ASSERT_EQ(file_write("events/fprobes/ukh_sleep__exit/trigger", "!" + exit), 0);
    ASSERT_EQ(file_write("events/fprobes/ukh_sleep__entry/trigger", "!" + entry), 0);
    // A key may not name a variable that is more than a field, as the kernel's.
    const std::string expr_key = "hist:keys=$t:t=common_timestamp.usecs";
    ASSERT_EQ(file_write("error_log", ""), 0);
    EXPECT_EQ(file_write("events/fprobes/ukh_sleep__entry/trigger", expr_key), -EINVAL);
    expect_logged("hist:fprobes:ukh_sleep__entry", "Using variable references in keys not supported", expr_key, 10);
}

// histogram.rst's fully-qualified names: 'system.event_name.$var_name' for a variable of
// another event's trigger, 'system.event_name.field' for a field of this event.
TEST_F(HistVars, FullyQualifiedNamesOfVariablesAndFields) {
    ASSERT_EQ(file_append("synthetic_events", "sleep_latency u64 lat; pid_t pid"), 0) << read("error_log");
    ASSERT_EQ(file_write("events/fprobes/ukh_sleep__entry/trigger", "hist:keys=common_pid:ts0=common_timestamp.usecs"),
              0)
        << read("error_log");
    const std::string exit = "hist:keys=common_pid:lat=common_timestamp.usecs-fprobes.ukh_sleep__entry.$ts0:"
                             "onmatch(fprobes.ukh_sleep__entry).sleep_latency($lat,fprobes.ukh_sleep__exit.common_pid)";
    ASSERT_EQ(file_write("events/fprobes/ukh_sleep__exit/trigger", exit), 0) << read("error_log");
    ASSERT_EQ(file_write("events/synthetic/sleep_latency/trigger", "hist:keys=pid,lat.buckets=1000000:sort=lat"), 0)
        << read("error_log");
    g_sleep(100);
    g_sleep(100);
    const std::string hist = read("events/synthetic/sleep_latency/hist");
    EXPECT_EQ(lines_with(hist, "{ pid: " + std::string(10 - std::to_string(gettid()).size(), ' ') +
                                   std::to_string(gettid()) + ", lat: ~ 0-999999 } hitcount:          2")
                  .size(),
              1u)
        << hist;
    ASSERT_EQ(file_write("events/fprobes/ukh_sleep__exit/trigger", "!" + exit), 0);
    ASSERT_EQ(file_write("events/synthetic/sleep_latency/trigger", "!hist:keys=pid,lat.buckets=1000000:sort=lat"), 0);
    ASSERT_EQ(file_write("error_log", ""), 0);
    EXPECT_EQ(file_write("events/fprobes/ukh_sleep__exit/trigger",
                         "hist:keys=common_pid:lat=common_timestamp.usecs-fprobes.nosuch.$ts0"),
              -EINVAL);
    EXPECT_NE(read("error_log").find("Couldn't find variable"), std::string::npos) << read("error_log");
}

// An exit without its entry's variable set (its entry was before the trigger) updates
// nothing; a variable is read once.
TEST_F(HistVars, AReferenceNeedsTheVariableSetForTheKeyAndReadsItOnce) {
    ASSERT_EQ(file_append("synthetic_events", "sleep_latency u64 lat; pid_t pid"), 0);
    ASSERT_EQ(file_write("events/fprobes/ukh_sleep__exit/trigger",
                         "hist:keys=common_pid:lat=common_timestamp.usecs-$ts0:"
                         "onmatch(fprobes.ukh_sleep__entry).sleep_latency($lat,common_pid)"),
              -EINVAL); // ts0 is not defined yet
    EXPECT_NE(read("error_log").find("Couldn't find variable"), std::string::npos) << read("error_log");
    ASSERT_EQ(file_write("events/fprobes/ukh_sleep__entry/trigger", "hist:keys=common_pid:ts0=common_timestamp.usecs"),
              0);
    ASSERT_EQ(file_write("events/fprobes/ukh_sleep__exit/trigger",
                         "hist:keys=common_pid:lat=common_timestamp.usecs-$ts0:"
                         "onmatch(fprobes.ukh_sleep__entry).sleep_latency($lat,common_pid)"),
              0)
        << read("error_log");
    g_sleep(10);
    g_sleep(10);
    EXPECT_NE(read("events/fprobes/ukh_sleep__exit/hist").find("Hits: 2\n"), std::string::npos);
    // The entry's trigger cannot go while the exit's reads its variable.
    EXPECT_EQ(file_write("events/fprobes/ukh_sleep__entry/trigger", "!hist:keys=common_pid:ts0=common_timestamp.usecs"),
              -EBUSY);
    EXPECT_EQ(file_append("synthetic_events", "!sleep_latency"), -EBUSY); // an action fires it
}

TEST_F(HistVars, ErrorsOfVariablesActionsAndSyntheticEvents) {
    ASSERT_EQ(file_append("synthetic_events", "sleep_latency u64 lat; pid_t pid"), 0);
    ASSERT_EQ(file_write("events/fprobes/ukh_sleep__entry/trigger", "hist:keys=common_pid:ts0=common_timestamp.usecs"),
              0);
    struct Case {
        const char *trigger, *message;
    } cases[] = {
        {"hist:keys=common_pid:lat=common_timestamp.usecs-$nosuch", "Couldn't find variable"},
        {"hist:keys=common_pid:a=common_pid:a=common_pid", "Variable already defined"},
        {"hist:keys=common_pid:lat=common_timestamp.usecs-$ts0:onmatch(fprobes.ukh_sleep__entry).nosuch($lat)",
         "Couldn't find synthetic event"},
        {"hist:keys=common_pid:lat=common_timestamp.usecs-$ts0:onmatch(fprobes.ukh_sleep__entry).sleep_latency($lat)",
         "Param count doesn't match synthetic event field count"},
        {"hist:keys=common_pid:lat=common_timestamp.usecs-$ts0:onmatch(fprobes.nosuch).sleep_latency($lat,common_pid)",
         "Invalid subsystem or event name"},
        {"hist:keys=common_pid:lat=common_timestamp.usecs-$ts0:onmatch(fprobes.ukh_sleep__entry",
         "No closing paren found"},
        {"hist:keys=common_pid:lat=nosuch_field", "Couldn't find field"},
    };
    for (const Case &c : cases) {
        SCOPED_TRACE(c.trigger);
        ASSERT_EQ(file_write("error_log", ""), 0);
        EXPECT_EQ(file_write("events/fprobes/ukh_sleep__exit/trigger", c.trigger), -EINVAL);
        EXPECT_NE(read("error_log").find(c.message), std::string::npos) << read("error_log");
    }
    // Units of common_timestamp that differ (ts0 is in microseconds), the caret at the
    // command's start; a constant divisor of 0, the caret where its product starts, -EDOM:
    // the kernel's check_expr_operands() and parse_expr().
    const std::string mixed = "hist:keys=common_pid:lat=common_timestamp-$ts0";
    ASSERT_EQ(file_write("error_log", ""), 0);
    EXPECT_EQ(file_write("events/fprobes/ukh_sleep__exit/trigger", mixed), -EINVAL);
    expect_logged("hist:fprobes:ukh_sleep__exit", "Timestamp units in expression don't match", mixed, 0);
    const std::string by_zero = "hist:keys=common_pid:x=common_pid+common_pid*2/0";
    ASSERT_EQ(file_write("error_log", ""), 0);
    EXPECT_EQ(file_write("events/fprobes/ukh_sleep__exit/trigger", by_zero), -EDOM);
    expect_logged("hist:fprobes:ukh_sleep__exit", "Division by zero", by_zero, by_zero.find("common_pid*"));
    // onmatch() without a subsystem, or naming no event: the caret where the kernel puts it.
    const std::string no_subsystem = "hist:keys=common_pid:lat=common_timestamp.usecs-$ts0:"
                                     "onmatch(ukh_sleep__entry).sleep_latency($lat,common_pid)";
    ASSERT_EQ(file_write("error_log", ""), 0);
    EXPECT_EQ(file_write("events/fprobes/ukh_sleep__exit/trigger", no_subsystem), -EINVAL);
    expect_logged("hist:fprobes:ukh_sleep__exit", "Missing subsystem", no_subsystem,
                  no_subsystem.find("ukh_sleep__entry"));
    const std::string no_event = "hist:keys=common_pid:lat=common_timestamp.usecs-$ts0:"
                                 "onmatch(fprobes.nosuch).sleep_latency($lat,common_pid)";
    ASSERT_EQ(file_write("error_log", ""), 0);
    EXPECT_EQ(file_write("events/fprobes/ukh_sleep__exit/trigger", no_event), -EINVAL);
    expect_logged("hist:fprobes:ukh_sleep__exit", "Invalid subsystem or event name", no_event, no_event.find("nosuch"));
    ASSERT_EQ(file_write("events/fprobes/ukh_sleep__exit/trigger", "hist:keys=common_pid:x=common_pid/2"), 0)
        << read("error_log");
    ASSERT_EQ(file_write("events/fprobes/ukh_sleep__exit/trigger", "!hist:keys=common_pid:x=common_pid/2"), 0);
    struct Synth {
        const char *line, *message;
    } synth[] = {
        {"sleep_latency u64 x", "Event already exists"},
        {"bad-name u64 x", "Illegal name"},
        {"other u65 x", "Invalid type"},
        {"other u64", "Incomplete type"},
        {"other u64 x; u32 x", "Invalid field"},
    };
    for (const Synth &s : synth) {
        SCOPED_TRACE(s.line);
        ASSERT_EQ(file_write("error_log", ""), 0);
        EXPECT_EQ(file_append("synthetic_events", s.line), -EINVAL);
        EXPECT_NE(read("error_log").find("synthetic_events: error: " + std::string(s.message)), std::string::npos)
            << read("error_log");
    }
    EXPECT_EQ(read("synthetic_events"), "sleep_latency u64 lat; pid_t pid\n");
    // The dynamic_events form.
    ASSERT_EQ(file_append("dynamic_events", "s:synthetic/other u32 a; s64 b"), 0) << read("error_log");
    EXPECT_NE(read("dynamic_events").find("s:synthetic/other u32 a; s64 b\n"), std::string::npos);
    ASSERT_EQ(file_append("dynamic_events", "-:synthetic/other"), 0);
    EXPECT_EQ(read("synthetic_events"), "sleep_latency u64 lat; pid_t pid\n");
    // The kernel's other field types: char and unsigned char (a byte each), gfp_t.
    ASSERT_EQ(file_append("synthetic_events", "kinds char c; unsigned char uc; gfp_t g"), 0) << read("error_log");
    const std::string format = read("events/synthetic/kinds/format");
    for (const char *f : {"field:char c;", "field:unsigned char uc;", "field:gfp_t g;"})
        EXPECT_NE(format.find(f), std::string::npos) << format;
    EXPECT_NE(format.find("size:1;\tsigned:1;"), std::string::npos) << format;
    EXPECT_NE(format.find("size:1;\tsigned:0;"), std::string::npos) << format;
    ASSERT_EQ(file_append("synthetic_events", "!kinds"), 0);
}

} // namespace

namespace {

// Expressions with * and / (histogram.rst: "+-*/"): * and / before + and -, each left to
// right, a division by zero -1. The variables' values are shown by onmax().save().
TEST_F(HistVars, ExpressionsMultiplyAndDivide) {
    ASSERT_EQ(file_append("kprobe_events", "p:ex ukh_values aa=%di:u64 bb=%si:u64"), 0) << read("error_log");
    const std::string sum = "hist:keys=aa,bb:r=aa*bb+aa/bb-2:onmax($r).save(aa,bb)";
    const std::string ltr = "hist:keys=aa:q=aa/bb*bb:onmax($q).save(bb)";
    ASSERT_EQ(file_write("events/kprobes/ex/trigger", sum), 0) << read("error_log");
    ASSERT_EQ(file_append("events/kprobes/ex/trigger", ltr), 0) << read("error_log");
    EXPECT_EQ(g_values(7, 2), 9);
    EXPECT_EQ(g_values(10, 0), 10);
    EXPECT_EQ(g_values(20, 4), 24);
    const std::string hist = read("events/kprobes/ex/hist");
    // 7*2 + 7/2 - 2 = 15; 10*0 + (10/0 = -1) - 2 = 2^64 - 3; 20*4 + 20/4 - 2 = 83.
    EXPECT_NE(hist.find("\tmax:         15  aa:          7  bb:          2"), std::string::npos) << hist;
    EXPECT_NE(hist.find("\tmax: 18446744073709551613  aa:         10  bb:          0"), std::string::npos) << hist;
    EXPECT_NE(hist.find("\tmax:         83  aa:         20  bb:          4"), std::string::npos) << hist;
    // (7/2)*2 = 6, not 7/(2*2) = 1; (20/4)*4 = 20.
    EXPECT_NE(hist.find("\tmax:          6  bb:          2"), std::string::npos) << hist;
    EXPECT_NE(hist.find("\tmax:         20  bb:          4"), std::string::npos) << hist;
    // The kernel limits the depth of the expression's tree to three levels below its root:
    // a chain of four operands reaches it, one of five passes it (its first operand, where
    // the caret goes).
    ASSERT_EQ(file_append("events/kprobes/ex/trigger", "hist:keys=aa:t=aa*bb*aa*bb"), 0) << read("error_log");
    ASSERT_EQ(file_append("events/kprobes/ex/trigger", "!hist:keys=aa:t=aa*bb*aa*bb"), 0);
    ASSERT_EQ(file_write("error_log", ""), 0);
    EXPECT_EQ(file_append("events/kprobes/ex/trigger", "hist:keys=aa:t=aa+bb-aa+bb-aa"), -EINVAL);
    EXPECT_NE(read("error_log")
                  .find("Too many subexpressions (3 max)\n  Command: hist:keys=aa:t=aa+bb-aa+bb-aa\n" +
                        std::string(11 + 15, ' ') + "^"),
              std::string::npos)
        << read("error_log");
    ASSERT_EQ(file_append("events/kprobes/ex/trigger", "!" + sum), 0);
    ASSERT_EQ(file_append("events/kprobes/ex/trigger", "!" + ltr), 0);
    // Unary minus, histogram.rst's -(EXPR): the whole expression negated (unsigned, as the
    // kernel's), and nowhere inside one.
    const std::string neg = "hist:keys=aa:vals=$n:n=-(aa*bb)";
    ASSERT_EQ(file_append("events/kprobes/ex/trigger", neg), 0) << read("error_log");
    EXPECT_EQ(g_values(7, 2), 9);
    EXPECT_NE(read("events/kprobes/ex/hist").find("{ aa:          7 } hitcount:          1  n: 18446744073709551602\n"),
              std::string::npos)
        << read("events/kprobes/ex/hist");
    ASSERT_EQ(file_append("events/kprobes/ex/trigger", "!" + neg), 0);
    const std::string nested = "hist:keys=aa:n=aa-(-(bb))";
    ASSERT_EQ(file_write("error_log", ""), 0);
    EXPECT_EQ(file_append("events/kprobes/ex/trigger", nested), -EINVAL);
    expect_logged("hist:kprobes:ex", "Unary minus not supported in sub-expressions", nested, nested.find("-("));
}

} // namespace

namespace {

// keys=common_stacktrace (histogram.rst; "stacktrace" before 6.5): an entry per stack,
// printed a line per address as the kernel prints one: here the probed function (+0x1, the
// address after the int3, as the kernel's regs->ip at a kprobe), then the caller (the
// return address at the entry), as far as frame pointers lead.
TEST_F(HistVars, KeysByTheStack) {
    ASSERT_EQ(file_append("kprobe_events", "p:st ukh_values"), 0) << read("error_log");
    ASSERT_EQ(file_write("events/kprobes/st/trigger", "hist:keys=stacktrace"), 0) << read("error_log");
    long (*volatile a)(long) = ukh_caller_a, (*volatile b)(long) = ukh_caller_b;
    for (int i = 0; i < 3; ++i) a(i);
    b(7);
    const std::string hist = read("events/kprobes/st/hist");
    EXPECT_NE(hist.find("# trigger info: hist:keys=common_stacktrace:vals=hitcount:sort=hitcount:size=2048 [active]"),
              std::string::npos)
        << hist;
    const auto entry = [&](const char *caller) {
        const size_t at = hist.find(std::string("         ") + caller + "+0x");
        const size_t open = hist.rfind("{ common_stacktrace:\n         ukh_values+0x1/0x", at);
        const size_t close = hist.find("} hitcount: ", at);
        if (at == std::string::npos || open == std::string::npos || close == std::string::npos) return std::string();
        return hist.substr(close, hist.find('\n', close) - close);
    };
    EXPECT_EQ(entry("ukh_caller_a"), "} hitcount:          3") << hist;
    EXPECT_EQ(entry("ukh_caller_b"), "} hitcount:          1") << hist;
    EXPECT_NE(hist.find("Entries: 2\n"), std::string::npos) << hist;
    // A key only, without modifiers.
    EXPECT_EQ(file_append("events/kprobes/st/trigger", "hist:keys=common_pid:vals=common_stacktrace"), -EINVAL);
    EXPECT_EQ(file_append("events/kprobes/st/trigger", "hist:keys=common_stacktrace.hex"), -EINVAL);
    ASSERT_EQ(file_append("events/kprobes/st/trigger", "!hist:keys=common_stacktrace"), 0);
}

// histogram.rst's block_lat example on a function's entry and exit: the stack kept in a
// variable at the entry (st=common_stacktrace), passed through another variable (s=$st)
// to a synthetic event's `unsigned long[]` field, printed STACK: and a line an address, and
// a key of that event's histogram (stack.stacktrace).
TEST_F(HistVars, StacksInVariablesAndSyntheticEvents) {
    ASSERT_EQ(file_append("dynamic_events", "f ukh_values"), 0) << read("error_log");
    ASSERT_EQ(file_append("dynamic_events", "f ukh_values%return"), 0) << read("error_log");
    ASSERT_EQ(file_append("dynamic_events", "s:block_lat pid_t pid; u64 delta; unsigned long[] stack;"), 0)
        << read("error_log");
    const std::string format = read("events/synthetic/block_lat/format");
    EXPECT_NE(format.find("field:__data_loc unsigned long[] stack;\toffset:24;\tsize:4;\tsigned:0;"), std::string::npos)
        << format;
    EXPECT_NE(format.find("print fmt: \"pid=%d, delta=%llu, stack=%s\", REC->pid, REC->delta, __get_stacktrace(stack)"),
              std::string::npos)
        << format;
    const std::string entry = "hist:keys=common_pid:ts=common_timestamp.usecs,st=common_stacktrace";
    const std::string exit = "hist:keys=common_pid:delta=common_timestamp.usecs-$ts,s=$st:"
                             "onmatch(fprobes.ukh_values__entry).trace(block_lat,common_pid,$delta,$s)";
    const std::string by_stack = "hist:keys=delta.buckets=1000000,stack.stacktrace:sort=delta";
    ASSERT_EQ(file_write("events/fprobes/ukh_values__entry/trigger", entry), 0) << read("error_log");
    ASSERT_EQ(file_write("events/fprobes/ukh_values__exit/trigger", exit), 0) << read("error_log");
    ASSERT_EQ(file_write("events/synthetic/block_lat/trigger", by_stack), 0) << read("error_log");
    EXPECT_EQ(read("events/synthetic/block_lat/trigger"),
              "hist:keys=delta.buckets=1000000,stack.stacktrace:vals=hitcount:sort=delta.buckets=1000000:size=2048 "
              "[active]\n");
    ASSERT_EQ(file_write("events/synthetic/block_lat/enable", "1"), 0);
    long (*volatile a)(long) = ukh_caller_a, (*volatile b)(long) = ukh_caller_b;
    for (int i = 0; i < 3; ++i) a(i);
    b(7);
    ASSERT_EQ(file_write("events/synthetic/block_lat/enable", "0"), 0);

    // The records: "stack=STACK:", the probed function, its caller, a line each, then a
    // blank line, as the kernel's print_synth_event().
    const std::string trace = read("trace");
    const std::string head = " block_lat: pid=" + std::to_string(gettid()) + " delta=";
    size_t from_a = 0, from_b = 0;
    for (size_t at = trace.find(head); at != std::string::npos; at = trace.find(head, at + 1)) {
        const size_t stack = trace.find(" stack=STACK:\n=> ukh_values+0x", at);
        ASSERT_EQ(stack, trace.find('\n', at) - 13) << trace;
        const size_t caller = trace.find('\n', stack + 14) + 1;
        from_a += trace.compare(caller, 15, "=> ukh_caller_a") == 0;
        from_b += trace.compare(caller, 15, "=> ukh_caller_b") == 0;
        EXPECT_NE(trace.find("\n\n", caller), std::string::npos);
    }
    EXPECT_EQ(from_a, 3u) << trace;
    EXPECT_EQ(from_b, 1u) << trace;

    // The synthetic event's histogram keyed by the stack it was given: one entry a caller.
    const std::string hist = read("events/synthetic/block_lat/hist");
    const auto count = [&](const char *caller) {
        const size_t at = hist.find(std::string("         ") + caller + "+0x");
        const size_t open = hist.rfind("{ delta: ~ 0-999999, stack.stacktrace         ukh_values+0x", at);
        const size_t close = hist.find("} hitcount: ", at);
        if (at == std::string::npos || open == std::string::npos || close == std::string::npos) return std::string();
        return hist.substr(close, hist.find('\n', close) - close);
    };
    EXPECT_EQ(count("ukh_caller_a"), "} hitcount:          3") << hist;
    EXPECT_EQ(count("ukh_caller_b"), "} hitcount:          1") << hist;

    // A stack is passed only to a stack field, and is no number.
    EXPECT_EQ(file_append("events/fprobes/ukh_values__exit/trigger",
                          "hist:keys=common_pid:d=common_timestamp.usecs-$ts:"
                          "onmatch(fprobes.ukh_values__entry).trace(block_lat,common_pid,$st,$d)"),
              -EINVAL);
    EXPECT_NE(read("error_log").find("Param type doesn't match synthetic event field type"), std::string::npos);
    EXPECT_EQ(
        file_append("events/fprobes/ukh_values__entry/trigger", "hist:keys=common_pid:s2=common_stacktrace,x=$s2+1"),
        -EINVAL);
    EXPECT_NE(read("error_log").find("Stacktrace can not be an operand in expression"), std::string::npos);
    EXPECT_EQ(file_append("events/synthetic/block_lat/trigger", "hist:keys=pid.stacktrace"), -EINVAL);

    ASSERT_EQ(file_write("events/synthetic/block_lat/trigger", "!" + by_stack), 0);
    ASSERT_EQ(file_write("events/fprobes/ukh_values__exit/trigger", "!" + exit), 0);
    ASSERT_EQ(file_write("events/fprobes/ukh_values__entry/trigger", "!" + entry), 0);
}

// histogram.rst: an onmatch() parameter may be a field of the matching event, fully
// qualified (GRP.EVENT.FIELD) or, where the trigger's own event has no such field, alone.
// The kernel's way: a trigger `hist:keys=KEYS:synthetic_FIELD=FIELD` written on the
// matching event (its keys those of the hist trigger there), taken out with the trigger.
TEST_F(HistVars, FieldsOfTheMatchingEventAsParameters) {
    ASSERT_EQ(file_append("dynamic_events", "f:vin ukh_values bval=$arg2:s64"), 0) << read("error_log");
    ASSERT_EQ(file_append("dynamic_events", "f:vout ukh_values%return"), 0) << read("error_log");
    ASSERT_EQ(file_append("synthetic_events", "val_lat u64 lat; s64 b"), 0) << read("error_log");
    const std::string entry = "hist:keys=common_pid:ts0=common_timestamp.usecs";
    const std::string exit = "hist:keys=common_pid:lat=common_timestamp.usecs-$ts0:"
                             "onmatch(fprobes.vin).val_lat($lat,fprobes.vin.bval)";
    // No hist trigger on the matching event yet: none to take the keys of.
    EXPECT_EQ(file_write("events/fprobes/vout/trigger",
                         "hist:keys=common_pid:onmatch(fprobes.vin).val_lat(common_pid,fprobes.vin.bval)"),
              -EINVAL);
    EXPECT_NE(read("error_log").find("Matching event histogram not found"), std::string::npos) << read("error_log");
    ASSERT_EQ(file_write("events/fprobes/vin/trigger", entry), 0) << read("error_log");
    // A field the matching event does not have: refused, nothing left on that event.
    EXPECT_EQ(file_write("events/fprobes/vout/trigger", "hist:keys=common_pid:lat=common_timestamp.usecs-$ts0:"
                                                        "onmatch(fprobes.vin).val_lat($lat,fprobes.vin.nosuch)"),
              -EINVAL);
    EXPECT_NE(read("error_log").find("Couldn't create histogram for field"), std::string::npos) << read("error_log");
    // A later error of the trigger (the count) takes out the field variable it made.
    EXPECT_EQ(file_write("events/fprobes/vout/trigger", "hist:keys=common_pid:lat=common_timestamp.usecs-$ts0:"
                                                        "onmatch(fprobes.vin).val_lat($lat,bval,$lat)"),
              -EINVAL);
    const std::string entry_text = "hist:keys=common_pid:vals=hitcount:ts0=common_timestamp.usecs:sort=hitcount:"
                                   "size=2048:clock=global [active]\n";
    EXPECT_EQ(read("events/fprobes/vin/trigger"), entry_text);

    ASSERT_EQ(file_write("events/fprobes/vout/trigger", exit), 0) << read("error_log");
    EXPECT_EQ(read("events/fprobes/vin/trigger"),
              entry_text + "hist:keys=common_pid:vals=hitcount:synthetic_bval=bval:sort=hitcount:size=2048 [active]\n");
    // The unqualified form finds the same variable; the exit's own fields stay its own.
    const std::string exit2 = "hist:keys=common_pid:vals=hitcount,$lat:lat=common_timestamp.usecs-$ts0:"
                              "onmatch(fprobes.vin).val_lat($lat,bval)";
    ASSERT_EQ(file_append("synthetic_events", "val_lat2 u64 lat; s64 b"), 0);
    ASSERT_EQ(file_write("events/synthetic/val_lat/enable", "1"), 0);
    long (*volatile a)(long) = ukh_caller_a, (*volatile b)(long) = ukh_caller_b;
    for (int i = 0; i < 3; ++i) a(i);
    b(7);
    ASSERT_EQ(file_write("events/synthetic/val_lat/enable", "0"), 0);
    const std::string trace = read("trace");
    EXPECT_EQ(lines_with(trace, " b=1").size(), 3u) << trace;
    EXPECT_EQ(lines_with(trace, " b=2").size(), 1u) << trace;
    EXPECT_EQ(lines_with(trace, " val_lat: lat=").size(), 4u) << trace;

    // The exit's trigger removed, the field variable's goes with it.
    ASSERT_EQ(file_append("events/fprobes/vout/trigger", "!" + exit), 0) << read("error_log");
    EXPECT_EQ(read("events/fprobes/vin/trigger"), entry_text);
    ASSERT_EQ(file_append("events/fprobes/vout/trigger", exit2), 0) << read("error_log");
    EXPECT_NE(read("events/fprobes/vin/trigger").find("synthetic_bval=bval"), std::string::npos);
    // A truncating write takes out the event's hist triggers, and so their field variables.
    ASSERT_EQ(file_write("events/fprobes/vout/trigger", "hist:keys=common_pid"), 0) << read("error_log");
    EXPECT_EQ(read("events/fprobes/vin/trigger"), entry_text);
    ASSERT_EQ(file_append("events/fprobes/vout/trigger", "!hist:keys=common_pid"), 0);
    ASSERT_EQ(file_append("events/fprobes/vin/trigger", "!" + entry), 0);
}

} // namespace
