// A debugger stopped below kretprobed frames walks on to their real callers: the return
// stubs are described to GDB through its JIT interface (core/jit_debug.cpp), with the
// CFI that names each instance's saved return address. The test process runs
// `gdb -batch -p <itself> -ex bt` while it waits, below the probed frames, for gdb to
// finish, and reads the frames gdb printed.
#include <ukprobes/kprobes.h>

#include "arch/x86_64/trampoline.hpp"
#include "core/kretprobe.hpp"

#include <fmt/format.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fcntl.h>
#include <atomic>
#include <fstream>
#include <regex>
#include <spawn.h>
#include <sstream>
#include <string>
#include <thread>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

extern char **environ;

namespace {

struct GdbRun {
    bool ran = false;
    std::string output;
};

std::string find_gdb() {
    for (const char *dir : {"/usr/bin", "/usr/local/bin", "/bin"}) {
        std::string path = std::string(dir) + "/gdb";
        if (access(path.c_str(), X_OK) == 0) return path;
    }
    return {};
}

// Runs gdb in batch mode with `what` after the common options, and returns its output.
GdbRun run_gdb(const std::vector<std::string> &what) {
    GdbRun run;
    const std::string gdb = find_gdb();
    if (gdb.empty()) return run;
    char out_path[] = "/tmp/ukp_jit_gdb_XXXXXX";
    const int fd = mkstemp(out_path);
    if (fd < 0) return run;
    std::vector<std::string> args = {gdb, "-batch", "-nx", "-q", "-iex", "set debuginfod enabled off"};
    args.insert(args.end(), what.begin(), what.end());
    std::vector<char *> argv;
    for (auto &a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, fd, 1);
    posix_spawn_file_actions_adddup2(&actions, fd, 2);
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
    pid_t child = -1;
    const int err = posix_spawn(&child, gdb.c_str(), &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    close(fd);
    if (err == 0) {
        int status = 0;
        while (waitpid(child, &status, 0) < 0 && errno == EINTR) {
        }
        run.ran = true;
        std::ifstream in(out_path);
        std::stringstream text;
        text << in.rdbuf();
        run.output = text.str();
    }
    unlink(out_path);
    if (getenv("UKP_SHOW_GDB") != nullptr) fprintf(stderr, "%s", run.output.c_str());
    return run;
}

// In the process that gdb started (the test below): stop at ukj_stop, do not run gdb.
bool started_by_gdb() { return getenv("UKP_JIT_TEST_UNDER_GDB") != nullptr; }

// Options for the next attaching gdb, before the file is read.
std::vector<std::string> g_gdb_init;

// gdb attached to this process, its output. Called with the probed frames live.
GdbRun run_gdb_here() {
    if (started_by_gdb()) return {};
    prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0); // under Yama's ptrace_scope 1
    std::vector<std::string> what = g_gdb_init;
    for (const char *a : {"-p", "", "-ex", "bt"}) what.emplace_back(a);
    what[what.size() - 3] = std::to_string(getpid());
    return run_gdb(what);
}

// The function of each frame gdb printed, innermost first ("??" when it knows none).
std::vector<std::string> frame_functions(const std::string &bt) {
    static const std::regex frame(R"(^#\d+\s+(?:0x[0-9a-f]+ in )?(\S+) \()");
    std::vector<std::string> out;
    std::istringstream lines(bt);
    for (std::string line; std::getline(lines, line);) {
        std::smatch m;
        if (!std::regex_search(line, m, frame)) continue;
        // Through a frame filter gdb names a function with its parameter types.
        std::string name = m[1];
        if (const size_t paren = name.find('('); paren != std::string::npos && paren > 0) name.resize(paren);
        out.push_back(name);
    }
    return out;
}

GdbRun g_run;

} // namespace

// GdbInsideTheReturnPathWalksToTheRealCaller: ukj_stop waits there for gdb to set g_go_on.
std::atomic<bool> g_wait_in_stop{false}, g_waiting{false};
extern "C" {
volatile int g_go_on = 0;
}

extern "C" __attribute__((noinline, noipa)) void ukj_stop() {
    if (g_wait_in_stop.load()) {
        g_waiting = true;
        while (g_go_on == 0) usleep(1000);
        return;
    }
    g_run = run_gdb_here();
    asm volatile("" ::: "memory");
}

