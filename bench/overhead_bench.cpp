// Per-hit overhead, as the tables of kprobes.txt's "Probe Overhead" section: a direct
// call of the probed function, the raw int3 + SIGTRAP round trip, and kprobes with an
// empty handler: `k` (with post_handler) and `b` (boosted: no post_handler), on the
// breakpoint path (optimization off). Then the optimized table on a function whose first
// 5 bytes a jump can replace: its direct call, `o` (optimized kprobe), `rb` (kretprobe,
// breakpoint entry), `ro` (kretprobe, optimized entry), and, when root and tracefs allow,
// the kernel's own uprobe and uretprobe on the same function. Ratios are computed from
// this one run.
#include <ukprobes/kprobes.h>

#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <csignal>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <link.h>
#include <sys/stat.h>
#include <map>
#include <string>
#include <unistd.h>

extern "C" __attribute__((noinline)) int ukb_target(int x) {
    // One ordinary instruction before the ret: the probe goes on `lea 1(%rdi),%eax`.
    return x + 1;
}

// long ukb_opt_target(long x): x + 1, in 5 bytes of two instructions and a ret, so that a
// jmp rel32 can replace its entry (ukb_target's 4 bytes are too few).
asm(R"(
        .text
        .globl  ukb_opt_target
        .type   ukb_opt_target, @function
        .p2align 4
ukb_opt_target:
        mov     %rdi, %rax
        add     $1, %rax
        ret
        .size   ukb_opt_target, .-ukb_opt_target
)");
extern "C" long ukb_opt_target(long x);

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
    struct sigaction act {
    }, old{};
    act.sa_sigaction = raw_trap_handler;
    act.sa_flags = SA_SIGINFO;
    sigaction(SIGTRAP, &act, &old);
    for (auto _ : state) asm volatile("int3" ::: "memory");
    sigaction(SIGTRAP, &old, nullptr);
}

