#include "reader.hpp"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <atomic>
#include <cstring>
#include <stdexcept>

namespace ukprobe {

using ukp::control::Op;
namespace trace = ukp::trace;

namespace {

// How often a consuming reader asks the agent which buffers it serves (TraceReader::map_ring).
constexpr auto kServedCheck = std::chrono::milliseconds(100);

// "# entries-in-buffer/entries-written: N/M" of a trace file's text: N.
uint64_t entries_of(const std::string &text) {
    static constexpr char kKey[] = "entries-in-buffer/entries-written: ";
    const size_t at = text.find(kKey);
    return at == std::string::npos ? 0 : strtoull(text.c_str() + at + sizeof kKey - 1, nullptr, 10);
}

// Answers that mean the agent does not serve the ring at all (an older agent).
bool unsupported(int status) { return status == -ENOENT || status == -EOPNOTSUPP || status == -EINVAL; }

} // namespace

TraceReader::TraceReader(Client &client, int pid, bool consume) : client_(client), pid_(pid), consume_(consume) {
    const char *env = getenv("UKPROBE_AGENT_FORMATS");
    agent_formats_ = env != nullptr && strcmp(env, "1") == 0;
}

TraceReader::TraceReader(Client &events, int pid, int ring_fd, const ukp::sym::Registry *known)
    : client_(events), pid_(pid), consume_(true), taken_fd_(ring_fd), taken_(true) {
    if (known != nullptr) symbols_ = *known;
}

TraceReader::~TraceReader() {
    unmap();
    if (taken_fd_ >= 0) close(taken_fd_);
}

void TraceReader::unmap() {
    if (mapped_ != nullptr) munmap(mapped_, size_);
    mapped_ = nullptr;
    size_ = 0;
    dev_ = 0;
    ino_ = 0;
    unmap(snap_);
}

void TraceReader::unmap(Mapping &m) {
    if (m.base != nullptr) munmap(m.base, m.size);
    m = Mapping{};
}

bool TraceReader::map_fd(int fd, int prot, Mapping &m) {
    struct stat st {};
    if (fstat(fd, &st) != 0 || st.st_size <= 0) {
        close(fd);
        unmap(m);
        return false;
    }
    if (m.base != nullptr && st.st_dev == m.dev && st.st_ino == m.ino) {
        close(fd); // the same buffers as last time
        return true;
    }
    unmap(m);
    void *p = mmap(nullptr, static_cast<size_t>(st.st_size), prot, MAP_SHARED | MAP_NORESERVE, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return false;
    m = Mapping{static_cast<uint8_t *>(p), static_cast<size_t>(st.st_size), st.st_dev, st.st_ino};
    return true;
}

bool TraceReader::map_ring() {
    if (taken_) {
        if (taken_fd_ >= 0) {
            Mapping m;
            const bool ok = map_fd(taken_fd_, PROT_READ | PROT_WRITE, m);
            taken_fd_ = -1;
            if (ok && trace::RingView{m.base, m.size}.header() != nullptr && load_events()) {
                mapped_ = m.base;
                size_ = m.size;
                // Read while the process surely lives (it waits in the call that gave the
                // ring up): one killed later has no maps left to name its addresses with.
                // Objects of `known` still mapped where they were are not parsed again.
                // A capture only notes the maps: the report parses the objects.
                if (capturer_ != nullptr)
                    remember_maps();
                else
                    refresh_symbols();
            } else {
                unmap(m);
            }
        }
        return mapped_ != nullptr;
    }
    if (agent_formats_ && capturer_ == nullptr) return false;
    // The agent replaces its buffers only when they are resized or swapped with the
    // snapshot's, and the records written meanwhile wait in the new ones: a stream asks
    // at most every kServedCheck (each answer is a wakeup of the traced process's
    // control thread, and was one per read), unless told to (recheck_buffers).
    const auto now = std::chrono::steady_clock::now();
    if (mapped_ != nullptr && consume_ && now - served_checked_ < kServedCheck) return true;
    served_checked_ = now;
    Reply r = client_.request(Op::kOpenFd, ukp::control::kTraceRingPath);
    if (r.status < 0 || r.fd < 0) {
        if (r.fd >= 0) close(r.fd);
        if (unsupported(r.status) || r.status >= 0) agent_formats_ = true;
        unmap();
        return false;
    }
    struct stat st {};
    if (fstat(r.fd, &st) != 0 || st.st_size <= 0) {
        close(r.fd);
        unmap();
        return false;
    }
    if (mapped_ != nullptr && st.st_dev == dev_ && st.st_ino == ino_) {
        close(r.fd); // the same buffers as last time
        return true;
    }
    unmap();
    const int prot = consume_ ? PROT_READ | PROT_WRITE : PROT_READ;
    void *p = mmap(nullptr, static_cast<size_t>(st.st_size), prot, MAP_SHARED | MAP_NORESERVE, r.fd, 0);
    close(r.fd);
    if (p == MAP_FAILED) return false;
    mapped_ = static_cast<uint8_t *>(p);
    size_ = static_cast<size_t>(st.st_size);
    dev_ = st.st_dev;
    ino_ = st.st_ino;
    if (trace::RingView{mapped_, size_}.header() == nullptr || (events_.empty() && !load_events())) {
        // Another layout version, or no event table: the agent formats.
        agent_formats_ = true;
        unmap();
        return false;
    }
    return true;
}

void TraceReader::borrow_events(const TraceReader &from) {
    events_ = from.events_;
    events_text_ = from.events_text_;
    events_borrowed_ = true;
}

bool TraceReader::load_events() {
    if (events_borrowed_) return !events_.empty();
    if (agent_gone_) return false;
    const Reply r = client_.request(Op::kRead, "event_table");
    if (r.status < 0) return false;
    std::map<uint16_t, trace::EventInfo> table;
    std::string why;
    if (trace::parse_event_table(r.payload, &table, &why) != 0) return false;
    events_ = std::move(table);
    events_text_ = r.payload;
    return true;
}

const trace::EventInfo *TraceReader::find_event(uint16_t id) {
    auto it = events_.find(id);
    if (it == events_.end() && !events_fresh_) {
        // Defined since the table was read (ids are never reused: the table only grows).
        events_fresh_ = true;
        load_events();
        it = events_.find(id);
    }
    return it != events_.end() ? &it->second : nullptr;
}

void TraceReader::refresh_symbols() {
    symbols_.refresh_from_maps(pid_, &maps_);
    symbol_texts_.clear();
}

std::string TraceReader::symbolize(uint64_t addr, bool with_size) {
    if (const std::string *known = symbol_texts_.find(addr, with_size)) return *known;
    if (symbols_.objects().empty()) refresh_symbols();
    std::string text = trace::symbol_text(symbols_.objects(), addr, with_size);
    if (text.empty() && !symbols_fresh_ && !agent_gone_) { // a process gone has no maps left
        symbols_fresh_ = true;                             // an object loaded since
        refresh_symbols();
        text = trace::symbol_text(symbols_.objects(), addr, with_size);
    }
    if (text.empty()) return trace::hex_address(addr); // an object may come there later
    symbol_texts_.keep(addr, with_size, text);
    return text;
}

trace::EventPrinter TraceReader::printer() {
    events_fresh_ = symbols_fresh_ = false;
    return [this](const uint8_t *rec, uint32_t size, std::string &out) {
        trace::print_record(
            rec, size, [this](uint16_t id) { return find_event(id); },
            [this](uint64_t addr, bool with_size) { return symbolize(addr, with_size); }, out);
    };
}

std::string TraceReader::agent_text(const std::string &path) {
    const Reply r = client_.request(Op::kRead, path);
    if (r.status < 0) throw std::runtime_error(refusal(r, Op::kRead, path, pid_));
    return r.payload;
}

void TraceReader::capture() {
    static std::atomic<uint32_t> streams{0};
    capturer_ = std::make_unique<trace::capture::Capturer>(++streams, pid_);
    agent_formats_ = false; // a capture reads the ring, or nothing
}

std::string TraceReader::capture_blocks(size_t max_bytes) {
    namespace capture = trace::capture;
    // The blocks go into the buffer given back (give_buffer), its pages already touched:
    // a fresh megabyte each read is a page fault each 4 KiB.
    std::string out = std::move(spare_);
    out.clear();
    out.reserve(max_bytes + (64 << 10)); // no growth by steps (a batch may pass max_bytes)
    const uint32_t stream = capturer_->stream();
    if (!stream_written_) {
        stream_written_ = true;
        const std::string comm = trace::ring_thread_name(trace::RingView{mapped_, size_}, pid_, pid_);
        capture::append_block(out, capture::kStream, stream, std::to_string(pid_) + '\t' + comm + '\n');
    }
    // What names the records before them: the objects mapped now, at most every 100 ms
    // while records come (a library loaded since the last look; a process gone left its
    // last maps), and the event table as known.
    const trace::RingView view{mapped_, size_};
    const auto now = std::chrono::steady_clock::now();
    if (!agent_gone_ &&
        (maps_written_.empty() || (now - maps_read_ >= std::chrono::milliseconds(100) && trace::ring_has_data(view)))) {
        maps_read_ = now;
        if (auto maps = ukp::sym::Registry::read_maps(pid_); !maps.files.empty()) maps_ = std::move(maps);
    }
    if (!maps_.files.empty()) {
        if (std::string text = capture::maps_text(maps_); text != maps_written_) {
            capture::append_block(out, capture::kMaps, stream, text);
            maps_written_ = std::move(text);
        }
    }
    events_fresh_ = false;
    if (events_text_.empty()) { // the first read: the table
        events_fresh_ = true;
        load_events();
    }
    const auto add_events = [&] {
        if (events_text_ == events_written_) return;
        capture::append_block(out, capture::kEvents, stream, events_text_);
        events_written_ = events_text_;
    };
    add_events();
    // The records, in place. An event defined since the table was read: the table again,
    // after them (the report takes a stream's tables whole before it prints).
    capturer_->capture(view, out, max_bytes);
    for (uint16_t id : capturer_->new_ids()) find_event(id);
    add_events();
    return out;
}

std::string TraceReader::trace() {
    if (!map_ring()) return taken_ ? std::string() : agent_text("trace");
    return trace::trace_text_of(trace::RingView{mapped_, size_}, printer());
}

std::string TraceReader::pipe(int timeout_ms, size_t max_bytes) {
    if (capturer_ != nullptr) {
        // A capture copies the ring itself: an agent that does not pass it (an older one)
        // cannot be recorded.
        if (!map_ring()) {
            if (taken_) return {};
            throw std::runtime_error("the agent of process " + std::to_string(pid_) +
                                     " does not pass its ring buffers: record needs an agent of this version");
        }
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
        while (!trace::ring_has_data(trace::RingView{mapped_, size_}) && std::chrono::steady_clock::now() < deadline)
            usleep(1000);
        return capture_blocks(max_bytes);
    }
    if (!map_ring()) return taken_ ? std::string() : agent_text("trace_pipe"); // the agent waits 100 ms
    const trace::RingView view{mapped_, size_};
    const trace::PipeReader::WithView with_view = [&view](const std::function<void(const trace::RingView &)> &fn) {
        fn(view);
    };
    return pipe_.read(with_view, printer(), timeout_ms, max_bytes, std::move(spare_));
}

std::string TraceReader::pipe_left(size_t max_bytes) {
    if (mapped_ == nullptr) return {};
    agent_gone_ = true; // the symbols are named from what was read while it lived
    if (capturer_ != nullptr) return capture_blocks(max_bytes);
    const trace::RingView view{mapped_, size_};
    const trace::PipeReader::WithView with_view = [&view](const std::function<void(const trace::RingView &)> &fn) {
        fn(view);
    };
    return pipe_.read(with_view, printer(), 0, max_bytes, std::move(spare_));
}

std::string TraceReader::snapshot() {
    if (agent_formats_ || agent_snapshots_) return agent_text("snapshot");
    const Reply r = client_.request(Op::kOpenFd, ukp::control::kSnapshotRingPath);
    if (r.status < 0) {
        if (r.fd >= 0) close(r.fd);
        if (unsupported(r.status)) agent_snapshots_ = true;
        return agent_text("snapshot");
    }
    if (r.fd < 0) { // no snapshot allocated: the help text
        unmap(snap_);
        return trace::snapshot_text_of(trace::RingView{}, false, printer());
    }
    if (!map_fd(r.fd, PROT_READ, snap_)) return agent_text("snapshot");
    const trace::RingView view{snap_.base, snap_.size};
    if (view.header() == nullptr || (events_.empty() && !load_events())) {
        agent_snapshots_ = true; // another layout version, or no event table
        unmap(snap_);
        return agent_text("snapshot");
    }
    return trace::snapshot_text_of(view, true, printer());
}

bool TraceReader::has_records() {
    if (!map_ring()) return entries() != 0;
    return trace::ring_has_data(trace::RingView{mapped_, size_});
}

trace::RingLevel TraceReader::level() const {
    return formats_locally() ? trace::ring_level(trace::RingView{mapped_, size_}) : trace::RingLevel{};
}

bool TraceReader::holds_records() const {
    return formats_locally() && trace::ring_has_data(trace::RingView{mapped_, size_});
}

uint64_t TraceReader::entries() {
    if (!map_ring()) return taken_ ? 0 : entries_of(agent_text("trace"));
    trace::RingCounts counts;
    trace::ring_collect(trace::RingView{mapped_, size_}, &counts);
    return counts.entries;
}

} // namespace ukprobe
