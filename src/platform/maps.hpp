// The mappings of a process, as /proc/PID/maps lists them: the one reader of that file.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ukp::platform {

// One line of /proc/PID/maps.
struct Mapping {
    uint64_t start = 0, end = 0; // [start, end)
    uint64_t offset = 0;         // the file offset mapped at start
    uint64_t inode = 0;          // 0 for anonymous memory
    char perms[5] = {};          // "r-xp"
    std::string_view path;       // "" when anonymous, "[vdso]", "/memfd:NAME (deleted)"...;
                                 // valid only during the visit
    bool readable() const { return perms[0] == 'r'; }
    bool writable() const { return perms[1] == 'w'; }
    bool executable() const { return perms[2] == 'x'; }
    bool in_file() const { return !path.empty() && path[0] == '/'; }
};

using MappingVisitor = bool (*)(void *context, const Mapping &m);

// Calls visit(context, m) for each mapping of process `pid` (0: this process), in address
// order, until it returns false. False when the file cannot be read (no such process).
bool visit_mappings(int pid, MappingVisitor visit, void *context);

// The same, with any callable `bool(const Mapping &)`.
template <typename F>
bool for_each_mapping(int pid, F &&visit) {
    return visit_mappings(
        pid, [](void *f, const Mapping &m) { return (*static_cast<F *>(f))(m); }, &visit);
}

// A mapping kept beyond the visit.
struct OwnedMapping {
    uint64_t start = 0, end = 0, offset = 0, inode = 0;
    char perms[5] = {};
    std::string path;
};

// Every mapping of process `pid` (0: this process); empty when the file cannot be read.
std::vector<OwnedMapping> read_mappings(int pid);

// One line parsed (without its newline); false when it is not a maps line.
bool parse_mapping(std::string_view line, Mapping *out);

} // namespace ukp::platform
