// Watchpoints (<ukprobes/hw_breakpoint.h>, w: events): what a write costs unwatched, the
// kernel's part of a hit alone (a perf breakpoint signalling a handler that does nothing),
// an int3 trap for scale, a
// watched write (a hit: the CPU's debug trap, the kernel's SIGTRAP, the agent's handler),
// a write to the word beside a watched one (a miss), a w: event's hit (the hit recorded into
// the trace ring), and gdb's hardware watchpoint on the same kind of write (a `watch` whose
// commands only continue: a ptrace stop and resume per write), measured by running gdb on
// watch_target with two numbers of writes. Ratios are computed from this one run.
#include <ukprobes/hw_breakpoint.h>
#include <ukprobes/trace.h>

#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <chrono>
#include <csignal>
#include <sys/syscall.h>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <unistd.h>

extern "C" {
alignas(64) volatile long ukb_watched[8];
}

namespace {

std::map<std::string, double> g_ns; // per-write time of each benchmark, for the ratios

void empty_handler(struct perf_event *, struct perf_sample_data *, struct pt_regs *) {}

perf_event *watch_first_word() {
    perf_event_attr attr;
    hw_breakpoint_init(&attr);
    attr.bp_addr = reinterpret_cast<unsigned long>(&ukb_watched[0]);
    attr.bp_len = HW_BREAKPOINT_LEN_8;
    attr.bp_type = HW_BREAKPOINT_W;
    return register_user_hw_breakpoint(&attr, empty_handler, nullptr, 0);
}

void BM_Write_Unwatched(benchmark::State &state) {
    long i = 0;
    for (auto _ : state) ukb_watched[0] = ++i;
}

void raw_trap_handler(int, siginfo_t *, void *) {}

// The kernel's part alone: a perf breakpoint with sigtrap and a handler that does nothing.
// Runs before any breakpoint is registered, so sigaction() still reaches the kernel
// directly (the agent's handlers are not installed yet).
void BM_Write_RawPerfTrap(benchmark::State &state) {
    struct sigaction act {
    }, old{};
    act.sa_sigaction = raw_trap_handler;
    act.sa_flags = SA_SIGINFO;
    sigaction(SIGTRAP, &act, &old);
    perf_event_attr attr;
    hw_breakpoint_init(&attr);
    attr.bp_addr = reinterpret_cast<unsigned long>(&ukb_watched[0]);
    attr.bp_len = HW_BREAKPOINT_LEN_8;
    attr.bp_type = HW_BREAKPOINT_W;
    attr.exclude_kernel = 1;
    attr.sigtrap = 1;
    attr.remove_on_exec = 1;
    const long fd = syscall(SYS_perf_event_open, &attr, 0, -1, -1, PERF_FLAG_FD_CLOEXEC);
    if (fd < 0) {
        state.SkipWithError("perf_event_open");
    } else {
        long i = 0;
        for (auto _ : state) ukb_watched[0] = ++i;
        close(static_cast<int>(fd));
    }
    sigaction(SIGTRAP, &old, nullptr);
}

// For scale: an int3 and a SIGTRAP handler that returns (what an unoptimized kprobe costs
// the kernel). Before any breakpoint too.
void BM_RawInt3Trap(benchmark::State &state) {
    struct sigaction act {
    }, old{};
    act.sa_sigaction = raw_trap_handler;
    act.sa_flags = SA_SIGINFO;
    sigaction(SIGTRAP, &act, &old);
    for (auto _ : state) asm volatile("int3" ::: "memory");
    sigaction(SIGTRAP, &old, nullptr);
}

// Writes word `index` of ukb_watched while its first word is watched with an empty handler.
void write_beside_watch(benchmark::State &state, int index) {
    perf_event *bp = watch_first_word();
    if (IS_ERR(bp)) {
        state.SkipWithError(fmt::format("register_user_hw_breakpoint: {}", PTR_ERR(bp)).c_str());
        return;
    }
    long i = 0;
    for (auto _ : state) ukb_watched[index] = ++i;
    unregister_hw_breakpoint(bp);
}

void BM_Write_Watched(benchmark::State &state) { write_beside_watch(state, 0); }
void BM_Write_Neighbour(benchmark::State &state) { write_beside_watch(state, 1); }

void BM_Write_WatchEvent(benchmark::State &state) {
    ukp_trace_write("buffer_size_kb", "4096");
    if (int r = ukp_trace_append("dynamic_events", "w:bw w@ukb_watched:8 v=$value:s64"); r != 0) {
        state.SkipWithError(fmt::format("w: definition: {}", r).c_str());
        return;
    }
    ukp_trace_write("events/wprobes/bw/enable", "1");
    long i = 0;
    for (auto _ : state) ukb_watched[0] = ++i;
    ukp_trace_write("events/wprobes/bw/enable", "0");
    ukp_trace_append("dynamic_events", "-:wprobes/bw");
    ukp_trace_write("trace", "");
}

// Seconds gdb takes to run watch_target with `writes` writes under a watchpoint whose
// commands only continue (a command file: -ex takes no multi-line command).
double gdb_seconds(long writes) {
    char script[] = "/tmp/ukb-watch-XXXXXX";
    const int fd = mkstemp(script);
    if (fd < 0) return -1;
    const std::string text = "break main\nrun\nwatch watched\ncommands\nsilent\ncontinue\nend\ncontinue\n";
    const bool written = write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
    close(fd);
    const std::string cmd =
        fmt::format("gdb -q -batch -nx -x {} --args {} {} >/dev/null 2>&1", script, UKB_WATCH_TARGET, writes);
    const auto t0 = std::chrono::steady_clock::now();
    const int rc = written ? std::system(cmd.c_str()) : -1;
    const auto t1 = std::chrono::steady_clock::now();
    unlink(script);
    if (rc != 0) return -1;
    return std::chrono::duration<double>(t1 - t0).count();
}

// gdb's hardware watchpoint: the difference of two sessions, per write.
void BM_Write_GdbWatch(benchmark::State &state) {
    constexpr long kFew = 100, kMany = 2100;
    for (auto _ : state) {
        const double few = gdb_seconds(kFew), many = gdb_seconds(kMany);
        if (few < 0 || many < 0) {
            state.SkipWithError("gdb did not run watch_target");
            return;
        }
        state.SetIterationTime((many - few) / double(kMany - kFew));
    }
}

} // namespace

