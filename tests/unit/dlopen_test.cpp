// Libraries that come and go: a probe on "MOD:sym" of an object not loaded yet is
// armed when dlopen() maps it, before any of its code runs; dlclose() leaves it [GONE];
// loading the object again re-arms it.
#include <ukprobes/kprobes.h>

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <dlfcn.h>
#include <string>

namespace {

std::atomic<int> g_hits{0};
std::atomic<long> g_last_arg{0};

int count_hit(kprobe *, pt_regs *regs) {
    ++g_hits;
    g_last_arg = static_cast<long>(regs->di);
    return 0;
}

std::string list() {
    char *text = ukp_kprobes_list();
    std::string s = text != nullptr ? text : "";
    std::free(text);
    return s;
}

constexpr const char *kSpec = "libukp_dl_target.so:ukp_dl_fn";

TEST(Dlopen, PendingProbeIsArmedBeforeTheLibrarysConstructorRuns) {
    g_hits = 0;
    ASSERT_EQ(dlopen(UKP_DL_TARGET, RTLD_NOW | RTLD_NOLOAD), nullptr) << "the library must not be loaded yet";
    kprobe kp{};
    kp.symbol_name = kSpec;
    kp.pre_handler = count_hit;
    ASSERT_EQ(register_kprobe(&kp), 0) << "accepted as pending";
    EXPECT_EQ(kp.addr, nullptr);
    EXPECT_NE(list().find("ukp_dl_fn+0x0  libukp_dl_target.so [GONE]"), std::string::npos) << list();

    void *lib = dlopen(UKP_DL_TARGET, RTLD_NOW);
    ASSERT_NE(lib, nullptr) << dlerror();
    EXPECT_EQ(g_hits, 1) << "the constructor's call was probed";
    EXPECT_EQ(g_last_arg, 14);
    auto fn = reinterpret_cast<int (*)(int)>(dlsym(lib, "ukp_dl_fn"));
    ASSERT_NE(fn, nullptr);
    EXPECT_EQ(reinterpret_cast<void *>(kp.addr), reinterpret_cast<void *>(fn));
    EXPECT_EQ(fn(5), 15);
    EXPECT_EQ(g_hits, 2);
    EXPECT_EQ(list().find("[GONE]"), std::string::npos) << list();

    // Unloaded: the probe stays registered, marked [GONE].
    ASSERT_EQ(dlclose(lib), 0);
    ASSERT_EQ(dlopen(UKP_DL_TARGET, RTLD_NOW | RTLD_NOLOAD), nullptr) << "really unloaded";
    EXPECT_NE(kp.flags & KPROBE_FLAG_GONE, 0u);
    EXPECT_NE(list().find("libukp_dl_target.so [GONE]"), std::string::npos) << list();
    EXPECT_EQ(disable_kprobe(&kp), -EINVAL) << "a gone probe cannot be disabled";

    // Loaded again (possibly elsewhere): armed again.
    lib = dlopen(UKP_DL_TARGET, RTLD_NOW);
    ASSERT_NE(lib, nullptr);
    EXPECT_EQ(g_hits, 3) << "the constructor's call, again";
    fn = reinterpret_cast<int (*)(int)>(dlsym(lib, "ukp_dl_fn"));
    EXPECT_EQ(fn(2), 6);
    EXPECT_EQ(g_hits, 4);
    EXPECT_EQ(kp.flags & KPROBE_FLAG_GONE, 0u);
    EXPECT_EQ(reinterpret_cast<void *>(kp.addr), reinterpret_cast<void *>(fn));

    unregister_kprobe(&kp);
    EXPECT_EQ(list(), "");
    EXPECT_EQ(fn(2), 6);
    EXPECT_EQ(g_hits, 4);
    dlclose(lib);
}

TEST(Dlopen, UnregisteringAPendingProbe) {
    kprobe kp{};
    kp.symbol_name = kSpec;
    kp.pre_handler = count_hit;
    ASSERT_EQ(register_kprobe(&kp), 0);
    unregister_kprobe(&kp);
    EXPECT_EQ(list(), "");
    g_hits = 0;
    void *lib = dlopen(UKP_DL_TARGET, RTLD_NOW);
    ASSERT_NE(lib, nullptr);
    EXPECT_EQ(g_hits, 0) << "an unregistered pending probe is not armed";
    dlclose(lib);
}

TEST(Dlopen, ProbeByAddressStaysGoneAfterUnload) {
    void *lib = dlopen(UKP_DL_TARGET, RTLD_NOW);
    ASSERT_NE(lib, nullptr);
    kprobe kp{};
    kp.addr = static_cast<kprobe_opcode_t *>(dlsym(lib, "ukp_dl_fn"));
    kp.pre_handler = count_hit;
    ASSERT_EQ(register_kprobe(&kp), 0);
    ASSERT_EQ(dlclose(lib), 0);
    EXPECT_NE(kp.flags & KPROBE_FLAG_GONE, 0u);
    g_hits = 0;
    lib = dlopen(UKP_DL_TARGET, RTLD_NOW);
    EXPECT_EQ(g_hits, 0) << "an address means nothing in a new mapping";
    unregister_kprobe(&kp);
    dlclose(lib);
}

TEST(Dlopen, TheEnabledKnobDoesNotStopObjectTracking) {
    kprobe kp{};
    kp.symbol_name = kSpec;
    kp.pre_handler = count_hit;
    ASSERT_EQ(register_kprobe(&kp), 0);
    ASSERT_EQ(ukp_set_kprobes_enabled(0), 0);
    void *lib = dlopen(UKP_DL_TARGET, RTLD_NOW);
    ASSERT_NE(lib, nullptr);
    EXPECT_EQ(kp.flags & KPROBE_FLAG_GONE, 0u) << "resolved while kprobes were off";
    g_hits = 0;
    ASSERT_EQ(ukp_set_kprobes_enabled(1), 0);
    auto fn = reinterpret_cast<int (*)(int)>(dlsym(lib, "ukp_dl_fn"));
    EXPECT_EQ(fn(1), 3);
    EXPECT_EQ(g_hits, 1);
    unregister_kprobe(&kp);
    dlclose(lib);
}

} // namespace
