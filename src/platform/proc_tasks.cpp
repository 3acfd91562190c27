#include "platform/proc_tasks.hpp"

namespace ukp::platform {

long read_task_file(int tid, const char *leaf, char *buf, size_t size) {
    if (size == 0) return -22; // EINVAL
    // "/proc/self/task/" TID "/" LEAF, by hand.
    char path[96];
    size_t at = 0;
    for (const char *s = "/proc/self/task/"; *s != '\0';) path[at++] = *s++;
    char digits[12];
    int nd = 0;
    for (unsigned v = static_cast<unsigned>(tid); nd == 0 || v != 0; v /= 10)
        digits[nd++] = static_cast<char>('0' + v % 10);
    while (nd > 0) path[at++] = digits[--nd];
    path[at++] = '/';
    for (const char *s = leaf; *s != '\0' && at + 1 < sizeof path;) path[at++] = *s++;
    path[at] = '\0';
    const long fd = raw_syscall(SYS_openat, AT_FDCWD, reinterpret_cast<long>(path), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return fd;
    long total = 0;
    while (static_cast<size_t>(total) + 1 < size) {
        const long n = raw_syscall(SYS_read, fd, reinterpret_cast<long>(buf + total),
                                   static_cast<long>(size - 1 - static_cast<size_t>(total)));
        if (n == -4) continue; // EINTR
        if (n <= 0) {
            if (n < 0 && total == 0) total = n;
            break;
        }
        total += n;
    }
    raw_syscall(SYS_close, fd);
    buf[total > 0 ? total : 0] = '\0';
    return total;
}

long parse_decimal(const char **p) {
    const char *s = *p;
    const bool negative = *s == '-';
    if (negative) ++s;
    long v = 0;
    while (*s >= '0' && *s <= '9') v = v * 10 + (*s++ - '0');
    *p = s;
    return negative ? -v : v;
}

uint64_t parse_hex(const char **p) {
    const char *s = *p;
    if (s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) s += 2;
    uint64_t v = 0;
    for (;; ++s) {
        const char c = *s;
        if (c >= '0' && c <= '9') {
            v = v * 16 + static_cast<uint64_t>(c - '0');
        } else if (c >= 'a' && c <= 'f') {
            v = v * 16 + static_cast<uint64_t>(c - 'a' + 10);
        } else if (c >= 'A' && c <= 'F') {
            v = v * 16 + static_cast<uint64_t>(c - 'A' + 10);
        } else {
            break;
        }
    }
    *p = s;
    return v;
}

bool starts_with(const char *s, const char *prefix) {
    for (; *prefix != '\0'; ++s, ++prefix)
        if (*s != *prefix) return false;
    return true;
}

const char *find_text(const char *s, const char *needle) {
    for (; *s != '\0'; ++s)
        if (starts_with(s, needle)) return s;
    return *needle == '\0' ? s : nullptr;
}

} // namespace ukp::platform
