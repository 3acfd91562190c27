// Per-hit overhead, as the seeds' tables: a direct call of the probed function, the raw
// int3 + SIGTRAP round trip, and kprobes with an empty handler: `k` (with post_handler)
// and `b` (boosted: no post_handler). Ratios are computed from this one run.
#include <ukprobes/kprobes.h>

#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <csignal>
#include <cstdio>
#include <map>
#include <string>
#include <unistd.h>

extern "C" __attribute__((noinline)) int ukb_target(int x) {
    // One ordinary instruction before the ret: the probe goes on `lea 1(%rdi),%eax`.
    return x + 1;
}

namespace {

int empty_pre(kprobe *, pt_regs *) { return 0; }
void empty_post(kprobe *, pt_regs *, unsigned long) {}

void BM_DirectCall(benchmark::State &state) {
    int x = 0;
    for (auto _ : state) benchmark::DoNotOptimize(x = ukb_target(x));
}

void raw_trap_handler(int, siginfo_t *, void *) {}

// Runs before any probe exists, so sigaction() still reaches the kernel directly.
void BM_RawInt3Trap(benchmark::State &state) {
    struct sigaction act {}, old {};
    act.sa_sigaction = raw_trap_handler;
    act.sa_flags = SA_SIGINFO;
    sigaction(SIGTRAP, &act, &old);
    for (auto _ : state) asm volatile("int3" ::: "memory");
    sigaction(SIGTRAP, &old, nullptr);
}

void run_probed(benchmark::State &state, bool with_post) {
    kprobe kp{};
    kp.symbol_name = "ukb_target";
    kp.pre_handler = empty_pre;
    if (with_post) kp.post_handler = empty_post;
    if (int err = register_kprobe(&kp); err != 0) {
        state.SkipWithError(fmt::format("register_kprobe: {}", err).c_str());
        return;
    }
    int x = 0;
    for (auto _ : state) benchmark::DoNotOptimize(x = ukb_target(x));
    unregister_kprobe(&kp);
}

void BM_Kprobe_k(benchmark::State &state) { run_probed(state, true); }
void BM_Kprobe_b(benchmark::State &state) { run_probed(state, false); }

// Registration order is run order: the raw trap must run before the agent installs
// its handlers.
BENCHMARK(BM_RawInt3Trap);
BENCHMARK(BM_DirectCall);
BENCHMARK(BM_Kprobe_k);
BENCHMARK(BM_Kprobe_b);

// Keeps each benchmark's time per iteration to print ratios after the run.
class RatioReporter : public benchmark::ConsoleReporter {
public:
    RatioReporter() : ConsoleReporter(isatty(STDOUT_FILENO) ? OO_ColorTabular : OO_Tabular) {}
    std::map<std::string, double> ns;
    void ReportRuns(const std::vector<Run> &runs) override {
        for (const Run &r : runs)
            if (!r.error_occurred) ns[r.benchmark_name()] = r.GetAdjustedRealTime();
        ConsoleReporter::ReportRuns(runs);
    }
};

} // namespace

int main(int argc, char **argv) {
    benchmark::Initialize(&argc, argv);
    RatioReporter reporter;
    benchmark::RunSpecifiedBenchmarks(&reporter);
    const auto get = [&](const char *name) {
        auto it = reporter.ns.find(name);
        return it == reporter.ns.end() ? 0.0 : it->second;
    };
    const double call = get("BM_DirectCall"), raw = get("BM_RawInt3Trap"), k = get("BM_Kprobe_k"),
                 b = get("BM_Kprobe_b");
    if (call > 0 && raw > 0 && k > 0 && b > 0) {
        std::printf("\nratios (this run):\n");
        std::printf("  raw int3+SIGTRAP / direct call = %8.1f\n", raw / call);
        std::printf("  k / raw trap = %.2f   (goal <= 2.2)\n", k / raw);
        std::printf("  b / raw trap = %.2f   (goal <= 1.3)\n", b / raw);
        std::printf("  k / b        = %.2f\n", k / b);
        std::printf("  per-hit overhead over a direct call: k = %.0f ns, b = %.0f ns\n", k - call, b - call);
    }
    benchmark::Shutdown();
    return 0;
}
