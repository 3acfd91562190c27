// The binary record of a trace event, and the descriptions of its fields: the contract
// between the parts of the trace layer (definitions and fetch programs, the ring and the
// event files, filters, triggers and histograms).
//
// A record is laid out exactly as the event's `format` file prints it, as ftrace lays it
// out: the common fields, then the probe's own fields (__probe_ip, or __probe_func and
// __probe_ret_ip for a return probe), then one field per fetch argument, packed in order
// with no padding (the kernel's trace_probe does the same), then the dynamic data of
// string fields. A string field holds a __data_loc word: (length << 16) | offset, the
// offset counted from the start of the record, the length including the terminating NUL.
//
// The ring keeps its own header (timestamp, size, CPU) in front of each record;
// what is described here starts at the record's common_type.
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

namespace ukp::trace {

// The common fields every record starts with (ftrace's struct trace_entry).
struct CommonHeader {
    uint16_t type;         // the event's id (its `id` file)
    uint8_t flags;         // ftrace's irqs-off/need-resched/... bits: always 0 in user space
    uint8_t preempt_count; // always 0 in user space
    int32_t pid;           // the thread id of the thread that hit the probe
};
static_assert(sizeof(CommonHeader) == 8);
inline constexpr uint32_t kCommonSize = sizeof(CommonHeader);

// The largest record the ring takes, dynamic data included.
inline constexpr uint32_t kMaxRecordSize = 4096;
// The largest record an event writes: what the kernel's ring buffer takes with 4 KiB pages
// (BUF_MAX_DATA_SIZE: the page less its 16-byte header and the event's 8-byte header). The
// kernel drops an event whose record would be larger (trace_event_buffer_reserve fails).
inline constexpr uint32_t kMaxEventSize = 4072;

// How a field's value is printed in the trace text and compared by filters.
enum class Print : uint8_t {
    kUnsigned, // u8..u64, bitfields: decimal
    kSigned,   // s8..s64: decimal
    kHex,      // x8..x64, and arguments without a type: 0x...
    kChar,     // char: the character
    kString,   // string, ustring, symstr, $comm, "immediate": a __data_loc word, printed "..."
    kSymbol,   // symbol: an address, printed sym+0xoff by the reader
    kStack,    // a __data_loc array of addresses (a synthetic stack): "STACK:", then "=> sym" a line
};

// One field of a record, as the `format` file describes it.
struct Field {
    std::string name;    // as in the format file and in filters ("arg1", "__probe_ip")
    std::string c_type;  // as the format file prints the type ("u64", "s32",
                         // "__data_loc char[]", "unsigned long", "int")
    uint32_t offset = 0; // from the start of the record
    uint32_t size = 0;   // of one element in bytes (4 for a __data_loc word)
    bool is_signed = false;
    Print print = Print::kHex;
    uint32_t array_len = 0; // 0 for a scalar; N for an array of N elements of `size` bytes
    bool common = false;    // one of the common fields (printed before the blank line)
};

// Address -> symbol text: "name" or, with_offset, "name+0x1a/0x40" (hist's .sym and
// .sym-offset, the trace's probe addresses and `symbol` values). An empty answer prints
// the address as hex, as the kernel does for an unknown address.
using Symbolizer = std::function<std::string(uint64_t addr, bool with_offset)>;

// The common fields, in order, as every event's format file lists them first.
std::vector<Field> common_fields();

// The value of an integer field (element `index` of an array) of `rec`, sign-extended
// when the field is signed. The caller has checked that the field lies in the record.
inline uint64_t load_integer(const uint8_t *rec, const Field &f, uint32_t index = 0) {
    const uint8_t *p = rec + f.offset + index * f.size;
    switch (f.size) {
    case 1: {
        uint8_t v;
        std::memcpy(&v, p, 1);
        return f.is_signed ? uint64_t(int64_t(int8_t(v))) : v;
    }
    case 2: {
        uint16_t v;
        std::memcpy(&v, p, 2);
        return f.is_signed ? uint64_t(int64_t(int16_t(v))) : v;
    }
    case 4: {
        uint32_t v;
        std::memcpy(&v, p, 4);
        return f.is_signed ? uint64_t(int64_t(int32_t(v))) : v;
    }
    default: {
        uint64_t v;
        std::memcpy(&v, p, 8);
        return v;
    }
    }
}

// The string a __data_loc field (element `index`) points to, or null when the word
// points outside the record of `size` bytes. *len receives its length without the NUL.
inline const char *load_string(const uint8_t *rec, uint32_t size, const Field &f, uint32_t *len, uint32_t index = 0) {
    uint32_t loc;
    std::memcpy(&loc, rec + f.offset + index * 4, 4);
    const uint32_t off = loc & 0xffff, n = loc >> 16;
    if (n == 0 || off + n > size) return nullptr;
    *len = n - 1;
    return reinterpret_cast<const char *>(rec + off);
}

} // namespace ukp::trace
