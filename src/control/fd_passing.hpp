// A file descriptor passed over a unix socket (SCM_RIGHTS) with some bytes of a message:
// the agent's replies (Op::kOpenFd), the CLI's end of them, and `ukprobe run`'s hand-over
// of the seccomp listener. Header-only: the CLI does not link the agent.
#ifndef UKP_CONTROL_FD_PASSING_HPP
#define UKP_CONTROL_FD_PASSING_HPP

#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace ukp::control {

// sendmsg of iov[0..iovcnt) with `fd` riding along (none when fd < 0); retried on EINTR.
// Returns the bytes sent (possibly fewer than asked: the caller sends the rest without
// the descriptor) or -1 with errno set. MSG_NOSIGNAL: a closed peer is an error, not SIGPIPE.
inline ssize_t send_with_fd(int sock, const iovec *iov, int iovcnt, int fd) {
    msghdr msg{};
    msg.msg_iov = const_cast<iovec *>(iov);
    msg.msg_iovlen = static_cast<size_t>(iovcnt);
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    if (fd >= 0) {
        msg.msg_control = control;
        msg.msg_controllen = sizeof control;
        cmsghdr *c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int));
        std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
    }
    ssize_t n;
    do n = sendmsg(sock, &msg, MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    return n;
}

// recvmsg of up to `len` bytes into buf; a descriptor that rode with them goes to *fd
// (close-on-exec), else *fd is -1. Retried on EINTR. Returns the bytes read (0 at the
// end of the stream) or -1 with errno set. Descriptors beyond the first are closed.
inline ssize_t recv_with_fd(int sock, void *buf, size_t len, int *fd) {
    *fd = -1;
    iovec iov{buf, len};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)] = {};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    ssize_t n;
    do n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
    while (n < 0 && errno == EINTR);
    if (n < 0) return n;
    for (cmsghdr *c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
        const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < count; ++i) {
            int got;
            std::memcpy(&got, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
            if (*fd < 0)
                *fd = got;
            else
                close(got);
        }
    }
    return n;
}

} // namespace ukp::control

#endif
