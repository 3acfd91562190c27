#include "inject.hpp"

#include "platform/elf_file.hpp"
#include "platform/maps.hpp"

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
#include <linux/kcmp.h>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/ptrace.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/user.h>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

namespace ukprobe {
namespace platform = ukp::platform;

namespace {

// The signals the agent's handlers take (SIGTRAP, SIGSEGV, SIGBUS, SIGFPE, SIGILL), as a
// kernel signal mask (bit sig - 1).
constexpr uint64_t kAgentSignals = (1ull << (SIGTRAP - 1)) | (1ull << (SIGSEGV - 1)) | (1ull << (SIGBUS - 1)) |
                                   (1ull << (SIGFPE - 1)) | (1ull << (SIGILL - 1));

using Clock = std::chrono::steady_clock;

[[noreturn]] void fail(const std::string &msg) { throw std::runtime_error(msg); }

std::string read_text(const std::string &path) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

// A "Key:\tvalue" line of /proc/PID/task/TID/status: the value, or "".
std::string status_field_of_task(int pid, int tid, const char *key) {
    const std::string text = read_text(fmt::format("/proc/{}/task/{}/status", pid, tid));
    const std::string k = std::string(key) + ":";
    const size_t at = text.find(k);
    if (at == std::string::npos) return "";
    const size_t start = text.find_first_not_of(" \t", at + k.size());
    const size_t end = text.find('\n', at);
    return start == std::string::npos ? "" : text.substr(start, end == std::string::npos ? end : end - start);
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

using platform::OwnedMapping;

std::string base_name(const std::string &path) { return path.substr(path.rfind('/') + 1); }

// Whether `name` (a file's base name) is the C library's.
bool is_libc_name(const std::string &name) {
    return name == "libc.so.6" || (name.rfind("libc-", 0) == 0 && name.find(".so") != std::string::npos);
}

// Whether `name` is the C library's, its dynamic loader's or one of the libraries glibc
// before 2.34 kept apart: the code that takes the locks the injected calls take too.
bool is_c_runtime_name(const std::string &name) {
    return is_libc_name(name) || name.rfind("ld-linux", 0) == 0 || name.rfind("ld-2.", 0) == 0 ||
           name.rfind("libpthread", 0) == 0 || name.rfind("libdl", 0) == 0;
}

// The run-time addresses of `names` in the loaded object mapped from `path` at `base`
// (the start of its mapping of file offset 0), from its .dynsym.
std::vector<uint64_t> dynamic_symbols(const std::string &path, uint64_t base, const std::vector<std::string> &names) {
    platform::ElfFile elf;
    std::string why;
    if (!elf.open(path, &why)) fail(fmt::format("cannot read {}: {}", path, why));
    std::vector<uint64_t> found(names.size(), 0);
    const uint64_t first_vaddr = elf.first_load_address();
    elf.for_each_section([&](Elf_Scn *scn, const GElf_Shdr &sh) {
        if (sh.sh_type != SHT_DYNSYM) return;
        Elf_Data *data = elf_getdata(scn, nullptr);
        const size_t count = sh.sh_entsize ? sh.sh_size / sh.sh_entsize : 0;
        for (size_t i = 0; data != nullptr && i < count; ++i) {
            GElf_Sym sym;
            // Not an undefined one: an executable's can have a value, its PLT entry.
            if (gelf_getsym(data, static_cast<int>(i), &sym) == nullptr || sym.st_value == 0 ||
                sym.st_shndx == SHN_UNDEF)
                continue;
            // Plain functions only: an IFUNC's symbol is its resolver, not the function.
            if (GELF_ST_TYPE(sym.st_info) != STT_FUNC) continue;
            const char *name = elf_strptr(elf.elf(), sh.sh_link, sym.st_name);
            if (name == nullptr) continue;
            for (size_t k = 0; k < names.size(); ++k)
                if (found[k] == 0 && names[k] == name) found[k] = base + sym.st_value - first_vaddr;
        }
    });
    return found;
}

// Whether thread tid works in the process's descriptor table. The agent's optimizer has
// one of its own (text::use_own_fd_table): a loader started from it would start the control
// thread there too, where the agent's descriptors mean nothing.
bool shares_process_files(int pid, int tid) {
    if (tid == pid) return true;
    const long same = syscall(SYS_kcmp, pid, tid, KCMP_FILES, 0, 0);
    if (same >= 0) return same == 0;
    return read_text(fmt::format("/proc/{}/task/{}/comm", pid, tid)) != "ukp-optimizer\n"; // no kcmp
}

// Whether a thread stopped in system call `nr` waits for something outside the program (a
// descriptor, a child, time, a signal, another thread): then it holds no library lock as
// a rule. Not brk, mmap, munmap, mprotect, madvise: malloc makes them holding its arena's
// lock, and pthread_create, which the injected calls make, takes that lock (a perl
// attached while it forked children hung so, in calloc under pthread_create).
bool waits_outside(long nr) {
    switch (nr) {
    case SYS_read:
    case SYS_readv:
    case SYS_pread64:
    case SYS_write:
    case SYS_writev:
    case SYS_poll:
    case SYS_ppoll:
    case SYS_select:
    case SYS_pselect6:
    case SYS_epoll_wait:
    case SYS_epoll_pwait:
    case SYS_epoll_pwait2:
    case SYS_nanosleep:
    case SYS_clock_nanosleep:
    case SYS_restart_syscall: // the rest of a sleep, poll or futex wait a stop interrupted
    case SYS_pause:
    case SYS_rt_sigsuspend:
    case SYS_rt_sigtimedwait:
    case SYS_wait4:
    case SYS_waitid:
    case SYS_futex:
    case SYS_accept:
    case SYS_accept4:
    case SYS_recvfrom:
    case SYS_recvmsg:
    case SYS_recvmmsg:
    case SYS_sendto:
    case SYS_sendmsg:
    case SYS_connect:
    case SYS_msgrcv:
    case SYS_semop:
    case SYS_semtimedop:
    case SYS_io_getevents:
    case SYS_io_uring_enter:
        return true;
    default:
        return false;
    }
}

// The thread to run the calls on: one blocked in a system call that waits outside the
// program holds no library lock as a rule (a thread stopped inside malloc could deadlock
// dlopen); the leader otherwise. Only a thread that shares the process's descriptor table.
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
        if (!shares_process_files(pid, tid)) continue;
        const std::string sys = read_text(fmt::format("/proc/{}/task/{}/syscall", pid, tid));
        if (!sys.empty() && std::isdigit(static_cast<unsigned char>(sys[0])) && waits_outside(std::atol(sys.c_str()))) {
            *in_syscall = true;
            return tid;
        }
    }
    *in_syscall = false;
    return pid;
}

// The loader: a page of code and a page of data mapped into the target. A new thread of
// the target runs the code, so the interrupted thread stops only for mmap, mprotect and
// pthread_create, never for dlopen (milliseconds, and locks it might itself hold).
//
// Data page (the thread's argument, rbx in the stub):
constexpr uint64_t kDlopen = 0, kDlsym = 8, kDlerror = 16, kMunmap = 24, kDetach = 32, kSelf = 40, kSnprintf = 48,
                   kUsleep = 96;
constexpr uint64_t kStatus = 56; // 0 running; 1 dlopen, 2 dlsym, 3 ukp_control_start failed, 4 no go
constexpr uint64_t kValue = 64;  // ukp_control_start's result when status is 3
constexpr uint64_t kBase = 72;   // the mapping, for munmap
constexpr uint64_t kSize = 80;
constexpr uint64_t kCookie = 88;     // tells our page from whatever is mapped there later
constexpr uint64_t kGo = 104;        // set by the controller once the interrupted thread is released
constexpr uint64_t kWaitLeft = 112;  // polls of kGo left before the loader gives up
constexpr uint64_t kThreadOut = 120; // pthread_create's out-parameter
constexpr uint64_t kCreateName = 0xc0, kFormat = 0xf0, kSymbol = 0x100, kPath = 0x200, kError = 0xc00,
                   kErrorMax = 0x400;
// When the agent is already loaded: the stack it gives the loader thread (lowest address,
// size) and the thread attributes that carry it to pthread_create.
constexpr uint64_t kStackOut = 0x140, kAttr = 0x180; // pthread_attr_t: 56 bytes
// The mapping: the loader's code page, its data page, then the stack the interrupted
// thread's calls run on (never the thread's own: it may be on a small signal stack).
constexpr uint64_t kPage = 4096, kStackSize = 64 * 1024, kLoaderSize = 2 * kPage + kStackSize;
constexpr uint32_t kPollMicros = 200, kPolls = 25000; // the loader waits at most 5 s for kGo

// x86-64 code of the loader thread's start routine (argument: the data page):
//   until go: usleep(200)                   the stack of the interrupted thread's calls is
//                                           in this mapping: wait until it is released
//   pthread_detach(pthread_self());
//   h = dlopen(path, RTLD_NOW)              or: snprintf(error, max, "%s", dlerror()); status = 1
//   f = dlsym(h, "ukp_control_start")       or: the same with status = 2
//   rc = f()                                or, if rc != 0: value = rc; status = 3
//   on success, tail-call munmap(base, size): it returns into the thread's exit path
//   and no instruction of the unmapped page runs after it.
// On failure the pages stay for the controller to read why.
std::vector<uint8_t> loader_code() {
    std::vector<uint8_t> c;
    auto put = [&](std::initializer_list<uint8_t> bytes) { c.insert(c.end(), bytes); };
    auto imm32 = [&](uint32_t v) { put({uint8_t(v), uint8_t(v >> 8), uint8_t(v >> 16), uint8_t(v >> 24)}); };
    auto call_slot = [&](uint64_t slot) { put({0xff, 0x53, static_cast<uint8_t>(slot)}); }; // call [rbx+slot]
    auto set_status = [&](uint8_t v) { put({0x48, 0xc7, 0x43, static_cast<uint8_t>(kStatus), v, 0, 0, 0}); };
    auto lea_rbx = [&](uint8_t modrm, uint64_t off) {
        put({0x48, 0x8d, modrm});
        imm32(uint32_t(off));
    };
    // A forward jump with a rel32 to fill in by `land`.
    auto jump = [&](std::initializer_list<uint8_t> opcode) {
        put(opcode);
        imm32(0);
        return c.size();
    };
    auto land = [&](size_t after) {
        const uint32_t rel = uint32_t(c.size() - after);
        memcpy(c.data() + after - 4, &rel, 4);
    };
    put({0x53});             // push rbx (aligns the stack for calls)
    put({0x48, 0x89, 0xfb}); // mov rbx, rdi
    const size_t wait = c.size();
    put({0x48, 0x83, 0x7b, uint8_t(kGo), 0x00});  // cmp qword [rbx+go], 0
    const size_t to_go = jump({0x0f, 0x85});      // jne go
    put({0x48, 0xff, 0x4b, uint8_t(kWaitLeft)});  // dec qword [rbx+wait_left]
    const size_t to_timeout = jump({0x0f, 0x84}); // jz timeout
    put({0xbf});
    imm32(kPollMicros); // mov edi, poll
    call_slot(kUsleep);
    put({0xe9});
    imm32(uint32_t(wait - (c.size() + 4))); // jmp wait
    land(to_go);
    call_slot(kSelf);
    put({0x48, 0x89, 0xc7}); // mov rdi, rax
    call_slot(kDetach);
    lea_rbx(0xbb, kPath);           // lea rdi, [rbx+path]
    put({0xbe, RTLD_NOW, 0, 0, 0}); // mov esi, RTLD_NOW
    call_slot(kDlopen);
    put({0x48, 0x85, 0xc0}); // test rax, rax
    const size_t to_dlopen_failed = jump({0x0f, 0x84});
    put({0x48, 0x89, 0xc7}); // mov rdi, rax
    lea_rbx(0xb3, kSymbol);  // lea rsi, [rbx+symbol]
    call_slot(kDlsym);
    put({0x48, 0x85, 0xc0}); // test rax, rax
    const size_t to_dlsym_failed = jump({0x0f, 0x84});
    put({0xff, 0xd0}); // call rax
    put({0x85, 0xc0}); // test eax, eax
    const size_t to_start_failed = jump({0x0f, 0x85});
    put({0x48, 0x8b, 0x7b, uint8_t(kBase)});   // mov rdi, [rbx+base]
    put({0x48, 0x8b, 0x73, uint8_t(kSize)});   // mov rsi, [rbx+size]
    put({0x48, 0x8b, 0x43, uint8_t(kMunmap)}); // mov rax, [rbx+munmap]
    put({0x5b});                               // pop rbx
    put({0xff, 0xe0});                         // jmp rax
    land(to_dlopen_failed);
    put({0xb8, 1, 0, 0, 0}); // mov eax, 1
    const size_t to_error = jump({0xe9});
    land(to_dlsym_failed);
    put({0xb8, 2, 0, 0, 0}); // mov eax, 2
    land(to_error);
    put({0x50, 0x50}); // push rax twice (keeps the alignment)
    call_slot(kDlerror);
    put({0x48, 0x85, 0xc0}); // test rax, rax
    const size_t to_no_message = jump({0x0f, 0x84});
    lea_rbx(0xbb, kError); // lea rdi, [rbx+error]
    put({0xbe});
    imm32(uint32_t(kErrorMax)); // mov esi, max
    lea_rbx(0x93, kFormat);     // lea rdx, [rbx+format]
    put({0x48, 0x89, 0xc1});    // mov rcx, rax
    put({0x31, 0xc0});          // xor eax, eax (no vector arguments)
    call_slot(kSnprintf);
    land(to_no_message);
    put({0x58, 0x58});                         // pop rax twice
    put({0x48, 0x89, 0x43, uint8_t(kStatus)}); // mov [rbx+status], rax
    const size_t to_out1 = jump({0xe9});
    land(to_start_failed);
    put({0x48, 0x63, 0xc0});                  // movsxd rax, eax
    put({0x48, 0x89, 0x43, uint8_t(kValue)}); // mov [rbx+value], rax
    set_status(3);
    const size_t to_out2 = jump({0xe9});
    land(to_timeout);
    set_status(4);
    land(to_out1);
    land(to_out2);
    put({0x31, 0xc0}); // xor eax, eax
    put({0x5b});       // pop rbx
    put({0xc3});       // ret
    return c;
}

// A `syscall` instruction (0f 05) in the executable mapping of `path`.
uint64_t find_syscall_insn(int pid, const std::string &path) {
    uint64_t found = 0;
    platform::for_each_mapping(pid, [&](const platform::Mapping &m) {
        if (!m.executable() || m.path != path) return true;
        std::vector<uint8_t> text(std::min<uint64_t>(m.end - m.start, 1u << 20));
        iovec local{text.data(), text.size()}, remote{reinterpret_cast<void *>(m.start), text.size()};
        if (process_vm_readv(pid, &local, 1, &remote, 1, 0) != static_cast<ssize_t>(text.size())) return false;
        for (size_t i = 0; i + 1 < text.size(); ++i) {
            if (text[i] == 0x0f && text[i + 1] == 0x05) {
                found = m.start + i;
                return false;
            }
        }
        return true;
    });
    if (found == 0) fail(fmt::format("no syscall instruction found in {} of process {}", path, pid));
    return found;
}

enum {
    kFnDlopen,
    kFnDlsym,
    kFnDlerror,
    kFnMmap,
    kFnMprotect,
    kFnMunmap,
    kFnCreate,
    kFnDetach,
    kFnSelf,
    kFnSnprintf,
    kFnUsleep,
    kFnAttrInit,
    kFnAttrSetstack
};

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

