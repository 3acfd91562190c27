// `ukprobe mount -p PID DIR`: the agent's tracefs and debugfs files as a FUSE file system
// (libfuse3's low-level API, served by its multithreaded loop). Every file operation
// becomes a request on the control socket: reads are Op::kRead, writes Op::kWrite or
// Op::kAppend, and the tree under events/ is what available_events lists. trace and
// trace_pipe are read from the ring and printed here (reader.hpp). docs/cli.md,
// "mount", describes the behaviour for people.
#include "mount.hpp"

#include "client.hpp"
#include "reader.hpp"

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>

#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <map>
#include <memory>
#include <mutex>
#include <poll.h>
#include <pthread.h>
#include <set>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <thread>
#include <unistd.h>
#include <utility>
#include <vector>

namespace ukprobe {

namespace {

using ukp::control::Op;

// How long the kernel may cache names and attributes of the fixed tree. Names under
// events/ come and go with definitions made from anywhere: never cached (0).
constexpr double kFixedTimeout = 10.0;

struct FileSpec {
    const char *name;
    bool writable;
};

// The files the agent serves, by directory (src/trace/events.cpp, src/control/control.cpp).
constexpr FileSpec kRootFiles[] = {
    {"available_events", false}, {"available_tracepoints", false},
    {"buffer_size_kb", true},    {"dynamic_events", true},
    {"error_log", true},         {"kprobe_events", true},
    {"kprobe_profile", false},   {"snapshot", true},
    {"synthetic_events", true},  {"trace", true},
    {"trace_pipe", false},       {"tracing_on", true},
};
constexpr FileSpec kKprobesFiles[] = {{"enabled", true}, {"list", false}, {"optimization", true}};
constexpr FileSpec kEventFiles[] = {{"enable", true}, {"filter", true}, {"format", false},
                                    {"hist", false},  {"id", false},    {"trigger", true}};

const FileSpec *find_spec(std::span<const FileSpec> files, std::string_view name) {
    for (const FileSpec &f : files)
        if (name == f.name) return &f;
    return nullptr;
}

// Files whose open with O_TRUNC empties them, as in the kernel: the definitions files
// lose every event (-EBUSY while one is enabled), trace and error_log are cleared.
bool is_definitions(const std::string &path) { return path == "kprobe_events" || path == "dynamic_events"; }
bool clears_on_truncate(const std::string &path) {
    return is_definitions(path) || path == "trace" || path == "error_log";
}
// Files whose writes the kernel ignores: only the O_TRUNC at open does something.
bool ignores_writes(const std::string &path) { return path == "trace" || path == "error_log"; }

std::vector<std::string> split(const std::string &path) {
    std::vector<std::string> parts;
    size_t start = 0;
    while (start < path.size()) {
        size_t slash = path.find('/', start);
        if (slash == std::string::npos) slash = path.size();
        parts.push_back(path.substr(start, slash - start));
        start = slash + 1;
    }
    return parts;
}

// What a path is.
struct Node {
    bool dir = false;
    bool writable = false; // a file the agent takes writes to
    bool fixed = true;     // there whatever is defined (not under events/GRP)
};

// What the agent answered: status 0 and its text, or a negative errno.
struct Answer {
    int status = 0;
    std::string text;
};

// Connections to one agent, one per request in flight. trace and trace_pipe are printed
// here from the agent's ring (reader.hpp). The agent serves one request at a
// time, and an agent that formats trace_pipe itself (an older one) holds its thread up
// to 100 ms while no record comes: a trace_pipe reader here therefore waits (ask_pipe)
// while other operations are under way and for kPipeGrace after the last, so that the
// several requests of one `cat` or `ls` wait at most for the pipe read already running,
// not for one each.
class Agent {
public:
    static constexpr auto kPipeGrace = std::chrono::milliseconds(50);
    static constexpr auto kPipeRecheck = std::chrono::milliseconds(20); // interrupt checks while held back

