// End-to-end tests of ukprobe as records in tests/e2e/*.txt, one GoogleTest test each.
//
// A record is a run of "KEY value" lines, records separated by blank lines, '#' starts a
// comment line. Keys (anything else is an error):
//   NAME          the test's name ([A-Za-z0-9_]+), first in its record
//   RUN           a sh script; lines after it that start with white space continue it
//   EXPECT        a line the output (stdout and stderr together) must contain, whole
//   EXPECT_REGEX  a regex (ECMAScript, std::regex) some line of the output must match
//   REQUIRES      a sh command that must succeed, or the test is skipped
//   WILL_FAIL     the script must exit non-zero (otherwise it must exit 0)
//   TIMEOUT       seconds (default 10); the script's process group is killed after it
// The script runs after tests/e2e/lib.sh (start, output, finish) with $UKPROBE, $TARGETS,
// $E2E_TMP, $E2E_DIR (this directory, for the repository's scripts), $EXAMPLES (the
// examples/ modules and sample_target) and $AGENT (libukprobes.so) set. Afterwards
// every target it started that still runs must pass `ukprobe verify` (code identical to
// its files), then it is killed.
#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <dirent.h>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <poll.h>
#include <regex>
#include <sstream>
#include <string>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

namespace {

struct Record {
    std::string file;
    int line = 0;
    std::string name, run, requires_;
    std::vector<std::string> expect, expect_regex;
    bool will_fail = false;
    int timeout = 10;
};

struct Result {
    int status = -1; // the shell's exit status, or -1 if it timed out or died by a signal
    std::string output;
};

// Runs `script` with /bin/sh in its own process group; stdout and stderr together.
Result run_shell(const std::string &script, int timeout_seconds) {
    int pipefd[2];
    if (pipe2(pipefd, O_CLOEXEC) != 0) return {};
    const pid_t child = fork();
    if (child == 0) {
        setpgid(0, 0);
        dup2(pipefd[1], 1);
        dup2(pipefd[1], 2);
        execl("/bin/sh", "sh", "-c", script.c_str(), static_cast<char *>(nullptr));
        _exit(127);
    }
    close(pipefd[1]);
    setpgid(child, child);
    Result r;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_seconds);
    char buf[4096];
    bool eof = false;
    int status = 0;
    while (true) {
        if (!eof) {
            pollfd p{pipefd[0], POLLIN, 0};
            if (poll(&p, 1, 100) > 0) {
                const ssize_t n = read(pipefd[0], buf, sizeof buf);
                if (n > 0)
                    r.output.append(buf, static_cast<size_t>(n));
                else
                    eof = true;
                continue;
            }
        } else {
            usleep(10000);
        }
        // The shell may be gone while a background process still holds the pipe.
        if (waitpid(child, &status, WNOHANG) == child) {
            r.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
            break;
        }
        if (std::chrono::steady_clock::now() >= deadline) {
            kill(-child, SIGKILL);
            waitpid(child, &status, 0);
            r.output += "\n[timed out after " + std::to_string(timeout_seconds) + " s]\n";
            break;
        }
    }
    close(pipefd[0]);
    return r;
}

bool alive(pid_t pid) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
    std::string stat;
    std::getline(in, stat);
    const size_t paren = stat.rfind(')');
    return paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] != 'Z';
}

// Targets left over become this process's children (it is a subreaper): reap them.
void reap() {
    while (waitpid(-1, nullptr, WNOHANG) > 0) {
    }
}

class E2eTest : public testing::Test {
public:
    explicit E2eTest(Record r) : r_(std::move(r)) {}

