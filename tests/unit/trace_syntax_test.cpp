// The kprobe_events language as data: tests/data/trace/syntax_errors.txt (each rejected
// line with the kernel's error and caret) and good_lines.txt (accepted lines and what
// kprobe_events shows for them).
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "trace/errors.hpp"
#include "trace/events.hpp"
#include "trace_files.hpp"
#include "trace_target.h"

using namespace ukp::trace;
using namespace ukp::trace::test_files;

namespace {

std::string data_path(const char *name) {
    std::string here = __FILE__;
    return here.substr(0, here.rfind('/')) + "/../data/trace/" + name;
}

std::vector<std::string> lines_of(const char *name) {
    std::ifstream in(data_path(name));
    std::vector<std::string> out;
    std::string line;
    while (std::getline(in, line))
        if (!line.empty() && line[0] != '#') out.push_back(line);
    return out;
}

bool error_id_of(std::string_view id, Err *out) {
    for (int i = 0; i <= static_cast<int>(Err::NO_VFS_TYPE); ++i)
        if (error_id(static_cast<Err>(i)) == id) {
            *out = static_cast<Err>(i);
            return true;
        }
    return false;
}

TEST(TraceSyntax, ErrorTableIsComplete) {
    EXPECT_EQ(error_message(Err::BAD_REG_NAME), "Invalid register name");
    EXPECT_EQ(error_message(Err::NOFENTRY_ARGS), "$arg* can be used only on function entry or exit");
    EXPECT_EQ(error_id(Err::DEREF_OPEN_BRACE), "DEREF_OPEN_BRACE");
}

TEST(TraceSyntax, ErrorCasesFromData) {
    // The functions must exist in this program for the probes to resolve.
    volatile long keep = reinterpret_cast<long>(&ttarget_triple) + reinterpret_cast<long>(&ttarget_eight);
    (void)keep;
    const auto lines = lines_of("syntax_errors.txt");
    ASSERT_GT(lines.size(), 60u);
    std::vector<std::string> setup;
    int cases = 0;
    for (const std::string &line : lines) {
        const size_t tab = line.find('\t');
        ASSERT_NE(tab, std::string::npos) << line;
        const std::string id = line.substr(0, tab);
        std::string cmd = line.substr(tab + 1);
        if (id == "setup") {
            setup.push_back(cmd);
            continue;
        }
        SCOPED_TRACE(line);
        ++cases;
        Err want;
        ASSERT_TRUE(error_id_of(id, &want)) << "unknown error id " << id;
        const size_t caret = cmd.find('^');
        ASSERT_NE(caret, std::string::npos);
        cmd.erase(caret, 1);

        ASSERT_EQ(file_write("kprobe_events", ""), 0);
        for (const auto &s : setup) ASSERT_EQ(file_append("kprobe_events", s), 0) << s;
        setup.clear();
        ASSERT_EQ(file_write("error_log", ""), 0);
        const std::string before = read("kprobe_events");
        EXPECT_NE(file_append("kprobe_events", cmd), 0);
        EXPECT_EQ(read("kprobe_events"), before) << "a rejected line changed kprobe_events";

        const std::string log = read("error_log");
        const std::string expect = "trace_kprobe: error: " + std::string(error_message(want)) + "\n  Command: " + cmd +
                                   "\n" + std::string(11 + caret, ' ') + "^\n";
        const size_t close = log.find("] ");
        ASSERT_NE(close, std::string::npos) << log;
        EXPECT_EQ(log.substr(close + 2), expect);
        EXPECT_EQ(log[0], '[');
    }
    EXPECT_GT(cases, 60);
    ASSERT_EQ(file_write("kprobe_events", ""), 0);
}

TEST(TraceSyntax, GoodLinesFromData) {
    volatile long keep = reinterpret_cast<long>(&ttarget_record);
    (void)keep;
    const auto lines = lines_of("good_lines.txt");
    ASSERT_GT(lines.size(), 10u);
    for (const std::string &line : lines) {
        SCOPED_TRACE(line);
        const size_t tab = line.find('\t');
        ASSERT_NE(tab, std::string::npos);
        ASSERT_EQ(file_write("kprobe_events", ""), 0);
        ASSERT_EQ(file_write("error_log", ""), 0);
        EXPECT_EQ(file_append("kprobe_events", line.substr(0, tab)), 0) << read("error_log");
        EXPECT_EQ(read("kprobe_events"), line.substr(tab + 1) + "\n");
    }
    ASSERT_EQ(file_write("kprobe_events", ""), 0);
}

TEST(TraceSyntax, TooManyArguments) {
    std::string line = "p:e ttarget_triple";
    for (int i = 0; i < 128; ++i) line += " \\" + std::to_string(i);
    ASSERT_EQ(file_write("kprobe_events", line), 0);
    ASSERT_EQ(file_write("kprobe_events", ""), 0);
    ASSERT_EQ(file_write("error_log", ""), 0);
    EXPECT_EQ(file_write("kprobe_events", line + " \\128"), -EINVAL);
    const std::string log = read("error_log");
    EXPECT_NE(log.find("error: Too many arguments are specified"), std::string::npos) << log;
    EXPECT_NE(log.find(std::string(11 + std::string("p:e ttarget_triple ").size(), ' ') + "^\n"), std::string::npos);
}

TEST(TraceSyntax, RecordLargerThanTheLimit) {
    std::string line = "p:big ttarget_triple";
    for (int i = 0; i < 9; ++i) line += " +0(%di):u64[64]"; // 9 x 512 bytes > 4096
    ASSERT_EQ(file_write("kprobe_events", ""), 0);
    ASSERT_EQ(file_write("error_log", ""), 0);
    EXPECT_NE(file_write("kprobe_events", line), 0);
    EXPECT_NE(read("error_log").find("error: Event too big (too many fields?)"), std::string::npos);
    EXPECT_EQ(read("kprobe_events"), "");
}

TEST(TraceSyntax, ClearingAnEnabledEventIsBusy) {
    ASSERT_EQ(file_write("kprobe_events", "p:busy ttarget_triple"), 0);
    ASSERT_EQ(file_write("events/kprobes/busy/enable", "1"), 0);
    EXPECT_EQ(file_write("kprobe_events", ""), -EBUSY);
    EXPECT_EQ(file_append("kprobe_events", "-:busy"), -EBUSY);
    EXPECT_EQ(read("kprobe_events"), "p:kprobes/busy ttarget_triple\n");
    ASSERT_EQ(file_write("events/kprobes/busy/enable", "0"), 0);
    EXPECT_EQ(file_append("kprobe_events", "-:kprobes/busy"), 0);
    EXPECT_EQ(read("kprobe_events"), "");
    EXPECT_EQ(file_append("kprobe_events", "-:busy"), -ENOENT);
}

TEST(TraceSyntax, SeveralProbePointsUnderOneEvent) {
    ASSERT_EQ(file_write("kprobe_events", "p:multi ttarget_triple a=%di"), 0);
    ASSERT_EQ(file_append("kprobe_events", "p:multi ttarget_eight a=%di"), 0);
    EXPECT_EQ(read("kprobe_events"), "p:kprobes/multi ttarget_triple a=%di\np:kprobes/multi ttarget_eight a=%di\n");
    EXPECT_EQ(read("kprobe_profile").find("multi"), 2u);
    ASSERT_EQ(file_write("kprobe_events", ""), 0);
}

} // namespace