    explicit Agent(int pid) : pid_(pid) {}

    // -ENODEV when the agent cannot be reached (the process detached it or exited).
    Answer ask(Op op, const std::string &path, const std::string &payload = {}) {
        return counted([&] {
            return with_client([&](Client &c) {
                Reply r = c.request(op, path, payload);
                if (r.fd >= 0) close(r.fd);
                return Answer{r.status < 0 ? r.status : 0, std::move(r.payload)};
            });
        });
    }

    // The trace file, printed here from the agent's ring (reader.hpp).
    Answer trace_text() {
        return counted([&] {
            return with_client([&](Client &c) { return Answer{0, TraceReader(c, pid_, false).trace()}; });
        });
    }

    // The snapshot file, likewise from the snapshot buffers.
    Answer snapshot_text() {
        return counted([&] {
            return with_client([&](Client &c) { return Answer{0, TraceReader(c, pid_, false).snapshot()}; });
        });
    }

    // A trace_pipe read by `reader` (on a connection of its own). One the agent formats
    // holds its thread: it waits until no other operation is under way. -EINTR when
    // `interrupted` says so while it waits for its turn.
    // Asked before the first read too: a reader that had not mapped the ring yet waited
    // at the gate, and a `cat trace` every 50 ms (a script waiting for the ring to empty)
    // kept it there for good.
    template <typename Interrupted>
    Answer ask_pipe(TraceReader &reader, Interrupted interrupted) {
        try {
            if (!reader.will_format_locally()) {
                std::unique_lock lock(gate_mu_);
                while (active_ > 0 || std::chrono::steady_clock::now() - last_done_ < kPipeGrace) {
                    if (interrupted()) return {-EINTR, {}};
                    gate_cv_.wait_for(lock, kPipeRecheck);
                }
            }
            return {0, reader.pipe(kPipeWaitMs, 1 << 20)};
        } catch (const std::runtime_error &) {
            // The process is gone: what its ring held last first (the mapping outlives it).
            std::string left = reader.pipe_left(1 << 20);
            if (!left.empty()) return {0, std::move(left)};
            return {-ENODEV, {}};
        }
    }

    int pid() const { return pid_; }

private:
    static constexpr int kPipeWaitMs = 100; // a trace_pipe read waits this long for a record

    // fn's answer, counted as an operation under way (ask_pipe waits for them).
    template <typename Fn>
    Answer counted(Fn fn) {
        {
            std::lock_guard lock(gate_mu_);
            ++active_;
        }
        Answer a = fn();
        {
            std::lock_guard lock(gate_mu_);
            --active_;
            last_done_ = std::chrono::steady_clock::now();
        }
        gate_cv_.notify_all();
        return a;
    }

    // fn(client) over a pooled connection; -ENODEV when none works.
    template <typename Fn>
    Answer with_client(Fn fn) {
        for (int attempt = 0; attempt < 2; ++attempt) {
            bool reused = false;
            std::unique_ptr<Client> c = take(&reused);
            if (c == nullptr) break;
            try {
                Answer a = fn(*c);
                give_back(std::move(c));
                return a;
            } catch (const std::runtime_error &) {
                // A pooled connection the agent has closed since (a detach, then an attach):
                // once more over a new one. A new one that breaks means the agent is gone.
                if (!reused) break;
            }
        }
        return {-ENODEV, {}};
    }

    std::unique_ptr<Client> take(bool *reused) {
        {
            std::lock_guard lock(mu_);
            if (!idle_.empty()) {
                std::unique_ptr<Client> c = std::move(idle_.back());
                idle_.pop_back();
                *reused = true;
                return c;
            }
        }
        auto c = std::make_unique<Client>();
        std::string why;
        if (c->connect(pid_, &why) != 0) return nullptr;
        return c;
    }
    void give_back(std::unique_ptr<Client> c) {
        std::lock_guard lock(mu_);
        idle_.push_back(std::move(c));
    }