    // Makes system call `nr` from the `syscall` instruction at `insn`, stopping at its exit
    // (PTRACE_SYSCALL): no stack is touched.
    uint64_t syscall(const user_regs_struct &saved, uint64_t insn, long nr, uint64_t a0, uint64_t a1, uint64_t a2 = 0,
                     uint64_t a3 = 0, uint64_t a4 = 0, uint64_t a5 = 0) {
        user_regs_struct r = saved;
        r.rip = insn;
        r.rax = static_cast<unsigned long long>(nr);
        r.rdi = a0;
        r.rsi = a1;
        r.rdx = a2;
        r.r10 = a3;
        r.r8 = a4;
        r.r9 = a5;
        r.orig_rax = static_cast<unsigned long long>(-1);
        r.eflags &= ~0x100ull;
        if (ptrace(PTRACE_SETREGS, tid_, nullptr, &r) != 0) fail(fmt::format("PTRACE_SETREGS: {}", strerror(errno)));
        bool entered = false;
        int deliver = 0;
        while (true) {
            if (ptrace(PTRACE_SYSCALL, tid_, nullptr, reinterpret_cast<void *>(static_cast<long>(deliver))) != 0)
                fail(fmt::format("PTRACE_SYSCALL: {}", strerror(errno)));
            deliver = 0;
            int status = 0;
            if (waitpid(tid_, &status, __WALL) != tid_) fail(fmt::format("waitpid: {}", strerror(errno)));
            if (WIFEXITED(status) || WIFSIGNALED(status))
                fail(WIFSIGNALED(status)
                         ? fmt::format("the target was killed by {} during the injection (in system call {})",
                                       strsignal(WTERMSIG(status)), nr)
                         : std::string("the target exited during the injection"));
            if (!WIFSTOPPED(status) || status >> 16 != 0) continue;
            if (WSTOPSIG(status) != (SIGTRAP | 0x80)) {
                deliver = WSTOPSIG(status); // the program's signal, delivered as usual
                continue;
            }
            user_regs_struct now{};
            ptrace(PTRACE_GETREGS, tid_, nullptr, &now);
            if (static_cast<long>(now.orig_rax) != nr) continue; // a signal handler's own calls
            if (!entered) {
                entered = true;
                continue;
            }
            return now.rax;
        }
    }

