#include "supervisor.hpp"

#include "client.hpp"
#include "keeper.hpp"

#include "control/protocol.hpp"
#include "trace/ring.hpp"

#include <fmt/core.h>

#include <cerrno>
#include <climits>
#include <cstddef>
#include <cstring>
#include <linux/audit.h>
#include <linux/filter.h>
#include <poll.h>
#include <string>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

using ukp::control::Op;

namespace ukprobe {

namespace {

using Clock = std::chrono::steady_clock;

// Longest wait for a process's ring to be emptied at its exit.
constexpr auto kDrainTimeout = std::chrono::seconds(5);

// A ping to the agent of `pid` sent, or -1: its socket may be bound and listening before
// its control thread exists, and a request would then wait forever on a process ukprobe
// holds. The answer comes on the descriptor returned (Supervisor::agent_answers).
int send_ping(int pid) {
    const std::string path = agent_socket_path(pid, static_cast<unsigned>(geteuid()));
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    if (path.size() >= sizeof addr.sun_path) return -1;
    memcpy(addr.sun_path, path.c_str(), path.size() + 1);
    const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    const ukp::control::RequestHeader h{ukp::control::kMagic, ukp::control::kVersion, static_cast<uint16_t>(Op::kPing),
                                        0, 0};
    if (::connect(fd, reinterpret_cast<sockaddr *>(&addr), sizeof addr) != 0 ||
        send(fd, &h, sizeof h, MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof h)) {
        close(fd);
        return -1;
    }
    return fd;
}

} // namespace

int install_filter() {
    constexpr uint32_t kNotify = SECCOMP_RET_USER_NOTIF, kAllow = SECCOMP_RET_ALLOW;
    sock_filter code[] = {
        /* 0 */ BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, arch)),
        /* 1 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
        /* 2 */ BPF_STMT(BPF_RET | BPF_K, kAllow),
        /* 3 */ BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
        /* 4 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_exit_group, 7, 0),
        /* 5 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_execve, 6, 0),
        /* 6 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_execveat, 5, 0),
        /* 7 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_unlink, 4, 0),
        /* 8 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_unlinkat, 3, 0),
        /* 9 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_rt_sigprocmask, 0, 3),
        // The low word of args[4] (little-endian): an agent's notice, or the program's own call.
        /* 10 */ BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, args[4])),
        /* 11 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, static_cast<uint32_t>(ukp::trace::kNoticeMagic), 0, 1),
        /* 12 */ BPF_STMT(BPF_RET | BPF_K, kNotify),
        /* 13 */ BPF_STMT(BPF_RET | BPF_K, kAllow),
    };
    sock_fprog prog{static_cast<unsigned short>(sizeof code / sizeof code[0]), code};
    int fd = static_cast<int>(syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_NEW_LISTENER, &prog));
    if (fd < 0 && errno == EACCES) {
        // Without CAP_SYS_ADMIN a filter needs no_new_privs (set-uid programs then run
        // without their privileges).
        if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return -1;
        fd = static_cast<int>(syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_NEW_LISTENER, &prog));
    }
    return fd;
}

// An agent's notice (ring.hpp) of `kind`.
bool notice(const seccomp_notif &req, long kind) {
    return req.data.nr == __NR_rt_sigprocmask && req.data.args[1] == 0 && req.data.args[2] == 0 &&
           req.data.args[4] == static_cast<uint64_t>(ukp::trace::kNoticeMagic) &&
           req.data.args[5] == static_cast<uint64_t>(kind);
}

bool forked_ring_notice(const seccomp_notif &req, int *parent) {
    const uint64_t word = req.data.args[5];
    constexpr uint64_t kKindMask = (uint64_t{1} << ukp::trace::kNoticeKindBits) - 1;
    if (!notice(req, static_cast<long>(word)) || (word & kKindMask) != ukp::trace::kNoticeForkedRing) return false;
    const uint64_t pid = word >> ukp::trace::kNoticeKindBits;
    *parent = pid <= 0x7fffffff ? static_cast<int>(pid) : 0;
    return true;
}

