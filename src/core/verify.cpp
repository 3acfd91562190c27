// ukp_verify(): the process's code against its files, probes aside (issue: byte-exact
// restoration). Off the hit path.
#include "core/core.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <link.h>
#include <string>
#include <unistd.h>
#include <vector>

namespace ukp::core {

namespace {

struct Segment {
    std::string path;   // the file, "" for the vdso (no file: not compared)
    std::string name;   // for the report
    uint64_t start = 0; // run-time address
    uint64_t file_offset = 0;
    uint64_t size = 0; // bytes backed by the file
};

int collect(dl_phdr_info *info, size_t, void *arg) {
    auto *out = static_cast<std::vector<Segment> *>(arg);
    std::string path = info->dlpi_name != nullptr ? info->dlpi_name : "";
    if (path.rfind("linux-vdso", 0) == 0 || path.rfind("linux-gate", 0) == 0) return 0;
    std::string shown = path;
    if (path.empty()) {
        // The main program: read through /proc/self/exe, named by what it links to.
        path = "/proc/self/exe";
        char target[4096];
        const ssize_t n = readlink(path.c_str(), target, sizeof target - 1);
        shown = n > 0 ? std::string(target, static_cast<size_t>(n)) : path;
    }
    const size_t slash = shown.rfind('/');
    const std::string name = shown.substr(slash == std::string::npos ? 0 : slash + 1);
    for (int i = 0; i < info->dlpi_phnum; ++i) {
        const ElfW(Phdr) &ph = info->dlpi_phdr[i];
        if (ph.p_type != PT_LOAD || !(ph.p_flags & PF_X)) continue;
        out->push_back({path, name, info->dlpi_addr + ph.p_vaddr, ph.p_offset, ph.p_filesz});
    }
    return 0;
}

} // namespace

int verify(std::string *report) {
    // Islands the optimizer still has to put back (after a detach) go back first.
    optimizer_flush_for(std::chrono::milliseconds(1000));
    std::vector<Segment> segments;
    dl_iterate_phdr(collect, &segments);
    int differing = 0;
    std::vector<uint8_t> file, memory;
    for (const Segment &seg : segments) {
        const int fd = open(seg.path.c_str(), O_RDONLY | O_CLOEXEC);
        if (fd < 0) continue; // a deleted or unreadable file: nothing to compare with
        file.resize(seg.size);
        const ssize_t n = pread(fd, file.data(), seg.size, static_cast<off_t>(seg.file_offset));
        close(fd);
        if (n != static_cast<ssize_t>(seg.size)) continue;
        memory.resize(seg.size);
        // The code and what the points own in it at one moment: the optimizer writes its
        // jmps and islands under the registry mutex, and may still be at work (the flush
        // above is bounded).
        std::vector<std::pair<uint64_t, uint8_t>> armed;
        {
            std::lock_guard lock(registry_mutex());
            if (ukp_safe_copy(memory.data(), reinterpret_cast<const void *>(seg.start), seg.size) != 0) continue;
            armed = armed_bytes();
        }
        // An armed probe's byte counts as its original.
        for (auto it = std::lower_bound(armed.begin(), armed.end(), std::make_pair(seg.start, uint8_t{0}));
             it != armed.end() && it->first < seg.start + seg.size; ++it)
            memory[it->first - seg.start] = it->second;
        for (uint64_t i = 0; i < seg.size;) {
            if (memory[i] == file[i]) {
                ++i;
                continue;
            }
            uint64_t j = i;
            while (j < seg.size && memory[j] != file[j]) ++j;
            differing += static_cast<int>(j - i);
            if (report != nullptr)
                *report +=
                    fmt::format("{:016x}  {}+0x{:x}  {} bytes\n", seg.start + i, seg.name, seg.file_offset + i, j - i);
            i = j;
        }
    }
    return differing;
}

} // namespace ukp::core

extern "C" int ukp_verify(char **report) {
    std::string text;
    const int n = ukp::core::verify(report != nullptr ? &text : nullptr);
    if (report != nullptr) {
        *report = static_cast<char *>(std::malloc(text.size() + 1));
        if (*report == nullptr) return -ENOMEM;
        std::memcpy(*report, text.c_str(), text.size() + 1);
    }
    return n;
}
