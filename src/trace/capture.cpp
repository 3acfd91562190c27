#include "trace/capture.hpp"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstddef>
#include <cstring>

#include "trace/output.hpp"

namespace ukp::trace::capture {

namespace {

size_t padded(size_t n) { return (n + 7) & ~size_t{7}; }

template <typename T>
void put(std::string &out, const T &v) {
    out.append(reinterpret_cast<const char *>(&v), sizeof v);
}

// Opens a block at the end of `out`; close_block sets its size and pads it.
size_t open_block(std::string &out, uint32_t type, uint32_t stream) {
    const size_t at = out.size();
    put(out, BlockHeader{type, stream, 0});
    return at;
}

void close_block(std::string &out, size_t at) {
    const uint64_t size = out.size() - at - sizeof(BlockHeader);
    std::memcpy(out.data() + at + offsetof(BlockHeader, size), &size, sizeof size);
    out.append(padded(out.size()) - out.size(), '\0');
}

} // namespace

std::string file_header() {
    FileHeader h{};
    std::memcpy(h.magic, kMagic, sizeof kMagic);
    h.version = kVersion;
    h.header_size = sizeof(FileHeader);
    return std::string(reinterpret_cast<const char *>(&h), sizeof h);
}

void append_block(std::string &out, uint32_t type, uint32_t stream, std::string_view payload) {
    const size_t at = open_block(out, type, stream);
    out.append(payload);
    close_block(out, at);
}

std::string maps_text(const sym::Registry::ProcessMaps &maps) {
    std::string out = maps.exe + "\n";
    char hex[24];
    for (const auto &f : maps.files) {
        const auto r = std::to_chars(hex, hex + sizeof hex, f.first_exec, 16);
        out.append(hex, r.ptr);
        out += '\t';
        out += f.path;
        out += '\n';
    }
    return out;
}

bool parse_maps(std::string_view text, sym::Registry::ProcessMaps *out) {
    sym::Registry::ProcessMaps m;
    size_t nl = text.find('\n');
    if (nl == std::string_view::npos) return false;
    m.exe = std::string(text.substr(0, nl));
    for (size_t pos = nl + 1; pos < text.size(); pos = nl + 1) {
        nl = text.find('\n', pos);
        if (nl == std::string_view::npos) return false;
        const std::string_view line = text.substr(pos, nl - pos);
        const size_t tab = line.find('\t');
        if (tab == std::string_view::npos) return false;
        sym::Registry::ProcessMaps::File f;
        if (std::from_chars(line.data(), line.data() + tab, f.first_exec, 16).ptr != line.data() + tab) return false;
        f.path = std::string(line.substr(tab + 1));
        m.files.push_back(std::move(f));
    }
    *out = std::move(m);
    return true;
}

size_t Capturer::capture(const RingView &v, std::string &out, size_t max_bytes, uint64_t *lost) {
    const size_t start = out.size();
    new_ids_.clear();
    const RingHeader *h = v.header();
    if (h == nullptr) return 0;
    size_t records = 0;
    uint64_t lost_here = 0;
    std::string names;
    ThreadNames lookup(v);
    size_t block = std::string::npos;
    const auto add_lost = [&](uint64_t ts, uint32_t cpu, uint64_t count) {
        put(out, Entry{ts, cpu, 8, kLost});
        put(out, count);
        lost_here += count;
    };
    // Each buffer in turn, a batch at a time (the report sorts by timestamp), from the one
    // after where the last capture stopped: a thread that writes faster than this reads
    // does not keep the others' buffers from being read.
    const uint32_t first = next_buffer_ % h->buffer_count;
    for (uint32_t k = 0; k < h->buffer_count && out.size() - start < max_bytes; ++k) {
        const uint32_t buffer = (first + k) % h->buffer_count;
        next_buffer_ = buffer + 1;
        while (out.size() - start < max_bytes &&
               ring_consume_batch(v, buffer, max_bytes - (out.size() - start), &batch_)) {
            if (block == std::string::npos) block = open_block(out, kRecords, stream_);
            // The batch's entries written in place: room for each record, its entry and a
            // LOST entry before it, made once (zeroed: the padding), cut to what was used.
            // (Each record's entry is 8 bytes shorter than its ring header; a LOST entry
            // is 24; a loss alone has no bytes in the ring.)
            size_t at = out.size();
            const RingBatch::Record &last = batch_.records.back();
            out.resize(at + last.offset + padded(last.header.size) + batch_.records.size() * 24);
            char *const base = out.data();
            for (const RingBatch::Record &r : batch_.records) {
                const uint64_t ts = r.header.kind == kRecordKind ? ring_time_ns(h, r.header.ts) : last_ts_;
                if (r.lost_before != 0) {
                    const Entry e{ts, r.header.cpu, 8, kLost};
                    std::memcpy(base + at, &e, sizeof e);
                    std::memcpy(base + at + sizeof e, &r.lost_before, 8);
                    at += sizeof e + 8;
                    lost_here += r.lost_before;
                }
                if (r.header.kind != kRecordKind) continue;
                const uint8_t *rec = batch_.bytes.data() + r.offset;
                const uint16_t size = r.header.size;
                const Entry e{ts, r.header.cpu, size, kRecord};
                std::memcpy(base + at, &e, sizeof e);
                std::memcpy(base + at + sizeof e, rec, size);
                last_ts_ = ts;
                ++records;
                CommonHeader c{};
                if (size >= kCommonSize) std::memcpy(&c, rec, kCommonSize);
                if (!ids_seen_[c.type]) {
                    ids_seen_[c.type] = true;
                    new_ids_.push_back(c.type);
                }
                if (c.pid != last_tid_) {
                    last_tid_ = c.pid;
                    // The thread as this pid namespace numbers it (a process in a container
                    // records its own numbers): the capture keeps that number, as the
                    // trace shows it. Its name looked up once per capture, written again
                    // only when it changed.
                    last_here_ = lookup.pid_of(c.pid);
                    if (named_.insert(last_here_).second) {
                        const std::string &name = lookup.of(c.pid);
                        auto [it, added] = names_.try_emplace(last_here_, name);
                        if (added || it->second != name) {
                            it->second = name;
                            names += std::to_string(last_here_) + '\t' + name + '\n';
                        }
                    }
                }
                if (last_here_ != c.pid && size >= kCommonSize)
                    std::memcpy(base + at + sizeof e + offsetof(CommonHeader, pid), &last_here_, sizeof last_here_);
                at += sizeof e + padded(size);
            }
            out.resize(at);
        }
    }
    named_.clear();
    last_tid_ = last_here_ = -1;
    // Emptied: then the records refused without a buffer, as trace_pipe's LOST line.
    if (out.size() - start < max_bytes) {
        if (const uint64_t n = ring_claim_lost_no_buffer(v); n != 0) {
            if (block == std::string::npos) block = open_block(out, kRecords, stream_);
            add_lost(last_ts_, 0, n);
        }
    }
    if (block != std::string::npos) close_block(out, block);
    if (!names.empty()) append_block(out, kNames, stream_, names);
    if (lost != nullptr) *lost += lost_here;
    return records;
}

uint64_t lost_in(std::string_view blocks) {
    uint64_t lost = 0;
    for (size_t pos = 0; blocks.size() - pos >= sizeof(BlockHeader);) {
        BlockHeader b{};
        std::memcpy(&b, blocks.data() + pos, sizeof b);
        const size_t body = pos + sizeof b;
        if (b.size > blocks.size() - body) break;
        for (size_t p = 0; b.type == kRecords && b.size - p >= sizeof(Entry);) {
            Entry e{};
            std::memcpy(&e, blocks.data() + body + p, sizeof e);
            p += sizeof e;
            if (e.kind == kLost && b.size - p >= 8) {
                uint64_t n = 0;
                std::memcpy(&n, blocks.data() + body + p, sizeof n);
                lost += n;
            }
            p += padded(e.size);
        }
        pos = body + padded(b.size);
    }
    return lost;
}

namespace {

int fail(std::string *why, std::string text) {
    if (why != nullptr) *why = std::move(text);
    return -EPROTO;
}

// "TID\tNAME\n" lines (kNames) and "PID\tCOMM\n" (kStream).
bool parse_names(std::string_view text, std::unordered_map<int32_t, std::string> *out) {
    for (size_t pos = 0; pos < text.size();) {
        const size_t nl = text.find('\n', pos);
        if (nl == std::string_view::npos) return false;
        const std::string_view line = text.substr(pos, nl - pos);
        const size_t tab = line.find('\t');
        int32_t tid = 0;
        if (tab == std::string_view::npos ||
            std::from_chars(line.data(), line.data() + tab, tid).ptr != line.data() + tab)
            return false;
        (*out)[tid] = std::string(line.substr(tab + 1));
        pos = nl + 1;
    }
    return true;
}

} // namespace

int read_file(const uint8_t *data, size_t size, File *out, std::string *why) {
    FileHeader h{};
    if (size < sizeof h) return fail(why, "not a capture file (too short)");
    std::memcpy(&h, data, sizeof h);
    if (std::memcmp(h.magic, kMagic, sizeof kMagic) != 0) return fail(why, "not a capture file of ukprobe record");
    if (h.version != kVersion)
        return fail(why, "capture file version " + std::to_string(h.version) + "; this ukprobe reads version " +
                             std::to_string(kVersion));
    if (h.header_size < sizeof h || h.header_size > size) return fail(why, "capture file header damaged");
    File f;
    std::string cut;
    for (size_t pos = padded(h.header_size); pos < size;) {
        BlockHeader b{};
        if (size - pos < sizeof b) {
            cut = "cut short";
            break;
        }
        std::memcpy(&b, data + pos, sizeof b);
        const size_t body = pos + sizeof b;
        if (b.size > size - body) {
            cut = "cut short";
            break;
        }
        const std::string_view text(reinterpret_cast<const char *>(data + body), b.size);
        const std::string where = " at byte " + std::to_string(pos);
        auto it = f.streams.find(b.stream);
        if (b.type == kStream) {
            std::unordered_map<int32_t, std::string> line;
            if (!parse_names(text, &line) || line.size() != 1) return fail(why, "damaged stream block" + where);
            Stream &s = f.streams[b.stream];
            s.pid = line.begin()->first;
            s.comm = line.begin()->second;
        } else if (it == f.streams.end()) {
            if (b.type >= kEvents && b.type <= kRecords) return fail(why, "block of an undeclared stream" + where);
            // A block type of a later version: skipped.
        } else if (b.type == kEvents) {
            std::map<uint16_t, EventInfo> table;
            std::string bad;
            if (parse_event_table(text, &table, &bad) != 0)
                return fail(why, "damaged event table" + where + ": " + bad);
            for (auto &[id, info] : table) it->second.events[id] = std::move(info);
        } else if (b.type == kMaps) {
            if (!parse_maps(text, &it->second.maps)) return fail(why, "damaged maps block" + where);
        } else if (b.type == kNames) {
            if (!parse_names(text, &it->second.names)) return fail(why, "damaged names block" + where);
        } else if (b.type == kRecords) {
            for (size_t p = 0; p < b.size;) {
                Entry e{};
                if (b.size - p < sizeof e) return fail(why, "damaged records block" + where);
                std::memcpy(&e, text.data() + p, sizeof e);
                p += sizeof e;
                if (padded(e.size) > b.size - p || (e.kind == kLost && e.size != 8))
                    return fail(why, "damaged records block" + where);
                f.items.push_back(Item{e.ts, b.stream, e.cpu, e.kind, e.size, data + body + p});
                p += padded(e.size);
            }
        }
        pos = body + padded(b.size);
    }
    std::stable_sort(f.items.begin(), f.items.end(), [](const Item &a, const Item &b) { return a.ts < b.ts; });
    *out = std::move(f);
    if (!cut.empty() && why != nullptr)
        *why = "the capture file is " + cut + " (its recorder was killed?): read up to its last whole block";
    return 0;
}

} // namespace ukp::trace::capture
