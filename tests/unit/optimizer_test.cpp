// Jump optimization: probes that qualify get a 5-byte jmp to a detour instead of their
// int3 (src/core/optimizer.cpp), and behave exactly as on the breakpoint path.
#include <ukprobes/kprobes.h>

#include "asm_functions.h"
#include "core/core.hpp"
#include "core/kretprobe.hpp"
#include "jumps.h"
#include "opt_functions_decl.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <iterator>
#include <map>
#include <poll.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/ptrace.h>
#include <sys/wait.h>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

extern "C" {
struct ukpt_sweep_fn {
    const char *name;
    void *fn;
    long (*drive)(long seed);
};
__attribute__((weak)) const ukpt_sweep_fn *ukpt_sweep_table_O0(size_t *n);
__attribute__((weak)) const ukpt_sweep_fn *ukpt_sweep_table_O2(size_t *n);
__attribute__((weak)) const ukpt_sweep_fn *ukpt_sweep_table_Os(size_t *n);
}

namespace {

std::atomic<long> g_hits{0};
int count_pre(kprobe *, pt_regs *) {
    g_hits.fetch_add(1, std::memory_order_relaxed);
    return 0;
}
void empty_post(kprobe *, pt_regs *, unsigned long) {}

uint8_t first_byte(const void *addr) { return *static_cast<const volatile uint8_t *>(addr); }
bool optimized(const kprobe &kp) { return (kp.flags & KPROBE_FLAG_OPTIMIZED) != 0; }

// Whether kp gets its jump within about `seconds`: a pass that could not place it (a
// thread that did not answer in time, one not seen at rest) is tried again 20 ms later.
bool optimized_within(const kprobe &kp, double seconds) {
    for (int i = 0; i < seconds * 100 && !optimized(kp); ++i) {
        usleep(10 * 1000);
        ukp_optimizer_flush();
    }
    return optimized(kp);
}

std::string list_text() {
    char *t = ukp_kprobes_list();
    std::string s = t != nullptr ? t : "";
    std::free(t);
    return s;
}

// Registers kp on `symbol` with `pre` and lets the optimizer put its jump in.
void put_optimized(kprobe &kp, kprobe_pre_handler_t pre, kprobe_fault_handler_t fault = nullptr,
                   const char *symbol = "ukpt_opt_work") {
    kp.symbol_name = symbol;
    kp.pre_handler = pre;
    kp.fault_handler = fault;
    ASSERT_EQ(register_kprobe(&kp), 0);
    ukp_optimizer_flush();
    ASSERT_TRUE(optimized(kp)) << list_text();
}

// Registers rp on `symbol` with `handler` (and an entry_handler, maxactive) and lets the
// optimizer put its jump in.
void put_optimized_rp(kretprobe &rp, const char *symbol, kretprobe_handler_t handler, int maxactive = 0,
                      kretprobe_handler_t entry = nullptr) {
    rp.kp.symbol_name = symbol;
    rp.handler = handler;
    rp.entry_handler = entry;
    rp.maxactive = maxactive;
    ASSERT_EQ(register_kretprobe(&rp), 0);
    ukp_optimizer_flush();
    ASSERT_TRUE(optimized(rp.kp)) << list_text();
}

class OptimizerTest : public ::testing::Test {
protected:
    void SetUp() override {
        ASSERT_EQ(ukp_set_kprobes_optimization(1), 0);
        g_hits = 0;
    }
};

TEST_F(OptimizerTest, APreHandlerProbeIsOptimizedAndStillHit) {
    kprobe kp{};
    kp.symbol_name = "ukpt_opt_work";
    kp.pre_handler = count_pre;
    ASSERT_EQ(register_kprobe(&kp), 0);
    ukp_optimizer_flush();
    EXPECT_TRUE(optimized(kp));
    EXPECT_EQ(first_byte(kp.addr), 0xe9);
    EXPECT_NE(list_text().find("[OPTIMIZED]"), std::string::npos) << list_text();
    for (long i = 0; i < 100; ++i) ASSERT_EQ(ukpt_opt_work(i), ((i + 1) * 3) ^ i);
    EXPECT_EQ(g_hits.load(), 100);
    // Every byte of the region is the probe's: verify finds nothing else changed.
    EXPECT_EQ(ukp_verify(nullptr), 0);
    unregister_kprobe(&kp);
    EXPECT_NE(first_byte(reinterpret_cast<void *>(&ukpt_opt_work)), 0xe9);
    EXPECT_EQ(ukp_verify(nullptr), 0);
    EXPECT_EQ(ukpt_opt_work(5), (6 * 3) ^ 5);
    EXPECT_EQ(g_hits.load(), 100);
}

// The worker reads /proc and object files in a descriptor table of its own: they never
// take, even for a moment, the lowest free number a program opening right then expects,
// and it holds none of the program's files open past their close.
int optimizer_tid() {
    DIR *d = opendir("/proc/self/task");
    if (d == nullptr) return -1;
    int found = -1;
    while (dirent *e = readdir(d)) {
        if (e->d_name[0] == '.') continue;
        char path[320], name[32] = {};
        snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
        if (FILE *f = fopen(path, "re")) {
            if (fgets(name, sizeof name, f) != nullptr && strcmp(name, "ukp-optimizer\n") == 0) found = atoi(e->d_name);
            fclose(f);
        }
    }
    closedir(d);
    return found;
}

TEST_F(OptimizerTest, TheWorkerKeepsADescriptorTableOfItsOwn) {
    int pipe_fds[2];
    ASSERT_EQ(pipe2(pipe_fds, O_CLOEXEC), 0);
    kprobe kp{};
    put_optimized(kp, count_pre); // the worker has run
    const int tid = optimizer_tid();
    ASSERT_GT(tid, 0) << "no thread named ukp-optimizer";
    const std::string dir = "/proc/self/task/" + std::to_string(tid) + "/fd";
    std::map<int, std::string> table;
    DIR *d = opendir(dir.c_str());
    ASSERT_NE(d, nullptr);
    while (dirent *e = readdir(d)) {
        if (e->d_name[0] == '.') continue;
        char target[4096];
        const ssize_t n = readlinkat(dirfd(d), e->d_name, target, sizeof target - 1);
        table[atoi(e->d_name)] = n > 0 ? std::string(target, static_cast<size_t>(n)) : "?";
    }
    closedir(d);
    std::string listing;
    for (const auto &[fd, what] : table) listing += std::to_string(fd) + " -> " + what + "\n";
    // 0-2 lead nowhere, and its own /proc/self/mem: not the program's pipe, nor its own
    // listing's directory (that is this thread's, in the process's table).
    ASSERT_EQ(table.size(), 4u) << listing;
    for (int fd = 0; fd < 3; ++fd) EXPECT_EQ(table[fd], "/") << listing;
    EXPECT_EQ(table[3], "/proc/" + std::to_string(getpid()) + "/mem") << listing;
    // The pipe's reader sees its end of file once the program closes the writing end.
    close(pipe_fds[1]);
    pollfd pfd{pipe_fds[0], POLLIN, 0};
    ASSERT_EQ(poll(&pfd, 1, 2000), 1) << "a copy of the writing end is still open";
    char c;
    EXPECT_EQ(read(pipe_fds[0], &c, 1), 0);
    close(pipe_fds[0]);
    unregister_kprobe(&kp);
}

TEST_F(OptimizerTest, TheKnobUnoptimizesAllAndBack) {
    kprobe kp{};
    kp.symbol_name = "ukpt_opt_work";
    kp.pre_handler = count_pre;
    ASSERT_EQ(register_kprobe(&kp), 0);
    ukp_optimizer_flush();
    ASSERT_TRUE(optimized(kp));
    ASSERT_EQ(ukp_set_kprobes_optimization(0), 0);
    EXPECT_EQ(ukp_kprobes_optimization(), 0);
    EXPECT_EQ(first_byte(kp.addr), 0xcc);
    EXPECT_FALSE(optimized(kp));
    EXPECT_EQ(list_text().find("[OPTIMIZED]"), std::string::npos);
    EXPECT_EQ(ukpt_opt_work(1), 6 ^ 1);
    EXPECT_EQ(g_hits.load(), 1);
    EXPECT_EQ(ukp_verify(nullptr), 0);
    ASSERT_EQ(ukp_set_kprobes_optimization(1), 0);
    ukp_optimizer_flush();
    EXPECT_EQ(first_byte(kp.addr), 0xe9);
    EXPECT_TRUE(optimized(kp));
    EXPECT_EQ(ukpt_opt_work(1), 6 ^ 1);
    EXPECT_EQ(g_hits.load(), 2);
    unregister_kprobe(&kp);
}

TEST_F(OptimizerTest, PostHandlersDisablingAndKprobesEnabledUnoptimize) {
    kprobe kp{}, post{};
    kp.symbol_name = post.symbol_name = "ukpt_opt_work";
    kp.pre_handler = count_pre;
    post.post_handler = empty_post;
    ASSERT_EQ(register_kprobe(&kp), 0);
    ukp_optimizer_flush();
    ASSERT_EQ(first_byte(kp.addr), 0xe9);
    // A post_handler keeps the breakpoint path.
    ASSERT_EQ(register_kprobe(&post), 0);
    EXPECT_EQ(first_byte(kp.addr), 0xcc);
    EXPECT_FALSE(optimized(kp));
    ukp_optimizer_flush();
    EXPECT_EQ(first_byte(kp.addr), 0xcc);
    EXPECT_EQ(ukpt_opt_work(2), 9 ^ 2);
    EXPECT_EQ(g_hits.load(), 1);
    unregister_kprobe(&post);
    ukp_optimizer_flush();
    EXPECT_EQ(first_byte(kp.addr), 0xe9);
    // Disabled: no int3, no jmp; enabled again: optimized again.
    ASSERT_EQ(disable_kprobe(&kp), 0);
    EXPECT_EQ(first_byte(kp.addr), 0x48); // lea's REX prefix
    EXPECT_EQ(ukp_verify(nullptr), 0);
    ASSERT_EQ(enable_kprobe(&kp), 0);
    ukp_optimizer_flush();
    EXPECT_EQ(first_byte(kp.addr), 0xe9);
    ASSERT_EQ(ukp_set_kprobes_enabled(0), 0);
    EXPECT_EQ(first_byte(kp.addr), 0x48);
    ASSERT_EQ(ukp_set_kprobes_enabled(1), 0);
    ukp_optimizer_flush();
    EXPECT_EQ(first_byte(kp.addr), 0xe9);
    EXPECT_EQ(ukpt_opt_work(2), 9 ^ 2);
    EXPECT_EQ(g_hits.load(), 2);
    unregister_kprobe(&kp);
}

// Two events on one function, one of them disabled (an entry and a return event of which
// only one is enabled): the point keeps its jump, as the kernel optimizes an aggregate
// probe whatever its disabled members, and the disabled probe's handlers are not run.
TEST_F(OptimizerTest, ADisabledProbeBesideAnEnabledOneKeepsTheJump) {
    static std::atomic<long> returns{0};
    kprobe kp{}, off{};
    kretprobe rp{};
    kp.symbol_name = off.symbol_name = rp.kp.symbol_name = "ukpt_opt_work";
    kp.pre_handler = off.pre_handler = count_pre;
    off.flags = KPROBE_FLAG_DISABLED;
    rp.handler = [](kretprobe_instance *, pt_regs *) {
        returns.fetch_add(1, std::memory_order_relaxed);
        return 0;
    };
    rp.kp.flags = KPROBE_FLAG_DISABLED;
    ASSERT_EQ(register_kprobe(&kp), 0);
    ASSERT_EQ(register_kprobe(&off), 0);
    ASSERT_EQ(register_kretprobe(&rp), 0);
    EXPECT_TRUE(optimized_within(kp, 2)) << list_text();
    EXPECT_EQ(first_byte(kp.addr), 0xe9);
    EXPECT_NE(list_text().find("[DISABLED][OPTIMIZED]"), std::string::npos) << list_text();
    EXPECT_EQ(ukpt_opt_work(2), 9 ^ 2);
    EXPECT_EQ(g_hits.load(), 1);
    EXPECT_EQ(returns.load(), 0);
    // Enabled, the return probe is run on the same jump.
    ASSERT_EQ(enable_kretprobe(&rp), 0);
    EXPECT_TRUE(optimized_within(kp, 2)) << list_text();
    EXPECT_EQ(ukpt_opt_work(2), 9 ^ 2);
    EXPECT_EQ(g_hits.load(), 2);
    EXPECT_EQ(returns.load(), 1);
    // The enabled one disabled, the other two enabled and disabled again: no probe
    // enabled is no int3 and no jump.
    ASSERT_EQ(disable_kretprobe(&rp), 0);
    ASSERT_EQ(disable_kprobe(&kp), 0);
    EXPECT_EQ(first_byte(kp.addr), 0x48); // lea's REX prefix
    EXPECT_EQ(ukpt_opt_work(2), 9 ^ 2);
    EXPECT_EQ(g_hits.load(), 2);
    ASSERT_EQ(enable_kprobe(&off), 0);
    EXPECT_TRUE(optimized_within(off, 2)) << list_text();
    EXPECT_EQ(ukpt_opt_work(2), 9 ^ 2);
    EXPECT_EQ(g_hits.load(), 3);
    EXPECT_EQ(ukp_verify(nullptr), 0);
    unregister_kretprobe(&rp);
    unregister_kprobe(&off);
    unregister_kprobe(&kp);
}

TEST_F(OptimizerTest, AProbeInsideTheRegionUnoptimizesIt) {
    kprobe kp{}, inner{};
    kp.symbol_name = inner.symbol_name = "ukpt_opt_inner";
    inner.offset = 4; // the imul, inside the 8-byte region (lea + imul)
    kp.pre_handler = inner.pre_handler = count_pre;
    ASSERT_EQ(register_kprobe(&kp), 0);
    ukp_optimizer_flush();
    ASSERT_EQ(first_byte(kp.addr), 0xe9);
    ASSERT_EQ(register_kprobe(&inner), 0);
    EXPECT_EQ(first_byte(kp.addr), 0xcc);
    EXPECT_EQ(first_byte(inner.addr), 0xcc);
    ukp_optimizer_flush();
    EXPECT_EQ(first_byte(kp.addr), 0xcc);
    EXPECT_EQ(ukpt_opt_inner(3), 12 ^ 3);
    EXPECT_EQ(g_hits.load(), 2); // both probes ran
    EXPECT_EQ(ukp_verify(nullptr), 0);
    // Optimized again once the inner probe is gone.
    unregister_kprobe(&inner);
    ukp_optimizer_flush();
    EXPECT_EQ(first_byte(kp.addr), 0xe9);
    EXPECT_EQ(ukpt_opt_inner(3), 12 ^ 3);
    EXPECT_EQ(g_hits.load(), 3);
    unregister_kprobe(&kp);
    EXPECT_EQ(ukp_verify(nullptr), 0);
}

long replacement(long x) { return -x; }

int redirect_pre(kprobe *, pt_regs *regs) {
    g_hits.fetch_add(1, std::memory_order_relaxed);
    regs->ip = reinterpret_cast<unsigned long>(&replacement);
    return 1;
}

TEST_F(OptimizerTest, APreHandlerChangingIpIsHonoured) {
    kprobe kp{};
    kp.symbol_name = "ukpt_opt_work";
    kp.pre_handler = redirect_pre;
    ASSERT_EQ(register_kprobe(&kp), 0);
    ukp_optimizer_flush();
    ASSERT_EQ(first_byte(kp.addr), 0xe9);
    EXPECT_EQ(ukpt_opt_work(7), -7);
    EXPECT_EQ(g_hits.load(), 1);
    unregister_kprobe(&kp);
    EXPECT_EQ(ukpt_opt_work(7), (8 * 3) ^ 7);
}

// Faults on purpose after changing a register. It calls nothing, so it is proven to leave
// the vector state alone, and the trampoline calls it itself, under a recovery point of
// its own frame (trampolines.S), rather than through the C dispatcher's.
long *volatile g_bad_pointer = reinterpret_cast<long *>(16);
std::atomic<int> g_opt_faults{0};
int g_opt_trapnr = -1;
int faulting_pre(kprobe *, pt_regs *regs) {
    g_hits.fetch_add(1, std::memory_order_relaxed);
    regs->di = 1000;
    return static_cast<int>(*static_cast<volatile long *>(g_bad_pointer));
}
int fault_rolls_back(kprobe *, pt_regs *, int trapnr) {
    ++g_opt_faults;
    g_opt_trapnr = trapnr;
    return 0;
}
int fault_keeps(kprobe *, pt_regs *, int) {
    ++g_opt_faults;
    return 1;
}

// As on the breakpoint path (faults_test): a miss is counted, the fault_handler asked, and
// the registers go back to the hit's unless it answers 1. The thread leaves the handler's
// read section (unregister_kprobe returns) and its depth (every hit runs the handler).
TEST_F(OptimizerTest, AFaultingPreHandlerIsRolledBackUnlessItsFaultHandlerKeepsTheChange) {
    const struct {
        kprobe_fault_handler_t fault_handler;
        bool kept;
    } cases[] = {{fault_rolls_back, false}, {nullptr, false}, {fault_keeps, true}};
    for (const auto &c : cases) {
        kprobe kp{};
        put_optimized(kp, faulting_pre, c.fault_handler);
        g_hits = 0;
        g_opt_faults = 0;
        g_opt_trapnr = -1;
        for (long i = 0; i < 3; ++i) {
            const long x = c.kept ? 1000 : 5 + i;
            ASSERT_EQ(ukpt_opt_work(5 + i), ((x + 1) * 3) ^ x) << "kept " << c.kept << ", hit " << i;
        }
        EXPECT_EQ(g_hits.load(), 3);
        EXPECT_EQ(kp.nmissed, 3u);
        EXPECT_EQ(g_opt_faults.load(), c.fault_handler != nullptr ? 3 : 0);
        if (c.fault_handler == fault_rolls_back) {
            EXPECT_EQ(g_opt_trapnr, 14) << "page fault";
        }
        unregister_kprobe(&kp);
        EXPECT_EQ(ukpt_opt_work(5), (6 * 3) ^ 5);
    }
}

// A fault_handler that skips the probed instruction when it faults (regs->ip past it, as
// the kernel's exception fixups do) sends the thread into the region the jump replaced:
// it goes on in the region's copy, here the copy's `ret`, not in the jump's bytes.
int skip_the_load(kprobe *, pt_regs *regs, int trapnr) {
    g_opt_trapnr = trapnr;
    regs->ax = 5;
    regs->ip += 3; // mov (%rdi), %rax
    return 1;
}

TEST_F(OptimizerTest, AFaultHandlerResumingInsideTheRegionGoesOnInItsCopy) {
    kprobe kp{};
    put_optimized(kp, count_pre, skip_the_load, "ukpt_load");
    g_hits = 0;
    g_opt_trapnr = -1;
    long *volatile bad = nullptr;
    EXPECT_EQ(ukpt_load(bad), 5);
    EXPECT_EQ(g_opt_trapnr, 14) << "page fault";
    EXPECT_EQ(g_hits.load(), 1);
    long good = 42;
    EXPECT_EQ(ukpt_load(&good), 42);
    unregister_kprobe(&kp);
}

// A pre_handler that does the probed instruction's work itself and skips it (the
// fault-injection habit of returning a value without the load) resumes inside the region
// too: past the first instruction, in the jump's bytes. Both ways through the trampoline:
// its fast case (one probe) and the C dispatcher (two probes on the point).
int do_the_load(kprobe *p, pt_regs *regs) {
    g_hits.fetch_add(1, std::memory_order_relaxed);
    regs->ax = regs->di == 0 ? 7 : *reinterpret_cast<const long *>(regs->di);
    regs->ip = reinterpret_cast<unsigned long>(p->addr) + 3; // past mov (%rdi), %rax
    return 1;
}

TEST_F(OptimizerTest, APreHandlerSkippingTheProbedInstructionGoesOnInTheCopy) {
    for (const bool two : {false, true}) {
        kprobe kp{};
        kprobe second{};
        put_optimized(kp, do_the_load, nullptr, "ukpt_load");
        if (two) {
            put_optimized(second, count_pre, nullptr, "ukpt_load");
            ASSERT_TRUE(optimized(kp));
        }
        g_hits = 0;
        long *volatile none = nullptr;
        EXPECT_EQ(ukpt_load(none), 7) << "two probes: " << two;
        long good = 42;
        EXPECT_EQ(ukpt_load(&good), 42) << "two probes: " << two;
        // The second probe's handler does not run: the first one's answer ends the chain.
        EXPECT_EQ(g_hits.load(), 2) << "two probes: " << two;
        if (two) unregister_kprobe(&second);
        unregister_kprobe(&kp);
    }
}

// A hit while the thread runs a handler runs no handler and counts a miss (kprobes.rst), and
// a hit in the agent's own work neither: the trampoline's fast case leaves both to the
// dispatcher. The handler calls the probed function directly, so it is still proven.
long g_inner = 0;
int recursing_pre(kprobe *, pt_regs *) {
    g_hits.fetch_add(1, std::memory_order_relaxed);
    g_inner = ukpt_opt_work(1);
    return 0;
}

TEST_F(OptimizerTest, HitsInsideAHandlerOrTheAgentsWorkRunNoHandler) {
    kprobe kp{};
    put_optimized(kp, recursing_pre);
    for (long i = 0; i < 3; ++i) ASSERT_EQ(ukpt_opt_work(i), ((i + 1) * 3) ^ i);
    EXPECT_EQ(g_hits.load(), 3);
    EXPECT_EQ(kp.nmissed, 3u);
    EXPECT_EQ(g_inner, (2 * 3) ^ 1);
    {
        const ukp::core::AgentWork quiet;
        EXPECT_EQ(ukpt_opt_work(4), (5 * 3) ^ 4);
    }
    EXPECT_EQ(g_hits.load(), 3);
    EXPECT_EQ(kp.nmissed, 3u);
    unregister_kprobe(&kp);
}

// A pre_handler that makes the thread call ukpt_opt_bump (which only counts) before the
// probed function: it pushes the probe address as the return address and resumes at
// ukpt_opt_bump, whose `ret` comes back to the probe, hit a second time, which lets the
// function run. The stack pointer the thread resumes with is 8 below the one it had.
extern "C" {
long g_opt_bumps = 0;
void ukpt_opt_bump();
}
asm(R"(
        .text
        .p2align 4
        .type   ukpt_opt_bump, @function
ukpt_opt_bump:
        lock incq g_opt_bumps(%rip)
        ret
        .size   ukpt_opt_bump, .-ukpt_opt_bump
)");

thread_local bool t_bumped = false;
int push_call_pre(kprobe *p, pt_regs *regs) {
    g_hits.fetch_add(1, std::memory_order_relaxed);
    if (t_bumped) { // back from ukpt_opt_bump: run the function
        t_bumped = false;
        return 0;
    }
    t_bumped = true;
    regs->sp -= 8;
    *reinterpret_cast<unsigned long *>(regs->sp) = reinterpret_cast<unsigned long>(p->addr);
    regs->ip = reinterpret_cast<unsigned long>(&ukpt_opt_bump);
    return 1;
}

// Puts `pre` on ukpt_opt_work, which must come out optimized, and calls the function 20
// times on the jump path, then 20 on the breakpoint path: each call returns its result,
// goes through ukpt_opt_bump once and runs the handler `hits_per_call` times.
void expect_each_call_bumped(kprobe_pre_handler_t pre, long hits_per_call) {
    kprobe kp{};
    put_optimized(kp, pre);
    g_opt_bumps = 0;
    for (long i = 0; i < 20; ++i) ASSERT_EQ(ukpt_opt_work(i), ((i + 1) * 3) ^ i);
    EXPECT_EQ(g_opt_bumps, 20);
    EXPECT_EQ(g_hits.load(), 20 * hits_per_call);
    ASSERT_EQ(ukp_set_kprobes_optimization(0), 0);
    ASSERT_EQ(first_byte(kp.addr), 0xcc);
    for (long i = 0; i < 20; ++i) ASSERT_EQ(ukpt_opt_work(i), ((i + 1) * 3) ^ i);
    EXPECT_EQ(g_opt_bumps, 40);
    EXPECT_EQ(g_hits.load(), 40 * hits_per_call);
    ASSERT_EQ(ukp_set_kprobes_optimization(1), 0);
    unregister_kprobe(&kp);
}

// A handler that lowers the stack pointer (here to push a return address; the dispatcher
// itself does it when it emulates a probed `call` for a post_handler that came while the
// jump was in place): the trampoline must not put the word it resumes through into its
// own frame, where the new stack pointer's red zone now begins. The breakpoint path does
// the same.
TEST_F(OptimizerTest, APreHandlerPushingOntoTheStackIsHonoured) { expect_each_call_bumped(push_call_pre, 2); }

// A pre_handler that returns 0 after lowering the stack pointer: the region runs with
// the stack as the handler left it. Here it pushes ukpt_opt_bump as a return address, so
// the function returns into it, and its `ret` goes on to the caller.
int push_bounce_pre(kprobe *, pt_regs *regs) {
    g_hits.fetch_add(1, std::memory_order_relaxed);
    regs->sp -= 8;
    *reinterpret_cast<unsigned long *>(regs->sp) = reinterpret_cast<unsigned long>(&ukpt_opt_bump);
    return 0;
}

TEST_F(OptimizerTest, APreHandlerLoweringTheStackWithoutRedirectingIsHonoured) {
    expect_each_call_bumped(push_bounce_pre, 1);
}

// The same from a post_handler, which runs from the post trampoline after the probed
// instruction's copy: it calls ukpt_opt_bump before the function goes on.
void push_call_post(kprobe *, pt_regs *regs, unsigned long) {
    g_hits.fetch_add(1, std::memory_order_relaxed);
    regs->sp -= 8;
    *reinterpret_cast<unsigned long *>(regs->sp) = regs->ip;
    regs->ip = reinterpret_cast<unsigned long>(&ukpt_opt_bump);
}

TEST_F(OptimizerTest, APostHandlerPushingOntoTheStackIsHonoured) {
    kprobe kp{};
    kp.symbol_name = "ukpt_opt_work";
    kp.post_handler = push_call_post;
    ASSERT_EQ(register_kprobe(&kp), 0);
    g_opt_bumps = 0;
    for (long i = 0; i < 20; ++i) ASSERT_EQ(ukpt_opt_work(i), ((i + 1) * 3) ^ i);
    EXPECT_EQ(g_opt_bumps, 20);
    EXPECT_EQ(g_hits.load(), 20);
    unregister_kprobe(&kp);
}

// And from a kretprobe's return handler, which runs from the return trampoline: the
// function's caller gets its result after ukpt_opt_bump ran.
int push_call_ret(kretprobe_instance *, pt_regs *regs) {
    g_hits.fetch_add(1, std::memory_order_relaxed);
    regs->sp -= 8;
    *reinterpret_cast<unsigned long *>(regs->sp) = regs->ip;
    regs->ip = reinterpret_cast<unsigned long>(&ukpt_opt_bump);
    return 0;
}

TEST_F(OptimizerTest, AReturnHandlerPushingOntoTheStackIsHonoured) {
    kretprobe rp{};
    rp.kp.symbol_name = "ukpt_opt_work";
    rp.handler = push_call_ret;
    ASSERT_EQ(register_kretprobe(&rp), 0);
    g_opt_bumps = 0;
    for (long i = 0; i < 20; ++i) ASSERT_EQ(ukpt_opt_work(i), ((i + 1) * 3) ^ i);
    EXPECT_EQ(g_opt_bumps, 20);
    EXPECT_EQ(g_hits.load(), 20);
    unregister_kretprobe(&rp);
}

// The case stress_test found: threads run an optimized probe on a `call` while a probe
// with a post_handler comes and goes at the same address. A thread that enters the detour
// after the post_handler's probe was published, before the int3 is back, has its call
// emulated by the dispatcher (the return address pushed, the stack pointer 8 lower).
TEST_F(OptimizerTest, APostHandlerArrivingAtAnOptimizedCall) {
    kprobe kp{};
    kp.addr = reinterpret_cast<kprobe_opcode_t *>(ukpt_branches_at_call);
    kp.pre_handler = count_pre;
    ASSERT_EQ(register_kprobe(&kp), 0);
    ukp_optimizer_flush();
    ASSERT_TRUE(optimized(kp)) << list_text();
    std::atomic<bool> stop{false};
    std::atomic<long> calls{0}, wrong{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
        threads.emplace_back([&, t] {
            long n = 0;
            for (long i = t; !stop.load(std::memory_order_relaxed); ++i, ++n)
                if (ukpt_branches(i & 0xffff) != 2 * (i & 0xffff) + 1) wrong.fetch_add(1);
            calls.fetch_add(n);
        });
    }
    int optimized_rounds = 0;
    for (int round = 0; round < 100; ++round) {
        kprobe post{};
        post.addr = kp.addr;
        post.post_handler = empty_post;
        ASSERT_EQ(register_kprobe(&post), 0);
        unregister_kprobe(&post);
        ukp_optimizer_flush();
        if (first_byte(kp.addr) == 0xe9) ++optimized_rounds;
    }
    stop = true;
    for (auto &th : threads) th.join();
    EXPECT_EQ(wrong.load(), 0);
    EXPECT_EQ(g_hits.load(), calls.load());
    EXPECT_GT(optimized_rounds, 50);
    unregister_kprobe(&kp);
}

int stack_hungry_pre(kprobe *, pt_regs *regs) {
    // Writes a lot of stack, as a handler may: the red zone below regs->sp must survive.
    volatile char scratch[4096];
    for (size_t i = 0; i < sizeof scratch; ++i) scratch[i] = static_cast<char>(i);
    g_hits.fetch_add(1 + scratch[100] - 100, std::memory_order_relaxed);
    regs->r11 = 0; // a scratch register the function does not read
    return 0;
}

TEST_F(OptimizerTest, ALeafKeepsItsRedZone) {
    kprobe kp{};
    kp.symbol_name = "ukpt_opt_red_zone";
    kp.offset = 14;
    kp.pre_handler = stack_hungry_pre;
    ASSERT_EQ(register_kprobe(&kp), 0);
    ukp_optimizer_flush();
    ASSERT_TRUE(optimized(kp)) << list_text();
    for (long x : {0l, 1l, 12345l, -9l}) EXPECT_EQ(ukpt_opt_red_zone(x), 2 * x + 0x5a5a5a5a);
    EXPECT_EQ(g_hits.load(), 4);
    unregister_kprobe(&kp);
}

int vector_hungry_pre(kprobe *, pt_regs *) {
    // glibc's memset and memcpy use the widest vector registers; the double math, xmm.
    static char a[4096], b[4096];
    std::memset(a, g_hits.load() & 0x7f, sizeof a);
    std::memcpy(b, a, sizeof b);
    volatile double d = 1.5;
    g_hits.fetch_add(static_cast<long>(d * 2.0 / 3.0) + (b[100] - a[100]), std::memory_order_relaxed);
    return 0;
}

// The vector registers a function holds across the probed region come back intact.
TEST_F(OptimizerTest, VectorRegistersSurviveTheHandlers) {
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx")) GTEST_SKIP() << "no AVX";
    kprobe kp{};
    kp.symbol_name = "ukpt_opt_vec_probe";
    kp.pre_handler = vector_hungry_pre;
    ASSERT_EQ(register_kprobe(&kp), 0);
    ukp_optimizer_flush();
    ASSERT_TRUE(optimized(kp));
    alignas(32) unsigned char in[512], out[512];
    for (size_t i = 0; i < sizeof in; ++i) in[i] = static_cast<unsigned char>(i * 7 + 3);
    for (int round = 0; round < 3; ++round) {
        std::memset(out, 0, sizeof out);
        ukpt_opt_vectors(in, out);
        EXPECT_EQ(std::memcmp(in, out, sizeof in), 0) << "round " << round;
    }
    EXPECT_EQ(g_hits.load(), 3);
    unregister_kprobe(&kp);
}

unsigned long g_seen_flags = 0;    // regs->flags at the last hit
unsigned long g_handler_flags = 0; // the flags the handler itself ran with
int flag_changing_pre(kprobe *, pt_regs *regs) {
    g_hits.fetch_add(1, std::memory_order_relaxed);
    g_seen_flags = regs->flags;
    g_handler_flags = __builtin_ia32_readeflags_u64();
    // Compares in C code change the real flags; regs->flags is what the program gets.
    return regs->ax == 12345 ? 1 : 0;
}

// The arithmetic flags (OF included) and the rest come back as they were.
TEST_F(OptimizerTest, FlagsSurviveTheHandlers) {
    const long cases[][2] = {{1, 2}, {2, 1}, {5, 5}, {INT64_MIN, 1}, {INT64_MAX, -1}, {0, 0}, {-1, 1}};
    std::vector<long> expected;
    for (const auto &c : cases) expected.push_back(ukpt_opt_flags(c[0], c[1]));
    kprobe kp{};
    kp.symbol_name = "ukpt_opt_flags_probe";
    kp.pre_handler = flag_changing_pre;
    ASSERT_EQ(register_kprobe(&kp), 0);
    ukp_optimizer_flush();
    ASSERT_TRUE(optimized(kp));
    for (size_t i = 0; i < std::size(cases); ++i) {
        EXPECT_EQ(ukpt_opt_flags(cases[i][0], cases[i][1]), expected[i]) << i;
        EXPECT_EQ(g_seen_flags, static_cast<unsigned long>(expected[i]))
            << "regs->flags is the flags at the hit, " << i;
    }
    EXPECT_EQ(g_hits.load(), static_cast<long>(std::size(cases)));
    unregister_kprobe(&kp);
}

// The direction flag set at the hit: the handler sees it in regs->flags, runs with it
// clear (the C code it is), and the program goes on with it set.
TEST_F(OptimizerTest, TheDirectionFlagIsSeenAndKept) {
    constexpr unsigned long kDf = 0x400;
    const long before = ukpt_opt_flags_down(1, 2);
    ASSERT_NE(before & kDf, 0);
    kprobe kp{};
    put_optimized(kp, flag_changing_pre, nullptr, "ukpt_opt_flags_probe");
    EXPECT_EQ(ukpt_opt_flags_down(1, 2), before);
    EXPECT_EQ(g_seen_flags, static_cast<unsigned long>(before));
    EXPECT_EQ(g_handler_flags & kDf, 0u);
    EXPECT_EQ(ukpt_opt_flags(2, 1) & kDf, 0) << "and clear where it was clear";
    EXPECT_EQ(g_seen_flags & kDf, 0u);
    unregister_kprobe(&kp);
}

std::atomic<long> g_ret_sum{0};
int ret_handler(kretprobe_instance *, pt_regs *regs) {
    g_ret_sum.fetch_add(static_cast<long>(regs_return_value(regs)), std::memory_order_relaxed);
    return 0;
}

TEST_F(OptimizerTest, AKretprobeOnAnOptimizedEntryTakesNoTrap) {
    kretprobe rp{};
    rp.kp.symbol_name = "ukpt_opt_work";
    rp.handler = ret_handler;
    ASSERT_EQ(register_kretprobe(&rp), 0);
    ukp_optimizer_flush();
    EXPECT_EQ(first_byte(rp.kp.addr), 0xe9);
    EXPECT_TRUE(optimized(rp.kp));
    g_ret_sum = 0;
    long expect = 0;
    for (long i = 0; i < 50; ++i) {
        expect += ((i + 1) * 3) ^ i;
        ASSERT_EQ(ukpt_opt_work(i), ((i + 1) * 3) ^ i);
    }
    EXPECT_EQ(g_ret_sum.load(), expect);
    EXPECT_EQ(rp.nmissed, 0);
    unregister_kretprobe(&rp);
}

int entry_nothing(kretprobe_instance *, pt_regs *) { return 0; }

// Returns whose instance's stub called the function (RetInstance::called): the jump
// path's way, whose return the CPU predicts, rather than a replaced return address.
std::atomic<int> g_called_returns{0};
int ret_handler_noting_call(kretprobe_instance *ri, pt_regs *regs) {
    const auto *inst = reinterpret_cast<const ukp::core::RetInstance *>(reinterpret_cast<const char *>(ri) -
                                                                        offsetof(ukp::core::RetInstance, pub));
    if (inst->called) g_called_returns.fetch_add(1, std::memory_order_relaxed);
    return ret_handler(ri, regs);
}

// A kretprobe leads the jmp of a function's entry to the kretprobe detour, alone (its
// trampoline then does the entry in a few instructions) or beside other probes or with an
// entry_handler (the usual trampoline's work, after which the stub calls the function);
// without a kretprobe the jmp leads to the usual detour. The jmp follows the probes as
// they come and go, and every return is the stub's call's.
TEST_F(OptimizerTest, AKretprobeLeadsTheJumpToTheKretprobeDetour) {
    const auto usual = reinterpret_cast<uint64_t>(&ukp_optprobe_trampoline);
    const auto kret = reinterpret_cast<uint64_t>(&ukp_kret_entry_trampoline);
    const void *fn = reinterpret_cast<const void *>(&ukpt_opt_work);
    kprobe kp{};
    put_optimized(kp, count_pre);
    EXPECT_EQ(jumped_trampoline(fn), usual) << "a kprobe alone";
    kretprobe rp{};
    ASSERT_NO_FATAL_FAILURE(put_optimized_rp(rp, "ukpt_opt_work", ret_handler_noting_call));
    EXPECT_EQ(jumped_trampoline(fn), kret) << "a kprobe beside it";
    g_ret_sum = 0;
    g_called_returns = 0;
    EXPECT_EQ(ukpt_opt_work(4), 11); // ((4 + 1) * 3) ^ 4
    EXPECT_EQ(g_hits.load(), 1);
    EXPECT_EQ(g_ret_sum.load(), 11);
    EXPECT_EQ(g_called_returns.load(), 1) << "beside a kprobe, the stub called the function";
    unregister_kprobe(&kp);
    ukp_optimizer_flush();
    EXPECT_EQ(jumped_trampoline(fn), kret) << "alone now";
    EXPECT_TRUE(optimized(rp.kp));
    long expect = 11;
    for (long i = 0; i < 20; ++i) {
        expect += ((i + 1) * 3) ^ i;
        ASSERT_EQ(ukpt_opt_work(i), ((i + 1) * 3) ^ i);
    }
    EXPECT_EQ(g_ret_sum.load(), expect);
    EXPECT_EQ(g_called_returns.load(), 21);
    kprobe again{};
    put_optimized(again, count_pre);
    EXPECT_EQ(jumped_trampoline(fn), kret) << "a kprobe came back";
    unregister_kretprobe(&rp);
    ukp_optimizer_flush();
    EXPECT_EQ(jumped_trampoline(fn), usual) << "the kprobe alone again";
    unregister_kprobe(&again);

    kretprobe with_entry{};
    ASSERT_NO_FATAL_FAILURE(put_optimized_rp(with_entry, "ukpt_opt_work", ret_handler_noting_call, 0, entry_nothing));
    EXPECT_EQ(jumped_trampoline(fn), kret) << "with an entry_handler";
    g_called_returns = 0;
    EXPECT_EQ(ukpt_opt_work(4), 11);
    EXPECT_EQ(g_called_returns.load(), 1);
    unregister_kretprobe(&with_entry);
}

std::vector<int> g_return_order;
int first_returns(kretprobe_instance *ri, pt_regs *regs) {
    g_return_order.push_back(1);
    return ret_handler_noting_call(ri, regs);
}
int second_returns(kretprobe_instance *ri, pt_regs *regs) {
    g_return_order.push_back(2);
    return ret_handler_noting_call(ri, regs);
}

// Two kretprobes and a kprobe on one optimized entry: the returns come in the order they
// come on the breakpoint path, where each kretprobe replaces the return address in turn
// (the last one's first); the last one's stub calls the function, the first's replaces
// the return address the stub then returns to.
TEST_F(OptimizerTest, TwoKretprobesAndAKprobeOnAnOptimizedEntryReturnInOrder) {
    kretprobe first{}, second{};
    ASSERT_NO_FATAL_FAILURE(put_optimized_rp(first, "ukpt_opt_work", first_returns));
    ASSERT_NO_FATAL_FAILURE(put_optimized_rp(second, "ukpt_opt_work", second_returns));
    kprobe kp{};
    put_optimized(kp, count_pre);
    g_return_order.clear();
    g_ret_sum = 0;
    g_called_returns = 0;
    for (long i = 0; i < 3; ++i) ASSERT_EQ(ukpt_opt_work(i), ((i + 1) * 3) ^ i);
    EXPECT_EQ(g_return_order, (std::vector<int>{2, 1, 2, 1, 2, 1}));
    EXPECT_EQ(g_ret_sum.load(), 2 * (3 + 7 + 11));
    EXPECT_EQ(g_called_returns.load(), 3) << "one of each call's two";
    EXPECT_EQ(g_hits.load(), 3);
    EXPECT_EQ(first.ukp_unwound + second.ukp_unwound, 0u);
    EXPECT_EQ(first.nmissed + second.nmissed, 0);
    unregister_kprobe(&kp);
    unregister_kretprobe(&second);
    unregister_kretprobe(&first);
}

extern "C" __attribute__((noinline)) long ukpt_instead_of_work(long x) {
    asm volatile("" ::: "memory");
    return x + 1000;
}
int send_elsewhere(kprobe *, pt_regs *regs) {
    g_hits.fetch_add(1, std::memory_order_relaxed);
    regs->ip = reinterpret_cast<uint64_t>(&ukpt_instead_of_work);
    return 1;
}

// A kprobe after a kretprobe on an optimized entry sends the thread into another function
// ("Changing Execution Path"): the kretprobe's return is then that function's, by the
// replaced return address, with its value.
TEST_F(OptimizerTest, AKprobeSendingTheThreadElsewhereBesideAKretprobe) {
    kretprobe rp{};
    ASSERT_NO_FATAL_FAILURE(put_optimized_rp(rp, "ukpt_opt_work", ret_handler_noting_call));
    kprobe kp{};
    put_optimized(kp, send_elsewhere);
    g_ret_sum = 0;
    g_called_returns = 0;
    EXPECT_EQ(ukpt_opt_work(4), 1004);
    EXPECT_EQ(g_hits.load(), 1);
    EXPECT_EQ(g_ret_sum.load(), 1004);
    EXPECT_EQ(g_called_returns.load(), 0) << "the return address replaced";
    EXPECT_EQ(rp.ukp_unwound, 0u);
    unregister_kprobe(&kp);
    EXPECT_EQ(ukpt_opt_work(4), 11);
    EXPECT_EQ(g_ret_sum.load(), 1015);
    unregister_kretprobe(&rp);
}

// A function that jumps back to its own first instruction may keep data below its stack
// pointer there (the red zone): a kretprobe alone on it keeps the usual detour, which
// steps over the red zone, and the function's result is right.
TEST_F(OptimizerTest, AFunctionJumpingBackToItsEntryKeepsItsRedZone) {
    kretprobe rp{};
    ASSERT_NO_FATAL_FAILURE(put_optimized_rp(rp, "ukpt_opt_reentry", ret_handler, 64));
    EXPECT_EQ(jumped_trampoline(reinterpret_cast<const void *>(&ukpt_opt_reentry)),
              reinterpret_cast<uint64_t>(&ukp_optprobe_trampoline));
    std::thread([] {
        for (int i = 0; i < 3; ++i) EXPECT_EQ(ukpt_opt_reentry(5, 0), 15) << i;
    }).join();
    unregister_kretprobe(&rp);
}

// What the return handler of RegistersAndFlagsSurviveAKretprobe saw last.
struct SeenInstance {
    long ax;
    int task;
    uint64_t ret_addr, fp;
} g_seen_ri;
int record_instance(kretprobe_instance *ri, pt_regs *regs) {
    g_seen_ri = {static_cast<long>(regs_return_value(regs)), ri->task, reinterpret_cast<uint64_t>(ri->ret_addr),
                 reinterpret_cast<uint64_t>(ri->fp)};
    ri->task = -1; // the next call that takes this instance must fill it in again
    return 0;
}

// Every general register and the flags (DF included) reach the probed function, and come
// back from it, as they were without the probe: through a kretprobe's own entry, on the
// thread's first hit (which the trampoline leaves to the usual one) and later ones, and
// where the return address and the detour's push below the red zone lie on different
// pages (left to the usual trampoline too).
TEST_F(OptimizerTest, RegistersAndFlagsSurviveAKretprobe) {
    kretprobe rp{};
    ASSERT_NO_FATAL_FAILURE(put_optimized_rp(rp, "ukpt_opt_regs_probe", record_instance));
    ASSERT_EQ(jumped_trampoline(reinterpret_cast<const void *>(&ukpt_opt_regs_probe)),
              reinterpret_cast<uint64_t>(&ukp_kret_entry_trampoline));
    // The stacks: the probed function's sp 8 bytes into a page (the push 128 + 8 below it,
    // on the page before), and in the middle of one.
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    auto *stack = static_cast<char *>(std::aligned_alloc(page, 4 * page));
    ASSERT_NE(stack, nullptr);
    // ukpt_opt_regs pushes 6 registers and calls: its callee's sp is 64 below the one given.
    char *const tops[] = {nullptr, stack + 2 * page + 8 + 64, stack + 2 * page + page / 2 + 64};
    // The arithmetic flags in turn, all of them, and DF; IF and bit 1 as user mode has them.
    const long flag_sets[] = {0x202, 0x203, 0x206, 0x212, 0x242, 0x282, 0xa02, 0xad7, 0x602, 0xed7};
    long calls = 0;
    std::thread([&] {
        for (int round = 0; round < 3; ++round) {
            for (char *top : tops) {
                for (long flags : flag_sets) {
                    long in[16];
                    for (int r = 0; r < 15; ++r) in[r] = static_cast<long>(0x0101010101010101ull * (r + 1)) ^ flags;
                    in[15] = flags;
                    std::memset(ukpt_regs_seen, 0, sizeof ukpt_regs_seen);
                    std::memset(ukpt_regs_after, 0, sizeof ukpt_regs_after);
                    g_seen_ri = {};
                    if (top == nullptr)
                        ukpt_opt_regs(in);
                    else
                        ukpt_on_stack(ukpt_opt_regs, in, top);
                    ++calls;
                    constexpr long kMask = 0xed7; // OF DF SF ZF AF PF CF
                    for (int r = 0; r < 15; ++r) {
                        EXPECT_EQ(ukpt_regs_seen[r], in[r]) << "entry, register " << r << ", flags " << flags;
                        EXPECT_EQ(ukpt_regs_after[r], in[r]) << "return, register " << r << ", flags " << flags;
                    }
                    EXPECT_EQ(ukpt_regs_seen[15] & kMask, flags & kMask) << "entry";
                    EXPECT_EQ(ukpt_regs_after[15] & kMask, flags & kMask) << "return";
                    // The instance, as the entry filled it in.
                    EXPECT_EQ(g_seen_ri.ax, in[0]) << "the handler saw rax";
                    EXPECT_EQ(g_seen_ri.task, gettid());
                    EXPECT_EQ(g_seen_ri.ret_addr, reinterpret_cast<uint64_t>(ukpt_opt_regs_return));
                    if (top != nullptr) {
                        EXPECT_EQ(g_seen_ri.fp, reinterpret_cast<uint64_t>(top - 64));
                    }
                }
            }
        }
    }).join();
    std::free(stack);
    EXPECT_EQ(rp.nmissed, 0);
    EXPECT_EQ(rp.kp.nmissed, 0ul);
    EXPECT_EQ(calls, 3 * 3 * static_cast<long>(std::size(flag_sets)));
    unregister_kretprobe(&rp);
}

// The stack a hit takes of the program's: the trampolines' frames, the vector state saved
// around the handlers and the handlers' own frames. A thread's stack may be small (a
// coroutine's, a signal's alternate stack); on a CPU with AMX, saving every component the
// OS enabled took 11 KB at each hit, where the tiles are nothing C code touches.
TEST_F(OptimizerTest, AHitTakesLittleOfTheProgramsStack) {
    kretprobe rp{};
    ASSERT_NO_FATAL_FAILURE(put_optimized_rp(rp, "ukpt_opt_regs_probe", record_instance));
    constexpr size_t kStack = 64 * 1024;
    constexpr unsigned char kUntouched = 0xa5;
    auto *stack = static_cast<unsigned char *>(std::aligned_alloc(64, kStack));
    ASSERT_NE(stack, nullptr);
    std::memset(stack, kUntouched, kStack);
    unsigned char *const top = stack + kStack - 1024;
    std::thread([&] {
        for (int i = 0; i < 3; ++i) { // the thread's first hit takes the usual path, the others the jump's
            long in[16] = {};
            in[15] = 0x202;
            ukpt_on_stack(ukpt_opt_regs, in, top);
            EXPECT_EQ(g_seen_ri.ret_addr, reinterpret_cast<uint64_t>(ukpt_opt_regs_return));
        }
    }).join();
    size_t low = 0;
    while (low < kStack && stack[low] == kUntouched) ++low;
    const size_t used = static_cast<size_t>(top - (stack + low));
    std::free(stack);
    unregister_kretprobe(&rp);
    EXPECT_EQ(rp.nmissed, 0);
    // ukpt_on_stack's call and ukpt_opt_regs' pushes take 64 bytes; the rest is the hit's:
    // 4 KB with AVX-512's state, 8 KB with the sanitizers' frames (12 and 16 when AMX's
    // tiles were saved too).
#if defined(__SANITIZE_ADDRESS__)
    constexpr size_t kMost = 10 * 1024;
#else
    constexpr size_t kMost = 6 * 1024;
#endif
    EXPECT_LT(used, kMost) << used << " bytes of the program's stack below the call";
}

// A thread blocked in read(2) inside the region (its instruction pointer just after the
// syscall, 4 bytes into the 5 the jump replaces) is moved into the relocated copy: when
// it wakes up it goes on correctly, where it would otherwise run the jmp's displacement.
TEST_F(OptimizerTest, AThreadInsideTheRegionIsMovedOut) {
    int fds[2];
    ASSERT_EQ(pipe(fds), 0);
    char got = 0;
    std::atomic<long> result{-100};
    std::thread reader([&] { result = ukpt_opt_read(fds[0], &got, 1); });
    usleep(100 * 1000); // blocked in the read by now
    kprobe kp{};
    kp.symbol_name = "ukpt_opt_read";
    kp.pre_handler = count_pre;
    ASSERT_EQ(register_kprobe(&kp), 0);
    ukp_optimizer_flush();
    EXPECT_EQ(first_byte(kp.addr), 0xe9);
    EXPECT_EQ(result.load(), -100); // still blocked: the signal restarted its read
    ASSERT_EQ(write(fds[1], "x", 1), 1);
    reader.join();
    EXPECT_EQ(result.load(), 1);
    EXPECT_EQ(got, 'x');
    // And through the jump.
    ASSERT_EQ(write(fds[1], "y", 1), 1);
    EXPECT_EQ(ukpt_opt_read(fds[0], &got, 1), 1);
    EXPECT_EQ(got, 'y');
    EXPECT_EQ(g_hits.load(), 1);
    unregister_kprobe(&kp);
    close(fds[0]);
    close(fds[1]);
}

// 8 threads call the probed function in a loop while the probe goes from int3 to jmp and
// back thousands of times: every call gives the right result and is counted once.
// `n` threads calling ukpt_opt_work and checking its results until stop().
struct WorkLoop {
    std::atomic<bool> stopping{false};
    std::atomic<long> calls{0}, wrong{0};
    std::vector<std::thread> threads;
    explicit WorkLoop(int n) {
        for (int t = 0; t < n; ++t)
            threads.emplace_back([this, t] {
                long k = 0;
                for (long i = t; !stopping.load(std::memory_order_relaxed); ++i, ++k)
                    if (ukpt_opt_work(i) != (((i + 1) * 3) ^ i)) wrong.fetch_add(1);
                calls.fetch_add(k);
            });
    }
    void stop() {
        stopping = true;
        for (auto &th : threads) th.join();
        threads.clear();
    }
    ~WorkLoop() { stop(); }
};

TEST_F(OptimizerTest, HotLoopWhileOptimizingAndUnoptimizing) {
    kprobe kp{};
    kp.symbol_name = "ukpt_opt_work";
    kp.pre_handler = count_pre;
    ASSERT_EQ(register_kprobe(&kp), 0);
    WorkLoop loop(8);
    int optimized_rounds = 0;
    for (int round = 0; round < 2000; ++round) {
        ASSERT_EQ(ukp_set_kprobes_optimization(round % 2), 0);
        ukp_optimizer_flush();
        if (first_byte(kp.addr) == 0xe9) ++optimized_rounds;
    }
    loop.stop();
    EXPECT_EQ(loop.wrong.load(), 0);
    EXPECT_EQ(g_hits.load(), loop.calls.load());
    EXPECT_GT(optimized_rounds, 900);
    unregister_kprobe(&kp);
    ASSERT_EQ(ukp_set_kprobes_optimization(1), 0);
}

std::atomic<long> g_returns{0};
int count_return(kretprobe_instance *, pt_regs *) {
    g_returns.fetch_add(1, std::memory_order_relaxed);
    return 0;
}

// 4 threads run through a kretprobed function while a kprobe beside it comes and goes, so
// that its entry goes from the kretprobe detour's own fast case to the usual trampoline,
// whose stub calls the function (through the breakpoint each time): every call is right,
// and every entry either comes back through the return handler or is counted missed.
TEST_F(OptimizerTest, HotLoopWhileAKprobeComesAndGoesBesideAKretprobe) {
    kretprobe rp{};
    g_returns = 0;
    ASSERT_NO_FATAL_FAILURE(put_optimized_rp(rp, "ukpt_opt_work", count_return, 64));
    WorkLoop loop(4);
    const auto kret = reinterpret_cast<uint64_t>(&ukp_kret_entry_trampoline);
    const void *fn = reinterpret_cast<const void *>(&ukpt_opt_work);
    int alone_rounds = 0, beside_rounds = 0;
    for (int round = 0; round < 200; ++round) {
        kprobe kp{};
        kp.symbol_name = "ukpt_opt_work";
        kp.pre_handler = count_pre;
        ukp_optimizer_flush();
        alone_rounds += jumped_trampoline(fn) == kret;
        ASSERT_EQ(register_kprobe(&kp), 0);
        ukp_optimizer_flush();
        beside_rounds += jumped_trampoline(fn) == kret;
        unregister_kprobe(&kp);
    }
    loop.stop();
    unregister_kretprobe(&rp);
    EXPECT_EQ(loop.wrong.load(), 0);
    EXPECT_EQ(g_returns.load() + rp.nmissed + static_cast<long>(rp.kp.nmissed), loop.calls.load());
    EXPECT_EQ(rp.ukp_unwound, 0u);
    EXPECT_GT(alone_rounds, 100) << "optimized, the kretprobe alone";
    EXPECT_GT(beside_rounds, 100) << "optimized, with the kprobe";
}

// The same with the kprobe staying and the kretprobe coming and going, so that the jump
// moves between the usual detour and the kretprobe's (through the breakpoint each time):
// every call is right and counted by the kprobe, and no return is lost to an unwind.
TEST_F(OptimizerTest, HotLoopWhileTheJumpMovesBetweenDetours) {
    kprobe kp{};
    put_optimized(kp, count_pre);
    WorkLoop loop(4);
    const auto kret = reinterpret_cast<uint64_t>(&ukp_kret_entry_trampoline);
    const auto usual = reinterpret_cast<uint64_t>(&ukp_optprobe_trampoline);
    const void *fn = reinterpret_cast<const void *>(&ukpt_opt_work);
    int kret_rounds = 0, usual_rounds = 0;
    uint64_t unwound = 0;
    g_returns = 0;
    for (int round = 0; round < 200; ++round) {
        kretprobe rp{};
        rp.kp.symbol_name = "ukpt_opt_work";
        rp.handler = count_return;
        rp.maxactive = 64;
        ukp_optimizer_flush();
        usual_rounds += jumped_trampoline(fn) == usual;
        ASSERT_EQ(register_kretprobe(&rp), 0);
        ukp_optimizer_flush();
        kret_rounds += jumped_trampoline(fn) == kret;
        unregister_kretprobe(&rp);
        unwound += rp.ukp_unwound;
    }
    loop.stop();
    unregister_kprobe(&kp);
    EXPECT_EQ(loop.wrong.load(), 0);
    EXPECT_EQ(g_hits.load() + static_cast<long>(kp.nmissed), loop.calls.load());
    EXPECT_GT(g_returns.load(), 0);
    EXPECT_EQ(unwound, 0u);
    EXPECT_GT(kret_rounds, 100) << "the kretprobe's detour, with the kretprobe";
    EXPECT_GT(usual_rounds, 100) << "the usual one, the kprobe alone";
}

// The same while 8 threads run through the region: the inner probe comes and goes, the
// entry goes from jump to breakpoint (running the first instruction alone, into the
// region) and back to a jump when the optimizer's strict pass finds no thread on its way
// into the region by the old path (most rounds it finds one and tries again later);
// every call is right and every probe hit counted.
TEST_F(OptimizerTest, HotLoopWhileAnInnerProbeComesAndGoes) {
    static std::atomic<long> inner_hits{0};
    kprobe kp{};
    kp.symbol_name = "ukpt_opt_inner";
    kp.pre_handler = count_pre;
    ASSERT_EQ(register_kprobe(&kp), 0);
    std::atomic<bool> stop{false};
    std::atomic<long> calls{0}, wrong{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 8; ++t) {
        threads.emplace_back([&, t] {
            long n = 0;
            for (long i = t; !stop.load(std::memory_order_relaxed); ++i, ++n)
                if (ukpt_opt_inner(i) != (((i + 1) * 3) ^ i)) wrong.fetch_add(1);
            calls.fetch_add(n);
        });
    }
    int optimized_rounds = 0;
    for (int round = 0; round < 300; ++round) {
        kprobe inner{};
        inner.symbol_name = "ukpt_opt_inner";
        inner.offset = 4;
        inner.pre_handler = [](kprobe *, pt_regs *) {
            inner_hits.fetch_add(1, std::memory_order_relaxed);
            return 0;
        };
        ASSERT_EQ(register_kprobe(&inner), 0);
        usleep(200);
        unregister_kprobe(&inner);
        ukp_optimizer_flush();
        if (first_byte(kp.addr) == 0xe9) ++optimized_rounds;
    }
    stop = true;
    for (auto &th : threads) th.join();
    EXPECT_EQ(wrong.load(), 0);
    EXPECT_EQ(g_hits.load(), calls.load());
    EXPECT_GT(inner_hits.load(), 0);
    // No thread runs now: nothing keeps it a breakpoint. (A pass may still find a thread
    // that ended, not yet gone from /proc/self/task, and try again 20 ms later.)
    for (int i = 0; i < 100 && first_byte(kp.addr) != 0xe9; ++i) {
        ukp_optimizer_flush();
        usleep(10000);
    }
    EXPECT_EQ(first_byte(kp.addr), 0xe9) << "re-optimized in " << optimized_rounds << " of 300 rounds";
    unregister_kprobe(&kp);
}

// Every function entry of the sweep functions (-O0, -O2, -Os): optimized where the checks
// allow, and the drivers' results unchanged, with every entry hit.
extern "C" {
extern long (*const ukpt_many[])(long);
extern const unsigned long ukpt_many_count;
}

// More points than one pass of the optimizer takes (kMaxBatch): every one is placed, in
// as many passes as it takes, and ukp_optimizer_flush() waits for all of them.
TEST_F(OptimizerTest, MorePointsThanOnePassTakesAreAllOptimized) {
    ASSERT_GT(ukpt_many_count, 1024u);
    std::vector<kprobe> kps(ukpt_many_count);
    // Registered with optimization off, then switched on: all of them queued at once (as
    // enabling an event group that covers a whole library does).
    ASSERT_EQ(ukp_set_kprobes_optimization(0), 0);
    for (size_t i = 0; i < kps.size(); ++i) {
        kps[i].addr = reinterpret_cast<kprobe_opcode_t *>(ukpt_many[i]);
        kps[i].pre_handler = count_pre;
        ASSERT_EQ(register_kprobe(&kps[i]), 0) << i;
    }
    ASSERT_EQ(ukp_set_kprobes_optimization(1), 0);
    ukp_optimizer_flush();
    size_t opt = 0;
    for (const kprobe &kp : kps) opt += optimized(kp);
    EXPECT_EQ(opt, kps.size());
    g_hits = 0;
    for (size_t i = 0; i < kps.size(); ++i) EXPECT_EQ(ukpt_many[i](2), static_cast<long>(6 + i + 1));
    EXPECT_EQ(g_hits.load(), static_cast<long>(kps.size()));
    for (auto &kp : kps) unregister_kprobe(&kp);
    EXPECT_EQ(ukp_verify(nullptr), 0);
}

TEST_F(OptimizerTest, SweepFunctionEntriesOptimizedBehaveTheSame) {
    const ukpt_sweep_fn *(*tables[])(size_t *) = {ukpt_sweep_table_O0, ukpt_sweep_table_O2, ukpt_sweep_table_Os};
    size_t total = 0, opt = 0;
    for (auto table : tables) {
        ASSERT_NE(table, nullptr) << "ukp_sweep_functions not linked";
        size_t n = 0;
        const ukpt_sweep_fn *fns = table(&n);
        std::vector<long> expected;
        for (size_t i = 0; i < n; ++i)
            for (long seed : {1l, 2l, 5l}) expected.push_back(fns[i].drive(seed));
        std::vector<kprobe> kps(n);
        for (size_t i = 0; i < n; ++i) {
            kps[i].addr = static_cast<kprobe_opcode_t *>(fns[i].fn);
            kps[i].pre_handler = count_pre;
            ASSERT_EQ(register_kprobe(&kps[i]), 0) << fns[i].name;
        }
        ukp_optimizer_flush();
        for (size_t i = 0; i < n; ++i) {
            ++total;
            if (optimized(kps[i])) {
                ++opt;
                EXPECT_EQ(first_byte(kps[i].addr), 0xe9) << fns[i].name;
            }
        }
        g_hits = 0;
        size_t k = 0;
        for (size_t i = 0; i < n; ++i)
            for (long seed : {1l, 2l, 5l}) EXPECT_EQ(fns[i].drive(seed), expected[k++]) << fns[i].name;
        EXPECT_GE(g_hits.load(), static_cast<long>(3 * n)); // each entry at least once per drive
        for (auto &kp : kps) unregister_kprobe(&kp);
        EXPECT_EQ(ukp_verify(nullptr), 0);
    }
    std::printf("sweep entries optimized: %zu of %zu\n", opt, total);
    EXPECT_GE(opt * 10, total * 8); // most entries pass the checks
}

} // namespace

