#include "trace/output.hpp"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

namespace ukp::trace {

namespace {

// ftrace's trace_entry flag bits (kernel/trace/trace.h).
constexpr uint8_t kIrqsOff = 0x01, kNeedReschedLazy = 0x02, kNeedResched = 0x04, kHardirq = 0x08, kSoftirq = 0x10,
                  kPreemptResched = 0x20, kNmi = 0x40, kBhOff = 0x80;

// The five latency columns, as trace_print_lat_fmt prints them on 6.18.
void lat_fmt(uint8_t flags, uint8_t pc, char out[6]) {
    const bool bh_off = flags & kBhOff;
    out[0] = (flags & kIrqsOff) && bh_off ? 'D' : (flags & kIrqsOff) ? 'd' : bh_off ? 'b' : '.';
    switch (flags & (kNeedResched | kNeedReschedLazy | kPreemptResched)) {
    case kNeedResched | kNeedReschedLazy | kPreemptResched:
        out[1] = 'B';
        break;
    case kNeedResched | kPreemptResched:
        out[1] = 'N';
        break;
    case kNeedReschedLazy | kPreemptResched:
        out[1] = 'L';
        break;
    case kNeedResched | kNeedReschedLazy:
        out[1] = 'b';
        break;
    case kNeedResched:
        out[1] = 'n';
        break;
    case kPreemptResched:
        out[1] = 'p';
        break;
    case kNeedReschedLazy:
        out[1] = 'l';
        break;
    default:
        out[1] = '.';
        break;
    }
    const bool nmi = flags & kNmi, hard = flags & kHardirq, soft = flags & kSoftirq;
    out[2] = nmi && hard ? 'Z' : nmi ? 'z' : hard && soft ? 'H' : hard ? 'h' : soft ? 's' : '.';
    static const char hex[] = "0123456789abcdef";
    out[3] = (pc & 0xf) ? hex[pc & 0xf] : '.';
    out[4] = (pc & 0xf0) ? hex[pc >> 4] : '.';
    out[5] = 0;
}

std::string snapshot_help(bool allocated) {
    std::string s = allocated ? "#\n# * Snapshot is allocated *\n#\n" : "#\n# * Snapshot is freed *\n#\n";
    s += "# Snapshot commands:\n"
         "# echo 0 > snapshot : Clears and frees snapshot buffer\n"
         "# echo 1 > snapshot : Allocates snapshot buffer, if not already allocated.\n"
         "#                      Takes a snapshot of the main buffer.\n"
         "# echo 2 > snapshot : Clears snapshot buffer (but does not allocate or free)\n"
         "#                      (Doesn't have to be '2' works with any number that\n"
         "#                       is not a '0' or '1')\n";
    return s;
}

} // namespace

namespace {

uint64_t pid_ns_of(const std::string &proc_dir) {
    struct stat st {};
    return stat((proc_dir + "/ns/pid").c_str(), &st) == 0 ? st.st_ino : 0;
}

// A task's number in its own pid namespace (NSpid's last field), 0 if unknown.
int32_t own_number(const std::string &proc_dir) {
    FILE *f = std::fopen((proc_dir + "/status").c_str(), "re");
    if (f == nullptr) return 0;
    char line[256];
    int32_t n = 0;
    while (std::fgets(line, sizeof line, f) != nullptr) {
        if (std::strncmp(line, "NSpid:", 6) != 0) continue;
        for (char *p = line + 6, *end = nullptr;; p = end) {
            const long v = std::strtol(p, &end, 10);
            if (end == p) break;
            n = static_cast<int32_t>(v);
        }
        break;
    }
    std::fclose(f);
    return n;
}

// The reader's own pid namespace.
uint64_t own_pid_ns() {
    static const uint64_t ns = pid_ns_of("/proc/self");
    return ns;
}

// The process numbered `pid` in pid namespace `ns`, as this one numbers it; 0 if none is
// seen from here. Found once per process (a walk of /proc).
int32_t outer_pid(uint64_t ns, int32_t pid) {
    static std::mutex mu;
    static std::map<std::pair<uint64_t, int32_t>, int32_t> found;
    std::lock_guard lock(mu);
    if (auto it = found.find({ns, pid}); it != found.end() && pid_ns_of("/proc/" + std::to_string(it->second)) == ns &&
                                         own_number("/proc/" + std::to_string(it->second)) == pid)
        return it->second;
    int32_t outer = 0;
    if (DIR *d = opendir("/proc")) {
        while (dirent *e = readdir(d)) {
            char *end = nullptr;
            const long x = std::strtol(e->d_name, &end, 10);
            if (x <= 0 || *end != 0) continue;
            const std::string dir = std::string("/proc/") + e->d_name;
            if (pid_ns_of(dir) == ns && own_number(dir) == pid) {
                outer = static_cast<int32_t>(x);
                break;
            }
        }
        closedir(d);
    }
    if (outer != 0) found[{ns, pid}] = outer;
    return outer;
}

} // namespace

int32_t pid_here(int32_t seen_by, int32_t pid) {
    const uint64_t ns = pid_ns_of("/proc/" + std::to_string(seen_by));
    return ns == 0 || ns == own_pid_ns() ? pid : outer_pid(ns, pid);
}

ThreadNames::ThreadNames(const RingView &v) : v_(v) {
    const RingHeader *h = v.header();
    pid_ = h != nullptr ? h->pid : getpid();
    if (h != nullptr && h->pid_ns != 0 && h->pid_ns != own_pid_ns()) outer_ = outer_pid(h->pid_ns, h->pid);
}

const ThreadNames::Thread &ThreadNames::lookup(int32_t tid) {
    auto it = cache_.find(tid);
    if (it != cache_.end()) return it->second;
    const RingHeader *h = v_.header();
    if (h == nullptr || h->pid_ns == 0 || tid == 0 || h->pid_ns == own_pid_ns())
        return cache_.emplace(tid, Thread{ring_thread_name(v_, pid_, tid), tid}).first->second;
    // Another pid namespace: the thread among the process's, by its own number.
    int32_t here = 0;
    if (outer_ != 0) {
        const std::string task = "/proc/" + std::to_string(outer_) + "/task";
        if (DIR *d = opendir(task.c_str())) {
            while (dirent *e = readdir(d)) {
                char *end = nullptr;
                const long x = std::strtol(e->d_name, &end, 10);
                if (x > 0 && *end == 0 && own_number(task + "/" + e->d_name) == tid) {
                    here = static_cast<int32_t>(x);
                    break;
                }
            }
            closedir(d);
        }
    }
    // Its name where it lives, else the ring's (never /proc/TID of this namespace: another task's).
    std::string name = here != 0 ? ring_thread_name(v_, outer_, here) : ring_thread_name(v_, 0, tid);
    return cache_.emplace(tid, Thread{std::move(name), here != 0 ? here : tid}).first->second;
}

void append_entry(const RingEntry &e, ThreadNames &names, const EventPrinter &print, std::string &out) {
    if (e.lost_before != 0) out += lost_events_line(e.cpu, e.lost_before);
    CommonHeader c{};
    if (e.rec.size() >= kCommonSize) std::memcpy(&c, e.rec.data(), kCommonSize);
    append_trace_line_prefix(out, names.of(c.pid), names.pid_of(c.pid), e.cpu, c.flags, c.preempt_count, e.ts);
    print(e.rec.data(), static_cast<uint32_t>(e.rec.size()), out);
    out += '\n';
}

int online_cpus() {
    const long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? static_cast<int>(n) : 1;
}

std::string trace_header(uint64_t entries, uint64_t written, int cpus) {
    char line[128];
    std::snprintf(line, sizeof line, "# entries-in-buffer/entries-written: %llu/%llu   #P:%d\n",
                  static_cast<unsigned long long>(entries), static_cast<unsigned long long>(written), cpus);
    std::string s = "# tracer: nop\n#\n";
    s += line;
    s += "#\n"
         "#                                _-----=> irqs-off/BH-disabled\n"
         "#                               / _----=> need-resched\n"
         "#                              | / _---=> hardirq/softirq\n"
         "#                              || / _--=> preempt-depth\n"
         "#                              ||| / _-=> migrate-disable\n"
         "#                              |||| /     delay\n"
         "#           TASK-PID     CPU#  |||||  TIMESTAMP  FUNCTION\n"
         "#              | |         |   |||||     |         |\n";
    return s;
}

namespace {

// `v` in decimal at `p`, in a field of `width` (zeros or blanks before, or blanks after
// with `left`): printf's %0Nllu, %Nllu and %-Nlld, without its parsing. Returns the end.
char *put_number(char *p, uint64_t v, bool negative, size_t width, char pad, bool left) {
    char digits[24];
    size_t n = 0;
    do {
        digits[n++] = static_cast<char>('0' + v % 10);
        v /= 10;
    } while (v != 0);
    if (negative) digits[n++] = '-';
    const size_t fill = width > n ? width - n : 0;
    if (!left) p = std::fill_n(p, fill, pad);
    while (n > 0) *p++ = digits[--n];
    if (left) p = std::fill_n(p, fill, ' ');
    return p;
}

} // namespace

void append_trace_line_prefix(std::string &out, const std::string &comm, int32_t pid, uint32_t cpu, uint8_t flags,
                              uint8_t preempt_count, uint64_t ts_ns) {
    const uint64_t usecs = (ts_ns + 500) / 1000; // ftrace's ns2usecs rounds
    // "%16s-%-7d [%03u] %s %5llu.%06llu: ", built in one buffer and appended once (a
    // reader formats a line per record: each append is a call).
    char buf[128];
    char *p = buf;
    if (comm.size() < 16) p = std::fill_n(p, 16 - comm.size(), ' ');
    out.append(buf, static_cast<size_t>(p - buf));
    out += comm;
    p = buf;
    *p++ = '-';
    const bool negative = pid < 0;
    p = put_number(p, negative ? 0 - static_cast<uint64_t>(static_cast<int64_t>(pid)) : static_cast<uint64_t>(pid),
                   negative, 7, ' ', true);
    *p++ = ' ';
    *p++ = '[';
    p = put_number(p, cpu, false, 3, '0', false);
    *p++ = ']';
    *p++ = ' ';
    lat_fmt(flags, preempt_count, p);
    p += 5;
    *p++ = ' ';
    p = put_number(p, usecs / 1000000, false, 5, ' ', false);
    *p++ = '.';
    p = put_number(p, usecs % 1000000, false, 6, '0', false);
    *p++ = ':';
    *p++ = ' ';
    out.append(buf, static_cast<size_t>(p - buf));
}

std::string trace_line_prefix(const std::string &comm, int32_t pid, uint32_t cpu, uint8_t flags, uint8_t preempt_count,
                              uint64_t ts_ns) {
    std::string out;
    append_trace_line_prefix(out, comm, pid, cpu, flags, preempt_count, ts_ns);
    return out;
}

std::string lost_events_line(uint32_t cpu, uint64_t lost) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "CPU:%u [LOST %llu EVENTS]\n", cpu, static_cast<unsigned long long>(lost));
    return buf;
}

