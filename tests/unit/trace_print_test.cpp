// What a reader in another process (the CLI) needs to print records as the agent does:
// the event table survives its text, and the objects read from /proc/PID/maps name
// addresses as the link map's do.
#include <gtest/gtest.h>

#include <sys/auxv.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <ctime>

#include "symbols/symbols.hpp"
#include "trace/print.hpp"

namespace ukp::trace {
namespace {

int g_print_test_data[16]; // a data symbol of the main program

__attribute__((noinline)) int print_test_function(int x) { return x * 7 + g_print_test_data[x & 15]; }

EventInfo sample_event() {
    EventInfo e{2001, "grp", "ev", true, common_fields(), "\"(%lx <- %lx) s=\\\"%s\\\"\", REC->__probe_func"};
    e.fields.push_back({"__probe_func", "unsigned long", 8, 8, false, Print::kHex, 0, false});
    e.fields.push_back({"__probe_ret_ip", "unsigned long", 16, 8, false, Print::kHex, 0, false});
    e.fields.push_back({"s", "__data_loc char[]", 24, 4, false, Print::kString, 2, false});
    e.fields.push_back({"at", "u64", 32, 8, false, Print::kSymbol, 0, false});
    return e;
}

TEST(EventTable, ItsTextGivesBackTheSameEvents) {
    const EventInfo a = sample_event();
    const EventInfo b{2000, "kprobes", "plain", false, common_fields(), "\"(%lx)\", REC->__probe_ip"};
    const std::string text = event_table_text({&b, &a});
    std::map<uint16_t, EventInfo> got;
    std::string why;
    ASSERT_EQ(parse_event_table(text, &got, &why), 0) << why;
    ASSERT_EQ(got.size(), 2u);
    for (const EventInfo *want : {&a, &b}) {
        const EventInfo &e = got.at(want->id);
        EXPECT_EQ(e.group, want->group);
        EXPECT_EQ(e.name, want->name);
        EXPECT_EQ(e.is_return, want->is_return);
        EXPECT_EQ(e.print_fmt, want->print_fmt);
        ASSERT_EQ(e.fields.size(), want->fields.size());
        for (size_t i = 0; i < e.fields.size(); ++i) {
            const Field &x = e.fields[i], &y = want->fields[i];
            EXPECT_EQ(x.name, y.name);
            EXPECT_EQ(x.c_type, y.c_type);
            EXPECT_EQ(x.offset, y.offset);
            EXPECT_EQ(x.size, y.size);
            EXPECT_EQ(x.is_signed, y.is_signed);
            EXPECT_EQ(x.print, y.print);
            EXPECT_EQ(x.array_len, y.array_len);
            EXPECT_EQ(x.common, y.common);
        }
    }
}

TEST(EventTable, AnotherVersionOrAnUnknownLineIsRefused) {
    std::map<uint16_t, EventInfo> got;
    std::string why;
    EXPECT_EQ(parse_event_table("ukprobes-event-table 3\n", &got, &why), -EPROTO);
    EXPECT_NE(why.find("ukprobes-event-table 2"), std::string::npos) << why;
    EXPECT_EQ(parse_event_table("ukprobes-event-table 1\nevent\t1\tg\tn\tp\n", &got, &why), 0)
        << "a capture written before event probes: " << why;
    EXPECT_EQ(parse_event_table("ukprobes-event-table 2\nevent\t1\tg\tn\tp\nwhat\t1\n", &got, &why), -EPROTO);
    EXPECT_NE(why.find("line 3"), std::string::npos) << why;
    EXPECT_EQ(parse_event_table("ukprobes-event-table 2\nfield\tx\tu8\t0\t1\t0\thex\t0\t0\n", &got, &why), -EPROTO)
        << "a field before any event";
    EXPECT_EQ(parse_event_table("ukprobes-event-table 2\nevent\t1\tg\tn\tx\n", &got, &why), -EPROTO)
        << "an event of no known kind";
}

// An event probe's kind carries the event it is on, which its records print.
TEST(EventTable, AnEventProbeKeepsTheEventItIsOn) {
    EventInfo e{2002, "eprobes", "small", false, common_fields(), "\"(kprobes.src)\"", "kprobes.src"};
    const std::string text = event_table_text({&e});
    EXPECT_NE(text.find("event\t2002\teprobes\tsmall\te:kprobes.src\n"), std::string::npos) << text;
    std::map<uint16_t, EventInfo> got;
    std::string why;
    ASSERT_EQ(parse_event_table(text, &got, &why), 0) << why;
    EXPECT_EQ(got[2002].attached_to, "kprobes.src");
    EXPECT_FALSE(got[2002].is_return);
}

// Names from the link map (the agent) and from /proc/PID/maps (the CLI), for this process.
TEST(ProcessSymbols, TheMapsNameAddressesAsTheLinkMapDoes) {
    sym::Registry linked, mapped;
    linked.refresh();
    mapped.refresh_from_maps(getpid());
    ASSERT_FALSE(mapped.objects().empty());
    EXPECT_TRUE(mapped.objects().front()->main_program);
    const uint64_t addrs[] = {
        reinterpret_cast<uint64_t>(&print_test_function) + 3,
        reinterpret_cast<uint64_t>(&g_print_test_data[5]),
        reinterpret_cast<uint64_t>(&std::fopen),
        reinterpret_cast<uint64_t>(&clock_gettime), // may be libc's or the vdso's
        getauxval(AT_SYSINFO_EHDR) + 0x800,         // in the vdso's image
    };
    for (uint64_t a : addrs) {
        EXPECT_EQ(symbol_text(mapped.objects(), a, true), symbol_text(linked.objects(), a, true)) << std::hex << a;
        EXPECT_EQ(symbol_text(mapped.objects(), a, false), symbol_text(linked.objects(), a, false)) << std::hex << a;
    }
    EXPECT_EQ(symbol_text(mapped.objects(), reinterpret_cast<uint64_t>(&print_test_function), true)
                  .rfind("_ZN3ukp5trace12_GLOBAL__N_119print_test_functionEi+0x0/", 0),
              0u);
    EXPECT_GE(print_test_function(1), 7);
}

} // namespace
} // namespace ukp::trace
