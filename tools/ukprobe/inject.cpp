#include "inject.hpp"

#include <fmt/core.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <dirent.h>
#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <fstream>
#include <gelf.h>
#include <libelf.h>
#include <sstream>
#include <stdexcept>
#include <sys/ptrace.h>
#include <sys/uio.h>
#include <sys/user.h>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

namespace ukprobe {

namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void fail(const std::string &msg) { throw std::runtime_error(msg); }

std::string read_text(const std::string &path) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

// A "Key:\tvalue" line of /proc/PID/status.
std::string status_field(int pid, const char *key) {
    std::istringstream in(read_text(fmt::format("/proc/{}/status", pid)));
    std::string line;
    const std::string prefix = std::string(key) + ":";
    while (std::getline(in, line))
        if (line.rfind(prefix, 0) == 0) return line.substr(line.find_first_not_of(" \t", prefix.size()));
    return {};
}

bool have_cap_sys_ptrace() {
    const std::string caps = status_field(getpid(), "CapEff");
    if (caps.empty()) return false;
    return (std::stoull(caps, nullptr, 16) >> 19) & 1; // CAP_SYS_PTRACE is bit 19
}

// Why PTRACE_SEIZE failed with `err`, and what to do about it.
std::string refusal(int pid, int err) {
    if (err == ESRCH) return fmt::format("no process {}", pid);
    std::string why = fmt::format("cannot ptrace process {}: {}", pid, strerror(err));
    const std::string tracer = status_field(pid, "TracerPid");
    if (!tracer.empty() && tracer != "0") {
        const std::string comm = read_text(fmt::format("/proc/{}/comm", tracer));
        return why + fmt::format("\n  it is already traced by process {} ({}); a process has one tracer at a time: "
                                 "detach that one (a debugger, strace) and retry",
                                 tracer, comm.substr(0, comm.find('\n')));
    }
    const bool cap = have_cap_sys_ptrace();
    std::istringstream uids(status_field(pid, "Uid"));
    long ruid = -1, euid = -1, suid = -1;
    uids >> ruid >> euid >> suid;
    const long me = static_cast<long>(getuid());
    if (!cap && (ruid != me || euid != me || suid != me))
        return why + fmt::format("\n  the process runs as uid {} and you are uid {}: ptrace needs the same user or "
                                 "the CAP_SYS_PTRACE capability; run ukprobe as uid {} or as root",
                                 euid, me, euid);
    const std::string scope = read_text("/proc/sys/kernel/yama/ptrace_scope");
    if (!scope.empty() && !cap) {
        const int s = std::atoi(scope.c_str());
        if (s == 1)
            return why + "\n  Yama's kernel.yama.ptrace_scope is 1: only a parent may trace its descendants. Do one "
                         "of: `sudo sysctl kernel.yama.ptrace_scope=0`, `sudo setcap cap_sys_ptrace+ep "
                         "$(command -v ukprobe)`, run ukprobe as root, or start the program with `ukprobe run`";
        if (s == 2)
            return why + "\n  Yama's kernel.yama.ptrace_scope is 2: only processes with CAP_SYS_PTRACE may trace; run "
                         "ukprobe as root or give it the capability (`sudo setcap cap_sys_ptrace+ep ...`)";
        if (s == 3)
            return why + "\n  Yama's kernel.yama.ptrace_scope is 3: ptrace is disabled until reboot; start the "
                         "program with `ukprobe run` instead";
    }
    if (status_field(pid, "State").rfind("Z", 0) == 0) return why + "\n  the process is a zombie";
    return why + "\n  the process may be non-dumpable (setuid, or prctl(PR_SET_DUMPABLE, 0)), or a security "
                 "module refuses; run ukprobe as root, or start the program with `ukprobe run`";
}

struct Mapping {
    uint64_t start = 0, end = 0, offset = 0;
    std::string path;
};

std::vector<Mapping> read_maps(int pid) {
    std::vector<Mapping> maps;
    std::istringstream in(read_text(fmt::format("/proc/{}/maps", pid)));
    std::string line;
    while (std::getline(in, line)) {
        Mapping m;
        char perms[8];
        unsigned long long start, end, offset;
        int path_at = 0;
        if (sscanf(line.c_str(), "%llx-%llx %7s %llx %*s %*s %n", &start, &end, perms, &offset, &path_at) < 4) continue;
        m.start = start;
        m.end = end;
        m.offset = offset;
        if (path_at > 0) m.path = line.substr(static_cast<size_t>(path_at));
        maps.push_back(m);
    }
    return maps;
}

std::string base_name(const std::string &path) { return path.substr(path.rfind('/') + 1); }

// The run-time addresses of `names` in the loaded object mapped from `path` at `base`
// (the start of its mapping of file offset 0), from its .dynsym.
std::vector<uint64_t> dynamic_symbols(const std::string &path, uint64_t base, const std::vector<std::string> &names) {
    elf_version(EV_CURRENT);
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail(fmt::format("cannot open {}: {}", path, strerror(errno)));
    Elf *elf = elf_begin(fd, ELF_C_READ, nullptr);
    std::vector<uint64_t> found(names.size(), 0);
    uint64_t first_vaddr = UINT64_MAX;
    size_t phnum = 0;
    if (elf != nullptr && elf_getphdrnum(elf, &phnum) == 0) {
        for (size_t i = 0; i < phnum; ++i) {
            GElf_Phdr ph;
            if (gelf_getphdr(elf, static_cast<int>(i), &ph) != nullptr && ph.p_type == PT_LOAD)
                first_vaddr = std::min<uint64_t>(first_vaddr, ph.p_vaddr & ~(ph.p_align - 1));
        }
    }
    Elf_Scn *scn = nullptr;
    while (elf != nullptr && (scn = elf_nextscn(elf, scn)) != nullptr) {
        GElf_Shdr sh;
        if (gelf_getshdr(scn, &sh) == nullptr || sh.sh_type != SHT_DYNSYM) continue;
        Elf_Data *data = elf_getdata(scn, nullptr);
        const size_t count = sh.sh_entsize ? sh.sh_size / sh.sh_entsize : 0;
        for (size_t i = 0; data != nullptr && i < count; ++i) {
            GElf_Sym sym;
            if (gelf_getsym(data, static_cast<int>(i), &sym) == nullptr || sym.st_value == 0) continue;
            if (GELF_ST_TYPE(sym.st_info) != STT_FUNC && GELF_ST_TYPE(sym.st_info) != STT_GNU_IFUNC) continue;
            const char *name = elf_strptr(elf, sh.sh_link, sym.st_name);
            if (name == nullptr) continue;
            for (size_t k = 0; k < names.size(); ++k)
                if (found[k] == 0 && names[k] == name) found[k] = base + sym.st_value - first_vaddr;
        }
    }
    if (elf != nullptr) elf_end(elf);
    close(fd);
    return found;
}

// The thread to run the calls on: one blocked in a system call holds no library lock as
// a rule (a thread stopped inside malloc could deadlock dlopen); the leader otherwise.
int pick_thread(int pid, bool *in_syscall) {
    std::vector<int> tids;
    if (DIR *d = opendir(fmt::format("/proc/{}/task", pid).c_str())) {
        while (dirent *e = readdir(d))
            if (e->d_name[0] != '.') tids.push_back(std::atoi(e->d_name));
        closedir(d);
    }
    std::sort(tids.begin(), tids.end());
    // The leader first.
    std::stable_partition(tids.begin(), tids.end(), [&](int t) { return t == pid; });
    for (int tid : tids) {
        const std::string state = read_text(fmt::format("/proc/{}/task/{}/stat", pid, tid));
        const size_t paren = state.rfind(')');
        if (paren == std::string::npos || paren + 2 >= state.size()) continue;
        const char s = state[paren + 2];
        if (s == 'Z' || s == 'X' || s == 't' || s == 'T') continue;
        const std::string sys = read_text(fmt::format("/proc/{}/task/{}/syscall", pid, tid));
        if (!sys.empty() && std::isdigit(static_cast<unsigned char>(sys[0]))) {
            *in_syscall = true;
            return tid;
        }
    }
    *in_syscall = false;
    return pid;
}

class Tracee {
public:
    explicit Tracee(int tid) : tid_(tid) {}