    void TestBody() override {
        char tmpl[] = "/tmp/ukp-e2e-XXXXXX";
        ASSERT_NE(mkdtemp(tmpl), nullptr);
        const std::string tmp = tmpl;
        chmod(tmp.c_str(), 0755); // targets may run as another user
        const std::string env = std::string("UKPROBE='") + UKP_UKPROBE + "'; TARGETS='" + UKP_TARGETS + "'; E2E_TMP='" +
                                tmp + "'; E2E_DIR='" + UKP_E2E_DIR + "'; EXAMPLES='" + UKP_EXAMPLES + "'; AGENT='" +
                                UKP_AGENT + "'; export UKPROBE TARGETS E2E_TMP E2E_DIR EXAMPLES AGENT; . '" +
                                UKP_E2E_DIR + "/lib.sh'\n";
        if (!r_.requires_.empty()) {
            const Result req = run_shell(env + r_.requires_, 10);
            if (req.status != 0) {
                std::filesystem::remove_all(tmp);
                GTEST_SKIP() << "REQUIRES failed: " << r_.requires_;
            }
        }
        const Result res = run_shell(env + r_.run, r_.timeout);
        const std::string where = r_.file + ":" + std::to_string(r_.line);
        SCOPED_TRACE(where + " " + r_.name + "\n--- output ---\n" + res.output + "--------------");
        if (r_.will_fail)
            EXPECT_NE(res.status, 0) << "the script was to fail";
        else
            EXPECT_EQ(res.status, 0) << "the script's exit status";
        std::vector<std::string> lines;
        {
            std::istringstream in(res.output);
            std::string l;
            while (std::getline(in, l)) lines.push_back(l);
        }
        for (const std::string &e : r_.expect)
            EXPECT_NE(std::find(lines.begin(), lines.end(), e), lines.end()) << "no output line is: " << e;
        for (const std::string &e : r_.expect_regex) {
            const std::regex re(e);
            EXPECT_TRUE(
                std::any_of(lines.begin(), lines.end(), [&](const std::string &l) { return std::regex_search(l, re); }))
                << "no output line matches: " << e;
        }
        // Every target still running: its code must be what its files say.
        std::ifstream pids(tmp + "/pids");
        pid_t pid;
        while (pids >> pid) {
            if (!alive(pid)) continue;
            const Result v =
                run_shell(env + "$UKPROBE attach " + std::to_string(pid) + " && $UKPROBE -p " + std::to_string(pid) +
                              " verify && $UKPROBE -p " + std::to_string(pid) + " detach",
                          10);
            EXPECT_EQ(v.status, 0) << "after the test, ukprobe verify of process " << pid << ":\n" << v.output;
            kill(pid, SIGKILL);
        }
        reap();
        std::filesystem::remove_all(tmp);
    }

private:
    Record r_;
};

std::vector<Record> parse(const std::string &path) {
    std::vector<Record> out;
    std::ifstream in(path);
    std::string line, last_key;
    Record cur;
    int lineno = 0;
    auto flush = [&] {
        if (!cur.name.empty())
            out.push_back(cur);
        else if (!cur.run.empty())
            throw std::runtime_error(path + ":" + std::to_string(cur.line) + ": record without NAME");
        cur = Record{};
        last_key.clear();
    };
    while (std::getline(in, line)) {
        ++lineno;
        if (!line.empty() && (line[0] == ' ' || line[0] == '\t')) {
            if (last_key != "RUN")
                throw std::runtime_error(path + ":" + std::to_string(lineno) + ": continuation line not after RUN");
            cur.run += "\n" + line;
            continue;
        }
        if (line.empty()) {
            flush();
            continue;
        }
        if (line[0] == '#') continue;
        const size_t sp = line.find(' ');
        const std::string key = line.substr(0, sp);
        const std::string value = sp == std::string::npos ? "" : line.substr(sp + 1);
        const std::string where = path + ":" + std::to_string(lineno);
        if (cur.name.empty() && key != "NAME") throw std::runtime_error(where + ": a record starts with NAME");
        last_key = key;
        if (key == "NAME") {
            if (!cur.name.empty()) throw std::runtime_error(where + ": NAME twice (blank line missing?)");
            if (!std::regex_match(value, std::regex("[A-Za-z0-9_]+"))) throw std::runtime_error(where + ": bad NAME");
            cur.name = value;
            cur.file = path;
            cur.line = lineno;
        } else if (key == "RUN")
            cur.run = value;
        else if (key == "EXPECT")
            cur.expect.push_back(value);
        else if (key == "EXPECT_REGEX")
            cur.expect_regex.push_back(value);
        else if (key == "REQUIRES") // several lines: all must hold
            cur.requires_ = cur.requires_.empty() ? value : "{ " + cur.requires_ + "; } && { " + value + "; }";
        else if (key == "WILL_FAIL")
            cur.will_fail = true;
        else if (key == "TIMEOUT")
            cur.timeout = std::atoi(value.c_str());
        else
            throw std::runtime_error(where + ": unknown key " + key);
    }
    flush();
    return out;
}

} // namespace

int main(int argc, char **argv) {
    testing::InitGoogleTest(&argc, argv);
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    std::vector<std::string> files;
    for (const auto &e : std::filesystem::directory_iterator(UKP_E2E_DIR))
        if (e.path().extension() == ".txt" && e.path().filename() != "CMakeLists.txt")
            files.push_back(e.path().string());
    std::sort(files.begin(), files.end());
    for (const std::string &f : files) {
        std::vector<Record> records;
        try {
            records = parse(f);
        } catch (const std::exception &e) {
            fprintf(stderr, "%s\n", e.what());
            return 2;
        }
        const std::string suite = "e2e_" + std::filesystem::path(f).stem().string();
        for (const Record &r : records)
            testing::RegisterTest(suite.c_str(), r.name.c_str(), nullptr, nullptr, r.file.c_str(), r.line,
                                  [r]() -> testing::Test * { return new E2eTest(r); });
    }
    return RUN_ALL_TESTS();
}
