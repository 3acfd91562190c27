// ukprobe: the controller. Loads the agent into a running process (attach) and drives it
// over its control socket. docs/cli.md is the reference.
#include "client.hpp"
#include "inject.hpp"
#include "run.hpp"
#include "mount.hpp"
#include "short_forms.hpp"
#include "proc.hpp"
#include "reader.hpp"
#include "report.hpp"
#include "trace/capture.hpp"

#include <CLI/CLI.hpp>
#include <fmt/core.h>
#include <fmt/ranges.h>

#include <atomic>
#include <chrono>
#include <cctype>
#include <cerrno>
#include <climits>
#include <csignal>
#include <malloc.h>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string_view>
#include <vector>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

using ukp::control::Op;

namespace {

constexpr int kPipeWaitMs = 100; // a trace_pipe read waits this long for a record, as the agent's

struct Options {
    int pid = 0;
    bool verbose = false;
    std::string agent;
    std::string path, text;
    std::string event;       // enable, disable: GRP/EVENT or EVENT
    ukprobe::RunOptions run; // run
    // The one-line questions (calls, latency, sdt).
    std::string spec;               // calls' [MOD:]FUNCS, latency's [MOD:]FUNC
    double seconds = 0;             // -d: how long to count in a running process (0: until SIGINT)
    unsigned buckets = 0;           // latency --buckets: microseconds a bucket (0: powers of two)
    std::vector<std::string> files; // sdt's
};

// The agent to load: --agent PATH alone when given. Otherwise $UKP_AGENT, then, for the
// ukprobe of the build tree, the build tree's agent; then the agent of ukprobe's own
// installation, in the library directory beside its bin directory (the installation may
// have been moved); then the agent in the library directory ukprobe was configured for.
// The paths come from tools/ukprobe/CMakeLists.txt.
std::string find_agent(const std::string &given) {
    std::vector<std::string> candidates;
    if (!given.empty())
        candidates.push_back(given);
    else {
        if (const char *env = getenv("UKP_AGENT"); env != nullptr && *env != 0) candidates.push_back(env);
        // The same file as the build tree's ukprobe (not a copy of it, not an installed one).
        struct stat self {
        }, built{};
        if (stat("/proc/self/exe", &self) == 0 && stat(UKP_BUILD_EXE, &built) == 0 && self.st_dev == built.st_dev &&
            self.st_ino == built.st_ino)
            candidates.push_back(UKP_AGENT_BUILD_PATH);
        char exe[PATH_MAX];
        const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
        if (n > 0) {
            std::string dir(exe, static_cast<size_t>(n));
            dir = dir.substr(0, dir.rfind('/'));
            candidates.push_back(dir + "/" UKP_AGENT_RELATIVE_PATH);
        }
        candidates.push_back(UKP_AGENT_INSTALL_PATH);
    }
    for (const std::string &c : candidates) {
        char real[PATH_MAX];
        if (realpath(c.c_str(), real) != nullptr && access(real, R_OK) == 0) return real;
    }
    throw std::runtime_error(fmt::format("cannot find libukprobes.so (tried {}); give --agent PATH or set UKP_AGENT",
                                         fmt::join(candidates, ", ")));
}

[[noreturn]] void fail(const std::string &msg) { throw std::runtime_error(msg); }

void require_pid(const Options &o) {
    if (o.pid <= 0) fail("which process? give -p PID");
}

// A request on a fresh connection; a refusal by the agent becomes an error with its message.
ukprobe::Reply ask(const Options &o, ukprobe::Client &c, Op op, const std::string &path = {},
                   const std::string &payload = {}) {
    ukprobe::Reply r = c.request(op, path, payload);
    if (r.status < 0) fail(ukprobe::refusal(r, op, path, o.pid));
    return r;
}

void connect_or_fail(const Options &o, ukprobe::Client &c) {
    std::string why;
    if (c.connect(o.pid, &why) != 0) fail(why);
}

// The process got no UKP_CACHE_DIR: its agent is told the directory `run` would give
// (the reference tables of libc and the rest are then decoded once per file, not once per
// attach). An older agent refuses the path: it goes without.
void name_refs_cache(ukprobe::Client &c) {
    if (const std::string dir = ukprobe::refs_cache_dir(); !dir.empty())
        c.request(Op::kWrite, ukp::control::kRefsCacheDirPath, dir);
}

// The agent's signals out of the masks of the threads that block them (inject.hpp), and
// a line for each such thread.
void unblock_agent_signals(int pid, FILE *say) {
    for (const ukprobe::UnblockedThread &t : ukprobe::unblock_agent_signals(pid)) {
        std::string names;
        for (int sig : {SIGTRAP, SIGSEGV, SIGBUS, SIGFPE, SIGILL})
            if ((t.signals & (1ull << (sig - 1))) != 0)
                names += fmt::format("{}SIG{}", names.empty() ? "" : ",", sigabbrev_np(sig));
        if (t.error.empty())
            fmt::print(say, "thread {}: {} unblocked (on a thread that blocks them a probe hit is fatal)\n", t.tid,
                       names);
        else
            fmt::print(stderr, "ukprobe: thread {} blocks {} and keeps them ({}): a probe hit on it would be fatal\n",
                       t.tid, names.empty() ? "the agent's signals" : names, t.error);
    }
}

// `say`: where its lines go (stdout; stderr when it serves a command that answers on stdout).
int cmd_attach(const Options &o, FILE *say = stdout) {
    require_pid(o);
    {
        ukprobe::Client c;
        std::string why;
        if (c.connect(o.pid, &why) == 0) {
            const ukprobe::Reply r = c.request(Op::kPing);
            if (r.status >= 0) {
                name_refs_cache(c);
                fmt::print(say, "process {}: agent already attached, reused\n", o.pid);
                unblock_agent_signals(o.pid, say);
                if (o.verbose) fmt::print("{}\n", r.payload);
                return 0;
            }
        }
    }
    const std::string agent = find_agent(o.agent);
    const ukprobe::InjectResult res = ukprobe::inject_agent(o.pid, agent);
    ukprobe::Client c;
    connect_or_fail(o, c);
    const ukprobe::Reply r = ask(o, c, Op::kPing);
    name_refs_cache(c);
    fmt::print(say, "process {}: agent attached\n", o.pid);
    unblock_agent_signals(o.pid, say);
    if (o.verbose) {
        fmt::print("agent: {}\n", agent);
        fmt::print("thread {} taken at interrupt {}, {}\n", res.tid, res.interrupts,
                   res.was_in_syscall ? "in a system call" : "running the program's own code");
        if (res.steps > 0)
            fmt::print("thread {} stepped out of the C library in {} instructions\n", res.tid, res.steps);
        fmt::print("thread {} paused {:.3f} ms from interrupt to detach (stopped {:.3f} ms, calls {:.3f} ms){}\n",
                   res.tid, res.pause_ms, res.stopped_ms, res.calls_ms,
                   res.was_in_syscall ? ", its system call restarted" : "");
        fmt::print("agent ready {:.3f} ms after the interrupt (loaded by a thread of its own)\n", res.ready_ms);
        fmt::print("{}\n", r.payload);
    }
    return 0;
}

int cmd_simple(const Options &o, Op op, const std::string &path = {}, const std::string &payload = {}) {
    require_pid(o);
    ukprobe::Client c;
    connect_or_fail(o, c);
    const ukprobe::Reply r = ask(o, c, op, path, payload);
    if (op == Op::kVerify) {
        fmt::print("{}", r.payload);
        if (r.status > 0) {
            fmt::print(stderr, "ukprobe: process {}: {} code bytes differ from their files\n", o.pid, r.status);
            return 1;
        }
        fmt::print("process {}: code matches its files\n", o.pid);
        return 0;
    }
    if (op == Op::kDetach) {
        fmt::print("process {}: detached\n", o.pid);
        return 0;
    }
    fmt::print("{}", r.payload);
    if (op == Op::kPing && (r.payload.empty() || r.payload.back() != '\n')) fmt::print("\n");
    return 0;
}

// enable EVENT, disable EVENT: its enable file, the event named as GRP/EVENT or by its
// name alone (found in kprobe_events; else the group kprobes, as the kernel's default).
int cmd_enable(const Options &o, bool on) {
    require_pid(o);
    ukprobe::Client c;
    connect_or_fail(o, c);
    const std::string defs = ask(o, c, Op::kRead, "kprobe_events").payload;
    ask(o, c, Op::kWrite, "events/" + ukprobe::event_path(o.event, defs) + "/enable", on ? "1" : "0");
    return 0;
}

// trace, read trace, read trace_pipe (one read: what comes within kPipeWaitMs,
// consumed) and read snapshot: printed here from the mapped rings (reader.hpp).
int cmd_trace(const Options &o, const std::string &file) {
    require_pid(o);
    ukprobe::Client c;
    connect_or_fail(o, c);
    const bool pipe = file == "trace_pipe";
    ukprobe::TraceReader reader(c, o.pid, pipe);
    const std::string text = pipe                 ? reader.pipe(kPipeWaitMs, 1 << 20)
                             : file == "snapshot" ? reader.snapshot()
                                                  : reader.trace();
    fmt::print("{}", text);
    return 0;
}

std::atomic<bool> g_interrupted{false};

// trace-pipe: trace_pipe's lines as they come, until SIGINT or SIGTERM (then exit 0).
// A read waits at most 100 ms for a record, so the end is at most that late and loses
// nothing.
int cmd_trace_pipe(const Options &o) {
    require_pid(o);
    ukprobe::Client c;
    connect_or_fail(o, c);
    ukprobe::TraceReader reader(c, o.pid, true);
    struct sigaction sa {};
    sa.sa_handler = [](int) { g_interrupted.store(true); };
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);
    while (!g_interrupted.load()) {
        std::string text;
        try {
            text = reader.pipe(kPipeWaitMs, 1 << 20);
        } catch (const std::runtime_error &) {
            // A process on its way out closes its sockets before it is a zombie: given a
            // second to get there.
            for (int i = 0; i < 100 && ukprobe::process_alive(o.pid); ++i) usleep(10 * 1000);
            if (ukprobe::process_alive(o.pid)) throw;
            // The process ended: so does its trace, once what its ring held last (the
            // ring mapped here outlives it) is printed.
            for (std::string left; !(left = reader.pipe_left(1 << 20)).empty();) fmt::print("{}", left);
            fflush(stdout);
            fmt::print(stderr, "ukprobe: process {} exited\n", o.pid);
            return 0;
        }
        fmt::print("{}", text);
        fflush(stdout);
    }
    return 0;
}

