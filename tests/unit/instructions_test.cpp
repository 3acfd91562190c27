// Probes on each kind of instruction give the same results as unprobed execution, with
// and without a post_handler (the "boosted" path), and post_handler sees the address
// the instruction really continued at.
#include <ukprobes/kprobes.h>

#include "asm_functions.h"

#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <string>

namespace {

std::atomic<int> g_pre{0}, g_post{0};
unsigned long g_post_ip = 0;

int count_pre(kprobe *, pt_regs *) {
    ++g_pre;
    return 0;
}
void count_post(kprobe *, pt_regs *regs, unsigned long) {
    ++g_post;
    g_post_ip = regs->ip;
}

struct Case {
    const char *name;
    char *site;
    std::function<long()> run;
    long expected;
    // Where post_handler must see ip: 0 = the next instruction (site + length unknown here,
    // so only checked to lie after the site), else this exact address.
    std::function<unsigned long()> post_ip;
};

long identity(long x) { return x + 1000; }

std::vector<Case> cases() {
    auto at = [](const char *p) { return [p] { return reinterpret_cast<unsigned long>(p); }; };
    auto fn = [](auto f) { return [f] { return reinterpret_cast<unsigned long>(f); }; };
    return {
        {"rip_load", ukpt_rip_load_at_mov, [] { return ukpt_rip_load(); }, 0x1234 * 2, at(ukpt_rip_load_at_store)},
        {"rip_store", ukpt_rip_load_at_store,
         [] {
             ukpt_data_copy = 0;
             ukpt_rip_load();
             return ukpt_data_copy;
         },
         0x1234, at(ukpt_rip_load_at_lea)},
        {"rip_lea", ukpt_rip_load_at_lea, [] { return ukpt_rip_load(); }, 0x1234 * 2, nullptr},
        {"test", ukpt_branches_at_test, [] { return ukpt_branches(5); }, 11, at(ukpt_branches_at_jcc)},
        // SF=1 from the probed test must reach the jcc: the flags survive the copy and the
        // post trampoline.
        {"test_negative", ukpt_branches_at_test, [] { return ukpt_branches(-5); }, -1, at(ukpt_branches_at_jcc)},
        {"jcc_not_taken", ukpt_branches_at_jcc, [] { return ukpt_branches(5); }, 11, at(ukpt_branches_at_call)},
        {"jcc_taken", ukpt_branches_at_jcc, [] { return ukpt_branches(-5); }, -1, nullptr},
        {"call", ukpt_branches_at_call, [] { return ukpt_branches(7); }, 15, fn(&ukpt_twice)},
        {"inc", ukpt_branches_at_inc, [] { return ukpt_branches(7); }, 15, at(ukpt_branches_at_jmp)},
        {"jmp", ukpt_branches_at_jmp, [] { return ukpt_branches(7); }, 15, at(ukpt_branches_at_ret)},
        {"ret", ukpt_branches_at_ret, [] { return ukpt_branches(7); }, 15, nullptr},
        {"call_indirect", ukpt_indirect_at_call, [] { return ukpt_indirect(identity, 1); }, 2002, fn(&identity)},
        {"jmp_indirect", ukpt_indirect_at_jmp, [] { return ukpt_indirect(identity, 1); }, 2002, fn(&ukpt_twice)},
        {"jrcxz_taken", ukpt_loop_at_jrcxz, [] { return ukpt_loop(0); }, 0, nullptr},
        {"jrcxz_not_taken", ukpt_loop_at_jrcxz, [] { return ukpt_loop(10); }, 55, nullptr},
        {"loop", ukpt_loop_at_loop, [] { return ukpt_loop(10); }, 55, nullptr},
        {"red_zone_nop", ukpt_red_zone_at_nop, [] { return ukpt_red_zone(3); }, 3 + 0x5a5a5a5a,
         at(ukpt_red_zone_at_xor)},
        {"red_zone_xor", ukpt_red_zone_at_xor, [] { return ukpt_red_zone(3); }, 3 + 0x5a5a5a5a, nullptr},
        {"syscall_rcx", ukpt_syscall_rcx_at_syscall, [] { return ukpt_syscall_rcx(); }, 0, nullptr},
        {"load", ukpt_load_at_mov,
         [] {
             long v = 77;
             return ukpt_load(&v);
         },
         77, nullptr},
    };
}

class InstructionTest : public ::testing::TestWithParam<bool> {};

TEST_P(InstructionTest, SameResultsAsUnprobed) {
    const bool with_post = GetParam();
    for (const Case &c : cases()) {
        SCOPED_TRACE(c.name);
        const long unprobed = c.run();
        ASSERT_EQ(unprobed, c.expected);
        kprobe kp{};
        kp.addr = reinterpret_cast<kprobe_opcode_t *>(c.site);
        kp.pre_handler = count_pre;
        if (with_post) kp.post_handler = count_post;
        ASSERT_EQ(register_kprobe(&kp), 0);
        g_pre = 0;
        g_post = 0;
        g_post_ip = 0;
        const long probed = c.run();
        unregister_kprobe(&kp);
        EXPECT_EQ(probed, unprobed);
        EXPECT_GE(g_pre, 1);
        if (with_post) {
            EXPECT_EQ(g_post, g_pre);
            if (c.post_ip) {
                EXPECT_EQ(g_post_ip, c.post_ip());
            }
        }
    }
}

INSTANTIATE_TEST_SUITE_P(PostHandler, InstructionTest, ::testing::Bool(),
                         [](const auto &info) { return info.param ? "with_post" : "boosted"; });

} // namespace