    int pid_;
    std::mutex mu_;
    std::vector<std::unique_ptr<Client>> idle_;
    std::mutex gate_mu_;
    std::condition_variable gate_cv_;
    int active_ = 0;                                  // ask() calls under way
    std::chrono::steady_clock::time_point last_done_; // when the last of them ended
};

// An open file.
struct Handle {
    std::string path;
    int flags = 0;     // open(2)'s
    bool pipe = false; // trace_pipe: streamed, not a snapshot
    std::mutex mu;     // reads of one open file come one at a time
    // trace_pipe: its reader of the ring, on a connection of its own (made at the first read).
    std::unique_ptr<Client> client;
    std::unique_ptr<TraceReader> reader;
    bool loaded = false;
    std::string text; // the snapshot taken at the first read; for trace_pipe what the last read left
};

struct DirEntry {
    std::string name;
    fuse_ino_t ino;
    mode_t mode;
};

// An open directory: its entries as they were at opendir.
struct DirHandle {
    std::vector<DirEntry> entries;
};

class TraceFs {
public:
    explicit TraceFs(int pid) : agent(pid), uid_(getuid()), gid_(getgid()) {
        clock_gettime(CLOCK_REALTIME, &mounted_at_);
        paths_.push_back(""); // FUSE_ROOT_ID
        inos_[""] = FUSE_ROOT_ID;
    }

    Agent agent;

    // trace_pipe files open and not yet at their end, and whether the process is gone
    // (ProcessWatch): the file system stays until those readers have had what the ring
    // held last.
    std::atomic<int> pipes_open{0};
    std::atomic<bool> process_gone{false};

    // Inode numbers: one per path ever looked up, never reused (the tree is small).
    fuse_ino_t ino_of(const std::string &path) {
        std::lock_guard lock(ino_mu_);
        auto [it, added] = inos_.try_emplace(path, paths_.size() + 1);
        if (added) paths_.push_back(path);
        return it->second;
    }
    bool path_of(fuse_ino_t ino, std::string *path) {
        std::lock_guard lock(ino_mu_);
        if (ino == 0 || ino > paths_.size()) return false;
        *path = paths_[ino - 1];
        return true;
    }

    // The events defined now, as "GRP" -> {"EVENT", ...}.
    int events(std::map<std::string, std::set<std::string>> *out) {
        const Answer a = agent.ask(Op::kRead, "available_events");
        if (a.status < 0) return a.status;
        for (const std::string &line : split_lines(a.text)) {
            const size_t colon = line.find(':');
            if (colon == std::string::npos) continue;
            (*out)[line.substr(0, colon)].insert(line.substr(colon + 1));
        }
        return 0;
    }

    // 0 and what `path` is, or -ENOENT (or the agent's error).
    int classify(const std::string &path, Node *n) {
        const std::vector<std::string> p = split(path);
        *n = Node{};
        if (p.empty()) {
            n->dir = true;
            return 0;
        }
        if (p.size() == 1 && find_spec(kRootFiles, p[0]) != nullptr) {
            n->writable = find_spec(kRootFiles, p[0])->writable;
            return 0;
        }
        if (p[0] == "kprobes") {
            if (p.size() == 1)
                n->dir = true;
            else if (p.size() == 2 && find_spec(kKprobesFiles, p[1]) != nullptr)
                n->writable = find_spec(kKprobesFiles, p[1])->writable;
            else
                return -ENOENT;
            return 0;
        }
        if (p[0] != "events" || p.size() > 4) return -ENOENT;
        if (p.size() == 1) {
            n->dir = true;
            return 0;
        }
        if (p.size() == 2 && p[1] == "enable") {
            n->writable = true;
            return 0;
        }
        std::map<std::string, std::set<std::string>> defined;
        if (int r = events(&defined); r != 0) return r;
        n->fixed = false;
        const auto group = defined.find(p[1]);
        if (group == defined.end()) return -ENOENT;
        if (p.size() == 2) {
            n->dir = true;
            return 0;
        }
        if (p.size() == 3 && p[2] == "enable") {
            n->writable = true;
            return 0;
        }
        if (group->second.count(p[2]) == 0) return -ENOENT;
        if (p.size() == 3) {
            n->dir = true;
            return 0;
        }
        const FileSpec *f = find_spec(kEventFiles, p[3]);
        if (f == nullptr) return -ENOENT;
        n->writable = f->writable;
        return 0;
    }

