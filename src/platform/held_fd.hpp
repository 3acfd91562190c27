// A descriptor the agent keeps for the life of the process (the memfd of the
// trace rings, of the kprobe_profile counters), and which descriptor
// table holds it.
//
// The program's table is the program's: a descriptor of ours there is one it
// can see in /proc/self/fd, one fewer under its RLIMIT_NOFILE, one it may close
// or dup2() over, and one every child of fork() inherits. So a memfd made on
// one of the program's threads is adopted by the control thread, which runs
// with a table of its own (text::use_own_fd_table): it reopens the file through
// /proc/self/task/TID/fd/N, and the program's copy is closed
// (docs/reference.md, "Descriptors").
//
// Every number is checked against the file's identity before it is used or
// closed: the program may have closed ours and opened something else under the
// same number.
#pragma once

#include <sys/types.h>

namespace ukp::platform {

// Gives the calling thread a descriptor table of its own, empty but for 0-2, which lead
// nowhere: the agent's threads keep their descriptors out of the program's table. The
// thread must not keep a descriptor for others to use, nor close one of theirs. 0 or
// -errno.
int enter_own_fd_table();
// Whether the calling thread runs with a table of its own (enter_own_fd_table()).
bool has_own_fd_table();

class HeldFd {
public:
    // Takes `fd`, just made on the calling thread (in its table), with its identity.
    void set(int fd);
    // Whether it is held in the program's table (not yet adopted).
    bool in_program_table() const { return fd_ >= 0 && holder_ == 0; }

    // A descriptor of the caller's own for the file (close-on-exec; the caller closes
    // it), or -errno: a copy when the caller's table holds it, else a reopening.
    int copy() const;

    // On a thread with a table of its own: takes the file into that table, reopened
    // from the table of `from` (a thread of the program). The program's number is kept
    // for close_program_copy(). 0 or -errno (nothing changes then).
    int adopt(pid_t from);
    // On a thread of the program's table: closes the number adopt() left there, if it
    // still names the file.
    void close_program_copy();

    // Closes it, if the caller's table holds it and the number still names the file;
    // forgets it either way.
    void release();

    // For a child of fork(), which works without the C library (probes may be on it):
    // the number, whether the child's table has it (it held it in the program's), and
    // whether a file of that identity is this one.
    int number() const { return fd_; }
    bool same_file(dev_t dev, ino_t ino) const { return dev == dev_ && ino == ino_; }
    // Takes `fd` of the program's table, of that identity (no call into the C library).
    void set_in_program_table(int fd, dev_t dev, ino_t ino) {
        *this = HeldFd{};
        fd_ = fd;
        dev_ = dev;
        ino_ = ino;
    }
    // Forgets it without closing anything.
    void forget() { *this = HeldFd{}; }

private:
    bool names_file(int fd) const;     // fstat: the same device and inode
    bool caller_holds() const;         // the caller's table is the one that holds fd_
    int reopen_from(pid_t task) const; // through /proc/self/[task/TID/]fd/N

    int fd_ = -1;
    pid_t holder_ = 0;    // the thread whose own table holds fd_, or 0: the program's table
    int program_fd_ = -1; // the program's number, after adopt(), until closed
    dev_t dev_ = 0;
    ino_t ino_ = 0;
};

} // namespace ukp::platform
