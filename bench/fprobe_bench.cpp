// f: function events over many functions, in one run:
//  - first, before the benchmarks, `f:all libc.so.6:*` (every function of libc, about
//    3,700) defined and enabled once, as a process does the first time: its points are
//    made then (each function decoded for the jump optimizer); printed, not a benchmark.
//  - BM_DefineAllOfLibc / BM_EnableAllOfLibc: the same again, each timed alone (manual
//    time): the points exist (they live as long as the process), so this is the cost of
//    defining and arming the event itself. Counters: the functions armed, the share of
//    them on the jump path once the optimizer is through (`optimized_pct`), how long
//    after the enable it was through (`optimized_ms`), and how long the disable that
//    follows took (`disable_ms`).
//  - BM_OneEventInALargeLibraryAtRunTime: one event defined and enabled while the program
//    runs, on a function of a large library just loaded (libpython3.11, 2.9 MB of code)
//    whose reference table is not built: the time until `enable` returns (manual time),
//    and, as a counter, until the optimizer thread's tables thread built the table and
//    the jump is in (`jump_ms`). The library is unloaded after each iteration, its table
//    with it.
//  - BM_SingleEvent / BM_GlobEvent: the hit of an entry event on one function, defined by
//    name (`f:one fbt_target`) and by a glob that covers it and its neighbours
//    (`f:many fbt_*`): the cost per hit is that of a single event. Ratios at the end.
// Repeated 3 times in random order; the fastest repetition of each is reported.
#include <ukprobes/kprobes.h>
#include <ukprobes/trace.h>

#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <map>
#include <string>
#include <vector>

extern "C" {
__attribute__((noinline)) long fbt_target(long a) {
    __asm__ volatile("" ::: "memory");
    return a + 1;
}
__attribute__((noinline)) long fbt_neighbour(long a) {
    __asm__ volatile("" ::: "memory");
    return a + 2;
}
__attribute__((noinline)) long fbt_other(long a) {
    __asm__ volatile("" ::: "memory");
    return a + 3;
}
}

namespace {

using Clock = std::chrono::steady_clock;

long (*volatile g_target)(long) = fbt_target;

double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

// Counts the probe rows of kprobes/list (ukp_kprobes_list: one per function) and those on
// the jump path.
void count_probes(int *rows, int *optimized) {
    char *l = ukp_kprobes_list();
    *rows = *optimized = 0;
    for (char *p = l; p != nullptr && (p = std::strchr(p, '\n')) != nullptr; ++p) ++*rows;
    for (char *p = l; p != nullptr && (p = std::strstr(p, "[OPTIMIZED]")) != nullptr; ++p) ++*optimized;
    std::free(l);
}

constexpr const char *kAll = "f:all libc.so.6:*";

void BM_DefineAllOfLibc(benchmark::State &state) {
    for (auto _ : state) {
        ukp_trace_write("dynamic_events", "");
        const Clock::time_point t = Clock::now();
        const int r = ukp_trace_write("dynamic_events", kAll);
        state.SetIterationTime(ms_since(t) / 1000);
        if (r != 0) {
            state.SkipWithError("definition rejected");
            break;
        }
    }
    ukp_trace_write("dynamic_events", "");
}

void BM_EnableAllOfLibc(benchmark::State &state) {
    int rows = 0, optimized = 0;
    double through_ms = 0, disable_ms = 0;
    for (auto _ : state) {
        ukp_trace_write("dynamic_events", "");
        if (ukp_trace_write("dynamic_events", kAll) != 0) {
            state.SkipWithError("definition rejected");
            break;
        }
        const Clock::time_point t = Clock::now();
        const int r = ukp_trace_write("events/fprobes/all/enable", "1");
        state.SetIterationTime(ms_since(t) / 1000);
        ukp_optimizer_flush();
        through_ms = ms_since(t);
        count_probes(&rows, &optimized);
        const Clock::time_point d = Clock::now();
        ukp_trace_write("events/fprobes/all/enable", "0");
        disable_ms = ms_since(d);
        if (r != 0) {
            state.SkipWithError("enable failed");
            break;
        }
    }
    ukp_trace_write("dynamic_events", "");
    state.counters["functions"] = rows;
    state.counters["optimized_pct"] = rows > 0 ? 100.0 * optimized / rows : 0;
    state.counters["optimized_ms"] = through_ms;
    state.counters["disable_ms"] = disable_ms;
}

constexpr const char *kLargeLibrary = "libpython3.11.so.1.0";

void BM_OneEventInALargeLibraryAtRunTime(benchmark::State &state) {
    double jump_ms = 0;
    int rows = 0, optimized = 0;
    for (auto _ : state) {
        void *lib = dlopen(kLargeLibrary, RTLD_NOW | RTLD_LOCAL);
        if (lib == nullptr) {
            state.SkipWithError("libpython3.11 is not installed");
            break;
        }
        const Clock::time_point t = Clock::now();
        const int r = ukp_trace_write("dynamic_events", "p:one libpython3.11.so.1.0:PyList_New");
        const int e = r == 0 ? ukp_trace_write("events/kprobes/one/enable", "1") : r;
        state.SetIterationTime(ms_since(t) / 1000);
        ukp_optimizer_flush();
        jump_ms = ms_since(t);
        count_probes(&rows, &optimized);
        ukp_trace_write("events/kprobes/one/enable", "0");
        ukp_trace_write("dynamic_events", "");
        dlclose(lib);
        if (r != 0 || e != 0) {
            state.SkipWithError("event not set up");
            break;
        }
    }
    state.counters["jump_ms"] = jump_ms;
    state.counters["optimized"] = optimized;
}

void run_calls(benchmark::State &state, const char *line, const char *enable) {
    ukp_trace_write("dynamic_events", "");
    if (ukp_trace_write("dynamic_events", line) != 0 || ukp_trace_write(enable, "1") != 0) {
        state.SkipWithError("event not set up");
        return;
    }
    ukp_trace_write("tracing_on", "1");
    ukp_optimizer_flush();
    long x = 0;
    for (auto _ : state) benchmark::DoNotOptimize(x += g_target(x));
    ukp_trace_write(enable, "0");
    ukp_trace_write("dynamic_events", "");
    ukp_trace_write("trace", "");
}

void BM_SingleEvent(benchmark::State &state) { run_calls(state, "f:one fbt_target", "events/fprobes/one/enable"); }
void BM_GlobEvent(benchmark::State &state) { run_calls(state, "f:many fbt_*", "events/fprobes/many/enable"); }

BENCHMARK(BM_DefineAllOfLibc)->UseManualTime()->Iterations(1)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_EnableAllOfLibc)->UseManualTime()->Iterations(1)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_OneEventInALargeLibraryAtRunTime)->UseManualTime()->Iterations(3)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_SingleEvent);
BENCHMARK(BM_GlobEvent);