// record -p PID: the process's rings captured (reader.hpp's capture mode) into o.run.output
// until SIGINT or SIGTERM, or the process's end. Definitions given with -e are added, with
// their filters and triggers, for the recording only (a session: removed when it ends).
// The recording itself, over the connection c; *exited: the process ended meanwhile.
void record_process(const Options &o, ukprobe::Client &c, bool *exited_out) {
    if (!o.run.definitions.empty() || !o.run.synthetic.empty() || !o.run.filters.empty() || !o.run.triggers.empty())
        ask(o, c, Op::kSession);
    const std::string before = ask(o, c, Op::kRead, "kprobe_events").payload;
    for (const std::string &def : o.run.definitions) ask(o, c, Op::kAppend, "kprobe_events", def);
    for (const std::string &def : o.run.synthetic) ask(o, c, Op::kAppend, "synthetic_events", def);
    const std::string defs = ask(o, c, Op::kRead, "kprobe_events").payload;
    const std::string synthetic = ukprobe::synthetic_names(o.run.synthetic);
    std::istringstream synth(synthetic);
    for (std::string line; std::getline(synth, line);)
        ask(o, c, Op::kWrite, "events/" + line.substr(2) + "/enable", "1");
    const std::string named = defs + synthetic; // where a bare name is looked for
    // The events the definitions made: the lines kprobe_events did not have before.
    std::istringstream lines(defs);
    for (std::string line; std::getline(lines, line);) {
        if (line.empty() || before.find(line + "\n") != std::string::npos) continue;
        const size_t colon = line.find(':'), space = line.find(' ');
        if (colon == std::string::npos || space == std::string::npos || space < colon) continue;
        ask(o, c, Op::kWrite, "events/" + line.substr(colon + 1, space - colon - 1) + "/enable", "1");
    }
    for (const auto &[list, file] : {std::pair{&o.run.filters, "filter"}, std::pair{&o.run.triggers, "trigger"}})
        for (const std::string &a : *list) {
            const size_t eq = a.find('=');
            if (eq == std::string::npos || eq == 0) fail(fmt::format("--{} wants EVENT=TEXT, not '{}'", file, a));
            ask(o, c, file == std::string("filter") ? Op::kWrite : Op::kAppend,
                "events/" + ukprobe::event_path(a.substr(0, eq), named) + "/" + file, a.substr(eq + 1));
        }
    const std::string path = o.run.output.empty() ? "ukprobe.dat" : o.run.output;
    FILE *out = fopen(path.c_str(), "we");
    if (out == nullptr) fail(fmt::format("cannot write {}: {}", path, strerror(errno)));
    const std::string header = ukp::trace::capture::file_header();
    bool ok = fwrite(header.data(), 1, header.size(), out) == header.size();
    ukprobe::TraceReader reader(c, o.pid, true);
    reader.capture();
    struct sigaction sa {};
    sa.sa_handler = [](int) { g_interrupted.store(true); };
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);
    uint64_t bytes = header.size(), lost = 0;
    const auto write = [&](const std::string &blocks) {
        lost += ukp::trace::capture::lost_in(blocks);
        bytes += blocks.size();
        ok = ok && fwrite(blocks.data(), 1, blocks.size(), out) == blocks.size();
    };
    bool exited = false;
    while (!g_interrupted.load()) {
        try {
            write(reader.pipe(kPipeWaitMs, 4 << 20));
        } catch (const std::runtime_error &) {
            for (int i = 0; i < 100 && ukprobe::process_alive(o.pid); ++i) usleep(10 * 1000);
            if (ukprobe::process_alive(o.pid)) throw;
            for (std::string left; !(left = reader.pipe_left(4 << 20)).empty();) write(left);
            exited = true;
            break;
        }
    }
    if (!exited) { // what came before the interrupt (bounded: the process may write on)
        try {
            for (int i = 0; i < 64 && reader.has_records(); ++i) write(reader.pipe(0, 4 << 20));
        } catch (const std::runtime_error &) {
        }
    }
    ok = fflush(out) == 0 && ok;
    fclose(out);
    if (!ok) fail(fmt::format("cannot write {}: {}", path, strerror(errno)));
    fmt::print(stderr, "ukprobe: {} bytes written to {}{}{}\n", bytes, path,
               lost != 0 ? fmt::format(", {} events lost", lost) : "",
               exited ? fmt::format("; process {} exited", o.pid) : "");
    *exited_out = exited;
}

