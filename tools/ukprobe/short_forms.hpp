// The one-line questions of `ukprobe`: `calls` (how often each function of a library is
// called), `latency` (a histogram of one function's latency), `sdt` (the SDT probes a
// program carries). The first two expand to the tracer's language (f: events, hist
// triggers, a synthetic event), print what they expand to, and answer with the kernel's
// hist text. docs/cli.md, "One-line questions".
#pragma once

#include "run.hpp"

#include <string>
#include <vector>

namespace ukprobe {

// What a question expands to: files written before the definitions (synthetic_events),
// the definitions (dynamic_events' language), files written after them (triggers), in
// order; and the hist files whose text is the answer.
struct Expansion {
    std::vector<FileWrite> before;
    std::vector<std::string> definitions;
    std::vector<FileWrite> after;
    std::vector<std::string> answers; // "events/GRP/EVENT/hist"
};

// `calls [MOD:]FUNCS`, or `calls MOD` (a path or a name with ".so": every function of it):
// one f: event over the functions, a hist keyed by the function, by hits.
Expansion expand_calls(const std::string &spec);

// `latency [MOD:]FUNC`: histogram.rst's wakeup-latency recipe on FUNC's entry and exit
// events; `buckets` microseconds wide (0: by powers of two). Throws std::runtime_error
// for a FUNC that is a glob or a list.
Expansion expand_latency(const std::string &spec, unsigned buckets);

// The expansion as one would type it under /sys/kernel/tracing ("echo '...' >> FILE",
// "cat FILE"), one command a line, after a comment naming `question`.
std::string expansion_text(const std::string &question, const Expansion &x);

// The hists of several processes (texts of one question's hist file) summed: entries of
// the same key (its addresses left out: each process has its own) added up, sorted as
// the trigger sorts (by hits, or by the key's first number: a latency's bucket), the
// kernel's totals. Empty when a hist has other values than hitcount (not summed).
std::string sum_hists(const std::vector<std::string> &texts);

// RunOptions for `ukprobe run` that answer the question for PROG ARGS: the events
// defined at its start and disabled again once their triggers are in (they only count),
// no trace, each process's answer read at its end.
void add_to_run(const Expansion &x, RunOptions *o);

// The SDT probes of the ELF files `paths` (or of the objects process `pid` maps, when
// `pid` > 0), one line each: "MOD:PROVIDER:NAME", its sites and its arguments' types as
// a t: event types $argN. Throws std::runtime_error for a file that cannot be read.
std::string sdt_list(const std::vector<std::string> &paths, int pid);

} // namespace ukprobe
