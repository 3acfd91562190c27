// The jump verdicts decided ahead (core/plans.cpp): plan_jumps() over every function of
// libc, on two threads, agrees with each function's verdict decided alone as opt_prepare
// decides it; the verdicts go to the disk and come back in a process that has none of its
// own (nothing decided again); a damaged entry is not used, and a verdict holds only for
// the bytes it was decided from.
#include "core/core.hpp"
#include "core/registry_internal.hpp"
#include "platform/disk_cache.hpp"
#include "symbols/symbols.hpp"

#include "loaded_object.hpp"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dirent.h>
#include <link.h>
#include <mutex>
#include <sched.h>
#include <string>
#include <vector>

namespace {

namespace core = ukp::core;

using Loaded = ukp::testing::LoadedObject;

std::vector<std::string> plan_entries(const std::string &dir) {
    std::vector<std::string> names;
    if (DIR *d = opendir(dir.c_str())) {
        while (const dirent *e = readdir(d))
            if (std::strncmp(e->d_name, "plans-", 6) == 0) names.push_back(dir + "/" + e->d_name);
        closedir(d);
    }
    return names;
}

class Plans : public ::testing::Test {
protected:
    void SetUp() override {
        char tmpl[] = "/tmp/ukp-plans-XXXXXX";
        ASSERT_NE(mkdtemp(tmpl), nullptr);
        dir_ = tmpl;
        setenv("UKP_CACHE_DIR", dir_.c_str(), 1);
        libc_ = ukp::testing::find_loaded("/libc.so.6");
        ASSERT_FALSE(libc_.path.empty());
        obj_ = ukp::sym::load_object(libc_.path, libc_.bias);
        ASSERT_NE(obj_, nullptr);
        for (const ukp::sym::Symbol &s : obj_->symbols()) // each address once, by the name probes show
            if (s.function && !s.ifunc && s.size > 0 && obj_->function_at(s.value) == &s) functions_.push_back(&s);
        ASSERT_GT(functions_.size(), 1000u);
        for (const ukp::sym::Symbol *s : functions_) addrs_.push_back(s->value);
        ASSERT_EQ(core::prepare_agent(), 0);
        core::forget_plans(libc_.bias); // as in a process that decided none
    }
    void TearDown() override {
        core::forget_plans(libc_.bias);
        unsetenv("UKP_CACHE_DIR");
        const std::string cmd = "rm -rf " + dir_;
        EXPECT_EQ(std::system(cmd.c_str()), 0);
    }

    // The function's code as opt_prepare reads it, and its checksum.
    uint64_t code_of(const ukp::sym::Symbol &fn, std::vector<uint8_t> *code) {
        std::lock_guard lock(core::registry_mutex());
        if (!core::read_function_code(fn.value, fn.size, code)) return 0;
        return ukp::platform::cache_checksum(code->data(), code->size());
    }