// `work` on a connection to the agent of o.pid, attached for it if it does not listen
// (as perf record -p: the agent is loaded, and detached after; it stays loaded, idle).
// `work` sets its bool when the process ended meanwhile. `say`: as cmd_attach's.
template <typename F>
int with_agent(const Options &o, F &&work, FILE *say = stdout) {
    require_pid(o);
    bool attached_here = false;
    std::string why;
    if (ukprobe::Client probe; probe.connect(o.pid, &why) != 0) {
        Options quiet = o;
        quiet.verbose = false;
        if (const int err = cmd_attach(quiet, say); err != 0) return err;
        attached_here = true;
    }
    bool exited = false;
    {
        ukprobe::Client c;
        connect_or_fail(o, c);
        work(c, &exited);
    } // the session, and with it the definitions it added, ends with its connection
    if (attached_here && !exited) {
        ukprobe::Client c;
        if (c.connect(o.pid, &why) == 0 && c.request(Op::kDetach).status >= 0)
            fmt::print(say, "process {}: detached\n", o.pid);
    }
    return 0;
}

int cmd_record_attached(const Options &o) {
    return with_agent(o, [&](ukprobe::Client &c, bool *exited) { record_process(o, c, exited); });
}

// A question asked of a running process (calls, latency with -p PID): its expansion
// applied for the question's time (a session: removed when it ends), until SIGINT or
// SIGTERM, -d SECS, or the process's end; then its answers, on stdout. The answers are read
// every second meanwhile: a process that ends leaves its last ones.
void ask_question(const Options &o, ukprobe::Client &c, const ukprobe::Expansion &x, bool *exited) {
    ask(o, c, Op::kSession);
    const auto apply = [&](const ukprobe::FileWrite &w) {
        ask(o, c, w.append ? Op::kAppend : Op::kWrite, w.path, w.text);
    };
    for (const ukprobe::FileWrite &w : x.before) apply(w);
    for (const std::string &d : x.definitions) apply({true, "dynamic_events", d});
    for (const ukprobe::FileWrite &w : x.after) apply(w);
    struct sigaction sa {};
    sa.sa_handler = [](int) { g_interrupted.store(true); };
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);
    fmt::print(stderr, "ukprobe: process {}: counting {}\n", o.pid,
               o.seconds > 0 ? fmt::format("for {} s", o.seconds) : std::string("until Ctrl-C"));
    using Clock = std::chrono::steady_clock;
    const Clock::time_point start = Clock::now();
    Clock::time_point read_at = start;
    std::vector<std::string> last(x.answers.size());
    const auto read_answers = [&] {
        try {
            for (size_t i = 0; i < x.answers.size(); ++i) last[i] = ask(o, c, Op::kRead, x.answers[i]).payload;
        } catch (const ukprobe::AgentGone &) {
            *exited = true;
        }
        read_at = Clock::now();
    };
    while (!g_interrupted.load() && !*exited) {
        usleep(50 * 1000);
        const Clock::time_point now = Clock::now();
        if (o.seconds > 0 && now - start >= std::chrono::duration<double>(o.seconds)) break;
        if (c.peer_closed())
            *exited = true;
        else if (now - read_at >= std::chrono::seconds(1))
            read_answers();
    }
    if (!*exited) read_answers();
    if (*exited)
        fmt::print(stderr, "ukprobe: process {} exited; its counts as last read, {:.1f} s before\n", o.pid,
                   std::chrono::duration<double>(Clock::now() - read_at).count());
    ukprobe::print_to(o.run.answer_output, [&](FILE *out) {
        for (const std::string &a : last) fmt::print(out, "{}", a);
    });
}

