// `ukprobe mount`: the agent's files as a FUSE file system laid out as tracefs, so that
// echo and cat work on them as on /sys/kernel/tracing. docs/cli.md, "mount", is the
// reference.
#pragma once

#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace ukprobe {

struct MountOptions {
    std::string dir;                       // the mount point, an existing directory
    bool foreground = false;               // serve in this process; else return once mounted
    std::vector<std::string> fuse_options; // -o OPT, handed to FUSE (allow_other, debug, ...)
};

// Registers the `mount` subcommand on `app`, filling `o`.
CLI::App *add_mount_command(CLI::App &app, MountOptions &o);

// Mounts the files of the agent in process `pid` at o.dir and serves them until the file
// system is unmounted or the process exits. Throws std::runtime_error when it cannot
// mount; returns the exit status otherwise.
int cmd_mount(int pid, const MountOptions &o);

} // namespace ukprobe
