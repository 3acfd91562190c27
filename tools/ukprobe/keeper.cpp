#include "keeper.hpp"

#include "control/fd_passing.hpp"

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <fcntl.h>
#include <linux/seccomp.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace ukprobe {

namespace {

// The calls ukprobe has received and not answered, by id (0: a free slot), in memory the
// keeper shares: open addressing from id % kSlots. More at once than it holds (each is a
// process waiting in execve, exit_group or unlink while its ring is emptied) go unnoted:
// should ukprobe die then, those processes would wait for good. Word kSlots after them:
// the id ukprobe noted last.
constexpr size_t kSlots = 4096;
constexpr size_t kTableWords = kSlots + 1;
std::atomic<uint64_t> *g_slots = nullptr;

// A call ukprobe received in the instant before it died, and did not note, is found by
// its id: the listener numbers its calls one after another (from a random start, the
// kernel's seccomp_next_notify_id()), and hands them out in that order. So it is one of
// the few after the last one noted, or before the first one the keeper receives. An id
// tried that no call has (ENOENT), or whose call nobody received yet (EINPROGRESS: the
// keeper receives it in turn), changes nothing.
constexpr uint64_t kNearby = 64;

// SECCOMP_USER_NOTIF_FLAG_CONTINUE for the call `id`; false if no such call waits for an
// answer.
bool send_continue(int notify_fd, uint64_t id) {
    seccomp_notif_resp resp;
    memset(&resp, 0, sizeof resp);
    resp.id = id;
    resp.flags = SECCOMP_USER_NOTIF_FLAG_CONTINUE;
    return ioctl(notify_fd, SECCOMP_IOCTL_NOTIF_SEND, &resp) == 0; // ENOENT: answered before, or the caller was killed
}

// The calls numbered [from, from + n) that were received and not answered go on.
void continue_nearby(int notify_fd, uint64_t from, uint64_t n) {
    for (uint64_t i = 0; i < n; ++i) send_continue(notify_fd, from + i);
}

// Closes every descriptor from `from` up but `keep`.
void close_all_but(int from, int keep) {
    if (keep > from) syscall(SYS_close_range, from, keep - 1, 0);
    syscall(SYS_close_range, keep > from ? keep + 1 : from, ~0u, 0);
}

// The keeper's side of the fork: system calls only.
[[noreturn]] void keep(int sock) {
    setsid(); // no terminal: ^C at ukprobe is not for the keeper
    prctl(PR_SET_NAME, "ukp-keeper", 0, 0, 0);
    for (int s : {SIGHUP, SIGINT, SIGQUIT, SIGPIPE, SIGTSTP, SIGTTIN, SIGTTOU}) signal(s, SIG_IGN);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr); // ukprobe's are blocked (its signalfd); SIGTERM ends the keeper
    // Above the standard three, which become /dev/null (ukprobe may have run without them).
    if (sock < 3) {
        const int high = fcntl(sock, F_DUPFD_CLOEXEC, 3);
        if (high < 0) _exit(1);
        close(sock);
        sock = high;
    }
    const int null = open("/dev/null", O_RDWR | O_CLOEXEC);
    for (int fd = 0; fd < 3 && null >= 0; ++fd) dup2(null, fd);
    close_all_but(3, sock);
    // The listener, once the program's child has made it; nothing (ukprobe gone, or no
    // program started) ends the keeper.
    char byte = 0;
    int notify_fd = -1;
    if (ukp::control::recv_with_fd(sock, &byte, 1, &notify_fd) != 1 || notify_fd < 0) _exit(0);
    // Until ukprobe goes (its end of the socket closes) or no process is left under the
    // filter (the listener hangs up).
    for (;;) {
        pollfd fds[2] = {{sock, POLLIN, 0}, {notify_fd, 0, 0}};
        if (poll(fds, 2, -1) < 0) {
            if (errno == EINTR) continue;
            _exit(1);
        }
        if (fds[1].revents & (POLLHUP | POLLERR | POLLNVAL)) _exit(0);
        if (fds[0].revents != 0) {
            const ssize_t n = read(sock, &byte, 1);
            if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) break;
        }
    }
    // ukprobe is gone: what it left waiting goes on (noted, or received just after the
    // last one noted), then every call as it comes.
    for (size_t i = 0; i < kSlots; ++i)
        if (const uint64_t id = g_slots[i].load(); id != 0) continue_call(notify_fd, id);
    const uint64_t last = g_slots[kSlots].load();
    if (last != 0) continue_nearby(notify_fd, last + 1, kNearby);
    bool first = last == 0; // nothing was noted: the first call received shows where the ids are
    for (;;) {
        pollfd fd{notify_fd, POLLIN, 0};
        if (poll(&fd, 1, -1) < 0) {
            if (errno == EINTR) continue;
            _exit(1);
        }
        if (fd.revents & POLLIN) {
            seccomp_notif req;
            memset(&req, 0, sizeof req);
            if (ioctl(notify_fd, SECCOMP_IOCTL_NOTIF_RECV, &req) != 0) continue;
            continue_call(notify_fd, req.id);
            if (first) continue_nearby(notify_fd, req.id - kNearby, kNearby);
            first = false;
        } else if (fd.revents & (POLLHUP | POLLERR | POLLNVAL)) {
            _exit(0);
        }
    }
}

} // namespace

void continue_call(int notify_fd, uint64_t id) {
    send_continue(notify_fd, id);
    keeper_strike(id);
}

bool Keeper::start() {
    void *table =
        mmap(nullptr, kTableWords * sizeof(uint64_t), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (table == MAP_FAILED) return false;
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
        munmap(table, kTableWords * sizeof(uint64_t));
        return false;
    }
    g_slots = static_cast<std::atomic<uint64_t> *>(table);
    const pid_t pid = fork();
    if (pid == 0) {
        close(sv[0]);
        keep(sv[1]);
    }
    close(sv[1]);
    if (pid < 0) {
        close(sv[0]);
        g_slots = nullptr;
        munmap(table, kTableWords * sizeof(uint64_t));
        return false;
    }
    pid_ = pid;
    sock_ = sv[0];
    return true;
}

bool Keeper::give(int notify_fd) {
    if (sock_ < 0) return false;
    const char byte = 0;
    const iovec one{const_cast<char *>(&byte), 1};
    if (notify_fd >= 0 && ukp::control::send_with_fd(sock_, &one, 1, notify_fd) == 1) return true;
    close(sock_); // nothing to keep: the keeper ends
    sock_ = -1;
    return false;
}

void keeper_note(uint64_t id) {
    if (g_slots == nullptr || id == 0) return;
    g_slots[kSlots].store(id);
    for (size_t i = 0; i < kSlots; ++i) {
        uint64_t free = 0;
        if (g_slots[(id + i) % kSlots].compare_exchange_strong(free, id)) return;
    }
}

void keeper_strike(uint64_t id) {
    if (g_slots == nullptr || id == 0) return;
    for (size_t i = 0; i < kSlots; ++i) {
        uint64_t noted = id;
        if (g_slots[(id + i) % kSlots].compare_exchange_strong(noted, 0)) return;
    }
}

} // namespace ukprobe