    // Calls fn(a0, a1) on the stopped thread with `sp` as its stack pointer (16-byte
    // aligned, the return address 0 written at sp - 8 by the caller's layout) and waits
    // for the return to trap at address 0.
    uint64_t call(const user_regs_struct &saved, uint64_t fn, uint64_t sp, uint64_t a0 = 0, uint64_t a1 = 0,
                  uint64_t a2 = 0, uint64_t a3 = 0, uint64_t a4 = 0, uint64_t a5 = 0) {
        user_regs_struct r = saved;
        const uint64_t zero = 0;
        write_mem(sp - 8, &zero, sizeof zero);
        r.rip = fn;
        r.rsp = sp - 8;
        r.rdi = a0;
        r.rsi = a1;
        r.rdx = a2;
        r.rcx = a3;
        r.r8 = a4;
        r.r9 = a5;
        r.rax = 0;
        // No system call in progress: the kernel's restart logic must not move rip.
        r.orig_rax = static_cast<unsigned long long>(-1);
        r.eflags &= ~(0x400ull | 0x100ull); // the ABI wants DF clear; no single-stepping
        if (ptrace(PTRACE_SETREGS, tid_, nullptr, &r) != 0) fail(fmt::format("PTRACE_SETREGS: {}", strerror(errno)));
        int deliver = 0, deliver_last = 0;
        while (true) {
            if (ptrace(PTRACE_CONT, tid_, nullptr, reinterpret_cast<void *>(static_cast<long>(deliver))) != 0)
                fail(fmt::format("PTRACE_CONT: {}", strerror(errno)));
            deliver = 0;
            int status = 0;
            if (waitpid(tid_, &status, __WALL) != tid_) fail(fmt::format("waitpid: {}", strerror(errno)));
            if (WIFEXITED(status) || WIFSIGNALED(status))
                fail(WIFSIGNALED(status) ? fmt::format("the target was killed by {} during the injection (in a call of "
                                                       "{:#x}, last stop by signal {})",
                                                       strsignal(WTERMSIG(status)), fn, deliver_last)
                                         : std::string("the target exited during the injection"));
            if (!WIFSTOPPED(status) || status >> 16 != 0) continue; // an event or group stop: go on
            const int sig = WSTOPSIG(status);
            if (sig == SIGSEGV) {
                user_regs_struct now{};
                ptrace(PTRACE_GETREGS, tid_, nullptr, &now);
                if (now.rip == 0) return now.rax;
            }
            deliver_last = sig;
            // Any other signal goes to the program at once, as without a tracer: the
            // agent's own int3 probes and fault-safe reads raise SIGTRAP and SIGSEGV in
            // the called code, and their handlers must run.
            deliver = sig;
        }
    }

private:
    int tid_;
};