    void read_mem(uint64_t addr, void *buf, size_t n) {
        iovec local{buf, n}, remote{reinterpret_cast<void *>(addr), n};
        if (process_vm_readv(tid_, &local, 1, &remote, 1, 0) != static_cast<ssize_t>(n))
            fail(fmt::format("cannot read the target's memory at {:#x}: {}", addr, strerror(errno)));
    }
    void write_mem(uint64_t addr, const void *buf, size_t n) {
        iovec local{const_cast<void *>(buf), n}, remote{reinterpret_cast<void *>(addr), n};
        if (process_vm_writev(tid_, &local, 1, &remote, 1, 0) != static_cast<ssize_t>(n))
            fail(fmt::format("cannot write the target's memory at {:#x}: {}", addr, strerror(errno)));
    }
    std::string read_string(uint64_t addr) {
        std::string s;
        char c;
        while (s.size() < 4096) {
            read_mem(addr + s.size(), &c, 1);
            if (c == 0) break;
            s += c;
        }
        return s;
    }

    // Calls fn(a0, a1) on the stopped thread with `sp` as its stack pointer (16-byte
    // aligned, the return address 0 written at sp - 8 by the caller's layout) and waits
    // for the return to trap at address 0.
    uint64_t call(const user_regs_struct &saved, uint64_t fn, uint64_t sp, uint64_t a0 = 0, uint64_t a1 = 0) {
        user_regs_struct r = saved;
        const uint64_t zero = 0;
        write_mem(sp - 8, &zero, sizeof zero);
        r.rip = fn;
        r.rsp = sp - 8;
        r.rdi = a0;
        r.rsi = a1;
        r.rax = 0;
        // No system call in progress: the kernel's restart logic must not move rip.
        r.orig_rax = static_cast<unsigned long long>(-1);
        r.eflags &= ~(0x400ull | 0x100ull); // the ABI wants DF clear; no single-stepping
        if (ptrace(PTRACE_SETREGS, tid_, nullptr, &r) != 0) fail(fmt::format("PTRACE_SETREGS: {}", strerror(errno)));
        int deliver = 0;
        while (true) {
            if (ptrace(PTRACE_CONT, tid_, nullptr, reinterpret_cast<void *>(static_cast<long>(deliver))) != 0)
                fail(fmt::format("PTRACE_CONT: {}", strerror(errno)));
            deliver = 0;
            int status = 0;
            if (waitpid(tid_, &status, __WALL) != tid_) fail(fmt::format("waitpid: {}", strerror(errno)));
            if (WIFEXITED(status) || WIFSIGNALED(status)) fail("the target exited during the injection");
            if (!WIFSTOPPED(status) || status >> 16 != 0) continue; // an event or group stop: go on
            const int sig = WSTOPSIG(status);
            if (sig == SIGSEGV) {
                user_regs_struct now{};
                ptrace(PTRACE_GETREGS, tid_, nullptr, &now);
                if (now.rip == 0) return now.rax;
            }
            // Any other signal goes to the program at once, as without a tracer: the
            // agent's own int3 probes and fault-safe reads raise SIGTRAP and SIGSEGV in
            // the called code, and their handlers must run.
            deliver = sig;
        }
    }

private:
    int tid_;
};

} // namespace

