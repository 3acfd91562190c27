// What /proc tells `ukprobe run` of the processes of the program's tree.
#pragma once

#include <string>

namespace ukprobe {

// The program's name (/proc/PID/comm); empty if the process is gone.
std::string comm_of(int pid);

// The parent's pid, or -1.
int parent_of(int pid);

// The number process `pid` has in its own pid namespace (NSpid's last field: a
// container's, bwrap's), which its agent writes into its ring; `pid` if /proc does not say.
int own_number(int pid);

// The process thread `tid` belongs to, or -1.
int tgid_of(int tid);

// Whether `pid` exists and is not a zombie.
bool process_alive(int pid);

// Whether `pid` descends from this process.
bool descends_from_us(int pid);

} // namespace ukprobe