    // The entries of directory `path`, "." and ".." first.
    int list(const std::string &path, fuse_ino_t self, std::vector<DirEntry> *out) {
        std::string parent_path = path.substr(0, path.rfind('/') == std::string::npos ? 0 : path.rfind('/'));
        out->push_back({".", self, S_IFDIR});
        out->push_back({"..", self == FUSE_ROOT_ID ? FUSE_ROOT_ID : ino_of(parent_path), S_IFDIR});
        const auto add = [&](const std::string &name, bool dir) {
            out->push_back({name, ino_of(path.empty() ? name : path + "/" + name), mode_t(dir ? S_IFDIR : S_IFREG)});
        };
        const auto add_files = [&](std::span<const FileSpec> files) {
            for (const FileSpec &f : files) add(f.name, false);
        };
        const std::vector<std::string> p = split(path);
        if (p.empty()) {
            add_files(kRootFiles);
            add("events", true);
            add("kprobes", true);
            return 0;
        }
        if (p[0] == "kprobes") {
            add_files(kKprobesFiles);
            return 0;
        }
        if (p.size() == 3) {
            add_files(kEventFiles);
            return 0;
        }
        std::map<std::string, std::set<std::string>> defined;
        if (int r = events(&defined); r != 0) return r;
        add("enable", false);
        if (p.size() == 1) {
            for (const auto &[group, names] : defined) add(group, true);
            return 0;
        }
        const auto group = defined.find(p[1]);
        if (group == defined.end()) return -ENOENT;
        for (const std::string &name : group->second) add(name, true);
        return 0;
    }

    void fill_attr(fuse_ino_t ino, const Node &n, struct stat *st) const {
        *st = {};
        st->st_ino = ino;
        // tracefs's classic modes; size 0 as tracefs reports: readers read to EOF.
        st->st_mode = n.dir ? S_IFDIR | 0755 : S_IFREG | (n.writable ? 0644 : 0444);
        st->st_nlink = n.dir ? 2 : 1;
        st->st_uid = uid_;
        st->st_gid = gid_;
        st->st_blksize = 4096;
        st->st_atim = st->st_mtim = st->st_ctim = mounted_at_;
    }

private:
    static std::vector<std::string> split_lines(const std::string &text) {
        std::vector<std::string> lines;
        size_t start = 0;
        while (start < text.size()) {
            size_t nl = text.find('\n', start);
            if (nl == std::string::npos) nl = text.size();
            if (nl > start) lines.push_back(text.substr(start, nl - start));
            start = nl + 1;
        }
        return lines;
    }

