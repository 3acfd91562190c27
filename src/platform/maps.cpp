#include "platform/maps.hpp"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <unistd.h>

namespace ukp::platform {
namespace {

bool take_hex(std::string_view *s, uint64_t *out) {
    uint64_t v = 0;
    size_t i = 0;
    for (; i < s->size() && i < 16; ++i) {
        const char c = (*s)[i];
        const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0) break;
        v = v << 4 | static_cast<uint64_t>(d);
    }
    if (i == 0) return false;
    s->remove_prefix(i);
    *out = v;
    return true;
}

bool take_char(std::string_view *s, char c) {
    if (s->empty() || s->front() != c) return false;
    s->remove_prefix(1);
    return true;
}

void skip_spaces(std::string_view *s) {
    while (!s->empty() && s->front() == ' ') s->remove_prefix(1);
}

} // namespace

bool parse_mapping(std::string_view line, Mapping *out) {
    Mapping m;
    uint64_t major = 0, minor = 0;
    if (!take_hex(&line, &m.start) || !take_char(&line, '-') || !take_hex(&line, &m.end) || !take_char(&line, ' ') ||
        line.size() < 5 || line[4] != ' ')
        return false;
    std::memcpy(m.perms, line.data(), 4);
    line.remove_prefix(5);
    if (!take_hex(&line, &m.offset) || !take_char(&line, ' ') || !take_hex(&line, &major) || !take_char(&line, ':') ||
        !take_hex(&line, &minor) || !take_char(&line, ' '))
        return false;
    size_t digits = 0;
    while (digits < line.size() && line[digits] >= '0' && line[digits] <= '9')
        m.inode = m.inode * 10 + static_cast<uint64_t>(line[digits++] - '0');
    if (digits == 0) return false;
    line.remove_prefix(digits);
    skip_spaces(&line);
    m.path = line;
    *out = m;
    return true;
}

bool visit_mappings(int pid, MappingVisitor visit, void *context) {
    char name[32] = "/proc/self/maps";
    if (pid != 0) {
        char digits[12];
        int n = 0;
        for (unsigned v = static_cast<unsigned>(pid); n == 0 || v != 0; v /= 10)
            digits[n++] = static_cast<char>('0' + v % 10);
        char *p = name + 6; // after "/proc/"
        while (n > 0) *p++ = digits[--n];
        std::memcpy(p, "/maps", 6);
    }
    const int fd = open(name, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    // Lines are at most a path (PATH_MAX) and ~80 bytes of fields; a longer one is skipped.
    char buf[8192];
    size_t have = 0;
    bool skipping = false, more = true;
    while (more) {
        const ssize_t n = read(fd, buf + have, sizeof buf - have);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            more = false;
            if (have == 0) break;
            buf[have++] = '\n'; // a last line without its newline
        } else {
            have += static_cast<size_t>(n);
        }
        size_t at = 0;
        for (;;) {
            const void *nl = std::memchr(buf + at, '\n', have - at);
            if (nl == nullptr) break;
            const size_t end = static_cast<size_t>(static_cast<const char *>(nl) - buf);
            Mapping m;
            if (!skipping && parse_mapping(std::string_view(buf + at, end - at), &m) && !visit(context, m)) {
                close(fd);
                return true;
            }
            skipping = false;
            at = end + 1;
        }
        std::memmove(buf, buf + at, have - at);
        have -= at;
        if (have == sizeof buf) { // a line longer than the buffer: drop it to its newline
            have = 0;
            skipping = true;
        }
    }
    close(fd);
    return true;
}

std::vector<OwnedMapping> read_mappings(int pid) {
    std::vector<OwnedMapping> all;
    for_each_mapping(pid, [&](const Mapping &m) {
        OwnedMapping o{m.start, m.end, m.offset, m.inode, {}, std::string(m.path)};
        std::memcpy(o.perms, m.perms, sizeof o.perms);
        all.push_back(std::move(o));
        return true;
    });
    return all;
}

} // namespace ukp::platform
