// The seccomp side of `ukprobe run`: the filter the program's tree runs under, which hands
// exit_group, execve(at), unlink(at) and the agents' notices (trace/ring.hpp) to ukprobe
// (SECCOMP_RET_USER_NOTIF), and ukprobe's end of it: the notifications received, answered,
// and held while the streams empty a ring (Hold). No ptrace: probe hits (SIGTRAP) never
// stop.
#pragma once

#include <linux/seccomp.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

namespace ukprobe {

// The seccomp filter of the child and its descendants. exit_group, execve(at), unlink(at)
// and the agents' notices (ring.hpp: an rt_sigprocmask that changes nothing) wait for
// ukprobe; every other call runs as usual, the program's own rt_sigprocmask included.
// An agent whose control thread listens gives notice before main, and waits while
// ukprobe connects and sets the filters and triggers. Installed in the child before its
// exec; returns the listener's descriptor, or -1 (errno).
int install_filter();

// An agent's notice (ring.hpp) of `kind`.
bool notice(const seccomp_notif &req, long kind);
// A forked child's notice of its own ring (kNoticeForkedRing); *parent: the process it
// was forked from, as its agent says, or 0.
bool forked_ring_notice(const seccomp_notif &req, int *parent);

// Whether an execve(2) the process waits in will fail for want of its file: a shell or
// execvp() tries every directory of PATH in turn, and ukprobe need not empty a ring for
// each miss. Reads the path from the process's memory (nothing else may change it: the
// caller waits in the call); anything unclear answers false, and the ring is emptied.
bool exec_file_missing(const seccomp_notif &req);

// A system call waiting for ukprobe (a seccomp notification): let go once the last
// stream that empties a ring for it drops its share, or by expire() at the latest. The
// thread that answers notifications hands these out and goes on: it never waits for
// output.
class Hold {
public:
    Hold(int notify_fd, uint64_t id);
    ~Hold() { let_go(); }
    Hold(const Hold &) = delete;
    Hold &operator=(const Hold &) = delete;

    // Lets the call go if its time is up; whether it is gone.
    bool expire(std::chrono::steady_clock::time_point now);

    // The call goes on unchanged (once).
    void let_go();

private:
    const int notify_fd_;
    const uint64_t id_;
    const std::chrono::steady_clock::time_point deadline_;
    std::atomic<bool> gone_{false};
};
using HoldPtr = std::shared_ptr<Hold>;

// ukprobe's end of the filter, on the thread that answers the notifications.
class Supervisor {
public:
    // From now on the notifications come on `notify_fd`, the listener install_filter gave
    // the child (-1: none).
    void listen(int notify_fd) { notify_fd_ = notify_fd; }
    int fd() const { return notify_fd_; }

    // Receives the notification that is ready; false if none could be.
    bool receive(seccomp_notif *req);
    // The next notification received while a ping waited for its answer (agent_answers),
    // in order; false once none is left.
    bool next_deferred(seccomp_notif *req);

    // Whether the agent of `pid` answers a ping within `timeout_ms` (`verbose`: says so on
    // stderr if not). Notifications that come meanwhile wait their turn (next_deferred).
    bool agent_answers(int pid, int timeout_ms, bool verbose);

    // The waiting system call returns `value` without running.
    void answer(uint64_t id, long value);
    // The waiting system call goes on unchanged.
    void let_go(uint64_t id);
    // The waiting system call, held for the streams that empty a ring for it; let go by
    // expire_holds at the latest.
    HoldPtr hold(uint64_t id);
    // Lets go the calls held past their time; forgets those let go.
    void expire_holds(std::chrono::steady_clock::time_point now);

private:
    int notify_fd_ = -1;
    std::deque<seccomp_notif> deferred_;     // received while waiting for a ping's answer
    std::vector<std::weak_ptr<Hold>> holds_; // calls held for the streams, let go by kDrainTimeout
};

} // namespace ukprobe
