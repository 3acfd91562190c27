// A probe on every instruction of a set of ordinary C++ functions, compiled at -O0, -O2
// and -Os (tests/targets/sweep_functions.cpp), gives the same results as unprobed
// execution, with and without a post_handler (the "boosted" path), and leaves the code
// byte for byte as it was.
//
// For each level, each function, each instruction: register a probe there, run the
// function's driver on fixed seeds, compare with the unprobed results, unregister. The
// drivers themselves (which build the arguments: stack arguments, struct copies,
// function pointers) and the .cold parts GCC splits off either are probed the same way.
// The test also requires most probed instructions to be hit, so that it cannot pass
// without running the probes.
//
// A crash kills the binary (ukprobes owns the signals: the test installs no handler of
// its own). g_sweep_current then names the instruction being probed, for a debugger or
// a core dump; UKP_SWEEP_VERBOSE=1 also prints it to stderr before each run.
#include <ukprobes/kprobes.h>

#include "arch/x86_64/insn.hpp"
#include "symbols/symbols.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ostream>
#include <string>
#include <vector>

// From tests/targets/sweep_functions.cpp (target ukp_sweep_functions). Weak, so that
// without that library the test fails with a message instead of the link failing.
extern "C" {
// Same definition as in sweep_functions.cpp.
struct ukpt_sweep_fn {
    const char *name;
    void *fn;
    long (*drive)(long seed);
};
__attribute__((weak)) const ukpt_sweep_fn *ukpt_sweep_table_O0(size_t *n);
__attribute__((weak)) const ukpt_sweep_fn *ukpt_sweep_table_O2(size_t *n);
__attribute__((weak)) const ukpt_sweep_fn *ukpt_sweep_table_Os(size_t *n);
}

namespace sweep_O0 {
__attribute__((weak)) long run_all(long seed);
}
namespace sweep_O2 {
__attribute__((weak)) long run_all(long seed);
}
namespace sweep_Os {
__attribute__((weak)) long run_all(long seed);
}

// The instruction being probed and how:
//   "O2 fib+0x1a (0x55d0c3a1b4fa) [48 8b 05 ...] with_post".
// Global and not static, for a debugger or a core dump of a crashed run.
extern "C" {
char g_sweep_current[256];
}

namespace {

namespace arch = ukp::arch;
namespace sym = ukp::sym;

constexpr long kSeeds[] = {1, 2, 5};
constexpr size_t kNumSeeds = sizeof kSeeds / sizeof kSeeds[0];
// At least this fraction of the probed instructions must be hit.
constexpr double kMinHitFraction = 0.6;

std::atomic<unsigned long> g_pre{0}, g_post{0};

int count_pre(kprobe *, pt_regs *) {
    g_pre.fetch_add(1, std::memory_order_relaxed);
    return 0;
}

void count_post(kprobe *, pt_regs *, unsigned long) { g_post.fetch_add(1, std::memory_order_relaxed); }

struct Level {
    const char *name;
    const ukpt_sweep_fn *(*table)(size_t *);
    long (*run_all)(long);
};

void PrintTo(const Level &level, std::ostream *os) { *os << level.name; }

const Level kLevels[] = {
    {"O0", ukpt_sweep_table_O0, sweep_O0::run_all},
    {"O2", ukpt_sweep_table_O2, sweep_O2::run_all},
    {"Os", ukpt_sweep_table_Os, sweep_Os::run_all},
};

// A stretch of code probed instruction by instruction: a table function, its driver, or
// the .cold part GCC split off either of them. `entry` runs it.
struct Function {
    std::string name;
    const ukpt_sweep_fn *entry = nullptr;
    uint64_t start = 0;
    uint64_t size = 0;
    std::vector<uint8_t> code; // the bytes before any probe
    std::vector<arch::Insn> insns;
    long expected[kNumSeeds] = {};
};

std::string hex_bytes(const uint8_t *p, size_t n) {
    std::string s;
    char b[4];
    for (size_t i = 0; i < n; ++i) {
        std::snprintf(b, sizeof b, i == 0 ? "%02x" : " %02x", p[i]);
        s += b;
    }
    return s;
}

std::string describe(const char *level, const Function &f, const arch::Insn &in) {
    char head[200];
    std::snprintf(head, sizeof head, "%s %s+0x%llx (%p) [", level, f.name.c_str(),
                  static_cast<unsigned long long>(in.addr - f.start), reinterpret_cast<void *>(in.addr));
    return head + hex_bytes(in.bytes, in.len) + "]";
}

bool padding_only(const uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; ++i)
        if (p[i] != 0x90 && p[i] != 0xcc && p[i] != 0x00) return false;
    return true;
}