extern "C" __attribute__((noinline, noipa)) int ukj_leaf(int x) {
    ukj_stop();
    asm volatile("" : "+r"(x));
    return x + 1;
}

extern "C" __attribute__((noinline, noipa)) int ukj_mid(int x) {
    int r = ukj_leaf(x);
    asm volatile("" : "+r"(r));
    return r + 1;
}

extern "C" __attribute__((noinline, noipa)) int ukj_level(int depth) {
    int r = depth == 0 ? ukj_leaf(depth) : ukj_level(depth - 1);
    asm volatile("" : "+r"(r)); // no tail call: each level keeps its frame
    return r + 1;
}

// GdbInTheStubsCallWalksToTheRealCaller: a function a jump can enter (one 5-byte lea
// before its ret), its caller, and the return handler that notes the last instance.
std::atomic<const kretprobe_instance *> g_noted_instance{nullptr};
int note_instance(kretprobe_instance *ri, pt_regs *) {
    g_noted_instance = ri;
    return 0;
}
extern "C" __attribute__((noinline, noipa)) long ukj_called(long x) {
    asm volatile("" ::: "memory");
    return 3 * x + 1;
}
extern "C" __attribute__((noinline, noipa)) long ukj_calls(long x) {
    long r = ukj_called(x);
    asm volatile("" : "+r"(r));
    return r + 1;
}

extern "C" __attribute__((noinline, noipa)) int ukj_top(int which) {
    int r = which == 0 ? ukj_mid(1) : ukj_level(2);
    asm volatile("" : "+r"(r));
    return r + 1;
}

