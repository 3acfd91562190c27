// The disk cache of reference tables and symbol tables (refs_cache.cpp): a table comes
// back as built, at any bias; entries that are damaged, writable by others, for another
// file or under no UKP_CACHE_DIR are not used.
#include "arch/x86_64/region.hpp"
#include "platform/disk_cache.hpp"
#include "symbols/symbols.hpp"

#include "loaded_object.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <ctime>
#include <cstring>
#include <dirent.h>
#include <fcntl.h>
#include <link.h>
#include <string>
#include <sys/stat.h>
#include <unistd.h>
#include <vector>

namespace {

using ukp::arch::ObjectRefs;

using Loaded = ukp::testing::LoadedObject;

std::vector<std::string> entries(const std::string &dir, const char *prefix = "refs-") {
    std::vector<std::string> names;
    if (DIR *d = opendir(dir.c_str())) {
        while (const dirent *e = readdir(d))
            if (std::strncmp(e->d_name, prefix, std::strlen(prefix)) == 0) names.push_back(dir + "/" + e->d_name);
        closedir(d);
    }
    return names;
}

void expect_same(const ObjectRefs &a, const ObjectRefs &b) {
    EXPECT_EQ(a.values, b.values);
    EXPECT_EQ(a.branches, b.branches);
    EXPECT_EQ(a.starts, b.starts);
    EXPECT_EQ(a.resynced_bytes, b.resynced_bytes);
    EXPECT_EQ(a.identity_addr, b.identity_addr);
    EXPECT_EQ(a.identity, b.identity);
}

class RefsCache : public ::testing::Test {
protected:
    void SetUp() override {
        char tmpl[] = "/tmp/ukp-refs-cache-XXXXXX";
        ASSERT_NE(mkdtemp(tmpl), nullptr);
        dir_ = tmpl;
        setenv("UKP_CACHE_DIR", dir_.c_str(), 1);
        libc_ = ukp::testing::find_loaded("/libc.so.6");
        ASSERT_FALSE(libc_.path.empty());
    }
    void TearDown() override {
        unsetenv("UKP_CACHE_DIR");
        chmod(dir_.c_str(), 0700);
        const std::string cmd = "rm -rf " + dir_;
        EXPECT_EQ(std::system(cmd.c_str()), 0);
    }
    // libc's table stored once; the entry's path.
    std::string store_libc() {
        const auto built = ukp::arch::build_object_refs(libc_.path, libc_.bias);
        EXPECT_TRUE(built);
        if (!built) return {};
        ukp::arch::store_cached_refs(libc_.path, libc_.bias, *built);
        const auto names = entries(dir_);
        EXPECT_EQ(names.size(), 1u);
        return names.empty() ? std::string() : names[0];
    }
    std::string dir_;
    Loaded libc_;
};

TEST_F(RefsCache, ATableComesBackAsBuiltAtAnyBias) {
    const auto built = ukp::arch::build_object_refs(libc_.path, libc_.bias);
    ASSERT_TRUE(built);
    ASSERT_GT(built->values.size(), 1000u);
    ASSERT_GT(built->branches.size(), 1000u);
    EXPECT_EQ(ukp::arch::load_cached_refs(libc_.path, libc_.bias), nullptr) << "nothing stored yet";
    ukp::arch::store_cached_refs(libc_.path, libc_.bias, *built);
    const auto same = ukp::arch::load_cached_refs(libc_.path, libc_.bias);
    ASSERT_TRUE(same);
    expect_same(*same, *built);
    // Another process loads libc elsewhere: the same table, moved.
    const uint64_t other = libc_.bias + 0x7340000;
    const auto moved = ukp::arch::load_cached_refs(libc_.path, other);
    const auto built_there = ukp::arch::build_object_refs(libc_.path, other);
    ASSERT_TRUE(moved);
    ASSERT_TRUE(built_there);
    expect_same(*moved, *built_there);
    // Readable and writable by this user only.
    struct stat st {};
    ASSERT_EQ(stat(entries(dir_)[0].c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
}

TEST_F(RefsCache, ObjectRefsTakesTheTableFromDiskOnceForgotten) {
    store_libc();
    auto read = [](uint64_t addr, void *out, size_t n) {
        std::memcpy(out, reinterpret_cast<const void *>(addr), n);
        return true;
    };
    ukp::arch::forget_object_refs(libc_.bias);
    const uint64_t before = ukp::arch::object_refs_loaded_from_disk();
    const auto refs = ukp::arch::object_refs(libc_.path, libc_.bias, read);
    ASSERT_TRUE(refs);
    EXPECT_EQ(ukp::arch::object_refs_loaded_from_disk(), before + 1);
}

// A build its caller stops (the process exits) gives no table, keeps none in memory or on
// disk, and the next call builds it whole.
TEST_F(RefsCache, AStoppedBuildIsNeitherKeptNorStored) {
    auto read = [](uint64_t addr, void *out, size_t n) {
        std::memcpy(out, reinterpret_cast<const void *>(addr), n);
        return true;
    };
    std::string error;
    const std::atomic<bool> stop{true};
    EXPECT_FALSE(ukp::arch::build_object_refs(libc_.path, libc_.bias, &error, &stop));
    EXPECT_NE(error.find("stopped"), std::string::npos) << error;
    ukp::arch::forget_object_refs(libc_.bias);
    const size_t kept = ukp::arch::object_refs_cached();
    EXPECT_FALSE(ukp::arch::object_refs(libc_.path, libc_.bias, read, &stop));
    EXPECT_EQ(ukp::arch::object_refs_cached(), kept) << "a stopped build was kept";
    EXPECT_TRUE(entries(dir_).empty()) << "a stopped build was stored";
    const std::atomic<bool> go{false};
    const auto refs = ukp::arch::object_refs(libc_.path, libc_.bias, read, &go);
    ASSERT_TRUE(refs);
    EXPECT_EQ(ukp::arch::object_refs_cached(), kept + 1);
    EXPECT_EQ(entries(dir_).size(), 1u);
    expect_same(*refs, *ukp::arch::build_object_refs(libc_.path, libc_.bias));
}

TEST_F(RefsCache, DamagedEntriesAreIgnored) {
    const std::string entry = store_libc();
    ASSERT_FALSE(entry.empty());
    ASSERT_TRUE(ukp::arch::load_cached_refs(libc_.path, libc_.bias));
    struct stat st {};
    ASSERT_EQ(stat(entry.c_str(), &st), 0);
    // One byte of the table changed.
    {
        const int fd = open(entry.c_str(), O_RDWR);
        ASSERT_GE(fd, 0);
        char byte = 0;
        const off_t at = st.st_size - 100;
        ASSERT_EQ(pread(fd, &byte, 1, at), 1);
        byte ^= 0x40;
        ASSERT_EQ(pwrite(fd, &byte, 1, at), 1);
        close(fd);
    }
    EXPECT_EQ(ukp::arch::load_cached_refs(libc_.path, libc_.bias), nullptr) << "a changed byte";
    // Cut short.
    store_libc();
    ASSERT_EQ(truncate(entry.c_str(), st.st_size - 8), 0);
    EXPECT_EQ(ukp::arch::load_cached_refs(libc_.path, libc_.bias), nullptr) << "a truncated entry";
}

TEST_F(RefsCache, EntriesOthersCouldHaveWrittenAreIgnored) {
    const std::string entry = store_libc();
    ASSERT_FALSE(entry.empty());
    ASSERT_EQ(chmod(entry.c_str(), 0620), 0);
    EXPECT_EQ(ukp::arch::load_cached_refs(libc_.path, libc_.bias), nullptr) << "group-writable entry";
    ASSERT_EQ(chmod(entry.c_str(), 0600), 0);
    ASSERT_TRUE(ukp::arch::load_cached_refs(libc_.path, libc_.bias));
    if (geteuid() == 0) {
        ASSERT_EQ(chown(entry.c_str(), 4321, 4321), 0);
        EXPECT_EQ(ukp::arch::load_cached_refs(libc_.path, libc_.bias), nullptr) << "another user's entry";
        ASSERT_EQ(chown(entry.c_str(), 0, 0), 0);
    }
    ASSERT_EQ(chmod(dir_.c_str(), 0777), 0);
    EXPECT_EQ(ukp::arch::load_cached_refs(libc_.path, libc_.bias), nullptr) << "a world-writable directory";
}

TEST_F(RefsCache, AnotherFileFindsNothing) {
    // A copy of libc: another inode, so another entry, even with the same bytes; and a
    // copy changed since its table was stored finds nothing.
    const std::string copy = dir_ + "/libc-copy.so";
    {
        const std::string cmd = "cp " + libc_.path + " " + copy;
        ASSERT_EQ(std::system(cmd.c_str()), 0);
    }
    store_libc();
    EXPECT_EQ(ukp::arch::load_cached_refs(copy, libc_.bias), nullptr) << "another file";
    const auto built = ukp::arch::build_object_refs(copy, libc_.bias);
    ASSERT_TRUE(built);
    ukp::arch::store_cached_refs(copy, libc_.bias, *built);
    ASSERT_TRUE(ukp::arch::load_cached_refs(copy, libc_.bias));
    {
        const int fd = open(copy.c_str(), O_WRONLY | O_APPEND);
        ASSERT_GE(fd, 0);
        ASSERT_EQ(write(fd, "x", 1), 1);
        close(fd);
    }
    EXPECT_EQ(ukp::arch::load_cached_refs(copy, libc_.bias), nullptr) << "a file changed since";
    unlink(copy.c_str());
}

// Old entries (other agents, other libraries) beyond the limit go, the least recently
// used first; a load marks an entry used.
TEST_F(RefsCache, TheLeastRecentlyUsedEntriesGo) {
    const std::string mine = store_libc();
    ASSERT_FALSE(mine.empty());
    const size_t limit = ukp::platform::kCacheEntries;
    // Entries of other agents, last used from 3 days to an hour ago; libc's the oldest.
    const time_t now = time(nullptr);
    for (size_t i = 0; i < limit + 5; ++i) {
        const std::string name = dir_ + "/refs-old" + std::to_string(i);
        const int fd = open(name.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600);
        ASSERT_GE(fd, 0);
        const timespec times[2] = {{now - 3 * 86400 + static_cast<time_t>(i) * 60, 0},
                                   {now - 3 * 86400 + static_cast<time_t>(i) * 60, 0}};
        ASSERT_EQ(futimens(fd, times), 0);
        close(fd);
    }
    const timespec oldest[2] = {{now - 4 * 86400, 0}, {now - 4 * 86400, 0}};
    ASSERT_EQ(utimensat(AT_FDCWD, mine.c_str(), oldest, 0), 0);
    // Loading it marks it used: it stays when the next store prunes.
    ASSERT_TRUE(ukp::arch::load_cached_refs(libc_.path, libc_.bias));
    const auto built = ukp::arch::build_object_refs(libc_.path, libc_.bias + 0x1000);
    ASSERT_TRUE(built);
    ukp::arch::store_cached_refs("/nonexistent-path-is-skipped", libc_.bias, *built); // no file: nothing
    EXPECT_EQ(entries(dir_).size(), limit + 6);
    // Another object's table (the copy of libc under another path) is a new entry.
    const std::string copy = dir_ + "/libc-copy.so";
    ASSERT_EQ(std::system(("cp " + libc_.path + " " + copy).c_str()), 0);
    ukp::arch::store_cached_refs(copy, libc_.bias, *built);
    const auto left = entries(dir_);
    EXPECT_EQ(left.size(), limit);
    auto has = [&](const std::string &f) { return std::find(left.begin(), left.end(), f) != left.end(); };
    EXPECT_TRUE(has(mine)) << "the entry loaded last went";
    for (size_t i = 0; i < 7; ++i) EXPECT_FALSE(has(dir_ + "/refs-old" + std::to_string(i))) << i;
    EXPECT_TRUE(has(dir_ + "/refs-old7"));
    EXPECT_TRUE(ukp::arch::load_cached_refs(copy, libc_.bias)) << "the entry just stored went";
}

TEST_F(RefsCache, NothingIsWrittenWithoutTheVariable) {
    unsetenv("UKP_CACHE_DIR");
    const auto built = ukp::arch::build_object_refs(libc_.path, libc_.bias);
    ASSERT_TRUE(built);
    ukp::arch::store_cached_refs(libc_.path, libc_.bias, *built);
    EXPECT_TRUE(entries(dir_).empty());
    EXPECT_EQ(ukp::arch::load_cached_refs(libc_.path, libc_.bias), nullptr);
}

// A controller's directory (ukprobe attach) serves where the environment names none; the
// environment's wins; written empty again, there is none.
TEST_F(RefsCache, TheControllersDirectoryServesWithoutTheVariable) {
    unsetenv("UKP_CACHE_DIR");
    EXPECT_EQ(ukp::platform::cache_dir(), "");
    ukp::platform::set_cache_dir(dir_);
    EXPECT_EQ(ukp::platform::cache_dir(), dir_);
    const std::string entry = store_libc();
    EXPECT_FALSE(entry.empty());
    EXPECT_NE(ukp::arch::load_cached_refs(libc_.path, libc_.bias), nullptr);
    setenv("UKP_CACHE_DIR", "/nonexistent-parent/ukprobes", 1);
    EXPECT_EQ(ukp::platform::cache_dir(), ""); // the variable's, which cannot be made
    unsetenv("UKP_CACHE_DIR");
    ukp::platform::set_cache_dir("");
    EXPECT_EQ(ukp::platform::cache_dir(), "");
    EXPECT_EQ(ukp::arch::load_cached_refs(libc_.path, libc_.bias), nullptr);
}

// libc's symbol table, read lazily (symbols.cpp): parsed and kept the first time, taken
// from the directory the next, at another bias, the same as a fresh parse at that bias.
std::vector<ukp::sym::Symbol> lazy_symbols(const std::string &path, uint64_t bias) {
    ukp::sym::detail::LazySymbols lazy({path, {0, 0}, bias});
    return lazy.symbols();
}

void expect_same(const std::vector<ukp::sym::Symbol> &a, const std::vector<ukp::sym::Symbol> &b) {
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
        EXPECT_EQ(a[i].name, b[i].name) << i;
        EXPECT_EQ(a[i].value, b[i].value) << a[i].name;
        EXPECT_EQ(a[i].size, b[i].size) << a[i].name;
        EXPECT_EQ(a[i].function, b[i].function) << a[i].name;
        EXPECT_EQ(a[i].ifunc, b[i].ifunc) << a[i].name;
    }
}

TEST_F(RefsCache, ASymbolTableComesBackAsParsedAtAnyBias) {
    const uint64_t loads = ukp::sym::tables_loaded_from_disk();
    const auto first = lazy_symbols(libc_.path, libc_.bias);
    ASSERT_GT(first.size(), 1000u);
    EXPECT_EQ(ukp::sym::tables_loaded_from_disk(), loads) << "parsed, not loaded";
    ASSERT_EQ(entries(dir_, "syms-").size(), 1u);
    const uint64_t other_bias = libc_.bias + 0x12345000;
    const auto again = lazy_symbols(libc_.path, other_bias);
    EXPECT_EQ(ukp::sym::tables_loaded_from_disk(), loads + 1);
    const auto parsed = ukp::sym::load_object(libc_.path, other_bias);
    ASSERT_TRUE(parsed);
    expect_same(again, parsed->symbols());
    ukp::sym::detail::LazySymbols lazy({libc_.path, {0, 0}, other_bias});
    EXPECT_EQ(lazy.plt_ranges(), parsed->plt_ranges());
}

TEST_F(RefsCache, DamagedSymbolEntriesAreIgnored) {
    lazy_symbols(libc_.path, libc_.bias);
    const auto names = entries(dir_, "syms-");
    ASSERT_EQ(names.size(), 1u);
    struct stat st {};
    ASSERT_EQ(stat(names[0].c_str(), &st), 0);
    const int fd = open(names[0].c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    char byte = 0;
    ASSERT_EQ(pread(fd, &byte, 1, st.st_size - 10), 1); // in the names
    byte ^= 0x20;
    ASSERT_EQ(pwrite(fd, &byte, 1, st.st_size - 10), 1);
    close(fd);
    const uint64_t loads = ukp::sym::tables_loaded_from_disk();
    const auto again = lazy_symbols(libc_.path, libc_.bias);
    EXPECT_EQ(ukp::sym::tables_loaded_from_disk(), loads) << "a changed byte";
    expect_same(again, ukp::sym::load_object(libc_.path, libc_.bias)->symbols());
}

TEST_F(RefsCache, NoSymbolTableIsKeptWithoutTheVariable) {
    unsetenv("UKP_CACHE_DIR");
    const uint64_t loads = ukp::sym::tables_loaded_from_disk();
    lazy_symbols(libc_.path, libc_.bias);
    lazy_symbols(libc_.path, libc_.bias);
    EXPECT_TRUE(entries(dir_, "syms-").empty());
    EXPECT_EQ(ukp::sym::tables_loaded_from_disk(), loads);
}

} // namespace
