// The control socket's wire format, shared by the agent (control.cpp) and the CLI.
// Header-only and free of agent state so that the controller can use it without linking
// the agent. docs/cli.md, "Protocol", describes the same thing for people.
//
// One request, one reply, in order, over a SOCK_STREAM unix socket. All integers are
// little-endian (host order on x86-64).
//
//   request: RequestHeader, then path_len bytes of path, then payload_len bytes of payload
//   reply:   ReplyHeader,   then payload_len bytes of payload; when flags has kReplyFd,
//            one file descriptor rides with the header's bytes as SCM_RIGHTS.
#ifndef UKP_CONTROL_PROTOCOL_HPP
#define UKP_CONTROL_PROTOCOL_HPP

#include <cstdint>
#include <string>

namespace ukp::control {

constexpr uint32_t kMagic = 0x434b5055; // "UPKC" as bytes on the wire: 'U' 'P' 'K' 'C'
constexpr uint16_t kVersion = 1;
constexpr uint32_t kMaxPath = 4096;
constexpr uint32_t kMaxPayload = 64u << 20;

enum class Op : uint16_t {
    kPing = 1,   // reply payload: "ukprobes PROTOCOL VERSION pid PID"
    kRead = 2,   // path -> file text
    kWrite = 3,  // path, payload: replace (a write with O_TRUNC)
    kAppend = 4, // path, payload: append (>>)
    kDetach = 5, // undo the additions of this connection's session and of one-shot controllers; stop the thread
    kVerify = 6, // status: differing code bytes (>= 0) or -errno; payload: ukp_verify()'s report
    kOpenFd = 7, // path -> a file descriptor by SCM_RIGHTS: kTraceRingPath, the trace ring
    // Makes this connection a session: what it adds from now on (events defined, knobs
    // changed) is undone when it closes, even without kDetach (a killed controller).
    // Without it, additions belong to all one-shot controllers together and stay until
    // a kDetach.
    kSession = 8,
    // Makes this connection `ukprobe run`'s stream of the process: should it close while
    // the process runs (ukprobe killed), nobody reads the trace any more, and every event
    // is disabled (events/enable 0): the program goes on without its probes. An agent
    // that does not know it answers -EOPNOTSUPP; nothing else changes.
    kSupervised = 9,
};

constexpr uint16_t kReplyFd = 1; // ReplyHeader::flags: a descriptor rides with the header

// Op::kOpenFd's path for the memfd of the main trace ring (src/trace/ring.hpp's
// RingHeader at offset 0; its size is the file's). Reads of "event_table" give what
// printing its records takes (src/trace/print.hpp). A controller maps both and formats
// trace and trace_pipe itself; an agent without them answers -ENOENT.
constexpr const char *kTraceRingPath = "trace_ring";
// Op::kOpenFd's path for the memfd of the snapshot buffers (same layout): the snapshot
// file printed by the controller. Status 0 without a descriptor when no snapshot is
// allocated; an agent that does not serve it answers -ENOENT.
constexpr const char *kSnapshotRingPath = "snapshot_ring";
// Op::kOpenFd's path for the memfd of kprobe_profile's counters and their table
// (src/trace/counters.hpp): the controller reads the counts from it, also once the
// process is gone. An agent that does not serve it answers -ENOENT.
constexpr const char *kCountersPath = "counters";
// Read and written (Op::kRead, kWrite) like a file: the directory where the agent keeps
// the reference tables of the objects it probes, when its environment has no
// UKP_CACHE_DIR (`ukprobe attach` names its own). Written empty: none.
constexpr const char *kRefsCacheDirPath = "ukprobes/refs_cache_dir";

struct RequestHeader {
    uint32_t magic;       // kMagic
    uint16_t version;     // kVersion of the sender
    uint16_t op;          // Op
    uint32_t path_len;    // <= kMaxPath
    uint32_t payload_len; // <= kMaxPayload
};

struct ReplyHeader {
    uint32_t magic;       // kMagic
    uint16_t version;     // kVersion of the agent
    uint16_t flags;       // kReplyFd
    int32_t status;       // >= 0 success (op-specific value), < 0 a negative errno
    uint32_t payload_len; // on error: a message for people, may be empty
};

static_assert(sizeof(RequestHeader) == 16 && sizeof(ReplyHeader) == 16);

// Where the agents of `uid` listen: under /tmp, or, where the process cannot write /tmp (a
// container with a read-only root, `bwrap --ro-bind / /`, no /tmp at all), under /dev/shm
// (`fallback`). The directory is the user's own (mode 0700); the agent refuses to use it
// otherwise.
inline std::string socket_dir(unsigned uid, bool fallback = false) {
    return (fallback ? "/dev/shm/ukprobes-" : "/tmp/ukprobes-") + std::to_string(uid);
}

// The inode number of the kernel's first pid namespace (PROC_PID_INIT_INO), the one a
// process outside any container is in.
inline constexpr uint64_t kInitialPidNs = 0xeffffffcu;

// A process in another pid namespace (a container, `bwrap --unshare-pid`, `unshare -p`)
// that shares /tmp numbers itself differently: `pid` is the number its own namespace
// gives it, and the name carries that namespace's inode, so that its socket neither takes
// the name of a process outside nor is taken for one. PID.sock in the first namespace.
inline std::string socket_path(unsigned uid, int pid, uint64_t pid_ns = kInitialPidNs, bool fallback = false) {
    std::string name = std::to_string(pid);
    if (pid_ns != kInitialPidNs) name += "." + std::to_string(pid_ns);
    return socket_dir(uid, fallback) + "/" + name + ".sock";
}

inline const char *op_name(uint16_t op) {
    switch (static_cast<Op>(op)) {
    case Op::kPing:
        return "ping";
    case Op::kRead:
        return "read";
    case Op::kWrite:
        return "write";
    case Op::kAppend:
        return "append";
    case Op::kDetach:
        return "detach";
    case Op::kVerify:
        return "verify";
    case Op::kOpenFd:
        return "openfd";
    case Op::kSession:
        return "session";
    case Op::kSupervised:
        return "supervised";
    }
    return "?";
}

} // namespace ukp::control

#endif