// ---- islands (arch/x86_64/island.hpp) ----

using CopyFn = void *(*)(void *, const void *, size_t);

// The memcpy this CPU's ifunc picked, and the `jmp rel8` in mempcpy that enters it past its
// first instruction (glibc's assembly shares the body); null source if this libc has none.
struct SharedCopy {
    CopyFn memcpy_fn = nullptr, mempcpy_fn = nullptr;
    const uint8_t *source = nullptr;
};
SharedCopy shared_copy() {
    SharedCopy s;
    s.memcpy_fn = reinterpret_cast<CopyFn>(dlsym(RTLD_DEFAULT, "memcpy"));
    s.mempcpy_fn = reinterpret_cast<CopyFn>(dlsym(RTLD_DEFAULT, "mempcpy"));
    if (s.memcpy_fn == nullptr || s.mempcpy_fn == nullptr) return s;
    const auto *p = reinterpret_cast<const uint8_t *>(s.mempcpy_fn);
    const auto *entry = reinterpret_cast<const uint8_t *>(s.memcpy_fn);
    for (int i = 0; i < 14; ++i) {
        const uint8_t *to = p + i + 2 + static_cast<int8_t>(p[i + 1]);
        if (p[i] == 0xeb && to > entry && to < entry + 8) s.source = p + i;
    }
    return s;
}

