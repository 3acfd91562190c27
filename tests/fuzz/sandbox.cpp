// run_in_child(): see sandbox.hpp. The child side is built without sanitizers or coverage
// (CMakeLists.txt) and calls no libc after the fuzzed code ran: that code may have left
// any register or flag in any state.
#include "sandbox.hpp"

#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/ucontext.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fcntl.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <initializer_list>

extern "C" [[noreturn]] void ukp_fuzz_enter(const ukp::fuzz::CpuState *s, const void *xsave_init);

namespace ukp::fuzz {
namespace {

RunResult *g_shared = nullptr;   // MAP_SHARED: the child's report
const RunSpec *g_spec = nullptr; // the child's copy of the spec (inherited by fork)
alignas(16) uint8_t g_altstack[64 * 1024];
// A standard-form XSAVE area whose header says "every component in init state".
alignas(64) uint8_t g_xsave_init[4096];

void copy_bytes(void *dst, const void *src, size_t n) {
    asm volatile("rep movsb" : "+D"(dst), "+S"(src), "+c"(n) : : "memory");
}

[[noreturn]] void raw_exit(int code) {
    for (;;) asm volatile("syscall" : : "a"(SYS_exit), "D"(code) : "rcx", "r11", "memory");
}

void on_signal(int sig, siginfo_t *si, void *ucv) {
    RunResult *r = g_shared;
    const ucontext_t *uc = static_cast<const ucontext_t *>(ucv);
    r->sig = sig;
    r->code = si->si_code;
    r->addr = reinterpret_cast<uint64_t>(si->si_addr);
    copy_bytes(r->gregs, uc->uc_mcontext.gregs, sizeof(r->gregs));
    if (uc->uc_mcontext.fpregs != nullptr) {
        copy_bytes(r->xmm, uc->uc_mcontext.fpregs->_xmm, sizeof(r->xmm));
        r->mxcsr = uc->uc_mcontext.fpregs->mxcsr;
    }
    int n = 0;
    for (int i = 0; i < g_spec->npages; ++i) {
        if (!g_spec->pages[i].snapshot) continue;
        copy_bytes(r->mem[n++], reinterpret_cast<const void *>(g_spec->pages[i].addr), kPageSize);
    }
    r->nsnap = n;
    r->kind = sig == SIGALRM ? RunResult::kTimeout : RunResult::kSignal;
    raw_exit(0);
}

// The kernel's struct sigaction: libc's (and the sanitizers' interceptors) stay out.
struct KernelSigaction {
    void (*handler)(int, siginfo_t *, void *);
    unsigned long flags;
    void (*restorer)();
    uint64_t mask;
};

constexpr unsigned long kSaRestorer = 0x04000000;
void no_return() { raw_exit(4); }

[[noreturn]] void child(const RunSpec &spec) {
    g_spec = &spec;
    for (int i = 0; i < spec.npages; ++i) {
        const PageSpec &p = spec.pages[i];
        void *want = reinterpret_cast<void *>(p.addr);
        void *got =
            mmap(want, kPageSize, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
        if (got != want) _exit(3);
        copy_bytes(got, p.content, kPageSize);
        // Code is read-only, as a program's is: an instruction that could rewrite its own
        // bytes would run differently from any copy of it elsewhere.
        if (p.exec && mprotect(got, kPageSize, PROT_READ | PROT_EXEC) != 0) _exit(3);
    }
    stack_t ss{};
    ss.ss_sp = g_altstack;
    ss.ss_size = sizeof(g_altstack);
    if (sigaltstack(&ss, nullptr) != 0) _exit(3);
    KernelSigaction sa{};
    sa.handler = on_signal;
    // x86-64 delivers no signal without a restorer; ours is never used (the handler exits).
    sa.flags = SA_SIGINFO | SA_ONSTACK | kSaRestorer;
    sa.restorer = no_return;
    sa.mask = ~0ull; // nothing nests in the handler
    for (int sig : {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGTRAP, SIGALRM}) {
        if (syscall(SYS_rt_sigaction, sig, &sa, nullptr, sizeof(sa.mask)) != 0) _exit(3);
    }
    uint64_t none = 0;
    if (syscall(SYS_rt_sigprocmask, SIG_SETMASK, &none, nullptr, sizeof(none)) != 0) _exit(3);
    // Bounds loops (a long rep string instruction): the handler reports a timeout.
    itimerval t{};
    t.it_value.tv_sec = 2;
    if (setitimer(ITIMER_REAL, &t, nullptr) != 0) _exit(3);

    // From here on the only system call allowed is exit (the handler's).
    sock_filter filter[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 0, 3),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_exit, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
    };
    sock_fprog prog{static_cast<unsigned short>(sizeof(filter) / sizeof(filter[0])), filter};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) _exit(3);
    if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0) _exit(3);
    ukp_fuzz_enter(&spec.cpu, g_xsave_init);
}

