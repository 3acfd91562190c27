// glibc's full blocks: found in code (arch/x86_64/full_blocks.hpp) and opened to the
// agent's signals (core/full_blocks.cpp), so that a probe's int3 in the steps a thread
// runs with every signal blocked is not fatal.
#include <ukprobes/kprobes.h>

#include "arch/x86_64/full_blocks.hpp"
#include "core/core.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <csignal>
#include <cstring>
#include <dlfcn.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <vector>

namespace {

using ukp::arch::FullBlock;

constexpr uint64_t kBase = 0x400000;
constexpr uint64_t kAgentBits = (1ull << (SIGTRAP - 1)) | (1ull << (SIGSEGV - 1)) | (1ull << (SIGBUS - 1)) |
                                (1ull << (SIGFPE - 1)) | (1ull << (SIGILL - 1));

// Code at kBase and one 8-byte set in memory at kSet.
struct Code {
    std::vector<uint8_t> bytes;
    uint64_t set_at = 0;
    uint64_t set = ~0ull;

    void add(std::initializer_list<uint8_t> b) { bytes.insert(bytes.end(), b); }
    uint64_t pc() const { return kBase + bytes.size(); }
    // lea SET(%rip), %rsi
    void lea_set() {
        const uint64_t end = pc() + 7;
        const auto disp = static_cast<int32_t>(set_at - end);
        add({0x48, 0x8d, 0x35});
        uint8_t d[4];
        memcpy(d, &disp, 4);
        add({d[0], d[1], d[2], d[3]});
    }
    std::vector<FullBlock> find() const {
        ukp::arch::Reach reach;
        reach.code.push_back({kBase, pc()});
        const ukp::arch::ReadFn code = [this](uint64_t a, void *out, size_t n) {
            if (a < kBase || a + n > pc()) return false;
            memcpy(out, bytes.data() + (a - kBase), n);
            return true;
        };
        const ukp::arch::ReadFn data = [this](uint64_t a, void *out, size_t n) {
            if (a != set_at || n != sizeof set) return false;
            memcpy(out, &set, n);
            return true;
        };
        return ukp::arch::find_full_blocks(reach, kAgentBits, code, data);
    }
};

const std::initializer_list<uint8_t> kXorEdi = {0x31, 0xff};                       // xor %edi,%edi
const std::initializer_list<uint8_t> kSetmaskEdi = {0xbf, 0x02, 0x00, 0x00, 0x00}; // mov $2,%edi
const std::initializer_list<uint8_t> kUnblockEdi = {0xbf, 0x01, 0x00, 0x00, 0x00}; // mov $1,%edi
const std::initializer_list<uint8_t> kNrEax = {0xb8, 0x0e, 0x00, 0x00, 0x00};      // mov $0xe,%eax
const std::initializer_list<uint8_t> kSyscall = {0x0f, 0x05};
const std::initializer_list<uint8_t> kR10 = {0x41, 0xba, 0x08, 0x00, 0x00, 0x00}; // mov $8,%r10d

Code set_in_memory(std::initializer_list<uint8_t> how) {
    Code c;
    c.set_at = kBase + 0x100000;
    c.add(kR10);
    c.add(how);
    c.add(kNrEax);
    c.lea_set();
    c.add(kSyscall);
    return c;
}

// SIG_BLOCK, rt_sigprocmask, lea of the set, `between`, syscall.
Code lea_then(std::initializer_list<uint8_t> between) {
    Code c;
    c.set_at = kBase + 0x100000;
    c.add(kXorEdi);
    c.add(kNrEax);
    c.lea_set();
    c.add(between);
    c.add(kSyscall);
    return c;
}

TEST(FullBlocks, ASetInMemoryIsFoundAtItsLeasDisplacement) {
    for (auto how : {kXorEdi, kSetmaskEdi}) {
        const Code c = set_in_memory(how);
        const std::vector<FullBlock> found = c.find();
        ASSERT_EQ(found.size(), 1u);
        EXPECT_EQ(found[0].kind, FullBlock::Kind::kSetInMemory);
        EXPECT_EQ(found[0].set, c.set_at);
        EXPECT_EQ(found[0].patch_at, c.pc() - 2 - 4); // the disp32 ends the lea before the syscall
        EXPECT_EQ(found[0].syscall_at, c.pc() - 2);
    }
}

TEST(FullBlocks, AnImmediateStoredAsTheSetIsFoundAtItsImmediate) {
    Code c;
    c.add({0x48, 0xb8, 0xff, 0xff, 0xff, 0xff, 0xfe, 0xff, 0xff, 0xff}); // movabs $0xfffffffeffffffff,%rax
    c.add({0x48, 0x89, 0x83, 0xf0, 0x08, 0x00, 0x00});                   // mov %rax,0x8f0(%rbx)
    c.add({0x48, 0x8d, 0xb3, 0xf0, 0x08, 0x00, 0x00});                   // lea 0x8f0(%rbx),%rsi
    c.add(kXorEdi);
    c.add(kNrEax);
    c.add(kSyscall);
    const std::vector<FullBlock> found = c.find();
    ASSERT_EQ(found.size(), 1u);
    EXPECT_EQ(found[0].kind, FullBlock::Kind::kImmediate);
    EXPECT_EQ(found[0].patch_at, kBase + 2);
    EXPECT_EQ(found[0].set, 0xfffffffeffffffffull);
}

TEST(FullBlocks, WhatIsNoFullBlockIsLeftAlone) {
    // Unblocking every signal.
    EXPECT_TRUE(set_in_memory(kUnblockEdi).find().empty());
    // A set that lets one of the agent's signals through already, or many others.
    Code c = set_in_memory(kXorEdi);
    c.set = ~(1ull << (SIGTRAP - 1));
    EXPECT_TRUE(c.find().empty());
    c.set = 0xffffffull;
    EXPECT_TRUE(c.find().empty());
    // Another system call (rt_sigaction is 13).
    Code other;
    other.set_at = kBase + 0x100000;
    other.add(kXorEdi);
    other.add({0xb8, 0x0d, 0x00, 0x00, 0x00});
    other.lea_set();
    other.add(kSyscall);
    EXPECT_TRUE(other.find().empty());
    // rsi changed after the lea; the lea and the system call on either side of a branch.
    EXPECT_TRUE(lea_then({0x4c, 0x89, 0xf6}).find().empty()); // mov %r14,%rsi
    EXPECT_TRUE(lea_then({0xeb, 0x00}).find().empty());       // jmp .+2
    EXPECT_EQ(lea_then({0x90}).find().size(), 1u);            // nop: still one
}

TEST(FullBlocks, TheLeaIsLedAwayByItsHighByteAlone) {
    const Code c = set_in_memory(kXorEdi);
    const FullBlock block = c.find().at(0);
    const std::vector<ukp::arch::Retarget> targets = ukp::arch::one_byte_retargets(block);
    ASSERT_FALSE(targets.empty());
    int32_t old_disp = 0;
    memcpy(&old_disp, c.bytes.data() + (block.patch_at - kBase), 4);
    for (const ukp::arch::Retarget &t : targets) {
        int32_t disp = old_disp;
        auto *b = reinterpret_cast<uint8_t *>(&disp);
        b[3] = t.high_byte;
        ASSERT_EQ(block.patch_at + 4 + static_cast<uint64_t>(static_cast<int64_t>(disp)), t.target);
        ASSERT_NE(t.target, block.set);
        ASSERT_EQ((t.target - block.set) % (1ull << 24), 0u);
    }
    // Nearest first.
    EXPECT_EQ(targets.front().target - block.set == (1ull << 24) || block.set - targets.front().target == (1ull << 24),
              true);
}

// ---- in this process, on glibc ----

std::atomic<long> g_hits{0};
int count_pre(kprobe *, pt_regs *) {
    g_hits.fetch_add(1, std::memory_order_relaxed);
    return 0;
}

void *thread_body(void *arg) { return arg; }

std::atomic<int> g_raised{0};
void on_usr1(int) { g_raised.fetch_add(1, std::memory_order_relaxed); }

TEST(FullBlocks, ThreadsStartAndEndOverInt3sInTheStepsGlibcRunsWithEverySignalBlocked) {
    ASSERT_EQ(ukp_set_kprobes_optimization(0), 0);
    // What glibc 2.36 calls with every signal blocked: the new thread's __ctype_init,
    // the parent's clone3, the exiting thread's getpagesize and madvise, pthread_kill's
    // getpid. Each one killed this process with SIGTRAP on its int3 before.
    std::vector<kprobe> kps(5);
    const char *names[] = {"libc.so.6:__ctype_init", "libc.so.6:clone3", "libc.so.6:getpagesize", "libc.so.6:madvise",
                           "libc.so.6:getpid"};
    for (size_t i = 0; i < kps.size(); ++i) {
        kps[i].symbol_name = names[i];
        kps[i].pre_handler = count_pre;
        ASSERT_EQ(register_kprobe(&kps[i]), 0) << names[i];
        EXPECT_EQ(kps[i].flags & KPROBE_FLAG_OPTIMIZED, 0u) << names[i];
    }
    const std::vector<FullBlock> opened = ukp::core::opened_full_blocks();
    int in_memory = 0, immediate = 0;
    for (const FullBlock &b : opened) (b.kind == FullBlock::Kind::kImmediate ? immediate : in_memory)++;
    EXPECT_GE(in_memory, 2); // pthread_create's and pthread_kill's (and posix_spawn's)
    EXPECT_GE(immediate, 1); // a thread's exit
    struct sigaction sa {};
    sa.sa_handler = on_usr1;
    sigaction(SIGUSR1, &sa, nullptr);
    g_hits = 0;
    constexpr int kThreads = 200;
    for (int i = 0; i < kThreads; ++i) {
        pthread_t t;
        ASSERT_EQ(pthread_create(&t, nullptr, thread_body, nullptr), 0);
        ASSERT_EQ(pthread_join(t, nullptr), 0);
        raise(SIGUSR1); // pthread_kill's block, around getpid
    }
    EXPECT_EQ(g_raised.load(), kThreads);
    // __ctype_init and clone3 once per thread; getpid at least once per raise.
    EXPECT_GE(g_hits.load(), 3 * kThreads);
    for (kprobe &kp : kps) unregister_kprobe(&kp);
    ASSERT_EQ(ukp_set_kprobes_optimization(1), 0);
    // The changed bytes count as the file's.
    EXPECT_EQ(ukp_verify(nullptr), 0);
}

} // namespace
