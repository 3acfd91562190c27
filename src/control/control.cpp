// The agent side of the control socket: one thread, started by ukp_control_start() (the
// injector calls it after dlopen) or at load when UKP_CONTROL=1. It serves the debugfs
// files of the core, hands every other path to the trace layer's file API
// (<ukprobes/trace.h>), and passes the trace ring's memfd to a controller that
// prints the trace itself (Op::kOpenFd). Off the hit path: it takes no lock a probe
// hit takes.
#include "control/control.hpp"
#include "platform/agent_heap.hpp"
#include "platform/agent_threads.hpp"
#include "platform/async_blocked.hpp"
#include "platform/held_fd.hpp"
#include "platform/high_fd.hpp"
#include "text/text.hpp"
#include "control/fd_passing.hpp"
#include "control/protocol.hpp"
#include "platform/disk_cache.hpp"
#include "core/agent.hpp"
#include "core/fork.hpp"
#include "trace/counters.hpp"
#include "trace/events.hpp"
#include "trace/ring.hpp"

#include <ukprobes/kprobes.h>
#include <ukprobes/trace.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dirent.h>
#include <fcntl.h>
#include <mutex>
#include <new>
#include <poll.h>
#include <pthread.h>
#include <semaphore.h>
#include <string>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>
#include <vector>

