// fault_handler rules, and a program that uses SIGSEGV and SIGTRAP itself behaving
// exactly as without ukprobes. Cases that end the process run as death tests (forked).
#include <ukprobes/kprobes.h>

#include "asm_functions.h"
#include "sanitizers.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

namespace {

// Volatile, so the compiler cannot see (and warn about) the deliberate bad access.
long *volatile kBadPointer = reinterpret_cast<long *>(16);

std::atomic<int> g_faults{0};
int g_last_trapnr = -1;
unsigned long g_fault_ip = 0;

// Faults on purpose after changing a register.
int faulting_pre(kprobe *, pt_regs *regs) {
    regs->di = 1000;
    return static_cast<int>(*static_cast<volatile long *>(kBadPointer));
}

int fault_unhandled(kprobe *, pt_regs *regs, int trapnr) {
    ++g_faults;
    g_last_trapnr = trapnr;
    g_fault_ip = regs->ip;
    return 0;
}

int fault_handled(kprobe *, pt_regs *regs, int trapnr) {
    ++g_faults;
    g_last_trapnr = trapnr;
    (void)regs;
    return 1;
}

struct FaultTest : ::testing::Test {
    void SetUp() override {
        g_faults = 0;
        g_last_trapnr = -1;
    }
};

TEST_F(FaultTest, FaultInPreHandlerUnhandledRestoresRegisters) {
    kprobe kp{};
    kp.symbol_name = "ukpt_twice";
    kp.pre_handler = faulting_pre;
    kp.fault_handler = fault_unhandled;
    ASSERT_EQ(register_kprobe(&kp), 0);
    EXPECT_EQ(ukpt_twice(21), 42) << "the program behaves as without the probe";
    EXPECT_EQ(g_faults, 1);
    EXPECT_EQ(g_last_trapnr, 14) << "page fault";
    EXPECT_EQ(kp.nmissed, 1u);
    unregister_kprobe(&kp);
}

TEST_F(FaultTest, FaultInPreHandlerHandledKeepsRegisters) {
    kprobe kp{};
    kp.symbol_name = "ukpt_twice";
    kp.pre_handler = faulting_pre;
    kp.fault_handler = fault_handled;
    ASSERT_EQ(register_kprobe(&kp), 0);
    EXPECT_EQ(ukpt_twice(21), 2000) << "handled: the handler's change to di stays";
    EXPECT_EQ(g_faults, 1);
    unregister_kprobe(&kp);
}

TEST_F(FaultTest, FaultInHandlerWithoutFaultHandlerIsSurvived) {
    kprobe kp{};
    kp.symbol_name = "ukpt_twice";
    kp.pre_handler = faulting_pre;
    ASSERT_EQ(register_kprobe(&kp), 0);
    for (int i = 0; i < 3; ++i) EXPECT_EQ(ukpt_twice(5), 10);
    EXPECT_EQ(kp.nmissed, 3u);
    unregister_kprobe(&kp);
}

void faulting_post(kprobe *, pt_regs *, unsigned long) { (void)*static_cast<volatile long *>(kBadPointer); }

TEST_F(FaultTest, FaultInPostHandler) {
    kprobe kp{};
    kp.symbol_name = "ukpt_twice";
    kp.post_handler = faulting_post;
    kp.fault_handler = fault_unhandled;
    ASSERT_EQ(register_kprobe(&kp), 0);
    EXPECT_EQ(ukpt_twice(4), 8);
    EXPECT_EQ(g_faults, 1);
    EXPECT_EQ(g_last_trapnr, 14);
    unregister_kprobe(&kp);
}

// A kretprobe's own entry handler (the agent's, run without a recovery point) beside a
// user's kprobe on the same entry, in both orders: the user's handler stays guarded.
std::atomic<int> g_returns{0};
int count_return(kretprobe_instance *, pt_regs *) {
    ++g_returns;
    return 0;
}

TEST_F(FaultTest, AUserHandlerBesideAKretprobeStaysGuarded) {
    for (const bool kretprobe_first : {true, false}) {
        g_faults = 0;
        g_returns = 0;
        kretprobe rp{};
        rp.kp.symbol_name = "ukpt_twice";
        rp.handler = count_return;
        kprobe kp{};
        kp.symbol_name = "ukpt_twice";
        kp.pre_handler = faulting_pre;
        kp.fault_handler = fault_unhandled;
        if (kretprobe_first) {
            ASSERT_EQ(register_kretprobe(&rp), 0);
        }
        ASSERT_EQ(register_kprobe(&kp), 0);
        if (!kretprobe_first) {
            ASSERT_EQ(register_kretprobe(&rp), 0);
        }
        for (int i = 0; i < 3; ++i) EXPECT_EQ(ukpt_twice(21), 42) << kretprobe_first;
        EXPECT_EQ(g_faults, 3) << kretprobe_first;
        EXPECT_EQ(kp.nmissed, 3u) << kretprobe_first;
        EXPECT_EQ(g_returns, 3) << kretprobe_first;
        unregister_kprobe(&kp);
        unregister_kretprobe(&rp);
    }
}

// A user's entry and return handlers that fault: the agent's kretprobe entry runs them
// guarded. A faulting entry handler leaves the call unprobed (its instance goes back);
// a faulting return handler is abandoned, and the function returns as it would.
std::atomic<int> g_bad_entries{0};
int faulting_entry(kretprobe_instance *, pt_regs *) {
    ++g_bad_entries;
    return static_cast<int>(*static_cast<volatile long *>(kBadPointer));
}
int faulting_return(kretprobe_instance *, pt_regs *) {
    ++g_returns;
    return static_cast<int>(*static_cast<volatile long *>(kBadPointer));
}

TEST_F(FaultTest, FaultingKretprobeHandlersAreSurvived) {
    g_returns = 0;
    g_bad_entries = 0;
    kretprobe rp{};
    rp.kp.symbol_name = "ukpt_twice";
    rp.entry_handler = faulting_entry;
    rp.handler = count_return;
    rp.maxactive = 4;
    ASSERT_EQ(register_kretprobe(&rp), 0);
    for (int i = 0; i < 10; ++i) EXPECT_EQ(ukpt_twice(i), 2 * i);
    EXPECT_EQ(g_bad_entries, 10);
    EXPECT_EQ(g_returns, 0) << "a call whose entry handler faulted is not probed";
    EXPECT_EQ(rp.kp.nmissed, 10u);
    EXPECT_EQ(rp.nmissed, 0) << "every instance went back: none ran short";
    unregister_kretprobe(&rp);

    kretprobe rp2{};
    rp2.kp.symbol_name = "ukpt_twice";
    rp2.handler = faulting_return;
    ASSERT_EQ(register_kretprobe(&rp2), 0);
    for (int i = 0; i < 3; ++i) EXPECT_EQ(ukpt_twice(i), 2 * i);
    EXPECT_EQ(g_returns, 3);
    EXPECT_EQ(rp2.kp.nmissed, 3u);
    unregister_kretprobe(&rp2);
}

// The probed instruction itself faults: `mov (%rdi),%rax` with a bad pointer. The
// fault_handler skips it and supplies a value.
int skip_load(kprobe *, pt_regs *regs, int trapnr) {
    ++g_faults;
    g_last_trapnr = trapnr;
    g_fault_ip = regs->ip;
    regs->ax = static_cast<unsigned long>(-1);
    regs->ip += 3; // the length of mov (%rdi),%rax
    return 1;
}

TEST_F(FaultTest, FaultInSteppedInstructionHandled) {
    for (bool with_post : {false, true}) {
        kprobe kp{};
        kp.addr = reinterpret_cast<kprobe_opcode_t *>(ukpt_load_at_mov);
        kp.fault_handler = skip_load;
        if (with_post) kp.post_handler = [](kprobe *, pt_regs *, unsigned long) {};
        ASSERT_EQ(register_kprobe(&kp), 0);
        long good = 99;
        EXPECT_EQ(ukpt_load(&good), 99);
        EXPECT_EQ(ukpt_load(kBadPointer), -1);
        EXPECT_EQ(g_last_trapnr, 14);
        EXPECT_EQ(g_fault_ip, reinterpret_cast<unsigned long>(ukpt_load_at_mov))
            << "the fault is reported at the probed address, not the copy";
        unregister_kprobe(&kp);
    }
}

// The trap number a fault_handler receives is the x86 one, for each kind of fault in a
// handler: divide error 0, invalid opcode 6, general protection 13, page fault 14.
long *volatile kNonCanonical = reinterpret_cast<long *>(0x8000000000000000ul);
// In assembly, so that no sanitizer check comes first.
long load_through(long *p) {
    long v;
    asm volatile("mov (%1), %0" : "=r"(v) : "r"(p) : "memory");
    return v;
}
struct HandlerFault {
    const char *name;
    int (*pre)(kprobe *, pt_regs *);
    int trapnr;
};
const HandlerFault kHandlerFaults[] = {
    {"divide error",
     [](kprobe *, pt_regs *) {
         long q;
         asm volatile("xor %%ecx, %%ecx\n\tmov $1000, %%eax\n\tcqto\n\tidiv %%rcx" : "=a"(q) : : "rcx", "rdx");
         return static_cast<int>(q);
     },
     0},
    {"invalid opcode",
     [](kprobe *, pt_regs *) {
         asm volatile("ud2");
         return 0;
     },
     6},
    {"general protection", [](kprobe *, pt_regs *) { return static_cast<int>(load_through(kNonCanonical)); }, 13},
    {"page fault", [](kprobe *, pt_regs *) { return static_cast<int>(load_through(kBadPointer)); }, 14},
};

TEST_F(FaultTest, FaultHandlerGetsTheTrapNumberOfEachFault) {
    for (const HandlerFault &c : kHandlerFaults) {
        SCOPED_TRACE(c.name);
        g_faults = 0;
        g_last_trapnr = -1;
        kprobe kp{};
        kp.addr = reinterpret_cast<kprobe_opcode_t *>(ukpt_load_at_mov);
        kp.pre_handler = c.pre;
        kp.fault_handler = fault_unhandled;
        ASSERT_EQ(register_kprobe(&kp), 0);
        long v = 5;
        EXPECT_EQ(ukpt_load(&v), 5) << "the program goes on as without the handler";
        EXPECT_EQ(g_faults, 1);
        EXPECT_EQ(g_last_trapnr, c.trapnr);
        EXPECT_EQ(kp.nmissed, 1u);
        unregister_kprobe(&kp);
    }
}

// The probed instruction itself takes a general protection fault (a non-canonical address).
TEST_F(FaultTest, SteppedInstructionGeneralProtectionIsTrap13) {
    kprobe kp{};
    kp.addr = reinterpret_cast<kprobe_opcode_t *>(ukpt_load_at_mov);
    kp.fault_handler = skip_load;
    ASSERT_EQ(register_kprobe(&kp), 0);
    EXPECT_EQ(ukpt_load(kNonCanonical), -1);
    EXPECT_EQ(g_last_trapnr, 13);
    EXPECT_EQ(g_fault_ip, reinterpret_cast<unsigned long>(ukpt_load_at_mov));
    unregister_kprobe(&kp);
}

// A SIGSEGV handler the program installed before the agent's first registration is kept
// as the program's: its own faults still reach it. Runs in a re-executed child, where the
// agent has not installed anything yet. Exit codes: 0 right; 10+ wrong.
std::atomic<int> g_early_calls{0};
void early_segv(int, siginfo_t *, void *ctx) {
    ++g_early_calls;
    auto *uc = static_cast<ucontext_t *>(ctx);
    uc->uc_mcontext.gregs[REG_RAX] = 77;
    uc->uc_mcontext.gregs[REG_RIP] += 3; // past mov (%rdi),%rax
}
void handler_installed_before_the_agent() {
    struct sigaction act {};
    act.sa_sigaction = early_segv;
    act.sa_flags = SA_SIGINFO;
    sigemptyset(&act.sa_mask);
    if (sigaction(SIGSEGV, &act, nullptr) != 0) _exit(2);
    kprobe kp{};
    kp.addr = reinterpret_cast<kprobe_opcode_t *>(ukpt_branches_at_test);
    kp.pre_handler = [](kprobe *, pt_regs *) { return 0; };
    if (register_kprobe(&kp) != 0) _exit(3);
    if (ukpt_load(kBadPointer) != 77) _exit(10); // the program's own fault, not a probe's
    if (g_early_calls != 1) _exit(11);
    struct sigaction now {};
    sigaction(SIGSEGV, nullptr, &now);
    if (now.sa_sigaction != early_segv) _exit(12); // the program still sees its handler
    _exit(0);
}

TEST(ProgramSignalsEarly, HandlerInstalledBeforeTheAgentKeepsWorking) {
    GTEST_FLAG_SET(death_test_style, "threadsafe"); // a fresh process: no agent handlers yet
    EXPECT_EXIT(handler_installed_before_the_agent(), ::testing::ExitedWithCode(0), "");
}

// A program's own SIGSEGV handler, installed after the probe (through the interposed
// sigaction), sees the fault exactly where it would without the probe.
std::atomic<unsigned long> g_program_seen_ip{0};
void program_segv(int, siginfo_t *info, void *ctx) {
    auto *uc = static_cast<ucontext_t *>(ctx);
    g_program_seen_ip = static_cast<unsigned long>(uc->uc_mcontext.gregs[REG_RIP]);
    (void)info;
    uc->uc_mcontext.gregs[REG_RAX] = -2;
    uc->uc_mcontext.gregs[REG_RIP] += 3;
}

TEST_F(FaultTest, UnhandledSteppedFaultReachesTheProgramsHandler) {
    kprobe kp{};
    kp.addr = reinterpret_cast<kprobe_opcode_t *>(ukpt_load_at_mov);
    kp.fault_handler = fault_unhandled;
    ASSERT_EQ(register_kprobe(&kp), 0);
    struct sigaction act {
    }, old{};
    act.sa_sigaction = program_segv;
    act.sa_flags = SA_SIGINFO;
    ASSERT_EQ(sigaction(SIGSEGV, &act, &old), 0);
    EXPECT_EQ(ukpt_load(kBadPointer), -2);
    EXPECT_EQ(g_faults, 1);
    EXPECT_EQ(g_program_seen_ip, reinterpret_cast<unsigned long>(ukpt_load_at_mov));
    struct sigaction now {};
    ASSERT_EQ(sigaction(SIGSEGV, &old, &now), 0);
    EXPECT_EQ(now.sa_sigaction, program_segv) << "sigaction reports the program's handler";
    unregister_kprobe(&kp);
}

TEST_F(FaultTest, UnhandledSteppedFaultWithDefaultActionKillsLikeWithoutProbes) {
    EXPECT_EXIT(
        {
            kprobe kp{};
            kp.addr = reinterpret_cast<kprobe_opcode_t *>(ukpt_load_at_mov);
            if (register_kprobe(&kp) != 0) _exit(3);
            signal(SIGSEGV, SIG_DFL);
            ukpt_load(kBadPointer);
            _exit(0);
        },
        ::testing::KilledBySignal(SIGSEGV), "");
}

// ---- signals the program uses itself -------------------------------------------------

std::atomic<int> g_trap_handler_calls{0};
std::atomic<int> g_trap_code{0};
void program_trap(int, siginfo_t *info, void *) {
    ++g_trap_handler_calls;
    g_trap_code = info->si_code;
}

struct ProgramSignals : ::testing::Test {
    kprobe kp{};
    void SetUp() override {
        // A registered probe puts the agent's handlers in place first.
        kp.symbol_name = "ukpt_twice";
        ASSERT_EQ(register_kprobe(&kp), 0);
        g_trap_handler_calls = 0;
    }
    void TearDown() override { unregister_kprobe(&kp); }
};

TEST_F(ProgramSignals, ProgramsOwnInt3ReachesItsHandler) {
    struct sigaction act {
    }, old{};
    act.sa_sigaction = program_trap;
    act.sa_flags = SA_SIGINFO;
    ASSERT_EQ(sigaction(SIGTRAP, &act, &old), 0);
    ukpt_int3();
    EXPECT_EQ(g_trap_handler_calls, 1);
    EXPECT_EQ(g_trap_code, SI_KERNEL);
    raise(SIGTRAP);
    EXPECT_EQ(g_trap_handler_calls, 2);
    EXPECT_EQ(ukpt_twice(3), 6) << "probes still work";
    ASSERT_EQ(sigaction(SIGTRAP, &old, nullptr), 0);
}

TEST_F(ProgramSignals, ProgramsOwnInt3WithoutHandlerKills) {
    EXPECT_EXIT(ukpt_int3(), ::testing::KilledBySignal(SIGTRAP), "");
}

std::atomic<int> g_guard_faults{0};
char *g_guard_page = nullptr;
void unprotect_on_fault(int, siginfo_t *info, void *) {
    ++g_guard_faults;
    if (static_cast<char *>(info->si_addr) == g_guard_page) mprotect(g_guard_page, 4096, PROT_READ | PROT_WRITE);
}

TEST_F(ProgramSignals, ProgramHandlesItsOwnSegfaults) {
    g_guard_page = static_cast<char *>(mmap(nullptr, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    ASSERT_NE(g_guard_page, MAP_FAILED);
    struct sigaction act {
    }, old{};
    act.sa_sigaction = unprotect_on_fault;
    act.sa_flags = SA_SIGINFO;
    ASSERT_EQ(sigaction(SIGSEGV, &act, &old), 0);
    *reinterpret_cast<volatile char *>(g_guard_page) = 7; // faults once, then succeeds
    EXPECT_EQ(g_guard_faults, 1);
    EXPECT_EQ(g_guard_page[0], 7);
    ASSERT_EQ(sigaction(SIGSEGV, &old, nullptr), 0);
    munmap(g_guard_page, 4096);
}

TEST_F(ProgramSignals, SignalReturnsThePreviousHandler) {
    auto h1 = [](int) {};
    auto h2 = [](int) {};
    sighandler_t first = signal(SIGBUS, h1);
    EXPECT_EQ(signal(SIGBUS, h2), h1);
    EXPECT_EQ(signal(SIGBUS, first), h2);
}

TEST_F(ProgramSignals, ProgramSegfaultWithDefaultActionDiesBySigsegv) {
    if (UKP_UNDER_ASAN) GTEST_SKIP() << "AddressSanitizer's SIGSEGV handler reports and exits instead";
    EXPECT_EXIT({ *static_cast<volatile long *>(kBadPointer) = 1; }, ::testing::KilledBySignal(SIGSEGV), "");
}

} // namespace
