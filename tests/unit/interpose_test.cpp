// The libc functions the agent interposes must answer as glibc does: the same result, the
// same errno on failure, errno untouched on success. ukp_interpose_calls prints each
// call's result and errno; it runs without and with the agent and the outputs must agree
// line for line.
#include "sanitizers.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

namespace {

struct Run {
    std::vector<std::string> lines;
    int status = -1;
};

// Runs the target with exactly `env` as its environment, stdout captured.
Run run_target(const std::vector<std::string> &env, const std::vector<std::string> &args) {
    Run run;
    int out[2];
    if (pipe(out) != 0) return run;
    const pid_t pid = fork();
    if (pid == 0) {
        dup2(out[1], STDOUT_FILENO);
        close(out[0]);
        close(out[1]);
        std::vector<char *> argv{const_cast<char *>(UKP_INTERPOSE_CALLS)};
        for (const std::string &a : args) argv.push_back(const_cast<char *>(a.c_str()));
        argv.push_back(nullptr);
        std::vector<char *> envp;
        for (const std::string &e : env) envp.push_back(const_cast<char *>(e.c_str()));
        envp.push_back(nullptr);
        execve(UKP_INTERPOSE_CALLS, argv.data(), envp.data());
        _exit(127);
    }
    close(out[1]);
    std::string text;
    char buf[4096];
    for (ssize_t n; (n = read(out[0], buf, sizeof buf)) != 0;) {
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) break;
        text.append(buf, static_cast<size_t>(n));
    }
    close(out[0]);
    waitpid(pid, &run.status, 0);
    for (size_t start = 0; start < text.size();) {
        size_t end = text.find('\n', start);
        if (end == std::string::npos) end = text.size();
        run.lines.push_back(text.substr(start, end - start));
        start = end + 1;
    }
    return run;
}

const std::string kPreload = std::string("LD_PRELOAD=") + UKP_AGENT;
// A probe on a function the target never calls: registering it installs the agent's
// signal handlers, so sigaction() on its signals goes through the agent's own record.
const std::string kProbe = "UKP_EVENTS=p:interpose_unused,libc.so.6:mkfifo";

void expect_same_lines(const Run &glibc, const Run &agent) {
    ASSERT_TRUE(WIFEXITED(glibc.status) && WEXITSTATUS(glibc.status) == 0) << "status " << glibc.status;
    ASSERT_TRUE(WIFEXITED(agent.status) && WEXITSTATUS(agent.status) == 0) << "status " << agent.status;
    ASSERT_GT(glibc.lines.size(), 100u);
    const size_t n = std::max(glibc.lines.size(), agent.lines.size());
    int reported = 0;
    for (size_t i = 0; i < n; ++i) {
        const std::string g = i < glibc.lines.size() ? glibc.lines[i] : "(none)";
        const std::string a = i < agent.lines.size() ? agent.lines[i] : "(none)";
        if (g == a) continue;
        if (++reported > 40) break;
        ADD_FAILURE() << "line " << i + 1 << "\n  glibc: " << g << "\n  agent: " << a;
    }
    EXPECT_EQ(glibc.lines.size(), agent.lines.size());
}

// Under AddressSanitizer the agent cannot be preloaded into a program without its runtime,
// whose own interceptors of these functions would answer instead of glibc.
#define SKIP_UNDER_ASAN()                                                                                              \
    if (UKP_UNDER_ASAN) GTEST_SKIP() << "the sanitizer's interceptors answer, not glibc"

TEST(Interposed, SameResultsAndErrnoAsGlibc) {
    SKIP_UNDER_ASAN();
    expect_same_lines(run_target({}, {}), run_target({kPreload}, {}));
}

TEST(Interposed, SameResultsAndErrnoAsGlibcWithTheAgentsHandlersInstalled) {
    SKIP_UNDER_ASAN();
    expect_same_lines(run_target({}, {"managed"}), run_target({kPreload, kProbe}, {"managed"}));
}

// The same calls inside this process, which links the agent statically: its sigprocmask
// is the one called. The agent's mark on it: SIGTRAP is never blocked.
TEST(Interposed, SigprocmaskLeavesErrnoAlone) {
    sigset_t set, now;
    sigemptyset(&set);
    sigaddset(&set, SIGUSR1);
    sigaddset(&set, SIGTRAP);
    sigset_t saved;
    ASSERT_EQ(sigprocmask(SIG_BLOCK, nullptr, &saved), 0);
    errno = EINTR;
    EXPECT_EQ(sigprocmask(SIG_SETMASK, &set, nullptr), 0);
    EXPECT_EQ(errno, EINTR);
    ASSERT_EQ(sigprocmask(SIG_BLOCK, nullptr, &now), 0);
    EXPECT_EQ(sigismember(&now, SIGUSR1), 1);
    EXPECT_EQ(sigismember(&now, SIGTRAP), 0) << "not the agent's sigprocmask";
    errno = 12345;
    EXPECT_EQ(sigprocmask(99, &set, nullptr), -1);
    EXPECT_EQ(errno, EINVAL);
    errno = EINTR;
    EXPECT_EQ(pthread_sigmask(99, &set, nullptr), EINVAL);
    EXPECT_EQ(errno, EINTR);
    sigfillset(&set);
    errno = EINTR;
    EXPECT_EQ(pthread_sigmask(SIG_BLOCK, &set, nullptr), 0);
    EXPECT_EQ(errno, EINTR);
    sigprocmask(SIG_SETMASK, &saved, nullptr);
}

TEST(Interposed, ACatchLeavesErrnoAlone) {
    errno = EINTR;
    try {
        throw 7;
    } catch (int) {
        EXPECT_EQ(errno, EINTR);
    }
}

} // namespace
