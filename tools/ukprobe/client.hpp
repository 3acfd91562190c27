// The controller's end of the control socket (src/control/protocol.hpp).
#pragma once

#include "control/protocol.hpp"

#include <stdexcept>
#include <string>

namespace ukprobe {

struct Reply {
    int status = 0;      // >= 0 success, < 0 a negative errno from the agent
    std::string payload; // the text, or on error the agent's message
    int fd = -1;         // a descriptor passed with the reply, or -1
};

class Client {
public:
    Client() = default;
    Client(const Client &) = delete;
    Client &operator=(const Client &) = delete;
    ~Client();

    // Connects to the agent in process `pid`. 0, or a negative errno with *why filled in.
    int connect(int pid, std::string *why);
    // Sends one request and waits for its reply. Throws std::runtime_error when the
    // connection breaks.
    Reply request(ukp::control::Op op, const std::string &path = {}, const std::string &payload = {});
    // Whether the agent's end of the connection is gone (its process exited or exec'd:
    // the socket closes with the old image), without waiting and without reading.
    bool peer_closed() const;
    // Makes a request that waits longer than `ms` for the agent (sending or receiving)
    // fail as a broken connection. After connect.
    void set_timeout_ms(int ms);

private:
    int fd_ = -1;
};

// What Client::request throws when the agent's end closes before its reply: the process
// ended or exec'd, or the agent detached.
class AgentGone : public std::runtime_error {
public:
    AgentGone() : std::runtime_error("the agent closed the connection") {}
};

// What a command that lost the agent of `pid` says: that the process ended, when it did
// (waiting up to a second for it to get there), or e.what().
std::string lost_agent_message(const AgentGone &e, int pid);

// What a refused request says: "write events/g/e/filter in process 42: Invalid argument",
// then the agent's message (its error_log entry) on the next lines.
std::string refusal(const Reply &r, ukp::control::Op op, const std::string &path, int pid);

// The uid whose socket directory serves `pid` (its effective uid), or -1.
long process_euid(int pid);

// Where the agent of `pid` (running as `uid`) listens, as this process reaches it: named
// by the number and the pid namespace the process has in its own (protocol.hpp), under
// /tmp or (a process that cannot write /tmp) /dev/shm, and in another mount namespace (a
// private /tmp) through the process's root.
std::string agent_socket_path(int pid, unsigned uid);

// Where agents keep the reference tables of the objects they probe (the agent's
// refs_cache.cpp): UKP_CACHE_DIR if set (empty: none), else $XDG_CACHE_HOME/ukprobes or
// ~/.cache/ukprobes, whose parent is made if missing (the agent makes the last component,
// mode 0700). Empty when there is no such place.
std::string refs_cache_dir();

} // namespace ukprobe
