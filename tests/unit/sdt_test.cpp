// SDT probes (<sys/sdt.h>'s .note.stapsdt) and t: events on them: this program carries its
// own probes, written as the header's macro writes them (a nop, a note naming it, the
// arguments' operands as the assembler prints them).
#include <gtest/gtest.h>

#include <cinttypes>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "symbols/symbols.hpp"
#include "trace/events.hpp"
#include "trace_files.hpp"

using namespace ukp::trace;
using namespace ukp::trace::test_files;

// One SDT site: a nop, and a note with its address, the .stapsdt.base it was computed
// against, a semaphore (none), provider, name and the arguments' specs. Two arguments: a
// 64-bit unsigned one and a 32-bit signed one, in whatever operands the compiler picks.
#define UKT_SDT2(provider, name, a1, a2)                                                                               \
    __asm__ __volatile__("990: nop\n"                                                                                  \
                         ".pushsection .note.stapsdt,\"?\",\"note\"\n"                                                 \
                         ".balign 4\n"                                                                                 \
                         ".4byte 992f-991f, 994f-993f, 3\n"                                                            \
                         "991: .asciz \"stapsdt\"\n"                                                                   \
                         "992: .balign 4\n"                                                                            \
                         "993: .8byte 990b\n"                                                                          \
                         ".8byte _.stapsdt.base\n"                                                                     \
                         ".8byte 0\n"                                                                                  \
                         ".asciz \"" provider "\"\n"                                                                   \
                         ".asciz \"" name "\"\n"                                                                       \
                         ".asciz \"8@%[x] -4@%[y]\"\n"                                                                 \
                         "994: .balign 4\n"                                                                            \
                         ".popsection\n"                                                                               \
                         ".ifndef _.stapsdt.base\n"                                                                    \
                         ".pushsection .stapsdt.base,\"aG\",\"progbits\",.stapsdt.base,comdat\n"                       \
                         ".weak _.stapsdt.base\n"                                                                      \
                         ".hidden _.stapsdt.base\n"                                                                    \
                         "_.stapsdt.base: .space 1\n"                                                                  \
                         ".size _.stapsdt.base, 1\n"                                                                   \
                         ".popsection\n"                                                                               \
                         ".endif\n" ::[x] "nor"((unsigned long)(a1)),                                                  \
                         [y] "nor"((int)(a2)))

extern "C" {
__attribute__((noinline)) void ukt_request(unsigned long id, int status) { UKT_SDT2("ukt", "request", id, status); }
__attribute__((noinline)) void ukt_two_sites(unsigned long id, int status) {
    UKT_SDT2("ukt", "twice", id, status);
    asm volatile("" ::: "memory");
    UKT_SDT2("ukt", "twice", id + 1000, -status);
}
}