// Fails unless the agent can be read and process `pid` is there.
void check_target(int pid, const std::string &agent) {
    if (access(agent.c_str(), R_OK) != 0) fail(fmt::format("cannot read the agent {}: {}", agent, strerror(errno)));
    if (read_text(fmt::format("/proc/{}/maps", pid)).empty() && kill(pid, 0) != 0 && errno == ESRCH)
        fail(fmt::format("no process {}", pid));
}

// The target's libc: the mapping of file offset 0 of the copy the dynamic loader loaded.
// Fails when it has none. A program may map the file itself too (a debugger's or a
// profiler's reading of it: another mapping of offset 0, perhaps first in the list): the
// loaded copy is the one an executable mapping of the same file continues, its start less
// its offset being the same load address.
OwnedMapping find_libc(int pid) {
    // dlopen and its friends in the target's libc (glibc >= 2.34 has them there).
    const std::vector<OwnedMapping> maps = platform::read_mappings(pid);
    const auto is_libc = [](const OwnedMapping &m) { return is_libc_name(base_name(m.path)); };
    const OwnedMapping *first = nullptr;
    for (const OwnedMapping &m : maps) {
        if (m.offset != 0 || !is_libc(m)) continue;
        if (first == nullptr) first = &m;
        for (const OwnedMapping &x : maps)
            if (x.inode == m.inode && x.perms[2] == 'x' && x.start - x.offset == m.start && x.start >= m.end) return m;
    }
    if (first != nullptr) return *first;
    if (maps.empty()) fail(refusal(pid, EPERM));
    fail(fmt::format("process {} has no libc.so.6 mapped (a static or non-C program): it cannot load the "
                     "agent; start it with `ukprobe run` or link libukprobes",
                     pid));
}

// The run-time addresses of the functions the injection calls in `libc`, indexed by kFn*.
// Fails when one is missing.
std::vector<uint64_t> libc_functions(int pid, const OwnedMapping &libc) {
    const std::vector<std::string> names = {"dlopen",
                                            "dlsym",
                                            "dlerror",
                                            "mmap",
                                            "mprotect",
                                            "munmap",
                                            "pthread_create",
                                            "pthread_detach",
                                            "pthread_self",
                                            "snprintf",
                                            "usleep",
                                            "pthread_attr_init",
                                            "pthread_attr_setstack"};
    const std::vector<uint64_t> fns = dynamic_symbols(libc.path, libc.start, names);
    for (size_t i = 0; i < names.size(); ++i)
        if (fns[i] == 0)
            fail(fmt::format("{} in process {} has no {} (glibc older than 2.34?)", libc.path, pid, names[i]));
    return fns;
}

// The functions of an agent already loaded that the calls use, 0 where it has none.
struct AgentFunctions {
    uint64_t stack = 0; // ukp_loader_stack()
    uint64_t quiet = 0; // ukp_loader_quiet() (an agent older than it has none)
};

// The functions of the agent at `agent` if the target has that file loaded already
// (preloaded, or an earlier attach), else none.
AgentFunctions loaded_agent_functions(int pid, const std::string &agent) {
    struct ::stat st {};
    if (::stat(agent.c_str(), &st) != 0) return {};
    const std::vector<OwnedMapping> maps = platform::read_mappings(pid);
    for (const OwnedMapping &m : maps) {
        if (m.offset != 0 || m.inode != st.st_ino || base_name(m.path) != base_name(agent)) continue;
        for (const OwnedMapping &x : maps) {
            if (x.inode != m.inode || x.perms[2] != 'x' || x.start - x.offset != m.start) continue;
            try {
                const std::vector<uint64_t> at =
                    dynamic_symbols(agent, m.start, {"ukp_loader_stack", "ukp_loader_quiet"});
                return {at[0], at[1]};
            } catch (const std::exception &) {
                return {};
            }
        }
    }
    return {};
}

// Where a thread stopped at `rip` runs, for the calls.
enum class StopPlace {
    // The agent's own code or an out-of-line copy of probed code (anonymous memory): the
    // thread is let go again at once and taken later. The agent knows which threads are
    // inside its copies by asking them with a signal, and an injected call would answer
    // for the thread from elsewhere while it still has to return there.
    kUnsafe,
    // The C library or its loader: a thread stopped there outside a system call may be
    // inside malloc, holding an arena's lock (or, single-threaded, halfway through
    // changing the arena unlocked), and pthread_create's calloc would then hang on that
    // lock or corrupt the heap.
    kCRuntime,
    // Any other code of a file, or the vDSO: no lock of the C library is held there.
    kProgram,
};

