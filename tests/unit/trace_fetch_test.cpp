// Every fetcharg and every type against tests/targets/trace_target.c, whose values are
// known; the format file against the kernel's own (tests/data/trace/format_golden.txt);
// faults, return probes, $argN past the sixth, and UKP_EVENTS at start-up.
#include <gtest/gtest.h>

#include <sys/mman.h>
#include <sys/prctl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include <ukprobes/trace.h>

#include "trace/events.hpp"
#include "trace_files.hpp"
#include "trace_target.h"

extern char **environ;

using namespace ukp::trace;
using namespace ukp::trace::test_files;

namespace {

// Calls through volatile pointers, so that the compiler keeps every call.
long (*volatile g_record)(struct ttarget_rec *, const char *, int, unsigned long) = ttarget_record;
long (*volatile g_eight)(long, long, long, long, long, long, long, long) = ttarget_eight;
long (*volatile g_pointer)(const char *) = ttarget_pointer;
long (*volatile g_triple)(long) = ttarget_triple;

std::string data_path(const char *name) {
    std::string here = __FILE__;
    return here.substr(0, here.rfind('/')) + "/../data/trace/" + name;
}

// The event part of the trace lines of event `name` ("name: (...) a=1").
std::vector<std::string> events_in_trace(const std::string &name) {
    std::vector<std::string> out;
    std::istringstream in(read("trace"));
    std::string line;
    const std::string key = " " + name + ": (";
    while (std::getline(in, line)) {
        const size_t at = line.find(key);
        if (at != std::string::npos && line[0] != '#') out.push_back(line.substr(at + 1));
    }
    return out;
}

std::string comm() {
    char name[16] = {0};
    prctl(PR_GET_NAME, name, 0, 0, 0);
    return name;
}

class TraceFetch : public ::testing::Test {
protected:
    void SetUp() override {
        ASSERT_EQ(file_write("events/enable", "0"), 0);
        ASSERT_EQ(file_write("kprobe_events", ""), 0);
        ASSERT_EQ(file_write("trace", ""), 0);
        ASSERT_EQ(file_write("tracing_on", "1"), 0);
    }
    void TearDown() override {
        EXPECT_EQ(file_write("events/enable", "0"), 0);
        EXPECT_EQ(file_write("kprobe_events", ""), 0);
    }
};

TEST_F(TraceFetch, EveryTypeAndFetchargAtEntry) {
    const std::string def =
        "p:vals ttarget_record neg=+0(%di):s32 flags=+4(%di):x8 bf=+4(%di):b3@2/8 small=+5(%di):u8 "
        "word=+6(%di):x16 big=+8(%di):s64 name=+0(+16(%di)):string names=+24(%di):string[3] "
        "letters=+48(%di):char[4] nextneg=+0(+56(%di)):s32 unext=+u0(+u16(+u56(%di))):ustring "
        "s=+0(%si):string c=%dx:s32 u=%cx:u64 x32=%dx:x32 u16=%dx:u16 s8=%dx:s8 dflt=%cx cm=$comm "
        "imm=\\42 immneg=\\-1:s8 lit=\\\"lit\" g=@ttarget_counter:s64 gs=@ttarget_greeting:string "
        "sym=%di:symbol ss=%di:symstr a1=$arg1 a3=$arg3:s16 words=+6(%di):x16[1] ch=+0(+16(%di)):ustring";
    ASSERT_EQ(file_write("kprobe_events", def), 0) << read("error_log");
    ASSERT_EQ(file_write("events/kprobes/vals/enable", "1"), 0);
    EXPECT_EQ(g_record(&ttarget_first, ttarget_greeting, -7, 12345), -5 + 1 - 7 + 12345);
    const auto lines = events_in_trace("vals");
    ASSERT_EQ(lines.size(), 1u) << read("trace");
    char addr[32];
    snprintf(addr, sizeof addr, "0x%lx", reinterpret_cast<unsigned long>(&ttarget_first));
    const std::string want = "vals: (" + symbolize(reinterpret_cast<uint64_t>(&ttarget_record), true) +
                             ") neg=-5 flags=0xb5 bf=5 small=200 word=0xbeef big=-1234567890123 "
                             "name=\"alpha\" names={\"one\",\"two\",\"three\"} letters={'w','x','y','z'} "
                             "nextneg=7 unext=\"beta\" s=\"hello\" c=-7 u=12345 x32=0xfffffff9 u16=65529 s8=-7 "
                             "dflt=0x3039 cm=\"" +
                             comm() +
                             "\" imm=0x2a immneg=-1 lit=\"lit\" g=4242 gs=\"hello\" "
                             "sym=ttarget_first+0x0/0x40 ss=\"ttarget_first+0x0/0x40\" a1=" +
                             addr + " a3=-7 words={0xbeef} ch=\"alpha\"";
    EXPECT_EQ(lines[0], want);
    EXPECT_NE(read("kprobe_profile").find("vals"), std::string::npos);
}

// An event whose every argument is a register as it is (the hit stores them from a
// four-byte plan each, not through the programs): every size and signedness, the same
// register twice, a field after a narrow one.
TEST_F(TraceFetch, AnEventOfRegistersOnlyStoresEverySize) {
    ASSERT_EQ(file_write("kprobe_events", "p:regs ttarget_record s8=%dx:s8 u8=%cx:u8 x8=%dx:x8 s16=%dx:s16 "
                                          "u16=%cx:u16 s32=%dx:s32 x32=%dx:x32 u32=%cx:u32 s64=%dx:s64 "
                                          "x64=%cx:x64 a3=$arg3:s16 a4=$arg4 dflt=%dx"),
              0)
        << read("error_log");
    ASSERT_EQ(file_write("events/kprobes/regs/enable", "1"), 0);
    // edx = -7 (an int: the upper half of rdx is 0), rcx = 12345 (0x3039)
    g_record(&ttarget_first, ttarget_greeting, -7, 12345);
    const auto lines = events_in_trace("regs");
    ASSERT_EQ(lines.size(), 1u) << read("trace");
    const std::string tail = "s8=-7 u8=57 x8=0xf9 s16=-7 u16=12345 s32=-7 x32=0xfffffff9 u32=12345 s64=4294967289 "
                             "x64=0x3039 a3=-7 a4=0x3039 dflt=0xfffffff9";
    ASSERT_GE(lines[0].size(), tail.size()) << lines[0];
    EXPECT_EQ(lines[0].substr(lines[0].size() - tail.size()), tail) << lines[0];
}

// A char of value 0 prints as the kernel prints it: the NUL byte between its quotes (the
// line went on to the end before, at the NUL, without the closing quote and what follows).
TEST_F(TraceFetch, ANulCharKeepsItsQuotesAndTheRestOfTheLine) {
    ASSERT_EQ(file_write("kprobe_events", "p:nul ttarget_record z=+5(%si):char after=%cx:u64"), 0) << read("error_log");
    ASSERT_EQ(file_write("events/kprobes/nul/enable", "1"), 0);
    g_record(&ttarget_first, ttarget_greeting, -7, 12345); // "hello": its NUL at +5
    const auto lines = events_in_trace("nul");
    ASSERT_EQ(lines.size(), 1u) << read("trace");
    const std::string tail = std::string("z='") + '\0' + "' after=12345";
    ASSERT_GE(lines[0].size(), tail.size());
    EXPECT_EQ(lines[0].substr(lines[0].size() - tail.size()), tail);
}

TEST_F(TraceFetch, FetchargsFromData) {
    std::ifstream in(data_path("fetchargs.txt"));
    std::string line, def = "p:fa ttarget_record", want;
    char first[32];
    snprintf(first, sizeof first, "0x%lx", reinterpret_cast<unsigned long>(&ttarget_first));
    int n = 0;
    while (std::getline(in, line)) {
        if (line.empty() || line[0] == '#') continue;
        const size_t tab = line.find('\t');
        ASSERT_NE(tab, std::string::npos) << line;
        std::string value = line.substr(tab + 1);
        for (auto [key, rep] : {std::pair<std::string, std::string>{"@FIRST@", first}, {"@COMM@", comm()}}) {
            const size_t at = value.find(key);
            if (at != std::string::npos) value.replace(at, key.size(), rep);
        }
        std::string name = "v"; // not `"v" + string`: GCC 12 warns falsely (-Wrestrict) at -O3
        name += std::to_string(n++);
        def += " " + name + "=" + line.substr(0, tab);
        want += " " + name + "=" + value;
    }
    ASSERT_GT(n, 50);
    ASSERT_EQ(file_write("kprobe_events", def), 0) << read("error_log");
    ASSERT_EQ(file_write("events/kprobes/fa/enable", "1"), 0);
    g_record(&ttarget_first, ttarget_greeting, -7, 12345);
    const auto lines = events_in_trace("fa");
    ASSERT_EQ(lines.size(), 1u);
    const std::string head = "fa: (" + symbolize(reinterpret_cast<uint64_t>(&ttarget_record), true) + ")";
    EXPECT_EQ(lines[0], head + want);
}

// "{C*N}" in `text` stands for N times the character C.
std::string expand_runs(std::string text) {
    for (size_t at; (at = text.find('{')) != std::string::npos && text.find("*", at) == at + 2;) {
        const size_t end = text.find('}', at);
        const size_t n = std::stoul(text.substr(at + 3, end - at - 3));
        text.replace(at, end - at + 1, std::string(n, text[at + 1]));
    }
    return text;
}

TEST_F(TraceFetch, LongStringsFromData) {
    std::ifstream in(data_path("long_strings.txt"));
    std::string line;
    int cases = 0;
    while (std::getline(in, line)) {
        if (line.empty() || line[0] == '#') continue;
        const size_t t1 = line.find('\t'), t2 = line.find('\t', t1 + 1);
        ASSERT_NE(t2, std::string::npos) << line;
        const std::string def = line.substr(0, t1), want = expand_runs(line.substr(t2 + 1));
        size_t len_a = 0, len_b = 0;
        std::istringstream(line.substr(t1 + 1, t2 - t1 - 1)) >> len_a >> len_b;
        SCOPED_TRACE(line.substr(0, t2));
        ASSERT_EQ(file_write("kprobe_events", def), 0) << read("error_log");
        ASSERT_EQ(file_write("events/kprobes/ls/enable", "1"), 0);
        const std::string a(len_a, 'A'), b(len_b, 'b');
        ttarget_rec rec = ttarget_first;
        rec.name = a.c_str();
        g_record(&rec, b.c_str(), 0, 7);
        const auto lines = events_in_trace("ls");
        if (want == "-") {
            EXPECT_EQ(lines.size(), 0u) << "the kernel drops a record of more than 4,072 bytes";
        } else {
            ASSERT_EQ(lines.size(), 1u);
            const size_t args = lines[0].find(") ");
            ASSERT_NE(args, std::string::npos) << lines[0];
            const std::string got = lines[0].substr(args + 2);
            EXPECT_EQ(got.size(), want.size());
            EXPECT_TRUE(got == want) << got.substr(0, 200) << "...";
        }
        const bool miss = want == "-" || want.find("(fault)") != std::string::npos;
        char profile[128];
        snprintf(profile, sizeof profile, "  %-44s %15d %15d\n", "ls", 1, miss ? 1 : 0);
        EXPECT_EQ(read("kprobe_profile"), profile);
        ASSERT_EQ(file_write("events/kprobes/ls/enable", "0"), 0);
        ASSERT_EQ(file_write("kprobe_events", ""), 0);
        ASSERT_EQ(file_write("trace", ""), 0);
        ++cases;
    }
    EXPECT_GE(cases, 18);
}

// Strings are measured and copied a page at a time: one that ends just before an
// unreadable page prints whole, one that runs into it prints (fault).
TEST_F(TraceFetch, StringsNextToAnUnreadablePage) {
    const size_t page = static_cast<size_t>(getpagesize());
    auto *mem =
        static_cast<char *>(mmap(nullptr, 3 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    ASSERT_NE(mem, MAP_FAILED);
    ASSERT_EQ(mprotect(mem + 2 * page, page, PROT_NONE), 0);
    char *end = mem + 2 * page;
    ASSERT_EQ(file_write("kprobe_events", "p:pg ttarget_pointer s=+0(%di):string"), 0) << read("error_log");
    ASSERT_EQ(file_write("events/kprobes/pg/enable", "1"), 0);
    std::memcpy(end - 4, "abc", 4);
    g_pointer(end - 4);
    std::memset(end - 3001, 'q', 3000); // 3,000 characters over two pages, the NUL last
    end[-1] = '\0';
    g_pointer(end - 3001);
    std::memset(end - 100, 'z', 100); // no NUL before the unreadable page
    g_pointer(end - 100);
    const auto lines = events_in_trace("pg");
    ASSERT_EQ(lines.size(), 3u) << read("trace");
    EXPECT_NE(lines[0].find(") s=\"abc\""), std::string::npos) << lines[0];
    EXPECT_NE(lines[1].find(") s=\"" + std::string(3000, 'q') + "\""), std::string::npos);
    EXPECT_NE(lines[2].find(") s=(fault)"), std::string::npos) << lines[2];
    munmap(mem, 3 * page);
}

TEST_F(TraceFetch, ArgumentsPastTheSixthAndReturnProbes) {
    ASSERT_EQ(file_write("kprobe_events", "p:eight ttarget_eight $arg1 $arg6 $arg7 $arg8 $stack1:u8"), 0)
        << read("error_log");
    ASSERT_EQ(file_append("kprobe_events", "r:eightr ttarget_eight $arg2 a8=$arg8:s64 $retval:s64 old=+0($arg7):u8"), 0)
        << read("error_log");
    ASSERT_EQ(file_append("kprobe_events", "r:triple ttarget_triple rv ra a0"), 0) << read("error_log");
    ASSERT_EQ(file_write("events/kprobes/enable", "1"), 0);
    EXPECT_EQ(read("events/kprobes/enable"), "1\n");
    EXPECT_EQ(g_eight(1, 2, 3, 4, 5, 6, 7, -8), 20);
    EXPECT_EQ(g_triple(14), 42);
    auto lines = events_in_trace("eight");
    ASSERT_EQ(lines.size(), 1u) << read("trace");
    EXPECT_EQ(lines[0], "eight: (" + symbolize(reinterpret_cast<uint64_t>(&ttarget_eight), true) +
                            ") arg1=0x1 arg2=0x6 arg3=0x7 arg4=0xfffffffffffffff8 arg5=7");
    lines = events_in_trace("eightr");
    ASSERT_EQ(lines.size(), 1u);
    // "(CALLER+OFF/SIZE <- ttarget_eight)"; $arg8 and $arg7 are values saved at entry.
    EXPECT_NE(lines[0].find(" <- ttarget_eight) arg1=0x2 a8=-8 arg3=20 old="), std::string::npos) << lines[0];
    lines = events_in_trace("triple");
    ASSERT_EQ(lines.size(), 1u);
    EXPECT_NE(lines[0].find(" <- ttarget_triple) arg1=0x2a arg2=0x"), std::string::npos) << lines[0];
    EXPECT_NE(lines[0].find(" arg3=0xe"), std::string::npos) << lines[0];
}

TEST_F(TraceFetch, BadPointerGivesTheFaultFormAndAMiss) {
    ASSERT_EQ(file_write("kprobe_events", "p:bad ttarget_pointer s=+0(%di):string v=+0(%di):u32 ok=%di"), 0);
    ASSERT_EQ(file_write("events/kprobes/bad/enable", "1"), 0);
    EXPECT_EQ(g_pointer(reinterpret_cast<const char *>(16)), 1);
    EXPECT_EQ(g_pointer(ttarget_greeting), 1);
    const auto lines = events_in_trace("bad");
    ASSERT_EQ(lines.size(), 2u);
    EXPECT_NE(lines[0].find(") s=(fault) v=0 ok=0x10"), std::string::npos) << lines[0];
    EXPECT_NE(lines[1].find(") s=\"hello\" v=1819043176 ok=0x"), std::string::npos) << lines[1];
    char want[128];
    snprintf(want, sizeof want, "  %-44s %15d %15d\n", "bad", 2, 1);
    EXPECT_EQ(read("kprobe_profile"), want);
}

TEST_F(TraceFetch, UprobeFormPathAndFileOffset) {
    // The file offset of ttarget_triple in this executable, from its mapping.
    const uint64_t addr = reinterpret_cast<uint64_t>(&ttarget_triple);
    std::ifstream maps("/proc/self/maps");
    std::string line;
    uint64_t off = 0;
    while (std::getline(maps, line)) {
        unsigned long long lo, hi, moff;
        if (sscanf(line.c_str(), "%llx-%llx %*s %llx", &lo, &hi, &moff) == 3 && addr >= lo && addr < hi)
            off = addr - lo + moff;
    }
    ASSERT_NE(off, 0u);
    char def[128], shown[128];
    snprintf(def, sizeof def, "p:up /proc/self/exe:0x%llx x=%%di", static_cast<unsigned long long>(off));
    snprintf(shown, sizeof shown, "p:uprobes/up /proc/self/exe:0x%016llx x=%%di\n",
             static_cast<unsigned long long>(off));
    ASSERT_EQ(file_write("kprobe_events", def), 0) << read("error_log");
    EXPECT_EQ(read("kprobe_events"), shown);
    snprintf(def, sizeof def, "r /proc/self/exe:0x%llx $retval", static_cast<unsigned long long>(off));
    ASSERT_EQ(file_append("kprobe_events", def), 0) << read("error_log");
    ASSERT_EQ(file_write("events/uprobes/enable", "1"), 0);
    g_triple(11);
    auto lines = events_in_trace("up");
    ASSERT_EQ(lines.size(), 1u);
    EXPECT_NE(lines[0].find(") x=0xb"), std::string::npos) << lines[0];
    char gen[64];
    snprintf(gen, sizeof gen, "r_exe_0x%llx", static_cast<unsigned long long>(off)); // the given path's base name
    lines = events_in_trace(gen);
    ASSERT_EQ(lines.size(), 1u) << read("kprobe_events");
    EXPECT_NE(lines[0].find(" <- ttarget_triple) arg1=0x21"), std::string::npos) << lines[0];
}

// The file offset of an address of this executable, from its mapping.
uint64_t file_offset_of(const void *p) {
    const uint64_t addr = reinterpret_cast<uint64_t>(p);
    std::ifstream maps("/proc/self/maps");
    std::string line;
    while (std::getline(maps, line)) {
        unsigned long long lo, hi, moff;
        if (sscanf(line.c_str(), "%llx-%llx %*s %llx", &lo, &hi, &moff) == 3 && addr >= lo && addr < hi)
            return addr - lo + moff;
    }
    return 0;
}

TEST_F(TraceFetch, SdtSemaphoreCountsWhileEnabled) {
    const uint64_t off = file_offset_of(reinterpret_cast<const void *>(&ttarget_triple));
    const uint64_t ref = file_offset_of(&ttarget_semaphore);
    ASSERT_NE(off, 0u);
    ASSERT_NE(ref, 0u);
    char def[160], shown[160];
    snprintf(def, sizeof def, "p:sem /proc/self/exe:0x%llx(0x%llx)", static_cast<unsigned long long>(off),
             static_cast<unsigned long long>(ref));
    snprintf(shown, sizeof shown, "p:uprobes/sem /proc/self/exe:0x%016llx(0x%llx)\n",
             static_cast<unsigned long long>(off), static_cast<unsigned long long>(ref));
    ASSERT_EQ(file_write("kprobe_events", def), 0) << read("error_log");
    EXPECT_EQ(read("kprobe_events"), shown);
    EXPECT_EQ(ttarget_semaphore, 0);
    ASSERT_EQ(file_write("events/uprobes/sem/enable", "1"), 0);
    EXPECT_EQ(ttarget_semaphore, 1);
    ASSERT_EQ(file_write("events/uprobes/sem/enable", "0"), 0);
    EXPECT_EQ(ttarget_semaphore, 0);
}

TEST_F(TraceFetch, ModuleGivenAsAFullPath) {
    char self[4096];
    const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    ASSERT_GT(n, 0);
    self[n] = '\0';
    const std::string def = std::string("p:bypath ") + self + ":ttarget_triple x=%di";
    ASSERT_EQ(file_write("kprobe_events", def), 0) << read("error_log");
    EXPECT_EQ(read("kprobe_events"), std::string("p:kprobes/bypath ") + self + ":ttarget_triple x=%di\n");
    ASSERT_EQ(file_write("events/kprobes/bypath/enable", "1"), 0);
    g_triple(9);
    const auto lines = events_in_trace("bypath");
    ASSERT_EQ(lines.size(), 1u);
    EXPECT_NE(lines[0].find(") x=0x9"), std::string::npos);
}

TEST_F(TraceFetch, ModuleNotLoadedYetIsAccepted) {
    ASSERT_EQ(file_write("kprobe_events", "p:later libnot_loaded_yet.so:some_function"), 0) << read("error_log");
    EXPECT_EQ(read("kprobe_events"), "p:kprobes/later libnot_loaded_yet.so:some_function\n");
}

TEST_F(TraceFetch, NewEventsAreDisabledAndDisabledEventsRecordNothing) {
    ASSERT_EQ(file_write("kprobe_events", "p:quiet ttarget_triple x=%di"), 0);
    EXPECT_EQ(read("events/kprobes/quiet/enable"), "0\n");
    g_triple(1);
    EXPECT_TRUE(events_in_trace("quiet").empty());
    ASSERT_EQ(file_write("events/kprobes/quiet/enable", "1"), 0);
    ASSERT_EQ(file_write("tracing_on", "0"), 0);
    g_triple(2);
    ASSERT_EQ(file_write("tracing_on", "1"), 0);
    g_triple(3);
    const auto lines = events_in_trace("quiet");
    ASSERT_EQ(lines.size(), 1u);
    EXPECT_NE(lines[0].find(") x=0x3"), std::string::npos);
}

TEST_F(TraceFetch, FormatFileAsTheKernelPrintsIt) {
    std::ifstream in(data_path("format_golden.txt"));
    std::string line, def, want;
    while (std::getline(in, line)) {
        if (line.rfind("# definition: ", 0) == 0)
            def = line.substr(14);
        else if (line[0] != '#')
            want += line + "\n";
    }
    ASSERT_FALSE(def.empty());
    ASSERT_EQ(file_write("kprobe_events", def), 0) << read("error_log");
    const std::string id = read("events/kprobes/fmt/id");
    const size_t at = want.find("@ID@");
    ASSERT_NE(at, std::string::npos);
    want.replace(at, 4, id.substr(0, id.size() - 1));
    EXPECT_EQ(read("events/kprobes/fmt/format"), want);
}

TEST_F(TraceFetch, CApiReadsAndWrites) {
    EXPECT_EQ(ukp_trace_write("/sys/kernel/tracing/kprobe_events", "p:capi ttarget_triple"), 0);
    char *text = nullptr;
    ASSERT_EQ(ukp_trace_read("kprobe_events", &text), 0);
    EXPECT_STREQ(text, "p:kprobes/capi ttarget_triple\n");
    free(text);
    EXPECT_EQ(ukp_trace_read("events/kprobes/nosuch/id", &text), -ENOENT);
    EXPECT_EQ(ukp_trace_append("kprobe_events", "p:capi2 ttarget_triple %zz"), -EINVAL);
}

// Run by StartupVariable in a child whose UKP_EVENTS the agent applied before main.
TEST(TraceStartupChild, EventsAppliedBeforeMain) {
    if (getenv("UKP_EVENTS") == nullptr) GTEST_SKIP() << "run by TraceStartup.Variable";
    EXPECT_EQ(read("kprobe_events"), "p:kprobes/boot ttarget_triple x=%di y=+0(%si):u8\n");
    EXPECT_EQ(read("events/kprobes/boot/enable"), "1\n");
    g_triple(5);
    const auto lines = events_in_trace("boot");
    ASSERT_EQ(lines.size(), 1u);
    EXPECT_NE(lines[0].find(") x=0x5 y="), std::string::npos);
}

TEST(TraceStartup, Variable) {
    char self[4096];
    const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    ASSERT_GT(n, 0);
    self[n] = '\0';
    std::vector<std::string> env = {"UKP_EVENTS=p:boot,ttarget_triple,x=%di,y=+0(%si):u8"};
    for (char **e = environ; *e != nullptr; ++e)
        if (strncmp(*e, "UKP_EVENTS=", 11) != 0) env.emplace_back(*e);
    std::vector<char *> envp;
    for (auto &s : env) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::string filter = "--gtest_filter=TraceStartupChild.*";
    char *argv[] = {self, filter.data(), nullptr};
    pid_t pid = 0;
    ASSERT_EQ(posix_spawn(&pid, self, nullptr, nullptr, argv, envp.data()), 0);
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 0);
}

} // namespace
