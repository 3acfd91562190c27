#include "memfds.hpp"

#include "proc.hpp"

#include "trace/counters.hpp"
#include "trace/profile_table.hpp"
#include "trace/ring.hpp"

#include <fmt/core.h>

#include <cstdlib>
#include <cstring>
#include <dirent.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace ukprobe {

namespace {

// A memfd of the agent of `pid` whose name starts with `prefix`, taken from the process
// (pidfd_getfd through `pidfd`: ukprobe is its ancestor), for which `own` says the process
// is `pid` itself (a child of fork() also holds its parent's); -1 if none. *number, when
// given, is its descriptor there.
template <typename Own>
int memfd_of(int pid, int pidfd, const char *prefix, Own own, int *number = nullptr) {
    int found = -1;
    const std::string dir = fmt::format("/proc/{}/fd", pid);
    if (DIR *d = opendir(dir.c_str())) {
        while (const dirent *e = readdir(d)) {
            char link[128] = {};
            const std::string path = dir + "/" + e->d_name;
            if (readlink(path.c_str(), link, sizeof link - 1) <= 0 || strncmp(link, prefix, strlen(prefix)) != 0)
                continue;
            const int fd = static_cast<int>(syscall(SYS_pidfd_getfd, pidfd, atoi(e->d_name), 0));
            if (fd < 0) continue;
            if (own(fd)) {
                found = fd;
                if (number != nullptr) *number = atoi(e->d_name);
                break;
            }
            close(fd);
        }
        closedir(d);
    }
    return found;
}

} // namespace

int ring_of(int pid, int pidfd, int *number) {
    // The agent writes its process's number in its own pid namespace.
    const int self = own_number(pid);
    return memfd_of(
        pid, pidfd, "/memfd:ukprobes-trace",
        [self](int fd) {
            ukp::trace::RingHeader h{};
            return pread(fd, &h, sizeof h, 0) == static_cast<ssize_t>(sizeof h) && h.magic == ukp::trace::kRingMagic &&
                   h.pid == self;
        },
        number);
}

int counters_of(int pid, int pidfd) {
    const int self = own_number(pid);
    return memfd_of(pid, pidfd, "/memfd:ukprobes-counters", [self](int fd) {
        ukp::trace::CountersHeader h{};
        constexpr size_t kFixed = offsetof(ukp::trace::CountersHeader, table_seq);
        return pread(fd, &h, kFixed, 0) == static_cast<ssize_t>(kFixed) && h.magic == ukp::trace::kCountersMagic &&
               h.pid == self;
    });
}

bool SharedCounts::map(int fd) {
    unmap();
    struct stat st {};
    if (fd < 0) return false;
    if (fstat(fd, &st) != 0 || st.st_size <= 0) {
        close(fd);
        return false;
    }
    void *p = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_SHARED | MAP_NORESERVE, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return false;
    base_ = static_cast<const uint8_t *>(p);
    size_ = static_cast<size_t>(st.st_size);
    return true;
}

std::string SharedCounts::read(std::string *why) const { return ukp::trace::read_profile(base_, size_, why); }

void SharedCounts::unmap() {
    if (base_ != nullptr) munmap(const_cast<uint8_t *>(base_), size_);
    base_ = nullptr;
    size_ = 0;
}

} // namespace ukprobe