// Whether the object at `path` is an allocator of its own (it defines malloc, as jemalloc,
// tcmalloc and the sanitizers' runtimes do): the C library's malloc and calloc are then
// its, and its code takes its locks. One that cannot be read counts as one. Kept in *seen.
bool is_allocator(const std::string &path, std::map<std::string, bool> *seen) {
    const auto known = seen->find(path);
    if (known != seen->end()) return known->second;
    bool allocator = true;
    try {
        allocator = dynamic_symbols(path, 0, {"malloc"})[0] != 0;
    } catch (const std::exception &) {
    }
    return (*seen)[path] = allocator;
}

// Where code in mapping `m` runs, for the calls (the objects that define malloc kept in
// *allocators).
StopPlace place_of(const platform::Mapping &m, std::map<std::string, bool> *allocators) {
    if (m.path == "[vdso]") return StopPlace::kProgram;
    if (!m.in_file()) return StopPlace::kUnsafe;
    const std::string path(m.path);
    const std::string name = base_name(path);
    if (name.rfind("libukprobes", 0) == 0) return StopPlace::kUnsafe;
    if (is_c_runtime_name(name) || is_allocator(path, allocators)) return StopPlace::kCRuntime;
    return StopPlace::kProgram;
}

// Where the thread of `pid` stopped at `rip` is.
StopPlace stop_place(int pid, uint64_t rip, std::map<std::string, bool> *allocators) {
    StopPlace place = StopPlace::kUnsafe;
    platform::for_each_mapping(pid, [&](const platform::Mapping &m) {
        if (rip < m.start || rip >= m.end) return true;
        place = place_of(m, allocators);
        return false;
    });
    return place;
}

// The places of all the executable mappings of a process, for the many lookups of a
// thread stepped out of the C library.
class CodePlaces {
public:
    CodePlaces(int pid, std::map<std::string, bool> *allocators) {
        platform::for_each_mapping(pid, [&](const platform::Mapping &m) {
            if (m.executable()) ranges_.push_back({m.start, m.end, place_of(m, allocators)});
            return true;
        });
    }
    StopPlace at(uint64_t rip) const {
        for (const Range &r : ranges_)
            if (rip >= r.start && rip < r.end) return r.place;
        return StopPlace::kUnsafe;
    }

private:
    struct Range {
        uint64_t start, end;
        StopPlace place;
    };
    std::vector<Range> ranges_;
};

// Waits for the stop of the PTRACE_INTERRUPT sent to `tid`; fails if the process exits.
void wait_for_interrupt(int pid, int tid) {
    // The first stop: the interrupt's. A signal that comes first goes to the program
    // (an int3 probe's SIGTRAP must reach the agent's handler).
    while (true) {
        int status = 0;
        if (waitpid(tid, &status, __WALL) != tid) fail(fmt::format("waitpid: {}", strerror(errno)));
        if (WIFEXITED(status) || WIFSIGNALED(status)) fail(fmt::format("process {} exited", pid));
        if (WIFSTOPPED(status) && status >> 16 == PTRACE_EVENT_STOP) break;
        if (WIFSTOPPED(status))
            ptrace(PTRACE_CONT, tid, nullptr,
                   reinterpret_cast<void *>(static_cast<long>(status >> 16 == 0 ? WSTOPSIG(status) : 0)));
    }
}

// Whether a signal is pending for thread `tid` of `pid`.
bool signal_pending(int pid, int tid) {
    const std::string status = read_text(fmt::format("/proc/{}/task/{}/status", pid, tid));
    const size_t at = status.find("SigPnd:");
    return at != std::string::npos && std::strtoull(status.c_str() + at + 7, nullptr, 16) != 0;
}

// A thread of the target, seized and stopped where the calls can run.
struct StoppedThread {
    int tid = 0;
    user_regs_struct regs{};       // its registers at the stop, put back after the calls
    Clock::time_point interrupted; // when PTRACE_INTERRUPT was sent
    Clock::time_point stopped;     // when it stopped
    int interrupts = 0;            // threads interrupted to find it, it included
    int steps = 0;                 // instructions it was stepped through to leave the C library
};

// Steps thread `s`, stopped outside a system call in the C library or its allocator, one
// instruction at a time until it runs the program's own code, and returns true with its
// registers there. Mostly it is inside malloc or free (a program that allocates all the
// time may be stopped there in every one of thousands of interrupts), a few hundred
// instructions from their return. It never steps into a system call (one may block for
// good) nor through code other than the C library's and the program's (the agent's
// trampolines keep the flags on the stack, trap flag included); then, after kMaxSteps or
// kMaxStepping (a step costs 10 to 50 us: a long function, as a sort with libc's own
// comparison, would pause the thread for a second), or on a signal, the thread is let go
// (the signal delivered) and it returns false.
bool step_out_of_c_runtime(int pid, StoppedThread *s, std::map<std::string, bool> *allocators) {
    constexpr int kMaxSteps = 20000;
    constexpr std::chrono::milliseconds kMaxStepping{20};
    const CodePlaces places(pid, allocators);
    const Clock::time_point started = Clock::now();
    int deliver = 0;
    for (int step = 1; step <= kMaxSteps && Clock::now() - started < kMaxStepping; ++step) {
        errno = 0;
        const long insn = ptrace(PTRACE_PEEKTEXT, s->tid, reinterpret_cast<void *>(s->regs.rip), nullptr);
        if (errno != 0 || (insn & 0xffff) == 0x050f) break; // syscall
        if (ptrace(PTRACE_SINGLESTEP, s->tid, nullptr, nullptr) != 0) break;
        int status = 0;
        if (waitpid(s->tid, &status, __WALL) != s->tid) fail(fmt::format("waitpid: {}", strerror(errno)));
        if (WIFEXITED(status) || WIFSIGNALED(status)) fail(fmt::format("process {} exited", pid));
        siginfo_t info{};
        const bool stepped = WIFSTOPPED(status) && status >> 16 == 0 && WSTOPSIG(status) == SIGTRAP &&
                             ptrace(PTRACE_GETSIGINFO, s->tid, nullptr, &info) == 0 && info.si_code == TRAP_TRACE;
        if (!stepped) {
            // A signal of its own (an int3 probe's SIGTRAP, a timer's...) goes to it.
            if (WIFSTOPPED(status) && status >> 16 == 0) deliver = WSTOPSIG(status);
            break;
        }
        if (ptrace(PTRACE_GETREGS, s->tid, nullptr, &s->regs) != 0) break;
        const StopPlace place = places.at(s->regs.rip);
        if (place == StopPlace::kProgram) {
            s->steps = step;
            return true;
        }
        if (place != StopPlace::kCRuntime) break;
    }
    ptrace(PTRACE_DETACH, s->tid, nullptr, reinterpret_cast<void *>(static_cast<long>(deliver)));
    return false;
}

