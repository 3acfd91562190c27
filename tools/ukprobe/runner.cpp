// ukprobe run (and record). The program is a child of ukprobe with the agent preloaded
// (LD_PRELOAD), its events defined before main (UKP_EVENTS) and the control socket on
// (UKP_CONTROL=1).
//
// Seeing the end: once a process is gone its socket is gone, and the agent's destructor
// unlinks the socket path before exit_group. So the child installs, before exec, a seccomp
// filter that hands exit_group, execve(at), unlink(at) and the agents' notices (ring.hpp)
// to ukprobe (SECCOMP_RET_USER_NOTIF, inherited by every descendant: supervisor.hpp). A
// process calling exit_group waits in the call while its stream empties its ring (mapped:
// reader.hpp) and reads kprobe_profile over the connection it already holds; then the
// call goes on (SECCOMP_USER_NOTIF_FLAG_CONTINUE: Hold). An unlink lets ukprobe connect
// to a process it has not reached yet before the socket path goes; an execve empties the
// ring of the image about to be replaced. No ptrace: probe hits (SIGTRAP) never stop.
//
// Seeing the children: they inherit the filter. A process whose agent's control thread
// listens gives notice before its main, and waits while ukprobe connects, checks
// error_log and sets filters and triggers (AgentStream). ukprobe is a subreaper: orphaned
// descendants stay in its tree. A child of fork() that has not exec'd serves no socket:
// it gives notice of its new ring, and while it waits there its ring is taken from it
// (pidfd_getfd) and streamed from then on (ForkedRing), emptied at its execve or
// exit_group, read to the end once it is gone. A ring not taken then is read when the
// process waits in execve or exit_group (drain_forked_ring).
//
// Threads: the main one answers the notifications and signals and never waits for
// output (Runner); one per stream reads and formats a ring (agent_stream.hpp,
// forked_ring.hpp); one writes the merged trace (output.hpp).
#include "run.hpp"

#include "agent_stream.hpp"
#include "client.hpp"
#include "forked_ring.hpp"
#include "output.hpp"
#include "proc.hpp"
#include "profiles.hpp"
#include "short_forms.hpp"
#include "ring_watch.hpp"
#include "keeper.hpp"
#include "supervisor.hpp"
#include "control/fd_passing.hpp"
#include "trace/output.hpp"
#include "trace/ring.hpp"
#include "platform/elf_file.hpp"
#include "platform/proc_tasks.hpp"

#include <fmt/core.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <map>
#include <memory>
#include <optional>
#include <poll.h>
#include <sstream>
#include <stdexcept>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

using ukp::control::Op;

