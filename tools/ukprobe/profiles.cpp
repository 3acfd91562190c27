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

} // namespace ukprobe