    std::mutex ino_mu_;
    std::map<std::string, fuse_ino_t> inos_;
    std::vector<std::string> paths_; // paths_[ino - 1]
    uid_t uid_;
    gid_t gid_;
    timespec mounted_at_{};
};

TraceFs &fs_of(fuse_req_t req) { return *static_cast<TraceFs *>(fuse_req_userdata(req)); }
Handle &handle_of(fuse_file_info *fi) { return *reinterpret_cast<Handle *>(fi->fh); }

// --- the operations ---------------------------------------------------------------------

void op_init(void *, fuse_conn_info *conn) {
    // open(O_TRUNC) arrives as such (it clears kprobe_events, trace, error_log), not as a
    // truncate before the open.
    if (conn->capable & FUSE_CAP_ATOMIC_O_TRUNC) conn->want |= FUSE_CAP_ATOMIC_O_TRUNC;
}

void op_lookup(fuse_req_t req, fuse_ino_t parent, const char *name) {
    TraceFs &fs = fs_of(req);
    std::string dir;
    if (!fs.path_of(parent, &dir)) {
        fuse_reply_err(req, ENOENT);
        return;
    }
    const std::string path = dir.empty() ? std::string(name) : dir + "/" + name;
    Node n;
    if (const int r = fs.classify(path, &n); r != 0) {
        fuse_reply_err(req, -r);
        return;
    }
    fuse_entry_param e{};
    e.ino = fs.ino_of(path);
    fs.fill_attr(e.ino, n, &e.attr);
    e.attr_timeout = e.entry_timeout = n.fixed ? kFixedTimeout : 0;
    fuse_reply_entry(req, &e);
}

void op_getattr(fuse_req_t req, fuse_ino_t ino, fuse_file_info *) {
    TraceFs &fs = fs_of(req);
    std::string path;
    Node n;
    if (!fs.path_of(ino, &path)) {
        fuse_reply_err(req, ENOENT);
        return;
    }
    if (const int r = fs.classify(path, &n); r != 0) {
        fuse_reply_err(req, -r);
        return;
    }
    struct stat st;
    fs.fill_attr(ino, n, &st);
    fuse_reply_attr(req, &st, n.fixed ? kFixedTimeout : 0);
}

// Sizes and times are accepted and change nothing (a truncate(1) of a tracefs file does
// nothing either); owners and modes are refused.
void op_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *, int to_set, fuse_file_info *fi) {
    if (to_set & (FUSE_SET_ATTR_MODE | FUSE_SET_ATTR_UID | FUSE_SET_ATTR_GID)) {
        fuse_reply_err(req, EPERM);
        return;
    }
    op_getattr(req, ino, fi);
}

void op_open(fuse_req_t req, fuse_ino_t ino, fuse_file_info *fi) {
    TraceFs &fs = fs_of(req);
    std::string path;
    Node n;
    if (!fs.path_of(ino, &path)) {
        fuse_reply_err(req, ENOENT);
        return;
    }
    if (const int r = fs.classify(path, &n); r != 0) {
        fuse_reply_err(req, -r);
        return;
    }
    if (n.dir) {
        fuse_reply_err(req, EISDIR);
        return;
    }
    const bool writes = (fi->flags & O_ACCMODE) != O_RDONLY;
    if (writes && (fi->flags & O_TRUNC) && clears_on_truncate(path)) {
        // The kernel empties these at open: `echo X > kprobe_events` is "remove all, add X",
        // and fails at open with EBUSY while an event is enabled.
        const Answer a = fs.agent.ask(Op::kWrite, path, "");
        if (a.status < 0) {
            fuse_reply_err(req, -a.status);
            return;
        }
    }
    auto h = std::make_unique<Handle>();
    h->path = path;
    h->flags = fi->flags;
    h->pipe = path == "trace_pipe";
    fi->direct_io = 1; // size 0, as tracefs: the page cache would show nothing
    fi->nonseekable = h->pipe;
    fi->fh = reinterpret_cast<uint64_t>(h.get());
    // On a failed reply (the opener was interrupted) no release follows.
    if (h->pipe) ++fs.pipes_open;
    if (fuse_reply_open(req, fi) == 0)
        h.release();
    else if (h->pipe)
        --fs.pipes_open;
}

void op_release(fuse_req_t req, fuse_ino_t, fuse_file_info *fi) {
    Handle *h = &handle_of(fi);
    {
        std::lock_guard lock(h->mu);
        if (h->pipe) --fs_of(req).pipes_open;
    }
    delete h;
    fuse_reply_err(req, 0);
}

// trace_pipe: each read waits for records (up to 100 ms per attempt; between attempts an
// interrupt, Ctrl-C of the reader, ends the wait) and returns what came. Each open file
// consumes for itself, as the kernel's: two readers share the records between them.
void read_pipe(fuse_req_t req, TraceFs &fs, Handle &h, size_t size) {
    while (h.text.empty()) {
        if (fuse_req_interrupted(req)) {
            fuse_reply_err(req, EINTR);
            return;
        }
        if (h.reader == nullptr) {
            auto c = std::make_unique<Client>();
            std::string why;
            if (c->connect(fs.agent.pid(), &why) != 0) {
                fuse_reply_err(req, ENODEV);
                return;
            }
            h.client = std::move(c);
            h.reader = std::make_unique<TraceReader>(*h.client, fs.agent.pid(), true);
        }
        Answer a = fs.agent.ask_pipe(*h.reader, [req] { return fuse_req_interrupted(req) != 0; });
        if (a.status == -ENODEV && fs.process_gone.load()) {
            // The process is gone and what its ring held has been read: the end of the file.
            // The reader stays counted until it closes the file (op_release): the file
            // system unmounts once none is open, and a reader whose end of file was sent
            // but whose read had not returned yet (the kernel may still have a request of
            // it in flight) got ECONNABORTED instead.
            fuse_reply_buf(req, nullptr, 0);
            return;
        }
        if (a.status < 0) {
            fuse_reply_err(req, -a.status);
            return;
        }
        h.text = std::move(a.text);
        if (h.text.empty() && (h.flags & O_NONBLOCK)) {
            fuse_reply_err(req, EAGAIN);
            return;
        }
    }
    const size_t n = std::min(size, h.text.size());
    // What the reader did not take (or could not: it was interrupted) stays for its next read.
    if (fuse_reply_buf(req, h.text.data(), n) == 0) h.text.erase(0, n);
}

void op_read(fuse_req_t req, fuse_ino_t, size_t size, off_t off, fuse_file_info *fi) {
    TraceFs &fs = fs_of(req);
    Handle &h = handle_of(fi);
    std::lock_guard lock(h.mu);
    if (h.pipe) {
        read_pipe(req, fs, h, size);
        return;
    }
    if (!h.loaded) {
        // The whole file at the first read; later reads take their offsets from it.
        Answer a = h.path == "trace"      ? fs.agent.trace_text()
                   : h.path == "snapshot" ? fs.agent.snapshot_text()
                                          : fs.agent.ask(Op::kRead, h.path);
        if (a.status < 0) {
            fuse_reply_err(req, -a.status);
            return;
        }
        h.text = std::move(a.text);
        h.loaded = true;
    }
    if (off < 0 || static_cast<size_t>(off) >= h.text.size()) {
        fuse_reply_buf(req, nullptr, 0);
        return;
    }
    fuse_reply_buf(req, h.text.data() + off, std::min(size, h.text.size() - static_cast<size_t>(off)));
}

// Each write goes to the agent as it comes, so that a refused one fails with the agent's
// errno (`echo bad >> kprobe_events`: "write error: Invalid argument").
void op_write(fuse_req_t req, fuse_ino_t, const char *buf, size_t size, off_t, fuse_file_info *fi) {
    TraceFs &fs = fs_of(req);
    Handle &h = handle_of(fi);
    if (ignores_writes(h.path)) {
        fuse_reply_write(req, size);
        return;
    }
    // `>` replaces, `>>` appends; the definitions files were emptied at an O_TRUNC open
    // and take every write as lines added.
    const Op op = (h.flags & O_TRUNC) && !is_definitions(h.path) ? Op::kWrite : Op::kAppend;
    const Answer a = fs.agent.ask(op, h.path, std::string(buf, size));
    if (a.status < 0)
        fuse_reply_err(req, -a.status);
    else
        fuse_reply_write(req, size);
}

void op_opendir(fuse_req_t req, fuse_ino_t ino, fuse_file_info *fi) {
    TraceFs &fs = fs_of(req);
    std::string path;
    Node n;
    if (!fs.path_of(ino, &path)) {
        fuse_reply_err(req, ENOENT);
        return;
    }
    if (const int r = fs.classify(path, &n); r != 0) {
        fuse_reply_err(req, -r);
        return;
    }
    if (!n.dir) {
        fuse_reply_err(req, ENOTDIR);
        return;
    }
    auto d = std::make_unique<DirHandle>();
    if (const int r = fs.list(path, ino, &d->entries); r != 0) {
        fuse_reply_err(req, -r);
        return;
    }
    fi->fh = reinterpret_cast<uint64_t>(d.get());
    if (fuse_reply_open(req, fi) == 0) d.release();
}

void op_readdir(fuse_req_t req, fuse_ino_t, size_t size, off_t off, fuse_file_info *fi) {
    const DirHandle &d = *reinterpret_cast<DirHandle *>(fi->fh);
    std::vector<char> buf(size);
    size_t used = 0;
    for (size_t i = static_cast<size_t>(std::max<off_t>(off, 0)); i < d.entries.size(); ++i) {
        struct stat st {};
        st.st_ino = d.entries[i].ino;
        st.st_mode = d.entries[i].mode;
        // The offset given with an entry is where the next readdir goes on.
        const size_t n = fuse_add_direntry(req, buf.data() + used, size - used, d.entries[i].name.c_str(), &st,
                                           static_cast<off_t>(i + 1));
        if (n > size - used) break;
        used += n;
    }
    fuse_reply_buf(req, buf.data(), used);
}

void op_releasedir(fuse_req_t req, fuse_ino_t, fuse_file_info *fi) {
    delete reinterpret_cast<DirHandle *>(fi->fh);
    fuse_reply_err(req, 0);
}

fuse_lowlevel_ops make_ops() {
    fuse_lowlevel_ops ops{};
    ops.init = op_init;
    ops.lookup = op_lookup;
    ops.getattr = op_getattr;
    ops.setattr = op_setattr;
    ops.open = op_open;
    ops.read = op_read;
    ops.write = op_write;
    ops.release = op_release;
    ops.opendir = op_opendir;
    ops.readdir = op_readdir;
    ops.releasedir = op_releasedir;
    return ops;
}

// Ends the FUSE loop when the traced process exits: the file system unmounts itself once
// the trace_pipe readers have read what the ring held last (at most kDrainLimit later).
class ProcessWatch {
public:
    ProcessWatch(int pidfd, TraceFs &fs) : pidfd_(pidfd), fs_(fs) {
        if (pipe2(wake_, O_CLOEXEC) != 0) throw std::runtime_error(fmt::format("pipe: {}", strerror(errno)));
        // Signals stay with the main thread, whose wait in the FUSE loop they end.
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        thread_ = std::thread([this] { run(); });
        pthread_sigmask(SIG_SETMASK, &old, nullptr);
    }
    ~ProcessWatch() {
        const char byte = 1;
        if (write(wake_[1], &byte, 1) != 1)
            thread_.detach();
        else
            thread_.join();
        close(wake_[0]);
        close(wake_[1]);
    }
    bool exited() const { return exited_.load(); }

private:
    void run() {
        pollfd fds[2] = {{pidfd_, POLLIN, 0}, {wake_[0], POLLIN, 0}};
        while (poll(fds, 2, -1) < 0 && errno == EINTR) {
        }
        if (fds[0].revents == 0) return;
        exited_.store(true);
        fs_.process_gone.store(true);
        const auto until = std::chrono::steady_clock::now() + kDrainLimit;
        while (fs_.pipes_open.load() > 0 && std::chrono::steady_clock::now() < until) {
            pollfd wake{wake_[0], POLLIN, 0};
            if (poll(&wake, 1, 20) > 0) return; // the loop ended meanwhile
        }
        // fuse_set_signal_handlers' handler ends the loop (the workers block signals).
        kill(getpid(), SIGTERM);
    }