void run_probed(benchmark::State &state, bool with_post) {
    ukp_set_kprobes_optimization(0); // the breakpoint path
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

// kprobes.txt's r, kr, j and jr: a kretprobe, a kprobe and a kretprobe on one function, a
// jprobe, a jprobe and a kretprobe.
void run_combination(benchmark::State &state, bool kprobe_too, bool kretprobe_too, bool jprobe_too) {
    ukp_set_kprobes_optimization(0); // the breakpoint path
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

void BM_DirectCallOpt(benchmark::State &state) {
    long x = 0;
    for (auto _ : state) benchmark::DoNotOptimize(x = ukb_opt_target(x));
}

// `o` (kprobe) or `ro`/`rb` (kretprobe) on ukb_opt_target, with optimization on or off.
void run_opt_target(benchmark::State &state, bool kretprobe_instead, bool optimize) {
    ukp_set_kprobes_optimization(optimize ? 1 : 0);
    kprobe kp{};
    kp.symbol_name = "ukb_opt_target";
    kp.pre_handler = empty_pre;
    kretprobe rp{};
    rp.kp.symbol_name = "ukb_opt_target";
    rp.handler = empty_ret;
    kprobe *probe = kretprobe_instead ? &rp.kp : &kp;
    const int err = kretprobe_instead ? register_kretprobe(&rp) : register_kprobe(&kp);
    if (err != 0) {
        state.SkipWithError(fmt::format("register: {}", err).c_str());
        return;
    }
    ukp_optimizer_flush();
    if (optimize != ((probe->flags & KPROBE_FLAG_OPTIMIZED) != 0)) {
        state.SkipWithError(optimize ? "the probe was not optimized" : "the probe was optimized");
    } else {
        long x = 0;
        for (auto _ : state) benchmark::DoNotOptimize(x = ukb_opt_target(x));
    }
    if (kretprobe_instead)
        unregister_kretprobe(&rp);
    else
        unregister_kprobe(&kp);
    ukp_set_kprobes_optimization(1);
}

void BM_Kprobe_b_opt_target(benchmark::State &state) { run_opt_target(state, false, false); }

// `o` and `ro` with two threads hitting the same probe at once, one per CPU on this
// machine: what hits on different CPUs share (the grace-period marks, a kretprobe's
// instance pool) costs here. The first thread registers before the timed loop and
// unregisters after it; the benchmark's barrier at the loop's start and end orders them.
void run_opt_target_two_threads(benchmark::State &state, bool kretprobe_instead) {
    static kprobe kp;
    static kretprobe rp;
    static bool ready;
    if (state.thread_index() == 0) {
        ukp_set_kprobes_optimization(1);
        kp = kprobe{};
        kp.symbol_name = "ukb_opt_target";
        kp.pre_handler = empty_pre;
        rp = kretprobe{};
        rp.kp.symbol_name = "ukb_opt_target";
        rp.handler = empty_ret;
        ready = (kretprobe_instead ? register_kretprobe(&rp) : register_kprobe(&kp)) == 0;
        ukp_optimizer_flush();
        ready = ready && ((kretprobe_instead ? rp.kp.flags : kp.flags) & KPROBE_FLAG_OPTIMIZED) != 0;
    }
    long x = 0;
    for (auto _ : state) {
        if (!ready) {
            state.SkipWithError("the probe was not registered and optimized");
            break;
        }
        benchmark::DoNotOptimize(x = ukb_opt_target(x));
    }
    if (state.thread_index() == 0) {
        if (kretprobe_instead)
            unregister_kretprobe(&rp);
        else
            unregister_kprobe(&kp);
    }
}

void BM_Kprobe_o_TwoThreads(benchmark::State &state) { run_opt_target_two_threads(state, false); }
void BM_Kretprobe_ro_TwoThreads(benchmark::State &state) { run_opt_target_two_threads(state, true); }
void BM_Kprobe_o(benchmark::State &state) { run_opt_target(state, false, true); }
void BM_Kretprobe_rb(benchmark::State &state) { run_opt_target(state, true, false); }
void BM_Kretprobe_ro(benchmark::State &state) { run_opt_target(state, true, true); }

// The kernel's uprobes on ukb_opt_target, through tracefs, in an instance of its own so
// that the global trace buffer is left alone.
constexpr const char *kTracefs = "/sys/kernel/tracing";

bool write_file(const std::string &path, const std::string &text, bool append = false) {
    const int fd = open(path.c_str(), O_WRONLY | (append ? O_APPEND : O_TRUNC) | O_CLOEXEC);
    if (fd < 0) return false;
    const bool ok = write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
    close(fd);
    return ok;
}

// "PATH:0xOFFSET" of a function of the main program, as uprobe_events wants it.
std::string file_location(const void *fn) {
    struct Find {
        uint64_t addr, offset;
        bool found;
    } find{reinterpret_cast<uint64_t>(fn), 0, false};
    dl_iterate_phdr(
        [](dl_phdr_info *info, size_t, void *data) {
            auto *f = static_cast<Find *>(data);
            for (int i = 0; i < info->dlpi_phnum; ++i) {
                const auto &ph = info->dlpi_phdr[i];
                const uint64_t lo = info->dlpi_addr + ph.p_vaddr;
                if (ph.p_type == PT_LOAD && f->addr >= lo && f->addr < lo + ph.p_memsz) {
                    f->offset = f->addr - lo + ph.p_offset;
                    f->found = true;
                }
            }
            return f->found ? 1 : 0;
        },
        &find);
    char exe[4096];
    const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (!find.found || n <= 0) return "";
    exe[n] = '\0';
    return fmt::format("{}:{:#x}", exe, find.offset);
}

void run_kernel_uprobe(benchmark::State &state, bool ret) {
    const std::string events = std::string(kTracefs) + "/uprobe_events";
    if (geteuid() != 0 || access(events.c_str(), W_OK) != 0) {
        state.SkipWithError("kernel uprobes skipped: needs root and tracefs at /sys/kernel/tracing "
                            "(mount -t tracefs nodev /sys/kernel/tracing)");
        return;
    }
    const std::string where = file_location(reinterpret_cast<const void *>(&ukb_opt_target));
    const std::string name = ret ? "ukb_uretprobe" : "ukb_uprobe";
    const std::string instance = std::string(kTracefs) + "/instances/ukp_bench";
    mkdir(instance.c_str(), 0755);
    const std::string enable = instance + "/events/ukp_bench/" + name + "/enable";
    if (where.empty() || !write_file(events, fmt::format("{}:ukp_bench/{} {}\n", ret ? 'r' : 'p', name, where), true) ||
        !write_file(enable, "1")) {
        state.SkipWithError(
            fmt::format("kernel uprobe: cannot define or enable {} at {}: {}", name, where, std::strerror(errno))
                .c_str());
        write_file(events, fmt::format("-:ukp_bench/{}\n", name), true);
        rmdir(instance.c_str());
        return;
    }
    long x = 0;
    for (auto _ : state) benchmark::DoNotOptimize(x = ukb_opt_target(x));
    write_file(enable, "0");
    write_file(events, fmt::format("-:ukp_bench/{}\n", name), true);
    rmdir(instance.c_str());
}

void BM_KernelUprobe(benchmark::State &state) { run_kernel_uprobe(state, false); }
void BM_KernelUretprobe(benchmark::State &state) { run_kernel_uprobe(state, true); }

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
BENCHMARK(BM_DirectCallOpt);
BENCHMARK(BM_Kprobe_b_opt_target);
BENCHMARK(BM_Kprobe_o);
BENCHMARK(BM_Kretprobe_rb);
BENCHMARK(BM_Kretprobe_ro);
BENCHMARK(BM_Kprobe_o_TwoThreads)->Threads(2);
BENCHMARK(BM_Kretprobe_ro_TwoThreads)->Threads(2);
BENCHMARK(BM_KernelUprobe);
BENCHMARK(BM_KernelUretprobe);

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
        std::printf("  / direct call: r %.0f, kr %.0f, j %.0f, jr %.0f\n", r / call, kr / call, j / call, jr / call);
        std::printf("  over a direct call: r %.0f ns, kr %.0f ns, j %.0f ns, jr %.0f ns\n", r - call, kr - call,
                    j - call, jr - call);
    }
    const double ocall = get("BM_DirectCallOpt"), bo = get("BM_Kprobe_b_opt_target"), o = get("BM_Kprobe_o"),
                 rb = get("BM_Kretprobe_rb"), ro = get("BM_Kretprobe_ro"), ku = get("BM_KernelUprobe"),
                 kur = get("BM_KernelUretprobe");
    if (ocall > 0 && o > 0 && ro > 0) {
        std::printf("\noptimized table (ukb_opt_target, this run):\n");
        std::printf("  o / direct call  = %.2f   (goal <= 8)\n", o / ocall);
        std::printf("  ro / o           = %.2f   (goal <= 2)\n", ro / o);
        if (bo > 0) std::printf("  b / o            = %.1f   (the same probe on the breakpoint path)\n", bo / o);
        if (rb > 0) std::printf("  rb / ro          = %.1f\n", rb / ro);
        std::printf("  over a direct call: o %.1f ns, ro %.1f ns\n", o - ocall, ro - ocall);
        if (ku > 0) std::printf("  kernel uprobe / o     = %.0f\n", ku / o);
        if (kur > 0) std::printf("  kernel uretprobe / ro = %.0f\n", kur / ro);
    }
    benchmark::Shutdown();
    return 0;
}