// Each benchmark's fastest repetition, for the ratios printed after the table.
class FastestReporter : public benchmark::ConsoleReporter {
public:
    std::map<std::string, double> ns;
    double jump_ms = 0; // BM_OneEventInALargeLibraryAtRunTime's, in its fastest repetition
    void ReportRuns(const std::vector<Run> &runs) override {
        for (const Run &r : runs) {
            if (r.run_type != Run::RT_Iteration) continue;
            const double t = r.GetAdjustedRealTime();
            if (auto it = ns.find(r.benchmark_name()); it == ns.end() || t < it->second) {
                ns[r.benchmark_name()] = t;
                if (auto c = r.counters.find("jump_ms"); c != r.counters.end()) jump_ms = c->second;
            }
        }
        ConsoleReporter::ReportRuns(runs);
    }
};

bool given(int argc, char **argv, const char *flag) {
    for (int i = 1; i < argc; ++i)
        if (std::strncmp(argv[i], flag, std::strlen(flag)) == 0) return true;
    return false;
}

} // namespace

// The first definition and enable of kAll in this process, printed.
void first_time() {
    const Clock::time_point t = Clock::now();
    const int r = ukp_trace_write("dynamic_events", kAll);
    const double define_ms = ms_since(t);
    const Clock::time_point e = Clock::now();
    const int r2 = ukp_trace_write("events/fprobes/all/enable", "1");
    const double enable_ms = ms_since(e);
    ukp_optimizer_flush();
    const double through_ms = ms_since(e);
    int rows = 0, optimized = 0;
    count_probes(&rows, &optimized);
    ukp_trace_write("events/fprobes/all/enable", "0");
    ukp_trace_write("dynamic_events", "");
    std::printf("first time in this process (%d, %d): %s defined in %.1f ms, enabled in %.1f ms; %d functions, "
                "%.1f%% on the jump path %.1f ms after the enable\n\n",
                r, r2, kAll, define_ms, enable_ms, rows, rows > 0 ? 100.0 * optimized / rows : 0.0, through_ms);
}

int main(int argc, char **argv) {
    first_time();
    std::vector<char *> args(argv, argv + argc);
    std::string reps = "--benchmark_repetitions=3", interleave = "--benchmark_enable_random_interleaving=true";
    if (!given(argc, argv, "--benchmark_repetitions")) {
        args.push_back(reps.data());
        args.push_back(interleave.data());
    }
    int n = static_cast<int>(args.size());
    args.push_back(nullptr);
    benchmark::Initialize(&n, args.data());
    FastestReporter rep;
    benchmark::RunSpecifiedBenchmarks(&rep);
    if (const double one = rep.ns["BM_SingleEvent"]; one > 0)
        std::printf("\nhit of the glob's event / hit of the single function's event: %.2fx\n",
                    rep.ns["BM_GlobEvent"] / one);
    if (const double ms = rep.ns["BM_OneEventInALargeLibraryAtRunTime/iterations:3/manual_time"]; ms > 0)
        std::printf("one event in libpython3.11 at run time: enabled in %.1f ms, its jump in place %.0f ms later "
                    "(%.0fx: the table is built after the enable returns)\n",
                    ms, rep.jump_ms - ms, rep.jump_ms / ms);
    benchmark::Shutdown();
    return 0;
}
