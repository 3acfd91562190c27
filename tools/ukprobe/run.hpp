// ukprobe run: a program started with the agent preloaded and events defined before its
// main, its trace (and its descendants') streamed until it exits. docs/cli.md, `run`.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

namespace ukprobe {

// A write of one of the tracer's files: `echo TEXT >> PATH` (append) or `echo TEXT > PATH`.
struct FileWrite {
    bool append = true;
    std::string path, text;
};

struct RunOptions {
    std::vector<std::string> definitions; // -e DEF: kprobe_events lines (words split by blanks)
    std::vector<std::string> synthetic;   // --synthetic DEF: synthetic_events lines, before the triggers
    std::vector<std::string> filters;     // --filter EVENT=EXPR
    std::vector<std::string> triggers;    // --trigger EVENT=TRIG
    std::string output;                   // -o FILE; empty: stdout
    uint64_t buffer_size_kb = 0;          // -b KB: each thread's buffer (buffer_size_kb); 0: the agent's default
    bool follow = true;                   // false (--no-follow): descendants run without the agent
    bool verbose = false;                 // -v: say on stderr when an agent is reached, or does not answer
    std::string agent;                    // the libukprobes.so to preload (absolute)
    std::vector<std::string> argv;        // PROG ARGS...
    bool capture = false;                 // ukprobe record: capture blocks (trace/capture.hpp), not text
    std::vector<FileWrite> setup;         // written at each process's start, after filters and triggers
    std::vector<std::string> answers;     // files read at each process's end and printed on stdout,
                                          // instead of the kprobe_profile of each (calls, latency)
    std::string answer_output;            // where the answers go; empty: stdout
};

// Runs the program to its end; returns its exit status (128 + the signal that killed it).
// Throws std::runtime_error for what stops it from starting.
int run_program(const RunOptions &o);

// "GRP/EVENT" for EVENT given as GRP/EVENT (or GRP.EVENT) or as a bare name: the group of
// the event of that name in `definitions` (kprobe_events' text), else "kprobes".
std::string event_path(const std::string &event, const std::string &definitions);
// The synthetic events of --synthetic definitions as event_path() finds them: a line
// "s:synthetic/NAME" each.
std::string synthetic_names(const std::vector<std::string> &synthetic);

// Calls `print` with FILE open for writing ("": stdout), and closes it. Throws
// std::runtime_error when it cannot be opened or written.
void print_to(const std::string &file, const std::function<void(FILE *)> &print);

} // namespace ukprobe