namespace ukprobe {
namespace platform = ukp::platform;

std::string event_path(const std::string &event, const std::string &definitions) {
    std::string e = event;
    if (const size_t dot = e.find('.'); e.find('/') == std::string::npos && dot != std::string::npos) e[dot] = '/';
    if (e.find('/') != std::string::npos) return e;
    std::istringstream in(definitions);
    std::string line;
    while (std::getline(in, line)) {
        const std::string word = line.substr(0, line.find_first_of(" \t"));
        const size_t colon = word.find(':'), slash = word.find('/');
        if (colon == std::string::npos || slash == std::string::npos || slash < colon) continue;
        if (word.substr(slash + 1) == e) return word.substr(colon + 1);
    }
    return "kprobes/" + e;
}

std::string synthetic_names(const std::vector<std::string> &synthetic) {
    std::string out;
    for (const std::string &d : synthetic) {
        const size_t start = d.find_first_not_of(" \t");
        if (start == std::string::npos || d[start] == '!') continue;
        out += "s:synthetic/" + d.substr(start, d.find_first_of(" \t", start) - start) + "\n";
    }
    return out;
}

void print_to(const std::string &file, const std::function<void(FILE *)> &print) {
    FILE *out = file.empty() ? stdout : fopen(file.c_str(), "we");
    if (out == nullptr) throw std::runtime_error(fmt::format("cannot write {}: {}", file, strerror(errno)));
    print(out);
    const bool ok = fflush(out) == 0 && ferror(out) == 0;
    if (out != stdout) fclose(out);
    if (!ok) throw std::runtime_error(fmt::format("cannot write {}", file.empty() ? "stdout" : file));
}

namespace {

using Clock = std::chrono::steady_clock;

// How long an agent is given to answer a ping (Supervisor::agent_answers). At its notice
// that its control thread listens, that thread exists and will answer: the wait is what a
// busy machine takes to run it (50 ms was too short under load, and a process never
// connected then lost its trace if a signal killed it). At its socket's removal at exit,
// the thread may be gone already.
constexpr int kReadyPingTimeoutMs = 2000;
constexpr int kExitPingTimeoutMs = 50;

// UKP_EVENTS: definitions separated by ';', their words by ','; a comma of a word (an f:
// definition's list of functions) is written "\,".
std::string startup_events(const std::vector<std::string> &defs) {
    std::string spec;
    for (const std::string &d : defs) {
        if (d.find(';') != std::string::npos)
            throw std::runtime_error(fmt::format("definition '{}': ';' cannot be passed in UKP_EVENTS", d));
        std::istringstream words(d);
        std::string w, def;
        while (words >> w) {
            std::string escaped;
            for (char c : w) escaped += c == ',' ? std::string("\\,") : std::string(1, c);
            def += (def.empty() ? "" : ",") + escaped;
        }
        if (def.empty()) continue;
        spec += (spec.empty() ? "" : ";") + def;
    }
    return spec;
}

std::pair<std::string, std::string> split_assignment(const std::string &s, const char *what) {
    const size_t eq = s.find('=');
    if (eq == std::string::npos || eq == 0)
        throw std::runtime_error(
            fmt::format("--{} '{}': give EVENT={}", what, s, std::string(what) == "filter" ? "EXPR" : "TRIGGER"));
    return {s.substr(0, eq), s.substr(eq + 1)};
}

// Why the agent cannot be preloaded into `prog` (as execvp would find it), or "": the
// dynamic loader is what reads LD_PRELOAD, so a static program runs without the agent,
// and a set-user-ID or set-group-ID program that changes the caller's credentials runs
// in secure mode, where the loader ignores it.
std::string untraceable(const std::string &prog) {
    std::string path = prog;
    if (prog.find('/') == std::string::npos) {
        path.clear();
        const char *env = getenv("PATH");
        std::istringstream dirs(env != nullptr ? env : "/usr/local/bin:/usr/bin:/bin");
        for (std::string dir; std::getline(dirs, dir, ':');) {
            const std::string candidate = (dir.empty() ? "." : dir) + "/" + prog;
            if (access(candidate.c_str(), X_OK) == 0) {
                path = candidate;
                break;
            }
        }
        if (path.empty()) return ""; // execvp says why
    }
    struct stat st {};
    if (stat(path.c_str(), &st) != 0) return "";
    if (((st.st_mode & S_ISUID) != 0 && st.st_uid != geteuid()) ||
        ((st.st_mode & S_ISGID) != 0 && st.st_gid != getegid()))
        return "set-user-ID or set-group-ID: the dynamic loader ignores LD_PRELOAD there, so the agent is not loaded";
    platform::ElfFile elf;
    if (elf.open(path) && !elf.has_interpreter())
        return "statically linked: no dynamic loader reads LD_PRELOAD, so the agent is not loaded";
    return "";
}

class Runner {
public:
    explicit Runner(const RunOptions &o) : o_(o) {}
    int run();

private:
    void check_options();
    void open_output();
    sigset_t take_signals();
    int start_program(const sigset_t &old_mask);
    [[noreturn]] void child(int fd_sock, int err_pipe, const sigset_t &old_mask);
    std::string supervise(int err_fd);
    bool reap();
    void forget_ended_forked();
    void end_streams();
    void on_socket(int pid);
    bool new_agent_in(int pid);
    int events_source(int pid, const TraceReader **table_from);
    bool take_forked(int pid);
    void drain_forked(int pid);
    void on_notification();
    void handle(const seccomp_notif &req);
    void on_signals();
    void kill_program(int sig);
    void explain_staying() const;

