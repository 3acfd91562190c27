// Function events (f:, fprobetrace.rst): on one function's entry or exit, and, as ukprobes
// extends them, on every function a glob or a list names, under one event.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "core/core.hpp"
#include "text/text.hpp"
#include "trace/events.hpp"
#include "trace_files.hpp"
#include "ukprobes/kprobes.h"

using namespace ukp::trace;
using namespace ukp::trace::test_files;

extern "C" {
__attribute__((noinline)) long ukf_alpha(long v) {
    asm volatile("" ::: "memory");
    return v * 2;
}
__attribute__((noinline)) long ukf_beta(long v) {
    asm volatile("" ::: "memory");
    return v * 3;
}
__attribute__((noinline)) long ukf_gamma(long v) {
    asm volatile("" ::: "memory");
    return v * 5;
}
__attribute__((noinline)) long ukf_other(long v) {
    asm volatile("" ::: "memory");
    return v * 7;
}
}

namespace {

long (*volatile g_alpha)(long) = ukf_alpha;
long (*volatile g_beta)(long) = ukf_beta;
long (*volatile g_gamma)(long) = ukf_gamma;
long (*volatile g_other)(long) = ukf_other;

class FunctionEvents : public CleanTracer {};

// fprobetrace.rst's usage example, on a function of this program: the entry with its
// argument, the exit with its return value (unnamed: arg1), default names SYM__entry and
// SYM__exit in group fprobes.
TEST_F(FunctionEvents, EntryAndExitOfOneFunction) {
    ASSERT_EQ(file_append("dynamic_events", "f ukf_alpha v=$arg1"), 0) << read("error_log");
    ASSERT_EQ(file_append("dynamic_events", "f ukf_alpha%return $retval"), 0) << read("error_log");
    EXPECT_EQ(read("dynamic_events"), "f:fprobes/ukf_alpha__entry ukf_alpha v=$arg1\n"
                                      "f:fprobes/ukf_alpha__exit ukf_alpha%return arg1=$retval\n");
    ASSERT_EQ(file_write("events/fprobes/enable", "1"), 0);
    EXPECT_EQ(g_alpha(21), 42);
    ASSERT_EQ(file_write("events/fprobes/enable", "0"), 0);
    const auto entry = trace_lines("ukf_alpha__entry"), exit = trace_lines("ukf_alpha__exit");
    ASSERT_EQ(entry.size(), 1u) << read("trace");
    ASSERT_EQ(exit.size(), 1u) << read("trace");
    EXPECT_NE(entry[0].find("ukf_alpha__entry: (ukf_alpha+0x0/0x"), std::string::npos) << entry[0];
    EXPECT_NE(entry[0].find(" v=0x15"), std::string::npos) << entry[0];
    // $retval takes the function's return type from its debug information (long: s64),
    // as the kernel's from BTF; $arg1 is the register, in hex.
    EXPECT_NE(exit[0].find(" <- ukf_alpha) arg1=42"), std::string::npos) << exit[0];
}

// $argN in the exit form is the value at entry; a $retval among the arguments makes the
// event an exit one without %return, as fprobetrace's parser does.
TEST_F(FunctionEvents, TheExitSeesTheArgumentsOfItsEntry) {
    ASSERT_EQ(file_append("dynamic_events", "f:g/both ukf_beta in=$arg1:s64 out=$retval:s64"), 0) << read("error_log");
    EXPECT_EQ(read("dynamic_events"), "f:g/both ukf_beta%return in=$arg1:s64 out=$retval:s64\n");
    ASSERT_EQ(file_write("events/g/both/enable", "1"), 0);
    EXPECT_EQ(g_beta(-4), -12);
    EXPECT_EQ(g_beta(10), 30);
    ASSERT_EQ(file_write("events/g/both/enable", "0"), 0);
    const auto lines = trace_lines("both");
    ASSERT_EQ(lines.size(), 2u) << read("trace");
    EXPECT_NE(lines[0].find(" in=-4 out=-12"), std::string::npos) << lines[0];
    EXPECT_NE(lines[1].find(" in=10 out=30"), std::string::npos) << lines[1];
}

// A glob with an exclusion: one event, one line in dynamic_events, one row in kprobes/list
// with its count of functions, one enable; every function it names records, the others
// not. The default name is the pattern's up to its wildcard.
TEST_F(FunctionEvents, AGlobAndAnExclusionMakeOneEventOverTheirFunctions) {
    ASSERT_EQ(file_append("dynamic_events", "f:many ukf_*,!ukf_beta v=$arg1:s64"), 0) << read("error_log");
    ASSERT_EQ(file_append("dynamic_events", "f ukf_[ab]*%return r=$retval:s64"), 0) << read("error_log");
    EXPECT_EQ(read("dynamic_events"), "f:fprobes/many ukf_*,!ukf_beta v=$arg1:s64\n"
                                      "f:fprobes/ukf__exit ukf_[ab]*%return r=$retval:s64\n");
    const std::string list = kprobes_list_text();
    EXPECT_NE(list.find("  f  ukf_*,!ukf_beta  fprobes/many 3 functions, "), std::string::npos) << list;
    EXPECT_NE(list.find("  f  ukf_[ab]*%return  fprobes/ukf__exit 2 functions, "), std::string::npos) << list;
    EXPECT_EQ(list.find("ukf_gamma+0x0"), std::string::npos) << list; // no row per function
    EXPECT_NE(list.find(" [DISABLED]\n"), std::string::npos) << list;
    ASSERT_EQ(file_write("events/fprobes/many/enable", "1"), 0);
    ASSERT_EQ(file_write("events/fprobes/ukf__exit/enable", "1"), 0);
    g_alpha(1);
    g_beta(2);
    g_gamma(3);
    g_other(4);
    ASSERT_EQ(file_write("events/fprobes/enable", "0"), 0);
    const auto many = trace_lines("many");
    ASSERT_EQ(many.size(), 3u) << read("trace");
    EXPECT_NE(many[0].find("(ukf_alpha+0x0/0x"), std::string::npos) << many[0];
    EXPECT_NE(many[0].find(" v=1"), std::string::npos) << many[0];
    EXPECT_NE(many[1].find("(ukf_gamma+0x0/0x"), std::string::npos) << many[1];
    EXPECT_NE(many[2].find("(ukf_other+0x0/0x"), std::string::npos) << many[2];
    const auto exits = trace_lines("ukf__exit");
    ASSERT_EQ(exits.size(), 2u) << read("trace");
    EXPECT_NE(exits[0].find("<- ukf_alpha) r=2"), std::string::npos) << exits[0];
    EXPECT_NE(exits[1].find("<- ukf_beta) r=6"), std::string::npos) << exits[1];
    // Removing the event takes every function's probe away.
    ASSERT_EQ(file_append("dynamic_events", "-:many"), 0);
    ASSERT_EQ(file_append("dynamic_events", "-:ukf__exit"), 0);
    EXPECT_EQ(kprobes_list_text().find("ukf_"), std::string::npos) << kprobes_list_text();
}

// The process-start form (UKP_EVENTS) separates words with commas: a list's are "\\,".
TEST_F(FunctionEvents, AListInTheProcessStartForm) {
    ASSERT_EQ(apply_startup_events("f:st,ukf_alpha\\,ukf_gamma,v=$arg1:s64"), 0) << read("error_log");
    EXPECT_EQ(read("dynamic_events"), "f:fprobes/st ukf_alpha,ukf_gamma v=$arg1:s64\n");
    g_alpha(3);
    g_beta(4);
    g_gamma(5);
    ASSERT_EQ(file_write("events/fprobes/st/enable", "0"), 0); // applied enabled
    const auto lines = trace_lines("st");
    ASSERT_EQ(lines.size(), 2u) << read("trace");
    EXPECT_NE(lines[0].find(" v=3"), std::string::npos) << lines[0];
    EXPECT_NE(lines[1].find(" v=5"), std::string::npos) << lines[1];
}

// A glob over a library: every function of it the agent can probe (some it cannot: its own
// blacklist), and the program goes on.
TEST_F(FunctionEvents, AGlobOverALibrary) {
    ASSERT_EQ(file_append("dynamic_events", "f:lib libc.so.6:str*"), 0) << read("error_log");
    ASSERT_EQ(file_write("events/fprobes/lib/enable", "1"), 0);
    char buf[16] = "probe";
    volatile size_t n = strlen(buf) + strnlen(buf, sizeof buf);
    ASSERT_EQ(file_write("events/fprobes/lib/enable", "0"), 0);
    EXPECT_EQ(n, 10u);
    const std::string list = kprobes_list_text();
    const size_t row = list.find("  f  libc.so.6:str*  fprobes/lib ");
    ASSERT_NE(row, std::string::npos) << list;
    EXPECT_GT(std::stoul(list.substr(row + 33)), 20u) << list.substr(row);
}

// The functions of the event fprobes/lib over libc.so.6:str*,mem*,wcs* (its row in
// kprobes/list), 0 if it has none.
unsigned long functions_of_lib() {
    const std::string list = kprobes_list_text();
    const std::string head = "  f  libc.so.6:str*,mem*,wcs*  fprobes/lib ";
    const size_t row = list.find(head);
    return row == std::string::npos ? 0 : std::stoul(list.substr(row + head.size()));
}

// For its first 5 s, the spawn gate looks for a thread in clone (a spawn it does not count)
// before an int3 goes into libc, and a look holds for a millisecond. Disabling an event
// over a library sends each of its points back through its int3, each in a gate window of
// its own: the look still holds across them, so the disable looks about once a
// millisecond, not once a function (which were 3,700 looks, 67 ms, for all of libc).
TEST_F(FunctionEvents, DisablingAnEventOverALibraryLooksForSpawnsOnceAMillisecond) {
    using Clock = std::chrono::steady_clock;
    const Clock::time_point defined = Clock::now();
    ASSERT_EQ(file_append("dynamic_events", "f:lib libc.so.6:str*,mem*,wcs*"), 0) << read("error_log");
    const long before_enable = ukp::core::spawn_gate_clone_looks();
    ASSERT_EQ(file_write("events/fprobes/lib/enable", "1"), 0);
    ukp_optimizer_flush(); // the points on their jumps
    const long before_disable = ukp::core::spawn_gate_clone_looks();
    const Clock::time_point disabling = Clock::now();
    ASSERT_EQ(file_write("events/fprobes/lib/enable", "0"), 0);
    const Clock::time_point disabled = Clock::now();
    const long looks = ukp::core::spawn_gate_clone_looks() - before_disable;
    if (disabled - defined > std::chrono::seconds(4)) GTEST_SKIP() << "the gate's first 5 s are over: it looks no more";
    ASSERT_GT(before_disable - before_enable, 0) << "the enable looked";
    const unsigned long functions = functions_of_lib();
    ASSERT_GT(functions, 100u) << kprobes_list_text();
    const long ms = std::chrono::duration_cast<std::chrono::milliseconds>(disabled - disabling).count();
    EXPECT_LE(looks, ms + 2) << "in " << ms << " ms, over " << functions << " functions";
}

// Disabling an event over many functions takes their jumps out together, as the kernel's
// optimizer unoptimizes a list of probes: every int3, one synchronization of the cores,
// every region's bytes, another (each a membarrier, which interrupts every core running
// the process: 50 us here with one other thread running), not two a function. The code is
// the original afterwards, and the event works when enabled again.
TEST_F(FunctionEvents, DisablingAnEventOverALibraryTakesItsJumpsOutTogether) {
    ASSERT_EQ(file_append("dynamic_events", "f:lib libc.so.6:str*,mem*,wcs*"), 0) << read("error_log");
    ASSERT_EQ(file_write("events/fprobes/lib/enable", "1"), 0);
    ukp_optimizer_flush();
    const unsigned long functions = functions_of_lib();
    ASSERT_GT(functions, 100u) << kprobes_list_text();
    const uint64_t before = ukp::text::sync_count();
    ASSERT_EQ(file_write("events/fprobes/lib/enable", "0"), 0);
    EXPECT_LE(ukp::text::sync_count() - before, 5u) << "over " << functions << " functions";
    EXPECT_EQ(ukp_verify(nullptr), 0);
    char buf[16] = "probe";
    ASSERT_EQ(file_write("events/fprobes/lib/enable", "1"), 0);
    volatile size_t n = strlen(buf) + strnlen(buf, sizeof buf);
    ASSERT_EQ(file_write("events/fprobes/lib/enable", "0"), 0);
    EXPECT_EQ(n, 10u);
    EXPECT_GE(trace_lines("lib").size(), 2u) << read("trace");
    EXPECT_EQ(ukp_verify(nullptr), 0);
    // So does kprobes/enabled going to 0 (the points left on their int3s, a few, are
    // synchronized one at a time).
    ASSERT_EQ(file_write("events/fprobes/lib/enable", "1"), 0);
    ukp_optimizer_flush();
    const uint64_t knob_before = ukp::text::sync_count();
    ASSERT_EQ(ukp_set_kprobes_enabled(0), 0);
    EXPECT_LE(ukp::text::sync_count() - knob_before, 3 + functions / 10) << "over " << functions << " functions";
    ASSERT_EQ(ukp_set_kprobes_enabled(1), 0);
    ASSERT_EQ(file_write("events/fprobes/lib/enable", "0"), 0);
    EXPECT_EQ(ukp_verify(nullptr), 0);
}

// The fprobe tracer's errors, with their carets; nothing is defined.
TEST_F(FunctionEvents, ErrorsWithTheirCarets) {
    struct Case {
        const char *line;
        size_t caret;
        const char *message;
    } cases[] = {
        {"f:e ukf_nosuch", 4, "Invalid probed address or symbol"},
        {"f:e ukf_nosuch*", 4, "Invalid probed address or symbol"}, // a glob that matches nothing
        {"f:e ukf_*,!ukf_*", 4, "Invalid probed address or symbol"},
        {"f:e libc.so.6:ukf_*", 4, "Invalid probed address or symbol"}, // not that object's
        {"f:e ukf_alpha%ret", 13, "Invalid probed address suffix"},
        {"f4:e ukf_alpha", 1, "Maxactive is only for function exit"},
        {"f:e ukf_alpha $arg0", 14, "Invalid argument number"},
    };
    for (const Case &c : cases) {
        SCOPED_TRACE(c.line);
        ASSERT_EQ(file_write("error_log", ""), 0);
        EXPECT_NE(file_append("dynamic_events", c.line), 0);
        EXPECT_EQ(read("dynamic_events"), "");
        expect_logged("trace_fprobe", c.message, c.line, c.caret);
    }
    // A maxactive with the exit form is taken.
    ASSERT_EQ(file_append("dynamic_events", "f4:x ukf_alpha%return"), 0) << read("error_log");
    EXPECT_EQ(read("dynamic_events"), "f4:fprobes/x ukf_alpha%return\n");
}

} // namespace
