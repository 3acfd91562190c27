// The definition parser under random mutation of real lines, for a bounded time: it
// never crashes, every error points inside the command, and every accepted line shows
// back as a line that parses to the same definition (kprobe_events round trip).
#include <gtest/gtest.h>

#include <cerrno>
#include <chrono>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "trace/parse.hpp"
#include "trace_target.h"

using namespace ukp::trace;

namespace {

// Resolves every symbol and file to one real function, so that the parse goes on to
// the arguments whatever the mutation did to the probe point.
class AnyResolver : public Resolver {
public:
    int resolve_code(std::string_view spec, uint64_t, uint64_t *addr) override {
        if (spec.find_first_of("!@$%^&*()") != std::string_view::npos) return -ENOENT;
        *addr = reinterpret_cast<uint64_t>(&ttarget_triple);
        return 0;
    }
    int resolve_data(std::string_view spec, uint64_t *addr) override {
        if (spec.empty()) return -ENOENT;
        *addr = reinterpret_cast<uint64_t>(&ttarget_counter);
        return 0;
    }
    int resolve_file_offset(std::string_view path, uint64_t, uint64_t *addr, char) override {
        if (path.empty()) return -ENOENT;
        *addr = reinterpret_cast<uint64_t>(&ttarget_triple);
        return 0;
    }
    bool function_entry(uint64_t addr) override { return addr == reinterpret_cast<uint64_t>(&ttarget_triple); }
};

std::vector<std::string> seeds() {
    std::vector<std::string> out;
    std::string here = __FILE__;
    const std::string dir = here.substr(0, here.rfind('/')) + "/../data/trace/";
    for (const char *f : {"good_lines.txt", "syntax_errors.txt"}) {
        std::ifstream in(dir + f);
        std::string line;
        while (std::getline(in, line)) {
            if (line.empty() || line[0] == '#') continue;
            std::string cmd = line.substr(line.find('\t') + 1);
            if (std::string(f) == "good_lines.txt") cmd = line.substr(0, line.find('\t'));
            std::erase(cmd, '^');
            out.push_back(cmd);
        }
    }
    return out;
}

// What kprobe_events would show of `def` (parsed from `line`) parses back to the same thing.
void expect_round_trip(const std::string &line, const ProbeDef &def, Resolver &res) {
    ProbeDef again;
    ProbeError err;
    ASSERT_EQ(parse_definition(def.show(), res, &again, &err), 0) << line << "\n" << def.show();
    ASSERT_EQ(again.show(), def.show()) << line;
}

// A symbol that reads as a number, with an offset of 0: shown without it, "8+0" read back
// as address 8 (found by the test below, in CI).
TEST(TraceParseFuzz, ASymbolThatReadsAsANumberKeepsItsOffset) {
    AnyResolver res;
    for (const char *line : {"p:e 8+0", "r:e 0x10+0", "p:e 8+4", "w:e w@8+0:4"}) {
        ProbeDef def;
        ProbeError err;
        ASSERT_EQ(parse_definition(line, res, &def, &err), 0) << line;
        EXPECT_EQ(def.where, Where::kSymbol) << line;
        EXPECT_NE(def.show().find('+'), std::string::npos) << def.show();
        EXPECT_NO_FATAL_FAILURE(expect_round_trip(line, def, res));
    }
}

TEST(TraceParseFuzz, MutatedLinesForABoundedTime) {
    const auto base = seeds();
    ASSERT_GT(base.size(), 50u);
    std::mt19937_64 rng(20261123);
    const std::string alphabet = " \t:/%@$+-u()[]\\\"=.,0123456789abxsrpdi_lmnoqtcgk";
    AnyResolver res;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(3);
    uint64_t runs = 0, accepted = 0;
    while (std::chrono::steady_clock::now() < until) {
        std::string line = base[rng() % base.size()];
        const int edits = 1 + static_cast<int>(rng() % 4);
        for (int i = 0; i < edits; ++i) {
            const size_t at = line.empty() ? 0 : rng() % (line.size() + 1);
            const char c = alphabet[rng() % alphabet.size()];
            switch (rng() % 3) {
            case 0:
                line.insert(line.begin() + static_cast<long>(at), c);
                break;
            case 1:
                if (at < line.size()) line.erase(at, 1);
                break;
            default:
                if (at < line.size()) line[at] = c;
                break;
            }
        }
        ProbeDef def;
        ProbeError err;
        const int r = parse_definition(line, res, &def, &err);
        ++runs;
        if (r != 0) {
            ASSERT_EQ(r, -EINVAL) << line;
            if (err.logged) {
                ASSERT_GE(err.pos, 0) << line;
                ASSERT_LE(static_cast<size_t>(err.pos), def.command.size()) << line;
            }
            continue;
        }
        if (def.remove) continue;
        ++accepted;
        ASSERT_NO_FATAL_FAILURE(expect_round_trip(line, def, res));
    }
    EXPECT_GT(runs, 1000u);
    EXPECT_GT(accepted, 10u);
    RecordProperty("runs", static_cast<int>(runs));
}

} // namespace
