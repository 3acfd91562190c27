// Where the agent keeps the file descriptors it holds for the life of the process: high
// up, not at the lowest free numbers, which programs assume are theirs (a shell's
// `exec 4>file`, code that expects open() to return 3 or that dup2()s onto small numbers).
#pragma once

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

namespace ukp::platform {

// Moves fd (close-on-exec) to the lowest free number at or above half the descriptor
// limit, at most 512; returns the new number, or fd unchanged if there is no room there.
inline int move_fd_high(int fd) {
    if (fd < 0) return fd;
    rlimit lim{};
    if (getrlimit(RLIMIT_NOFILE, &lim) != 0) return fd;
    const rlim_t half = lim.rlim_cur == RLIM_INFINITY ? 512 : lim.rlim_cur / 2;
    const int floor = static_cast<int>(half < 512 ? half : 512);
    if (fd >= floor) return fd;
    const int high = fcntl(fd, F_DUPFD_CLOEXEC, floor);
    if (high < 0) return fd;
    close(fd);
    return high;
}

// Grows the process's descriptor table to the numbers move_fd_high() uses, by moving a
// descriptor there and closing it. The kernel grows a table that several threads share
// only after an RCU grace period (milliseconds, in the first move_fd_high() of a
// process whose agent had started its threads), and one of a single thread at once: the
// agent calls this at load. The table keeps its size.
inline void grow_fd_table() {
    const int fd = open("/", O_PATH | O_CLOEXEC);
    if (fd >= 0) close(move_fd_high(fd));
}

} // namespace ukp::platform
