#include "platform/held_fd.hpp"

#include <cerrno>
#include <cstdlib>
#include <dirent.h>
#include <linux/close_range.h>
#include <sched.h>
#include <sys/syscall.h>
#include <vector>
#include <cstdio>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace ukp::platform {

namespace {

thread_local bool t_own_table __attribute__((tls_model("initial-exec"))) = false;

// Closes every descriptor of a table this thread has just unshared, on kernels without
// close_range() (before 5.9).
void close_all_listed() {
    DIR *dir = opendir("/proc/thread-self/fd");
    if (dir == nullptr) return;
    const int own = dirfd(dir);
    std::vector<int> fds;
    while (dirent *e = readdir(dir)) {
        if (e->d_name[0] == '.') continue;
        const int fd = atoi(e->d_name);
        if (fd != own) fds.push_back(fd);
    }
    closedir(dir);
    for (int fd : fds) close(fd);
}

pid_t this_tid() { return static_cast<pid_t>(gettid()); }

// The caller's table's key: its tid if it runs with a table of its own, else 0.
pid_t table_of_caller() { return has_own_fd_table() ? this_tid() : 0; }

} // namespace

bool has_own_fd_table() { return t_own_table; }

int enter_own_fd_table() {
    if (!t_own_table) {
        // CLOSE_RANGE_UNSHARE over every number: the kernel gives the thread a new, empty
        // table, without holding the program's files even for a moment.
        if (syscall(SYS_close_range, 0u, ~0u, CLOSE_RANGE_UNSHARE) != 0) {
            if (unshare(CLONE_FILES) != 0) return -errno;
            close_all_listed();
        }
        t_own_table = true;
        // 0-2 lead nowhere (O_PATH: reads and writes fail): a stray write to standard
        // error cannot land in a file this thread opened next.
        for (int fd = 0; fd < 3; ++fd) open("/", O_PATH);
    }
    return 0;
}

void HeldFd::set(int fd) {
    *this = HeldFd{};
    if (fd < 0) return;
    struct stat st {};
    if (fstat(fd, &st) != 0) return;
    fd_ = fd;
    holder_ = table_of_caller();
    dev_ = st.st_dev;
    ino_ = st.st_ino;
}

bool HeldFd::names_file(int fd) const {
    struct stat st {};
    return fd >= 0 && fstat(fd, &st) == 0 && same_file(st.st_dev, st.st_ino);
}

bool HeldFd::caller_holds() const { return table_of_caller() == holder_; }

// The file reopened in the caller's table through the table of `task` (0: the process's
// leader), where it is number fd_; -errno, or -EBADF if that number names another file.
int HeldFd::reopen_from(pid_t task) const {
    char path[64];
    if (task == 0)
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd_);
    else
        snprintf(path, sizeof path, "/proc/self/task/%d/fd/%d", task, fd_);
    const int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) return -errno;
    if (!names_file(fd)) {
        close(fd);
        return -EBADF;
    }
    return fd;
}

int HeldFd::copy() const {
    if (fd_ < 0) return -ENOENT;
    if (!caller_holds()) return reopen_from(holder_);
    if (!names_file(fd_)) return -EBADF;
    const int fd = fcntl(fd_, F_DUPFD_CLOEXEC, 0);
    return fd < 0 ? -errno : fd;
}

int HeldFd::adopt(pid_t from) {
    if (fd_ < 0) return -ENOENT;
    if (holder_ != 0) return 0;
    if (!has_own_fd_table()) return -EINVAL;
    const int fd = reopen_from(from);
    if (fd < 0) return fd;
    program_fd_ = fd_;
    fd_ = fd;
    holder_ = this_tid();
    return 0;
}

void HeldFd::close_program_copy() {
    if (program_fd_ < 0 || has_own_fd_table()) return;
    if (names_file(program_fd_)) close(program_fd_);
    program_fd_ = -1;
}

void HeldFd::release() {
    if (fd_ >= 0 && caller_holds() && names_file(fd_)) close(fd_);
    close_program_copy();
    forget();
}

} // namespace ukp::platform