std::atomic<long> g_copy_hits{0};
std::atomic<uintptr_t> g_copy_lo{0}, g_copy_hi{0};
// Counts the hits whose destination is one of the test's buffers (the agent and the
// test framework call memcpy too).
int count_copy_pre(kprobe *, pt_regs *regs) {
    if (regs->di >= g_copy_lo.load(std::memory_order_relaxed) && regs->di < g_copy_hi.load(std::memory_order_relaxed))
        g_copy_hits.fetch_add(1, std::memory_order_relaxed);
    return 0;
}

// libc's memcpy, which mempcpy enters at +3 with a jmp rel8, is optimized by way of an
// island in the padding after that jmp; 4 threads copy through memcpy and mempcpy while
// the jump comes and goes 400 times: every copy is right, every memcpy call is a hit and
// no mempcpy call is one. Unregistered, the branch and the island's bytes are libc's again.
TEST_F(OptimizerTest, MemcpyEnteredByMempcpyIsOptimizedWithAnIsland) {
    const SharedCopy s = shared_copy();
    if (s.source == nullptr) GTEST_SKIP() << "this libc's mempcpy does not jump into memcpy";
    const uint8_t disp = s.source[1];
    uint8_t island_before[5];
    std::memcpy(island_before, s.source + 2, sizeof island_before);

    constexpr int kThreads = 4;
    constexpr size_t kBuf = 512;
    static uint8_t bufs[kThreads][2][kBuf];
    g_copy_lo = reinterpret_cast<uintptr_t>(&bufs[0][0][0]);
    g_copy_hi = g_copy_lo + sizeof bufs;
    g_copy_hits = 0;
    kprobe kp{};
    kp.addr = reinterpret_cast<kprobe_opcode_t *>(s.memcpy_fn);
    kp.pre_handler = count_copy_pre;
    ASSERT_EQ(register_kprobe(&kp), 0);
    ukp_optimizer_flush();
    ASSERT_TRUE(optimized(kp)) << list_text();
    EXPECT_EQ(first_byte(reinterpret_cast<const void *>(s.memcpy_fn)), 0xe9);
    EXPECT_EQ(s.source[1], 0) << "mempcpy's jmp leads to the island right after it";
    EXPECT_EQ(s.source[2], 0xe9);
    EXPECT_EQ(ukp_verify(nullptr), 0);

    std::atomic<bool> stop{false};
    std::atomic<long> calls{0}, wrong{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
        threads.emplace_back([&, t] {
            const CopyFn volatile mc = s.memcpy_fn, mp = s.mempcpy_fn;
            uint8_t *src = bufs[t][0], *dst = bufs[t][1];
            for (size_t i = 0; i < kBuf; ++i) src[i] = static_cast<uint8_t>(i * 7 + t);
            long n = 0;
            for (size_t i = 0; !stop.load(std::memory_order_relaxed); ++i, ++n) {
                const size_t len = (i * 37) % kBuf;
                if (mc(dst, src, len) != dst || std::memcmp(dst, src, len) != 0) wrong.fetch_add(1);
                const size_t off = i % 3;
                if (mp(dst, src + off, len - (len > off ? off : len)) != dst + len - (len > off ? off : len))
                    wrong.fetch_add(1);
            }
            calls.fetch_add(n);
        });
    }
    int optimized_rounds = 0;
    for (int round = 0; round < 400; ++round) {
        ASSERT_EQ(ukp_set_kprobes_optimization(round % 2), 0);
        ukp_optimizer_flush();
        if (first_byte(reinterpret_cast<const void *>(s.memcpy_fn)) == 0xe9) ++optimized_rounds;
    }
    ASSERT_EQ(ukp_set_kprobes_optimization(1), 0);
    stop = true;
    for (auto &th : threads) th.join();
    EXPECT_EQ(wrong.load(), 0);
    EXPECT_EQ(g_copy_hits.load(), calls.load());
    EXPECT_GT(optimized_rounds, 150);
    unregister_kprobe(&kp);
    ukp_optimizer_flush();
    EXPECT_EQ(s.source[1], disp);
    EXPECT_EQ(std::memcmp(s.source + 2, island_before, sizeof island_before), 0);
    EXPECT_EQ(ukp_verify(nullptr), 0);
}

