#include "profiles.hpp"

#include "trace/profile_table.hpp"

#include <fmt/core.h>

#include <algorithm>
#include <cstdio>
#include <sstream>

namespace ukprobe {

void print_profiles(std::vector<ProfileBlock> blocks, uint64_t lost) {
    std::stable_sort(blocks.begin(), blocks.end(), [](const auto &a, const auto &b) { return a.seq < b.seq; });
    struct Sum {
        std::string name;
        uint64_t hits = 0, misses = 0;
    };
    std::vector<Sum> sums;
    size_t printed = 0, silent = 0;
    for (const ProfileBlock &b : blocks) {
        if (b.text.empty()) continue; // never read
        std::vector<Sum> lines;
        std::istringstream in(b.text);
        for (Sum one; in >> one.name >> one.hits >> one.misses;) lines.push_back(one);
        const bool counted =
            std::any_of(lines.begin(), lines.end(), [](const Sum &x) { return x.hits + x.misses != 0; });
        if (!counted && &b != &blocks.front()) {
            ++silent;
            continue;
        }
        fmt::print(stderr, "# kprobe_profile: process {} ({}){}{}\n{}", b.pid, b.comm, b.forked ? ", forked" : "",
                   b.final ? "" : ", as last read before it ended", b.text);
        ++printed;
        for (const Sum &x : lines) {
            auto it = std::find_if(sums.begin(), sums.end(), [&](const Sum &y) { return y.name == x.name; });
            if (it == sums.end()) it = sums.insert(sums.end(), Sum{x.name});
            it->hits += x.hits;
            it->misses += x.misses;
        }
    }
    if (printed >= 2) {
        std::string total;
        for (const Sum &x : sums) total += ukp::trace::profile_line(x.name, x.hits, x.misses);
        fmt::print(stderr, "# kprobe_profile: all {} processes{}\n{}", printed,
                   silent != 0 ? fmt::format(" ({} more counted nothing)", silent) : "", total);
    }
    if (lost != 0) fmt::print(stderr, "# lost: {} events (the trace's LOST lines)\n", lost);
}

void print_answers(std::vector<ProfileBlock> blocks, const std::vector<std::string> &paths, FILE *out,
                   const std::function<std::string(const std::vector<std::string> &)> &sum) {
    std::stable_sort(blocks.begin(), blocks.end(), [](const auto &a, const auto &b) { return a.seq < b.seq; });
    std::vector<const ProfileBlock *> shown;
    const ProfileBlock *first = nullptr; // the first image that answered: shown if none counted
    size_t silent = 0, unasked = 0;
    uint64_t unasked_hits = 0;
    for (const ProfileBlock &b : blocks) {
        if (b.answers.size() != paths.size()) {
            // Its kprobe_profile (counted in shared memory) says whether it hit anything.
            std::istringstream in(b.text);
            uint64_t hits = 0;
            std::string name;
            for (uint64_t h = 0, m = 0; in >> name >> h >> m;) hits += h;
            unasked += hits != 0;
            unasked_hits += hits;
            continue;
        }
        if (first == nullptr) first = &b;
        // A hist's text ends with its totals: an image that hit nothing says "Hits: 0".
        const bool counted = std::any_of(b.answers.begin(), b.answers.end(), [](const std::string &a) {
            return a.find("\n    Hits: 0\n") == std::string::npos;
        });
        if (counted)
            shown.push_back(&b);
        else
            ++silent;
    }
    if (shown.empty() && first != nullptr) {
        shown.push_back(first);
        --silent;
    }
    const bool headers = shown.size() > 1 || paths.size() > 1;
    for (const ProfileBlock *b : shown)
        for (size_t i = 0; i < paths.size(); ++i) {
            if (headers) fmt::print(out, "# process {} ({}): {}\n", b->pid, b->comm, paths[i]);
            fmt::print(out, "{}", b->answers[i]);
        }
    for (size_t i = 0; i < paths.size() && shown.size() > 1 && sum; ++i) {
        std::vector<std::string> texts;
        for (const ProfileBlock *b : shown) texts.push_back(b->answers[i]);
        if (const std::string total = sum(texts); !total.empty())
            fmt::print(out, "# all {} processes: {}\n{}", shown.size(), paths[i], total);
    }
    if (shown.size() > 1 || silent != 0)
        fmt::print(stderr, "ukprobe: {} process images answered{}\n", shown.size(),
                   silent != 0 ? fmt::format(" ({} more counted nothing)", silent) : "");
    if (unasked != 0)
        fmt::print(stderr,
                   "ukprobe: {} processes that ended unasked (killed, or forked without an exec) hit the events {} "
                   "times: not counted above\n",
                   unasked, unasked_hits);
}

} // namespace ukprobe
