// Hist triggers: the hist file against golden text (the kernel's format), drops when the
// table is full, pause/cont/clear, .sym through the symbolizer, and 8 threads updating one
// table with exact totals.
#include "trace/hist_table.hpp"
#include "trace/trigger.hpp"
#include "null_trigger_host.hpp"

#include <ukprobes/kprobes.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

namespace ukp::trace {
namespace {

using test_hosts::NullHost;

std::vector<Field> test_fields() {
    std::vector<Field> f = common_fields();
    f.push_back({"__probe_ip", "unsigned long", 8, 8, false, Print::kHex});
    f.push_back({"a", "s64", 16, 8, true, Print::kSigned});
    f.push_back({"b", "u32", 24, 4, false, Print::kUnsigned});
    f.push_back({"s", "__data_loc char[]", 28, 4, true, Print::kString});
    return f;
}

std::vector<uint8_t> record(int32_t pid, uint64_t ip, int64_t a, uint32_t b, const std::string &s) {
    std::vector<uint8_t> r(32 + s.size() + 1, 0);
    std::memcpy(r.data() + 4, &pid, 4);
    std::memcpy(r.data() + 8, &ip, 8);
    std::memcpy(r.data() + 16, &a, 8);
    std::memcpy(r.data() + 24, &b, 4);
    const uint32_t loc = 32u | uint32_t(s.size() + 1) << 16;
    std::memcpy(r.data() + 28, &loc, 4);
    std::memcpy(r.data() + 32, s.data(), s.size());
    return r;
}

// The golden file's text. With UKP_REBASE=1 in the environment, `actual` is written
// there first (review the diff before committing it).
std::string golden(const std::string &name, const std::string &actual) {
    const std::string path = std::string(UKP_FILTER_DATA) + "/" + name;
    if (getenv("UKP_REBASE")) std::ofstream(path) << actual;
    std::ifstream in(path);
    EXPECT_TRUE(in) << name;
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

struct Fixture {
    NullHost host;
    TriggerSet set;
    std::vector<Field> fields = test_fields();
    pt_regs regs{};
    void fire(int32_t pid, uint64_t ip, int64_t a, uint32_t b, const std::string &s, const char *comm = "worker") {
        const auto r = record(pid, ip, a, b, s);
        set.fire(r.data(), uint32_t(r.size()), comm, regs);
    }
};

void feed(Fixture &f) {
    f.fire(10, 0x401000, 1, 100, "hello", "main");
    f.fire(10, 0x401000, 1, 50, "hello", "main");
    f.fire(11, 0x401010, -3, 7, "world", "worker");
    f.fire(12, 0x402000, 1000, 1, "hello", "other");
    f.fire(10, 0x401000, 1, 25, "x", "main");
}

TEST(Hist, GoldenKeysValuesSort) {
    Fixture f;
    ASSERT_EQ(f.set.write("hist:keys=a:vals=b:sort=b.descending", f.fields, f.host, nullptr), 0);
    ASSERT_EQ(f.set.write("hist:keys=s,common_pid.execname:values=hitcount,a.hex if b > 1", f.fields, f.host, nullptr),
              0);
    ASSERT_EQ(f.set.write("hist:keys=b.log2,a.hex:sort=a", f.fields, f.host, nullptr), 0);
    ASSERT_EQ(f.set.write("hist:keys=b.buckets=10:size=200", f.fields, f.host, nullptr), 0);
    feed(f);
    EXPECT_EQ(f.set.text(), golden("hist_basic.trigger", f.set.text()));
    EXPECT_EQ(f.set.hist_text(), golden("hist_basic.hist", f.set.hist_text()));
}

TEST(Hist, SymbolKeysUseTheSymbolizer) {
    Fixture f;
    f.set.set_symbolizer([](uint64_t addr, bool off) -> std::string {
        if (addr >= 0x401000 && addr < 0x401100)
            return off ? "main+0x" + std::to_string(addr - 0x401000) + "/0x100" : "main";
        return "";
    });
    ASSERT_EQ(f.set.write("hist:keys=__probe_ip.sym", f.fields, f.host, nullptr), 0);
    ASSERT_EQ(f.set.write("hist:keys=__probe_ip.sym-offset:sort=__probe_ip", f.fields, f.host, nullptr), 0);
    feed(f);
    EXPECT_EQ(f.set.hist_text(), golden("hist_sym.hist", f.set.hist_text()));
}

TEST(Hist, FullTableCountsDrops) {
    Fixture f;
    ASSERT_EQ(f.set.write("hist:keys=a:size=100", f.fields, f.host, nullptr), 0); // rounds up to 128
    for (int i = 0; i < 300; i++) f.fire(1, 0, i % 200, 0, "");
    const std::string text = f.set.hist_text();
    EXPECT_NE(text.find("# trigger info: hist:keys=a:vals=hitcount:sort=hitcount:size=128 [active]\n"),
              std::string::npos);
    // As the kernel's tracing_map: Hits leaves the dropped hits out.
    EXPECT_NE(text.find("\nTotals:\n    Hits: 228\n    Entries: 128\n    Dropped: 72\n"), std::string::npos) << text;
    // Keys 0..199 then 0..99 again: the first 128 distinct keys (0..127) get elements;
    // every hit of 128..199 is a drop.
    size_t entries_hits = 0;
    std::istringstream in(text);
    std::string line;
    while (std::getline(in, line)) {
        const size_t p = line.find("hitcount:");
        if (line.starts_with("{ ") && p != std::string::npos) entries_hits += std::stoul(line.substr(p + 9));
    }
    const size_t d = text.find("Dropped: ");
    ASSERT_NE(d, std::string::npos);
    EXPECT_EQ(entries_hits + std::stoul(text.substr(d + 9)), 300u) << "every hit is counted or dropped";
    EXPECT_EQ(entries_hits, 128u + 100u); // keys 0..99 (first seen first) each hit twice
}

TEST(Hist, PauseContinueClear) {
    Fixture f;
    ASSERT_EQ(f.set.write("hist:keys=b", f.fields, f.host, nullptr), 0);
    FilterError err;
    EXPECT_EQ(f.set.write("hist:keys=b", f.fields, f.host, &err), -EEXIST);
    EXPECT_EQ(err.message, "Hist trigger already exists");
    EXPECT_EQ(f.set.write("hist:keys=a:cont", f.fields, f.host, &err), -ENOENT);
    EXPECT_EQ(err.message, "Can't clear or continue a nonexistent hist trigger");
    f.fire(1, 0, 0, 5, "");
    ASSERT_EQ(f.set.write("hist:keys=b:pause", f.fields, f.host, nullptr), 0);
    EXPECT_EQ(f.set.text(), "hist:keys=b:vals=hitcount:sort=hitcount:size=2048 [paused]\n");
    f.fire(1, 0, 0, 5, "");
    EXPECT_NE(f.set.hist_text().find("{ b:          5 } hitcount:          1\n"), std::string::npos);
    ASSERT_EQ(f.set.write("hist:keys=b:cont", f.fields, f.host, nullptr), 0);
    f.fire(1, 0, 0, 5, "");
    EXPECT_NE(f.set.hist_text().find("{ b:          5 } hitcount:          2\n"), std::string::npos);
    ASSERT_EQ(f.set.write("hist:keys=b:clear", f.fields, f.host, nullptr), 0);
    EXPECT_NE(f.set.hist_text().find("\nTotals:\n    Hits: 0\n    Entries: 0\n    Dropped: 0\n"), std::string::npos);
    f.fire(1, 0, 0, 6, "");
    EXPECT_NE(f.set.hist_text().find("{ b:          6 } hitcount:          1\n"), std::string::npos);
    ASSERT_EQ(f.set.write("!hist:keys=b", f.fields, f.host, nullptr), 0);
    EXPECT_TRUE(f.set.empty());
    EXPECT_EQ(f.set.hist_text(), "");
}

TEST(Hist, BadSpecsAreRejectedWithTheKernelsMessages) {
    Fixture f;
    struct Case {
        const char *text;
        const char *message;
        int pos;
    };
    const Case cases[] = {
        {"hist:keys=nosuch", "Couldn't find field", 10},
        {"hist:keys=a.bogus", "Invalid field modifier", 12},
        {"hist:keys=a:sort=b", "Sort field must be a key or a val", 17},
        {"hist:keys=a:sort=a.up", "Invalid sort modifier", 19},
        {"hist:keys=a:sort=a,hitcount,a", "Too many sort fields (Max = 2)", 17},
        {"hist:keys=a:vals=s", "String type can not be an operand in expression", 17},
        {"hist:keys=a:size=64", "Invalid size (128..131072 entries)", 17},
        {"hist:keys=a if nosuch == 1", "Field not found", 15 + 7},
        {"hist:keys=a:nohitcount", "Non-hitcount value is required for 'nohitcount'", 0},
        {"hist:keys=a:vals=hitcount:NOHC", "Non-hitcount value is required for 'nohitcount'", 0},
        {"hist:keys=a.percent", "Invalid field modifier", 12},
        {"hist:keys=a:vals=hitcount.hex", "Invalid field modifier", 26},
        {"hist:keys=a:vals=b.syscall", "Invalid field modifier", 19},
        {"hist:keys=a:clock=x86-tsc", "Couldn't set trace_clock", 18},
    };
    for (const Case &c : cases) {
        FilterError err{"", -1};
        EXPECT_EQ(f.set.write(c.text, f.fields, f.host, &err), -EINVAL) << c.text;
        EXPECT_EQ(err.message, c.message) << c.text;
        EXPECT_EQ(err.pos, c.pos) << c.text;
    }
    EXPECT_TRUE(f.set.empty());
}

// histogram.rst's value modifiers .percent (a share of the column's total over every
// entry, truncated to hundredths) and .graph (a bar of 20 characters against the largest),
// hitcount's as columns of their own, and :nohitcount leaving the hitcount out.
TEST(Hist, PercentGraphAndNohitcount) {
    Fixture f;
    ASSERT_EQ(f.set.write("hist:keys=common_pid:vals=hitcount.percent,hitcount.graph:sort=common_pid:NOHC", f.fields,
                          f.host, nullptr),
              0);
    ASSERT_EQ(f.set.write("hist:keys=common_pid:vals=b.percent,b:sort=common_pid", f.fields, f.host, nullptr), 0);
    feed(f); // pid 10: three hits, b 175; 11: one, b 7; 12: one, b 1
    EXPECT_EQ(f.set.text(), "hist:keys=common_pid:vals=hitcount.percent,hitcount.graph:sort=common_pid:size=2048:"
                            "nohitcount [active]\n"
                            "hist:keys=common_pid:vals=hitcount,b.percent,b:sort=common_pid:size=2048 [active]\n");
    const std::string h = f.set.hist_text();
    EXPECT_NE(h.find("{ common_pid:         10 }  hitcount (%):  60.00  hitcount: ####################\n"
                     "{ common_pid:         11 }  hitcount (%):  20.00  hitcount: ######              \n"
                     "{ common_pid:         12 }  hitcount (%):  20.00  hitcount: ######              \n"),
              std::string::npos)
        << h;
    // 175/183, 7/183, 1/183 of b's total, truncated as the kernel's __get_percentage().
    EXPECT_NE(h.find("{ common_pid:         10 } hitcount:          3  b (%):  95.62  b:        175\n"
                     "{ common_pid:         11 } hitcount:          1  b (%):   3.82  b:          7\n"
                     "{ common_pid:         12 } hitcount:          1  b (%):   0.54  b:          1\n"),
              std::string::npos)
        << h;
    // "!hist" names the trigger without :nohitcount, as the kernel compares them.
    ASSERT_EQ(f.set.write("!hist:keys=common_pid:vals=hitcount.percent,hitcount.graph:sort=common_pid", f.fields,
                          f.host, nullptr),
              0);
    EXPECT_EQ(f.set.text(), "hist:keys=common_pid:vals=hitcount,b.percent,b:sort=common_pid:size=2048 [active]\n");
}

// :clock=CLOCK, printed (global unless told) by a trigger that reads common_timestamp, as
// the kernel's; a clock other than the nanosecond ones is refused (BadSpecs... above).
TEST(Hist, TheClockIsPrintedWhenTheTimeIsRead) {
    Fixture f;
    ASSERT_EQ(f.set.write("hist:keys=a:t=common_timestamp:clock=mono", f.fields, f.host, nullptr), 0);
    ASSERT_EQ(f.set.write("hist:keys=b:vals=common_timestamp.usecs", f.fields, f.host, nullptr), 0);
    ASSERT_EQ(f.set.write("hist:keys=s:clock=local", f.fields, f.host, nullptr), 0);
    EXPECT_EQ(f.set.text(), "hist:keys=a:vals=hitcount:t=common_timestamp:sort=hitcount:size=2048:clock=mono [active]\n"
                            "hist:keys=b:vals=hitcount,common_timestamp.usecs:sort=hitcount:size=2048:clock=global "
                            "[active]\n"
                            "hist:keys=s:vals=hitcount:sort=hitcount:size=2048 [active]\n");
}

// histogram.rst's variables as values: vals=$VAR sums the variable's value at each hit,
// and the variable may be assigned before or after its use.
TEST(Hist, VariablesSummedAsValues) {
    Fixture f;
    ASSERT_EQ(f.set.write("hist:keys=common_pid:vals=$twice:twice=b*2:sort=common_pid", f.fields, f.host, nullptr), 0);
    ASSERT_EQ(f.set.write("hist:keys=common_pid:ts0=common_timestamp,b2=b:vals=$ts0,$b2", f.fields, f.host, nullptr),
              0);
    feed(f); // pid 10: b 100, 50, 25; 11: 7; 12: 1
    EXPECT_EQ(f.set.text(),
              "hist:keys=common_pid:vals=hitcount,$twice:twice=b*2:sort=common_pid:size=2048 [active]\n"
              "hist:keys=common_pid:vals=hitcount,$ts0,$b2:ts0=common_timestamp,b2=b:sort=hitcount:size=2048:"
              "clock=global [active]\n");
    const std::string h = f.set.hist_text();
    EXPECT_NE(h.find("{ common_pid:         10 } hitcount:          3  twice:        350\n"
                     "{ common_pid:         11 } hitcount:          1  twice:         14\n"
                     "{ common_pid:         12 } hitcount:          1  twice:          2\n"),
              std::string::npos)
        << h;
    EXPECT_NE(h.find("  b2:        175\n"), std::string::npos) << h;
    // The trigger file's line names the trigger again, for "!" (variables joined by commas).
    ASSERT_EQ(f.set.write("!hist:keys=common_pid:vals=hitcount,$ts0,$b2:ts0=common_timestamp,b2=b:sort=hitcount:"
                          "size=2048:clock=global",
                          f.fields, f.host, nullptr),
              0);
    EXPECT_EQ(f.set.text(), "hist:keys=common_pid:vals=hitcount,$twice:twice=b*2:sort=common_pid:size=2048 [active]\n");
    // Numbers alone are worked out, and shown so, as the kernel folds its constants.
    ASSERT_EQ(f.set.write("hist:keys=a:x=1+2*3,y=a+1:vals=$x", f.fields, f.host, nullptr), 0);
    EXPECT_NE(f.set.text().find("hist:keys=a:vals=hitcount,$x:x=7,y=a+1:sort=hitcount:size=2048 [active]\n"),
              std::string::npos)
        << f.set.text();
    f.fire(10, 0, 5, 0, "");
    EXPECT_NE(f.set.hist_text().find("{ a:          5 } hitcount:          1  x:          7\n"), std::string::npos)
        << f.set.hist_text();
    ASSERT_EQ(f.set.write("!hist:keys=a:x=1+2*3,y=a+1:vals=$x", f.fields, f.host, nullptr), 0);
    FilterError err{"", -1};
    EXPECT_EQ(f.set.write("hist:keys=common_pid:vals=b,$nosuch:x=b", f.fields, f.host, &err), -EINVAL);
    EXPECT_EQ(err.message, "Couldn't find variable");
    EXPECT_EQ(err.pos, 28);
}

// .syscall: a key holding a system call's number prints its name (x86-64's numbers, from
// the kernel headers), "unknown_syscall" for a number that names none.
TEST(Hist, SyscallKeysPrintTheCallsName) {
    Fixture f;
    ASSERT_EQ(f.set.write("hist:keys=b.syscall:sort=b", f.fields, f.host, nullptr), 0);
    EXPECT_EQ(f.set.text(), "hist:keys=b.syscall:vals=hitcount:sort=b.syscall:size=2048 [active]\n");
    f.fire(1, 0, 0, 0, "");
    f.fire(1, 0, 0, 1, "");
    f.fire(1, 0, 0, 1, "");
    f.fire(1, 0, 0, 999, "");
    const std::string h = f.set.hist_text();
    EXPECT_NE(h.find("{ b: sys_read                      [  0] } hitcount:          1\n"
                     "{ b: sys_write                     [  1] } hitcount:          2\n"
                     "{ b: unknown_syscall               [999] } hitcount:          1\n"),
              std::string::npos)
        << h;
}

// histogram.rst's named triggers: hist:name=NAME on two events shares one table (each
// hist file shows it whole); each trigger keeps its own filter and pause; a trigger whose
// keys or values differ is refused while the name is installed, and taken once none is.
TEST(Hist, TriggersOfOneNameShareTheirTable) {
    Fixture rx, tx; // two events with the same fields
    ASSERT_EQ(rx.set.write("hist:name=foo:keys=b:vals=a", rx.fields, rx.host, nullptr), 0);
    ASSERT_EQ(tx.set.write("hist:name=foo:keys=b:vals=a if a > 0", tx.fields, tx.host, nullptr), 0);
    EXPECT_EQ(tx.set.text(), "hist:name=foo:keys=b:vals=hitcount,a:sort=hitcount:size=2048 if a > 0 [active]\n");
    rx.fire(1, 0, 1, 5, "");
    tx.fire(1, 0, 2, 5, "");
    tx.fire(1, 0, 3, 6, "");
    tx.fire(1, 0, -1, 6, ""); // tx's filter: not counted
    const std::string both = "{ b:          6 } hitcount:          1  a:          3\n"
                             "{ b:          5 } hitcount:          2  a:          3\n";
    EXPECT_NE(rx.set.hist_text().find(both), std::string::npos) << rx.set.hist_text();
    EXPECT_NE(tx.set.hist_text().find(both), std::string::npos) << tx.set.hist_text();
    EXPECT_NE(rx.set.hist_text().find("Hits: 3\n"), std::string::npos);
    // Paused on one event: the other still counts into the table.
    ASSERT_EQ(tx.set.write("hist:name=foo:keys=b:vals=a:pause if a > 0", tx.fields, tx.host, nullptr), 0);
    tx.fire(1, 0, 4, 6, "");
    rx.fire(1, 0, 4, 6, "");
    EXPECT_NE(tx.set.hist_text().find("{ b:          6 } hitcount:          2  a:          7\n"), std::string::npos)
        << tx.set.hist_text();
    FilterError err{"", -1};
    EXPECT_EQ(tx.set.write("hist:name=foo:keys=a", tx.fields, tx.host, &err), -EINVAL);
    EXPECT_EQ(err.message, "Named hist trigger doesn't match existing named trigger (includes variables)");
    EXPECT_EQ(err.pos, 10);
    ASSERT_EQ(rx.set.write("!hist:name=foo:keys=b:vals=a", rx.fields, rx.host, nullptr), 0);
    EXPECT_EQ(tx.set.write("hist:name=foo:keys=a", tx.fields, tx.host, nullptr), -EINVAL); // tx still has it
    ASSERT_EQ(tx.set.write("!hist:name=foo:keys=b:vals=a if a > 0", tx.fields, tx.host, nullptr), 0);
    ASSERT_EQ(tx.set.write("hist:name=foo:keys=a", tx.fields, tx.host, nullptr), 0);
    tx.fire(1, 0, 9, 6, "");
    EXPECT_NE(tx.set.hist_text().find("{ a:          9 } hitcount:          1\n"), std::string::npos)
        << tx.set.hist_text();
}

// A hit whose key's bucket is claimed by a hit that has not published it yet (a thread
// preempted between the two stores) is not dropped: it passes the bucket over, and the
// reader adds up the key once the other hit publishes it too.
TEST(Hist, ABucketLeftHalfFilledIsPassedOverNotDropped) {
    const uint8_t key[8] = {42};
    HistTable first(128, 8, 2);
    const int64_t el = first.find_or_insert(key, "a");
    ASSERT_GE(el, 0);
    uint32_t bucket = 0;
    while (bucket < first.n_buckets && first.bucket_elt[bucket].load() != uint32_t(el) + 1) bucket++;
    ASSERT_LT(bucket, first.n_buckets);
    const uint32_t hash = first.bucket_hash[bucket].load();

    // The same key's first bucket, claimed and left unfilled by another hit.
    HistTable t(128, 8, 2);
    t.bucket_hash[bucket].store(hash);
    const int64_t mine = t.find_or_insert(key, "b");
    ASSERT_GE(mine, 0) << "dropped";
    EXPECT_EQ(t.drops.load(), 0u);
    t.sums[size_t(mine) * 2].fetch_add(1);
    t.sums[size_t(mine) * 2 + 1].fetch_add(10);
    // The other hit goes on: it takes an element and publishes it in its bucket.
    const uint32_t other = t.next_elt.fetch_add(1);
    std::memcpy(t.keys.get() + size_t(other) * 8, key, 8);
    t.bucket_elt[bucket].store(other + 1);
    t.sums[size_t(other) * 2].fetch_add(1);
    t.sums[size_t(other) * 2 + 1].fetch_add(5);
    // Later hits find the first bucket; the reader shows one line with both.
    EXPECT_EQ(t.find_or_insert(key, "c"), int64_t(other));
    const auto lines = t.published();
    ASSERT_EQ(lines.size(), 1u);
    EXPECT_EQ(lines[0].sums, (std::vector<uint64_t>{2, 15}));
}

TEST(Hist, EightThreadsExactTotals) {
    Fixture f;
    ASSERT_EQ(f.set.write("hist:keys=b:vals=a:size=4096", f.fields, f.host, nullptr), 0);
    constexpr int kThreads = 8, kPerThread = 200000, kKeys = 1000;
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; t++)
        threads.emplace_back([&, t] {
            std::vector<std::vector<uint8_t>> recs;
            for (int k = 0; k < kKeys; k++) recs.push_back(record(t, 0, t + 1, uint32_t(k), ""));
            pt_regs regs{};
            for (int i = 0; i < kPerThread; i++) {
                const auto &r = recs[size_t((i * 7 + t) % kKeys)];
                f.set.fire(r.data(), uint32_t(r.size()), "w", regs);
            }
        });
    for (auto &t : threads) t.join();
    const std::string text = f.set.hist_text();
    std::istringstream in(text);
    std::string line;
    uint64_t hits = 0, sum_a = 0, entries = 0;
    while (std::getline(in, line)) {
        if (!line.starts_with("{ ")) continue;
        entries++;
        hits += std::stoull(line.substr(line.find("hitcount:") + 9));
        sum_a += std::stoull(line.substr(line.find("  a:") + 4));
    }
    EXPECT_EQ(entries, uint64_t(kKeys));
    EXPECT_EQ(hits, uint64_t(kThreads) * kPerThread);
    uint64_t want_a = 0;
    for (int t = 0; t < kThreads; t++) want_a += uint64_t(t + 1) * kPerThread;
    EXPECT_EQ(sum_a, want_a);
    EXPECT_NE(text.find("Totals:\n    Hits: 1600000\n    Entries: 1000\n    Dropped: 0\n"), std::string::npos);
}

} // namespace
} // namespace ukp::trace
