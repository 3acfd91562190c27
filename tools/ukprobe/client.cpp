#include "client.hpp"

#include "control/fd_passing.hpp"
#include "proc.hpp"

#include <fmt/core.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <poll.h>
#include <stdexcept>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

namespace ukprobe {

using namespace ukp::control;

long process_euid(int pid) {
    std::ifstream in(fmt::format("/proc/{}/status", pid));
    std::string line;
    while (std::getline(in, line)) {
        if (line.rfind("Uid:", 0) != 0) continue;
        long real = -1, effective = -1;
        if (sscanf(line.c_str(), "Uid: %ld %ld", &real, &effective) == 2) return effective;
    }
    return -1;
}

std::string agent_socket_path(int pid, unsigned uid) {
    const std::string proc = fmt::format("/proc/{}", pid);
    struct stat ns {};
    uint64_t pid_ns = kInitialPidNs;
    if (stat((proc + "/ns/pid").c_str(), &ns) == 0) pid_ns = ns.st_ino;
    struct stat mnt {
    }, own_mnt{};
    const std::string root = stat((proc + "/ns/mnt").c_str(), &mnt) == 0 && stat("/proc/self/ns/mnt", &own_mnt) == 0 &&
                                     (mnt.st_ino != own_mnt.st_ino || mnt.st_dev != own_mnt.st_dev)
                                 ? proc + "/root"
                                 : "";
    // Under /tmp, or /dev/shm for a process that cannot write /tmp (protocol.hpp). With a
    // socket in both, the newer: the other is an earlier image's, left behind where the
    // process's exec took it into a mount namespace whose /tmp is read-only.
    const std::string path = root + socket_path(uid, own_number(pid), pid_ns);
    const std::string fallback = root + socket_path(uid, own_number(pid), pid_ns, true);
    struct stat st {
    }, fst{};
    if (stat(fallback.c_str(), &fst) != 0 || !S_ISSOCK(fst.st_mode)) return path;
    if (stat(path.c_str(), &st) != 0 || !S_ISSOCK(st.st_mode)) return fallback;
    const auto newer = [](const timespec &a, const timespec &b) {
        return a.tv_sec != b.tv_sec ? a.tv_sec > b.tv_sec : a.tv_nsec > b.tv_nsec;
    };
    return newer(fst.st_mtim, st.st_mtim) ? fallback : path;
}

std::string refusal(const Reply &r, Op op, const std::string &path, int pid) {
    std::string what = op_name(static_cast<uint16_t>(op));
    if (!path.empty()) what += " " + path;
    std::string msg = fmt::format("{} in process {}: {}", what, pid, strerror(-r.status));
    if (!r.payload.empty()) msg += "\n" + r.payload;
    while (!msg.empty() && msg.back() == '\n') msg.pop_back();
    return msg;
}

Client::~Client() {
    if (fd_ >= 0) close(fd_);
}

int Client::connect(int pid, std::string *why) {
    const long uid = process_euid(pid);
    if (uid < 0) {
        *why = fmt::format("no process {}", pid);
        return -ESRCH;
    }
    const std::string path = agent_socket_path(pid, static_cast<unsigned>(uid));
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    if (path.size() >= sizeof addr.sun_path) return -ENAMETOOLONG;
    memcpy(addr.sun_path, path.c_str(), path.size() + 1);
    fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd_ < 0) return -errno;
    if (::connect(fd_, reinterpret_cast<sockaddr *>(&addr), sizeof addr) != 0) {
        const int err = errno;
        close(fd_);
        fd_ = -1;
        if (err == ENOENT || err == ECONNREFUSED)
            *why = fmt::format("no agent listens in process {} ({}); run `ukprobe attach {}` first", pid, path, pid);
        else
            *why = fmt::format("cannot connect to {}: {}", path, strerror(err));
        return -err;
    }
    return 0;
}

namespace {

void write_all(int fd, const void *buf, size_t n) {
    auto *p = static_cast<const char *>(buf);
    while (n > 0) {
        const ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) throw std::runtime_error(fmt::format("lost the agent: {}", strerror(errno)));
        p += w;
        n -= static_cast<size_t>(w);
    }
}

// Reads n bytes; false when the connection ends first.
bool read_all(int fd, void *buf, size_t n) {
    auto *p = static_cast<char *>(buf);
    while (n > 0) {
        const ssize_t r = read(fd, p, n);
        if (r < 0 && errno == EINTR) continue;
        if (r == 0) return false;
        if (r < 0) throw std::runtime_error(fmt::format("lost the agent: {}", strerror(errno)));
        p += r;
        n -= static_cast<size_t>(r);
    }
    return true;
}

} // namespace

std::string lost_agent_message(const AgentGone &e, int pid) {
    if (pid <= 0) return e.what();
    // A process on its way out closes its sockets before it is a zombie.
    for (int i = 0; i < 100 && process_alive(pid); ++i) usleep(10 * 1000);
    if (!process_alive(pid)) return fmt::format("process {} ended before its agent replied", pid);
    return e.what();
}

bool Client::peer_closed() const {
    if (fd_ < 0) return true;
    pollfd p{fd_, POLLRDHUP, 0};
    return poll(&p, 1, 0) == 1 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

void Client::set_timeout_ms(int ms) {
    if (fd_ < 0) return;
    const timeval tv{ms / 1000, (ms % 1000) * 1000};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

Reply Client::request(Op op, const std::string &path, const std::string &payload) {
    if (fd_ < 0) throw std::runtime_error("not connected");
    const RequestHeader h{kMagic, kVersion, static_cast<uint16_t>(op), static_cast<uint32_t>(path.size()),
                          static_cast<uint32_t>(payload.size())};
    write_all(fd_, &h, sizeof h);
    write_all(fd_, path.data(), path.size());
    write_all(fd_, payload.data(), payload.size());

    ReplyHeader rh{};
    Reply reply;
    // The header comes with recvmsg: a descriptor may ride with its bytes.
    const ssize_t n = recv_with_fd(fd_, &rh, sizeof rh, &reply.fd);
    if (n == 0) throw AgentGone();
    if (n < 0) throw std::runtime_error(fmt::format("lost the agent: {}", strerror(errno)));
    if (static_cast<size_t>(n) < sizeof rh &&
        !read_all(fd_, reinterpret_cast<char *>(&rh) + n, sizeof rh - static_cast<size_t>(n)))
        throw AgentGone();
    if (rh.magic != kMagic) throw std::runtime_error("the agent's reply is not of this protocol");
    if (rh.payload_len > kMaxPayload) throw std::runtime_error("the agent's reply is too large");
    reply.status = rh.status;
    reply.payload.resize(rh.payload_len);
    if (!read_all(fd_, reply.payload.data(), reply.payload.size())) throw AgentGone();
    return reply;
}

std::string refs_cache_dir() {
    if (const char *given = getenv("UKP_CACHE_DIR")) return given;
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    const std::string base = xdg != nullptr && xdg[0] == '/'     ? std::string(xdg)
                             : home != nullptr && home[0] == '/' ? std::string(home) + "/.cache"
                                                                 : std::string();
    if (base.empty()) return {};
    mkdir(base.c_str(), 0700);
    return base + "/ukprobes";
}

} // namespace ukprobe
