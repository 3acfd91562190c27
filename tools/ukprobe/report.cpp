#include "report.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/core.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <unordered_map>

#include "symbols/symbols.hpp"
#include "trace/capture.hpp"
#include "trace/output.hpp"
#include "trace/print.hpp"

namespace ukprobe {

namespace trace = ukp::trace;
namespace capture = ukp::trace::capture;

namespace {

// The capture file, mapped read-only.
class Mapped {
public:
    explicit Mapped(const std::string &path) {
        const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
        if (fd < 0) throw std::runtime_error(fmt::format("cannot open {}: {}", path, strerror(errno)));
        struct stat st {};
        if (fstat(fd, &st) != 0) {
            const int e = errno;
            close(fd);
            throw std::runtime_error(fmt::format("cannot read {}: {}", path, strerror(e)));
        }
        size_ = static_cast<size_t>(st.st_size);
        if (size_ > 0) {
            void *p = mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
            if (p == MAP_FAILED) {
                const int e = errno;
                close(fd);
                throw std::runtime_error(fmt::format("cannot map {}: {}", path, strerror(e)));
            }
            base_ = static_cast<const uint8_t *>(p);
            madvise(p, size_, MADV_SEQUENTIAL);
        }
        close(fd);
    }
    ~Mapped() {
        if (base_ != nullptr) munmap(const_cast<uint8_t *>(base_), size_);
    }
    Mapped(const Mapped &) = delete;
    Mapped &operator=(const Mapped &) = delete;
    const uint8_t *data() const { return base_; }
    size_t size() const { return size_; }

private:
    const uint8_t *base_ = nullptr;
    size_t size_ = 0;
};

// One stream's printing: its events, its objects (parsed at the first address to name),
// its threads' names.
class StreamPrinter {
public:
    explicit StreamPrinter(const capture::Stream &s) : s_(s) {}

    const trace::EventInfo *event(uint16_t id) const {
        const auto it = s_.events.find(id);
        return it != s_.events.end() ? &it->second : nullptr;
    }

    std::string symbolize(uint64_t addr, bool with_size) {
        if (const std::string *known = texts_.find(addr, with_size)) return *known;
        if (!loaded_) {
            loaded_ = true;
            symbols_.load_maps(s_.maps);
        }
        std::string text = trace::symbol_text(symbols_.objects(), addr, with_size);
        if (text.empty()) text = trace::hex_address(addr);
        texts_.keep(addr, with_size, text);
        return text;
    }

    const std::string &name(int32_t tid) const {
        static const std::string unknown = "<...>", idle = "<idle>";
        if (tid == 0) return idle;
        const auto it = s_.names.find(tid);
        return it != s_.names.end() ? it->second : unknown;
    }

    const trace::Symbolizer &symbolizer() { return symbolizer_; }
    const trace::EventLookup &lookup() { return lookup_; }
    const capture::Stream &stream() const { return s_; }

private:
    const capture::Stream &s_;
    ukp::sym::Registry symbols_;
    bool loaded_ = false;
    trace::SymbolTexts texts_;
    trace::Symbolizer symbolizer_ = [this](uint64_t addr, bool with_size) { return symbolize(addr, with_size); };
    trace::EventLookup lookup_ = [this](uint16_t id) { return event(id); };
};

// Whether `want` (GRP/EVENT, GRP.EVENT or EVENT) names e.
bool names_event(const std::string &want, const trace::EventInfo &e) {
    const size_t sep = want.find_first_of("/.");
    if (sep == std::string::npos) return want == e.name;
    return want.compare(0, sep, e.group) == 0 && want.size() - sep - 1 == e.name.size() &&
           want.compare(sep + 1, std::string::npos, e.name) == 0;
}

void json_string(std::string &out, std::string_view s) {
    out += '"';
    for (const char c : s) {
        const auto u = static_cast<unsigned char>(c);
        if (c == '"' || c == '\\') {
            out += '\\';
            out += c;
        } else if (u < 0x20 || u >= 0x7f) {
            // Bytes, not text: each as its own code point (a record may hold any byte).
            out += fmt::format("\\u{:04x}", u);
        } else {
            out += c;
        }
    }
    out += '"';
}

// The value of element k of field f, as JSON: a number when it is an integer printed in
// decimal that a double holds exactly, else the trace's text as a string.
void json_value(std::string &out, const uint8_t *rec, uint32_t size, const trace::Field &f, uint32_t k,
                const trace::Symbolizer &sym) {
    if (f.print == trace::Print::kUnsigned || f.print == trace::Print::kSigned) {
        const uint64_t v = trace::load_integer(rec, f, k);
        const bool neg = f.print == trace::Print::kSigned && static_cast<int64_t>(v) < 0;
        const uint64_t mag = neg ? 0 - v : v;
        if (mag <= (1ull << 53)) {
            out += neg ? fmt::format("-{}", mag) : fmt::format("{}", mag);
            return;
        }
    }
    std::string text;
    trace::print_field_value(rec, size, f, k, sym, text);
    if (f.print == trace::Print::kString && text.size() >= 2 && text.front() == '"')
        text = text.substr(1, text.size() - 2);
    json_string(out, text);
}

// The value of the field named `name` of a record of e, or 0 when it has none.
uint64_t field_value(const trace::EventInfo &e, const uint8_t *rec, uint32_t size, std::string_view name) {
    for (const trace::Field &f : e.fields)
        if (f.name == name && f.array_len == 0 && f.offset + f.size <= size && f.size <= 8)
            return trace::load_integer(rec, f);
    return 0;
}

// Chrome's trace event format (the JSON object form): an instant event per record, a
// metadata event naming each process and thread. Perfetto and chrome://tracing open it.
// A return event whose function's entry was recorded on the same thread (a `p` event at
// the address the `r` event names) also makes a slice of the call: a complete event from
// the entry to the return, named by the function, nested as the calls were.
class ChromeWriter {
public:
    explicit ChromeWriter(std::string &out) : out_(out) { out_ += "{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n"; }

