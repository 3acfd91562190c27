// The file and load bias of an object this test process has loaded, found by a part of its
// path ("/libc.so.6"): what the tests of the agent's per-object tables start from.
#pragma once

#include <cstdint>
#include <cstring>
#include <link.h>
#include <string>

namespace ukp::testing {

struct LoadedObject {
    std::string path; // empty if none is loaded
    uint64_t bias = 0;
};

inline LoadedObject find_loaded(const char *part) {
    struct Search {
        const char *part;
        LoadedObject found;
    } s{part, {}};
    dl_iterate_phdr(
        [](dl_phdr_info *info, size_t, void *data) {
            auto *s = static_cast<Search *>(data);
            if (info->dlpi_name == nullptr || std::strstr(info->dlpi_name, s->part) == nullptr) return 0;
            s->found.path = info->dlpi_name;
            s->found.bias = info->dlpi_addr;
            return 1;
        },
        &s);
    return s.found;
}

} // namespace ukp::testing