// A probe at mempcpy's jmp (its copy would still lead into memcpy's region) takes the
// island back: memcpy goes back to its breakpoint while it is there, and gets its jump
// again when it goes. Both probes count every call meanwhile.
TEST_F(OptimizerTest, AProbeOnTheIslandsBranchTakesTheIslandBack) {
    const SharedCopy s = shared_copy();
    if (s.source == nullptr) GTEST_SKIP() << "this libc's mempcpy does not jump into memcpy";
    {
        // memcpy is on the spawn path: the probe that takes its island is refused.
        kprobe copy{}, branch{};
        copy.addr = reinterpret_cast<kprobe_opcode_t *>(s.memcpy_fn);
        copy.pre_handler = count_copy_pre;
        ASSERT_EQ(register_kprobe(&copy), 0);
        ukp_optimizer_flush();
        branch.addr = reinterpret_cast<kprobe_opcode_t *>(const_cast<uint8_t *>(s.source));
        branch.pre_handler = count_pre;
        EXPECT_EQ(register_kprobe(&branch), -EINVAL);
        ukp_optimizer_flush();
        EXPECT_TRUE(optimized(copy));
        unregister_kprobe(&copy);
    }
    // The mechanism itself, as it works where the rule does not apply.
    ukp::core::set_spawn_path_enforced(false);
    struct Enforce {
        ~Enforce() { ukp::core::set_spawn_path_enforced(true); }
    } enforce;
    static uint8_t src[64], dst[64];
    g_copy_lo = reinterpret_cast<uintptr_t>(dst);
    g_copy_hi = reinterpret_cast<uintptr_t>(dst + sizeof dst);
    g_copy_hits = 0;
    g_hits = 0;
    kprobe copy{}, branch{};
    copy.addr = reinterpret_cast<kprobe_opcode_t *>(s.memcpy_fn);
    copy.pre_handler = count_copy_pre;
    ASSERT_EQ(register_kprobe(&copy), 0);
    ukp_optimizer_flush();
    ASSERT_TRUE(optimized(copy));
    ASSERT_EQ(s.source[1], 0);
    branch.addr = reinterpret_cast<kprobe_opcode_t *>(const_cast<uint8_t *>(s.source));
    branch.pre_handler = count_pre;
    ASSERT_EQ(register_kprobe(&branch), 0);
    ukp_optimizer_flush();
    EXPECT_FALSE(optimized(copy));
    EXPECT_EQ(first_byte(reinterpret_cast<const void *>(s.memcpy_fn)), 0xcc);
    const CopyFn volatile mc = s.memcpy_fn, mp = s.mempcpy_fn;
    for (int i = 0; i < 100; ++i) {
        ASSERT_EQ(mp(dst, src, 8 + i % 50), dst + 8 + i % 50);
        ASSERT_EQ(mc(dst, src, 8 + i % 50), dst);
    }
    EXPECT_GE(g_hits.load(), 100); // other threads may call mempcpy too
    EXPECT_EQ(g_copy_hits.load(), 100);
    unregister_kprobe(&branch);
    ukp_optimizer_flush();
    EXPECT_TRUE(optimized(copy)) << list_text();
    EXPECT_EQ(s.source[1], 0);
    unregister_kprobe(&copy);
    ukp_optimizer_flush();
    EXPECT_EQ(ukp_verify(nullptr), 0);
}

