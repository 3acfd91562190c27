// Cost of a trace event hit against the bare probe hit, in one run: a direct call of the
// probed function, a kprobe with an empty pre_handler (`bare`), a kretprobe with an empty
// handler (the baseline of a latency histogram), and kprobe events on the
// same function recording 0 arguments, 4 register arguments, and 4 arguments of which
// one is a string and one a dereference; a return event (`r:`) with the return value; the
// 4-register event beside a disabled return event; a latency histogram, and the steps it
// is built of. Every event hit writes its record into the ring buffer (tracing on, no
// filter); the latency's events record nothing, their triggers run. Ratios
// to `bare` are printed at the end.
//
// These VMs change speed within minutes, so unless told otherwise the run repeats each
// benchmark 5 times in random order (Google Benchmark's random interleaving), and the
// ratios are those of each benchmark's fastest repetition: one slow minute no longer
// lands on one benchmark and not on the other.
#include <ukprobes/kprobes.h>
#include <ukprobes/trace.h>

#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

extern "C" __attribute__((noinline)) long utb_target(long a, const char *s, const long *p, long d) {
    __asm__ volatile("" ::: "memory");
    return a + d + (s != nullptr) + (p != nullptr);
}

namespace {

long (*volatile g_target)(long, const char *, const long *, long) = utb_target;
const char g_text[] = "a string of some thirty bytes.";
const long g_value = 42;

int empty_pre(kprobe *, pt_regs *) { return 0; }

void run_calls(benchmark::State &state) {
    ukp_optimizer_flush(); // the probes on their jumps before the timing starts, not on int3s
    long x = 0;
    for (auto _ : state) benchmark::DoNotOptimize(x += g_target(x, g_text, &g_value, 3));
}

void BM_DirectCall(benchmark::State &state) { run_calls(state); }

void BM_BareProbe(benchmark::State &state) {
    kprobe kp{};
    kp.symbol_name = "utb_target";
    kp.pre_handler = empty_pre;
    if (register_kprobe(&kp) != 0) {
        state.SkipWithError("register_kprobe failed");
        return;
    }
    run_calls(state);
    unregister_kprobe(&kp);
}

// A kretprobe with an empty handler: the entry and the return through the return
// trampoline, what any measure of a function's latency needs before it does anything.
void BM_BareReturnProbe(benchmark::State &state) {
    kretprobe rp{};
    rp.kp.symbol_name = "utb_target";
    rp.handler = [](kretprobe_instance *, pt_regs *) { return 0; };
    if (register_kretprobe(&rp) != 0) {
        state.SkipWithError("register_kretprobe failed");
        return;
    }
    run_calls(state);
    unregister_kretprobe(&rp);
}

// One event on utb_target, defined by `line`, enabled for the run.
void run_event(benchmark::State &state, const char *name, const char *line) {
    ukp_trace_write("kprobe_events", "");
    if (ukp_trace_write("kprobe_events", line) != 0) {
        state.SkipWithError("definition rejected");
        return;
    }
    const std::string enable = std::string("events/kprobes/") + name + "/enable";
    ukp_trace_write(enable.c_str(), "1");
    ukp_trace_write("tracing_on", "1");
    run_calls(state);
    ukp_trace_write(enable.c_str(), "0");
    ukp_trace_write("kprobe_events", "");
    ukp_trace_write("trace", "");
}

void BM_Event0(benchmark::State &state) { run_event(state, "e0", "p:e0 utb_target"); }
void BM_Event4Regs(benchmark::State &state) { run_event(state, "e4", "p:e4 utb_target a=%di s=%si p=%dx d=%cx"); }
void BM_Event4StringDeref(benchmark::State &state) {
    run_event(state, "e4s", "p:e4s utb_target a=%di s=+0(%si):string v=+0(%dx):s64 d=%cx");
}
// A return event: the kretprobe's entry and its return through the return trampoline.
void BM_ReturnEvent(benchmark::State &state) { run_event(state, "rv", "r:rv utb_target ret=$retval"); }
// With an argument at entry: the kretprobe has an entry_handler, which saves it.
void BM_ReturnEventWithEntryArg(benchmark::State &state) {
    run_event(state, "rva", "r:rva utb_target x=$arg1 ret=$retval");
}
// The 4-register event with a return event on the same function defined and not enabled
// (a user's entry and exit events, one of them on): two probes at the point, one disabled.
void BM_Event4RegsBesideADisabledOne(benchmark::State &state) {
    ukp_trace_write("kprobe_events", "");
    if (ukp_trace_write("kprobe_events", "r:off utb_target ret=$retval") != 0 ||
        ukp_trace_append("kprobe_events", "p:e4d utb_target a=%di s=%si p=%dx d=%cx") != 0) {
        state.SkipWithError("definitions rejected");
        return;
    }
    ukp_trace_write("events/kprobes/e4d/enable", "1");
    ukp_trace_write("tracing_on", "1");
    run_calls(state);
    ukp_trace_write("events/kprobes/e4d/enable", "0");
    ukp_trace_write("kprobe_events", "");
    ukp_trace_write("trace", "");
}

// Writes each (file, text) of `setup` (appended), runs the calls, then removes the
// triggers (in reverse) and every dynamic event. Nothing is enabled: only triggers run.
void run_with_triggers(benchmark::State &state, const std::vector<std::pair<const char *, std::string>> &setup) {
    ukp_trace_write("dynamic_events", "");
    size_t done = 0;
    for (; done < setup.size(); ++done)
        if (ukp_trace_append(setup[done].first, setup[done].second.c_str()) != 0) {
            state.SkipWithError(setup[done].second.c_str());
            break;
        }
    if (done == setup.size()) run_calls(state);
    while (done-- > 0)
        if (std::strstr(setup[done].first, "/trigger") != nullptr)
            ukp_trace_append(setup[done].first, ("!" + setup[done].second).c_str());
    ukp_trace_write("dynamic_events", "");
}

constexpr const char *kEntry = "f:lat_in utb_target", *kExit = "f:lat_out utb_target%return";
constexpr const char *kEntryTrigger = "events/fprobes/lat_in/trigger", *kExitTrigger = "events/fprobes/lat_out/trigger";

// histogram.rst's latency recipe on the function: its entry keeps the time in a variable,
// its exit computes the latency and passes it to a synthetic event whose histogram counts
// it (nothing recorded into the ring: the events are not enabled, their triggers run).
void BM_LatencyHistogram(benchmark::State &state) {
    run_with_triggers(state, {{"dynamic_events", kEntry},
                              {"dynamic_events", kExit},
                              {"synthetic_events", "utb_latency u64 lat"},
                              {kEntryTrigger, "hist:keys=common_pid:ts0=common_timestamp"},
                              {kExitTrigger, "hist:keys=common_pid:lat=common_timestamp-$ts0:onmatch(fprobes.lat_in)."
                                             "utb_latency($lat)"},
                              {"events/synthetic/utb_latency/trigger", "hist:keys=lat.log2"}});
}

// The recipe built up a step at a time, to show where its cost lies. 1: the entry event
// with a histogram keyed by common_pid; 2: the same keeping common_timestamp in a
// variable; 3: the entry's and the exit's events, each with a histogram keyed by
// common_pid (two probes at the function's entry); 4: both with the recipe's variables,
// the latency computed, no synthetic event. And the two probes of 3 with empty handlers.
void BM_LatencyStep1EntryHist(benchmark::State &state) {
    run_with_triggers(state, {{"dynamic_events", kEntry}, {kEntryTrigger, "hist:keys=common_pid"}});
}
void BM_LatencyStep2EntryTimestamp(benchmark::State &state) {
    run_with_triggers(state,
                      {{"dynamic_events", kEntry}, {kEntryTrigger, "hist:keys=common_pid:ts0=common_timestamp"}});
}
void BM_LatencyStep3EntryAndExitHists(benchmark::State &state) {
    run_with_triggers(state, {{"dynamic_events", kEntry},
                              {"dynamic_events", kExit},
                              {kEntryTrigger, "hist:keys=common_pid"},
                              {kExitTrigger, "hist:keys=common_pid"}});
}
void BM_LatencyStep4Latency(benchmark::State &state) {
    run_with_triggers(state, {{"dynamic_events", kEntry},
                              {"dynamic_events", kExit},
                              {kEntryTrigger, "hist:keys=common_pid:ts0=common_timestamp"},
                              {kExitTrigger, "hist:keys=common_pid:lat=common_timestamp-$ts0"}});
}
void BM_BareProbeAndReturnProbe(benchmark::State &state) {
    kprobe kp{};
    kp.symbol_name = "utb_target";
    kp.pre_handler = empty_pre;
    kretprobe rp{};
    rp.kp.symbol_name = "utb_target";
    rp.handler = [](kretprobe_instance *, pt_regs *) { return 0; };
    if (register_kprobe(&kp) != 0) {
        state.SkipWithError("register_kprobe failed");
        return;
    }
    if (register_kretprobe(&rp) != 0) {
        unregister_kprobe(&kp);
        state.SkipWithError("register_kretprobe failed");
        return;
    }
    run_calls(state);
    unregister_kretprobe(&rp);
    unregister_kprobe(&kp);
}

// The bare probe and the 4-register event with two threads hitting at once, one per CPU
// here: what their hits share. The first thread sets up before the timed loop and tears
// down after it; the benchmark's barriers at the loop's start and end order them.
void run_two_threads(benchmark::State &state, const char *name, const char *line) {
    static kprobe kp;
    static bool ready;
    const std::string enable = std::string("events/kprobes/") + (name != nullptr ? name : "") + "/enable";
    if (state.thread_index() == 0) {
        if (name == nullptr) {
            kp = kprobe{};
            kp.symbol_name = "utb_target";
            kp.pre_handler = empty_pre;
            ready = register_kprobe(&kp) == 0;
        } else {
            ukp_trace_write("kprobe_events", "");
            ready = ukp_trace_write("kprobe_events", line) == 0 && ukp_trace_write(enable.c_str(), "1") == 0 &&
                    ukp_trace_write("tracing_on", "1") == 0;
        }
        ukp_optimizer_flush();
    }
    long x = 0;
    for (auto _ : state) {
        if (!ready) {
            state.SkipWithError("setup failed");
            break;
        }
        benchmark::DoNotOptimize(x += g_target(x, g_text, &g_value, 3));
    }
    if (state.thread_index() == 0) {
        if (name == nullptr) {
            unregister_kprobe(&kp);
        } else {
            ukp_trace_write(enable.c_str(), "0");
            ukp_trace_write("kprobe_events", "");
            ukp_trace_write("trace", "");
        }
    }
}

void BM_BareProbe_TwoThreads(benchmark::State &state) { run_two_threads(state, nullptr, nullptr); }
void BM_Event4Regs_TwoThreads(benchmark::State &state) {
    run_two_threads(state, "e4t", "p:e4t utb_target a=%di s=%si p=%dx d=%cx");
}

BENCHMARK(BM_DirectCall);
BENCHMARK(BM_BareProbe);
BENCHMARK(BM_BareReturnProbe);
BENCHMARK(BM_Event0);
BENCHMARK(BM_Event4Regs);
BENCHMARK(BM_Event4StringDeref);
BENCHMARK(BM_ReturnEvent);
BENCHMARK(BM_ReturnEventWithEntryArg);
BENCHMARK(BM_Event4RegsBesideADisabledOne);
BENCHMARK(BM_LatencyHistogram);
BENCHMARK(BM_LatencyStep1EntryHist);
BENCHMARK(BM_LatencyStep2EntryTimestamp);
BENCHMARK(BM_LatencyStep3EntryAndExitHists);
BENCHMARK(BM_LatencyStep4Latency);
BENCHMARK(BM_BareProbeAndReturnProbe);
BENCHMARK(BM_BareProbe_TwoThreads)->Threads(2);
BENCHMARK(BM_Event4Regs_TwoThreads)->Threads(2);

// Collects each benchmark's fastest repetition (time per iteration) to print the ratios
// after the usual table.
class RatioReporter : public benchmark::ConsoleReporter {
public:
    std::map<std::string, double> ns;
    void ReportRuns(const std::vector<Run> &runs) override {
        for (const Run &r : runs) {
            if (r.run_type != Run::RT_Iteration) continue; // the mean, median and stddev rows
            const std::string name = r.benchmark_name();
            const double t = r.GetAdjustedRealTime();
            if (auto it = ns.find(name); it == ns.end() || t < it->second) ns[name] = t;
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

int main(int argc, char **argv) {
    // The defaults of this benchmark (see the top): flags given on the command line win.
    std::vector<char *> args(argv, argv + argc);
    std::string reps = "--benchmark_repetitions=5", interleave = "--benchmark_enable_random_interleaving=true",
                min_time = "--benchmark_min_time=0.2";
    if (!given(argc, argv, "--benchmark_repetitions")) {
        args.push_back(reps.data());
        if (!given(argc, argv, "--benchmark_enable_random_interleaving")) args.push_back(interleave.data());
        if (!given(argc, argv, "--benchmark_min_time")) args.push_back(min_time.data());
    }
    int n = static_cast<int>(args.size());
    args.push_back(nullptr);
    argc = n;
    argv = args.data();
    benchmark::Initialize(&argc, argv);
    RatioReporter rep;
    benchmark::RunSpecifiedBenchmarks(&rep);
    const double bare = rep.ns["BM_BareProbe"];
    if (bare > 0) {
        std::printf("\nratio to the bare probe hit, fastest repetitions (direct call subtracted from neither):\n");
        for (const char *n :
             {"BM_Event0", "BM_Event4Regs", "BM_Event4StringDeref", "BM_ReturnEvent", "BM_Event4RegsBesideADisabledOne",
              "BM_LatencyHistogram", "BM_LatencyStep1EntryHist", "BM_LatencyStep2EntryTimestamp",
              "BM_LatencyStep3EntryAndExitHists", "BM_LatencyStep4Latency", "BM_BareProbeAndReturnProbe"})
            std::printf("  %-32s %6.2fx\n", n, rep.ns[n] / bare);
        if (const double ret = rep.ns["BM_BareReturnProbe"]; ret > 0)
            std::printf("ratio to the bare return probe (entry and return, empty handler):\n  %-32s %6.2fx\n"
                        "  %-32s %6.2fx\n",
                        "BM_BareReturnProbe", ret / bare, "BM_LatencyHistogram", rep.ns["BM_LatencyHistogram"] / ret);
    }
    benchmark::Shutdown();
    return 0;
}