bool exec_file_missing(const seccomp_notif &req) {
    if (req.data.nr != __NR_execve) return false;
    const auto pid = static_cast<pid_t>(req.pid);
    std::string path;
    uint64_t at = req.data.args[0];
    constexpr uint64_t kPage = 4096;
    while (path.size() < PATH_MAX) {
        char chunk[kPage];
        const size_t n = kPage - at % kPage; // up to the end of the page: the next may be unmapped
        const iovec local{chunk, n};
        const iovec remote{reinterpret_cast<void *>(at), n};
        if (process_vm_readv(pid, &local, 1, &remote, 1, 0) != static_cast<ssize_t>(n)) return false;
        const void *nul = memchr(chunk, '\0', n);
        path.append(chunk, nul != nullptr ? static_cast<const char *>(nul) - chunk : n);
        if (nul != nullptr) break;
        at += n;
    }
    if (path.empty() || path.size() >= PATH_MAX) return false;
    // As the process sees it: its root for an absolute path, its working directory else.
    const std::string proc = "/proc/" + std::to_string(pid) + (path[0] == '/' ? "/root" : "/cwd/");
    struct stat st {};
    return stat((proc + path).c_str(), &st) != 0 && (errno == ENOENT || errno == ENOTDIR);
}

Hold::Hold(int notify_fd, uint64_t id) : notify_fd_(notify_fd), id_(id), deadline_(Clock::now() + kDrainTimeout) {}

bool Hold::expire(Clock::time_point now) {
    if (now >= deadline_) let_go();
    return gone_.load();
}

void Hold::let_go() {
    if (gone_.exchange(true)) return;
    continue_call(notify_fd_, id_);
}

bool Supervisor::receive(seccomp_notif *req) {
    memset(req, 0, sizeof *req); // the kernel wants it zeroed
    if (ioctl(notify_fd_, SECCOMP_IOCTL_NOTIF_RECV, req) != 0) return false;
    keeper_note(req->id); // until it is answered: the keeper's, should ukprobe die first
    return true;
}

bool Supervisor::next_deferred(seccomp_notif *req) {
    if (deferred_.empty()) return false;
    *req = deferred_.front();
    deferred_.pop_front();
    return true;
}

bool Supervisor::agent_answers(int pid, int timeout_ms, bool verbose) {
    const int fd = send_ping(pid);
    if (fd < 0) return false;
    bool ok = false;
    const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    for (;;) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now());
        if (left.count() < 0) break;
        pollfd fds[2] = {{fd, POLLIN, 0}, {notify_fd_, POLLIN, 0}};
        if (poll(fds, 2, static_cast<int>(left.count())) <= 0) break;
        if (fds[0].revents != 0) {
            ukp::control::ReplyHeader rh{};
            ok = recv(fd, &rh, sizeof rh, MSG_WAITALL) == static_cast<ssize_t>(sizeof rh) &&
                 rh.magic == ukp::control::kMagic;
            break;
        }
        seccomp_notif req;
        if (receive(&req)) deferred_.push_back(req);
    }
    close(fd);
    if (verbose && !ok) fmt::print(stderr, "ukprobe: process {} did not answer a ping in {} ms\n", pid, timeout_ms);
    return ok;
}

void Supervisor::answer(uint64_t id, long value) {
    seccomp_notif_resp resp;
    memset(&resp, 0, sizeof resp);
    resp.id = id;
    resp.val = value;
    ioctl(notify_fd_, SECCOMP_IOCTL_NOTIF_SEND, &resp); // ENOENT: the caller was killed meanwhile
    keeper_strike(id);
}

void Supervisor::let_go(uint64_t id) { continue_call(notify_fd_, id); }

HoldPtr Supervisor::hold(uint64_t id) {
    auto hold = std::make_shared<Hold>(notify_fd_, id);
    holds_.push_back(hold);
    return hold;
}

void Supervisor::expire_holds(Clock::time_point now) {
    std::erase_if(holds_, [now](const std::weak_ptr<Hold> &w) {
        const HoldPtr h = w.lock();
        return h == nullptr || h->expire(now);
    });
}

} // namespace ukprobe
