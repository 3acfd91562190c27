// A batch of code writes on one of the program's threads (text::begin_write_batch): the
// writes share one /proc/self/mem, held at a high number for the batch only, and a
// program that closes that number and opens a file of its own under it does not get
// the agent's writes in its file.
#include "text/text.hpp"

#include <gtest/gtest.h>

#include <dirent.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

char g_target[16] = "...............";

// The descriptors open on /proc/PID/mem, by number.
std::vector<int> mem_fds() {
    std::vector<int> out;
    DIR *d = opendir("/proc/self/fd");
    if (d == nullptr) return out;
    const std::string mem = "/proc/" + std::to_string(getpid()) + "/mem";
    while (dirent *e = readdir(d)) {
        if (e->d_name[0] == '.') continue;
        char target[256];
        const ssize_t n = readlinkat(dirfd(d), e->d_name, target, sizeof target - 1);
        if (n > 0 && std::string(target, size_t(n)) == mem) out.push_back(std::atoi(e->d_name));
    }
    closedir(d);
    return out;
}

int high_floor() {
    rlimit lim{};
    if (getrlimit(RLIMIT_NOFILE, &lim) != 0) return 3;
    return int(std::min<rlim_t>(512, lim.rlim_cur / 2));
}

TEST(WriteBatch, OneDescriptorHighUpForTheBatchOnly) {
    ASSERT_EQ(ukp::text::init(), 0);
    ASSERT_TRUE(mem_fds().empty());
    ukp::text::begin_write_batch();
    ukp::text::begin_write_batch(); // nested: ends with the outermost
    ASSERT_EQ(ukp::text::write(reinterpret_cast<uint64_t>(g_target), "ab", 2), 0);
    ASSERT_EQ(ukp::text::write(reinterpret_cast<uint64_t>(g_target) + 2, "cd", 2), 0);
    EXPECT_EQ(std::string(g_target, 4), "abcd");
    const std::vector<int> held = mem_fds();
    ASSERT_EQ(held.size(), 1u) << "one /proc/self/mem for the batch";
    EXPECT_GE(held[0], high_floor());
    EXPECT_NE(fcntl(held[0], F_GETFD) & FD_CLOEXEC, 0);
    // The program's next descriptor is still the lowest free number.
    const int probe = open("/dev/null", O_RDONLY);
    ASSERT_GE(probe, 0);
    EXPECT_LT(probe, high_floor());
    close(probe);
    ukp::text::end_write_batch();
    EXPECT_EQ(mem_fds().size(), 1u) << "the inner scope's end keeps it";
    ukp::text::end_write_batch();
    EXPECT_TRUE(mem_fds().empty()) << "closed at the batch's end";
    // Outside a batch a write opens and closes its own.
    ASSERT_EQ(ukp::text::write(reinterpret_cast<uint64_t>(g_target), "ef", 2), 0);
    EXPECT_EQ(std::string(g_target, 4), "efcd");
    EXPECT_TRUE(mem_fds().empty());
}

TEST(WriteBatch, AFileTheProgramPutUnderTheNumberIsLeftAlone) {
    ASSERT_EQ(ukp::text::init(), 0);
    ukp::text::begin_write_batch();
    ASSERT_EQ(ukp::text::write(reinterpret_cast<uint64_t>(g_target), "gh", 2), 0);
    const std::vector<int> held = mem_fds();
    ASSERT_EQ(held.size(), 1u);
    const int number = held[0];
    // The program closes the number and opens a file of its own there.
    char path[] = "/tmp/ukp_write_batch_XXXXXX";
    const int file = mkstemp(path);
    ASSERT_GE(file, 0);
    unlink(path);
    ASSERT_EQ(close(number), 0);
    ASSERT_EQ(dup2(file, number), number);
    close(file);
    ASSERT_EQ(ukp::text::write(reinterpret_cast<uint64_t>(g_target) + 2, "ij", 2), 0);
    EXPECT_EQ(std::string(g_target, 4), "ghij");
    struct stat st {};
    ASSERT_EQ(fstat(number, &st), 0);
    EXPECT_EQ(st.st_size, 0) << "nothing written into the program's file";
    EXPECT_EQ(mem_fds().size(), 1u) << "a /proc/self/mem of its own again, elsewhere";
    ukp::text::end_write_batch();
    EXPECT_TRUE(mem_fds().empty());
    EXPECT_EQ(fstat(number, &st), 0) << "the program's file is not closed by the batch's end";
    EXPECT_EQ(st.st_size, 0);
    close(number);
}

} // namespace