// ---- the spawn gate (core/spawn_gate.cpp) ----

// glibc runs the child of posix_spawn (and system, popen) with every signal blocked: the
// int3 a probe in libc stands on before its jmp would kill it. A thread spawns /bin/true
// over and over while probes on execve and sigaction (which the child runs) come and go
// 150 times: no child dies, and every execve of a child that ran while the probe was
// there is a hit.
TEST_F(OptimizerTest, ChildrenOfPosixSpawnSurviveProbesComingAndGoing) {
    std::atomic<bool> stop{false};
    std::atomic<long> spawned{0}, killed{0};
    std::thread spawner([&] {
        char arg0[] = "true";
        char *argv[] = {arg0, nullptr};
        while (!stop.load()) {
            pid_t pid = 0;
            if (posix_spawn(&pid, "/bin/true", nullptr, nullptr, argv, environ) != 0) continue;
            int status = 0;
            waitpid(pid, &status, 0);
            spawned.fetch_add(1);
            if (WIFSIGNALED(status)) killed.fetch_add(1);
        }
    });
    for (int round = 0; round < 150; ++round) {
        kprobe ex{}, sa{};
        ex.symbol_name = "libc.so.6:execve";
        ex.pre_handler = count_pre;
        sa.symbol_name = "libc.so.6:sigaction";
        sa.pre_handler = count_pre;
        ASSERT_EQ(register_kprobe(&ex), 0);
        ASSERT_EQ(register_kprobe(&sa), 0);
        ukp_optimizer_flush();
        const long before = spawned.load();
        while (spawned.load() < before + 2) sched_yield(); // children run with the jumps in place
        unregister_kprobe(&sa);
        unregister_kprobe(&ex);
    }
    stop = true;
    spawner.join();
    EXPECT_EQ(killed.load(), 0) << "of " << spawned.load() << " children";
    EXPECT_GT(g_hits.load(), 0);
}