// calls, latency: with -p PID asked of the running process; with PROG ARGS, of a program
// run for it (`run`, its trace left out, each process's answer read at its end).
// `verb`: the question's command (calls, latency).
int cmd_question(Options &o, const std::string &verb, const ukprobe::Expansion &x, bool has_program) {
    if (has_program == (o.pid > 0)) fail(fmt::format("{}: give -p PID or -- PROG ARGS (one of them)", verb));
    if (o.pid <= 0 && o.seconds > 0)
        fail(fmt::format("{}: -d is for a running process (-p PID); PROG ARGS run to their end", verb));
    fmt::print(stderr, "{}", ukprobe::expansion_text(fmt::format("ukprobe {} {}", verb, o.spec), x));
    if (o.pid > 0)
        return with_agent(
            o, [&](ukprobe::Client &c, bool *exited) { ask_question(o, c, x, exited); }, stderr);
    ukprobe::add_to_run(x, &o.run);
    return ukprobe::run_program(o.run);
}

// One connection for many commands, read from stdin one per line ("read PATH",
// "write PATH TEXT", "append PATH TEXT", "list", "verify", "ping", "detach"). What it adds
// is removed when it ends, however it ends.
int cmd_session(const Options &o) {
    require_pid(o);
    ukprobe::Client c;
    connect_or_fail(o, c);
    ask(o, c, Op::kSession);
    int failed = 0;
    std::string line;
    while (std::getline(std::cin, line)) {
        const size_t sp1 = line.find(' ');
        const std::string verb = line.substr(0, sp1);
        const std::string rest = sp1 == std::string::npos ? "" : line.substr(sp1 + 1);
        const size_t sp2 = rest.find(' ');
        const std::string path = rest.substr(0, sp2), text = sp2 == std::string::npos ? "" : rest.substr(sp2 + 1);
        try {
            if (verb.empty() || verb[0] == '#') continue;
            if (verb == "ping")
                fmt::print("{}\n", ask(o, c, Op::kPing).payload);
            else if (verb == "read")
                fmt::print("{}", ask(o, c, Op::kRead, path).payload);
            else if (verb == "list")
                fmt::print("{}", ask(o, c, Op::kRead, "kprobes/list").payload);
            else if (verb == "write")
                ask(o, c, Op::kWrite, path, text);
            else if (verb == "append")
                ask(o, c, Op::kAppend, path, text);
            else if (verb == "verify") {
                const ukprobe::Reply r = ask(o, c, Op::kVerify);
                fmt::print("{}verify: {} bytes differ\n", r.payload, r.status);
                failed += r.status > 0;
            } else if (verb == "detach") {
                ask(o, c, Op::kDetach);
                fmt::print("process {}: detached\n", o.pid);
                break;
            } else
                fail(fmt::format("unknown command '{}' (ping, read, write, append, list, verify, detach)", verb));
        } catch (const ukprobe::AgentGone &e) {
            fmt::print(stderr, "ukprobe: {}\n", ukprobe::lost_agent_message(e, o.pid));
            ++failed;
        } catch (const std::runtime_error &e) {
            fmt::print(stderr, "ukprobe: {}\n", e.what());
            ++failed;
        }
        fflush(stdout);
    }
    return failed ? 1 : 0;
}