std::string trace_text_from(const RingView &v, const std::vector<RingEntry> &entries, const RingCounts &counts,
                            const EventPrinter &print) {
    std::string out = trace_header(counts.entries, counts.written, online_cpus());
    ThreadNames names(v);
    for (const RingEntry &e : entries) append_entry(e, names, print, out);
    return out;
}

std::string snapshot_text_from(const RingView &v, bool allocated, const std::vector<RingEntry> &entries,
                               const RingCounts &counts, const EventPrinter &print) {
    if (entries.empty()) return "# tracer: nop\n#\n" + snapshot_help(allocated);
    return trace_text_from(v, entries, counts, print);
}

std::string trace_text_of(const RingView &v, const EventPrinter &print) {
    RingCounts counts;
    const std::vector<RingEntry> entries = ring_collect(v, &counts);
    return trace_text_from(v, entries, counts, print);
}

std::string snapshot_text_of(const RingView &v, bool allocated, const EventPrinter &print) {
    RingCounts counts;
    const std::vector<RingEntry> entries = allocated ? ring_collect(v, &counts) : std::vector<RingEntry>{};
    return snapshot_text_from(v, allocated, entries, counts, print);
}

std::string trace_pipe_text_of(const RingView &v, const EventPrinter &print, size_t max_bytes) {
    std::string out;
    ThreadNames names(v);
    RingMerger merger(v);
    RingEntry e;
    while (out.size() < max_bytes && merger.next(&e)) append_entry(e, names, print, out);
    return out;
}

