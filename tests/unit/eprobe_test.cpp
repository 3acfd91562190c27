// Event probes (e:, eprobetrace.rst): a second event on another event's records, its
// fields fetched as $FIELD, typed and dereferenced as the arguments of any event.
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "trace/events.hpp"
#include "trace_files.hpp"

using namespace ukp::trace;
using namespace ukp::trace::test_files;

extern "C" {
struct uke_item {
    long id;
    int weight;
    const char *label;
};
__attribute__((noinline)) long uke_work(long n, const char *name, const struct uke_item *item) {
    asm volatile("" ::: "memory");
    return n + (name != nullptr) + (item != nullptr);
}
}

namespace {

long (*volatile g_work)(long, const char *, const uke_item *) = uke_work;

class EventProbes : public CleanTracer {
protected:
    void SetUp() override {
        CleanTracer::SetUp();
        // The event the e: events go on, itself never enabled.
        ASSERT_EQ(file_append("dynamic_events", "p:kprobes/src uke_work n=%di:s64 name=+0(%si):string item=%dx:x64"), 0)
            << read("error_log");
    }
};

// eprobetrace.rst's example 1: a smaller event from another's fields; the source records
// nothing of its own; the record names the event it is on.
TEST_F(EventProbes, ASecondViewOfAnEventWithItsFields) {
    ASSERT_EQ(file_append("dynamic_events", "e:small kprobes.src count=$n:s32 name=$name"), 0) << read("error_log");
    EXPECT_EQ(read("dynamic_events"), "p:kprobes/src uke_work n=%di:s64 name=+0(%si):string item=%dx:x64\n"
                                      "e:eprobes/small kprobes.src count=$n:s32 name=$name\n");
    const std::string format = read("events/eprobes/small/format");
    EXPECT_NE(format.find("field:s32 count;\toffset:8;"), std::string::npos) << format;
    EXPECT_NE(format.find("field:__data_loc char[] name;"), std::string::npos) << format;
    EXPECT_NE(format.find("print fmt: \"(kprobes.src) count=%d name=\\\"%s\\\"\""), std::string::npos) << format;
    ASSERT_EQ(file_write("events/eprobes/small/enable", "1"), 0);
    g_work(7, "seven", nullptr);
    g_work(-3, "minus three", nullptr);
    ASSERT_EQ(file_write("events/eprobes/small/enable", "0"), 0);
    EXPECT_TRUE(trace_lines("src").empty()) << read("trace");
    const auto lines = trace_lines("small");
    ASSERT_EQ(lines.size(), 2u) << read("trace");
    EXPECT_NE(lines[0].find("small: (kprobes.src) count=7 name=\"seven\""), std::string::npos) << lines[0];
    EXPECT_NE(lines[1].find("small: (kprobes.src) count=-3 name=\"minus three\""), std::string::npos) << lines[1];
    const std::string profile = read("kprobe_profile");
    EXPECT_NE(profile.find("  small "), std::string::npos) << profile;
}

// Defaults: group eprobes, the source's name, a field's value in hex of its size; a
// pointer field dereferenced (+OFFS($FIELD)), a string behind it; filters and hist on the
// e: event; the source cannot go while an e: event is on it.
TEST_F(EventProbes, DefaultsDereferencesFiltersAndHist) {
    ASSERT_EQ(file_append("dynamic_events", "e kprobes.src $n"), 0) << read("error_log");
    ASSERT_EQ(file_append("dynamic_events",
                          "e:g/item kprobes/src id=+0($item):s64 w=+8($item):s32 label=+0(+16($item)):string"),
              0)
        << read("error_log");
    EXPECT_NE(read("dynamic_events").find("e:eprobes/src kprobes.src arg1=$n\n"), std::string::npos);
    ASSERT_EQ(file_write("events/g/item/filter", "w > 10"), 0);
    ASSERT_EQ(file_write("events/g/item/trigger", "hist:keys=label:vals=w"), 0) << read("error_log");
    ASSERT_EQ(file_write("events/eprobes/src/enable", "1"), 0);
    ASSERT_EQ(file_write("events/g/item/enable", "1"), 0);
    const uke_item light{41, 5, "light"}, heavy{42, 50, "heavy"};
    g_work(26, "a", &light);
    g_work(27, "b", &heavy);
    g_work(28, "c", &heavy);
    ASSERT_EQ(file_write("events/enable", "0"), 0);
    const auto n = trace_lines("src");
    ASSERT_EQ(n.size(), 3u) << read("trace");
    EXPECT_NE(n[0].find("src: (kprobes.src) arg1=0x1a"), std::string::npos) << n[0];
    const auto items = trace_lines("item");
    ASSERT_EQ(items.size(), 2u) << read("trace"); // the light one filtered out
    EXPECT_NE(items[0].find("item: (kprobes.src) id=42 w=50 label=\"heavy\""), std::string::npos) << items[0];
    const std::string hist = read("events/g/item/hist");
    EXPECT_NE(hist.find("{ label: heavy"), std::string::npos) << hist;
    EXPECT_NE(hist.find("hitcount:          2  w:        100"), std::string::npos) << hist;
    EXPECT_NE(hist.find("{ label: light"), std::string::npos) << hist; // the trigger sees every hit
    EXPECT_NE(file_append("dynamic_events", "-:kprobes/src"), 0);      // in use
    ASSERT_EQ(file_write("events/g/item/trigger", "!hist:keys=label:vals=w"), 0);
    ASSERT_EQ(file_append("dynamic_events", "-:g/item"), 0);
    ASSERT_EQ(file_append("dynamic_events", "-:eprobes/src"), 0);
    EXPECT_EQ(file_append("dynamic_events", "-:kprobes/src"), 0);
}

// eprobetrace.rst's example 2 (+8($args) on raw_syscalls' `unsigned long args[6]`): an array
// field stands for where it lies in the record, so +OFFS reads its elements and a
// dereference goes through one; bare, it shows that address.
TEST_F(EventProbes, AnArrayFieldIsWhereItLiesInTheRecord) {
    ASSERT_EQ(file_append("dynamic_events", "p:kprobes/arr uke_work v=+0(%dx):u64[3]"), 0) << read("error_log");
    ASSERT_EQ(
        file_append("dynamic_events", "e:el kprobes.arr id=+0($v):s64 w=+8($v):s32 label=+0(+16($v)):string at=$v"), 0)
        << read("error_log");
    EXPECT_NE(read("events/eprobes/el/format").find("field:u64 at;"), std::string::npos)
        << read("events/eprobes/el/format");
    ASSERT_EQ(file_write("events/eprobes/el/enable", "1"), 0);
    const uke_item item{-9, 77, "inside"};
    g_work(1, "x", &item);
    ASSERT_EQ(file_write("events/eprobes/el/enable", "0"), 0);
    const auto lines = trace_lines("el");
    ASSERT_EQ(lines.size(), 1u) << read("trace");
    EXPECT_NE(lines[0].find("el: (kprobes.arr) id=-9 w=77 label=\"inside\" at=0x"), std::string::npos) << lines[0];
    // A typecast needs an address the program has, not one in the record.
    ASSERT_EQ(file_write("error_log", ""), 0);
    EXPECT_EQ(file_append("dynamic_events", "e:c kprobes.arr (uke_item)v->id"), -EINVAL);
    EXPECT_NE(read("error_log").find("This is not a pointer to union/structure."), std::string::npos)
        << read("error_log");
}

// The eprobe tracer's errors, with the kernel's carets (its selftest eprobes_syntax_errors).
TEST_F(EventProbes, ErrorsWithTheirCarets) {
    struct Case {
        const char *line;
        size_t caret;
        const char *message;
    } cases[] = {
        {"e a.", 2, "This requires both group and event name to attach"},
        {"e .b", 2, "This requires both group and event name to attach"},
        {"e kprobes", 2, "This requires both group and event name to attach"},
        {"e a.b", 2, "Attached event does not exist"},
        {"e kprobes.src foo", 14, "This event field is not found."},
        {"e:foo/bar kprobes.src arg=$foo", 26, "Attached event does not have this field"},
        {"e:foo/bar kprobes.src r=%di", 24, "Invalid $-variable specified"},
        {"e:foo/bar kprobes.src v=$n:string", 27, "String accepts only memory argument"},
        {"e:/bar kprobes.src", 2, "Group name is not specified"},
    };
    // A probe does not join an event probe.
    ASSERT_EQ(file_append("dynamic_events", "e:eprobes/view kprobes.src $n"), 0);
    EXPECT_NE(file_append("dynamic_events", "p:eprobes/view uke_work"), 0);
    ASSERT_EQ(file_append("dynamic_events", "-:eprobes/view"), 0);
    for (const Case &c : cases) {
        SCOPED_TRACE(c.line);
        ASSERT_EQ(file_write("error_log", ""), 0);
        EXPECT_NE(file_append("dynamic_events", c.line), 0);
        EXPECT_EQ(read("dynamic_events"), "p:kprobes/src uke_work n=%di:s64 name=+0(%si):string item=%dx:x64\n");
        expect_logged("event_probe", c.message, c.line, c.caret);
    }
}

} // namespace
