// What the tracer's tests read of its files (the file API of trace/events.hpp): a file's
// text, the trace lines of one event, and error_log's entry checked as the kernel prints it.
#pragma once

#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "trace/events.hpp"

namespace ukp::trace::test_files {

// The file's text; a failed read is a test failure (and gives "").
inline std::string read(const char *path) {
    std::string s;
    EXPECT_EQ(file_read(path, &s), 0) << path;
    return s;
}

// The lines of `trace` recording `event`: "... EVENT: (...".
inline std::vector<std::string> trace_lines(const std::string &event) {
    std::istringstream in(read("trace"));
    std::vector<std::string> out;
    for (std::string line; std::getline(in, line);)
        if (!line.empty() && line[0] != '#' && line.find(" " + event + ": (") != std::string::npos) out.push_back(line);
    return out;
}

// The lines of `text` that contain `what`.
inline std::vector<std::string> lines_with(const std::string &text, const std::string &what) {
    std::istringstream in(text);
    std::vector<std::string> out;
    for (std::string line; std::getline(in, line);)
        if (line.find(what) != std::string::npos) out.push_back(line);
    return out;
}

// That error_log's entry is `SOURCE: error: MESSAGE` for `command`, the caret under its
// column `caret`, after the timestamp "[ seconds.micros] ".
inline void expect_logged(const std::string &source, const std::string &message, const std::string &command,
                          size_t caret) {
    const std::string log = read("error_log");
    const std::string want =
        source + ": error: " + message + "\n  Command: " + command + "\n" + std::string(11 + caret, ' ') + "^\n";
    const size_t close = log.find("] ");
    ASSERT_NE(close, std::string::npos) << log;
    EXPECT_EQ(log.substr(close + 2), want);
}

// A test that starts with no event, no record, nothing logged, and leaves no event.
class CleanTracer : public ::testing::Test {
protected:
    void SetUp() override {
        ASSERT_EQ(file_write("events/enable", "0"), 0);
        ASSERT_EQ(file_write("dynamic_events", ""), 0);
        ASSERT_EQ(file_write("trace", ""), 0);
        ASSERT_EQ(file_write("error_log", ""), 0);
    }
    void TearDown() override {
        file_write("events/enable", "0");
        file_write("dynamic_events", "");
    }
};

} // namespace ukp::trace::test_files