// Saves the code of s and decodes it, from its start to its end. False (with a failure)
// if some of it does not decode, trailing padding excepted.
bool load_code(const char *level, const ukpt_sweep_fn &e, std::string name, const sym::Symbol &s, Function *f) {
    f->name = std::move(name);
    f->entry = &e;
    f->start = s.value;
    f->size = s.size;
    const auto *code = reinterpret_cast<const uint8_t *>(f->start);
    f->code.assign(code, code + f->size);
    for (uint64_t off = 0; off < f->size;) {
        arch::Insn in;
        const size_t avail = static_cast<size_t>(f->size - off);
        if (arch::decode(f->start + off, f->code.data() + off, avail, &in) != 0) {
            if (padding_only(f->code.data() + off, avail)) {
                std::printf("[ sweep    ] %s %s: %zu trailing bytes at +0x%llx do not decode; skipped as padding\n",
                            level, f->name.c_str(), avail, static_cast<unsigned long long>(off));
                break;
            }
            ADD_FAILURE() << level << " " << f->name << "+0x" << std::hex << off << ": does not decode: ["
                          << hex_bytes(f->code.data() + off, avail < 15 ? avail : 15) << "]";
            return false;
        }
        f->insns.push_back(in);
        off += in.len;
    }
    return true;
}

// Adds the function at addr (named `name`) and the .cold parts GCC split off it.
bool add_function(const sym::Registry &reg, const char *level, const ukpt_sweep_fn &e, const char *name,
                  const void *addr, std::vector<Function> *out) {
    const auto a = reinterpret_cast<uint64_t>(addr);
    const sym::Object *obj = reg.object_at(a);
    if (obj == nullptr) {
        ADD_FAILURE() << level << " " << name << ": no loaded object holds " << addr;
        return false;
    }
    const sym::Symbol *s = obj->function_at(a);
    if (s == nullptr || s->value != a || s->size == 0) {
        ADD_FAILURE() << level << " " << name << ": no sized function symbol starts at " << addr
                      << (s != nullptr ? " (found " + s->name + ")" : std::string());
        return false;
    }
    Function f;
    if (!load_code(level, e, name, *s, &f)) return false;
    out->push_back(std::move(f));
    const std::string cold = s->name + ".cold";
    for (const sym::Symbol &c : obj->symbols()) {
        if (!c.function || c.size == 0 || c.name.compare(0, cold.size(), cold) != 0) continue;
        Function part;
        if (!load_code(level, e, name + c.name.substr(s->name.size()), c, &part)) return false;
        out->push_back(std::move(part));
    }
    return true;
}

std::string errno_text(int err) {
    const int e = err < 0 ? -err : err;
    const char *name = strerrorname_np(e);
    return std::to_string(err) + " (" + (name != nullptr ? name : "?") + ": " + std::strerror(e) + ")";
}

struct Counts {
    size_t functions = 0;     // table entries
    size_t ranges = 0;        // functions, drivers and .cold parts probed
    size_t probed = 0;        // instructions
    size_t hit = 0;           // instructions hit at least once
    size_t registrations = 0; // probes registered (two per instruction)
    size_t refused = 0;       // registrations that failed
    size_t mismatches = 0;    // runs whose results differed
    unsigned long hits = 0;   // probe hits, all runs
};

class SweepTest : public ::testing::TestWithParam<Level> {};

