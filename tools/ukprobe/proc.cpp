#include "proc.hpp"

#include <fmt/core.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <unistd.h>

namespace ukprobe {

std::string comm_of(int pid) {
    std::ifstream in(fmt::format("/proc/{}/comm", pid));
    std::string s;
    std::getline(in, s);
    return s;
}

int parent_of(int pid) {
    std::ifstream in(fmt::format("/proc/{}/stat", pid));
    std::string stat;
    std::getline(in, stat);
    const size_t paren = stat.rfind(')');
    if (paren == std::string::npos) return -1;
    int ppid = -1;
    char state = 0;
    if (sscanf(stat.c_str() + paren + 1, " %c %d", &state, &ppid) != 2) return -1;
    return ppid;
}

bool process_alive(int pid) {
    std::ifstream in(fmt::format("/proc/{}/stat", pid));
    std::string stat;
    std::getline(in, stat);
    const size_t paren = stat.rfind(')');
    return paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] != 'Z' && stat[paren + 2] != 'X';
}

int own_number(int pid) {
    std::ifstream in(fmt::format("/proc/{}/status", pid));
    for (std::string line; std::getline(in, line);) {
        if (line.rfind("NSpid:", 0) != 0) continue;
        std::istringstream fields(line.substr(6));
        int own = pid;
        for (int n = 0; fields >> n;) own = n;
        return own;
    }
    return pid;
}

int tgid_of(int tid) {
    std::ifstream in(fmt::format("/proc/{}/status", tid));
    std::string line;
    while (std::getline(in, line))
        if (line.rfind("Tgid:", 0) == 0) return atoi(line.c_str() + 5);
    return -1;
}

bool descends_from_us(int pid) {
    const int self = getpid();
    for (int i = 0; i < 256 && pid > 1; ++i) {
        pid = parent_of(pid);
        if (pid == self) return true;
    }
    return false;
}

} // namespace ukprobe
