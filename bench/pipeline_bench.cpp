// The whole path a user runs: a program's probe hits, the agent's records, `ukprobe run`
// reading, merging and formatting them, the file written. Each benchmark is one run of a
// command; its time is the wall time until ukprobe has exited (the file complete).
//   Plain/calls        the program alone, 1,000,000 calls
//   Run/calls          under `ukprobe run -b 262144 -o FILE -e 'p:... i=%di:u64'`: every
//                      call a line (checked), so lines/s is the pipeline's rate
//   Plain/libc, Run/libc the same with the event on a libc function (strtoul): its
//                      address is named from the program's whole list of objects
//   Pipe/calls         the program with the agent linked in, its event given by UKP_EVENTS,
//                      and `ukprobe -p PID trace-pipe > FILE` reading it over the socket
//                      (timed from the program's go to the reader's exit, after it)
//   Alone/calls        the program with the agent preloaded and the event (UKP_EVENTS),
//                      nobody reading: what the probes and records cost by themselves
//   Record/calls       `ukprobe record -b 262144 -o FILE` of the same: every call a record
//                      in the file (checked with `ukprobe report`)
//   Record/flood       10,000,000 calls through 8 MiB rings: the program outruns any
//                      reader; the records kept per second are the recorder's rate
//   Plain/masks, Run/masks   200,000 sigprocmask(SIG_SETMASK) calls, alone and under
//                      `ukprobe run` with one event elsewhere: what ukprobe adds to them
// Ratios to the plain runs are printed at the end, from each benchmark's fastest repetition.
#include <benchmark/benchmark.h>

#include <fmt/core.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <fcntl.h>
#include <csignal>
#include <map>
#include <spawn.h>
#include <string>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

extern char **environ;

