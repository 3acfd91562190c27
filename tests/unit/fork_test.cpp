// fork() and vfork(): a child keeps its probes by default, or has them removed under
// UKP_FORK_REMOVE; a vfork child that execs changes nothing; the parent is unaffected.
#include <ukprobes/kprobes.h>

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <sys/wait.h>
#include <unistd.h>

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

} // namespace