std::string PipeReader::read(const WithView &with_view, const EventPrinter &print, int timeout_ms, size_t max_bytes,
                             std::string buffer) {
    std::string out = std::move(buffer);
    out.clear();
    if (max_bytes == 0) return out;
    if (!left_.empty()) {
        out = left_.substr(0, max_bytes);
        left_.erase(0, out.size());
        return out;
    }
    // Polling: the writer may not make the system call a wakeup needs.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    for (;;) {
        bool ready = false;
        with_view([&](const RingView &v) { ready = ring_has_data(v); });
        if (ready) break;
        if (std::chrono::steady_clock::now() >= deadline) return out;
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    out.reserve(std::min<size_t>(max_bytes, 4 << 20) + 4096); // a line may pass max_bytes
    RingView view;
    std::optional<RingMerger> merger;
    with_view([&](const RingView &v) {
        view = v;
        merger.emplace(v);
    });
    ThreadNames names(view);
    RingEntry e;
    for (;;) {
        // Consumed under with_view, printed outside it: a printer may take other locks.
        // A ring replaced meanwhile stays mapped (ring.cpp): the merger reads it to its end.
        bool got = false;
        with_view([&](const RingView &) { got = merger->next(&e); });
        if (!got) {
            // Emptied: then the records refused without a buffer (a thread past its exit
            // destructor freeing its memory, every buffer in use), as one LOST line.
            uint64_t lost = 0;
            with_view([&](const RingView &v) { lost = ring_claim_lost_no_buffer(v); });
            if (lost != 0) out += lost_events_line(0, lost);
            break;
        }
        const size_t before = out.size();
        append_entry(e, names, print, out);
        if (out.size() > max_bytes) {
            // The line that does not fit waits for the next read (a part of it, when alone).
            const size_t keep = before == 0 ? max_bytes : before;
            left_ = out.substr(keep);
            out.resize(keep);
            break;
        }
    }
    return out;
}

} // namespace ukp::trace