namespace ukp::control {

namespace {

constexpr int kPipeWaitMs = 100; // a trace_pipe request waits this long for a record

// What one controller changed, undone when it detaches or disappears.
struct Connection {
    int fd = -1;
    std::vector<std::string> events; // "GRP/EVENT" defined through this connection
    // Triggers added through it: (path, command), removed ("!command") before the events,
    // last first (a hist trigger whose variable another one reads goes after the reader).
    std::vector<std::pair<std::string, std::string>> triggers;
    // The filters it wrote: each file's text before the first write here (0: none).
    std::vector<std::pair<std::string, std::string>> saved_filters;
    int saved_enabled = -1;      // kprobes/enabled before its first write here, or -1
    int saved_optimization = -1; // kprobes/optimization likewise
    bool session = false;        // Op::kSession: its additions go when it closes
    bool supervised = false;     // Op::kSupervised: its close disables every event
};

std::mutex g_start_mu;               // serializes start and stop requests from the program
std::atomic<bool> g_stopping{false}; // the thread is on its way out (after detach)
bool g_thread_valid = false;         // g_thread is joinable; under g_start_mu
pthread_t g_thread;
// The thread's descriptors. It makes them in a table of its own (text::use_own_fd_table),
// where the program can neither see nor close them, nor count them against its limit;
// g_own_table says so (else, on a kernel that refuses, they are high in the program's).
int g_listen_fd = -1;
int g_wake_fd[2] = {-1, -1}; // a byte here makes the thread stop (ukp_control_stop)
bool g_own_table = false;
pid_t g_thread_tid = 0;
// Where the socket is; plain chars so that the exit-time unlink never meets a destroyed string.
char g_socket_path[sizeof(sockaddr_un::sun_path)];
pid_t g_owner = 0; // the process the socket belongs to (a forked child must leave it alone)

constexpr int kIoTimeoutSeconds = 10; // a controller that stalls mid-request is dropped

bool read_full(int fd, void *buf, size_t n) {
    auto *p = static_cast<char *>(buf);
    while (n > 0) {
        const ssize_t r = read(fd, p, n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return false;
        p += r;
        n -= static_cast<size_t>(r);
    }
    return true;
}

bool send_reply(int fd, int32_t status, const std::string &payload, int pass_fd = -1) {
    ReplyHeader h{kMagic, kVersion, 0, status, static_cast<uint32_t>(payload.size())};
    if (pass_fd >= 0) h.flags |= kReplyFd;
    iovec iov[2] = {{&h, sizeof h}, {const_cast<char *>(payload.data()), payload.size()}};
    size_t total = sizeof h + payload.size();
    ssize_t n = send_with_fd(fd, iov, payload.empty() ? 1 : 2, pass_fd);
    if (n < 0) return false;
    // The rest of a long payload, without the descriptor.
    size_t sent = static_cast<size_t>(n);
    while (sent < total) {
        const size_t off = sent - sizeof h;
        if (sent < sizeof h) return false; // the header always fits a socket buffer
        n = send(fd, payload.data() + off, payload.size() - off, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return false;
        sent += static_cast<size_t>(n);
    }
    return true;
}

// Trace paths: a definition file whose additions are tracked per connection.
// The files a write to which defines or removes events (dynamic_events lists them all).
bool is_definitions_file(const std::string &path) {
    return path == "kprobe_events" || path == "dynamic_events" || path == "uprobe_events" || path == "synthetic_events";
}

bool ends_with(const std::string &s, std::string_view tail) {
    return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// "p:GRP/EVENT ..." -> "GRP/EVENT" for every probe line of a definitions file's text.
std::vector<std::string> event_names(const std::string &text) {
    std::vector<std::string> names;
    size_t pos = 0;
    while (pos < text.size()) {
        size_t end = text.find('\n', pos);
        if (end == std::string::npos) end = text.size();
        const std::string line = text.substr(pos, end - pos);
        pos = end + 1;
        const size_t word_end = line.find_first_of(" \t");
        const std::string word = line.substr(0, word_end);
        const size_t colon = word.find(':');
        if (colon == std::string::npos || colon + 1 >= word.size()) continue;
        names.push_back(word.substr(colon + 1));
    }
    std::sort(names.begin(), names.end());
    return names;
}

int trace_read(const std::string &path, std::string *out) {
    char *text = nullptr;
    const int rc = ukp_trace_read(path.c_str(), &text);
    if (rc >= 0 && text != nullptr) *out = text;
    free(text);
    return rc < 0 ? rc : 0;
}

// The last entry of error_log (it starts with '['), for the reply to a failed write.
std::string last_error() {
    std::string log;
    if (trace_read("error_log", &log) != 0 || log.empty()) return {};
    size_t start = log.rfind("\n[");
    start = start == std::string::npos ? 0 : start + 1;
    return log.substr(start);
}

class Server {
public:
    explicit Server(int listen_fd) : listen_fd_(listen_fd) {}
    void run();

private:
    // Returns false when the connection must be closed (framing error or I/O failure).
    bool serve_one(size_t index);
    int32_t handle(Connection &c, uint16_t op, const std::string &path, const std::string &payload, std::string *reply,
                   int *reply_fd);
    int32_t handle_read(const std::string &path, std::string *reply);
    int32_t handle_write(Connection &c, const std::string &path, const std::string &payload, bool append,
                         std::string *reply);
    void forget_events(const std::vector<std::string> &removed);
    void undo(Connection &c);
    void close_connection(size_t index);

    int listen_fd_;
    std::vector<Connection> conns_;
    // The additions of one-shot connections (no Op::kSession): they outlive the
    // connection and go at Op::kDetach or when the thread stops.
    Connection shared_;
    std::vector<pollfd> fds_; // poll()'s array, rebuilt every round
    bool stop_ = false;
};

void Server::run() {
    std::vector<pollfd> &fds = fds_;
    while (!stop_) {
        // A fork() waits until this thread is back in poll(): fork.hpp.
        const core::ForkQuiet busy(core::ForkGate::kControl);
        fds.clear();
        fds.push_back({listen_fd_, POLLIN, 0});
        fds.push_back({g_wake_fd[0], POLLIN, 0});
        for (const Connection &c : conns_) fds.push_back({c.fd, POLLIN, 0});
        platform::release_spares(); // what the last requests' work kept: platform/agent_heap.hpp
        int ready;
        {
            const core::ForkQuiet::Unlocked idle(busy);
            ready = poll(fds.data(), fds.size(), -1);
        }
        if (ready < 0) {
            if (errno == EINTR) continue;
            break;
        }
        if (fds[1].revents != 0) break;
        for (size_t i = conns_.size(); i-- > 0;) {
            if (fds[i + 2].revents == 0) continue;
            if (!serve_one(i)) close_connection(i);
            if (stop_) break;
        }
        if (stop_ || (fds[0].revents & POLLIN) == 0) continue;
        const int fd = platform::move_fd_high(accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC));
        if (fd < 0) continue;
        ucred cred{};
        socklen_t len = sizeof cred;
        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || (cred.uid != geteuid() && cred.uid != 0)) {
            char msg[128];
            snprintf(msg, sizeof msg, "peer uid %u is neither the process's uid %u nor root", cred.uid,
                     static_cast<unsigned>(geteuid()));
            send_reply(fd, -EACCES, msg);
            close(fd);
            continue;
        }
        const timeval tv{kIoTimeoutSeconds, 0};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
        Connection c;
        c.fd = fd;
        conns_.push_back(std::move(c));
    }
    // Stopping: every controller loses what it added.
    const core::ForkQuiet busy(core::ForkGate::kControl);
    while (!conns_.empty()) close_connection(conns_.size() - 1);
    undo(shared_);
}

bool Server::serve_one(size_t index) {
    RequestHeader h{};
    if (!read_full(conns_[index].fd, &h, sizeof h)) return false;
    if (h.magic != kMagic) return false;
    if (h.version != kVersion) {
        send_reply(conns_[index].fd, -EPROTONOSUPPORT,
                   "protocol version " + std::to_string(h.version) + " not supported; the agent speaks " +
                       std::to_string(kVersion));
        return false;
    }
    if (h.path_len > kMaxPath || h.payload_len > kMaxPayload) {
        send_reply(conns_[index].fd, -EMSGSIZE, "request too large");
        return false;
    }
    std::string path(h.path_len, '\0'), payload(h.payload_len, '\0');
    if (!read_full(conns_[index].fd, path.data(), path.size())) return false;
    if (!read_full(conns_[index].fd, payload.data(), payload.size())) return false;
    std::string reply;
    int reply_fd = -1;
    const int32_t status = handle(conns_[index], h.op, path, payload, &reply, &reply_fd);
    const bool sent = send_reply(conns_[index].fd, status, reply, reply_fd);
    if (reply_fd >= 0) close(reply_fd); // the controller has its own now
    return sent && !stop_;
}

int32_t Server::handle(Connection &c, uint16_t op, const std::string &path, const std::string &payload,
                       std::string *reply, int *reply_fd) {
    const bool needs_path = op == uint16_t(Op::kRead) || op == uint16_t(Op::kWrite) || op == uint16_t(Op::kAppend) ||
                            op == uint16_t(Op::kOpenFd);
    if (needs_path) {
        if (path.empty() || path.front() == '/' || path.find('\0') != std::string::npos ||
            path.find("..") != std::string::npos) {
            *reply = "bad path '" + path + "': give a path relative to the tracing directory";
            return -EINVAL;
        }
    }
    if (payload.find('\0') != std::string::npos) {
        *reply = "the text contains a NUL byte";
        return -EINVAL;
    }
    switch (static_cast<Op>(op)) {
    case Op::kPing:
        *reply = "ukprobes protocol " + std::to_string(kVersion) + " pid " + std::to_string(getpid());
        return 0;
    case Op::kSession:
        // What this connection already added moves with it (none, as a rule: it is the first request).
        c.session = true;
        return 0;
    case Op::kSupervised:
        c.supervised = true;
        return 0;
    case Op::kRead:
        return handle_read(path, reply);
    case Op::kWrite:
        return handle_write(c.session ? c : shared_, path, payload, false, reply);
    case Op::kAppend:
        return handle_write(c.session ? c : shared_, path, payload, true, reply);
    case Op::kVerify: {
        char *report = nullptr;
        const int n = ukp_verify(&report);
        if (report != nullptr) *reply = report;
        free(report);
        return n;
    }
    case Op::kDetach: {
        undo(c);
        undo(shared_);
        // Unlinked before the reply: a controller that attaches right after finds no socket
        // and starts a new thread (ukp_control_start waits for this one).
        g_stopping.store(true);
        unlink(g_socket_path);
        stop_ = true;
        return 0;
    }
    case Op::kOpenFd: {
        // The ring's memfd: the controller maps it and formats the records itself.
        size_t size = 0;
        if (path == kSnapshotRingPath) {
            const int fd = trace::snapshot_memfd_copy(&size);
            if (fd == -ENOENT) return 0; // no snapshot allocated: no descriptor
            if (fd < 0) return fd;
            *reply_fd = fd;
            return 0;
        }
        if (path == kCountersPath) {
            const int fd = trace::counters_memfd_copy();
            if (fd < 0) return fd;
            *reply_fd = fd;
            return 0;
        }
        if (path != kTraceRingPath) {
            *reply = "no descriptor is served at '" + path + "' (only " + kTraceRingPath + ", " + kSnapshotRingPath +
                     " and " + kCountersPath + ")";
            return -ENOENT;
        }
        *reply_fd = trace::ring_memfd_copy(&size);
        if (*reply_fd < 0) return *reply_fd;
        return 0;
    }
    }
    *reply = "unknown operation " + std::to_string(op);
    return -EOPNOTSUPP;
}

int32_t Server::handle_read(const std::string &path, std::string *reply) {
    if (path == "trace_pipe" || path == "/trace_pipe") {
        // This thread answers one request at a time: a pipe read waits briefly for a record
        // (a reader loops, as `cat trace_pipe` does), so that other controllers and the
        // other files of a mount are not held up for long.
        char *text = nullptr;
        if (const int r = ukp_trace_pipe_read(kPipeWaitMs, 1 << 20, &text); r != 0) return r;
        *reply = text;
        free(text);
        return 0;
    }
    if (path == "kprobes/list") {
        *reply = trace::kprobes_list_text();
        return 0;
    }
    if (path == "kprobes/enabled") {
        *reply = ukp_kprobes_enabled() ? "1\n" : "0\n";
        return 0;
    }
    if (path == "kprobes/optimization") {
        *reply = ukp_kprobes_optimization() ? "1\n" : "0\n";
        return 0;
    }
    if (path == kRefsCacheDirPath) {
        const std::string dir = platform::cache_dir();
        *reply = dir.empty() ? "" : dir + "\n";
        return 0;
    }
    const int rc = trace_read(path, reply);
    if (rc == -ENOENT) *reply = "no such file: " + path;
    return rc;
}

// "0"/"1" with optional surrounding white space, as the kernel's knobs take them.
int parse_flag(const std::string &text) {
    size_t a = text.find_first_not_of(" \t\n");
    size_t b = text.find_last_not_of(" \t\n");
    if (a == std::string::npos || a != b) return -1;
    return text[a] == '0' ? 0 : text[a] == '1' ? 1 : -1;
}

int32_t Server::handle_write(Connection &c, const std::string &path, const std::string &payload, bool append,
                             std::string *reply) {
    if (path == "kprobes/enabled" || path == "kprobes/optimization") {
        const int on = parse_flag(payload);
        if (on < 0) {
            *reply = path + ": write 0 or 1";
            return -EINVAL;
        }
        const bool enabled = path == "kprobes/enabled";
        int &saved = enabled ? c.saved_enabled : c.saved_optimization;
        const int before = enabled ? ukp_kprobes_enabled() : ukp_kprobes_optimization();
        const int rc = enabled ? ukp_set_kprobes_enabled(on) : ukp_set_kprobes_optimization(on);
        if (rc == 0 && saved < 0) saved = before;
        return rc;
    }
    if (path == "kprobes/list") {
        *reply = "kprobes/list is read-only";
        return -EACCES;
    }
    if (path == kRefsCacheDirPath) {
        // Where the agent keeps the reference tables of the objects it probes (refs_cache.cpp),
        // for a process that got no UKP_CACHE_DIR: the one `ukprobe attach` uses itself.
        std::string dir = payload;
        while (!dir.empty() && (dir.back() == '\n' || dir.back() == ' ')) dir.pop_back();
        if (!dir.empty() && dir[0] != '/') {
            *reply = path + ": an absolute path, or nothing";
            return -EINVAL;
        }
        platform::set_cache_dir(dir);
        return 0;
    }
    const bool defs = is_definitions_file(path);
    std::string before_text, after_text, old_filter;
    if (defs) trace_read("dynamic_events", &before_text);
    const bool filter = ends_with(path, "/filter");
    if (filter && trace_read(path, &old_filter) != 0) old_filter.clear();
    const int rc =
        append ? ukp_trace_append(path.c_str(), payload.c_str()) : ukp_trace_write(path.c_str(), payload.c_str());
    if (rc < 0) {
        *reply = last_error();
        return rc;
    }
    if (ends_with(path, "/trigger")) {
        const size_t a = payload.find_first_not_of(" \t\n"), b = payload.find_last_not_of(" \t\n");
        if (a != std::string::npos && payload[a] != '!') c.triggers.emplace_back(path, payload.substr(a, b - a + 1));
    }
    if (filter &&
        std::none_of(c.saved_filters.begin(), c.saved_filters.end(), [&](const auto &f) { return f.first == path; }))
        c.saved_filters.emplace_back(path, old_filter == "none\n" || old_filter.empty() ? "0" : old_filter);
    if (defs && trace_read("dynamic_events", &after_text) == 0) {
        // Which events this write created or removed: a definition without a name gets
        // one from the tracer, so compare the file before and after.
        const std::vector<std::string> before = event_names(before_text), after = event_names(after_text);
        std::vector<std::string> added, removed;
        std::set_difference(after.begin(), after.end(), before.begin(), before.end(), std::back_inserter(added));
        std::set_difference(before.begin(), before.end(), after.begin(), after.end(), std::back_inserter(removed));
        forget_events(removed);
        c.events.insert(c.events.end(), added.begin(), added.end());
    }
    return rc;
}

void Server::forget_events(const std::vector<std::string> &removed) {
    const auto gone = [&](const std::string &e) { return std::binary_search(removed.begin(), removed.end(), e); };
    for (Connection &c : conns_) std::erase_if(c.events, gone);
    std::erase_if(shared_.events, gone);
}

void Server::undo(Connection &c) {
    // Its triggers first: the tracer refuses to remove an event that has some (-EBUSY,
    // as the kernel), or a synthetic event a hist action fires.
    for (auto it = c.triggers.rbegin(); it != c.triggers.rend(); ++it)
        ukp_trace_append(it->first.c_str(), ("!" + it->second).c_str());
    c.triggers.clear();
    for (const auto &[path, text] : c.saved_filters) ukp_trace_write(path.c_str(), text.c_str());
    c.saved_filters.clear();
    for (auto it = c.events.rbegin(); it != c.events.rend(); ++it) {
        // The tracer refuses to remove an enabled event, as the kernel does.
        ukp_trace_write(("events/" + *it + "/enable").c_str(), "0");
        ukp_trace_append("dynamic_events", ("-:" + *it).c_str());
    }
    std::vector<std::string> gone = c.events;
    std::sort(gone.begin(), gone.end());
    c.events.clear();
    forget_events(gone);
    if (c.saved_enabled >= 0) ukp_set_kprobes_enabled(c.saved_enabled);
    if (c.saved_optimization >= 0) ukp_set_kprobes_optimization(c.saved_optimization);
    c.saved_enabled = c.saved_optimization = -1;
}

void Server::close_connection(size_t index) {
    if (conns_[index].session) undo(conns_[index]);
    // `ukprobe run` is gone while this process runs: its events would go on writing a
    // ring nobody reads, each hit at a probe's cost.
    if (conns_[index].supervised) ukp_trace_write("events/enable", "0");
    close(conns_[index].fd);
    conns_.erase(conns_.begin() + static_cast<std::ptrdiff_t>(index));
}

// The running server, on the heap and named by a global: a forked child (which has no
// control thread) still reaches its memory, so leak checkers in the child see no leak.
Server *g_server = nullptr;

// What start_locked() and the thread it starts tell each other.
struct Startup {
    pid_t caller = 0; // a thread of the program's table, waiting for `done`
    sem_t done;
    int result = 0; // 0 or -errno, set before `done` is posted
};

int listen_at(const sockaddr_un &addr);

// The thread's first steps, before it serves: its own table, its socket and wake pipe
// there, and the agent's memfds made so far in the program's table, taken over.
int open_thread_fds(const Startup &s, const sockaddr_un &addr) {
    g_own_table = text::use_own_fd_table() == 0 || platform::has_own_fd_table();
    const int fd = listen_at(addr);
    if (fd < 0) return fd;
    if (pipe2(g_wake_fd, O_CLOEXEC) != 0) {
        const int err = -errno;
        close(fd);
        unlink(g_socket_path);
        return err;
    }
    if (!g_own_table)
        for (int &w : g_wake_fd) w = platform::move_fd_high(w);
    g_listen_fd = fd;
    g_thread_tid = static_cast<pid_t>(gettid());
    if (g_own_table) trace::adopt_program_fds(s.caller);
    return 0;
}

sockaddr_un g_addr; // the socket's address, for the thread; under g_start_mu until it has read it

std::atomic<Startup *> g_restart{nullptr}; // a parked thread's restart: whom to tell
std::atomic<bool> g_parked{false};         // the thread waits for a restart (after a detach)
std::atomic<bool> g_exited{false};         // the thread returned (its pipe is closed)

// Serves until a detach (g_stopping, set by the server) or a wake (stop()).
void serve() {
    {
        const core::ForkQuiet busy(core::ForkGate::kControl);
        g_server = new Server(g_listen_fd);
    }
    g_server->run();
    {
        const core::ForkQuiet busy(core::ForkGate::kControl);
        delete g_server;
        g_server = nullptr;
    }
}

// After a detach, a thread with a table of its own waits instead of ending: its table
// holds the memfds of the buffers and counters, which nothing else could give a later
// controller (platform/held_fd.hpp). A byte 'r' (start_locked) makes it listen again, with
// the memfds made since on the program's threads adopted; anything else ends it.
// Whether it serves again.
bool park() {
    g_parked.store(true);
    for (;;) {
        char byte = 0;
        const ssize_t n = read(g_wake_fd[0], &byte, 1);
        if (n < 0 && errno == EINTR) continue;
        if (n != 1 || byte != 'r') break;
        Startup *s = g_restart.load();
        if (s == nullptr) continue;
        const int fd = listen_at(g_addr);
        s->result = fd < 0 ? fd : 0;
        if (fd >= 0) {
            g_listen_fd = fd;
            trace::adopt_program_fds(s->caller);
            g_stopping.store(false);
            g_parked.store(false);
        }
        sem_post(&s->done); // `s` is gone from here on
        if (fd >= 0) return true;
    }
    g_parked.store(false);
    return false;
}

void *thread_main(void *arg) {
    const core::AgentWork quiet; // the whole thread is the agent's
    {
        auto *s = static_cast<Startup *>(arg);
        s->result = open_thread_fds(*s, g_addr);
        const bool failed = s->result != 0;
        sem_post(&s->done); // `s` is gone from here on
        if (failed) return nullptr;
    }
    for (;;) {
        serve();
        const bool detached = g_stopping.load();
        if (!detached) unlink(g_socket_path);
        close(g_listen_fd);
        g_listen_fd = -1;
        if (!detached || !g_own_table || !park()) break;
    }
    g_stopping.store(true);
    // In its own table they would go with the thread; closed anyway.
    for (int &w : g_wake_fd) {
        close(w);
        w = -1;
    }
    g_exited.store(true);
    return nullptr;
}

// A byte into the thread's wake pipe, which is in the thread's own table, so through
// /proc/self/task/TID/fd/N: 's' ends it, 'r' makes a parked one serve again.
int wake(char byte) {
    if (!g_own_table) return write(g_wake_fd[1], &byte, 1) == 1 ? 0 : -errno;
    char path[64];
    snprintf(path, sizeof path, "/proc/self/task/%d/fd/%d", g_thread_tid, g_wake_fd[1]);
    const int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0) return -errno;
    const int rc = write(fd, &byte, 1) == 1 ? 0 : -errno;
    close(fd);
    return rc;
}

// The user's socket directory, made if missing, and refused unless it is a real
// directory of this user that nobody else can enter, where a socket can be made (not on
// a read-only file system: EROFS).
int open_socket_dir(const std::string &dir) {
    if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) return -errno;
    const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return errno == ELOOP || errno == ENOTDIR ? -ENOTDIR : -errno;
    struct stat st {};
    if (fstat(fd, &st) != 0 || st.st_uid != geteuid() || (st.st_mode & 077) != 0) {
        close(fd);
        return -EPERM;
    }
    if (faccessat(fd, ".", W_OK, AT_EACCESS) != 0) {
        const int err = -errno;
        close(fd);
        return err;
    }
    return fd;
}

// The socket directory this process can use: /tmp's, else /dev/shm's (protocol.hpp,
// socket_dir); *fallback says which. /tmp's error if neither can be.
int choose_socket_dir(bool *fallback) {
    int rc = 0;
    for (const bool f : {false, true}) {
        const int fd = open_socket_dir(socket_dir(geteuid(), f));
        if (fd >= 0) {
            close(fd);
            *fallback = f;
            return 0;
        }
        if (!f) rc = fd;
    }
    return rc;
}

// The inode of this process's pid namespace (protocol.hpp, socket_path). Without /proc
// to tell, the first namespace's.
uint64_t own_pid_ns() {
    struct stat st {};
    return stat("/proc/self/ns/pid", &st) == 0 ? st.st_ino : kInitialPidNs;
}

// Whether nothing listens on the socket `name` in `dir` any more.
bool nobody_listens(const std::string &dir, const char *name) {
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    const std::string path = dir + "/" + name;
    if (path.size() >= sizeof addr.sun_path) return false;
    memcpy(addr.sun_path, path.c_str(), path.size() + 1);
    const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return false;
    const bool refused =
        connect(fd, reinterpret_cast<const sockaddr *>(&addr), sizeof addr) != 0 && errno == ECONNREFUSED;
    close(fd);
    return refused;
}

// Sockets of processes that are gone (killed: they could not remove their own). Those
// named in this process's pid namespace (`pid_ns`) when their process is gone; those of
// another, where a process number means nothing here, when nothing listens on them.
void remove_stale_sockets(const std::string &dir, uint64_t pid_ns) {
    DIR *d = opendir(dir.c_str());
    if (d == nullptr) return;
    while (dirent *e = readdir(d)) {
        char *end = nullptr;
        const long pid = strtol(e->d_name, &end, 10);
        if (pid <= 0 || end == nullptr) continue;
        uint64_t ns = kInitialPidNs;
        if (*end == '.' && end[1] >= '0' && end[1] <= '9') ns = strtoull(end + 1, &end, 10);
        if (strcmp(end, ".sock") != 0) continue;
        const bool gone =
            ns == pid_ns ? kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH : nobody_listens(dir, e->d_name);
        if (gone) unlinkat(dirfd(d), e->d_name, 0);
    }
    closedir(d);
}

// A forked child has no control thread: forget the parent's, and close its descriptors
// if the program's table held them (the child's table is a copy of it).
void forget_in_child() {
    if (!g_own_table) {
        if (g_listen_fd >= 0) close(g_listen_fd);
        for (int fd : g_wake_fd)
            if (fd >= 0) close(fd);
    }
    g_wake_fd[0] = g_wake_fd[1] = -1;
    g_own_table = false;
    g_parked.store(false);
    g_exited.store(false);
    g_restart.store(nullptr);
    g_listen_fd = -1;
    g_thread_valid = false;
    g_stopping.store(false);
    g_socket_path[0] = 0;
    // A thread of the parent may have been starting or stopping the server at the fork.
    new (&g_start_mu) std::mutex;
}

// A socket listening at `addr`, or -errno.
int listen_at(const sockaddr_un &addr) {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -errno;
    if (!g_own_table) fd = platform::move_fd_high(fd);
    unlink(g_socket_path); // a stale socket of an earlier process with this pid
    if (bind(fd, reinterpret_cast<const sockaddr *>(&addr), sizeof addr) != 0 || listen(fd, 8) != 0) {
        const int err = -errno;
        close(fd);
        return err;
    }
    return fd;
}

// A thread that detached and parks (or is about to) serves again; -ECHILD if it ended.
int restart_locked() {
    if (!g_own_table || g_exited.load()) return -ECHILD;
    Startup s;
    s.caller = static_cast<pid_t>(platform::has_own_fd_table() ? getpid() : gettid());
    sem_init(&s.done, 0, 0);
    g_restart.store(&s);
    int rc = wake('r');
    if (rc == 0) {
        while (sem_wait(&s.done) != 0 && errno == EINTR) {
        }
        rc = s.result;
    }
    g_restart.store(nullptr);
    sem_destroy(&s.done);
    if (rc == 0) trace::close_adopted_program_fds();
    return rc;
}

int start_locked() {
    if (g_thread_valid) {
        if (!g_stopping.load()) return 0;
        if (const int rc = restart_locked(); rc != -ECHILD) return rc;
        pthread_join(g_thread, nullptr);
        platform::release_agent_thread(g_thread);
        g_thread_valid = false;
    }
    g_exited.store(false);
    g_parked.store(false);
    g_stopping.store(false);
    bool fallback = false;
    if (const int rc = choose_socket_dir(&fallback); rc != 0) return rc;
    const uint64_t pid_ns = own_pid_ns();
    remove_stale_sockets(socket_dir(geteuid(), fallback), pid_ns);
    const std::string path = socket_path(geteuid(), getpid(), pid_ns, fallback);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    if (path.size() >= sizeof addr.sun_path) return -ENAMETOOLONG;
    memcpy(addr.sun_path, path.c_str(), path.size() + 1);
    memcpy(g_socket_path, path.c_str(), path.size() + 1);
    g_addr = addr;
    g_owner = getpid();
    core::hook_fork(); // before the thread: a fork() must wait for its work
    Startup startup;
    // A thread of the program's table, whose memfds the new thread adopts: this one, or
    // (for a loader run on the optimizer's thread, which has a table of its own) the
    // main thread.
    startup.caller = static_cast<pid_t>(platform::has_own_fd_table() ? getpid() : gettid());
    sem_init(&startup.done, 0, 0);
    // The thread starts with every asynchronous signal blocked, so it never takes one
    // meant for the program (the fault-safe reads of ukp_verify need the faults).
    int rc = 0;
    {
        const platform::AsyncSignalsBlocked blocked;
        rc = platform::start_agent_thread(&g_thread, thread_main, &startup);
    }
    if (rc != 0) {
        sem_destroy(&startup.done);
        return rc;
    }
    while (sem_wait(&startup.done) != 0 && errno == EINTR) {
    }
    sem_destroy(&startup.done);
    if (startup.result != 0) {
        pthread_join(g_thread, nullptr);
        platform::release_agent_thread(g_thread);
        return startup.result;
    }
    // The thread holds the memfds in its own table now: the program's copies go.
    if (g_own_table) trace::close_adopted_program_fds();
    pthread_setname_np(g_thread, "ukp-control");
    static bool atfork_registered = false;
    if (!atfork_registered) atfork_registered = pthread_atfork(nullptr, nullptr, forget_in_child) == 0;
    g_thread_valid = true;
    return 0;
}

} // namespace

