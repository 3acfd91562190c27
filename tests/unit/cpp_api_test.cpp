// The C++ API: RAII handles, lambdas as handlers, the same rules as the C API.
#include <ukprobes/ukprobes.hpp>

#include "asm_functions.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <string>

namespace ns {
__attribute__((noinline)) int scaled(int x, int factor) {
    asm volatile("" ::: "memory");
    return x * factor;
}
} // namespace ns

namespace {

std::string list() {
    char *text = ukp_kprobes_list();
    std::string s = text != nullptr ? text : "";
    std::free(text);
    return s;
}

TEST(CppApi, LambdasSeeAndChangeRegisters) {
    std::atomic<int> pre{0}, post{0};
    {
        auto probe = ukp::Kprobe::at("ns::scaled", {
                                                       .pre =
                                                           [&](pt_regs &regs) {
                                                               ++pre;
                                                               regs.si = 10; // second argument
                                                               return 0;
                                                           },
                                                       .post = [&](pt_regs &) { ++post; },
                                                   });
        ASSERT_TRUE(probe) << probe.error();
        EXPECT_EQ(probe.address(), reinterpret_cast<void *>(&ns::scaled));
        EXPECT_EQ(ns::scaled(3, 2), 30);
        EXPECT_EQ(pre, 1);
        EXPECT_EQ(post, 1);
        ASSERT_EQ(probe.disable(), 0);
        EXPECT_EQ(ns::scaled(3, 2), 6);
        ASSERT_EQ(probe.enable(), 0);
        EXPECT_EQ(ns::scaled(3, 2), 30);
    } // the handle's destructor unregisters
    EXPECT_EQ(list(), "");
    EXPECT_EQ(ns::scaled(3, 2), 6);
    EXPECT_EQ(pre, 2);
}

TEST(CppApi, ErrorsAreReturnedNotThrown) {
    auto missing = ukp::Kprobe::at("no_such_symbol_here", {.pre = [](pt_regs &) { return 0; }});
    EXPECT_FALSE(missing);
    EXPECT_EQ(missing.error(), -ENOENT);
    auto mid = ukp::Kprobe::at(static_cast<const void *>(ukpt_rip_load_at_mov + 1), {});
    EXPECT_EQ(mid.error(), -EILSEQ);
}

TEST(CppApi, MovedHandlesKeepTheProbe) {
    std::atomic<int> hits{0};
    ukp::Kprobe outer;
    {
        auto inner = ukp::Kprobe::at(reinterpret_cast<const void *>(&ukpt_twice), {.pre = [&](pt_regs &) {
                                         ++hits;
                                         return 0;
                                     }});
        ASSERT_TRUE(inner);
        outer = std::move(inner);
    }
    EXPECT_EQ(ukpt_twice(4), 8);
    EXPECT_EQ(hits, 1);
    outer.reset();
    EXPECT_EQ(ukpt_twice(4), 8);
    EXPECT_EQ(hits, 1);
}

TEST(CppApi, FaultLambda) {
    std::atomic<int> trap{-1};
    auto probe =
        ukp::Kprobe::at(reinterpret_cast<const void *>(ukpt_load_at_mov), {.fault = [&](pt_regs &regs, int trapnr) {
                            trap = trapnr;
                            regs.ax = 5;
                            regs.ip += 3;
                            return 1;
                        }});
    ASSERT_TRUE(probe);
    long *volatile bad = nullptr;
    EXPECT_EQ(ukpt_load(bad), 5);
    EXPECT_EQ(trap, 14);
}

__attribute__((noinline)) int cpp_divide(int a, int b) {
    asm volatile("" ::: "memory");
    return b == 0 ? -1 : a / b;
}

TEST(CppApi, KretprobeLambdasWithPrivateData) {
    std::atomic<int> failures{0};
    int last = 0;
    {
        auto rp = ukp::Kretprobe::at(reinterpret_cast<const void *>(&cpp_divide),
                                     {
                                         .entry =
                                             [](kretprobe_instance &ri, pt_regs &regs) {
                                                 *reinterpret_cast<long *>(ri.data) =
                                                     static_cast<long>(regs.si); // the divisor
                                                 return 0;
                                             },
                                         .ret =
                                             [&](kretprobe_instance &ri, pt_regs &regs) {
                                                 last = static_cast<int>(regs_return_value(&regs));
                                                 if (*reinterpret_cast<long *>(ri.data) == 0) ++failures;
                                             },
                                     },
                                     {.maxactive = 4, .data_size = sizeof(long)});
        ASSERT_TRUE(rp) << rp.error();
        EXPECT_EQ(cpp_divide(10, 2), 5);
        EXPECT_EQ(last, 5);
        EXPECT_EQ(cpp_divide(10, 0), -1);
        EXPECT_EQ(last, -1);
        EXPECT_EQ(failures, 1);
        EXPECT_EQ(rp.nmissed(), 0);
    }
    EXPECT_EQ(list(), "");
    EXPECT_EQ(cpp_divide(9, 3), 3);
    EXPECT_EQ(last, -1) << "unregistered by the destructor";
    auto missing = ukp::Kretprobe::at("no_such_symbol_here", {});
    EXPECT_EQ(missing.error(), -ENOENT);
}

} // namespace
