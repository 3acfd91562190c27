// The keeper of `ukprobe run`'s seccomp filter: a small process of ukprobe's own that holds
// the filter's listener beside it, and answers for it once it is gone.
//
// The program's tree makes its execve, exit_group and unlink calls through the filter
// (supervisor.hpp). Were the listener closed, the kernel would fail each of them with
// ENOSYS: a program that outlives a `ukprobe` killed with SIGKILL (or crashed, or ended
// by the OOM killer) could no longer run a program, remove a file or exit. The keeper
// keeps a descriptor of the listener and waits. If ukprobe goes while the tree still
// runs, the keeper lets every call go on unchanged from then on: the calls ukprobe had
// received and not answered (ukprobe notes each in a table the two share, and strikes it
// out once answered; one received in the instant before ukprobe died, not noted yet, is
// found by its number, next to the last one noted), then every new one. It ends when no process is left under the
// filter. It runs in a session of its own (no terminal's signals), with no descriptor of
// ukprobe's but the two it needs: a pipe ukprobe's output goes to still ends when
// ukprobe does.
#pragma once

#include <cstdint>
#include <sys/types.h>

namespace ukprobe {

class Keeper {
public:
    // Forks the keeper; false if it could not be (errno). Before the program's child: the
    // child knows then whether it may outlive ukprobe. The keeper's side of the fork makes
    // nothing but system calls (ukprobe's other threads may hold any lock).
    bool start();
    // Hands it the filter's listener; false if it could not take it (then it ends).
    bool give(int notify_fd);
    pid_t pid() const { return pid_; }
    bool running() const { return pid_ > 0; }

private:
    pid_t pid_ = -1;
    int sock_ = -1; // ukprobe's end: its close (ukprobe's exit, whatever the cause) is the signal
};

// The calls ukprobe has received from the listener and not answered yet, in the table the
// keeper reads: noted as each is received, struck out after its answer. Nothing when no
// keeper runs.
void keeper_note(uint64_t id);
void keeper_strike(uint64_t id);

// The system call `id` waiting on the listener goes on unchanged (and is struck out).
// System calls only: the keeper's side of the fork uses it too.
void continue_call(int notify_fd, uint64_t id);

} // namespace ukprobe
