// Hist triggers: `hist:keys=...[:values=...][:sort=...][:size=N][:pause][:cont][:clear]
// [if FILTER]`, aggregated into a table preallocated when the trigger is written, and
// printed as the kernel's `hist` file.
//
// The table follows the kernel's tracing_map: size (a power of two, 128..131072, default
// 2048) elements and twice as many buckets. A hit hashes its key, claims an empty bucket
// with a compare-and-swap on its hash word, takes the next free element with one atomic
// increment and publishes it; values are summed with atomic adds. No lock, no allocation.
// When every element is taken a new key is counted in Dropped, as the kernel does. A hit
// whose bucket another hit is still filling in waits a little, then passes it over where
// the kernel drops (its inserters are never preempted; threads here are): the reader adds
// up a key made twice (hist_table.hpp).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "trace/filter.hpp"
#include "trace/record.hpp"

namespace ukp::trace {

struct HistTable; // one generation of the table; :clear publishes a fresh one

class HistTrigger {
public:
    // One key or value of the trigger.
    struct Column {
        std::string name;     // the event field, "common_pid", or "hitcount"
        std::string modifier; // "", "hex", "sym", "sym-offset", "execname", "log2", "buckets"
        enum Mod : uint8_t { kNone, kHex, kSym, kSymOffset, kExecname, kLog2, kBuckets };
        Mod mod = kNone;      // `modifier` decoded, for the hit path
        uint64_t buckets = 0; // for .buckets=N
        bool is_string = false;
        bool is_signed = false;
        uint32_t offset = 0;  // of the field in the record
        uint32_t size = 0;    // bytes of the field (4 for a __data_loc word)
        uint32_t key_off = 0; // keys: offset in the packed key; values: index of the sum
        uint32_t key_len = 0; // keys: bytes in the packed key (8, or kMaxStringKey)
    };
    struct SortKey {
        int column = -1; // -1: hitcount; else index in keys (is_key) or values
        bool is_key = false;
        bool descending = false;
        std::string text; // as the trigger file prints it
    };

    ~HistTrigger();

    // Parses the part after "hist:" (and the filter after " if ", null for none).
    // Returns null and *err on a bad trigger (positions are offsets in `spec`, plus
    // spec_pos, the offset of spec in what the user wrote).
    static std::unique_ptr<HistTrigger> parse(std::string_view spec, int spec_pos, std::unique_ptr<Filter> filter,
                                              const std::vector<Field> &fields, FilterError *err);

    // Hit path (the filter already matched).
    void update(const uint8_t *rec, uint32_t size, const char *comm) noexcept;

    // "hist:keys=...:vals=...:sort=...:size=N[ if FILTER] [active]" (no newline).
    std::string spec_text() const;
    // One histogram of the hist file: header comment, entries, Totals.
    std::string show(const Symbolizer &sym) const;

    // Same keys, values, sort and filter: the kernel's notion of "the same" hist trigger.
    bool same_as(const HistTrigger &o) const;
    bool pause_flag() const { return want_pause_; }
    bool cont_flag() const { return want_cont_; }
    bool clear_flag() const { return want_clear_; }
    void set_paused(bool p) { paused_.store(p, std::memory_order_release); }
    bool paused() const { return paused_.load(std::memory_order_acquire); }
    // Publishes an empty table; the old one is retired (a hit may still be inside it).
    void clear();
    const Filter *filter() const { return filter_.get(); }

    uint64_t hits() const;
    uint64_t drops() const;

    static constexpr uint32_t kMaxStringKey = 256; // the kernel's MAX_FILTER_STR_VAL

private:
    HistTrigger() = default;

    std::vector<Column> keys_;
    std::vector<Column> vals_; // vals_[0] is hitcount
    std::vector<SortKey> sort_;
    uint32_t size_ = 2048;                                             // elements; buckets are twice as many
    uint32_t key_bytes_ = 0;                                           // packed key size
    bool want_pause_ = false, want_cont_ = false, want_clear_ = false; // as written
    std::atomic<bool> paused_{false};
    std::unique_ptr<Filter> filter_;
    std::atomic<HistTable *> table_{nullptr};        // what update() uses
    mutable std::mutex mu_;                          // clear() and show()
    std::vector<std::unique_ptr<HistTable>> tables_; // current and retired
};

} // namespace ukp::trace
