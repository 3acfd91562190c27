// Tables derived from a file, kept on disk so that the next process that loads the same
// file skips the work (arch's reference tables, symbols' symbol tables). Only where
// UKP_CACHE_DIR names a directory (ukprobe run sets it), or, without it, where a controller
// named one (ukprobe attach: set_cache_dir).
//
// An entry is a header and a body under a name derived from the file's identity (path,
// device, inode, size, modification time) and the agent's own (its file's): a file replaced
// or an agent rebuilt finds nothing. Anything that does not match, a file or directory
// another user could have written, is ignored. Writes go to a temporary file renamed into
// place, so readers see whole entries or none. Past kCacheEntries of a kind the least
// recently used go (a load marks an entry used).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace ukp::platform {

// Entries kept of each kind (prefix).
constexpr size_t kCacheEntries = 64;

// What a file is, for the cache: an entry records the key of the file it was built from.
struct FileKey {
    uint64_t dev, ino, size, mtime_ns;
    bool operator==(const FileKey &) const = default;
};

// What starts every entry's header: its kind, the agent that wrote it and the file it was
// built from.
struct CacheStamp {
    char magic[8];
    uint64_t agent;
    FileKey file;

    // This agent's stamp for an entry of kind `magic` built from `file`.
    static CacheStamp of(const char (&magic)[8], const FileKey &file);
    bool operator==(const CacheStamp &) const = default;
};

// False when `path` is not a regular file that can be stat'ed.
bool file_key(const std::string &path, FileKey *key);

// The agent's own file's key, hashed: tables built by another agent build are not used. 0
// when unknown (then nothing is cached).
uint64_t agent_id();

// The directory the controller named ("" for none), and the one in effect: UKP_CACHE_DIR
// if set, else the controller's, if it is absolute and only this user can write it (made,
// mode 0700, if missing and its parent exists); "" for none.
void set_cache_dir(const std::string &dir);
std::string cache_dir();

// A checksum for an entry's body: catches torn or damaged files.
uint64_t cache_checksum(const void *data, size_t n);

// An entry's file in `dir`: `prefix` ("refs", "syms") and a hash of what it depends on.
std::string cache_entry_path(const std::string &dir, const char *prefix, const std::string &path, const FileKey &file,
                             const FileKey &more = FileKey{});

// An entry's bytes, if it is a regular file of this user's that others cannot write, at
// least `min` bytes long; marked used. Empty otherwise.
std::string read_cache_entry(const std::string &entry, size_t min);

// Writes head and body as `entry`, then removes the least recently used entries whose names
// start with `prefix` beyond kCacheEntries.
void write_cache_entry(const std::string &dir, const std::string &entry, const char *prefix, const void *head,
                       size_t head_size, const std::string &body);

// Appends n items of T to an entry's body.
template <typename T>
void cache_append(std::string *out, const T *data, size_t n) {
    out->append(reinterpret_cast<const char *>(data), n * sizeof(T));
}

// Reads n items of T (bytes or integers) from `in` at *at; false past its end.
template <typename T>
bool cache_take(const std::string &in, size_t *at, size_t n, std::vector<T> *out) {
    if (n > (in.size() - *at) / sizeof(T)) return false;
    out->resize(n);
    std::memcpy(static_cast<void *>(out->data()), in.data() + *at, n * sizeof(T));
    *at += n * sizeof(T);
    return true;
}

} // namespace ukp::platform