TEST_P(SweepTest, EveryInstructionSameResults) {
    const Level &level = GetParam();
    const bool verbose = std::getenv("UKP_SWEEP_VERBOSE") != nullptr;
    ASSERT_TRUE(level.table != nullptr && level.run_all != nullptr)
        << "sweep_test must link ukp_sweep_functions (tests/targets/sweep.cmake)";
    size_t n = 0;
    const ukpt_sweep_fn *table = level.table(&n);
    ASSERT_GT(n, 0u);

    sym::Registry reg;
    reg.refresh();

    // Unprobed: bounds, code, instructions and results of every function and of its
    // driver, each driver run twice to check that it is deterministic.
    std::vector<Function> fns;
    for (size_t i = 0; i < n; ++i) {
        const ukpt_sweep_fn &e = table[i];
        const std::string drive_name = std::string("drive_") + e.name;
        const size_t first = fns.size();
        ASSERT_TRUE(add_function(reg, level.name, e, e.name, e.fn, &fns));
        ASSERT_TRUE(
            add_function(reg, level.name, e, drive_name.c_str(), reinterpret_cast<const void *>(e.drive), &fns));
        long expected[kNumSeeds];
        for (size_t s = 0; s < kNumSeeds; ++s) {
            expected[s] = e.drive(kSeeds[s]);
            EXPECT_EQ(e.drive(kSeeds[s]), expected[s])
                << level.name << " " << e.name << ": driver not deterministic, seed " << kSeeds[s];
        }
        for (size_t k = first; k < fns.size(); ++k) std::copy(expected, expected + kNumSeeds, fns[k].expected);
    }
    long run_all_expected[kNumSeeds];
    for (size_t s = 0; s < kNumSeeds; ++s) run_all_expected[s] = level.run_all(kSeeds[s]);

    Counts c;
    c.functions = n;
    c.ranges = fns.size();
    for (const Function &f : fns) {
        for (const arch::Insn &in : f.insns) {
            const std::string where = describe(level.name, f, in);
            SCOPED_TRACE(where);
            ++c.probed;
            unsigned long pre_counts[2] = {0, 0};
            for (int with_post = 1; with_post >= 0; --with_post) {
                const char *mode = with_post ? "with_post" : "boosted";
                std::snprintf(g_sweep_current, sizeof g_sweep_current, "%s %s", where.c_str(), mode);
                if (verbose) {
                    std::fprintf(stderr, "sweep: %s\n", g_sweep_current);
                    std::fflush(stderr);
                }
                kprobe kp{};
                kp.addr = reinterpret_cast<kprobe_opcode_t *>(in.addr);
                kp.pre_handler = count_pre;
                if (with_post) kp.post_handler = count_post;
                g_pre = 0;
                g_post = 0;
                ++c.registrations;
                const int err = register_kprobe(&kp);
                if (err != 0) {
                    ++c.refused;
                    ADD_FAILURE() << "register_kprobe(" << where << ", " << mode << ") = " << errno_text(err);
                    continue;
                }
                long got[kNumSeeds];
                for (size_t s = 0; s < kNumSeeds; ++s) got[s] = f.entry->drive(kSeeds[s]);
                unregister_kprobe(&kp);
                const unsigned long pre = g_pre.load(), post = g_post.load();
                pre_counts[with_post] = pre;
                c.hits += pre;
                bool same = true;
                for (size_t s = 0; s < kNumSeeds; ++s) {
                    EXPECT_EQ(got[s], f.expected[s])
                        << where << " " << mode << ", seed " << kSeeds[s] << ", " << pre << " hits";
                    same = same && got[s] == f.expected[s];
                }
                if (!same) ++c.mismatches;
                EXPECT_EQ(post, with_post ? pre : 0) << where << " " << mode << ": post_handler runs";
                EXPECT_EQ(kp.nmissed, 0u) << where << " " << mode;
            }
            // Same executions either way: the post_handler does not change the path.
            EXPECT_EQ(pre_counts[0], pre_counts[1]) << where << ": hits boosted vs with_post";
            if (pre_counts[0] != 0 || pre_counts[1] != 0) ++c.hit;
        }
    }
    g_sweep_current[0] = '\0';

    // Every probe is gone: the code is what it was, and the whole level still computes
    // the same.
    for (const Function &f : fns) {
        const auto *now = reinterpret_cast<const uint8_t *>(f.start);
        for (size_t i = 0; i < f.size; ++i) {
            if (now[i] != f.code[i]) {
                ADD_FAILURE() << level.name << " " << f.name << "+0x" << std::hex << i << ": byte 0x" << int{now[i]}
                              << " after probing, 0x" << int{f.code[i]} << " before";
                break;
            }
        }
    }
    for (size_t s = 0; s < kNumSeeds; ++s)
        EXPECT_EQ(level.run_all(kSeeds[s]), run_all_expected[s]) << level.name << " run_all, seed " << kSeeds[s];

    std::printf("[ sweep    ] %s: %zu functions (%zu code ranges), %zu instructions probed, %zu hit (%.1f%%), %zu "
                "registrations, "
                "%zu refused, %zu runs differed, %lu probe hits\n",
                level.name, c.functions, c.ranges, c.probed, c.hit, c.probed != 0 ? 100.0 * c.hit / c.probed : 0.0,
                c.registrations, c.refused, c.mismatches, c.hits);
    RecordProperty("functions", static_cast<int>(c.functions));
    RecordProperty("ranges", static_cast<int>(c.ranges));
    RecordProperty("probed", static_cast<int>(c.probed));
    RecordProperty("hit", static_cast<int>(c.hit));
    RecordProperty("refused", static_cast<int>(c.refused));
    RecordProperty("mismatches", static_cast<int>(c.mismatches));
    EXPECT_EQ(c.refused, 0u);
    EXPECT_EQ(c.mismatches, 0u);
    EXPECT_GT(static_cast<double>(c.hit), kMinHitFraction * static_cast<double>(c.probed))
        << level.name << ": too few of the probed instructions were hit";
}

INSTANTIATE_TEST_SUITE_P(Levels, SweepTest, ::testing::ValuesIn(kLevels),
                         [](const auto &info) { return std::string(info.param.name); });

} // namespace
