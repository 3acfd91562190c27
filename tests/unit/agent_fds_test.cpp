// The descriptors the agent keeps (the ring's memfd, /proc/self/mem, the control socket
// and its wake pipe, a controller's connection) stay out of the low numbers a program
// assumes are its own: a shell's `exec 4>&-` closed the agent's socket when it sat at 4.
#include "control/control.hpp"

#include <ukprobes/kprobes.h>
#include <ukprobes/trace.h>

#include <gtest/gtest.h>

#include <dirent.h>
#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <cstdio>
#include <fcntl.h>
#include <string>
#include <sys/resource.h>
#include <unistd.h>

extern "C" int ukpt_fds_target(int x);
__attribute__((noinline)) int ukpt_fds_target(int x) {
    __asm__ volatile("" ::: "memory");
    return x + 1;
}

namespace {

// Every open descriptor but 0-2 and the directory listing's own, with what it designates.
std::vector<std::pair<int, std::string>> open_fds() {
    std::vector<std::pair<int, std::string>> out;
    DIR *d = opendir("/proc/self/fd");
    if (d == nullptr) return out;
    const int own = dirfd(d);
    while (dirent *e = readdir(d)) {
        if (e->d_name[0] == '.') continue;
        const int fd = std::stoi(e->d_name);
        if (fd <= 2 || fd == own) continue;
        char target[4096];
        const ssize_t n = readlinkat(own, e->d_name, target, sizeof target - 1);
        out.emplace_back(fd, n > 0 ? std::string(target, static_cast<size_t>(n)) : "?");
    }
    closedir(d);
    return out;
}

TEST(AgentFds, TheAgentsDescriptorsAreHighUp) {
    const auto before = open_fds();
    kprobe kp{};
    kp.symbol_name = "ukpt_fds_target";
    ASSERT_EQ(register_kprobe(&kp), 0); // opens /proc/self/mem
    ASSERT_EQ(ukp_trace_write("kprobe_events", "p:fds/t ukpt_fds_target x=%di:s32"), 0); // the ring
    ASSERT_EQ(ukp_control_start(), 0); // the socket and the wake pipe
    EXPECT_EQ(ukpt_fds_target(1), 2);
    rlimit lim{};
    ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &lim), 0);
    const long floor = std::min<long>(512, static_cast<long>(lim.rlim_cur / 2));
    int agent = 0;
    for (const auto &[fd, what] : open_fds()) {
        bool had = false;
        for (const auto &b : before) had = had || b.first == fd;
        if (had) continue;
        ++agent;
        EXPECT_GE(fd, floor) << "the agent holds " << what << " at " << fd;
        EXPECT_NE(fcntl(fd, F_GETFD) & FD_CLOEXEC, 0) << what;
    }
    EXPECT_GE(agent, 3) << "the memfd, /proc/self/mem and the socket at least";
    // The program's next descriptor is the lowest number, as without the agent.
    const int mine = open("/dev/null", O_RDONLY);
    EXPECT_LE(mine, 3 + static_cast<int>(before.size()));
    close(mine);
    unregister_kprobe(&kp);
}

// At load, while the process has one thread, the agent registers for membarrier and
// grows the descriptor table to its high numbers: done later, with its threads started,
// each costs the kernel an RCU grace period (7-20 ms here) in the process's start. This
// runs before any probe or event of this test process exists.
long fd_table_size() {
    FILE *f = fopen("/proc/self/status", "re");
    if (f == nullptr) return -1;
    char line[256];
    long size = -1;
    while (fgets(line, sizeof line, f) != nullptr)
        if (sscanf(line, "FDSize: %ld", &size) == 1) break;
    fclose(f);
    return size;
}

TEST(AgentFds, PreparedAtLoadWhileSingleThreaded) {
    EXPECT_EQ(syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0), 0) << "not registered";
    EXPECT_EQ(syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE, 0, 0), 0) << "not registered";
    rlimit lim{};
    ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &lim), 0);
    const long floor = std::min<long>(512, static_cast<long>(lim.rlim_cur / 2));
    EXPECT_GT(fd_table_size(), floor);
}

} // namespace