    static constexpr auto kDrainLimit = std::chrono::seconds(5);
    int pidfd_;
    TraceFs &fs_;
    int wake_[2] = {-1, -1};
    std::atomic<bool> exited_{false};
    std::thread thread_;
};

} // namespace

CLI::App *add_mount_command(CLI::App &app, MountOptions &o) {
    CLI::App *m = app.add_subcommand("mount", "serve the process's tracing files as a tracefs-shaped file system "
                                              "at DIR (FUSE)");
    m->add_option("DIR", o.dir, "the mount point, an existing directory")->required();
    m->add_flag("-f,--foreground", o.foreground,
                "serve in the foreground until unmounted (default: return once "
                "mounted, the server in the background)");
    m->add_option("-o", o.fuse_options, "a FUSE mount option (allow_other, debug, ...); may repeat")
        ->allow_extra_args(false);
    m->fallthrough();
    return m;
}

int cmd_mount(int pid, const MountOptions &o) {
    if (pid <= 0) throw std::runtime_error("which process? give -p PID");
    char dir[PATH_MAX];
    if (realpath(o.dir.c_str(), dir) == nullptr)
        throw std::runtime_error(fmt::format("mount point {}: {}", o.dir, strerror(errno)));
    struct stat st {};
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        throw std::runtime_error(fmt::format("mount point {} is not a directory", o.dir));
    {
        // The agent must answer before anything is mounted.
        Client c;
        std::string why;
        if (c.connect(pid, &why) != 0) throw std::runtime_error(why);
        const Reply r = c.request(Op::kPing);
        if (r.status < 0) throw std::runtime_error(fmt::format("ping process {}: {}", pid, strerror(-r.status)));
    }
    const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
    if (pidfd < 0) throw std::runtime_error(fmt::format("pidfd_open({}): {}", pid, strerror(errno)));

    TraceFs fs(pid);
    std::vector<std::string> args = {"ukprobe", "-o",
                                     fmt::format("fsname=ukprobes-{},subtype=ukprobes,default_permissions", pid)};
    for (const std::string &opt : o.fuse_options) {
        args.push_back("-o");
        args.push_back(opt);
    }
    std::vector<char *> argv;
    for (std::string &a : args) argv.push_back(a.data());
    fuse_args fargs = FUSE_ARGS_INIT(static_cast<int>(argv.size()), argv.data());
    const fuse_lowlevel_ops ops = make_ops();
    fuse_session *se = fuse_session_new(&fargs, &ops, sizeof ops, &fs);
    fuse_opt_free_args(&fargs);
    if (se == nullptr) {
        close(pidfd);
        throw std::runtime_error("FUSE refused the options (see above)");
    }
    if (fuse_session_mount(se, dir) != 0) {
        fuse_session_destroy(se);
        close(pidfd);
        throw std::runtime_error(
            fmt::format("cannot mount at {} (see above; /dev/fuse and fusermount3 are needed)", dir));
    }
    fmt::print("process {}: tracing files mounted at {}\n", pid, dir);
    fflush(stdout);
    // Once mounted: the parent returns, the server goes on in a new session (its own
    // process group: a Ctrl-C of the shell does not unmount).
    if (!o.foreground && fuse_daemonize(0) != 0) {
        fuse_session_unmount(se);
        fuse_session_destroy(se);
        throw std::runtime_error("cannot go to the background");
    }
    int rc = 0;
    bool exited = false;
    if (fuse_set_signal_handlers(se) != 0) {
        rc = 1;
    } else {
        ProcessWatch watch(pidfd, fs);
        fuse_loop_config *config = fuse_loop_cfg_create();
        rc = fuse_session_loop_mt(se, config);
        fuse_loop_cfg_destroy(config);
        exited = watch.exited();
        fuse_remove_signal_handlers(se);
    }
    fuse_session_unmount(se);
    fuse_session_destroy(se);
    close(pidfd);
    if (exited) {
        fmt::print(stderr, "ukprobe: process {} exited; {} unmounted\n", pid, dir);
        return 0;
    }
    return rc < 0 ? 1 : 0;
}

} // namespace ukprobe