namespace {

constexpr long kCalls = 1000000, kMasks = 200000;
const std::string kFile = fmt::format("/tmp/ukp_pipeline_bench.{}", getpid());

int spawn_wait(const std::vector<std::string> &args) {
    std::vector<char *> argv;
    for (const std::string &a : args) argv.push_back(const_cast<char *>(a.c_str()));
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    pid_t pid;
    if (posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ) != 0) return -1;
    posix_spawn_file_actions_destroy(&fa);
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

long count_lines(const std::string &path) {
    FILE *f = fopen(path.c_str(), "r");
    if (f == nullptr) return -1;
    long n = 0;
    char buf[1 << 16];
    size_t got;
    while ((got = fread(buf, 1, sizeof buf, f)) > 0)
        for (size_t i = 0; i < got; ++i) n += buf[i] == '\n';
    fclose(f);
    return n;
}

std::vector<std::string> run_args(const char *what, long n, const std::string &event) {
    return {UKP_UKPROBE,         "--agent", UKP_AGENT,        "run", "-b", "262144", "-o", kFile, "-e", event, "--",
            UKP_PIPELINE_TARGET, what,      std::to_string(n)};
}

void one(benchmark::State &state, const std::vector<std::string> &args, long expect_lines, long items) {
    for (auto _ : state) {
        if (spawn_wait(args) != 0) {
            state.SkipWithError("the command failed");
            return;
        }
        if (expect_lines >= 0) {
            state.PauseTiming();
            const long lines = count_lines(kFile);
            state.ResumeTiming();
            if (lines != expect_lines) {
                state.SkipWithError(fmt::format("{} lines written, {} expected", lines, expect_lines).c_str());
                return;
            }
        }
    }
    state.SetItemsProcessed(state.iterations() * items);
}

const std::string kCallEvent = std::string("p:pb/w ") + UKP_PIPELINE_TARGET + ":pipeline_work i=%di:u64";

void BM_Plain_calls(benchmark::State &s) { one(s, {UKP_PIPELINE_TARGET, "calls", std::to_string(kCalls)}, -1, kCalls); }
void BM_Run_calls(benchmark::State &s) { one(s, run_args("calls", kCalls, kCallEvent), kCalls, kCalls); }
// Runs the program (preloaded, waiting for SIGUSR1) and trace-pipe on it; the time is
// from the signal to the reader's exit (the program gone, its ring read to the end).
void BM_Pipe_calls(benchmark::State &state) {
    for (auto _ : state) {
        state.PauseTiming();
        int ready[2];
        if (pipe(ready) != 0) return state.SkipWithError("pipe");
        const std::string events = std::string("UKP_EVENTS=p:pb/w,") + UKP_PIPELINE_TARGET + ":pipeline_work,i=%di:u64";
        std::vector<std::string> env = {std::string("LD_PRELOAD=") + UKP_AGENT, "UKP_CONTROL=1",
                                        "UKP_BUFFER_SIZE_KB=262144", events};
        for (char **e = environ; *e != nullptr; ++e) env.emplace_back(*e);
        std::vector<char *> envp;
        for (std::string &e : env) envp.push_back(e.data());
        envp.push_back(nullptr);
        const std::string n = std::to_string(kCalls);
        const char *argv[] = {UKP_PIPELINE_TARGET, "wait-calls", n.c_str(), nullptr};
        posix_spawn_file_actions_t fa;
        posix_spawn_file_actions_init(&fa);
        posix_spawn_file_actions_adddup2(&fa, ready[1], 1);
        posix_spawn_file_actions_addclose(&fa, ready[0]);
        pid_t prog = 0;
        const int spawned = posix_spawn(&prog, argv[0], &fa, nullptr, const_cast<char **>(argv), envp.data());
        posix_spawn_file_actions_destroy(&fa);
        close(ready[1]);
        char line[16] = {};
        const bool up = spawned == 0 && read(ready[0], line, sizeof line - 1) > 0;
        close(ready[0]);
        if (!up) return state.SkipWithError("the program did not start");
        const std::string pid = std::to_string(prog);
        posix_spawn_file_actions_init(&fa);
        posix_spawn_file_actions_addopen(&fa, 1, kFile.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
        const char *rargv[] = {UKP_UKPROBE, "-p", pid.c_str(), "trace-pipe", nullptr};
        pid_t reader = 0;
        posix_spawn(&reader, rargv[0], &fa, nullptr, const_cast<char **>(rargv), environ);
        posix_spawn_file_actions_destroy(&fa);
        usleep(300 * 1000); // connected, its ring mapped
        state.ResumeTiming();
        kill(prog, SIGUSR1);
        int status = 0;
        waitpid(prog, &status, 0);
        waitpid(reader, &status, 0);
        state.PauseTiming();
        const long lines = count_lines(kFile);
        state.ResumeTiming();
        if (lines != kCalls)
            return state.SkipWithError(fmt::format("{} lines written, {} expected", lines, kCalls).c_str());
    }
    state.SetItemsProcessed(state.iterations() * kCalls);
}

// The program with the agent preloaded and its event given by UKP_EVENTS, nobody reading:
// what the probes and records cost by themselves (the floor of Record/calls).
void BM_Alone_calls(benchmark::State &s) {
    one(s,
        {"/usr/bin/env", std::string("LD_PRELOAD=") + UKP_AGENT, "UKP_BUFFER_SIZE_KB=262144",
         "UKP_EVENTS=" + kCallEvent.substr(0, kCallEvent.find(' ')) + "," +
             kCallEvent.substr(kCallEvent.find(' ') + 1, kCallEvent.rfind(' ') - kCallEvent.find(' ') - 1) + "," +
             kCallEvent.substr(kCallEvent.rfind(' ') + 1),
         UKP_PIPELINE_TARGET, "calls", std::to_string(kCalls)},
        -1, kCalls);
}

// The records of `ukprobe report` (its lines but LOST lines), the report's lines counted
// out of the timing; *lost gets the events the LOST lines count.
long reported_records(benchmark::State &state, long *lost) {
    state.PauseTiming();
    const std::string text = kFile + ".txt";
    long records = -1;
    if (spawn_wait({UKP_UKPROBE, "report", "-o", text, kFile}) == 0) {
        records = 0;
        *lost = 0;
        if (FILE *f = fopen(text.c_str(), "r")) {
            char line[512];
            while (fgets(line, sizeof line, f) != nullptr) {
                unsigned cpu = 0;
                unsigned long long n = 0;
                if (sscanf(line, "CPU:%u [LOST %llu EVENTS]", &cpu, &n) == 2)
                    *lost += static_cast<long>(n);
                else if (strchr(line, '\n') != nullptr)
                    ++records;
            }
            fclose(f);
        }
    }
    unlink(text.c_str());
    state.ResumeTiming();
    return records;
}

std::vector<std::string> record_args(long n, const char *buffer_kb) {
    return {
        UKP_UKPROBE, "--agent",           UKP_AGENT, "record",         "-b", buffer_kb, "-o", kFile, "-e", kCallEvent,
        "--",        UKP_PIPELINE_TARGET, "calls",   std::to_string(n)};
}

// `ukprobe record` with a ring that holds every record: all of them in the file (checked
// with `ukprobe report`).
void BM_Record_calls(benchmark::State &state) {
    for (auto _ : state) {
        if (spawn_wait(record_args(kCalls, "262144")) != 0) return state.SkipWithError("record failed");
        long lost = 0;
        const long records = reported_records(state, &lost);
        if (records != kCalls || lost != 0)
            return state.SkipWithError(fmt::format("{} records, {} lost; {} expected", records, lost, kCalls).c_str());
    }
    state.SetItemsProcessed(state.iterations() * kCalls);
}

// A program that records faster than any reader (10,000,000 hits in about 0.4 s) through
// 8 MiB rings: the records kept per second are the recorder's rate; every hit is a record
// in the file or a LOST count (checked).
constexpr long kFlood = 10000000;
double g_flood_kept = 0; // the fraction kept, best run
void BM_Record_flood(benchmark::State &state) {
    long kept = 0;
    for (auto _ : state) {
        if (spawn_wait(record_args(kFlood, "8192")) != 0) return state.SkipWithError("record failed");
        long lost = 0;
        const long records = reported_records(state, &lost);
        if (records < 0 || records + lost != kFlood)
            return state.SkipWithError(fmt::format("{} records + {} lost != {}", records, lost, kFlood).c_str());
        kept += records;
        g_flood_kept = std::max(g_flood_kept, static_cast<double>(records) / kFlood);
    }
    state.SetItemsProcessed(kept);
}

const std::string kLibcEvent = "p:pb/s libc.so.6:strtoul s=+0(%di):string";
void BM_Plain_libc(benchmark::State &s) { one(s, {UKP_PIPELINE_TARGET, "libc", std::to_string(kCalls)}, -1, kCalls); }
void BM_Run_libc(benchmark::State &s) { one(s, run_args("libc", kCalls, kLibcEvent), kCalls + 1, kCalls); }
void BM_Plain_masks(benchmark::State &s) { one(s, {UKP_PIPELINE_TARGET, "masks", std::to_string(kMasks)}, -1, kMasks); }
void BM_Run_masks(benchmark::State &s) { one(s, run_args("masks", kMasks, kCallEvent), 0, kMasks); }

BENCHMARK(BM_Plain_calls)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Run_calls)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Pipe_calls)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Alone_calls)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Record_calls)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Record_flood)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Plain_libc)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Run_libc)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Plain_masks)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Run_masks)->Unit(benchmark::kMillisecond)->UseRealTime();