// The TEXT of write and append, and add's DEF, may start with '-': the kernel removes an
// event with `echo '-:GRP/EVENT' >> kprobe_events`. CLI11 would take such a word for an
// option: in `args` (a copy of argv) it is replaced by kStandIn, and returned, to be put
// back after parsing; "" when there is none.
constexpr char kStandIn[] = "\x01ukprobe-text";

std::string take_dashed_text(int argc, char **argv, char **args) {
    auto takes_value = [](std::string_view a) { return a == "-p" || a == "--pid" || a == "--agent"; };
    auto is_option = [&](std::string_view a) {
        return takes_value(a) || a == "-v" || a == "--verbose" || a == "-h" || a == "--help" ||
               a.starts_with("--pid=") || a.starts_with("--agent=") ||
               (a.size() > 2 && a.starts_with("-p") && std::isdigit(static_cast<unsigned char>(a[2])));
    };
    std::vector<int> words; // positional words, the command first
    for (int i = 1; i < argc && words.size() < 3; ++i) {
        const std::string_view a = argv[i];
        if (a == "--") break;
        if (is_option(a))
            i += takes_value(a);
        else
            words.push_back(i);
    }
    if (words.empty()) return {};
    const std::string_view verb = argv[words[0]];
    const size_t at = verb == "add" ? 1 : verb == "write" || verb == "append" ? 2 : 0;
    if (at == 0 || words.size() <= at || argv[words[at]][0] != '-') return {};
    args[words[at]] = const_cast<char *>(kStandIn);
    return argv[words[at]];
}

// The command line: the options parsing fills in, and the subcommands.
struct CommandLine {
    CLI::App app{"ukprobe: Kprobes for user space, outside the process"};
    Options o;
    bool no_follow = false; // run, record: --no-follow
    ukprobe::ReportOptions report_options;
    ukprobe::MountOptions mount_options;
    CLI::App *attach = nullptr, *ping = nullptr, *read = nullptr, *write = nullptr, *append = nullptr, *list = nullptr,
             *verify = nullptr, *detach = nullptr, *session = nullptr, *add = nullptr, *enable = nullptr,
             *disable = nullptr, *trace = nullptr, *trace_pipe = nullptr, *profile = nullptr, *clear = nullptr,
             *run = nullptr, *record = nullptr, *report = nullptr, *mount = nullptr, *calls = nullptr,
             *latency = nullptr, *sdt = nullptr;
};

// The options every command takes, and the commands on the agent of a running process.
void add_agent_commands(CommandLine &cl) {
    CLI::App &app = cl.app;
    Options &o = cl.o;
    app.add_option("-p,--pid", o.pid, "the process");
    app.add_flag("-v,--verbose", o.verbose, "say more (attach: the pause the target saw; run: each agent reached)");
    app.add_option("--agent", o.agent, "libukprobes.so to load (attach) or preload (run)");

    cl.attach = app.add_subcommand("attach", "load the agent into a running process and start its control thread");
    cl.attach->add_option("PID", o.pid, "the process");
    cl.ping = app.add_subcommand("ping", "check that the agent answers");
    cl.read = app.add_subcommand("read", "print a file of the agent (kprobes/list, trace, ...)");
    cl.read->add_option("PATH", o.path)->required();
    cl.write = app.add_subcommand("write", "replace a file's content (as `echo TEXT > FILE`)");
    cl.write->add_option("PATH", o.path)->required();
    cl.write->add_option("TEXT", o.text)->required();
    cl.append = app.add_subcommand("append", "append to a file (as `echo TEXT >> FILE`)");
    cl.append->add_option("PATH", o.path)->required();
    cl.append->add_option("TEXT", o.text)->required();
    cl.list = app.add_subcommand("list", "the registered probes (kprobes/list)");
    cl.verify = app.add_subcommand("verify", "compare the process's code with its files, probes aside");
    cl.detach = app.add_subcommand("detach", "remove what this controller added and stop the control thread");
    cl.session = app.add_subcommand("session", "run commands read from stdin over one connection; what they "
                                               "add is removed when it ends");
    // Short forms of the tracer's files.
    cl.add = app.add_subcommand("add", "add a definition (append to kprobe_events)");
    cl.add->add_option("DEF", o.text)->required();
    cl.enable = app.add_subcommand("enable", "enable an event (GRP/EVENT, or EVENT)");
    cl.enable->add_option("EVENT", o.event)->required();
    cl.disable = app.add_subcommand("disable", "disable an event (GRP/EVENT, or EVENT)");
    cl.disable->add_option("EVENT", o.event)->required();
    cl.trace = app.add_subcommand("trace", "print the trace (read trace)");
    cl.trace_pipe = app.add_subcommand("trace-pipe", "stream trace_pipe until interrupted");
    cl.profile = app.add_subcommand("profile", "print kprobe_profile");
    cl.clear = app.add_subcommand("clear", "clear the trace (echo > trace)");
    for (CLI::App *sub : {cl.attach, cl.ping, cl.read, cl.write, cl.append, cl.list, cl.verify, cl.detach, cl.session,
                          cl.add, cl.enable, cl.disable, cl.trace, cl.trace_pipe, cl.profile, cl.clear})
        sub->fallthrough();
}

