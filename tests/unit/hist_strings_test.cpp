// String fields of synthetic events (histogram.rst's `char comm[16]`, and `char NAME[]`):
// a string variable kept by the entry event, a string field of the exit event, both
// passed by onmatch() to a synthetic event whose records print them bare and whose
// histogram is keyed by one of them; the kernel's errors where the types do not match.
#include <gtest/gtest.h>

#include <time.h>

#include <string>
#include <vector>

#include "trace/events.hpp"
#include "trace_files.hpp"

using namespace ukp::trace;
using namespace ukp::trace::test_files;

extern "C" __attribute__((noinline)) int uks_named(const char *name, long usecs) {
    struct timespec t = {0, usecs * 1000};
    return nanosleep(&t, nullptr) + (name[0] == 0);
}

namespace {

int (*volatile g_named)(const char *, long) = uks_named;

constexpr const char *kEntryTrigger = "hist:keys=common_pid:ts0=common_timestamp.usecs:n=name";
constexpr const char *kExitTrigger = "hist:keys=common_pid:lat=common_timestamp.usecs-$ts0:"
                                     "onmatch(fprobes.named_in).named_latency($lat,$n,who)";
constexpr const char *kSynthTrigger = "hist:keys=name:vals=hitcount:sort=name";

class HistStrings : public CleanTracer {
protected:
    void SetUp() override {
        CleanTracer::SetUp();
        ASSERT_EQ(file_append("dynamic_events", "f:named_in uks_named name=+0($arg1):string"), 0) << read("error_log");
        ASSERT_EQ(file_append("dynamic_events", "f:named_out uks_named%return who=+0($arg1):string"), 0)
            << read("error_log");
    }
    void TearDown() override {
        file_write("events/enable", "0");
        file_write("events/synthetic/named_latency/trigger", std::string("!") + kSynthTrigger);
        file_write("events/fprobes/named_out/trigger", std::string("!") + kExitTrigger);
        file_write("events/fprobes/named_in/trigger", std::string("!") + kEntryTrigger);
        CleanTracer::TearDown();
    }
};

TEST_F(HistStrings, AStringVariableAndAStringFieldReachTheSyntheticEvent) {
    ASSERT_EQ(file_append("synthetic_events", "named_latency u64 lat; char name[16]; char who[]"), 0)
        << read("error_log");
    EXPECT_EQ(read("synthetic_events"), "named_latency u64 lat; char name[16]; char who[]\n");
    const std::string format = read("events/synthetic/named_latency/format");
    EXPECT_NE(format.find("field:__data_loc char[] name;"), std::string::npos) << format;
    EXPECT_NE(format.find("field:__data_loc char[] who;"), std::string::npos) << format;
    EXPECT_NE(format.find("print fmt: \"lat=%llu, name=%s, who=%s\", REC->lat, __get_str(name), __get_str(who)"),
              std::string::npos)
        << format;
    ASSERT_EQ(file_write("events/fprobes/named_in/trigger", kEntryTrigger), 0) << read("error_log");
    ASSERT_EQ(file_write("events/fprobes/named_out/trigger", kExitTrigger), 0) << read("error_log");
    ASSERT_EQ(file_write("events/synthetic/named_latency/trigger", kSynthTrigger), 0) << read("error_log");
    ASSERT_EQ(file_write("events/synthetic/named_latency/enable", "1"), 0);
    const std::string longer(300, 'x'); // cut at 255, as the kernel's STR_VAR_LEN_MAX cuts it
    g_named("alpha", 100);
    g_named("beta", 100);
    g_named("alpha", 2000);
    g_named(longer.c_str(), 10);
    ASSERT_EQ(file_write("events/synthetic/named_latency/enable", "0"), 0);

    const std::string trace = read("trace");
    const auto recs = lines_with(trace, " named_latency: lat=");
    ASSERT_EQ(recs.size(), 4u) << trace;
    const char *names[] = {"alpha", "beta", "alpha", nullptr};
    for (size_t i = 0; i < 3; ++i) {
        const std::string tail = std::string(" name=") + names[i] + " who=" + names[i];
        EXPECT_EQ(recs[i].substr(recs[i].size() - tail.size()), tail) << recs[i];
    }
    const std::string cut(255, 'x');
    EXPECT_NE(recs[3].find(" name=" + cut + " who=" + cut), std::string::npos) << recs[3];
    EXPECT_EQ(recs[3].find(cut + "x"), std::string::npos) << recs[3];
    EXPECT_GE(std::stoul(recs[2].substr(recs[2].find("lat=") + 4)), 2000u) << recs[2];

    // The synthetic event's histogram keyed by the string.
    const std::string hist = read("events/synthetic/named_latency/hist");
    EXPECT_EQ(lines_with(hist, "{ name: alpha").size(), 1u) << hist;
    EXPECT_NE(hist.find("{ name: alpha                                              } hitcount:          2"),
              std::string::npos)
        << hist;
    EXPECT_NE(hist.find("{ name: beta                                               } hitcount:          1"),
              std::string::npos)
        << hist;
    EXPECT_NE(hist.find("Hits: 4\n"), std::string::npos) << hist;
}

// A filter on the synthetic event's string field, as on any string field: only the
// records that match go to the ring (and to its triggers).
TEST_F(HistStrings, AFilterOnTheStringField) {
    ASSERT_EQ(file_append("synthetic_events", "named_latency u64 lat; char name[16]; char who[]"), 0);
    ASSERT_EQ(file_write("events/fprobes/named_in/trigger", kEntryTrigger), 0) << read("error_log");
    ASSERT_EQ(file_write("events/fprobes/named_out/trigger", kExitTrigger), 0) << read("error_log");
    ASSERT_EQ(file_write("events/synthetic/named_latency/filter", "name ~ \"al*\" && lat < 1000000"), 0)
        << read("error_log");
    ASSERT_EQ(file_write("events/synthetic/named_latency/enable", "1"), 0);
    for (const char *n : {"alpha", "beta", "almond", "gamma"}) g_named(n, 10);
    ASSERT_EQ(file_write("events/synthetic/named_latency/enable", "0"), 0);
    const auto recs = lines_with(read("trace"), " named_latency: lat=");
    ASSERT_EQ(recs.size(), 2u) << read("trace");
    EXPECT_NE(recs[0].find(" name=alpha who=alpha"), std::string::npos) << recs[0];
    EXPECT_NE(recs[1].find(" name=almond who=almond"), std::string::npos) << recs[1];
}

TEST_F(HistStrings, TypesMustMatchAsTheKernelWantsThem) {
    ASSERT_EQ(file_append("synthetic_events", "named_latency u64 lat; char name[16]; char who[]"), 0);
    ASSERT_EQ(file_write("events/fprobes/named_in/trigger", kEntryTrigger), 0) << read("error_log");
    struct Case {
        const char *trigger, *message;
        const char *at; // what the caret is under: its first place in the trigger
    } cases[] = {
        // A number where a string goes, and a string where a number goes.
        {"hist:keys=common_pid:lat=common_timestamp.usecs-$ts0:onmatch(fprobes.named_in).named_latency($lat,$lat,who)",
         "Param type doesn't match synthetic event field type", "$lat,who)"},
        {"hist:keys=common_pid:lat=common_timestamp.usecs-$ts0:onmatch(fprobes.named_in).named_latency(who,$n,who)",
         "Param type doesn't match synthetic event field type", "who,$n"},
        // A string is no operand of an expression, nor a value to track.
        {"hist:keys=common_pid:x=who+1", "String type can not be an operand in expression", "who+1"},
        {"hist:keys=common_pid:x=$n+1", "String type can not be an operand in expression", "$n+1"},
        {"hist:keys=common_pid:s=who:onmax($s).save(who)", "String type can not be an operand in expression", "s)"},
    };
    for (const Case &c : cases) {
        SCOPED_TRACE(c.trigger);
        ASSERT_EQ(file_write("error_log", ""), 0);
        EXPECT_EQ(file_write("events/fprobes/named_out/trigger", c.trigger), -EINVAL);
        expect_logged("hist:fprobes:named_out", c.message, c.trigger, std::string(c.trigger).find(c.at));
    }
    struct Synth {
        const char *line;
        size_t caret;
    } synth[] = {
        {"other char x[257]", 6}, // longer than the kernel's STR_VAR_LEN_MAX
        {"other int x[4]", 6},    // an array of numbers
        {"other char x[0]", 6},
        {"other char x[4", 6},
    };
    for (const Synth &s : synth) {
        SCOPED_TRACE(s.line);
        ASSERT_EQ(file_write("error_log", ""), 0);
        EXPECT_EQ(file_append("synthetic_events", s.line), -EINVAL);
        const std::string log = read("error_log");
        EXPECT_NE(log.find("synthetic_events: error: Invalid type"), std::string::npos) << log;
    }
    ASSERT_EQ(file_append("synthetic_events", "other char x[256]"), 0) << read("error_log");
    ASSERT_EQ(file_append("synthetic_events", "!other"), 0);
}

} // namespace
