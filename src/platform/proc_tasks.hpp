// The process's threads and their /proc files, read with straight system calls and no C
// library function (no opendir, snprintf or strtol): the agent's threads read them while
// an event may be arming every function of libc, and each call of a function whose int3
// is in and whose jump is not yet traps (the spawn gate looks at each thread every
// millisecond of such an arming; the optimizer at each of its passes).
#pragma once

#include "platform/raw_syscall.hpp"

#include <cstddef>
#include <cstdint>
#include <fcntl.h>
#include <sys/syscall.h>

namespace ukp::platform {

// Calls f(tid) for each thread of the process, the caller's included, until f returns
// false. False if /proc/self/task cannot be read.
template <class F>
bool for_each_thread(F &&f) {
    const long fd = raw_syscall(SYS_openat, AT_FDCWD, reinterpret_cast<long>("/proc/self/task"),
                                O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return false;
    alignas(8) char buf[2048];
    bool more = true;
    for (;;) {
        const long n = raw_syscall(SYS_getdents64, fd, reinterpret_cast<long>(buf), sizeof buf);
        if (n <= 0) break;
        for (long at = 0; at < n && more;) {
            // struct linux_dirent64: d_ino (8), d_off (8), d_reclen (2), d_type (1), d_name.
            const unsigned short reclen = *reinterpret_cast<const unsigned short *>(buf + at + 16);
            const char *name = buf + at + 19;
            int tid = 0;
            while (*name >= '0' && *name <= '9') tid = tid * 10 + (*name++ - '0');
            if (tid > 0 && *name == '\0') more = f(tid);
            at += reclen;
        }
        if (!more) break;
    }
    raw_syscall(SYS_close, fd);
    return true;
}

// /proc/self/task/TID/LEAF into buf, NUL-terminated (at most size - 1 bytes): its length,
// or -errno.
long read_task_file(int tid, const char *leaf, char *buf, size_t size);

// The decimal number (an optional '-' first) at *p, *p moved past it.
long parse_decimal(const char **p);
// The hexadecimal number (an optional "0x" first) at *p, *p moved past it.
uint64_t parse_hex(const char **p);
// Whether s starts with prefix.
bool starts_with(const char *s, const char *prefix);
// The first occurrence of needle in s, or null.
const char *find_text(const char *s, const char *needle);

} // namespace ukp::platform