// The spawn path: what glibc's posix_spawn (and system, popen) may run with every signal
// blocked, the child's file actions and execve included, and not the rest of libc.
TEST_F(OptimizerTest, TheSpawnPathHoldsWhatPosixSpawnsChildRuns) {
    kprobe kp{};
    kp.symbol_name = "libc.so.6:execve";
    kp.pre_handler = count_pre;
    ASSERT_EQ(register_kprobe(&kp), 0); // the first probe in libc works the path out
    unregister_kprobe(&kp);
    ASSERT_TRUE(ukp::core::spawn_path_known());
    void *libc = dlopen("libc.so.6", RTLD_NOLOAD | RTLD_LAZY);
    ASSERT_NE(libc, nullptr);
    const auto on_path = [libc](const char *name) {
        void *fn = dlsym(libc, name);
        return fn != nullptr && ukp::core::on_spawn_path(reinterpret_cast<uint64_t>(fn));
    };
    for (const char *name : {"posix_spawn", "posix_spawnp", "execve", "dup2", "__close_nocancel", "__open64_nocancel",
                             "chdir", "fchdir", "setsid", "__libc_sigaction", "sigprocmask", "_exit", "getenv"})
        EXPECT_TRUE(on_path(name)) << name;
    for (const char *name : {"malloc", "free", "printf", "write", "read", "fork", "pthread_create", "fopen", "getppid"})
        EXPECT_FALSE(on_path(name)) << name;
    dlclose(libc);
}

