// The descriptors the agent keeps (the ring's and the counters' memfds, the control socket
// and its wake pipe, a controller's connection) stay out of the program's table: a
// program that closes or replaces its descriptors took them from the agent.
#include "control/control.hpp"

#include <ukprobes/kprobes.h>
#include <ukprobes/trace.h>

#include <gtest/gtest.h>

#include <dirent.h>
#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <cstdio>
#include <cstdlib>
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

// What the control thread's own table holds (platform/held_fd.hpp), found by its name.
std::vector<std::string> control_thread_fds() {
    std::vector<std::string> out;
    DIR *tasks = opendir("/proc/self/task");
    if (tasks == nullptr) return out;
    while (dirent *t = readdir(tasks)) {
        if (t->d_name[0] == '.') continue;
        char comm[64] = "";
        const std::string dir = std::string("/proc/self/task/") + t->d_name;
        if (FILE *f = fopen((dir + "/comm").c_str(), "re")) {
            if (fgets(comm, sizeof comm, f) == nullptr) comm[0] = 0;
            fclose(f);
        }
        if (std::string(comm) != "ukp-control\n") continue;
        DIR *fds = opendir((dir + "/fd").c_str());
        if (fds == nullptr) continue;
        while (dirent *e = readdir(fds)) {
            char target[4096];
            const ssize_t n = readlinkat(dirfd(fds), e->d_name, target, sizeof target - 1);
            if (e->d_name[0] != '.' && n > 0) out.emplace_back(target, static_cast<size_t>(n));
        }
        closedir(fds);
    }
    closedir(tasks);
    return out;
}

// Events defined through the C API on this thread: their memfds wait at high numbers,
// close-on-exec; the control thread, once started, holds them in its own table, and the
// program's table has nothing of the agent's (docs/reference.md, "Descriptors").
TEST(AgentFds, NoneInTheProgramsTableOnceTheControlThreadRuns) {
    const auto before = open_fds();
    const auto is_new = [&](int fd) {
        for (const auto &b : before)
            if (b.first == fd) return false;
        return true;
    };
    kprobe kp{};
    kp.symbol_name = "ukpt_fds_target";
    ASSERT_EQ(register_kprobe(&kp), 0); // writes code: /proc/self/mem, opened and closed
    ASSERT_EQ(ukp_trace_write("kprobe_events", "p:fds/t ukpt_fds_target x=%di:s32"), 0); // the ring
    ASSERT_EQ(ukp_trace_write("events/fds/t/enable", "1"), 0);
    rlimit lim{};
    ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &lim), 0);
    const long floor = std::min<long>(512, static_cast<long>(lim.rlim_cur / 2));
    int waiting = 0;
    for (const auto &[fd, what] : open_fds()) {
        if (!is_new(fd)) continue;
        ++waiting;
        EXPECT_GE(fd, floor) << "the agent holds " << what << " at " << fd;
        EXPECT_NE(fcntl(fd, F_GETFD) & FD_CLOEXEC, 0) << what;
        EXPECT_EQ(what.rfind("/memfd:ukprobes-", 0), 0u) << what << " at " << fd;
    }
    EXPECT_EQ(waiting, 2) << "the ring's and the counters' memfds";
    ASSERT_EQ(ukp_control_start(), 0); // the socket and the wake pipe, in its table
    for (const auto &[fd, what] : open_fds()) EXPECT_FALSE(is_new(fd)) << "the agent holds " << what << " at " << fd;
    const auto held = control_thread_fds();
    const auto holds = [&](const std::string &prefix) {
        for (const auto &h : held)
            if (h.rfind(prefix, 0) == 0) return true;
        return false;
    };
    EXPECT_TRUE(holds("/memfd:ukprobes-trace")) << "the control thread took the ring";
    EXPECT_TRUE(holds("/memfd:ukprobes-counters")) << "the control thread took the counters";
    EXPECT_TRUE(holds("socket:")) << "its socket is in its own table";
    // The program's next descriptor is the lowest number, as without the agent.
    int lowest = 3;
    while (!is_new(lowest)) ++lowest;
    const int mine = open("/dev/null", O_RDONLY);
    EXPECT_EQ(mine, lowest);
    close(mine);
    EXPECT_EQ(ukpt_fds_target(41), 42);
    char *trace = nullptr;
    ASSERT_EQ(ukp_trace_read("trace", &trace), 0);
    EXPECT_NE(std::string(trace).find("x=41"), std::string::npos) << trace;
    free(trace);
    EXPECT_EQ(ukp_control_stop(), 0);
    ukp_trace_write("events/fds/t/enable", "0");
    ukp_trace_write("kprobe_events", "");
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