// Keeps each benchmark's fastest repetition, and prints the ratios after the table.
class Ratios : public benchmark::ConsoleReporter {
public:
    void ReportRuns(const std::vector<Run> &runs) override {
        ConsoleReporter::ReportRuns(runs);
        for (const Run &r : runs) {
            if (r.run_type != Run::RT_Iteration || r.error_occurred) continue;
            const double t = r.GetAdjustedRealTime();
            auto [it, fresh] = best_.emplace(r.run_name.function_name, t);
            if (!fresh && t < it->second) it->second = t;
            if (const auto c = r.counters.find("items_per_second"); c != r.counters.end()) {
                double &rate = rate_[r.run_name.function_name];
                rate = std::max(rate, static_cast<double>(c->second));
            }
        }
    }
    void Finalize() override {
        ConsoleReporter::Finalize();
        auto ms = [&](const char *n) { return best_.count(n) ? best_[n] : 0.0; };
        if (ms("BM_Run_calls") > 0)
            fmt::print("run -o FILE: {:.0f} lines/s over the whole run; {:.1f} x the program alone\n",
                       kCalls / (ms("BM_Run_calls") / 1e3), ms("BM_Run_calls") / ms("BM_Plain_calls"));
        if (ms("BM_Pipe_calls") > 0)
            fmt::print("trace-pipe over the socket: {:.0f} lines/s\n", kCalls / (ms("BM_Pipe_calls") / 1e3));
        if (ms("BM_Record_calls") > 0)
            fmt::print("record -o FILE: {:.0f} records/s over the whole run; {:.2f} x the program with its event "
                       "and nobody reading\n",
                       kCalls / (ms("BM_Record_calls") / 1e3), ms("BM_Record_calls") / ms("BM_Alone_calls"));
        if (ms("BM_Record_flood") > 0)
            fmt::print("record, a program faster than the recorder: {:.0f} records/s kept over the whole run at "
                       "best, {:.0f}% of its hits at best (the rest counted lost)\n",
                       rate_["BM_Record_flood"], g_flood_kept * 100);
        if (ms("BM_Run_libc") > 0)
            fmt::print("run -o FILE, a libc function's event: {:.0f} lines/s; {:.1f} x the program alone\n",
                       kCalls / (ms("BM_Run_libc") / 1e3), ms("BM_Run_libc") / ms("BM_Plain_libc"));
        if (ms("BM_Run_masks") > 0)
            fmt::print("sigprocmask: {:.0f} ns a call alone, {:.0f} ns under run\n",
                       ms("BM_Plain_masks") * 1e6 / kMasks, ms("BM_Run_masks") * 1e6 / kMasks);
    }

private:
    std::map<std::string, double> best_;
    std::map<std::string, double> rate_; // items per second, the best repetition's
};

} // namespace

int main(int argc, char **argv) {
    std::vector<char *> args(argv, argv + argc);
    std::string reps = "--benchmark_repetitions=5", order = "--benchmark_enable_random_interleaving=true";
    bool given = false;
    for (int i = 1; i < argc; ++i) given = given || std::string(argv[i]).rfind("--benchmark_repetitions", 0) == 0;
    if (!given) {
        args.push_back(reps.data());
        args.push_back(order.data());
    }
    int n = static_cast<int>(args.size());
    benchmark::Initialize(&n, args.data());
    Ratios reporter;
    benchmark::RunSpecifiedBenchmarks(&reporter);
    benchmark::Shutdown();
    std::remove(kFile.c_str());
    return 0;
}
