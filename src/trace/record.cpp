#include "trace/record.hpp"

namespace ukp::trace {

std::vector<Field> common_fields() {
    // As every ftrace event's format file lists them (struct trace_entry).
    return {
        {"common_type", "unsigned short", 0, 2, false, Print::kUnsigned, 0, true},
        {"common_flags", "unsigned char", 2, 1, false, Print::kUnsigned, 0, true},
        {"common_preempt_count", "unsigned char", 3, 1, false, Print::kUnsigned, 0, true},
        {"common_pid", "int", 4, 4, true, Print::kSigned, 0, true},
    };
}

} // namespace ukp::trace