int start() {
    const core::AgentWork quiet;
    std::lock_guard lock(g_start_mu);
    return start_locked();
}

int stop() {
    std::lock_guard lock(g_start_mu);
    if (!g_thread_valid) return 0;
    // A thread that detached parks (with a table of its own) and ends at this byte; one
    // that ended already needs none (its pipe is closed).
    if (!g_exited.load())
        if (const int err = wake('s'); err != 0 && !g_exited.load()) return err;
    pthread_join(g_thread, nullptr);
    platform::release_agent_thread(g_thread);
    g_thread_valid = false;
    return 0;
}

namespace {
// The socket goes with the process (a controller then reads "no agent", not a refusal).
__attribute__((destructor)) void remove_socket_at_exit() {
    const core::AgentWork quiet; // its getpid and unlink are the agent's, not the program's
    if (g_listen_fd >= 0 && g_socket_path[0] != 0 && g_owner == getpid()) unlink(g_socket_path);
}

// UKP_CONTROL=1 in the environment starts the thread when the agent is loaded.
__attribute__((constructor)) void start_from_environment() {
    const core::AgentWork quiet; // its getenv may run after UKP_EVENTS armed an event on it
    const char *v = getenv("UKP_CONTROL");
    if (v != nullptr && strcmp(v, "1") == 0) {
        if (!trace::apply_environment()) return; // the buffers it makes are the thread's to hold
        if (const int rc = start(); rc != 0)
            fprintf(stderr, "ukprobes: control socket not started: %s\n", strerror(-rc));
        else
            trace::notify_supervisor(trace::kNoticeControlReady); // `ukprobe run` connects now, before main
    }
}
} // namespace

} // namespace ukp::control

extern "C" int ukp_control_start(void) {
    ukp::platform::note_loader_thread(); // `ukprobe attach`'s loader thread: its stack comes back once it ends
    return ukp::control::start();
}

// For `ukprobe attach` when the agent is already loaded: the stack its loader thread runs
// on (platform/agent_threads.hpp), out[0] its lowest address, out[1] its size. 0 or
// -errno. Called by the injector on a stopped thread of the program.
extern "C" int ukp_loader_stack(uint64_t *out) { return ukp::platform::take_loader_stack(&out[0], &out[1]); }
// For `ukprobe attach` when the agent is already loaded: from on = 1 to on = 0, the hits of
// the calling thread (one of the program's, stopped by the injector for the calls that
// start the loader thread) are the agent's work, not traced as the program's. 0.
extern "C" int ukp_loader_quiet(int on) {
    if (on != 0)
        ukp::core::begin_agent_work();
    else
        ukp::core::end_agent_work();
    return 0;
}
extern "C" int ukp_control_stop(void) { return ukp::control::stop(); }