// The options run and record share: the events, their filters and triggers, the output
// (`output`: its help), the buffers' size and --no-follow (`follow`: its help).
void add_program_options(CommandLine &cl, CLI::App *sub, const char *output, const char *follow) {
    Options &o = cl.o;
    sub->add_option("-e,--event", o.run.definitions, "a definition (kprobe_events language); repeatable")
        ->allow_extra_args(false);
    sub->add_option("--synthetic", o.run.synthetic,
                    "a synthetic event (synthetic_events language: NAME TYPE FIELD[; TYPE FIELD]...), for the "
                    "triggers' actions; repeatable")
        ->allow_extra_args(false);
    sub->add_option("--filter", o.run.filters, "EVENT=EXPR: the event's filter; repeatable")->allow_extra_args(false);
    sub->add_option("--trigger", o.run.triggers, "EVENT=TRIGGER: a trigger of the event; repeatable")
        ->allow_extra_args(false);
    sub->add_option("-o,--output", o.run.output, output);
    sub->add_option("-b,--buffer-size-kb", o.run.buffer_size_kb,
                    "KiB of each thread's ring buffer, as tracefs' buffer_size_kb (default 1408)")
        ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 22));
    sub->add_flag("--no-follow", cl.no_follow, follow);
}

// run and record, the commands that start a program (or record a running process), and
// report, which prints what record captured.
void add_program_commands(CommandLine &cl) {
    cl.run = cl.app.add_subcommand("run", "run a program with events defined before its main; stream its trace "
                                          "until it exits");
    add_program_options(cl, cl.run, "write the trace to FILE instead of stdout",
                        "only the program itself is traced, not the processes it starts");
    // PROG ARGS...: everything from the first word run does not know, or after "--".
    cl.run->prefix_command();
    cl.run->allow_extras();
    cl.record = cl.app.add_subcommand("record", "capture the records of a program run (-- PROG ARGS) or of a "
                                                "process (-p PID) into a file, for `report`");
    add_program_options(cl, cl.record, "the capture file (default ukprobe.dat)",
                        "only the program itself is recorded, not the processes it starts");
    // `ukprobe record -p PID`, as `perf record -p` (the same as `ukprobe -p PID record`).
    cl.record->add_option("-p,--pid", cl.o.pid,
                          "the process to record (attached for the recording if its agent does not listen), "
                          "instead of PROG");
    cl.record->prefix_command();
    cl.record->allow_extras();
    ukprobe::ReportOptions &r = cl.report_options;
    cl.report = cl.app.add_subcommand("report", "print a capture file of `record` as the trace, or export it");
    cl.report->add_option("FILE", r.file, "the capture file (default ukprobe.dat)");
    cl.report->add_option("--event", r.events, "only this event (GRP/EVENT, or EVENT); repeatable")
        ->allow_extra_args(false);
    cl.report->add_option("--pid", r.pids, "only this process or thread; repeatable")->allow_extra_args(false);
    cl.report->add_option("--from", r.from, "only records at or after SECS (the trace's timestamps)");
    cl.report->add_option("--to", r.to, "only records at or before SECS");
    cl.report
        ->add_option("--format", r.format,
                     "text (the trace), or chrome (Chrome trace JSON: Perfetto, chrome://tracing)")
        ->check(CLI::IsMember({"text", "chrome"}));
    cl.report->add_option("-o,--output", r.output, "write to FILE instead of stdout");
}

