// The control thread (control.cpp): the agent's end of the unix socket that `ukprobe`
// talks to. protocol.hpp has the wire format.
#pragma once

namespace ukp::control {

// Starts the control thread if it is not running: creates the user's socket directory
// (socket_dir(), mode 0700), listens on socket_path(euid, pid). 0 or a negative errno
// (-EPERM: the directory belongs to someone else or others can enter it).
int start();
// Stops the thread; controllers still connected lose what they added. 0 or -errno.
int stop();

} // namespace ukp::control

// The same, for the injector (it calls them by their ELF names) and for programs.
extern "C" int ukp_control_start(void);
extern "C" int ukp_control_stop(void);
