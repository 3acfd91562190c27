// The event the trace fuzzers filter and trigger on: the common fields, then the fields
// of a probe with a few typed arguments, laid out as record.hpp describes.
#pragma once

#include "trace/record.hpp"

#include <cstdint>
#include <cstring>
#include <vector>

namespace ukp::fuzz {

// Offsets: common 0..8, __probe_ip 8, arg1 u64 16, arg2 s32 24, name string 28,
// c char 32, arr u16[4] 33, stk (a synthetic event's stack, __data_loc) 41, then the
// string's data (the stack's too).
inline constexpr uint32_t kFixedRecordSize = 45;

inline std::vector<trace::Field> probe_fields() {
    using trace::Field;
    using trace::Print;
    std::vector<Field> f = trace::common_fields();
    f.push_back({"__probe_ip", "unsigned long", 8, 8, false, Print::kHex, 0, false});
    f.push_back({"arg1", "u64", 16, 8, false, Print::kUnsigned, 0, false});
    f.push_back({"arg2", "s32", 24, 4, true, Print::kSigned, 0, false});
    f.push_back({"name", "__data_loc char[]", 28, 4, false, Print::kString, 0, false});
    f.push_back({"c", "char", 32, 1, true, Print::kChar, 0, false});
    f.push_back({"arr", "u16", 33, 2, false, Print::kUnsigned, 4, false});
    f.push_back({"stk", "__data_loc unsigned long[]", 41, 4, false, Print::kStack, 0, false});
    return f;
}

// A record of at least kFixedRecordSize bytes from arbitrary bytes; the string field
// points at the bytes after the fixed part (or, as the input says, anywhere).
inline std::vector<uint8_t> make_record(const uint8_t *data, size_t size) {
    std::vector<uint8_t> rec(data, data + size);
    if (rec.size() < kFixedRecordSize + 8) rec.resize(kFixedRecordSize + 8, 'a');
    if (rec.size() > trace::kMaxRecordSize) rec.resize(trace::kMaxRecordSize);
    if (!(rec[0] & 1)) {
        const uint32_t len = static_cast<uint32_t>(rec.size() - kFixedRecordSize);
        const uint32_t loc = (len << 16) | kFixedRecordSize;
        std::memcpy(rec.data() + 28, &loc, 4);
        rec.back() = 0;
    }
    if (!(rec[0] & 2)) { // the stack's addresses: the same bytes, whole words of them
        const uint32_t len = static_cast<uint32_t>(rec.size() - kFixedRecordSize) & ~7u;
        const uint32_t loc = (len << 16) | kFixedRecordSize;
        std::memcpy(rec.data() + 41, &loc, 4);
    }
    return rec;
}

} // namespace ukp::fuzz
