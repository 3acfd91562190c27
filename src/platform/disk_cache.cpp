#include "platform/disk_cache.hpp"

#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <utility>

namespace ukp::platform {
namespace {

uint64_t fnv(const void *data, size_t n, uint64_t h = 0xcbf29ce484222325ull) {
    const auto *p = static_cast<const uint8_t *>(data);
    for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

bool key_of(const struct stat &st, FileKey *key) {
    if (!S_ISREG(st.st_mode)) return false;
    *key = {static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino), static_cast<uint64_t>(st.st_size),
            static_cast<uint64_t>(st.st_mtim.tv_sec) * 1000000000ull + static_cast<uint64_t>(st.st_mtim.tv_nsec)};
    return true;
}

std::mutex g_dir_mu;
std::string &given_dir() {                // under g_dir_mu
    static auto *dir = new std::string(); // never destroyed: a probe may register at exit
    return *dir;
}

// Removes the least recently used entries whose names start with `prefix` beyond
// kCacheEntries.
void prune(const std::string &dir, const char *prefix) {
    DIR *d = opendir(dir.c_str());
    if (d == nullptr) return;
    std::vector<std::pair<timespec, std::string>> entries;
    while (const dirent *e = readdir(d)) {
        if (strncmp(e->d_name, prefix, strlen(prefix)) != 0) continue;
        struct stat st {};
        if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0) entries.emplace_back(st.st_mtim, e->d_name);
    }
    if (entries.size() > kCacheEntries) {
        std::sort(entries.begin(), entries.end(), [](const auto &a, const auto &b) {
            return a.first.tv_sec != b.first.tv_sec ? a.first.tv_sec < b.first.tv_sec
                                                    : a.first.tv_nsec < b.first.tv_nsec;
        });
        for (size_t i = 0; i + kCacheEntries < entries.size(); ++i) unlinkat(dirfd(d), entries[i].second.c_str(), 0);
    }
    closedir(d);
}

} // namespace

bool file_key(const std::string &path, FileKey *key) {
    struct stat st {};
    return stat(path.c_str(), &st) == 0 && key_of(st, key);
}

uint64_t agent_id() {
    static const uint64_t id = [] {
        Dl_info info{};
        struct stat st {};
        FileKey key{};
        if (dladdr(reinterpret_cast<void *>(&agent_id), &info) == 0 || info.dli_fname == nullptr ||
            stat(info.dli_fname, &st) != 0 || !key_of(st, &key))
            return uint64_t{0};
        return fnv(&key, sizeof key);
    }();
    return id;
}

void set_cache_dir(const std::string &dir) {
    std::lock_guard lock(g_dir_mu);
    given_dir() = dir;
}

std::string cache_dir() {
    std::string given;
    const char *dir = getenv("UKP_CACHE_DIR");
    if (dir == nullptr) {
        std::lock_guard lock(g_dir_mu);
        given = given_dir();
        dir = given.c_str();
    }
    if (dir[0] != '/') return {};
    struct stat st {};
    if (lstat(dir, &st) != 0 && (mkdir(dir, 0700) != 0 || lstat(dir, &st) != 0)) return {};
    if (!S_ISDIR(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 022) != 0) return {};
    return dir;
}

// Four lanes over 8-byte words, each multiplied and rotated, then folded with the last
// bytes: byte-wise FNV over libc's reference table (~900 KB) took a millisecond of every
// process's start.
CacheStamp CacheStamp::of(const char (&magic)[8], const FileKey &file) {
    CacheStamp s{};
    memcpy(s.magic, magic, sizeof s.magic);
    s.agent = agent_id();
    s.file = file;
    return s;
}

uint64_t cache_checksum(const void *data, size_t n) {
    const auto *p = static_cast<const uint8_t *>(data);
    uint64_t lane[4] = {0xcbf29ce484222325ull, 0x9e3779b97f4a7c15ull, 0xc2b2ae3d27d4eb4full, 0x165667b19e3779f9ull};
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        for (int k = 0; k < 4; ++k) {
            uint64_t w;
            memcpy(&w, p + i + 8 * k, sizeof w);
            const uint64_t m = (lane[k] ^ w) * 0x100000001b3ull;
            lane[k] = (m << 29) | (m >> 35);
        }
    }
    uint64_t h = fnv(p + i, n - i);
    for (uint64_t l : lane) h = fnv(&l, sizeof l, h);
    return fnv(&n, sizeof n, h);
}

std::string cache_entry_path(const std::string &dir, const char *prefix, const std::string &path, const FileKey &file,
                             const FileKey &more) {
    uint64_t h = fnv(path.data(), path.size());
    h = fnv(&file, sizeof file, h);
    h = fnv(&more, sizeof more, h);
    const uint64_t agent = agent_id();
    h = fnv(&agent, sizeof agent, h);
    char name[48];
    snprintf(name, sizeof name, "/%s-%016llx", prefix, static_cast<unsigned long long>(h));
    return dir + name;
}

std::string read_cache_entry(const std::string &entry, size_t min) {
    const int fd = open(entry.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) return {};
    std::string bytes;
    struct stat st {};
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid() && (st.st_mode & 022) == 0 &&
        st.st_size >= static_cast<off_t>(min) && st.st_size < (off_t{1} << 32)) {
        bytes.resize(static_cast<size_t>(st.st_size));
        if (pread(fd, bytes.data(), bytes.size(), 0) != static_cast<ssize_t>(bytes.size())) bytes.clear();
        futimens(fd, nullptr);
    }
    close(fd);
    return bytes;
}

void write_cache_entry(const std::string &dir, const std::string &entry, const char *prefix, const void *head,
                       size_t head_size, const std::string &body) {
    static std::atomic<unsigned> serial{0};
    char tmp_name[64];
    snprintf(tmp_name, sizeof tmp_name, "/.tmp-%d-%u", getpid(), serial.fetch_add(1));
    const std::string tmp = dir + tmp_name;
    const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) return;
    bool ok = write(fd, head, head_size) == static_cast<ssize_t>(head_size);
    for (size_t at = 0; ok && at < body.size();) {
        const ssize_t n = write(fd, body.data() + at, body.size() - at);
        ok = n > 0;
        if (ok) at += static_cast<size_t>(n);
    }
    ok = close(fd) == 0 && ok;
    if (!ok || rename(tmp.c_str(), entry.c_str()) != 0) {
        unlink(tmp.c_str());
        return;
    }
    prune(dir, prefix);
}

} // namespace ukp::platform
