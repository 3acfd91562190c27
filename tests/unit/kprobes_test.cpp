// The C API of <ukprobes/kprobes.h>: registration rules and return values of kprobes.txt
// and kprobes.rst, handler semantics, many probes on one address, recursion, disable/enable,
// the enabled knob, the list text, and code restored byte for byte.
#include <ukprobes/kprobes.h>

#include "asm_functions.h"
#include "core/core.hpp"
#include "sanitizers.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

extern "C" {
__attribute__((noinline)) int ukt_add(int a, int b) {
    asm volatile("" ::: "memory");
    return a + b;
}
__attribute__((noinline)) int ukt_forty_two(void) {
    asm volatile("" ::: "memory");
    return 42;
}
__attribute__((noinline)) int ukt_blacklisted(int x) {
    asm volatile("" ::: "memory");
    return x + 1;
}
NOKPROBE_SYMBOL(ukt_blacklisted)
long ukt_global_data = 5;
}

namespace {

std::string list() {
    char *text = ukp_kprobes_list();
    std::string s = text != nullptr ? text : "";
    std::free(text);
    return s;
}

// Reads n bytes of the file backing addr's mapping, at addr's file offset.
std::vector<uint8_t> file_bytes(const void *addr, size_t n) {
    const auto a = reinterpret_cast<uint64_t>(addr);
    std::ifstream maps("/proc/self/maps");
    std::string line;
    while (std::getline(maps, line)) {
        unsigned long long lo, hi, off;
        char perms[8];
        char path[4096] = "";
        if (std::sscanf(line.c_str(), "%llx-%llx %7s %llx %*s %*s %4095s", &lo, &hi, perms, &off, path) < 4) continue;
        if (a < lo || a >= hi || path[0] != '/') continue;
        std::ifstream f(path, std::ios::binary);
        f.seekg(static_cast<std::streamoff>(off + (a - lo)));
        std::vector<uint8_t> out(n);
        f.read(reinterpret_cast<char *>(out.data()), static_cast<std::streamsize>(n));
        return out;
    }
    return {};
}

std::vector<uint8_t> memory_bytes(const void *addr, size_t n) {
    const auto *p = static_cast<const uint8_t *>(addr);
    return {p, p + n};
}

struct Recorder {
    std::atomic<int> pre{0}, post{0};
    unsigned long pre_ip = 0, post_ip = 0, pre_di = 0;
};
Recorder g_rec;

int record_pre(kprobe *, pt_regs *regs) {
    ++g_rec.pre;
    g_rec.pre_ip = regs->ip;
    g_rec.pre_di = regs->di;
    return 0;
}
void record_post(kprobe *, pt_regs *regs, unsigned long) {
    ++g_rec.post;
    g_rec.post_ip = regs->ip;
}

class KprobesTest : public ::testing::Test {
protected:
    void SetUp() override {
        g_rec.pre = 0;
        g_rec.post = 0;
        ASSERT_EQ(ukp_kprobes_enabled(), 1);
    }
    void TearDown() override {
        EXPECT_EQ(list(), "") << "a test left probes registered";
        char *report = nullptr;
        EXPECT_EQ(ukp_verify(&report), 0) << "code differs from the files:\n" << report;
        std::free(report);
    }
};

TEST_F(KprobesTest, PreAndPostHandlersSeeTheKernelsRegisterConvention) {
    kprobe kp{};
    kp.symbol_name = "ukt_add";
    kp.pre_handler = record_pre;
    kp.post_handler = record_post;
    ASSERT_EQ(register_kprobe(&kp), 0);
    const auto addr = reinterpret_cast<unsigned long>(&ukt_add);
    EXPECT_EQ(reinterpret_cast<unsigned long>(kp.addr), addr);
    EXPECT_EQ(ukt_add(2, 3), 5);
    EXPECT_EQ(g_rec.pre, 1);
    EXPECT_EQ(g_rec.post, 1);
    EXPECT_EQ(g_rec.pre_ip, addr + 1) << "x86 int3 convention: ip is just past the breakpoint";
    EXPECT_EQ(g_rec.pre_di, 2u);
    EXPECT_GT(g_rec.post_ip, addr) << "post_handler sees the next instruction";
    EXPECT_LT(g_rec.post_ip, addr + 16);
    unregister_kprobe(&kp);
    EXPECT_EQ(ukt_add(2, 3), 5);
    EXPECT_EQ(g_rec.pre, 1) << "no hit after unregister";
}

TEST_F(KprobesTest, SymbolWithObjectNameAndOffset) {
    kprobe kp{};
    kp.symbol_name = "ukpt_branches";
    kp.offset = static_cast<unsigned>(ukpt_branches_at_call - reinterpret_cast<char *>(&ukpt_branches));
    kp.pre_handler = record_pre;
    ASSERT_EQ(register_kprobe(&kp), 0);
    EXPECT_EQ(reinterpret_cast<char *>(kp.addr), ukpt_branches_at_call);
    EXPECT_EQ(ukpt_branches(4), 9);
    EXPECT_EQ(g_rec.pre, 1);
    unregister_kprobe(&kp);

    kprobe libc{};
    libc.symbol_name = "libc.so.6:getpid";
    libc.pre_handler = record_pre;
    ASSERT_EQ(register_kprobe(&libc), 0);
    const int before = g_rec.pre;
    (void)getpid();
    EXPECT_EQ(g_rec.pre, before + 1);
    unregister_kprobe(&libc);
}

TEST_F(KprobesTest, IfuncSymbolsProbeTheChosenImplementation) {
    if (UKP_UNDER_ASAN) GTEST_SKIP() << "the program's strlen is AddressSanitizer's interceptor";
    // strlen is an ifunc in libc: the probe must land in the implementation that runs.
    kprobe kp{};
    kp.symbol_name = "libc.so.6:strlen";
    kp.pre_handler = record_pre;
    ASSERT_EQ(register_kprobe(&kp), 0);
    size_t (*volatile call)(const char *) = std::strlen;
    EXPECT_EQ(call("four"), 4u);
    EXPECT_GE(g_rec.pre, 1);
    EXPECT_EQ(reinterpret_cast<void *>(kp.addr), reinterpret_cast<void *>(call));
    unregister_kprobe(&kp);
}

TEST_F(KprobesTest, ErrorsOfRegistration) {
    kprobe both{};
    both.symbol_name = "ukt_add";
    both.addr = reinterpret_cast<kprobe_opcode_t *>(&ukt_add);
    EXPECT_EQ(register_kprobe(&both), -EINVAL) << "symbol_name and addr both set";
    kprobe neither{};
    EXPECT_EQ(register_kprobe(&neither), -EINVAL);
    EXPECT_EQ(register_kprobe(nullptr), -EINVAL);

    kprobe unknown{};
    unknown.symbol_name = "no_such_function_anywhere";
    EXPECT_EQ(register_kprobe(&unknown), -ENOENT);
    kprobe unknown_in_loaded{};
    unknown_in_loaded.symbol_name = "libc.so.6:no_such_function_anywhere";
    EXPECT_EQ(register_kprobe(&unknown_in_loaded), -ENOENT) << "a loaded object without the symbol";

    kprobe mid{};
    mid.addr = reinterpret_cast<kprobe_opcode_t *>(ukpt_rip_load_at_mov + 1);
    EXPECT_EQ(register_kprobe(&mid), -EILSEQ) << "not an instruction boundary";
    kprobe data{};
    data.addr = reinterpret_cast<kprobe_opcode_t *>(&ukt_global_data);
    EXPECT_EQ(register_kprobe(&data), -EILSEQ) << "not executable code";
    std::vector<char> heap(64, '\x90');
    kprobe on_heap{};
    on_heap.addr = reinterpret_cast<kprobe_opcode_t *>(heap.data());
    EXPECT_EQ(register_kprobe(&on_heap), -EILSEQ);

    kprobe on_int3{};
    on_int3.symbol_name = "ukpt_int3"; // its first instruction is the program's own int3
    EXPECT_EQ(register_kprobe(&on_int3), -EOPNOTSUPP) << "cannot run anywhere but where it is";

    kprobe once{};
    once.symbol_name = "ukt_add";
    ASSERT_EQ(register_kprobe(&once), 0);
    EXPECT_EQ(register_kprobe(&once), -EINVAL) << "registered twice";
    unregister_kprobe(&once);
}

TEST_F(KprobesTest, Blacklist) {
    kprobe self{};
    self.addr = reinterpret_cast<kprobe_opcode_t *>(&register_kprobe);
    EXPECT_EQ(register_kprobe(&self), -EINVAL) << "the agent cannot probe itself";
    kprobe nok{};
    nok.symbol_name = "ukt_blacklisted";
    EXPECT_EQ(register_kprobe(&nok), -EINVAL) << "NOKPROBE_SYMBOL";
    kprobe restorer{};
    restorer.symbol_name = "libc.so.6:__restore_rt";
    const int r = register_kprobe(&restorer);
    EXPECT_TRUE(r == -EINVAL || r == -ENOENT) << r;
}

TEST_F(KprobesTest, UnqualifiedNamesSkipTheAgentsInterposers) {
    // The agent defines sigaction (to keep its place); "sigaction" still means libc's.
    kprobe kp{};
    kp.symbol_name = "sigaction";
    kp.pre_handler = record_pre;
    ASSERT_EQ(register_kprobe(&kp), 0);
    Dl_info info{};
    ASSERT_NE(dladdr(reinterpret_cast<void *>(kp.addr), &info), 0);
    // libc's, or the sanitizer runtime's interceptor that the program calls first.
    const std::string object = info.dli_fname;
    EXPECT_TRUE(object.find("libc.so") != std::string::npos || object.find("libasan") != std::string::npos) << object;
    unregister_kprobe(&kp);
}

TEST_F(KprobesTest, UnregisteringAnUnknownProbeClearsItsAddr) {
    kprobe kp{};
    kp.addr = reinterpret_cast<kprobe_opcode_t *>(&ukt_add);
    unregister_kprobe(&kp);
    EXPECT_EQ(kp.addr, nullptr);
    EXPECT_EQ(disable_kprobe(&kp), -EINVAL);
    EXPECT_EQ(enable_kprobe(&kp), -EINVAL);
}

std::vector<int> g_order;
int order_a(kprobe *, pt_regs *) {
    g_order.push_back(1);
    return 0;
}
int order_b(kprobe *, pt_regs *) {
    g_order.push_back(2);
    return 0;
}
int order_c(kprobe *, pt_regs *) {
    g_order.push_back(3);
    return 0;
}

TEST_F(KprobesTest, ManyProbesOnOneAddressRunInRegistrationOrder) {
    kprobe a{}, b{}, c{};
    a.symbol_name = b.symbol_name = c.symbol_name = "ukt_add";
    a.pre_handler = order_a;
    b.pre_handler = order_b;
    c.pre_handler = order_c;
    ASSERT_EQ(register_kprobe(&b), 0);
    ASSERT_EQ(register_kprobe(&a), 0);
    ASSERT_EQ(register_kprobe(&c), 0);
    g_order.clear();
    EXPECT_EQ(ukt_add(1, 1), 2);
    EXPECT_EQ(g_order, (std::vector<int>{2, 1, 3}));
    unregister_kprobe(&a);
    g_order.clear();
    EXPECT_EQ(ukt_add(1, 1), 2);
    EXPECT_EQ(g_order, (std::vector<int>{2, 3}));
    kprobe *both[] = {&b, &c};
    unregister_kprobes(both, 2);
    g_order.clear();
    EXPECT_EQ(ukt_add(1, 1), 2);
    EXPECT_TRUE(g_order.empty());
}

int recurse_pre(kprobe *p, pt_regs *) {
    ++g_rec.pre;
    // A probe hit while this thread runs a handler: its handlers are skipped.
    (void)ukt_add(1, 2);
    (void)p;
    return 0;
}

TEST_F(KprobesTest, RecursionCountsMissed) {
    kprobe kp{};
    kp.symbol_name = "ukt_add";
    kp.pre_handler = recurse_pre;
    ASSERT_EQ(register_kprobe(&kp), 0);
    EXPECT_EQ(ukt_add(3, 4), 7);
    EXPECT_EQ(g_rec.pre, 1);
    EXPECT_EQ(kp.nmissed, 1u);
    EXPECT_EQ(ukt_add(3, 4), 7);
    EXPECT_EQ(kp.nmissed, 2u);
    unregister_kprobe(&kp);
}

// The agent's own work (its control thread, the trace files read through the API) calls
// libc like anyone: a probe there must neither fire nor count a miss.
TEST_F(KprobesTest, HitsInTheAgentsOwnWorkRunNoHandlerAndCountNothing) {
    kprobe kp{};
    kp.symbol_name = "ukt_add";
    kp.pre_handler = record_pre;
    kp.post_handler = record_post;
    ASSERT_EQ(register_kprobe(&kp), 0);
    {
        const ukp::core::AgentWork quiet;
        EXPECT_EQ(ukt_add(3, 4), 7);
        {
            const ukp::core::AgentWork nested;
            EXPECT_EQ(ukt_add(1, 1), 2);
        }
        EXPECT_EQ(ukt_add(2, 2), 4);
    }
    EXPECT_EQ(g_rec.pre, 0);
    EXPECT_EQ(g_rec.post, 0);
    EXPECT_EQ(kp.nmissed, 0u);
    EXPECT_EQ(ukt_add(3, 4), 7); // the program's own call, after
    EXPECT_EQ(g_rec.pre, 1);
    EXPECT_EQ(g_rec.post, 1);
    unregister_kprobe(&kp);
}

int change_arg(kprobe *, pt_regs *regs) {
    regs->di = 100; // every register change is applied
    return 0;
}

TEST_F(KprobesTest, RegisterChangesAreApplied) {
    kprobe kp{};
    kp.symbol_name = "ukt_add";
    kp.pre_handler = change_arg;
    ASSERT_EQ(register_kprobe(&kp), 0);
    EXPECT_EQ(ukt_add(1, 2), 102);
    unregister_kprobe(&kp);
    EXPECT_EQ(ukt_add(1, 2), 3);
}

void post_adds_one(kprobe *, pt_regs *regs, unsigned long) { regs->ax += 1; }

// After `lea (%rdi,%rdi),%rax`: return 77 to the caller at once (ip and sp both change).
void post_returns_early(kprobe *, pt_regs *regs, unsigned long) {
    regs->ax = 77;
    regs->ip = *reinterpret_cast<unsigned long *>(regs->sp);
    regs->sp += 8;
}

TEST_F(KprobesTest, PostHandlerChangesAreApplied) {
    kprobe kp{};
    kp.symbol_name = "ukpt_twice";
    kp.post_handler = post_adds_one;
    ASSERT_EQ(register_kprobe(&kp), 0);
    EXPECT_EQ(ukpt_twice(4), 9);
    unregister_kprobe(&kp);
    kp = kprobe{};
    kp.symbol_name = "ukpt_twice";
    kp.post_handler = post_returns_early;
    ASSERT_EQ(register_kprobe(&kp), 0);
    EXPECT_EQ(ukpt_twice(4), 77);
    EXPECT_EQ(ukpt_branches(4), 78) << "returned into the caller, which adds one";
    unregister_kprobe(&kp);
    EXPECT_EQ(ukpt_twice(4), 8);
}

// Fault injection as in kprobes.rst, "Changing Execution Path": return 7 from the
// function without running it.
int skip_function(kprobe *, pt_regs *regs) {
    regs->ax = 7;
    regs->ip = *reinterpret_cast<unsigned long *>(regs->sp);
    regs->sp += 8;
    return 1;
}

TEST_F(KprobesTest, ChangingExecutionPath) {
    kprobe kp{};
    kp.symbol_name = "ukt_forty_two";
    kp.pre_handler = skip_function;
    kp.post_handler = record_post;
    ASSERT_EQ(register_kprobe(&kp), 0);
    EXPECT_EQ(ukt_forty_two(), 7);
    EXPECT_EQ(g_rec.post, 0) << "no post_handler after a changed execution path";
    unregister_kprobe(&kp);
    EXPECT_EQ(ukt_forty_two(), 42);
}

TEST_F(KprobesTest, DisableEnableAndRegisteredDisabled) {
    kprobe kp{};
    kp.symbol_name = "ukt_add";
    kp.pre_handler = record_pre;
    kp.flags = KPROBE_FLAG_DISABLED;
    ASSERT_EQ(register_kprobe(&kp), 0);
    const auto addr = reinterpret_cast<const void *>(&ukt_add);
    EXPECT_EQ(memory_bytes(addr, 16), file_bytes(addr, 16)) << "a disabled probe is not armed";
    EXPECT_EQ(ukt_add(1, 1), 2);
    EXPECT_EQ(g_rec.pre, 0);
    EXPECT_NE(list().find("[DISABLED]"), std::string::npos);
    ASSERT_EQ(enable_kprobe(&kp), 0);
    EXPECT_EQ(ukt_add(1, 1), 2);
    EXPECT_EQ(g_rec.pre, 1);
    EXPECT_EQ(list().find("[DISABLED]"), std::string::npos);
    ASSERT_EQ(disable_kprobe(&kp), 0);
    EXPECT_EQ(ukt_add(1, 1), 2);
    EXPECT_EQ(g_rec.pre, 1);
    unregister_kprobe(&kp);
}

TEST_F(KprobesTest, GlobalEnabledKnobKeepsEachProbesOwnState) {
    kprobe on{}, off{};
    on.symbol_name = "ukt_add";
    on.pre_handler = record_pre;
    off.symbol_name = "ukt_forty_two";
    off.pre_handler = record_pre;
    off.flags = KPROBE_FLAG_DISABLED;
    ASSERT_EQ(register_kprobe(&on), 0);
    ASSERT_EQ(register_kprobe(&off), 0);
    ASSERT_EQ(ukp_set_kprobes_enabled(0), 0);
    EXPECT_EQ(ukp_kprobes_enabled(), 0);
    const auto addr = reinterpret_cast<const void *>(&ukt_add);
    EXPECT_EQ(memory_bytes(addr, 16), file_bytes(addr, 16)) << "disarmed";
    ukt_add(1, 1);
    EXPECT_EQ(g_rec.pre, 0);
    ASSERT_EQ(ukp_set_kprobes_enabled(1), 0);
    ukt_add(1, 1);
    ukt_forty_two();
    EXPECT_EQ(g_rec.pre, 1) << "the disabled probe stays disabled";
    unregister_kprobe(&on);
    unregister_kprobe(&off);
}

TEST_F(KprobesTest, ListText) {
    kprobe kp{};
    kp.symbol_name = "ukpt_branches";
    kp.offset = static_cast<unsigned>(ukpt_branches_at_jcc - reinterpret_cast<char *>(&ukpt_branches));
    ASSERT_EQ(register_kprobe(&kp), 0);
    const std::string text = list();
    // [OPTIMIZED] once the background optimizer got to it (a jcc at that offset may qualify).
    const std::regex row("[0-9a-f]{16}  k  ukpt_branches\\+0x([0-9a-f]+)  kprobes_test (\\[OPTIMIZED\\])?\n");
    std::smatch m;
    ASSERT_TRUE(std::regex_match(text, m, row)) << text;
    EXPECT_EQ(std::stoul(m[1].str(), nullptr, 16), kp.offset);
    EXPECT_EQ(text.substr(0, 16), [&] {
        char b[17];
        std::snprintf(b, sizeof b, "%016lx", reinterpret_cast<unsigned long>(kp.addr));
        return std::string(b);
    }());
    unregister_kprobe(&kp);
}

TEST_F(KprobesTest, BatchRegistrationUndoesOnFailure) {
    kprobe good{}, bad{};
    good.symbol_name = "ukt_add";
    good.pre_handler = record_pre;
    bad.symbol_name = "no_such_function_anywhere";
    kprobe *kps[] = {&good, &bad};
    EXPECT_EQ(register_kprobes(kps, 2), -ENOENT);
    EXPECT_EQ(list(), "");
    ukt_add(1, 1);
    EXPECT_EQ(g_rec.pre, 0);
    EXPECT_EQ(register_kprobes(kps, 0), -EINVAL);
    good.addr = nullptr; // filled in by the registration above
    kprobe good2{};
    good2.symbol_name = "ukt_forty_two";
    kprobe *ok[] = {&good, &good2};
    ASSERT_EQ(register_kprobes(ok, 2), 0);
    unregister_kprobes(ok, 2);
}

TEST_F(KprobesTest, VerifyCountsOnlyBytesNoProbeOwns) {
    kprobe kp{};
    kp.symbol_name = "ukt_add";
    ASSERT_EQ(register_kprobe(&kp), 0);
    EXPECT_EQ(ukp_verify(nullptr), 0) << "an armed probe's int3 is its own";
    unregister_kprobe(&kp);
    // A change nobody owns: write a byte of a function through /proc/self/mem.
    const auto *fn = reinterpret_cast<const uint8_t *>(&ukt_forty_two);
    const uint8_t original = fn[0];
    const uint8_t changed = static_cast<uint8_t>(original ^ 0x01);
    FILE *mem = std::fopen("/proc/self/mem", "r+b");
    ASSERT_NE(mem, nullptr);
    auto poke = [&](uint8_t b) {
        std::fseek(mem, static_cast<long>(reinterpret_cast<uintptr_t>(fn)), SEEK_SET);
        std::fwrite(&b, 1, 1, mem);
        std::fflush(mem);
    };
    poke(changed);
    char *report = nullptr;
    EXPECT_EQ(ukp_verify(&report), 1);
    EXPECT_NE(std::string(report).find("kprobes_test+0x"), std::string::npos) << report;
    std::free(report);
    poke(original);
    std::fclose(mem);
    EXPECT_EQ(ukp_verify(nullptr), 0);
}

TEST_F(KprobesTest, CodeIsByteIdenticalToTheFileAfterUnregister) {
    const void *fns[] = {reinterpret_cast<void *>(&ukpt_branches), reinterpret_cast<void *>(&ukpt_rip_load),
                         reinterpret_cast<void *>(&ukt_add)};
    std::vector<kprobe> kps(3);
    kps[0].addr = reinterpret_cast<kprobe_opcode_t *>(ukpt_branches_at_call);
    kps[1].addr = reinterpret_cast<kprobe_opcode_t *>(ukpt_rip_load_at_store);
    kps[2].symbol_name = "ukt_add";
    for (auto &kp : kps) ASSERT_EQ(register_kprobe(&kp), 0);
    EXPECT_NE(memory_bytes(ukpt_branches_at_call, 1)[0], file_bytes(ukpt_branches_at_call, 1)[0]);
    for (auto &kp : kps) unregister_kprobe(&kp);
    for (const void *fn : fns) EXPECT_EQ(memory_bytes(fn, 32), file_bytes(fn, 32));
}

} // namespace