// A thread of `pid` (pick_thread) seized and stopped at a safe point: waiting in a system
// call, or after kWaitingTries, running the program's own code (stepped there out of the C
// library if need be); fails after kMaxWait.
StoppedThread stop_at_safe_point(int pid) {
    constexpr int kWaitingTries = 100;
    constexpr std::chrono::seconds kMaxWait{5};
    const Clock::time_point started = Clock::now();
    std::map<std::string, bool> allocators;
    StoppedThread s;
    for (int attempt = 0;; ++attempt) {
        s.interrupts = attempt + 1;
        bool in_syscall = false;
        s.tid = pick_thread(pid, &in_syscall);
        if (ptrace(PTRACE_SEIZE, s.tid, nullptr, reinterpret_cast<void *>(PTRACE_O_TRACESYSGOOD)) != 0)
            fail(refusal(pid, errno));
        s.interrupted = Clock::now();
        if (ptrace(PTRACE_INTERRUPT, s.tid, nullptr, nullptr) != 0) {
            const int err = errno;
            ptrace(PTRACE_DETACH, s.tid, nullptr, nullptr);
            fail(fmt::format("PTRACE_INTERRUPT: {}", strerror(err)));
        }
        wait_for_interrupt(pid, s.tid);
        s.stopped = Clock::now();
        if (ptrace(PTRACE_GETREGS, s.tid, nullptr, &s.regs) != 0)
            fail(fmt::format("PTRACE_GETREGS: {}", strerror(errno)));
        // A signal already pending for this thread (an int3 probe's SIGTRAP raised just
        // before the stop) must be delivered with the registers it was raised with.
        const bool pending = signal_pending(pid, s.tid);
        // Stopped anywhere else (running, or in a call malloc makes), it may hold a lock
        // the calls take: see StopPlace.
        const bool syscall = static_cast<long long>(s.regs.orig_rax) >= 0;
        const bool waiting = syscall && waits_outside(static_cast<long>(s.regs.orig_rax));
        const StopPlace place = stop_place(pid, s.regs.rip, &allocators);
        if (!pending && place != StopPlace::kUnsafe && waiting) return s;
        // No thread waits: one stopped in the program's own code, outside the C library,
        // or stepped there from it.
        const bool no_waiter = attempt >= kWaitingTries;
        if (!pending && place == StopPlace::kProgram && no_waiter) return s;
        Clock::duration rest = std::chrono::milliseconds(1);
        if (!pending && place == StopPlace::kCRuntime && !syscall && no_waiter) {
            const Clock::time_point stepping = Clock::now();
            if (step_out_of_c_runtime(pid, &s, &allocators)) return s;
            // Stepped in vain, it was stopped that long: it runs three times as long
            // before the next try, so that a program that never leaves libc runs at
            // three quarters of its speed at least while attach tries.
            rest = std::max(rest, 3 * (Clock::now() - stepping));
        } else {
            ptrace(PTRACE_DETACH, s.tid, nullptr, nullptr);
        }
        if (no_waiter && Clock::now() - started > kMaxWait)
            fail(fmt::format("process {}: in {} tries, no thread stopped waiting in a system call or running outside "
                             "the C library, its allocator and the agent; nothing was changed, try again",
                             pid, attempt + 1));
        usleep(static_cast<useconds_t>(std::chrono::duration_cast<std::chrono::microseconds>(rest).count()));
    }
}

// What the calls change in a stopped thread besides its registers, as it was.
struct ThreadState {
    std::vector<uint8_t> xstate; // the vector state (NT_X86_XSTATE), when have_xstate
    bool have_xstate = false;
    user_fpregs_struct fpregs{}; // else the x87 and SSE state, when have_fp
    bool have_fp = false;
    uint64_t mask = 0; // the signal mask, when have_mask
    bool have_mask = false;
};

// The state of the stopped thread `tid` the calls change, saved; its mask lets the agent's
// signals through from now on.
ThreadState prepare_for_calls(int tid) {
    ThreadState s;
    // The vector state (x87, SSE, AVX, ...): the called code uses vector registers.
    s.xstate.resize(16384);
    iovec xiov{s.xstate.data(), s.xstate.size()};
    s.have_xstate = ptrace(PTRACE_GETREGSET, tid, reinterpret_cast<void *>(NT_X86_XSTATE), &xiov) == 0;
    s.xstate.resize(xiov.iov_len);
    s.have_fp = !s.have_xstate && ptrace(PTRACE_GETFPREGS, tid, nullptr, &s.fpregs) == 0;
    // The signals the calls raise must reach their handlers: the return trap (a SIGSEGV
    // at address 0), the agent's own breakpoints and fault-safe reads while it loads. A
    // fault forced on a thread that blocks its signal is worse than fatal: the kernel
    // unblocks it and resets the process's action to SIG_DFL, and the agent's handler is
    // gone. And the thread created here to load the agent inherits this thread's mask.
    // So the agent's signals are let through for the calls, the mask put back after.
    s.have_mask = ptrace(PTRACE_GETSIGMASK, tid, reinterpret_cast<void *>(sizeof s.mask), &s.mask) == 0;
    if (s.have_mask && (s.mask & kAgentSignals) != 0) {
        uint64_t open = s.mask & ~kAgentSignals;
        ptrace(PTRACE_SETSIGMASK, tid, reinterpret_cast<void *>(sizeof open), &open);
    }
    return s;
}