    std::string dir_;
    Loaded libc_;
    std::shared_ptr<ukp::sym::Object> obj_;
    std::vector<const ukp::sym::Symbol *> functions_;
    std::vector<uint64_t> addrs_;
};

TEST_F(Plans, AheadAgreeWithEachDecidedAlone) {
    const uint64_t decided = core::plan_stats().decided;
    core::plan_jumps(addrs_);
    EXPECT_GE(core::plan_stats().decided - decided, functions_.size() * 9 / 10);

    const char *path = nullptr;
    const uint64_t eh = core::eh_frame_hdr_of(libc_.bias, &path);
    ASSERT_NE(eh, 0u);
    const auto refs = core::opt_object_refs(functions_[0]->value);
    ASSERT_NE(refs, nullptr);
    size_t compared = 0, jumps = 0, at_registration = 0, passed_over = 0;
    for (const ukp::sym::Symbol *fn : functions_) {
        std::vector<uint8_t> code;
        const uint64_t sum = code_of(*fn, &code);
        if (sum == 0) continue;
        core::RegionPlan ahead;
        const bool found = core::find_plan(libc_.bias, fn->value, fn->value, fn->size, sum, &ahead);
        // None where no probe may go (the agent's own handlers call __errno_location).
        bool refused = false;
        {
            std::lock_guard lock(core::registry_mutex());
            refused = core::is_blacklisted(*obj_, fn, fn->value);
        }
        EXPECT_EQ(found, !refused) << fn->name;
        if (!found) {
            ++passed_over;
            continue;
        }
        // Alone: what opt_prepare decides on a function nobody decided ahead.
        const core::JumpFacts facts = core::jump_facts(fn->value, fn->size, code, eh, core::symbols_inside(*obj_, *fn));
        ukp::arch::OptimizeCheck c;
        if (facts.pads_known) c = ukp::arch::check_region(facts.f, fn->value, facts.entries, 5, refs.get());
        core::RegionPlan alone =
            core::plan_of(c, facts.pads_known && facts.f.start_jumped, libc_.bias, fn->value, fn->size, fn->value, sum);
        if (facts.pads_known && !c.ok && !c.entered_by.empty()) alone.jump = core::RegionPlan::kAtRegistration;
        ++compared;
        jumps += ahead.jump == core::RegionPlan::kJump;
        at_registration += ahead.jump == core::RegionPlan::kAtRegistration;
        EXPECT_EQ(ahead.jump, alone.jump) << fn->name;
        EXPECT_EQ(ahead.start_jumped, alone.start_jumped) << fn->name;
        EXPECT_EQ(ahead.n_insns, alone.n_insns) << fn->name;
        EXPECT_EQ(0, std::memcmp(ahead.insn_offset, alone.insn_offset, sizeof ahead.insn_offset)) << fn->name;
        EXPECT_EQ(ahead.fn_offset, fn->value - libc_.bias);
        EXPECT_EQ(ahead.offset, fn->value - libc_.bias);
    }
    EXPECT_EQ(compared + passed_over, functions_.size());
    EXPECT_LT(passed_over, 10u);
    // libc: nearly every entry takes a jump (docs/performance.md), a few need an island.
    EXPECT_GT(jumps, compared * 9 / 10);
    EXPECT_GT(at_registration, 0u);
    std::printf("%zu functions: %zu with a jump, %zu left to an island\n", compared, jumps, at_registration);
}

TEST_F(Plans, ComeBackFromTheDiskDecidedOnce) {
    core::plan_jumps(addrs_);
    ASSERT_EQ(plan_entries(dir_).size(), 1u);
    // A process with none of its own: every verdict read, none decided again.
    core::forget_plans(libc_.bias);
    const core::PlanStats before = core::plan_stats();
    core::plan_jumps(addrs_);
    EXPECT_EQ(core::plan_stats().objects_loaded, before.objects_loaded + 1);
    EXPECT_EQ(core::plan_stats().decided, before.decided);
    std::vector<uint8_t> code;
    const ukp::sym::Symbol &fn = *functions_[functions_.size() / 2];
    const uint64_t sum = code_of(fn, &code);
    core::RegionPlan p;
    EXPECT_TRUE(core::find_plan(libc_.bias, fn.value, fn.value, fn.size, sum, &p));
    // Other bytes than those it was decided from: no verdict.
    EXPECT_FALSE(core::find_plan(libc_.bias, fn.value, fn.value, fn.size, sum + 1, &p));
    EXPECT_FALSE(core::find_plan(libc_.bias, fn.value, fn.value, fn.size + 1, sum, &p));
}

TEST_F(Plans, OnOneCoreTheSameVerdicts) {
    core::plan_jumps(addrs_);
    std::vector<core::RegionPlan> two;
    std::vector<uint64_t> sums;
    for (const ukp::sym::Symbol *fn : functions_) {
        std::vector<uint8_t> code;
        sums.push_back(code_of(*fn, &code));
        core::RegionPlan p;
        core::find_plan(libc_.bias, fn->value, fn->value, fn->size, sums.back(), &p);
        two.push_back(p);
    }
    // Decided again on this thread alone: no second thread where there is one core.
    cpu_set_t all, one;
    ASSERT_EQ(sched_getaffinity(0, sizeof all, &all), 0);
    CPU_ZERO(&one);
    CPU_SET(sched_getcpu(), &one);
    ASSERT_EQ(sched_setaffinity(0, sizeof one, &one), 0);
    unsetenv("UKP_CACHE_DIR"); // nothing read from the disk
    core::forget_plans(libc_.bias);
    const uint64_t decided = core::plan_stats().decided;
    core::plan_jumps(addrs_);
    sched_setaffinity(0, sizeof all, &all);
    EXPECT_GE(core::plan_stats().decided - decided, functions_.size() * 9 / 10);
    for (size_t i = 0; i < functions_.size(); ++i) {
        const ukp::sym::Symbol &fn = *functions_[i];
        core::RegionPlan p;
        core::find_plan(libc_.bias, fn.value, fn.value, fn.size, sums[i], &p);
        EXPECT_EQ(0, std::memcmp(&p, &two[i], sizeof p)) << fn.name;
    }
}

TEST_F(Plans, ADamagedEntryIsNotUsed) {
    core::plan_jumps(addrs_);
    const std::vector<std::string> names = plan_entries(dir_);
    ASSERT_EQ(names.size(), 1u);
    FILE *f = std::fopen(names[0].c_str(), "r+b");
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(std::fseek(f, -7, SEEK_END), 0);
    const int c = std::fgetc(f);
    ASSERT_EQ(std::fseek(f, -7, SEEK_END), 0);
    std::fputc(c ^ 0x40, f);
    std::fclose(f);
    core::forget_plans(libc_.bias);
    const core::PlanStats before = core::plan_stats();
    core::plan_jumps(addrs_);
    EXPECT_EQ(core::plan_stats().objects_loaded, before.objects_loaded);
    EXPECT_GE(core::plan_stats().decided - before.decided, functions_.size() * 9 / 10);
}

} // namespace