// The one-line questions: calls and latency (of -p PID, or of PROG ARGS run for them), sdt.
void add_questions(CommandLine &cl) {
    Options &o = cl.o;
    cl.calls = cl.app.add_subcommand("calls", "count the calls of each function of a library (an f: event and a hist "
                                              "keyed by the function)");
    cl.calls->add_option("FUNCS", o.spec, "MOD (all its functions), or [MOD:]FUNCS as an f: event takes them")
        ->required();
    cl.latency = cl.app.add_subcommand("latency", "a histogram of one function's latency, in microseconds (its "
                                                  "entry and exit events, a synthetic event)");
    cl.latency->add_option("FUNC", o.spec, "[MOD:]FUNC")->required();
    cl.latency->add_option("--buckets", o.buckets, "microseconds a bucket (default: powers of two)")
        ->check(CLI::PositiveNumber);
    for (CLI::App *sub : {cl.calls, cl.latency}) {
        sub->add_option("-d,--duration", o.seconds, "with -p PID: count for SECS, not until Ctrl-C")
            ->check(CLI::PositiveNumber);
        sub->add_option("-p,--pid", o.pid, "the running process to ask, instead of PROG");
        sub->add_option("-o,--output", o.run.answer_output, "write the answer (the hist) to FILE instead of stdout");
        sub->add_flag("--no-follow", cl.no_follow, "with PROG: only the program itself, not the processes it starts");
        // PROG ARGS...: after "--", or from the first word it does not know.
        sub->prefix_command();
        sub->allow_extras();
    }
    cl.sdt = cl.app.add_subcommand("sdt", "the SDT probes of programs and libraries (t: events' PROVIDER:NAME), "
                                          "or of every object process -p PID maps");
    cl.sdt->add_option("FILE", o.files, "an ELF file; repeatable");
}

// Each help ends with one example (tests/e2e/help.txt checks that every command has one).
void add_examples(CommandLine &cl) {
    cl.app.footer("Example:\n  ukprobe run -e 'p:open libc.so.6:open path=+0(%di):string' -- cat /etc/hostname\n\n"
                  "`ukprobe COMMAND --help` shows a command's options; the manual is ukprobe(1).");
    struct Example {
        CLI::App *sub;
        const char *command;
        const char *note = ""; // before it
    };
    const Example examples[] = {
        {cl.attach, "ukprobe attach 4242"},
        {cl.ping, "ukprobe -p 4242 ping"},
        {cl.read, "ukprobe -p 4242 read events/kprobes/acc/format"},
        {cl.write, "ukprobe -p 4242 write events/kprobes/acc/filter 'fd == 3'"},
        {cl.append, "ukprobe -p 4242 append events/kprobes/acc/trigger 'hist:keys=fd'"},
        {cl.list, "ukprobe -p 4242 list"},
        {cl.verify, "ukprobe -p 4242 verify"},
        {cl.detach, "ukprobe -p 4242 detach"},
        {cl.session, "(echo 'append kprobe_events p:m libc.so.6:malloc'; echo 'write events/kprobes/m/enable 1'; \\\n"
                     "   sleep 5; echo 'read kprobe_profile') | ukprobe -p 4242 session"},
        {cl.add, "ukprobe -p 4242 add 'p:acc libc.so.6:accept4 fd=%di:s32'"},
        {cl.enable, "ukprobe -p 4242 enable acc"},
        {cl.disable, "ukprobe -p 4242 disable kprobes/acc"},
        {cl.trace, "ukprobe -p 4242 trace | tail"},
        {cl.trace_pipe, "ukprobe -p 4242 trace-pipe > acc.trace"},
        {cl.profile, "ukprobe -p 4242 profile"},
        {cl.clear, "ukprobe -p 4242 clear"},
        {cl.run,
         "ukprobe run -e 'r:openret libc.so.6:open ret=$retval:s32' --filter 'openret=ret < 0' -- cat /nonexistent",
         "PROG ARGS...: the program to run and its arguments (after --)"},
        {cl.record, "ukprobe record -o cap.dat -e 'p:m libc.so.6:malloc size=%di:u64' -- ls /",
         "PROG ARGS...: the program to run and its arguments (after --); or -p PID"},
        {cl.report, "ukprobe report --event m --format chrome -o cap.json cap.dat"},
        {cl.mount, "ukprobe -p 4242 mount /tmp/tracing"},
        {cl.calls, "ukprobe -p 4242 calls -d 5 libc.so.6",
         "PROG ARGS...: a program to run for it (after --); or -p PID"},
        {cl.latency, "ukprobe latency libc.so.6:fsync -- sync",
         "PROG ARGS...: a program to run for it (after --); or -p PID"},
        {cl.sdt, "ukprobe sdt /usr/bin/python3.11"},
    };
    for (const Example &e : examples)
        e.sub->footer(fmt::format("{}{}Example:\n  {}", e.note, *e.note != 0 ? "\n\n" : "", e.command));
}

// run's or record's PROG ARGS given after "--": the program's own, which CLI11 never sees.
// *parsed: how many words of argv CLI11 parses (argc when there are none).
std::vector<std::string> program_after_dashes(int argc, char **argv, int *parsed) {
    std::vector<std::string> program;
    *parsed = argc;
    for (int i = 1; i < argc; ++i) {
        if (strcmp(argv[i], "run") != 0 && strcmp(argv[i], "record") != 0 && strcmp(argv[i], "calls") != 0 &&
            strcmp(argv[i], "latency") != 0)
            continue;
        for (int j = i + 1; j < argc; ++j)
            if (strcmp(argv[j], "--") == 0) {
                program.assign(argv + j + 1, argv + argc);
                *parsed = j;
                break;
            }
        break;
    }
    return program;
}

// The options of run and record that come from elsewhere on the command line.
void set_run_options(CommandLine &cl) {
    Options &o = cl.o;
    o.run.follow = !cl.no_follow;
    o.run.verbose = o.verbose;
    o.run.agent = find_agent(o.agent);
}