// The loader's data page (the slots the code reads: see kDlopen and the rest) for the
// loader mapped at `loader`.
std::vector<uint8_t> loader_data(const std::vector<uint64_t> &fns, uint64_t loader, uint64_t cookie,
                                 const std::string &agent) {
    std::vector<uint8_t> data(kPage, 0);
    const auto put64 = [&](uint64_t off, uint64_t v) { memcpy(data.data() + off, &v, 8); };
    put64(kDlopen, fns[kFnDlopen]);
    put64(kDlsym, fns[kFnDlsym]);
    put64(kDlerror, fns[kFnDlerror]);
    put64(kMunmap, fns[kFnMunmap]);
    put64(kDetach, fns[kFnDetach]);
    put64(kSelf, fns[kFnSelf]);
    put64(kSnprintf, fns[kFnSnprintf]);
    put64(kUsleep, fns[kFnUsleep]);
    put64(kBase, loader);
    put64(kSize, kLoaderSize);
    put64(kCookie, cookie);
    put64(kWaitLeft, kPolls);
    memcpy(data.data() + kFormat, "%s", 3);
    memcpy(data.data() + kCreateName, "pthread_create", 15);
    memcpy(data.data() + kSymbol, "ukp_control_start", 18);
    memcpy(data.data() + kPath, agent.c_str(), agent.size() + 1);
    return data;
}

// The loader mapped into the target and its thread created, by calls on the stopped
// thread `s` (libc's functions `fns`, its `syscall` instruction at `syscall_insn`); the
// loader's address. On a failure *error says why, and a mapping made is removed again.
uint64_t start_loader(int pid, const StoppedThread &s, const std::vector<uint64_t> &fns, uint64_t syscall_insn,
                      const std::string &agent, const AgentFunctions &in_agent, uint64_t cookie, std::string *error) {
    Tracee t(s.tid);
    uint64_t loader = 0;
    bool quiet = false; // the thread's hits are the agent's work (ukp_loader_quiet(1) called)
    try {
        // The mapping by a bare system call; every call after it runs on its stack.
        loader = t.syscall(s.regs, syscall_insn, SYS_mmap, 0, kLoaderSize, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS, static_cast<uint64_t>(-1), 0);
        if (loader > static_cast<uint64_t>(-4096) || loader == 0) {
            loader = 0;
            fail(fmt::format("mmap in process {} failed", pid));
        }
        const uint64_t sp = loader + kLoaderSize;
        const std::vector<uint8_t> code = loader_code();
        const std::vector<uint8_t> data = loader_data(fns, loader, cookie, agent);
        t.write_mem(loader, code.data(), code.size());
        t.write_mem(loader + kPage, data.data(), data.size());
        // An agent already loaded may have events live: the calls below, made on this
        // thread of the program, are its own work while they run, not the program's.
        if (in_agent.quiet != 0) quiet = static_cast<int32_t>(t.call(s.regs, in_agent.quiet, sp, 1)) == 0;
        if (t.call(s.regs, fns[kFnMprotect], sp, loader, kPage, PROT_READ | PROT_EXEC) != 0)
            fail(fmt::format("mprotect in process {} failed", pid));
        // The program's pthread_create if it interposes one (sanitizers, profilers must
        // know of every thread), libc's otherwise.
        uint64_t create = t.call(s.regs, fns[kFnDlsym], sp, 0 /* RTLD_DEFAULT */, loader + kPage + kCreateName);
        if (create == 0) create = fns[kFnCreate];
        // An agent already loaded may have events live: the loader thread runs on a stack it
        // notes, so that none of its work (libc's start of a thread, dlopen, its end) is
        // traced as the program's. Without one (an older agent, no entry left), glibc's.
        uint64_t attr = 0;
        if (in_agent.stack != 0 &&
            static_cast<int32_t>(t.call(s.regs, in_agent.stack, sp, loader + kPage + kStackOut)) == 0) {
            uint64_t stack[2] = {0, 0};
            t.read_mem(loader + kPage + kStackOut, stack, sizeof stack);
            if (t.call(s.regs, fns[kFnAttrInit], sp, loader + kPage + kAttr) == 0 &&
                t.call(s.regs, fns[kFnAttrSetstack], sp, loader + kPage + kAttr, stack[0], stack[1]) == 0)
                attr = loader + kPage + kAttr;
        }
        const int rc =
            static_cast<int32_t>(t.call(s.regs, create, sp, loader + kPage + kThreadOut, attr, loader, loader + kPage));
        if (rc != 0) fail(fmt::format("pthread_create in process {} failed: {}", pid, strerror(rc)));
        if (quiet) {
            quiet = false;
            t.call(s.regs, in_agent.quiet, sp, 0);
        }
    } catch (const std::exception &e) {
        *error = e.what();
        if (quiet) {
            try {
                t.call(s.regs, in_agent.quiet, loader + kLoaderSize, 0);
            } catch (const std::exception &) {
            }
        }
        if (loader != 0) {
            try {
                t.syscall(s.regs, syscall_insn, SYS_munmap, loader, kLoaderSize);
            } catch (const std::exception &) {
            }
        }
    }
    return loader;
}

// The stopped thread put back as it was (`state`, its registers) and let go; whether all
// of it could be put back.
bool restore_thread(const StoppedThread &s, ThreadState &state) {
    // Restore exactly: the vector state, then the registers (with orig_rax and rax as
    // they were, so an interrupted system call restarts). Its stack was not touched.
    bool restored = true;
    iovec xiov{state.xstate.data(), state.xstate.size()};
    user_regs_struct regs = s.regs;
    if (state.have_xstate)
        restored &= ptrace(PTRACE_SETREGSET, s.tid, reinterpret_cast<void *>(NT_X86_XSTATE), &xiov) == 0;
    if (state.have_fp) restored &= ptrace(PTRACE_SETFPREGS, s.tid, nullptr, &state.fpregs) == 0;
    restored &= ptrace(PTRACE_SETREGS, s.tid, nullptr, &regs) == 0;
    if (state.have_mask && (state.mask & kAgentSignals) != 0)
        restored &= ptrace(PTRACE_SETSIGMASK, s.tid, reinterpret_cast<void *>(sizeof state.mask), &state.mask) == 0;
    // From the stop of our return trap: its SIGSEGV is dropped.
    ptrace(PTRACE_DETACH, s.tid, nullptr, nullptr);
    return restored;
}

// Tells the loader at `loader` that the interrupted thread is let go (kGo); why it could
// not, or "".
std::string release_loader(int pid, uint64_t loader) {
    const uint64_t go = 1;
    try {
        Tracee(pid).write_mem(loader + kPage + kGo, &go, sizeof go);
    } catch (const std::exception &e) {
        return e.what();
    }
    return "";
}

