// fork() and vfork(): a child keeps its probes by default, or has them removed under
// UKP_FORK_REMOVE; a vfork child that execs changes nothing; the parent is unaffected.
#include <ukprobes/kprobes.h>
#include <ukprobes/trace.h>

#include "control/protocol.hpp"
#include "core/fork.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

extern "C" int ukp_control_start(void);
extern "C" int ukp_control_stop(void);

extern "C" __attribute__((noinline)) int ukf_work(int x) {
    asm volatile("" ::: "memory");
    return x + 7;
}

namespace {

std::atomic<int> g_hits{0};
int count_hit(kprobe *, pt_regs *) {
    ++g_hits;
    return 0;
}

// Runs body in a child of fork() and returns its exit status.
template <typename Body>
int in_child(Body body) {
    const pid_t pid = fork();
    if (pid == 0) _exit(body());
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 100 + WTERMSIG(status);
}

struct ForkTest : ::testing::Test {
    kprobe kp{};
    void SetUp() override {
        g_hits = 0;
        kp.symbol_name = "ukf_work";
        kp.pre_handler = count_hit;
        ASSERT_EQ(register_kprobe(&kp), 0);
    }
    void TearDown() override {
        unregister_kprobe(&kp);
        ukp_set_fork_policy(UKP_FORK_KEEP);
    }
};

TEST_F(ForkTest, ChildKeepsItsProbesByDefault) {
    const int status = in_child([] {
        g_hits = 0;
        if (ukf_work(1) != 8) return 2;
        return g_hits.load() == 1 ? 0 : 3;
    });
    EXPECT_EQ(status, 0) << "2: wrong result, 3: no hit in the child";
    EXPECT_EQ(ukf_work(1), 8);
    EXPECT_EQ(g_hits, 1) << "the parent's own hit";
}

TEST_F(ForkTest, ChildCanHaveProbesRemoved) {
    ASSERT_EQ(ukp_set_fork_policy(UKP_FORK_REMOVE), 0);
    uint8_t armed_byte;
    std::memcpy(&armed_byte, reinterpret_cast<const void *>(kp.addr), 1);
    ASSERT_EQ(armed_byte, 0xcc);
    const uint8_t original = kp.opcode;
    const int status = in_child([original] {
        g_hits = 0;
        if (ukf_work(2) != 9) return 2;
        if (g_hits.load() != 0) return 3;
        uint8_t b;
        std::memcpy(&b, reinterpret_cast<const void *>(&ukf_work), 1);
        return b == original ? 0 : 4;
    });
    EXPECT_EQ(status, 0) << "2: wrong result, 3: a handler ran, 4: code not restored";
    EXPECT_EQ(ukf_work(2), 9);
    EXPECT_EQ(g_hits, 1) << "the parent keeps its probe";
    EXPECT_EQ(ukp_set_fork_policy(7), -EINVAL);
}

TEST_F(ForkTest, VforkChildThatExecsChangesNothing) {
    ASSERT_EQ(ukp_set_fork_policy(UKP_FORK_REMOVE), 0); // not applied to vfork: shared memory
    const pid_t pid = vfork();
    if (pid == 0) {
        execl("/bin/true", "true", static_cast<char *>(nullptr));
        _exit(127);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    EXPECT_EQ(ukf_work(3), 10);
    EXPECT_EQ(g_hits, 1);
}

TEST_F(ForkTest, RegisteringInTheChildWorks) {
    const int status = in_child([] {
        kprobe again{};
        again.symbol_name = "ukf_work";
        again.pre_handler = count_hit;
        if (register_kprobe(&again) != 0) return 2;
        g_hits = 0;
        ukf_work(0);
        unregister_kprobe(&again);
        return g_hits.load() == 2 ? 0 : 3; // both probes ran
    });
    EXPECT_EQ(status, 0);
}

std::atomic<int> g_ret_task{0};
int note_task(kretprobe_instance *ri, pt_regs *) {
    g_ret_task = ri->task;
    return 0;
}

// ri->task is the calling thread's id: in a child of fork(), the child's, although the
// thread that forked had hit a kretprobe (and its id was known) before.
TEST_F(ForkTest, AKretprobeInTheChildSeesTheChildsThreadId) {
    kretprobe rp{};
    rp.kp.symbol_name = "ukf_work";
    rp.handler = note_task;
    ASSERT_EQ(register_kretprobe(&rp), 0);
    EXPECT_EQ(ukf_work(1), 8);
    EXPECT_EQ(g_ret_task.load(), static_cast<int>(gettid()));
    const int status = in_child([] {
        g_ret_task = 0;
        ukf_work(2);
        return g_ret_task.load() == static_cast<int>(gettid()) ? 0 : 1;
    });
    unregister_kretprobe(&rp);
    EXPECT_EQ(status, 0) << "1: ri->task was not the child's thread id";
}

// One request on a connected control socket; false when the agent did not answer.
bool request(int fd, ukp::control::Op op, const std::string &path, const std::string &payload = "") {
    using namespace ukp::control;
    const RequestHeader h{kMagic, kVersion, static_cast<uint16_t>(op), static_cast<uint32_t>(path.size()),
                          static_cast<uint32_t>(payload.size())};
    const std::string body = path + payload;
    if (send(fd, &h, sizeof h, MSG_NOSIGNAL) != sizeof h) return false;
    if (!body.empty() && send(fd, body.data(), body.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(body.size()))
        return false;
    ReplyHeader r{};
    if (recv(fd, &r, sizeof r, MSG_WAITALL) != sizeof r) return false;
    std::string reply(r.payload_len, '\0');
    return r.payload_len == 0 || recv(fd, reply.data(), reply.size(), MSG_WAITALL) == r.payload_len;
}

// Waits for a child that ends with alarm(3) armed: one killed by SIGALRM was stuck (on an
// inherited lock) and counts in *hung; one that exits other than with 0 in *failed.
void await_child(pid_t pid, int *hung, int *failed) {
    int status = 0;
    waitpid(pid, &status, 0);
    if (WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM)
        ++*hung;
    else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        ++*failed;
}

// The agent's control thread serves requests without a pause while the program forks:
// each child uses the trace layer the thread was using (its locks, the allocator). None
// may hang on a lock the thread held at the fork (it does not exist in the child).
TEST(ForkWhileAgentWorks, ChildrenNeverInheritTheControlThreadsLocks) {
    ASSERT_EQ(ukp_control_start(), 0);
    const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ASSERT_GE(fd, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    struct stat ns {};
    ASSERT_EQ(stat("/proc/self/ns/pid", &ns), 0);
    const std::string path = ukp::control::socket_path(geteuid(), getpid(), ns.st_ino);
    std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr *>(&addr), sizeof addr), 0) << path;
    std::atomic<bool> stop{false};
    std::atomic<long> served{0};
    std::thread client([&] {
        // Defining and removing an event holds the trace layer's lock while the probe goes in.
        while (!stop.load() && request(fd, ukp::control::Op::kAppend, "kprobe_events", "p:ukf/work ukf_work") &&
               request(fd, ukp::control::Op::kAppend, "kprobe_events", "-:ukf/work") &&
               request(fd, ukp::control::Op::kVerify, ""))
            ++served;
    });
    while (served.load() < 5) usleep(1000);
    int hung = 0, failed = 0;
    for (int i = 0; i < 150; ++i) {
        const pid_t pid = fork();
        if (pid == 0) {
            alarm(3); // a child stuck on an inherited lock is killed, and counted
            char *out = nullptr;
            if (ukp_trace_read("kprobe_events", &out) < 0) _exit(2);
            free(out);
            _exit(0);
        }
        await_child(pid, &hung, &failed);
    }
    stop = true;
    client.join();
    close(fd);
    EXPECT_EQ(ukp_control_stop(), 0);
    EXPECT_GT(served.load(), 5) << "the control thread was not kept busy";
    EXPECT_EQ(hung, 0) << "children stuck on a lock of the control thread";
    EXPECT_EQ(failed, 0);
}

// The optimizer goes to sleep and wakes without a pause while the program forks (another
// thread registers and removes a probe, each time a pass of it); each child registers a
// probe of its own and waits for its optimizer. None may hang on a lock the parent's
// optimizer held at the fork: the mutex of its condition variable, which it holds between
// letting the registry mutex go and sleeping (opt_after_fork_child makes new ones).
// The registrations themselves do not overlap the forks (`calls`): they read the list of
// loaded objects on the calling thread, under the C library's loader lock, which glibc's
// fork() does not take (a program thread inside dl_iterate_phdr() at a fork leaves it
// taken in the child).
TEST(ForkWhileAgentWorks, ChildrenNeverInheritTheOptimizersLocks) {
    std::atomic<bool> stop{false};
    std::atomic<long> cycles{0};
    std::mutex calls;
    std::thread churn([&] {
        while (!stop.load()) {
            kprobe p{};
            p.symbol_name = "ukf_work";
            p.pre_handler = count_hit;
            {
                const std::lock_guard lock(calls);
                if (register_kprobe(&p) != 0) break;
            }
            ukp_optimizer_flush();
            {
                const std::lock_guard lock(calls);
                unregister_kprobe(&p);
            }
            ++cycles;
        }
    });
    while (cycles.load() < 5) usleep(1000);
    int hung = 0, failed = 0;
    for (int i = 0; i < 3000; ++i) {
        pid_t pid;
        {
            const std::lock_guard lock(calls);
            pid = fork();
        }
        if (pid == 0) {
            alarm(3); // a child stuck on an inherited lock is killed, and counted
            kprobe mine{};
            mine.symbol_name = "ukf_work";
            mine.pre_handler = count_hit;
            if (register_kprobe(&mine) != 0) _exit(2);
            ukp_optimizer_flush();
            unregister_kprobe(&mine);
            _exit(0);
        }
        await_child(pid, &hung, &failed);
    }
    stop = true;
    churn.join();
    EXPECT_GT(cycles.load(), 5) << "the optimizer was not kept busy";
    EXPECT_EQ(hung, 0) << "children stuck on a lock of the optimizer";
    EXPECT_EQ(failed, 0);
}

int slow_hit(kprobe *, pt_regs *) {
    usleep(2000);
    return 0;
}

// Another thread is inside a handler (a read-side section) when the program forks; the
// child's unregistration waits for the sections begun before it: not for that thread's,
// which does not exist in the child.
TEST(ForkWhileAgentWorks, ChildUnregistersWhileAnotherThreadWasInAHandler) {
    static kprobe kp{};
    kp.symbol_name = "ukf_work";
    kp.pre_handler = slow_hit;
    ASSERT_EQ(register_kprobe(&kp), 0);
    std::atomic<bool> stop{false};
    std::thread t([&] {
        while (!stop) ukf_work(1);
    });
    usleep(20000);
    int hung = 0;
    for (int i = 0; i < 10; ++i) {
        const pid_t pid = fork();
        if (pid == 0) {
            alarm(3);
            unregister_kprobe(&kp);
            _exit(0);
        }
        int status = 0;
        waitpid(pid, &status, 0);
        if (WIFSIGNALED(status)) ++hung;
    }
    stop = true;
    t.join();
    unregister_kprobe(&kp);
    EXPECT_EQ(hung, 0) << "children stuck in unregister_kprobe";
}

// A process made by a fork() that runs no handler (bwrap's clone() for the pid 1 of its
// sandbox, syscall(SYS_fork)) while an agent thread was working: it has the gate that
// thread held, held, and not the thread. Its own fork()s must go through (the first
// renews the gates) and its children trace as any child does.
TEST(ForkWhileAgentWorks, AChildOfARawForkForksWhileItsParentsGateWasHeld) {
    ukp::core::hook_fork(); // as an agent thread's start does
    std::atomic<bool> held{false}, release{false};
    std::thread worker([&] {
        const ukp::core::ForkQuiet busy(ukp::core::ForkGate::kControl);
        held = true;
        while (!release.load()) usleep(1000);
    });
    while (!held.load()) usleep(1000);
    const pid_t raw = static_cast<pid_t>(syscall(SYS_fork));
    if (raw == 0) {
        alarm(5); // stuck at its fork(): killed, and counted as hung
        for (int i = 0; i < 3; ++i) {
            const pid_t child = fork();
            if (child == 0) _exit(ukf_work(1) == 8 ? 0 : 3);
            int status = 0;
            if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0) _exit(2);
        }
        _exit(0);
    }
    ASSERT_GT(raw, 0);
    int hung = 0, failed = 0;
    await_child(raw, &hung, &failed);
    release = true;
    worker.join();
    EXPECT_EQ(hung, 0) << "the raw child's fork() waited for a gate held by a thread it does not have";
    EXPECT_EQ(failed, 0);
    // The parent's gates are its own: a fork here goes through as before.
    EXPECT_EQ(in_child([] { return ukf_work(1) == 8 ? 0 : 1; }), 0);
}

} // namespace