// With optimization off, a point on the spawn path keeps its jmp (an int3 would kill the
// children, whose handlers glibc has reset): children that run dup2 in their file actions
// live, and their hits count. Off the path the knob holds.
TEST_F(OptimizerTest, WithOptimizationOffTheSpawnPathKeepsItsJumps) {
    ASSERT_EQ(ukp_set_kprobes_optimization(0), 0);
    kprobe dup{}, other{};
    dup.symbol_name = "libc.so.6:dup2";
    dup.pre_handler = count_pre;
    other.symbol_name = "libc.so.6:getppid";
    other.pre_handler = count_pre;
    ASSERT_EQ(register_kprobe(&dup), 0);
    ASSERT_EQ(register_kprobe(&other), 0);
    for (int i = 0; i < 100 && !optimized(dup); ++i) {
        ukp_optimizer_flush();
        usleep(10 * 1000);
    }
    EXPECT_TRUE(optimized(dup)) << list_text();
    EXPECT_FALSE(optimized(other)) << list_text();
    EXPECT_NE(list_text().find("dup2+0x0  libc.so.6 [OPTIMIZED]"), std::string::npos) << list_text();
    posix_spawn_file_actions_t fa;
    ASSERT_EQ(posix_spawn_file_actions_init(&fa), 0);
    ASSERT_EQ(posix_spawn_file_actions_adddup2(&fa, 2, 9), 0);
    char arg0[] = "true";
    char *argv[] = {arg0, nullptr};
    int killed = 0;
    for (int i = 0; i < 50; ++i) {
        pid_t pid = 0;
        ASSERT_EQ(posix_spawn(&pid, "/bin/true", &fa, nullptr, argv, environ), 0);
        int status = 0;
        ASSERT_EQ(waitpid(pid, &status, 0), pid);
        if (WIFSIGNALED(status)) ++killed;
    }
    posix_spawn_file_actions_destroy(&fa);
    EXPECT_EQ(killed, 0);
    EXPECT_GE(g_hits.load(), 50) << "each child's dup2";
    const long before = g_hits.load();
    getppid();
    EXPECT_EQ(g_hits.load(), before + 1);
    unregister_kprobe(&other);
    unregister_kprobe(&dup);
    EXPECT_EQ(ukp_set_kprobes_optimization(1), 0);
    EXPECT_EQ(ukp_verify(nullptr), 0);
}