// Waits for the loader thread at `loader` (its data page has `cookie`), which runs on its
// own now: done when its pages are gone (success); fails when its status says why not, or
// after 10 s.
void wait_for_agent(int pid, uint64_t loader, uint64_t cookie) {
    const Clock::time_point deadline = Clock::now() + std::chrono::seconds(10);
    Tracee reader(pid);
    while (true) {
        uint64_t head[2] = {0, 0}; // status, value
        uint64_t seen_cookie = 0;
        bool ours = true;
        try {
            reader.read_mem(loader + kPage + kCookie, &seen_cookie, 8);
            reader.read_mem(loader + kPage + kStatus, head, sizeof head);
        } catch (const std::exception &) {
            ours = false;
        }
        if (!ours || seen_cookie != cookie) break;
        if (head[0] == 1 || head[0] == 2) {
            char text[kErrorMax + 1] = {};
            try {
                reader.read_mem(loader + kPage + kError, text, kErrorMax);
            } catch (const std::exception &) {
            }
            fail(fmt::format("{} in process {} failed: {}", head[0] == 1 ? "dlopen" : "dlsym", pid,
                             text[0] ? text : "(no message)"));
        }
        if (head[0] == 4) fail(fmt::format("the loader in process {} gave up waiting for ukprobe", pid));
        if (head[0] == 3) {
            const int rc = static_cast<int>(static_cast<int64_t>(head[1]));
            fail(fmt::format("the agent loaded, but ukp_control_start() failed in process {}: {}{}", pid, strerror(-rc),
                             rc == -EPERM ? " (its socket directory /tmp/ukprobes-UID must be a directory of the "
                                            "process's user with mode 0700)"
                                          : ""));
        }
        if (Clock::now() > deadline)
            fail(fmt::format("the agent did not start in process {} within 10 s (its loader thread is stuck in "
                             "dlopen)",
                             pid));
        usleep(500);
    }
}

// Milliseconds from `from` to `to`.
double ms_between(Clock::time_point from, Clock::time_point to) {
    return std::chrono::duration<double, std::milli>(to - from).count();
}

} // namespace

InjectResult inject_agent(int pid, const std::string &agent) {
    InjectResult result;
    check_target(pid, agent);
    const OwnedMapping libc = find_libc(pid);
    const std::vector<uint64_t> fns = libc_functions(pid, libc);
    if (agent.size() >= kError - kPath) fail(fmt::format("the agent's path is too long: {}", agent));
    const uint64_t syscall_insn = find_syscall_insn(pid, libc.path);
    const AgentFunctions in_agent = loaded_agent_functions(pid, agent);
    // Tells the loader's data page from a later mapping at the same address.
    const uint64_t cookie =
        (static_cast<uint64_t>(getpid()) << 32) ^ static_cast<uint64_t>(Clock::now().time_since_epoch().count());

    const StoppedThread stopped = stop_at_safe_point(pid);
    result.tid = stopped.tid;
    result.was_in_syscall = static_cast<long long>(stopped.regs.orig_rax) >= 0;
    result.interrupts = stopped.interrupts;
    result.steps = stopped.steps;
    ThreadState state = prepare_for_calls(stopped.tid);
    std::string error;
    const Clock::time_point c0 = Clock::now();
    const uint64_t loader = start_loader(pid, stopped, fns, syscall_insn, agent, in_agent, cookie, &error);
    result.calls_ms = ms_between(c0, Clock::now());
    const bool restored = restore_thread(stopped, state);
    if (error.empty() && restored) error = release_loader(pid, loader);
    const Clock::time_point t1 = Clock::now();
    result.pause_ms = ms_between(stopped.interrupted, t1);
    result.stopped_ms = ms_between(stopped.stopped, t1);

    if (!restored) error += (error.empty() ? "" : "; ") + std::string("the thread's state could not be fully restored");
    if (!error.empty()) fail(error);

    wait_for_agent(pid, loader, cookie);
    result.ready_ms = ms_between(stopped.interrupted, Clock::now());
    return result;
}

std::vector<UnblockedThread> unblock_agent_signals(int pid) {
    const uint64_t agent = kAgentSignals;
    std::vector<UnblockedThread> out;
    const std::string dir = fmt::format("/proc/{}/task", pid);
    DIR *d = opendir(dir.c_str());
    if (d == nullptr) return out;
    std::vector<int> tids;
    while (const dirent *e = readdir(d))
        if (e->d_name[0] != '.') tids.push_back(atoi(e->d_name));
    closedir(d);
    for (int tid : tids) {
        const std::string blocked = status_field_of_task(pid, tid, "SigBlk");
        if (blocked.empty() || (std::strtoull(blocked.c_str(), nullptr, 16) & agent) == 0) continue;
        UnblockedThread u;
        u.tid = tid;
        if (ptrace(PTRACE_SEIZE, tid, nullptr, nullptr) != 0) {
            u.error = fmt::format("PTRACE_SEIZE: {}", strerror(errno));
            u.signals = std::strtoull(blocked.c_str(), nullptr, 16) & agent;
            out.push_back(u);
            continue;
        }
        bool stopped = ptrace(PTRACE_INTERRUPT, tid, nullptr, nullptr) == 0;
        while (stopped) {
            int status = 0;
            if (waitpid(tid, &status, __WALL) != tid || WIFEXITED(status) || WIFSIGNALED(status)) {
                stopped = false;
                break;
            }
            if (WIFSTOPPED(status) && status >> 16 == PTRACE_EVENT_STOP) break;
            // A signal that came first goes on to the thread.
            if (WIFSTOPPED(status))
                ptrace(PTRACE_CONT, tid, nullptr,
                       reinterpret_cast<void *>(static_cast<long>(status >> 16 == 0 ? WSTOPSIG(status) : 0)));
        }
        uint64_t mask = 0;
        if (!stopped) {
            u.error = "it could not be stopped";
        } else if (ptrace(PTRACE_GETSIGMASK, tid, reinterpret_cast<void *>(sizeof mask), &mask) != 0) {
            u.error = fmt::format("PTRACE_GETSIGMASK: {}", strerror(errno));
        } else {
            u.signals = mask & agent;
            mask &= ~agent;
            if (u.signals != 0 && ptrace(PTRACE_SETSIGMASK, tid, reinterpret_cast<void *>(sizeof mask), &mask) != 0)
                u.error = fmt::format("PTRACE_SETSIGMASK: {}", strerror(errno));
        }
        ptrace(PTRACE_DETACH, tid, nullptr, nullptr);
        if (u.signals != 0 || !u.error.empty()) out.push_back(u);
    }
    return out;
}

} // namespace ukprobe
