// Libraries that come and go: a probe on "MOD:sym" of an object not loaded yet is
// armed when dlopen() maps it, before any of its code runs; dlclose() leaves it [GONE];
// loading the object again re-arms it.
#include <ukprobes/hw_breakpoint.h>
#include <ukprobes/kprobes.h>

#include "arch/x86_64/region.hpp"
#include "platform/disk_cache.hpp"

#include "sanitizers.h"

#include <gtest/gtest.h>

#include <atomic>
#include <csignal>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <dirent.h>
#include <dlfcn.h>
#include <filesystem>
#include <pthread.h>
#include <string>
#include <sys/mman.h>
#include <thread>
#include <sys/wait.h>
#include <unistd.h>

namespace {

std::atomic<int> g_hits{0};
std::atomic<long> g_last_arg{0};

int count_hit(kprobe *, pt_regs *regs) {
    ++g_hits;
    g_last_arg = static_cast<long>(regs->di);
    return 0;
}

// Waits up to a minute for child to end: false (and the child killed) if it did not.
bool wait_for_child(pid_t child, int *status) {
    for (int waited_ms = 0; waited_ms < 60000; waited_ms += 10) {
        if (waitpid(child, status, WNOHANG) == child) return true;
        usleep(10 * 1000);
    }
    kill(child, SIGKILL);
    waitpid(child, status, 0);
    return false;
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

// ---- a program with a small alternate signal stack ----

std::atomic<int> g_usr1{0};
std::atomic<bool> g_stop_signals{false};

void on_usr1(int) {
    volatile char scratch[512]; // some use of the stack it lands on
    std::memset(const_cast<char *>(scratch), 1, sizeof scratch);
    ++g_usr1;
}

void *send_usr1(void *target) {
    while (!g_stop_signals) {
        pthread_kill(*static_cast<pthread_t *>(target), SIGUSR1);
        usleep(50);
    }
    return nullptr;
}

// Loads and unloads the library 20 times with a pending probe on it, on a thread whose
// alternate signal stack is 12 KiB over a guard page, while SIGUSR1 (handled on that
// stack) keeps arriving. 0 when every load's constructor call was probed. Under
// AddressSanitizer, whose instrumentation makes every frame larger, 36 KiB: 12 KiB
// overflowed in 9 runs of 30 there (the nested handlers), none in 30 with 36.
int load_on_a_small_alternate_stack() {
    const size_t page = static_cast<size_t>(getpagesize()), size = (UKP_UNDER_ASAN ? 36 : 12) * 1024;
    auto *mem =
        static_cast<char *>(mmap(nullptr, page + size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    if (mem == MAP_FAILED || mprotect(mem, page, PROT_NONE) != 0) return 10;
    stack_t ss{};
    ss.ss_sp = mem + page;
    ss.ss_size = size;
    if (sigaltstack(&ss, nullptr) != 0) return 11;
    struct sigaction act {};
    act.sa_handler = on_usr1;
    act.sa_flags = SA_ONSTACK | SA_RESTART;
    sigemptyset(&act.sa_mask);
    if (sigaction(SIGUSR1, &act, nullptr) != 0) return 12;
    kprobe kp{};
    kp.symbol_name = kSpec;
    kp.pre_handler = count_hit;
    if (register_kprobe(&kp) != 0) return 13;
    pthread_t self = pthread_self(), sender;
    if (pthread_create(&sender, nullptr, send_usr1, &self) != 0) return 14;
    // The signals are coming before the loads start (on a loaded machine the sender may
    // not have run yet when 20 loads are over).
    for (int i = 0; i < 5000 && g_usr1 == 0; ++i) usleep(1000);
    g_hits = 0;
    int loads = 0;
    for (; loads < 20; ++loads) {
        void *lib = dlopen(UKP_DL_TARGET, RTLD_NOW);
        if (lib == nullptr || dlclose(lib) != 0) break;
    }
    g_stop_signals = true;
    pthread_join(sender, nullptr);
    unregister_kprobe(&kp);
    if (loads != 20) return 15;
    if (g_usr1 == 0) return 17; // the signals must have come
    return g_hits == 20 ? 0 : 16;
}

TEST(Dlopen, TheLoaderEventFitsASmallAlternateSignalStack) {
    ASSERT_EQ(dlopen(UKP_DL_TARGET, RTLD_NOW | RTLD_NOLOAD), nullptr) << "the library must not be loaded yet";
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) _exit(load_on_a_small_alternate_stack());
    int status = 0;
    ASSERT_TRUE(wait_for_child(child, &status)) << "the child hung";
    ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    EXPECT_EQ(WEXITSTATUS(status), 0) << "the step that failed (load_on_a_small_alternate_stack)";
}

// ---- the first probe in an object ----

std::atomic<pid_t> g_watched_tid{0};
std::atomic<bool> g_read_elf{false};

// On libelf's elf_begin: notes that the watched thread read an ELF file.
int note_elf_read(kprobe *, pt_regs *) {
    if (gettid() == g_watched_tid) g_read_elf = true;
    return 0;
}

// The first probe in an object, registered while the program runs, is armed at once on
// its int3: the object's reference table (its ELF file read with libelf, a second for a
// large program) is built by the optimizer thread, which then gives the probe its jump.
TEST(Dlopen, AnObjectsFirstProbeLeavesItsTableToTheOptimizer) {
    if (ukp_kprobes_optimization() == 0) GTEST_SKIP() << "no table without optimization";
    void *lib = dlopen(UKP_DL_TARGET, RTLD_NOW);
    ASSERT_NE(lib, nullptr) << dlerror();
    kprobe watch{};
    watch.symbol_name = "libelf.so.1:elf_begin";
    watch.pre_handler = note_elf_read;
    ASSERT_EQ(register_kprobe(&watch), 0);
    ukp_optimizer_flush();
    const size_t before = ukp::arch::object_refs_cached();
    // The library's symbol table, which the registration reads too, read now.
    ASSERT_EQ(kallsyms_lookup_name("ukp_dl_fn"), reinterpret_cast<unsigned long>(dlsym(lib, "ukp_dl_fn")));
    kprobe kp{};
    kp.addr = static_cast<kprobe_opcode_t *>(dlsym(lib, "ukp_dl_fn"));
    kp.pre_handler = count_hit;
    g_watched_tid = gettid();
    ASSERT_EQ(register_kprobe(&kp), 0);
    g_watched_tid = 0;
    EXPECT_FALSE(g_read_elf) << "the registration read an ELF file";
    g_hits = 0;
    EXPECT_EQ(reinterpret_cast<int (*)(int)>(kp.addr)(1), 3);
    EXPECT_EQ(g_hits, 1) << "armed at once";
    ukp_optimizer_flush();
    EXPECT_EQ(ukp::arch::object_refs_cached(), before + 1) << "the optimizer built the table";
    EXPECT_EQ(reinterpret_cast<int (*)(int)>(kp.addr)(1), 3);
    EXPECT_EQ(g_hits, 2);
    unregister_kprobe(&kp);
    unregister_kprobe(&watch);
    dlclose(lib);
}

// The reference table built for a probe's object goes with the object: loading and
// unloading libraries at new addresses keeps memory bounded.
TEST(Dlopen, AnUnloadedObjectsReferenceTableIsDropped) {
    if (ukp_kprobes_optimization() == 0) GTEST_SKIP() << "no table without optimization";
    kprobe kp{};
    kp.symbol_name = kSpec;
    kp.pre_handler = count_hit;
    ASSERT_EQ(register_kprobe(&kp), 0);
    ukp_optimizer_flush(); // the tables the agent's own probes wait for (the loader's)
    const size_t before = ukp::arch::object_refs_cached();
    for (int i = 0; i < 5; ++i) {
        void *lib = dlopen(UKP_DL_TARGET, RTLD_NOW);
        ASSERT_NE(lib, nullptr) << dlerror();
        ukp_optimizer_flush(); // the probe armed at the load waits for the table there
        EXPECT_EQ(ukp::arch::object_refs_cached(), before + 1) << "load " << i;
        ASSERT_EQ(dlclose(lib), 0);
        EXPECT_EQ(ukp::arch::object_refs_cached(), before) << "unload " << i;
    }
    unregister_kprobe(&kp);
}

// A program that exits while the tables thread builds a reference table (a second for a
// large library) does not wait for the rest of the build: exit() stops it, and nothing
// half-built is kept. The child exits as soon as the build runs; had its exit waited for
// the build, the table would be in the cache directory, where a child that waits for the
// optimizer before it exits leaves it.
constexpr const char *kLargeLibrary = "libpython3.11.so.1.0";

int exit_while_a_table_is_built(const char *dir, bool wait_for_it) {
    setenv("UKP_CACHE_DIR", dir, 1);
    if (dlopen(kLargeLibrary, RTLD_NOW) == nullptr) return 2;
    kprobe kp{};
    const std::string where = std::string(kLargeLibrary) + ":PyList_New";
    kp.symbol_name = where.c_str();
    kp.pre_handler = count_hit;
    if (register_kprobe(&kp) != 0) return 3;
    if (wait_for_it) {
        ukp_optimizer_flush();
        std::exit(0);
    }
    // The tables thread runs only while it builds or decides.
    for (int i = 0; i < 10000; ++i) {
        bool building = false;
        if (DIR *d = opendir("/proc/self/task")) {
            while (const dirent *e = readdir(d)) {
                char comm[32] = {};
                const std::string file = std::string("/proc/self/task/") + e->d_name + "/comm";
                if (FILE *f = std::fopen(file.c_str(), "r")) {
                    building |=
                        std::fgets(comm, sizeof comm, f) != nullptr && std::strncmp(comm, "ukp-tables", 10) == 0;
                    std::fclose(f);
                }
            }
            closedir(d);
        }
        if (building) std::exit(0);
        usleep(500);
    }
    return 4;
}

TEST(Dlopen, AnExitDuringATablesBuildStopsTheBuild) {
    if (ukp_kprobes_optimization() == 0) GTEST_SKIP() << "no table without optimization";
    void *probe = dlopen(kLargeLibrary, RTLD_LAZY | RTLD_LOCAL);
    if (probe == nullptr) GTEST_SKIP() << kLargeLibrary << " is not installed (scripts/install-deps.sh installs it)";
    char path[4096] = {};
    ASSERT_EQ(dlinfo(probe, RTLD_DI_ORIGIN, path), 0);
    const std::string file = std::string(path) + "/" + kLargeLibrary;
    dlclose(probe);
    ASSERT_EQ(dlopen(kLargeLibrary, RTLD_NOW | RTLD_NOLOAD), nullptr) << "still loaded: the child would find its table";
    char tmpl[] = "/tmp/ukp-exit-build-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    ukp::platform::FileKey key{};
    ASSERT_TRUE(ukp::platform::file_key(file, &key)) << file;
    const std::string entry = ukp::platform::cache_entry_path(tmpl, "refs", file, key);
    const auto run = [&](bool wait_for_it) {
        const pid_t child = fork();
        ASSERT_GE(child, 0);
        if (child == 0) _exit(exit_while_a_table_is_built(tmpl, wait_for_it));
        int status = 0;
        ASSERT_TRUE(wait_for_child(child, &status)) << "the child hung";
        ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
        EXPECT_EQ(WEXITSTATUS(status), 0) << "2: no dlopen, 3: no registration, 4: no tables thread seen";
    };
    run(true);
    EXPECT_EQ(access(entry.c_str(), F_OK), 0) << "the table built before the exit is not where it is looked for";
    unlink(entry.c_str());
    run(false);
    EXPECT_NE(access(entry.c_str(), F_OK), 0) << "the exit waited for the build: " << entry;
    std::error_code ignored;
    std::filesystem::remove_all(tmpl, ignored);
}

// ---- return probes on objects not loaded yet ----

std::atomic<int> g_returns{0};
std::atomic<long> g_last_ret{0};

int count_return(kretprobe_instance *, pt_regs *regs) {
    ++g_returns;
    g_last_ret = static_cast<long>(regs->ax);
    return 0;
}

// As a kprobe: accepted, listed [GONE], armed before the library's constructor runs, gone
// again at dlclose and back at the next dlopen.
TEST(Dlopen, PendingKretprobeIsArmedBeforeTheLibrarysConstructorRuns) {
    ASSERT_EQ(dlopen(UKP_DL_TARGET, RTLD_NOW | RTLD_NOLOAD), nullptr) << "the library must not be loaded yet";
    kretprobe rp{};
    rp.kp.symbol_name = kSpec;
    rp.handler = count_return;
    ASSERT_EQ(register_kretprobe(&rp), 0) << "accepted as pending";
    EXPECT_NE(list().find("r  ukp_dl_fn+0x0  libukp_dl_target.so [GONE]"), std::string::npos) << list();
    g_returns = 0;
    for (int round = 1; round <= 2; ++round) {
        void *lib = dlopen(UKP_DL_TARGET, RTLD_NOW);
        ASSERT_NE(lib, nullptr) << dlerror();
        EXPECT_EQ(g_returns, 2 * round - 1) << "the constructor's call returned through the probe";
        EXPECT_EQ(g_last_ret, 42);
        auto fn = reinterpret_cast<int (*)(int)>(dlsym(lib, "ukp_dl_fn"));
        EXPECT_EQ(fn(5), 15);
        EXPECT_EQ(g_returns, 2 * round);
        EXPECT_EQ(g_last_ret, 15);
        ASSERT_EQ(dlclose(lib), 0);
        EXPECT_NE(rp.kp.flags & KPROBE_FLAG_GONE, 0u);
    }
    unregister_kretprobe(&rp);
    EXPECT_EQ(list(), "");
}

// Not a function's entry once loaded (an offset): refused now, as on a loaded object.
TEST(Dlopen, PendingKretprobeNeedsAFunctionEntry) {
    kretprobe rp{};
    rp.kp.symbol_name = kSpec;
    rp.kp.offset = 4;
    rp.handler = count_return;
    EXPECT_EQ(register_kretprobe(&rp), -ENOENT);
    EXPECT_EQ(list(), "");
}

// The agent re-reads the loaded objects when the loader reports a change, from inside a
// hit on its own probe, and allocates while it does. That is the agent's work, not the
// program's: a probe on malloc neither runs for those calls nor counts them as missed
// (python3 importing a module showed hundreds of misses in kprobe_profile).
TEST(Dlopen, TheAgentsOwnCallsOnALoadAreNotMissedHits) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    GTEST_SKIP() << "the sanitizer's allocator replaces malloc: the C library's is never called";
#endif
    kprobe kp{};
    kp.symbol_name = "libc.so.6:malloc";
    kp.pre_handler = count_hit;
    ASSERT_EQ(register_kprobe(&kp), 0);
    g_hits = 0;
    void *lib = dlopen(UKP_DL_TARGET, RTLD_NOW);
    ASSERT_NE(lib, nullptr) << dlerror();
    ASSERT_EQ(dlclose(lib), 0);
    unregister_kprobe(&kp);
    EXPECT_GT(g_hits.load(), 0) << "the loader's own allocations were seen";
    EXPECT_EQ(kp.nmissed, 0ul);
}

} // namespace
