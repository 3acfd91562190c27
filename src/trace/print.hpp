// A record as the trace shows it ("EVENT: (SYM+OFF/SIZE) a=1"), and the event table that
// printing needs. Shared by the agent (its own trace files) and the CLI, which maps the
// ring and formats the records itself (docs/cli.md, "Protocol").
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "trace/record.hpp"

namespace ukp::sym {
struct Object;
}

namespace ukp::trace {

inline constexpr uint16_t kStackEventId = 12; // the kernel's TRACE_USER_STACK (stacktrace trigger)

// What printing one event's records takes: a line of the event table.
struct EventInfo {
    uint16_t id = 0; // common_type of its records, its id file
    std::string group, name;
    bool is_return = false;    // kretprobe: __probe_func, __probe_ret_ip
    std::vector<Field> fields; // common fields first, as the format file
    std::string print_fmt;     // the format file's print fmt line
    std::string attached_to;   // an event probe's (e:): "GRP.EVENT" it is on; no probe field then
    bool synthetic = false;    // a synthetic event: its fields alone ("lat=5 pid=7")
};

// The event of a record's common_type, or null when there is none (printed "Unknown event N").
using EventLookup = std::function<const EventInfo *(uint16_t id)>;

// Prints the event's part of a record's trace line. No newline: the caller adds it.
void print_record(const uint8_t *rec, uint32_t size, const EventLookup &find, const Symbolizer &sym, std::string &out);
// The text of element `index` of field f of a record.
void print_field_value(const uint8_t *rec, uint32_t size, const Field &f, uint32_t index, const Symbolizer &sym,
                       std::string &out);

// "sym+0xoff/0xsize" (with_size) or "sym" for the symbol holding addr among objects
// (data symbols too), or "" when none does.
std::string symbol_text(const std::vector<std::shared_ptr<const sym::Object>> &objects, uint64_t addr, bool with_size);

// symbol_text's answers by address, kept while the objects they came from stay the same:
// a trace names a few probe addresses over and over, and each lookup searches every
// object's table in turn. At most kMax answers (then it starts again).
class SymbolTexts {
public:
    const std::string *find(uint64_t addr, bool with_size) const {
        const auto it = texts_.find(key(addr, with_size));
        return it != texts_.end() ? &it->second : nullptr;
    }
    void keep(uint64_t addr, bool with_size, const std::string &text) {
        if (texts_.size() >= kMax) texts_.clear();
        texts_.emplace(key(addr, with_size), text);
    }
    void clear() { texts_.clear(); }

private:
    static constexpr size_t kMax = 1 << 16;
    // Bit 63 says with the size: no user address has it.
    static uint64_t key(uint64_t addr, bool with_size) { return addr | (with_size ? 1ull << 63 : 0); }
    std::unordered_map<uint64_t, std::string> texts_;
};
// "0x1a2b": how an address no symbol holds is printed.
std::string hex_address(uint64_t addr);

// The event table (the agent's event_table file): a versioned text a reader in another
// process parses to print records.
//   ukprobes-event-table 1
//   event <TAB> ID <TAB> GROUP <TAB> NAME <TAB> p|r
//   field <TAB> NAME <TAB> C_TYPE <TAB> OFFSET <TAB> SIZE <TAB> SIGNED <TAB> PRINT <TAB> ARRAY_LEN <TAB> COMMON
//   fmt <TAB> PRINT_FMT
// PRINT is unsigned, signed, hex, char, string or symbol. Fields and fmt belong to the
// event line above them.
inline constexpr int kEventTableVersion = 2;
std::string event_table_text(const std::vector<const EventInfo *> &events);
// 0, or -EPROTO (another version, or a line this version does not know) with *why set.
int parse_event_table(std::string_view text, std::map<uint16_t, EventInfo> *out, std::string *why);

} // namespace ukp::trace