// Runs the command parsed; its exit status. `program`: run's or record's PROG ARGS, when
// given after "--" (`after_dashes`).
int run_command(CommandLine &cl, const std::vector<std::string> &program, bool after_dashes) {
    Options &o = cl.o;
    if (*cl.attach) return cmd_attach(o);
    if (*cl.ping) return cmd_simple(o, Op::kPing);
    if (*cl.read) {
        if (o.path == "trace" || o.path == "trace_pipe" || o.path == "snapshot") return cmd_trace(o, o.path);
        return cmd_simple(o, Op::kRead, o.path);
    }
    if (*cl.write) return cmd_simple(o, Op::kWrite, o.path, o.text);
    if (*cl.append) return cmd_simple(o, Op::kAppend, o.path, o.text);
    if (*cl.list) return cmd_simple(o, Op::kRead, "kprobes/list");
    if (*cl.verify) return cmd_simple(o, Op::kVerify);
    if (*cl.detach) return cmd_simple(o, Op::kDetach);
    if (*cl.session) return cmd_session(o);
    if (*cl.add) return cmd_simple(o, Op::kAppend, "kprobe_events", o.text);
    if (*cl.enable) return cmd_enable(o, true);
    if (*cl.disable) return cmd_enable(o, false);
    if (*cl.trace) return cmd_trace(o, "trace");
    if (*cl.trace_pipe) return cmd_trace_pipe(o);
    if (*cl.profile) return cmd_simple(o, Op::kRead, "kprobe_profile");
    if (*cl.clear) return cmd_simple(o, Op::kWrite, "trace", "");
    if (*cl.run) {
        o.run.argv = after_dashes ? program : cl.run->remaining();
        set_run_options(cl);
        return ukprobe::run_program(o.run);
    }
    if (*cl.record) {
        o.run.argv = after_dashes ? program : cl.record->remaining();
        if (o.run.argv.empty()) return cmd_record_attached(o);
        if (o.pid > 0) fail("record: give -p PID or -- PROG ARGS, not both");
        if (o.run.output.empty()) o.run.output = "ukprobe.dat";
        set_run_options(cl);
        o.run.capture = true;
        return ukprobe::run_program(o.run);
    }
    if (*cl.report) {
        if (cl.report_options.file.empty()) cl.report_options.file = "ukprobe.dat";
        return ukprobe::report(cl.report_options);
    }
    if (*cl.mount) return ukprobe::cmd_mount(o.pid, cl.mount_options);
    for (CLI::App *question : {cl.calls, cl.latency}) {
        if (!*question) continue;
        o.run.argv = after_dashes ? program : question->remaining();
        set_run_options(cl);
        const ukprobe::Expansion x =
            question == cl.calls ? ukprobe::expand_calls(o.spec) : ukprobe::expand_latency(o.spec, o.buckets);
        return cmd_question(o, question->get_name(), x, !o.run.argv.empty());
    }
    if (*cl.sdt) {
        if (o.files.empty() && o.pid <= 0) fail("sdt: give FILE... or -p PID");
        fmt::print("{}", ukprobe::sdt_list(o.files, o.pid));
        return 0;
    }
    return 1;
}

} // namespace

int main(int argc, char **argv) {
    // Started without a standard descriptor (`2>&-`, a service manager), ukprobe would
    // open its output or a socket under that number, and its messages would go there; a
    // print to a closed one throws. /dev/null stands in.
    for (int fd = 0; fd < 3; ++fd)
        if (fcntl(fd, F_GETFD) < 0 && errno == EBADF && open("/dev/null", O_RDWR) != fd) return 127;
    // The trace moves through blocks of a megabyte or so (a read of a ring, a write of the
    // output), made and freed on several threads. Served by mmap, or trimmed back to the
    // system after each, every page of each was a fresh page fault: a fifth of `run`'s
    // time at a million lines a second. They stay in the heap.
    mallopt(M_MMAP_THRESHOLD, 64 << 20);
    mallopt(M_TRIM_THRESHOLD, 256 << 20);
    CommandLine cl;
    cl.app.require_subcommand(1);
    add_agent_commands(cl);
    add_program_commands(cl);
    add_questions(cl);
    cl.mount = ukprobe::add_mount_command(cl.app, cl.mount_options);
    add_examples(cl);

    // TEXT or DEF words starting with '-' go to CLI11 as a stand-in (take_dashed_text).
    std::vector<char *> args(argv, argv + argc);
    const std::string dashed_text = take_dashed_text(argc, argv, args.data());
    argv = args.data();

    int parsed = argc;
    const std::vector<std::string> program = program_after_dashes(argc, argv, &parsed);
    try {
        cl.app.parse(parsed, argv);
    } catch (const CLI::ParseError &e) {
        return cl.app.exit(e);
    }
    if (cl.o.text == kStandIn) cl.o.text = dashed_text;
    try {
        return run_command(cl, program, parsed < argc);
    } catch (const ukprobe::AgentGone &e) {
        fmt::print(stderr, "ukprobe: {}\n", ukprobe::lost_agent_message(e, cl.o.pid));
        return 1;
    } catch (const std::exception &e) {
        fmt::print(stderr, "ukprobe: {}\n", e.what());
        return 1;
    }
}
