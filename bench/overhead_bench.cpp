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

int empty_ret(kretprobe_instance *, pt_regs *) { return 0; }

int j_target(int) {
    jprobe_return();
    return 0;
}

// The seeds' r, kr, j and jr: a kretprobe, a kprobe and a kretprobe on one function, a
// jprobe, a jprobe and a kretprobe.
void run_combination(benchmark::State &state, bool kprobe_too, bool kretprobe_too, bool jprobe_too) {
    kprobe kp{};
    kp.symbol_name = "ukb_target";
    kp.pre_handler = empty_pre;
    kretprobe rp{};
    rp.kp.symbol_name = "ukb_target";
    rp.handler = empty_ret;
    jprobe jp{};
    jp.kp.symbol_name = "ukb_target";
    jp.entry = JPROBE_ENTRY(j_target);
    int err = 0;
    if (kprobe_too && err == 0) err = register_kprobe(&kp);
    if (kretprobe_too && err == 0) err = register_kretprobe(&rp);
    if (jprobe_too && err == 0) err = register_jprobe(&jp);
    if (err == 0) {
        int x = 0;
        for (auto _ : state) benchmark::DoNotOptimize(x = ukb_target(x));
    } else {
        state.SkipWithError(fmt::format("register: {}", err).c_str());
    }
    if (jprobe_too) unregister_jprobe(&jp);
    if (kretprobe_too) unregister_kretprobe(&rp);
    if (kprobe_too) unregister_kprobe(&kp);
}

void BM_Kretprobe_r(benchmark::State &state) { run_combination(state, false, true, false); }
void BM_KprobeKretprobe_kr(benchmark::State &state) { run_combination(state, true, true, false); }
void BM_Jprobe_j(benchmark::State &state) { run_combination(state, false, false, true); }
void BM_JprobeKretprobe_jr(benchmark::State &state) { run_combination(state, false, true, true); }

// Registration order is run order: the raw trap must run before the agent installs
// its handlers.
BENCHMARK(BM_RawInt3Trap);
BENCHMARK(BM_DirectCall);
BENCHMARK(BM_Kprobe_k);
BENCHMARK(BM_Kprobe_b);
BENCHMARK(BM_Kretprobe_r);
BENCHMARK(BM_KprobeKretprobe_kr);
BENCHMARK(BM_Jprobe_j);
BENCHMARK(BM_JprobeKretprobe_jr);

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
    const double r = get("BM_Kretprobe_r"), kr = get("BM_KprobeKretprobe_kr"), j = get("BM_Jprobe_j"),
                 jr = get("BM_JprobeKretprobe_jr");
    if (call > 0 && raw > 0 && k > 0 && b > 0) {
        std::printf("\nratios (this run):\n");
        std::printf("  raw int3+SIGTRAP / direct call = %8.1f\n", raw / call);
        std::printf("  k / raw trap = %.2f   (goal <= 2.2)\n", k / raw);
        std::printf("  b / raw trap = %.2f   (goal <= 1.3)\n", b / raw);
        std::printf("  k / b        = %.2f\n", k / b);
        std::printf("  per-hit overhead over a direct call: k = %.0f ns, b = %.0f ns\n", k - call, b - call);
    }
    if (call > 0 && b > 0 && r > 0 && kr > 0 && j > 0 && jr > 0) {
        std::printf("  r / b        = %.2f   (goal <= 2.0)\n", r / b);
        std::printf("  kr / r       = %.2f   (a kprobe beside a kretprobe shares its trap)\n", kr / r);
        std::printf("  j / b        = %.2f   (a jprobe traps twice: entry and jprobe_return)\n", j / b);
        std::printf("  jr / j       = %.2f\n", jr / j);
        std::printf("  over a direct call: r %.0f ns, kr %.0f ns, j %.0f ns, jr %.0f ns\n", r - call, kr - call,
                    j - call, jr - call);
    }
    benchmark::Shutdown();
    return 0;
}