namespace {

TEST(Sdt, TheProgramsOwnProbesAreRead) {
    ukp::sym::Registry r;
    r.refresh();
    int found = 0;
    for (const ukp::sym::Object *o : r.objects_named(""))
        for (const ukp::sym::SdtProbe &p : ukp::sym::sdt_probes(*o))
            if (p.provider == "ukt") {
                ++found;
                EXPECT_TRUE(p.name == "request" || p.name == "twice") << p.name;
                EXPECT_NE(p.args.find("8@"), std::string::npos) << p.args;
                EXPECT_EQ(p.semaphore, 0u);
                // The site is a nop inside the function that holds it.
                EXPECT_EQ(*reinterpret_cast<const unsigned char *>(p.pc), 0x90) << std::hex << p.pc;
            }
    EXPECT_EQ(found, 3);
}

} // namespace
namespace {

class SdtEvents : public CleanTracer {};

// fprobetrace.rst's t: on an SDT probe: group tracepoints, the probe's name, $argN with the
// note's types (a 64-bit unsigned, a 32-bit signed one).
TEST_F(SdtEvents, ATracepointEventRecordsTheProbesArguments) {
    ASSERT_EQ(file_append("dynamic_events", "t ukt:request id=$arg1 status=$arg2"), 0) << read("error_log");
    EXPECT_EQ(read("dynamic_events"), "t:tracepoints/request ukt:request id=$arg1 status=$arg2\n");
    const std::string format = read("events/tracepoints/request/format");
    EXPECT_NE(format.find("field:u64 id;"), std::string::npos) << format;
    EXPECT_NE(format.find("field:s32 status;"), std::string::npos) << format;
    ASSERT_EQ(file_write("events/tracepoints/request/enable", "1"), 0);
    ukt_request(42, -7);
    ukt_request(43, 200);
    ASSERT_EQ(file_write("events/tracepoints/request/enable", "0"), 0);
    const auto lines = trace_lines("request");
    ASSERT_EQ(lines.size(), 2u) << read("trace");
    EXPECT_NE(lines[0].find("request: (ukt_request+0x"), std::string::npos) << lines[0];
    EXPECT_NE(lines[0].find(" id=42 status=-7"), std::string::npos) << lines[0];
    EXPECT_NE(lines[1].find(" id=43 status=200"), std::string::npos) << lines[1];
}

// One event on every site of a probe, each site's arguments where that site has them;
// $arg* names them all; explicit types and dereferences as for any event.
TEST_F(SdtEvents, EverySiteOfAProbeUnderOneEvent) {
    ASSERT_EQ(file_append("dynamic_events", "t:g/both ukt:twice $arg*"), 0) << read("error_log");
    EXPECT_EQ(read("dynamic_events"), "t:g/both ukt:twice arg1=$arg1 arg2=$arg2\n");
    ASSERT_EQ(file_write("events/g/both/enable", "1"), 0);
    ukt_two_sites(5, 9);
    ASSERT_EQ(file_write("events/g/both/enable", "0"), 0);
    const auto lines = trace_lines("both");
    ASSERT_EQ(lines.size(), 2u) << read("trace");
    EXPECT_NE(lines[0].find(" arg1=5 arg2=9"), std::string::npos) << lines[0];
    EXPECT_NE(lines[1].find(" arg1=1005 arg2=-9"), std::string::npos) << lines[1];
    ASSERT_EQ(file_append("dynamic_events", "t:hex ukt:request id=$arg1:x64"), 0) << read("error_log");
    EXPECT_NE(read("events/tracepoints/hex/format").find("field:u64 id;"), std::string::npos);
}

TEST_F(SdtEvents, UnknownTracepointsAndTheListOfProbes) {
    struct Case {
        const char *line;
        size_t caret;
        const char *message;
    } cases[] = {
        {"t:e ukt:nosuch", 4, "Tracepoint is not found"},
        {"t:e nosuch:request", 4, "Tracepoint is not found"},
        {"t:e ukt", 4, "Tracepoint is not found"},
        {"t:e libc.so.6:ukt:request", 4, "Tracepoint is not found"}, // not that object's
        {"t1:e ukt:request", 1, "Maxactive is only for function exit"},
        {"t:e ukt:request $arg3", 16, "Invalid argument number"},
        {"t:e ukt:request $retval", 16, "$retval is not available on probe"},
    };
    for (const Case &c : cases) {
        SCOPED_TRACE(c.line);
        ASSERT_EQ(file_write("error_log", ""), 0);
        EXPECT_NE(file_append("dynamic_events", c.line), 0);
        EXPECT_EQ(read("dynamic_events"), "");
        expect_logged("trace_fprobe", c.message, c.line, c.caret);
    }
    const std::string list = read("available_tracepoints");
    EXPECT_NE(list.find(":ukt:request\n"), std::string::npos) << list;
    EXPECT_NE(list.find(":ukt:twice\n"), std::string::npos) << list;
    EXPECT_EQ(list.find(":ukt:twice\n"), list.rfind(":ukt:twice\n")); // once, for its two sites
}

} // namespace
