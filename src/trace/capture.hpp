// The capture file: what `ukprobe record` writes and `ukprobe report` reads (docs/cli.md,
// "record and report"). The records as the rings held them, with what printing them
// later takes: each process's event table, the objects it mapped, its threads' names.
// Nothing is formatted while the program runs.
//
// The file is a FileHeader, then blocks, each a BlockHeader and `size` bytes padded to 8.
// A block belongs to a stream: the records of one process image (its ring), numbered
// from 1 in the order streams were met. Blocks of several streams interleave; the
// entries of a Records block come a thread's buffer at a time, each buffer's in
// timestamp order. The report sorts them all by timestamp.
//   kStream   "PID\tCOMM\n": the stream's process, once, before its other blocks
//   kEvents   an event table (print.hpp's text): the events of the stream's records; a
//             later table adds to the earlier ones (ids are never reused in an image)
//   kMaps     the objects the process maps (FIRST_EXEC_HEX\tPATH lines, the main
//             program's path first on a line of its own); replaces the earlier one
//   kNames    "TID\tNAME\n" lines: thread names, as the stream saw them
//   kRecords  entries: an Entry, then `size` bytes (the record, common_type first)
//             padded to 8; kind kLost carries an 8-byte count instead (a LOST line)
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "symbols/symbols.hpp"
#include "trace/print.hpp"
#include "trace/ring.hpp"

namespace ukp::trace::capture {

inline constexpr char kMagic[8] = {'U', 'K', 'P', 'C', 'A', 'P', 'T', '1'};
inline constexpr uint32_t kVersion = 1;

struct FileHeader {
    char magic[8];
    uint32_t version;
    uint32_t header_size; // sizeof(FileHeader): where the first block is
};
static_assert(sizeof(FileHeader) == 16);

enum BlockType : uint32_t { kStream = 1, kEvents = 2, kMaps = 3, kNames = 4, kRecords = 5 };

struct BlockHeader {
    uint32_t type;
    uint32_t stream;
    uint64_t size; // bytes after the header, before the padding
};
static_assert(sizeof(BlockHeader) == 16);

inline constexpr uint16_t kRecord = 0, kLost = 1;

struct Entry {
    uint64_t ts; // CLOCK_MONOTONIC ns
    uint32_t cpu;
    uint16_t size; // bytes after the entry, before the padding (8 for kLost)
    uint16_t kind; // kRecord or kLost
};
static_assert(sizeof(Entry) == 16);

// The file's first bytes.
std::string file_header();

// Appends a block of `type` for `stream` holding `payload`.
void append_block(std::string &out, uint32_t type, uint32_t stream, std::string_view payload);

// The text of a kMaps block, and back (false: not one).
std::string maps_text(const sym::Registry::ProcessMaps &maps);
bool parse_maps(std::string_view text, sym::Registry::ProcessMaps *out);

// One process image's ring, captured: consumes records of a view into kRecords blocks,
// with kNames blocks for threads not named before. Not thread-safe.
class Capturer {
public:
    // The caller writes the kStream block, and kEvents and kMaps blocks as the table and
    // the objects change. Records of an event no table has are kept: the report prints
    // them as the trace does ("Unknown event").
    Capturer(uint32_t stream, int32_t pid) : stream_(stream), pid_(pid) {}
    uint32_t stream() const { return stream_; }
    // Consumes records, a buffer at a time, while `out` grew by less than max_bytes (a
    // batch may pass it by one record), as blocks.
    // Returns the records consumed; *lost (when given) gets the events counted lost among
    // them (kLost entries).
    size_t capture(const RingView &v, std::string &out, size_t max_bytes, uint64_t *lost = nullptr);

    // Event ids met for the first time by the last capture (the caller makes sure its
    // table has them).
    const std::vector<uint16_t> &new_ids() const { return new_ids_; }

private:
    const uint32_t stream_;
    std::vector<bool> ids_seen_ = std::vector<bool>(65536);
    std::vector<uint16_t> new_ids_;
    const int32_t pid_;
    std::unordered_map<int32_t, std::string> names_; // the names written, by thread
    uint64_t last_ts_ = 0; // of the last record: a LOST entry with no record after it takes it
    RingBatch batch_;
    std::unordered_set<int32_t> named_; // threads named in this capture
    int32_t last_tid_ = -1;             // of the last record (most follow one of the same thread)
    int32_t last_here_ = -1;            // last_tid_ as the reader's pid namespace numbers it
    uint32_t next_buffer_ = 0;          // where the next capture starts
};

// ---- Reading a capture file ----

struct Stream {
    int32_t pid = 0;
    std::string comm;
    std::map<uint16_t, EventInfo> events;
    sym::Registry::ProcessMaps maps;
    std::unordered_map<int32_t, std::string> names;
};

// One entry of the file, where it lies.
struct Item {
    uint64_t ts;
    uint32_t stream;
    uint32_t cpu;
    uint16_t kind;
    uint16_t size;
    const uint8_t *data; // the record (kRecord) or the 8-byte count (kLost)
};

struct File {
    std::map<uint32_t, Stream> streams;
    std::vector<Item> items; // in timestamp order (stable: the file's order for equal ones)
};

// The events a chunk of whole blocks counts lost (its kLost entries).
uint64_t lost_in(std::string_view blocks);

// Parses a capture file's bytes (which must outlive *out). 0, or -EPROTO with *why set
// (not a capture file, another version, a block cut short). A file cut short after whole
// blocks (the recorder killed) is read up to its last whole block, *why saying so.
int read_file(const uint8_t *data, size_t size, File *out, std::string *why);

} // namespace ukp::trace::capture