// A probe that would keep a spawn-path point on its int3 for good is refused with -EINVAL:
// a post_handler (it needs the breakpoint), or a point inside another's region, whichever
// comes first. Off the path, a post_handler is accepted as always.
TEST_F(OptimizerTest, AProbeThatWouldStayOnItsInt3OnTheSpawnPathIsRefused) {
    kprobe post{};
    post.symbol_name = "libc.so.6:dup2";
    post.pre_handler = count_pre;
    post.post_handler = empty_post;
    EXPECT_EQ(register_kprobe(&post), -EINVAL);
    // getenv (on the path, through execvpe) begins with short instructions.
    void *libc = dlopen("libc.so.6", RTLD_NOLOAD | RTLD_LAZY);
    ASSERT_NE(libc, nullptr);
    const auto *getenv_fn = static_cast<const uint8_t *>(dlsym(libc, "getenv"));
    dlclose(libc);
    ukp::arch::Insn first;
    ASSERT_EQ(ukp::arch::decode(reinterpret_cast<uint64_t>(getenv_fn), getenv_fn, 15, &first), 0);
    ASSERT_LT(first.len, 5);
    kprobe outer{}, inner{};
    outer.symbol_name = inner.symbol_name = "libc.so.6:getenv";
    inner.offset = first.len;
    outer.pre_handler = inner.pre_handler = count_pre;
    ASSERT_EQ(register_kprobe(&outer), 0);
    EXPECT_EQ(register_kprobe(&inner), -EINVAL) << "it would put getenv's entry back on its int3";
    ukp_optimizer_flush();
    EXPECT_TRUE(optimized(outer));
    unregister_kprobe(&outer);
    inner = kprobe{};
    inner.symbol_name = "libc.so.6:getenv";
    inner.offset = first.len;
    inner.pre_handler = count_pre;
    outer = kprobe{};
    outer.symbol_name = "libc.so.6:getenv";
    outer.pre_handler = count_pre;
    ASSERT_EQ(register_kprobe(&inner), 0);
    EXPECT_EQ(register_kprobe(&outer), -EINVAL) << "its region would hold another point";
    unregister_kprobe(&inner);
    kprobe elsewhere{};
    elsewhere.symbol_name = "libc.so.6:getppid";
    elsewhere.pre_handler = count_pre;
    elsewhere.post_handler = empty_post;
    EXPECT_EQ(register_kprobe(&elsewhere), 0);
    unregister_kprobe(&elsewhere);
    EXPECT_EQ(ukp_verify(nullptr), 0);
}

// The optimizer stops running threads with a real-time signal the program leaves alone.
// A program that takes that signal while it runs (the JVM takes SIGRTMAX-2) keeps it: the
// next pass chooses another one, its handler sees none of the optimizer's, and the jumps
// still go in while a thread spins where the optimizer must stop it. (Before, the
// optimizer placed no jump in such a process any more.)
std::atomic<int> g_own_signals{0};
void own_signal(int) { g_own_signals.fetch_add(1); }

TEST_F(OptimizerTest, AProgramThatTakesTheStopSignalKeepsItAndJumpsStillGoIn) {
    kprobe first{};
    first.symbol_name = "ukpt_opt_work";
    first.pre_handler = count_pre;
    ASSERT_EQ(register_kprobe(&first), 0);
    ukp_optimizer_flush(); // a pass: the optimizer has its signal
    unregister_kprobe(&first);
    const int sig = SIGRTMAX - 2;
    struct sigaction own {
    }, old{};
    own.sa_handler = own_signal;
    sigemptyset(&own.sa_mask);
    ASSERT_EQ(sigaction(sig, &own, &old), 0);
    std::atomic<bool> stop{false};
    std::thread spinner([&] {
        while (!stop.load(std::memory_order_relaxed)) {
        }
    });
    kprobe kp{};
    kp.symbol_name = "ukpt_opt_work";
    kp.pre_handler = count_pre;
    ASSERT_EQ(register_kprobe(&kp), 0);
    const bool jumped = optimized_within(kp, 3);
    const int before_own = g_own_signals.load();
    raise(sig);
    stop = true;
    spinner.join();
    for (long i = 0; i < 10; ++i) ukpt_opt_work(i);
    unregister_kprobe(&kp);
    sigaction(sig, &old, nullptr);
    EXPECT_TRUE(jumped);
    EXPECT_EQ(before_own, 0) << "the optimizer sent the program's signal";
    EXPECT_EQ(g_own_signals.load(), 1);
    EXPECT_EQ(g_hits.load(), 10);
}

// A thread that blocks the stop signal (it blocked every signal before the agent chose
// one, by a raw system call here as glibc does around fork) is not sent it: the signal
// would stay pending for the program's signalfd or sigwaitinfo to take as its own. The
// jump goes in once the thread is seen outside the region: here it computes for 8 ms
// (when the optimizer looks, most likely), then sleeps for 1 ms, in turn.
TEST_F(OptimizerTest, AThreadThatBlocksTheStopSignalIsNotSentOne) {
    std::atomic<bool> stop{false}, masked{false};
    sigset_t pending;
    sigemptyset(&pending);
    std::thread blocker([&] {
        sigset_t all;
        sigfillset(&all);
        syscall(SYS_rt_sigprocmask, SIG_BLOCK, &all, nullptr, _NSIG / 8);
        masked = true;
        while (!stop.load(std::memory_order_relaxed)) {
            timespec t0{}, t{};
            clock_gettime(CLOCK_MONOTONIC, &t0);
            do clock_gettime(CLOCK_MONOTONIC, &t);
            while ((t.tv_sec - t0.tv_sec) * 1000000000l + (t.tv_nsec - t0.tv_nsec) < 8000000);
            usleep(1000);
        }
        sigpending(&pending);
        sigset_t none;
        sigemptyset(&none);
        syscall(SYS_rt_sigprocmask, SIG_SETMASK, &none, nullptr, _NSIG / 8);
    });
    while (!masked) usleep(100);
    kprobe kp{};
    kp.symbol_name = "ukpt_opt_work";
    kp.pre_handler = count_pre;
    ASSERT_EQ(register_kprobe(&kp), 0);
    const bool jumped = optimized_within(kp, 3);
    stop = true;
    blocker.join();
    for (long i = 0; i < 10; ++i) ukpt_opt_work(i);
    unregister_kprobe(&kp);
    EXPECT_TRUE(jumped);
    for (int sig = SIGRTMIN; sig <= SIGRTMAX; ++sig)
        EXPECT_FALSE(sigismember(&pending, sig)) << "signal " << sig << " left pending";
    EXPECT_EQ(g_hits.load(), 10);
}

// With every real-time signal it could choose taken by the program, the optimizer sends
// none: as under a tracer, the jumps go in when it sees every other thread blocked
// outside the regions.
TEST_F(OptimizerTest, WithEveryRealTimeSignalTakenTheJumpsGoInSilently) {
    std::vector<std::pair<int, struct sigaction>> taken;
    struct sigaction own {};
    own.sa_handler = own_signal;
    sigemptyset(&own.sa_mask);
    for (int sig = SIGRTMIN + 2; sig <= SIGRTMAX - 2; ++sig) {
        struct sigaction old {};
        ASSERT_EQ(sigaction(sig, &own, &old), 0);
        taken.emplace_back(sig, old);
    }
    const int own_before = g_own_signals.load();
    kprobe kp{};
    kp.symbol_name = "ukpt_opt_work";
    kp.pre_handler = count_pre;
    ASSERT_EQ(register_kprobe(&kp), 0);
    const bool jumped = optimized_within(kp, 2);
    for (long i = 0; i < 10; ++i) ukpt_opt_work(i);
    unregister_kprobe(&kp);
    for (const auto &[sig, old] : taken) sigaction(sig, &old, nullptr);
    EXPECT_TRUE(jumped);
    EXPECT_EQ(g_own_signals.load(), own_before) << "the optimizer sent one of the program's signals";
    EXPECT_EQ(g_hits.load(), 10);
}

// Under a tracer (a debugger) the optimizer sends no stop signal, which the tracer would
// see: it places the jumps when it sees every thread blocked outside the regions. A child
// traces this process's main thread, passing every signal on; a probe registered meanwhile
// gets its jmp, and its hits are counted.
TEST_F(OptimizerTest, UnderATracerTheJumpGoesInWithoutASignal) {
    const pid_t self = getpid();
    int ready[2];
    ASSERT_EQ(pipe(ready), 0);
    const pid_t tracer = fork();
    ASSERT_GE(tracer, 0);
    if (tracer == 0) {
        if (ptrace(PTRACE_SEIZE, self, nullptr, nullptr) != 0) _exit(1);
        const char one = 1;
        if (write(ready[1], &one, 1) != 1) _exit(1);
        for (;;) {
            int status = 0;
            if (waitpid(self, &status, __WALL) != self || WIFEXITED(status) || WIFSIGNALED(status)) _exit(0);
            const int sig = WIFSTOPPED(status) && (status >> 16) == 0 ? WSTOPSIG(status) : 0;
            ptrace(PTRACE_CONT, self, nullptr, reinterpret_cast<void *>(static_cast<long>(sig)));
        }
    }
    prctl(PR_SET_PTRACER, tracer);
    char one = 0;
    ASSERT_EQ(read(ready[0], &one, 1), 1);
    close(ready[0]);
    close(ready[1]);
    kprobe kp{};
    kp.symbol_name = "ukpt_opt_work";
    kp.pre_handler = count_pre;
    ASSERT_EQ(register_kprobe(&kp), 0);
    // A pass waits for a moment when no other thread runs: retried every 20 ms.
    const bool jumped = optimized_within(kp, 2);
    for (long i = 0; i < 10; ++i) ukpt_opt_work(i);
    unregister_kprobe(&kp);
    kill(tracer, SIGKILL);
    waitpid(tracer, nullptr, 0);
    EXPECT_TRUE(jumped);
    EXPECT_EQ(g_hits.load(), 10);
}