namespace {

// The frames from ukj_stop outwards, up to and including main; each return stub's frame
// ("ukp_kretprobe_stub.<function>") is counted and left out.
struct Walk {
    std::vector<std::string> callers;
    int stubs = 0;
    bool reached_main = false;
    std::vector<std::string> unknown; // frames gdb could not name
};

Walk walk_from_stop(const std::vector<std::string> &frames) {
    Walk w;
    size_t i = 0;
    while (i < frames.size() && frames[i] != "ukj_stop") ++i;
    for (; i < frames.size(); ++i) {
        if (frames[i].rfind("ukp_kretprobe_stub", 0) == 0) {
            ++w.stubs;
            continue;
        }
        if (frames[i] == "??") w.unknown.push_back(frames[i]);
        w.callers.push_back(frames[i]);
        if (frames[i] == "main") {
            w.reached_main = true;
            break;
        }
    }
    return w;
}

// Runs gdb with the probes on `symbols` registered, below ukj_top(which).
GdbRun bt_below_probes(const std::vector<const char *> &symbols, int which) {
    std::vector<kretprobe> rps(symbols.size());
    for (size_t i = 0; i < symbols.size(); ++i) {
        rps[i].kp.symbol_name = symbols[i];
        rps[i].maxactive = 8;
        EXPECT_EQ(register_kretprobe(&rps[i]), 0) << symbols[i];
    }
    g_run = {};
    int r = ukj_top(which);
    asm volatile("" : "+r"(r));
    for (auto &rp : rps) unregister_kretprobe(&rp);
    return g_run;
}

bool usable(const GdbRun &run, std::string *why) {
    if (!run.ran) {
        *why = "gdb is not installed";
        return false;
    }
    // A sandbox without ptrace: gdb can neither attach nor start a program.
    if (run.output.find("ukj_stop") == std::string::npos &&
        (run.output.find("Operation not permitted") != std::string::npos ||
         run.output.find("Could not attach to process") != std::string::npos)) {
        *why = "ptrace is not permitted here: " + run.output;
        return false;
    }
    return true;
}

std::string joined(const std::vector<std::string> &v) {
    std::string s;
    for (const auto &x : v) s += (s.empty() ? "" : " <- ") + x;
    return s;
}

// The callers of ukj_stop gdb shows, given the callers expected up to the test body.
void expect_callers(const GdbRun &run, const std::vector<std::string> &want, int stubs) {
    const Walk w = walk_from_stop(frame_functions(run.output));
    SCOPED_TRACE(run.output);
    ASSERT_GE(w.callers.size(), want.size()) << joined(w.callers);
    EXPECT_EQ(std::vector<std::string>(w.callers.begin(), w.callers.begin() + static_cast<long>(want.size())), want)
        << joined(w.callers);
    EXPECT_TRUE(w.reached_main) << "the walk goes on to main: " << joined(w.callers);
    EXPECT_TRUE(w.unknown.empty()) << "frames without a name: " << joined(w.callers);
    EXPECT_EQ(w.stubs, stubs) << "a named frame for each hijacked frame's stub, unless filtered out";
}

TEST(JitDebug, GdbWithoutProbesSeesThePlainChain) {
    const GdbRun run = bt_below_probes({}, 0);
    if (std::string why; !usable(run, &why)) GTEST_SKIP() << why;
    expect_callers(run, {"ukj_stop", "ukj_leaf", "ukj_mid", "ukj_top"}, 0);
}

TEST(JitDebug, GdbWalksThroughOneKretprobedFrameToItsRealCaller) {
    const GdbRun run = bt_below_probes({"ukj_mid"}, 0);
    if (std::string why; !usable(run, &why)) GTEST_SKIP() << why;
    expect_callers(run, {"ukj_stop", "ukj_leaf", "ukj_mid", "ukj_top"}, 1);
}

TEST(JitDebug, GdbWalksThroughThreeNestedKretprobedFrames) {
    const GdbRun run = bt_below_probes({"ukj_level"}, 1);
    if (std::string why; !usable(run, &why)) GTEST_SKIP() << why;
    expect_callers(run, {"ukj_stop", "ukj_leaf", "ukj_level", "ukj_level", "ukj_level", "ukj_top"}, 3);
}

TEST(JitDebug, GdbWalksThroughKretprobesOnEveryFrame) {
    // Three probed functions, one of them (ukj_top) holding two probes on its one frame.
    const GdbRun run = bt_below_probes({"ukj_leaf", "ukj_mid", "ukj_top", "ukj_top"}, 0);
    if (std::string why; !usable(run, &why)) GTEST_SKIP() << why;
    expect_callers(run, {"ukj_stop", "ukj_leaf", "ukj_mid", "ukj_top"}, 4);
    // The agent asks gdb to auto-load nothing: no warning in every session.
    EXPECT_EQ(run.output.find("auto-load"), std::string::npos) << run.output;
}

// The agent's frame filter (scripts/gdb/ukprobes_gdb.py), sourced as the docs say.
TEST(JitDebug, GdbWithTheAgentsFrameFilterListsOnlyTheRealCallers) {
    g_gdb_init = {"-iex", "source " UKP_GDB_SCRIPT};
    const GdbRun nested = bt_below_probes({"ukj_level"}, 1);
    const GdbRun every = bt_below_probes({"ukj_leaf", "ukj_mid", "ukj_top", "ukj_top"}, 0);
    g_gdb_init.clear();
    if (std::string why; !usable(nested, &why)) GTEST_SKIP() << why;
    if (nested.output.find("Python scripting is not supported") != std::string::npos)
        GTEST_SKIP() << "this gdb has no Python: " << nested.output;
    expect_callers(nested, {"ukj_stop", "ukj_leaf", "ukj_level", "ukj_level", "ukj_level", "ukj_top"}, 0);
    expect_callers(every, {"ukj_stop", "ukj_leaf", "ukj_mid", "ukj_top"}, 0);
}

TEST(JitDebug, GdbThatStartedTheProgramLearnsAndForgetsEachSled) {
    // gdb stops the program at its breakpoint on __jit_debug_register_code for each
    // registration and withdrawal. (The probes are not hit here: under a debugger their
    // int3 traps go to the debugger first, see docs/reference.md.)
    if (started_by_gdb()) {
        kretprobe rp{};
        rp.kp.symbol_name = "ukj_level";
        rp.maxactive = 4;
        ASSERT_EQ(register_kretprobe(&rp), 0);
        ukj_stop(); // gdb's first stop
        unregister_kretprobe(&rp);
        ukj_stop(); // the second
        return;
    }
    char exe[4096];
    const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    ASSERT_GT(n, 0);
    exe[n] = 0;
    const std::string list = "info functions ^ukp_kretprobe_stub";
    const GdbRun run = run_gdb({"-iex",
                                "set environment UKP_JIT_TEST_UNDER_GDB=1",
                                "-ex",
                                "break ukj_stop",
                                "-ex",
                                "run",
                                "-ex",
                                "echo STOP1\\n",
                                "-ex",
                                list,
                                "-ex",
                                "continue",
                                "-ex",
                                "echo STOP2\\n",
                                "-ex",
                                list,
                                "-ex",
                                "kill",
                                "--args",
                                exe,
                                "--gtest_filter=JitDebug.GdbThatStartedTheProgramLearnsAndForgetsEachSled"});
    if (std::string why; !usable(run, &why)) GTEST_SKIP() << why;
    SCOPED_TRACE(run.output);
    const size_t stop1 = run.output.find("STOP1"), stop2 = run.output.find("STOP2");
    ASSERT_NE(stop1, std::string::npos);
    ASSERT_NE(stop2, std::string::npos);
    const std::string first = run.output.substr(stop1, stop2 - stop1), second = run.output.substr(stop2);
    EXPECT_NE(first.find("ukp_kretprobe_stub.ukj_level"), std::string::npos) << "registered while gdb ran";
    EXPECT_EQ(second.find("ukp_kretprobe_stub.ukj_level"), std::string::npos) << "withdrawn at unregister";
}

// Stopped inside the return path, between the instructions that move the stack: in the
// stub after its push, and at the return trampoline's last jump, which leaves through the
// word where the stub's literal was. The CFI of both places leads to the real caller. A
// thread waits below the probed frame while gdb attaches, sets its breakpoints and lets
// it go on.
TEST(JitDebug, GdbInsideTheReturnPathWalksToTheRealCaller) {
    if (started_by_gdb()) return;
    kretprobe rp{};
    rp.kp.symbol_name = "ukj_mid";
    rp.maxactive = 1; // one stub: gdb's breakpoint on it is the one that runs
    ASSERT_EQ(register_kretprobe(&rp), 0);
    g_wait_in_stop = true;
    g_waiting = false;
    g_go_on = 0;
    std::thread worker([] {
        int r = ukj_top(0);
        asm volatile("" : "+r"(r));
    });
    while (!g_waiting.load()) usleep(1000);
    prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
    const GdbRun run = run_gdb({"-p",  std::to_string(getpid()),
                                "-ex", "break *((char *) 'ukp_kretprobe_stub.ukj_mid' + 15)",
                                "-ex", "break ukp_kretprobe_trampoline_exit",
                                "-ex", "break ukp_kretprobe_trampoline_ret",
                                "-ex", "set var g_go_on = 1",
                                "-ex", "continue",
                                "-ex", "echo STUB\\n",
                                "-ex", "bt",
                                "-ex", "continue",
                                "-ex", "echo EXIT\\n",
                                "-ex", "bt",
                                "-ex", "delete",
                                "-ex", "detach"});
    g_go_on = 1; // if gdb did not
    worker.join();
    g_wait_in_stop = false;
    unregister_kretprobe(&rp);
    if (std::string why; !usable(run, &why)) GTEST_SKIP() << why;
    SCOPED_TRACE(run.output);
    const size_t stub = run.output.find("STUB"), exit = run.output.find("EXIT");
    ASSERT_NE(stub, std::string::npos);
    ASSERT_NE(exit, std::string::npos);
    const std::vector<std::string> at_stub = frame_functions(run.output.substr(stub, exit - stub));
    const std::vector<std::string> at_exit = frame_functions(run.output.substr(exit));
    // ukj_top's frame then leads on to the worker's lambda: its stack pointer was right.
    ASSERT_GE(at_stub.size(), 3u);
    EXPECT_EQ(at_stub[0], "ukp_kretprobe_stub.ukj_mid");
    EXPECT_EQ(at_stub[1], "ukj_top") << "the stub's frame after its push";
    EXPECT_EQ(at_stub[2], "operator");
    ASSERT_GE(at_exit.size(), 3u);
    EXPECT_EQ(at_exit[0], "ukp_kretprobe_trampoline");
    EXPECT_EQ(at_exit[1], "ukj_top") << "the trampoline's frame at its last jump";
    EXPECT_EQ(at_exit[2], "operator");
}

// The same on the kretprobe's own jump path, where the stub calls the function: stopped
// at the stub's first instruction (the return address still on the stack), at its call
// (the return address dropped), and at the return trampoline's `ret`, the CFI leads to
// the real caller each time.
TEST(JitDebug, GdbInTheStubsCallWalksToTheRealCaller) {
    if (started_by_gdb()) return;
    kretprobe rp{};
    rp.kp.symbol_name = "ukj_called";
    rp.handler = note_instance;
    rp.maxactive = 8; // one in each shard: the thread's home shard has one for the jump path
    ASSERT_EQ(register_kretprobe(&rp), 0);
    ukp_optimizer_flush();
    ASSERT_NE(rp.kp.flags & KPROBE_FLAG_OPTIMIZED, 0u);
    g_waiting = false;
    g_go_on = 0;
    std::atomic<long> result{0};
    std::thread worker([&result] {
        // The thread's first entry goes the C way (ukp_optprobe_dispatch); the second is
        // the kretprobe trampoline's own, and the instance it took (its home shard's one)
        // is the next one's too.
        long r = ukj_calls(1) + ukj_calls(1);
        g_waiting = true;
        while (g_go_on == 0) usleep(1000);
        r += ukj_calls(2);
        result = r;
    });
    while (!g_waiting.load()) usleep(1000);
    const auto *ri = reinterpret_cast<const ukp::core::RetInstance *>(
        reinterpret_cast<const char *>(g_noted_instance.load()) - offsetof(ukp::core::RetInstance, pub));
    ASSERT_TRUE(ri->called) << "the second call took the jump path";
    const uint64_t stub = ri->pool->sled + ri->index * ukp::arch::kRetStubSize;
    prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
    // The hijacked way's exit too: a call that went that way stops there (and fails the
    // test) instead of running on while gdb waits.
    const GdbRun run = run_gdb({"-p",  std::to_string(getpid()),
                                "-ex", fmt::format("break *{:#x}", stub),
                                "-ex", fmt::format("break *{:#x}", stub + ukp::arch::kRetStubCalling),
                                "-ex", "break ukp_kretprobe_trampoline_ret",
                                "-ex", "break ukp_kretprobe_trampoline_exit",
                                "-ex", "set var g_go_on = 1",
                                "-ex", "continue",
                                "-ex", "echo FIRST\\n",
                                "-ex", "bt",
                                "-ex", "continue",
                                "-ex", "echo CALL\\n",
                                "-ex", "bt",
                                "-ex", "continue",
                                "-ex", "echo RET\\n",
                                "-ex", "bt",
                                "-ex", "delete",
                                "-ex", "detach"});
    g_go_on = 1; // if gdb did not
    worker.join();
    unregister_kretprobe(&rp);
    EXPECT_EQ(result.load(), 2 * 5 + 8);
    if (std::string why; !usable(run, &why)) GTEST_SKIP() << why;
    SCOPED_TRACE(run.output);
    const size_t first = run.output.find("FIRST"), call = run.output.find("CALL"), ret = run.output.find("RET");
    ASSERT_NE(first, std::string::npos);
    ASSERT_NE(call, std::string::npos);
    ASSERT_NE(ret, std::string::npos);
    const std::vector<std::string> at_first = frame_functions(run.output.substr(first, call - first));
    const std::vector<std::string> at_call = frame_functions(run.output.substr(call, ret - call));
    const std::vector<std::string> at_ret = frame_functions(run.output.substr(ret));
    for (const auto *frames : {&at_first, &at_call}) {
        ASSERT_GE(frames->size(), 3u);
        EXPECT_EQ((*frames)[0], "ukp_kretprobe_stub.ukj_called");
        EXPECT_EQ((*frames)[1], "ukj_calls");
        EXPECT_EQ((*frames)[2], "operator");
    }
    ASSERT_GE(at_ret.size(), 3u);
    EXPECT_EQ(at_ret[0], "ukp_kretprobe_trampoline");
    EXPECT_EQ(at_ret[1], "ukj_calls") << "the trampoline's frame at its ret";
    EXPECT_EQ(at_ret[2], "operator");
}

} // namespace