    void record(StreamPrinter &p, const capture::Item &it, const trace::CommonHeader &c) {
        name_once(p, c.pid);
        const trace::EventInfo *e = p.event(c.type);
        const uint32_t size = it.size;
        if (e != nullptr && c.type != trace::kStackEventId) pair_call(p, *e, it, c);
        begin(p.stream().pid, c.pid, it.ts, 't');
        out_ += "\"name\":";
        if (c.type == trace::kStackEventId) {
            out_ += "\"<user stack trace>\",\"cat\":\"ftrace\",\"args\":{\"stack\":[";
            for (uint32_t off = trace::kCommonSize; off + 8 <= size; off += 8) {
                uint64_t a;
                std::memcpy(&a, it.data + off, 8);
                if (off != trace::kCommonSize) out_ += ',';
                json_string(out_, p.symbolizer()(a, true));
            }
            out_ += "]}}";
            return;
        }
        if (e == nullptr) {
            json_string(out_, "Unknown event " + std::to_string(c.type));
            out_ += "}";
            return;
        }
        json_string(out_, e->name);
        out_ += ",\"cat\":";
        json_string(out_, e->group);
        out_ += ",\"args\":{";
        bool first = true;
        for (const trace::Field &f : e->fields) {
            if (f.common) continue;
            const uint32_t n = f.array_len > 0 ? f.array_len : 1;
            if (f.offset + f.size * n > size) break;
            if (!first) out_ += ',';
            first = false;
            json_string(out_, f.name);
            out_ += ':';
            if (f.array_len > 0) out_ += '[';
            for (uint32_t k = 0; k < n; ++k) {
                if (k) out_ += ',';
                if (f.name.starts_with("__probe_")) // the probe's own addresses, named as the trace names them
                    json_string(out_, p.symbolizer()(trace::load_integer(it.data, f, k), f.name != "__probe_func"));
                else
                    json_value(out_, it.data, size, f, k, p.symbolizer());
            }
            if (f.array_len > 0) out_ += ']';
        }
        out_ += "}}";
    }

    void lost(const StreamPrinter &p, const capture::Item &it, uint64_t count) {
        begin(p.stream().pid, p.stream().pid, it.ts, 'p');
        out_ +=
            fmt::format("\"name\":\"LOST\",\"cat\":\"ukprobe\",\"args\":{{\"events\":{},\"cpu\":{}}}}}", count, it.cpu);
    }

    void end() { out_ += "\n]}\n"; }

private:
    struct Open {
        uint64_t func; // the entry's address
        uint64_t ts;
    };
    static constexpr size_t kMaxDepth = 512; // entries never returned from are forgotten past it

    // An entry is remembered on its thread's stack; a return closes the latest entry of
    // its function (and forgets those above it: entries whose returns were not recorded).
    void pair_call(StreamPrinter &p, const trace::EventInfo &e, const capture::Item &it, const trace::CommonHeader &c) {
        std::vector<Open> &stack = open_[uint64_t(it.stream) << 32 | uint32_t(c.pid)];
        if (!e.is_return) {
            if (stack.size() == kMaxDepth) stack.erase(stack.begin());
            stack.push_back(Open{field_value(e, it.data, it.size, "__probe_ip"), it.ts});
            return;
        }
        const uint64_t func = field_value(e, it.data, it.size, "__probe_func");
        for (size_t i = stack.size(); i-- > 0;) {
            if (stack[i].func != func) continue;
            const uint64_t start = stack[i].ts, dur = it.ts >= start ? it.ts - start : 0;
            stack.resize(i);
            if (events_++ != 0) out_ += ",\n";
            out_ += fmt::format("{{\"ph\":\"X\",\"pid\":{},\"tid\":{},\"ts\":{}.{:03},\"dur\":{}.{:03},\"name\":",
                                p.stream().pid, c.pid, start / 1000, start % 1000, dur / 1000, dur % 1000);
            json_string(out_, p.symbolizer()(func, false));
            out_ += ",\"cat\":";
            json_string(out_, e.group);
            out_ += "}";
            return;
        }
    }