BENCHMARK(BM_Write_Unwatched);
BENCHMARK(BM_Write_RawPerfTrap);
BENCHMARK(BM_RawInt3Trap);
BENCHMARK(BM_Write_Neighbour);
BENCHMARK(BM_Write_Watched);
BENCHMARK(BM_Write_WatchEvent);
BENCHMARK(BM_Write_GdbWatch)->UseManualTime()->Iterations(3)->Unit(benchmark::kMicrosecond);

// The ratios of this run, after the table.
int main(int argc, char **argv) {
    benchmark::Initialize(&argc, argv);
    struct Keep : benchmark::ConsoleReporter {
        void ReportRuns(const std::vector<Run> &runs) override {
            ConsoleReporter::ReportRuns(runs);
            for (const Run &r : runs)
                if (!r.error_occurred)
                    g_ns[r.benchmark_name()] =
                        r.GetAdjustedRealTime() * (r.time_unit == benchmark::kMicrosecond ? 1000.0 : 1.0);
        }
    } reporter;
    benchmark::RunSpecifiedBenchmarks(&reporter);
    const double base = g_ns["BM_Write_Unwatched"];
    std::printf("\nPer write, this run:\n");
    for (const auto &[name, ns] : g_ns)
        std::printf("  %-40s %12.1f ns  %10.1fx an unwatched write\n", name.c_str(), ns, base > 0 ? ns / base : 0.0);
    const double hit = g_ns["BM_Write_Watched"], gdb = g_ns["BM_Write_GdbWatch/iterations:3/manual_time"];
    const double raw = g_ns["BM_Write_RawPerfTrap"];
    if (hit > 0 && raw > 0) std::printf("  a ukprobes hit / the kernel's part alone: %.2fx\n", hit / raw);
    const double int3 = g_ns["BM_RawInt3Trap"];
    if (hit > 0 && int3 > 0) std::printf("  a ukprobes hit / an int3 trap: %.1fx\n", hit / int3);
    if (hit > 0 && gdb > 0) std::printf("  gdb's watch / a ukprobes hit: %.1fx\n", gdb / hit);
    benchmark::Shutdown();
    return 0;
}