// What the fuzzer process and the zygote share: the spec with its page contents, and the
// report of the last run.
struct Shared {
    RunResult result;
    RunSpec spec;
    uint8_t content[kMaxPages][kPageSize];
};
Shared *g_sh = nullptr;
int g_cmd = -1;    // fuzzer -> zygote: one byte per run
int g_status = -1; // zygote -> fuzzer: the run's wait status

// Whole reads and writes, through signals (libFuzzer's timers interrupt them).
bool read_full(int fd, void *buf, size_t n) {
    auto *p = static_cast<uint8_t *>(buf);
    while (n > 0) {
        const ssize_t r = read(fd, p, n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return false;
        p += r;
        n -= static_cast<size_t>(r);
    }
    return true;
}

bool write_full(int fd, const void *buf, size_t n) {
    const auto *p = static_cast<const uint8_t *>(buf);
    while (n > 0) {
        const ssize_t r = write(fd, p, n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return false;
        p += r;
        n -= static_cast<size_t>(r);
    }
    return true;
}

// The zygote, forked once while the fuzzer process is still small, forks the runs: a
// fork costs in proportion to the forking process's memory, and the fuzzer's grows.
[[noreturn]] void zygote(int cmd, int status_fd) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    uint64_t seq;
    while (read_full(cmd, &seq, sizeof(seq))) {
        int64_t reply[2] = {static_cast<int64_t>(seq), -1};
        int status = -1;
        const pid_t pid = fork();
        if (pid == 0) child(g_sh->spec);
        if (pid > 0) {
            while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
            }
        }
        reply[1] = status;
        if (!write_full(status_fd, reply, sizeof(reply))) break;
    }
    _exit(0);
}

bool start_zygote() {
    void *p = mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return false;
    g_sh = static_cast<Shared *>(p);
    g_shared = &g_sh->result;
    std::memset(g_xsave_init, 0, sizeof(g_xsave_init));
    const uint32_t mxcsr = 0x1f80; // legacy area offset 24; xrstor loads it with SSE
    std::memcpy(g_xsave_init + 24, &mxcsr, sizeof(mxcsr));
    int to[2], from[2];
    if (pipe2(to, O_CLOEXEC) != 0 || pipe2(from, O_CLOEXEC) != 0) return false;
    const pid_t pid = fork();
    if (pid < 0) return false;
    if (pid == 0) {
        close(to[1]);
        close(from[0]);
        zygote(to[0], from[1]);
    }
    close(to[0]);
    close(from[1]);
    g_cmd = to[1];
    g_status = from[0];
    return true;
}

} // namespace

bool run_in_child(const RunSpec &spec, RunResult *out) {
    if (g_sh == nullptr && !start_zygote()) return false;
    if (spec.npages > kMaxPages) return false;
    g_sh->spec = spec;
    for (int i = 0; i < spec.npages; ++i) {
        std::memcpy(g_sh->content[i], spec.pages[i].content, kPageSize);
        g_sh->spec.pages[i].content = g_sh->content[i];
    }
    g_shared->kind = RunResult::kNoReport;
    g_shared->nsnap = 0;
    static uint64_t seq = 0;
    ++seq;
    int64_t reply[2];
    if (!write_full(g_cmd, &seq, sizeof(seq)) || !read_full(g_status, reply, sizeof(reply))) return false;
    if (reply[0] != static_cast<int64_t>(seq) || reply[1] == -1) return false;
    const int status = static_cast<int>(reply[1]);
    out->kind = g_shared->kind;
    if (WIFEXITED(status) && WEXITSTATUS(status) == 3) out->kind = RunResult::kSetupFailed;
    out->wait_status = status;
    out->sig = g_shared->sig;
    out->code = g_shared->code;
    out->addr = g_shared->addr;
    std::memcpy(out->gregs, g_shared->gregs, sizeof(out->gregs));
    std::memcpy(out->xmm, g_shared->xmm, sizeof(out->xmm));
    out->mxcsr = g_shared->mxcsr;
    out->nsnap = g_shared->nsnap;
    std::memcpy(out->mem, g_shared->mem, sizeof(out->mem[0]) * static_cast<size_t>(out->nsnap));
    return true;
}

} // namespace ukp::fuzz