    std::unordered_map<uint64_t, std::vector<Open>> open_; // by stream and thread
    void begin(int32_t pid, int32_t tid, uint64_t ts, char scope) {
        if (events_++ != 0) out_ += ",\n";
        // Microseconds with the nanoseconds as decimals.
        out_ += fmt::format("{{\"ph\":\"i\",\"s\":\"{}\",\"pid\":{},\"tid\":{},\"ts\":{}.{:03},", scope, pid, tid,
                            ts / 1000, ts % 1000);
    }

    void name_once(const StreamPrinter &p, int32_t tid) {
        const int32_t pid = p.stream().pid;
        if (named_.emplace(uint64_t(uint32_t(pid)) << 32 | uint32_t(tid), true).second) {
            if (named_.emplace(uint64_t(uint32_t(pid)) << 32 | 0x80000000u, true).second) {
                meta(pid, pid, "process_name", p.stream().comm);
            }
            meta(pid, tid, "thread_name", p.name(tid));
        }
    }

    void meta(int32_t pid, int32_t tid, const char *what, const std::string &name) {
        if (events_++ != 0) out_ += ",\n";
        out_ +=
            fmt::format("{{\"ph\":\"M\",\"pid\":{},\"tid\":{},\"name\":\"{}\",\"args\":{{\"name\":", pid, tid, what);
        json_string(out_, name);
        out_ += "}}";
    }

    std::string &out_;
    uint64_t events_ = 0;
    std::unordered_map<uint64_t, bool> named_;
};

} // namespace

int report(const ReportOptions &o) {
    if (o.format != "text" && o.format != "chrome")
        throw std::runtime_error(fmt::format("report: unknown format '{}' (text, chrome)", o.format));
    const Mapped file(o.file);
    capture::File f;
    std::string why;
    if (capture::read_file(file.data(), file.size(), &f, &why) != 0)
        throw std::runtime_error(fmt::format("{}: {}", o.file, why));
    if (!why.empty()) fmt::print(stderr, "ukprobe: {}: {}\n", o.file, why);

    FILE *out = stdout;
    if (!o.output.empty()) {
        out = fopen(o.output.c_str(), "we");
        if (out == nullptr) throw std::runtime_error(fmt::format("cannot write {}: {}", o.output, strerror(errno)));
    }
    std::unordered_map<uint32_t, std::unique_ptr<StreamPrinter>> printers;
    for (const auto &[id, s] : f.streams) printers.emplace(id, std::make_unique<StreamPrinter>(s));
    // The events the filter keeps, per stream: by id.
    std::unordered_map<uint32_t, std::vector<bool>> wanted;
    if (!o.events.empty()) {
        for (const auto &[id, s] : f.streams) {
            std::vector<bool> &w = wanted[id];
            w.assign(65536, false);
            for (const auto &[eid, e] : s.events)
                for (const std::string &want : o.events) w[eid] = w[eid] || names_event(want, e);
        }
    }
    const auto in_time = [&](uint64_t ts) {
        const double secs = static_cast<double>((ts + 500) / 1000) / 1e6; // as the trace prints it
        return (o.from < 0 || secs >= o.from) && (o.to < 0 || secs <= o.to);
    };
    const auto pid_wanted = [&](int32_t pid, int32_t tid) {
        if (o.pids.empty()) return true;
        for (int p : o.pids)
            if (p == pid || p == tid) return true;
        return false;
    };

    std::string text;
    text.reserve(1 << 21);
    std::unique_ptr<ChromeWriter> chrome;
    if (o.format == "chrome") chrome = std::make_unique<ChromeWriter>(text);
    bool ok = true;
    const auto flush = [&](bool always) {
        if (!always && text.size() < (1 << 20)) return;
        if (ok && fwrite(text.data(), 1, text.size(), out) != text.size()) ok = false;
        text.clear();
    };
    for (const capture::Item &it : f.items) {
        StreamPrinter &p = *printers.at(it.stream);
        const int32_t pid = p.stream().pid;
        if (!in_time(it.ts)) continue;
        if (it.kind == capture::kLost) {
            uint64_t n = 0;
            std::memcpy(&n, it.data, sizeof n);
            if (!pid_wanted(pid, pid)) continue;
            if (chrome)
                chrome->lost(p, it, n);
            else
                text += trace::lost_events_line(it.cpu, n);
        } else if (it.kind == capture::kRecord) {
            trace::CommonHeader c{};
            if (it.size < trace::kCommonSize) continue;
            std::memcpy(&c, it.data, sizeof c);
            if (!pid_wanted(pid, c.pid)) continue;
            if (!o.events.empty() && !wanted[it.stream][c.type]) continue;
            if (chrome) {
                chrome->record(p, it, c);
            } else {
                trace::append_trace_line_prefix(text, p.name(c.pid), c.pid, it.cpu, c.flags, c.preempt_count, it.ts);
                trace::print_record(it.data, it.size, p.lookup(), p.symbolizer(), text);
                text += '\n';
            }
        }
        flush(false);
    }
    if (chrome) chrome->end();
    flush(true);
    if (ok && fflush(out) != 0) ok = false;
    if (out != stdout) fclose(out);
    if (!ok) throw std::runtime_error(fmt::format("cannot write {}", o.output.empty() ? "the report" : o.output));
    return 0;
}

} // namespace ukprobe