    const RunOptions &o_;
    FILE *file_ = nullptr;
    std::unique_ptr<Output> out_;
    std::unique_ptr<RingWatch> watch_; // the streams' rings, looked at for them
    int child_ = -1;
    int child_status_ = -1; // wait status once the child is gone
    int signal_fd_ = -1;
    Supervisor supervisor_;                            // the notifications of the program's tree
    Keeper keeper_;                                    // answers for ukprobe should it die first
    std::vector<std::unique_ptr<AgentStream>> agents_; // every agent connected, in order
    std::map<int, AgentStream *> by_pid_;              // the latest agent of each process
    std::vector<std::unique_ptr<ForkedRing>> forked_;  // rings of forked children, until they end
    std::map<int, ForkedRing *> forked_by_pid_;        // the latest of each process
    std::map<int, int> forked_from_;                   // children of fork(): whom from, until they exit
    ukp::sym::Registry forked_symbols_;                // the objects of the last forked child taken: its
                                                       // siblings have the same ones at the same addresses
    std::vector<ProfileBlock> forked_profiles_;        // of forked children whose stream ended
    std::vector<std::string> hist_paths_;              // the hist files of the --trigger hist triggers
    uint64_t next_seq_ = 0;
    bool failed_ = false; // the program's definitions were refused
};

int Runner::run() {
    check_options();
    open_output();
    const sigset_t old_mask = take_signals();
    const std::string exec_error = supervise(start_program(old_mask));
    end_streams();
    if (!exec_error.empty()) {
        fmt::print(stderr, "ukprobe: {}\n", exec_error);
        return 127; // as a shell
    }
    if (failed_) return 1;
    return WIFEXITED(child_status_) ? WEXITSTATUS(child_status_) : 128 + WTERMSIG(child_status_);
}

// Refuses options the program cannot be run with; warns when the agent cannot be
// preloaded into it.
void Runner::check_options() {
    if (o_.argv.empty()) throw std::runtime_error("run: which program? give -- PROG ARGS...");
    startup_events(o_.definitions); // refuses what UKP_EVENTS cannot carry
    for (const std::string &f : o_.filters) split_assignment(f, "filter");
    for (const std::string &t : o_.triggers) split_assignment(t, "trigger");
    if (!o_.answer_output.empty()) print_to(o_.answer_output, [](FILE *) {}); // writable, before it runs
    if (const std::string why = untraceable(o_.argv[0]); !why.empty())
        fmt::print(stderr, "ukprobe: {} is {}; it runs untraced (the programs it starts are traced)\n", o_.argv[0],
                   why);
}

// The trace's destination (o_.output, else stdout) and the watch of the streams' rings.
void Runner::open_output() {
    if (!o_.output.empty()) {
        file_ = fopen(o_.output.c_str(), "we");
        if (file_ == nullptr) throw std::runtime_error(fmt::format("cannot write {}: {}", o_.output, strerror(errno)));
    }
    out_ = std::make_unique<Output>(file_ != nullptr ? file_ : stdout, o_.capture);
    watch_ = std::make_unique<RingWatch>();
}

// Takes the signals for the main thread's descriptor (signal_fd_), and the orphans of the
// program's tree; returns the signal mask the program is to start with.
sigset_t Runner::take_signals() {
    // Signals arrive through a descriptor; agent threads start with them blocked.
    sigset_t mask, old_mask;
    sigemptyset(&mask);
    for (int s : {SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGQUIT}) sigaddset(&mask, s);
    sigprocmask(SIG_BLOCK, &mask, &old_mask);
    signal_fd_ = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
    signal(SIGPIPE, SIG_IGN);
    // Orphaned descendants come to ukprobe: they stay in its tree and are waited for.
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    return old_mask;
}

// Forks the child that runs the program (child) and listens to its filter; returns the
// pipe the child writes its exec's errno to.
int Runner::start_program(const sigset_t &old_mask) {
    int sv[2], errp[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0 || pipe2(errp, O_CLOEXEC) != 0)
        throw std::runtime_error(fmt::format("run: {}", strerror(errno)));
    fflush(nullptr);
    // Before the child: it may outlive ukprobe only with a keeper (keeper.hpp).
    if (!keeper_.start() && o_.verbose)
        fmt::print(stderr, "ukprobe: no keeper ({}): the program dies with ukprobe\n", strerror(errno));
    child_ = fork();
    if (child_ < 0) throw std::runtime_error(fmt::format("fork: {}", strerror(errno)));
    if (child_ == 0) {
        close(sv[0]);
        close(errp[0]);
        child(sv[1], errp[1], old_mask);
    }
    close(sv[1]);
    close(errp[1]);
    char byte = 0;
    int notify_fd = -1;
    if (ukp::control::recv_with_fd(sv[0], &byte, 1, &notify_fd) != 1) notify_fd = -1;
    supervisor_.listen(notify_fd);
    keeper_.give(notify_fd);
    close(sv[0]);
    return errp[0];
}

void Runner::child(int fd_sock, int err_pipe, const sigset_t &old_mask) {
    // Without a keeper the program dies with ukprobe: with no listener left, its
    // exit_group, execve and unlink would fail (ENOSYS). With one it goes on untraced.
    if (!keeper_.running()) prctl(PR_SET_PDEATHSIG, SIGKILL);
    auto die = [&](int err) {
        const int e = err;
        (void)!write(err_pipe, &e, sizeof e);
        _exit(127);
    };
    const int nfd = install_filter();
    if (nfd < 0) die(errno);
    const char byte = 0;
    const iovec one{const_cast<char *>(&byte), 1};
    if (ukp::control::send_with_fd(fd_sock, &one, 1, nfd) != 1) die(errno);
    close(nfd);
    close(fd_sock);
    std::string preload = o_.agent;
    if (const char *old = getenv("LD_PRELOAD"); old != nullptr && *old != 0) preload += std::string(" ") + old;
    setenv("LD_PRELOAD", preload.c_str(), 1);
    setenv("UKP_EVENTS", startup_events(o_.definitions).c_str(), 1);
    setenv("UKP_CONTROL", "1", 1);
    setenv("UKP_SUPERVISED", "1", 1); // a process started once ukprobe is gone applies nothing
    if (o_.buffer_size_kb != 0) setenv("UKP_BUFFER_SIZE_KB", std::to_string(o_.buffer_size_kb).c_str(), 1);
    if (!o_.follow) setenv("UKP_NO_INHERIT", "1", 1);
    // The agents keep the reference tables of the objects they probe there (refs_cache.cpp):
    // each exec'd process after the first skips decoding libc again. One given is kept
    // (empty: none).
    if (const std::string dir = refs_cache_dir(); !dir.empty()) setenv("UKP_CACHE_DIR", dir.c_str(), 0);
    signal(SIGPIPE, SIG_DFL);
    sigprocmask(SIG_SETMASK, &old_mask, nullptr);
    std::vector<char *> argv;
    for (const std::string &a : o_.argv) argv.push_back(const_cast<char *>(a.c_str()));
    argv.push_back(nullptr);
    execvp(argv[0], argv.data());
    die(errno);
    _exit(127);
}

// Answers the notifications and signals until the program and every descendant are gone
// (`err_fd`: start_program's pipe); returns why the program could not be run, or "".
std::string Runner::supervise(int err_fd) {
    std::string exec_error;
    for (;;) {
        pollfd fds[3] = {{supervisor_.fd(), POLLIN, 0}, {signal_fd_, POLLIN, 0}, {err_fd, POLLIN, 0}};
        const int n = poll(fds, err_fd >= 0 ? 3 : 2, 100);
        if (n < 0 && errno != EINTR) break;
        if (fds[0].revents & POLLIN) on_notification();
        if (err_fd >= 0 && (fds[2].revents & (POLLIN | POLLHUP))) {
            int e = 0;
            if (read(err_fd, &e, sizeof e) == static_cast<ssize_t>(sizeof e))
                exec_error = fmt::format("cannot run {}: {}", o_.argv[0], strerror(e));
            close(err_fd);
            err_fd = -1;
        }
        if (fds[1].revents & POLLIN) on_signals();
        const bool none_left = reap();
        forget_ended_forked();
        supervisor_.expire_holds(Clock::now());
        if (child_status_ >= 0 && none_left) break;
    }
    return exec_error;
}

// Reaps the program, and descendants left to ukprobe; whether none is left.
bool Runner::reap() {
    int status = 0, pid;
    while ((pid = waitpid(-1, &status, WNOHANG | __WALL)) > 0)
        if (pid == child_) child_status_ = status;
    return pid < 0 && errno == ECHILD;
}

// Streams of forked children that ended go (a program may fork many); their counts stay.
void Runner::forget_ended_forked() {
    std::erase_if(forked_, [&](const std::unique_ptr<ForkedRing> &f) {
        if (!f->ended()) return false;
        if (auto it = forked_by_pid_.find(f->pid()); it != forked_by_pid_.end() && it->second == f.get())
            forked_by_pid_.erase(it);
        forked_profiles_.push_back(f->profile());
        return true;
    });
}

// Every process is gone: the streams end by themselves. The rest of the trace is
// written, then the counts of every process image.
void Runner::end_streams() {
    for (auto &a : agents_) a->join();
    for (auto &f : forked_) {
        f->join();
        forked_profiles_.push_back(f->profile());
    }
    forked_.clear();
    out_->finish();
    if (file_ != nullptr) fclose(file_);
    std::vector<ProfileBlock> blocks = std::move(forked_profiles_);
    for (auto &a : agents_) blocks.push_back(a->profile());
    if (!o_.answers.empty()) {
        print_to(o_.answer_output, [&](FILE *out) { print_answers(std::move(blocks), o_.answers, out, sum_hists); });
        return;
    }
    print_profiles(blocks, out_->lost());
    if (!hist_paths_.empty()) print_answers(std::move(blocks), hist_paths_, stderr, sum_hists);
}

// A new socket: connect if it is the program's or a descendant's (when followed), set
// the filters and triggers, check that every definition was taken, stream.
void Runner::on_socket(int pid) {
    if (!new_agent_in(pid)) return;
    if (pid != child_ && (!o_.follow || !descends_from_us(pid))) return;
    auto agent = std::make_unique<AgentStream>(pid, next_seq_++, *out_, *watch_);
    if (agent->connect() != 0) return;
    try {
        agent->share_counts();
        const Reply defs = agent->ask(Op::kRead, "kprobe_events");
        const Reply log = agent->ask(Op::kRead, "error_log");
        if (log.status >= 0 && !log.payload.empty()) {
            std::string text = log.payload;
            while (!text.empty() && text.back() == '\n') text.pop_back();
            fmt::print(stderr, "ukprobe: process {} ({}) rejected a definition:\n{}\n", pid, agent->comm(), text);
            if (pid == child_) {
                failed_ = true;
                kill_program(SIGKILL);
                return;
            }
        }
        // A definition the agent refused without an error_log entry (one it could not
        // parse: "p:bad") would otherwise go unnoticed: the events defined are counted.
        size_t given = 0, defined = 0;
        for (const std::string &d : o_.definitions) given += d.find_first_not_of(" \t") != std::string::npos;
        std::istringstream lines(defs.payload);
        for (std::string line; std::getline(lines, line);) defined += !line.empty();
        if (defs.status >= 0 && (log.status < 0 || log.payload.empty()) && defined < given) {
            fmt::print(stderr, "ukprobe: process {} ({}) defined {} of the {} definitions given (kprobe_events):\n{}",
                       pid, agent->comm(), defined, given, defs.payload);
            if (pid == child_) {
                failed_ = true;
                kill_program(SIGKILL);
                return;
            }
        }
        // One write; false when the program was stopped for its refusal.
        auto put = [&](Op op, const std::string &path, const std::string &text) {
            const Reply r = agent->ask(op, path, text);
            if (r.status >= 0) return true;
            fmt::print(stderr, "ukprobe: {}\n", refusal(r, op, path, pid));
            if (pid != child_) return true;
            failed_ = true;
            kill_program(SIGKILL);
            return false;
        };
        const std::string named = defs.payload + synthetic_names(o_.synthetic); // where a bare name is looked for
        auto apply = [&](const std::vector<std::string> &list, const char *what, const char *file, Op op) {
            for (const std::string &s : list) {
                const auto [event, text] = split_assignment(s, what);
                if (!put(op, "events/" + event_path(event, named) + "/" + file, text)) return false;
            }
            return true;
        };
        for (const std::string &d : o_.synthetic) // defined and enabled, as the -e events
            if (!put(Op::kAppend, "synthetic_events", d)) return;
        std::istringstream synth(synthetic_names(o_.synthetic));
        for (std::string line; std::getline(synth, line);)
            if (!put(Op::kWrite, "events/" + line.substr(2) + "/enable", "1")) return;
        if (!apply(o_.filters, "filter", "filter", Op::kWrite)) return;
        if (!apply(o_.triggers, "trigger", "trigger", Op::kAppend)) return;
        for (const FileWrite &w : o_.setup)
            if (!put(w.append ? Op::kAppend : Op::kWrite, w.path, w.text)) return;
        if (o_.answers.empty()) {
            // The histograms of --trigger's hist triggers, read as each image ends (after
            // it, nothing could read them) and printed after kprobe_profile.
            hist_paths_.clear();
            for (const std::string &t : o_.triggers) {
                const auto [event, text] = split_assignment(t, "trigger");
                const size_t start = text.find_first_not_of(' ');
                if (start == std::string::npos || text.compare(start, 4, "hist") != 0 ||
                    (text.size() > start + 4 && text[start + 4] != ':' && text[start + 4] != ' '))
                    continue;
                const std::string path = "events/" + event_path(event, named) + "/hist";
                if (std::find(hist_paths_.begin(), hist_paths_.end(), path) == hist_paths_.end())
                    hist_paths_.push_back(path);
            }
            agent->read_at_end(hist_paths_);
        } else {
            agent->read_at_end(o_.answers);
        }
        agent->prepare();
    } catch (const std::runtime_error &) {
        return; // gone meanwhile
    }
    agent->start();
    if (o_.verbose) fmt::print(stderr, "ukprobe: process {} ({}) reached\n", pid, agent->comm());
    if (auto it = forked_by_pid_.find(pid); it != forked_by_pid_.end()) it->second->finish();
    by_pid_[pid] = agent.get();
    agents_.push_back(std::move(agent));
}

// Whether an agent listens in `pid` that ukprobe does not stream from yet (a new process,
// or a new image after an exec: its socket is another one under the same path, which the
// file system may give the inode number of the old one, freed by the new agent's unlink).
bool Runner::new_agent_in(int pid) {
    struct stat st {};
    if (stat(agent_socket_path(pid, static_cast<unsigned>(geteuid())).c_str(), &st) != 0) return false;
    const auto it = by_pid_.find(pid);
    return it == by_pid_.end() || it->second->ended() || it->second->image_gone() ||
           it->second->socket_ino() != st.st_ino;
}

void Runner::on_notification() {
    seccomp_notif req;
    if (!supervisor_.receive(&req)) return;
    handle(req);
    while (supervisor_.next_deferred(&req)) handle(req);
}

void Runner::handle(const seccomp_notif &req) {
    const int tgid = tgid_of(static_cast<int>(req.pid));
    const int nr = req.data.nr;
    if (tgid > 0) {
        if (int parent = 0; forked_ring_notice(req, &parent)) {
            // A child of fork() with buffers of its own. Once ukprobe holds them (or
            // wants none), the child closes its descriptors for them.
            // The parent by the child's numbers (its pid namespace: a container's, bwrap's).
            if (parent > 0) parent = ukp::trace::pid_here(tgid, parent);
            if (parent > 0) forked_from_[tgid] = parent;
            // Not taken now (drain_forked takes them at its exit): it keeps them.
            supervisor_.answer(req.id, take_forked(tgid) ? ukp::trace::kNoticeDone : ukp::trace::kNoticeKeep);
            return;
        } else if (notice(req, ukp::trace::kNoticeHello)) {
            // A process about to apply UKP_EVENTS: ukprobe is here to read its trace.
            supervisor_.answer(req.id, ukp::trace::kNoticeDone);
            return;
        } else if (notice(req, ukp::trace::kNoticeControlReady)) {
            // An agent's control thread listens: connect while it waits, before main.
            if (new_agent_in(tgid) && supervisor_.agent_answers(tgid, kReadyPingTimeoutMs, o_.verbose)) on_socket(tgid);
        } else if (nr == __NR_rt_sigprocmask) {
            // Matched by the filter by chance (a program's own call with that word in r8).
        } else if (nr == __NR_unlink || nr == __NR_unlinkat) {
            // An agent's destructor about to remove its socket: connect while it waits.
            if (new_agent_in(tgid) && supervisor_.agent_answers(tgid, kExitPingTimeoutMs, o_.verbose)) on_socket(tgid);
        } else if (!exec_file_missing(req)) {
            // exit_group, execve, execveat: the call goes on once the streams of the
            // image have emptied its rings (a child that exec'd into an agent has two).
            const HoldPtr hold = supervisor_.hold(req.id);
            bool streamed = false;
            if (auto it = forked_by_pid_.find(tgid); it != forked_by_pid_.end() && it->second->streaming()) {
                it->second->drain(nr != __NR_exit_group, hold);
                streamed = true;
            }
            if (auto it = by_pid_.find(tgid); it != by_pid_.end() && !it->second->ended()) {
                it->second->drain(hold);
                streamed = true;
            }
            if (!streamed) drain_forked(tgid);
            if (nr == __NR_exit_group) forked_from_.erase(tgid);
            return;
        }
    }
    supervisor_.let_go(req.id);
}

// The process whose agent has the event table of `pid`, a child of fork() that has not
// exec'd: the nearest ancestor ukprobe streams from (the image it was forked from), or
// that of a forked ancestor; 0 if none. The ancestors are those the processes were forked
// from (their notices say), whoever their parent is now. Should that agent be gone (a
// daemon: the program forks it and exits at once), the table its stream read is
// *table_from (the connection to it fails: TraceReader::borrow_events).
int Runner::events_source(int pid, const TraceReader **table_from) {
    *table_from = nullptr;
    const auto forked_from = [this](int p) {
        auto it = forked_from_.find(p);
        return it != forked_from_.end() ? it->second : parent_of(p);
    };
    for (int p = forked_from(pid), i = 0; p > 1 && i < 256; p = forked_from(p), ++i) {
        if (auto it = by_pid_.find(p); it != by_pid_.end()) {
            AgentStream *a = it->second;
            if (!a->ended() && !a->image_gone()) return p;
            // Gone: its stream reads no table any more (its connection is closed).
            if (a->reader().has_events()) {
                *table_from = &a->reader();
                return p;
            }
        }
        if (auto it = forked_by_pid_.find(p); it != forked_by_pid_.end() && it->second->streaming()) {
            if (it->second->reader() != nullptr && it->second->reader()->has_events())
                *table_from = it->second->reader();
            return it->second->events_pid();
        }
    }
    return 0;
}

// A child of fork() gave notice of its own ring (it waits meanwhile): streamed from now on.
bool Runner::take_forked(int pid) {
    if (!o_.follow) return true;
    if (auto it = forked_by_pid_.find(pid); it != forked_by_pid_.end() && !it->second->gone()) return false;
    const TraceReader *table_from = nullptr;
    const int source = events_source(pid, &table_from);
    if (source <= 0) return true; // no event table to print it with, now or at its exit
    auto ring = std::make_unique<ForkedRing>(pid, source, next_seq_++, *out_, *watch_);
    if (!ring->open(forked_symbols_, table_from)) return false; // drain_forked tries again at its exit
    forked_symbols_ = ring->symbols();
    ring->start();
    forked_by_pid_[pid] = ring.get();
    forked_.push_back(std::move(ring));
    return true;
}

// A child of fork() whose ring ukprobe did not take at its notice waits in exit_group or
// execve: its ring is taken now and printed with the event table of its ancestor.
void Runner::drain_forked(int pid) {
    if (!o_.follow) return;
    const TraceReader *table_from = nullptr;
    const int source = events_source(pid, &table_from);
    if (source <= 0) return;
    if (std::optional<ProfileBlock> b = drain_forked_ring(pid, source, *out_, table_from)) {
        b->seq = next_seq_++;
        forked_profiles_.push_back(std::move(*b));
    }
}

void Runner::kill_program(int sig) {
    if (child_ > 0 && child_status_ < 0) kill(child_, sig);
}

void Runner::on_signals() {
    signalfd_siginfo si;
    while (read(signal_fd_, &si, sizeof si) == static_cast<ssize_t>(sizeof si)) {
        if (si.ssi_signo == SIGCHLD) continue; // reaped below
        // From the terminal the signal went to the whole foreground group, the program
        // too; sent to ukprobe alone, it is passed on, as a shell does for its job.
        if (si.ssi_code != SI_KERNEL) kill_program(static_cast<int>(si.ssi_signo));
        if (child_status_ >= 0) explain_staying();
    }
}

// The program has ended, processes it started still run (a daemon, a background job),
// and ukprobe was asked to end. It stays: `run` traces the program's whole tree to its
// end, and gone, it would leave their events enabled, their rings written with no reader
// (a child of fork() serves no socket they could be disabled through). It says so, and
// whom it waits for: the processes that came to it as their subreaper. Killed with
// SIGKILL, it leaves them to its keeper (keeper.hpp), and they go on.
void Runner::explain_staying() const {
    std::string pids;
    int n = 0;
    // An orphan is given to one of the subreaper's threads: each thread's children.
    ukp::platform::for_each_thread([&](int tid) {
        FILE *f = std::fopen(fmt::format("/proc/self/task/{}/children", tid).c_str(), "r");
        if (f == nullptr) return true;
        for (int pid; std::fscanf(f, "%d", &pid) == 1;)
            if (pid != keeper_.pid()) pids += fmt::format("{}{}", n++ == 0 ? "" : " ", pid);
        std::fclose(f);
        return true;
    });
    fmt::print(stderr,
               "ukprobe: {} has ended, but {} process{} it started still run{}: ukprobe traces them until "
               "they exit; stop them to end the trace\n",
               o_.argv[0], n, n == 1 ? "" : "es", n == 0 ? "" : fmt::format(" ({})", pids));
}

} // namespace

int run_program(const RunOptions &o) {
    Runner r(o);
    return r.run();
}

} // namespace ukprobe
