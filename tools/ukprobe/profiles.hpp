// The kprobe_profile of every process image `ukprobe run` met, printed when everything ends.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

namespace ukprobe {

// kprobe_profile of one process image, printed when everything ends.
struct ProfileBlock {
    uint64_t seq; // the order processes were met in
    int pid;
    std::string comm;
    std::string text;                      // the file's lines; empty if never read
    bool final;                            // read at its exit_group or execve, not as last read while it ran
    bool forked;                           // a child of fork() that had not exec'd
    std::vector<std::string> answers = {}; // RunOptions::answers' texts, read at its end (none: never)
};

// The counts as each process image left them, apart from the trace (stderr, as a second
// file), in the order the processes were met: the program's first image always, any other
// only if it counted something (a shell loop of `sleep` runs a hundred images that hit
// nothing; a shell forks for every command, and most children exec before any hit). Then,
// when more than one process was printed, the sums by event name: kprobe_profile as the
// kernel keeps it, for all of them at once, and the events the trace counted LOST.
void print_profiles(std::vector<ProfileBlock> blocks, uint64_t lost);

// A question's answers (RunOptions::answers, `paths`), on `out`: each process's that
// read them at its end, in the order the processes were met, the program's first; then a
// line on stderr for the processes that ended without (killed, or forked without exec:
// their agent was never asked).
// When more than one answered and `sum` gives a text for a file's answers, that text
// follows, after "# all N processes: FILE".
void print_answers(std::vector<ProfileBlock> blocks, const std::vector<std::string> &paths, FILE *out,
                   const std::function<std::string(const std::vector<std::string> &)> &sum = {});

} // namespace ukprobe