InjectResult inject_agent(int pid, const std::string &agent) {
    InjectResult result;
    if (access(agent.c_str(), R_OK) != 0) fail(fmt::format("cannot read the agent {}: {}", agent, strerror(errno)));
    if (read_text(fmt::format("/proc/{}/maps", pid)).empty() && kill(pid, 0) != 0 && errno == ESRCH)
        fail(fmt::format("no process {}", pid));

    // dlopen and its friends in the target's libc (glibc >= 2.34 has them there).
    const std::vector<Mapping> maps = read_maps(pid);
    const Mapping *libc = nullptr;
    for (const Mapping &m : maps) {
        const std::string name = base_name(m.path);
        if (m.offset == 0 && (name == "libc.so.6" || (name.rfind("libc-", 0) == 0 && name.find(".so") != std::string::npos))) {
            libc = &m;
            break;
        }
    }
    if (libc == nullptr) {
        if (maps.empty()) fail(refusal(pid, EPERM));
        fail(fmt::format("process {} has no libc.so.6 mapped (a static or non-C program): it cannot load the "
                         "agent; start it with `ukprobe run` or link libukprobes",
                         pid));
    }
    const std::vector<uint64_t> fns = dynamic_symbols(libc->path, libc->start, {"dlopen", "dlsym", "dlerror"});
    if (fns[0] == 0 || fns[1] == 0 || fns[2] == 0)
        fail(fmt::format("{} in process {} has no dlopen/dlsym (glibc older than 2.34?)", libc->path, pid));

    bool in_syscall = false;
    const int tid = pick_thread(pid, &in_syscall);
    result.tid = tid;
    if (ptrace(PTRACE_SEIZE, tid, nullptr, nullptr) != 0) fail(refusal(pid, errno));
    const Clock::time_point t0 = Clock::now();
    if (ptrace(PTRACE_INTERRUPT, tid, nullptr, nullptr) != 0) {
        const int err = errno;
        ptrace(PTRACE_DETACH, tid, nullptr, nullptr);
        fail(fmt::format("PTRACE_INTERRUPT: {}", strerror(err)));
    }
    Tracee t(tid);
    // The first stop: the interrupt's. A signal that comes first goes to the program
    // (an int3 probe's SIGTRAP must reach the agent's handler).
    while (true) {
        int status = 0;
        if (waitpid(tid, &status, __WALL) != tid) fail(fmt::format("waitpid: {}", strerror(errno)));
        if (WIFEXITED(status) || WIFSIGNALED(status)) fail(fmt::format("process {} exited", pid));
        if (WIFSTOPPED(status) && status >> 16 == PTRACE_EVENT_STOP) break;
        if (WIFSTOPPED(status))
            ptrace(PTRACE_CONT, tid, nullptr, reinterpret_cast<void *>(static_cast<long>(status >> 16 == 0 ? WSTOPSIG(status) : 0)));
    }

    const Clock::time_point stopped = Clock::now();
    user_regs_struct saved{};
    if (ptrace(PTRACE_GETREGS, tid, nullptr, &saved) != 0) fail(fmt::format("PTRACE_GETREGS: {}", strerror(errno)));
    result.was_in_syscall = static_cast<long long>(saved.orig_rax) >= 0;
    // The extended state (x87, SSE, AVX, ...): the called code uses vector registers.
    std::vector<uint8_t> xstate(16384);
    iovec xiov{xstate.data(), xstate.size()};
    const bool have_xstate = ptrace(PTRACE_GETREGSET, tid, reinterpret_cast<void *>(NT_X86_XSTATE), &xiov) == 0;
    xstate.resize(xiov.iov_len);
    user_fpregs_struct fpregs{};
    const bool have_fp = !have_xstate && ptrace(PTRACE_GETFPREGS, tid, nullptr, &fpregs) == 0;

    // Stack: below the red zone (128 bytes) and a margin, the two strings, then the frame.
    const std::string sym = "ukp_control_start";
    const uint64_t top = (saved.rsp - 128 - 256) & ~15ull;
    const uint64_t path_at = (top - agent.size() - 1) & ~15ull;
    const uint64_t sym_at = (path_at - sym.size() - 1) & ~15ull;
    const uint64_t sp = (sym_at - 64) & ~15ull;
    const uint64_t low = sp - 8;
    std::vector<uint8_t> saved_stack(top - low);

    std::string error;
    uint64_t handle = 0, start_fn = 0;
    int64_t start_rc = 0;
    const Clock::time_point c0 = Clock::now();
    try {
        t.read_mem(low, saved_stack.data(), saved_stack.size());
        t.write_mem(path_at, agent.c_str(), agent.size() + 1);
        t.write_mem(sym_at, sym.c_str(), sym.size() + 1);
        handle = t.call(saved, fns[0], sp, path_at, RTLD_NOW);
        if (handle == 0) {
            const uint64_t msg = t.call(saved, fns[2], sp);
            error = fmt::format("dlopen in process {} failed: {}", pid, msg ? t.read_string(msg) : "(no message)");
        } else {
            start_fn = t.call(saved, fns[1], sp, handle, sym_at);
            if (start_fn == 0)
                error = fmt::format("{} has no ukp_control_start: not a ukprobes agent", agent);
            else
                start_rc = static_cast<int32_t>(t.call(saved, start_fn, sp));
        }
    } catch (const std::exception &e) {
        error = e.what();
    }
    result.calls_ms = std::chrono::duration<double, std::milli>(Clock::now() - c0).count();

    // Restore exactly: the stack bytes, the extended state, then the registers (with
    // orig_rax and rax as they were, so an interrupted system call restarts).
    bool restored = true;
    try {
        t.write_mem(low, saved_stack.data(), saved_stack.size());
    } catch (const std::exception &) {
        restored = false;
    }
    if (have_xstate) restored &= ptrace(PTRACE_SETREGSET, tid, reinterpret_cast<void *>(NT_X86_XSTATE), &xiov) == 0;
    if (have_fp) restored &= ptrace(PTRACE_SETFPREGS, tid, nullptr, &fpregs) == 0;
    restored &= ptrace(PTRACE_SETREGS, tid, nullptr, &saved) == 0;
    // From the stop of our return trap: its SIGSEGV is dropped.
    ptrace(PTRACE_DETACH, tid, nullptr, nullptr);
    const Clock::time_point t1 = Clock::now();
    result.pause_ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
    result.stopped_ms = std::chrono::duration<double, std::milli>(t1 - stopped).count();

    if (!restored) error += (error.empty() ? "" : "; ") + std::string("the thread's state could not be fully restored");
    if (!error.empty()) fail(error);
    if (start_rc < 0)
        fail(fmt::format("the agent loaded, but ukp_control_start() failed in process {}: {}{}", pid,
                         strerror(static_cast<int>(-start_rc)),
                         start_rc == -EPERM ? fmt::format(" (check {} : it must be a directory of the process's user "
                                                          "with mode 0700)",
                                                          "/tmp/ukprobes-UID")
                                            : ""));
    return result;
}

} // namespace ukprobe
