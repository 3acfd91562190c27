// ukprobe report: a capture file of `ukprobe record` (trace/capture.hpp) printed as the
// trace `ukprobe run` would have printed, or exported for a trace viewer. docs/cli.md,
// "record and report".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ukprobe {

struct ReportOptions {
    std::string file;                // the capture file
    std::vector<std::string> events; // --event GRP/EVENT, GRP.EVENT or EVENT: only these (repeatable)
    std::vector<int> pids;           // --pid: only these processes or threads (repeatable)
    double from = -1, to = -1;       // --from/--to SECS: only records in [from, to], the trace's timestamps
    std::string format = "text";     // text | chrome (Chrome trace JSON: Perfetto, chrome://tracing)
    std::string output;              // -o FILE; empty: stdout
};

// Prints the report; returns 0, or throws std::runtime_error (an unreadable file).
int report(const ReportOptions &o);

} // namespace ukprobe
