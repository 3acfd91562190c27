// Event triggers: the trigger file's language and text (tests/data/filter/triggers.txt,
// checked against the kernel) and what each trigger does, on a TriggerHost that records
// what it is asked.
#include "trace/trigger.hpp"

#include <ukprobes/kprobes.h>

#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <fstream>
#include <map>
#include <thread>

namespace ukp::trace {
namespace {

// A real TriggerHost: tracing_on state, a snapshot counter, per-event enable flags and
// the stack traces it was asked to record.
class RecordingHost : public TriggerHost {
public:
    RecordingHost() {
        flags_["tfilt/work"].store(false);
        flags_["tfilt/other"].store(true);
    }
    void set_tracing_on(bool on) override {
        on_ = on;
        set_calls++;
    }
    bool tracing_is_on() const override { return on_; }
    void take_snapshot() override { snapshots++; }
    std::atomic<bool> *event_enable_flag(std::string_view system, std::string_view event) override {
        auto it = flags_.find(std::string(system) + "/" + std::string(event));
        return it == flags_.end() ? nullptr : &it->second;
    }
    TriggerSet *event_triggers(std::string_view system, std::string_view event) override {
        return system == "tfilt" && event == "other" ? &other_triggers : nullptr;
    }
    void record_stacktrace(const struct pt_regs &regs) override { stack_ips.push_back(regs.ip); }
    // The w: event "watch" (at -1, not enabled) as a mover that keeps what it watches and
    // logs what the hits asked; "busy" is an enabled one, "fixed" one with an address.
    struct Mover : WatchMover {
        uint64_t at = 0;
        std::vector<std::string> log;
        bool set(uint64_t a) noexcept override {
            log.push_back("set " + std::to_string(a));
            if (at != 0) return false;
            at = a;
            return true;
        }
        bool clear(uint64_t a, bool any) noexcept override {
            log.push_back(any ? "clear any" : "clear " + std::to_string(a));
            if (at == 0 || (!any && a != at)) return false;
            at = 0;
            return true;
        }
    } mover;
    WatchMover *watch_mover(std::string_view event, bool for_set, int *err) override {
        *err = event == "busy" && for_set ? -EBUSY : event == "fixed" ? -EINVAL : -ENOENT;
        return event == "watch" || (event == "busy" && !for_set) ? &mover : nullptr;
    }

    std::atomic<bool> on_{true};
    std::atomic<int> set_calls{0}, snapshots{0};
    std::vector<unsigned long> stack_ips;
    std::map<std::string, std::atomic<bool>> flags_;
    TriggerSet other_triggers; // tfilt/other's, for enable_hist and disable_hist
};

std::vector<Field> test_fields() {
    std::vector<Field> f = common_fields();
    f.push_back({"__probe_ip", "unsigned long", 8, 8, false, Print::kHex});
    f.push_back({"a", "s64", 16, 8, true, Print::kSigned});
    f.push_back({"b", "u32", 24, 4, false, Print::kUnsigned});
    f.push_back({"s", "__data_loc char[]", 28, 4, true, Print::kString});
    return f;
}

std::vector<uint8_t> record(int64_t a, uint32_t b) {
    std::vector<uint8_t> r(32, 0);
    std::memcpy(r.data() + 16, &a, 8);
    std::memcpy(r.data() + 24, &b, 4);
    const uint32_t loc = 32u | (1u << 16); // ""
    std::memcpy(r.data() + 28, &loc, 4);
    r.push_back(0);
    return r;
}

int errno_of(const std::string &s) {
    if (s == "0") return 0;
    if (s == "-EINVAL") return -EINVAL;
    if (s == "-EEXIST") return -EEXIST;
    if (s == "-ENOENT") return -ENOENT;
    ADD_FAILURE() << "unknown result " << s;
    return 1;
}

TEST(Trigger, DataFile) {
    const std::string path = std::string(UKP_FILTER_DATA) + "/triggers.txt";
    std::ifstream in(path);
    ASSERT_TRUE(in) << path;
    const std::vector<Field> fields = test_fields();
    RecordingHost host;
    TriggerSet set;
    std::string line, written, expect_text;
    int lineno = 0, rc = 0, writes = 0, write_line = 0;
    bool pending = false;
    auto check = [&] {
        if (!pending) return;
        EXPECT_EQ(set.text(), expect_text) << path << ":" << write_line << ": after writing '" << written << "'";
        pending = false;
    };
    while (std::getline(in, line)) {
        lineno++;
        if (line.empty() || line[0] == '#') continue;
        if (line.starts_with("w ")) {
            check();
            written = line.substr(2);
            FilterError err{"", 0};
            rc = set.write(written, fields, host, &err);
            if (rc) {
                EXPECT_FALSE(err.message.empty()) << "no message for " << written;
            }
            expect_text.clear();
            pending = true;
            write_line = lineno;
            writes++;
        } else if (line.starts_with("r ")) {
            EXPECT_EQ(rc, errno_of(line.substr(2))) << path << ":" << lineno << ": '" << written << "'";
        } else if (line.starts_with("| ")) {
            expect_text += line.substr(2) + "\n";
        } else {
            FAIL() << "unknown line " << path << ":" << lineno << ": " << line;
        }
    }
    check();
    EXPECT_GT(writes, 30);
}

TEST(Trigger, TraceonCountsOnlyHitsThatChangeTheState) {
    RecordingHost host;
    TriggerSet set;
    const auto fields = test_fields();
    ASSERT_EQ(set.write("traceon:2", fields, host, nullptr), 0);
    const auto rec = record(1, 1);
    pt_regs regs{};
    set.fire(rec.data(), uint32_t(rec.size()), "t", regs); // already on: not counted
    EXPECT_EQ(host.set_calls.load(), 0);
    EXPECT_EQ(set.text(), "traceon:count=2\n");
    for (int i = 0; i < 5; i++) {
        host.on_ = false;
        set.fire(rec.data(), uint32_t(rec.size()), "t", regs);
    }
    EXPECT_EQ(host.set_calls.load(), 2);
    EXPECT_FALSE(host.on_.load());
    EXPECT_EQ(set.text(), "traceon:count=0\n");
}

TEST(Trigger, FilterGatesTraceoffStacktraceSnapshot) {
    RecordingHost host;
    TriggerSet set;
    const auto fields = test_fields();
    ASSERT_EQ(set.write("traceoff if a == 7", fields, host, nullptr), 0);
    ASSERT_EQ(set.write("stacktrace:3 if b > 10", fields, host, nullptr), 0);
    ASSERT_EQ(set.write("snapshot if a == 7 && b == 20", fields, host, nullptr), 0);
    pt_regs regs{};
    regs.ip = 0x1234;
    const auto miss = record(1, 5), hit = record(7, 20);
    set.fire(miss.data(), uint32_t(miss.size()), "t", regs);
    EXPECT_TRUE(host.on_.load());
    EXPECT_TRUE(host.stack_ips.empty());
    EXPECT_EQ(host.snapshots.load(), 0);
    for (int i = 0; i < 5; i++) set.fire(hit.data(), uint32_t(hit.size()), "t", regs);
    EXPECT_FALSE(host.on_.load());
    EXPECT_EQ(host.stack_ips, (std::vector<unsigned long>{0x1234, 0x1234, 0x1234}));
    EXPECT_EQ(host.snapshots.load(), 5);
    EXPECT_EQ(set.text(), "snapshot:unlimited if a == 7 && b == 20\nstacktrace:count=0 if b > 10\n"
                          "traceoff:unlimited if a == 7\n");
}

TEST(Trigger, EnableAndDisableEventFlipTheTargetFlag) {
    RecordingHost host;
    TriggerSet set;
    const auto fields = test_fields();
    ASSERT_EQ(set.write("enable_event:tfilt:work:1", fields, host, nullptr), 0);
    ASSERT_EQ(set.write("disable_event:tfilt:other if a == 2", fields, host, nullptr), 0);
    pt_regs regs{};
    const auto rec = record(1, 1);
    set.fire(rec.data(), uint32_t(rec.size()), "t", regs);
    EXPECT_TRUE(host.flags_["tfilt/work"].load());
    EXPECT_TRUE(host.flags_["tfilt/other"].load());
    host.flags_["tfilt/work"] = false;
    set.fire(rec.data(), uint32_t(rec.size()), "t", regs); // count used up
    EXPECT_FALSE(host.flags_["tfilt/work"].load());
    const auto two = record(2, 1);
    set.fire(two.data(), uint32_t(two.size()), "t", regs);
    EXPECT_FALSE(host.flags_["tfilt/other"].load());
    EXPECT_EQ(set.text(), "disable_event:tfilt:other:unlimited if a == 2\nenable_event:tfilt:work:count=0\n");
}

// histogram.rst's enable_hist/disable_hist: a paused hist trigger of another event starts
// aggregating when one hit says so and stops at another's; each hit with a count takes
// one, whatever the target's state.
TEST(Trigger, EnableAndDisableHistPauseAndContinueTheTargetsHistograms) {
    RecordingHost host;
    const auto fields = test_fields();
    ASSERT_EQ(host.other_triggers.write("hist:keys=b:pause", fields, host, nullptr), 0);
    TriggerSet on, off;
    ASSERT_EQ(on.write("enable_hist:tfilt:other if a == 1", fields, host, nullptr), 0);
    ASSERT_EQ(off.write("disable_hist:tfilt:other:2", fields, host, nullptr), 0);
    pt_regs regs{};
    const auto counted = record(0, 7);
    auto hits_of_7 = [&] {
        const std::string h = host.other_triggers.hist_text();
        const size_t at = h.find("{ b:          7 } hitcount: ");
        return at == std::string::npos ? 0ul : std::stoul(h.substr(at + 28));
    };
    host.other_triggers.fire(counted.data(), uint32_t(counted.size()), "t", regs);
    EXPECT_EQ(hits_of_7(), 0ul); // paused
    const auto one = record(1, 1), two = record(2, 1);
    on.fire(two.data(), uint32_t(two.size()), "t", regs); // its filter says no
    host.other_triggers.fire(counted.data(), uint32_t(counted.size()), "t", regs);
    EXPECT_EQ(hits_of_7(), 0ul);
    EXPECT_NE(host.other_triggers.text().find("[paused]"), std::string::npos);
    on.fire(one.data(), uint32_t(one.size()), "t", regs);
    EXPECT_NE(host.other_triggers.text().find("[active]"), std::string::npos);
    host.other_triggers.fire(counted.data(), uint32_t(counted.size()), "t", regs);
    host.other_triggers.fire(counted.data(), uint32_t(counted.size()), "t", regs);
    EXPECT_EQ(hits_of_7(), 2ul);
    off.fire(one.data(), uint32_t(one.size()), "t", regs);
    host.other_triggers.fire(counted.data(), uint32_t(counted.size()), "t", regs);
    EXPECT_EQ(hits_of_7(), 2ul);
    off.fire(one.data(), uint32_t(one.size()), "t", regs); // already paused: counted all the same
    EXPECT_EQ(off.text(), "disable_hist:tfilt:other:count=0\n");
    on.fire(one.data(), uint32_t(one.size()), "t", regs);
    off.fire(one.data(), uint32_t(one.size()), "t", regs); // count used up
    host.other_triggers.fire(counted.data(), uint32_t(counted.size()), "t", regs);
    EXPECT_EQ(hits_of_7(), 3ul);
}

TEST(Trigger, BadFilterKeepsTheOldTriggersAndPointsAtTheError) {
    RecordingHost host;
    TriggerSet set;
    const auto fields = test_fields();
    ASSERT_EQ(set.write("traceoff", fields, host, nullptr), 0);
    FilterError err;
    EXPECT_EQ(set.write("stacktrace if a == 1 && nosuch == 2", fields, host, &err), -EINVAL);
    EXPECT_EQ(err.message, "Field not found");
    EXPECT_EQ(err.pos, 14 + 17); // "stacktrace if " + where the filter's caret points
    EXPECT_EQ(set.text(), "traceoff:unlimited\n");
    EXPECT_FALSE(set.empty());
    EXPECT_EQ(set.write("!traceoff", fields, host, nullptr), 0);
    EXPECT_TRUE(set.empty());
}

// Writers add and remove triggers while 4 threads fire: readers never see a freed list
// (run under ASan in the sanitizer build).
TEST(Trigger, WritesWhileFiring) {
    RecordingHost host;
    TriggerSet set;
    const auto fields = test_fields();
    std::atomic<bool> stop{false};
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; t++)
        threads.emplace_back([&] {
            const auto rec = record(3, 4);
            pt_regs regs{};
            while (!stop.load(std::memory_order_relaxed)) set.fire(rec.data(), uint32_t(rec.size()), "t", regs);
        });
    for (int i = 0; i < 300; i++) {
        ASSERT_EQ(set.write("snapshot if a == 3", fields, host, nullptr), 0);
        if (i == 0) {
            // On a busy machine the firing threads may not run at all between two writes:
            // the first snapshot trigger stays until one of them has fired it.
            const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
            while (host.snapshots.load() == 0 && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
        }
        ASSERT_EQ(set.write("hist:keys=b:vals=a", fields, host, nullptr), 0);
        ASSERT_EQ(set.write("!snapshot", fields, host, nullptr), 0);
        ASSERT_EQ(set.write("!hist:keys=b:vals=a", fields, host, nullptr), 0);
    }
    stop = true;
    for (auto &t : threads) t.join();
    EXPECT_TRUE(set.empty());
    EXPECT_GT(host.snapshots.load(), 0);
}

} // namespace
// set_wprobe and clear_wprobe (wprobetrace.rst): the address is a record's field plus an
// adjustment; set acts while nothing is watched, clear when the address matches (or any,
// without a field); a count limits the times they act; the lines read back as the
// kernel's; removing one stops the watch.
TEST(Trigger, SetAndClearWprobeMoveTheWatch) {
    const std::vector<Field> fields = test_fields();
    RecordingHost host;
    TriggerSet born, dead;
    FilterError err;
    ASSERT_EQ(born.write("set_wprobe:watch:a+8 if b == 1", fields, host, &err), 0) << err.message;
    ASSERT_EQ(dead.write("clear_wprobe:watch:a", fields, host, &err), 0) << err.message;
    EXPECT_EQ(born.text(), "set_wprobe:watch:a+8 if b == 1\n");
    EXPECT_EQ(dead.text(), "clear_wprobe:watch:a+0\n");
    pt_regs regs{};
    auto hit = [&](TriggerSet &t, int64_t a, uint32_t b) {
        const auto r = record(a, b);
        t.fire(r.data(), uint32_t(r.size()), "comm", regs);
    };
    hit(born, 100, 0); // the filter says no
    EXPECT_EQ(host.mover.at, 0u);
    hit(born, 100, 1);
    EXPECT_EQ(host.mover.at, 108u);
    hit(born, 200, 1); // watching already: nothing moves
    EXPECT_EQ(host.mover.at, 108u);
    hit(dead, 200, 0); // another object dies: not the watched one
    EXPECT_EQ(host.mover.at, 108u);
    hit(dead, 108, 0);
    EXPECT_EQ(host.mover.at, 0u);
    EXPECT_EQ(host.mover.log, (std::vector<std::string>{"set 108", "set 208", "clear 200", "clear 108"}));

    // A count: it acts once, then never.
    TriggerSet once;
    ASSERT_EQ(once.write("set_wprobe:watch:a:1", fields, host, &err), 0) << err.message;
    EXPECT_EQ(once.text(), "set_wprobe:watch:a+0:count=1\n");
    hit(once, 300, 0);
    hit(dead, 300, 0);
    hit(once, 400, 0);
    EXPECT_EQ(host.mover.at, 0u);
    EXPECT_EQ(once.text(), "set_wprobe:watch:a+0:count=0\n");

    // Without a field, clear_wprobe stops any watch; removing a set_wprobe stops it too.
    TriggerSet any;
    ASSERT_EQ(any.write("clear_wprobe:watch", fields, host, &err), 0) << err.message;
    EXPECT_EQ(any.text(), "clear_wprobe:watch\n");
    host.mover.at = 5;
    hit(any, 0, 0);
    EXPECT_EQ(host.mover.at, 0u);
    hit(born, 10, 1);
    EXPECT_EQ(host.mover.at, 18u);
    ASSERT_EQ(born.write("!set_wprobe:watch:a+8", fields, host, &err), 0) << err.message;
    EXPECT_EQ(host.mover.at, 0u);
    EXPECT_TRUE(born.empty());

    // The kernel's refusals.
    struct Bad {
        const char *line;
        int result;
        const char *message;
    } bad[] = {
        {"set_wprobe:watch", -EINVAL, "Expecting EVENT:FIELD"},
        {"set_wprobe:nosuch:a", -ENOENT, "No such watch event"},
        {"set_wprobe:busy:a", -EBUSY, "The watch event is enabled"},
        {"set_wprobe:fixed:a", -EINVAL, "The watch event has an address"},
        {"set_wprobe:watch:nofield", -ENOENT, "No such field"},
        {"set_wprobe:watch:b", -ENOEXEC, "The field is not an address"},
        {"set_wprobe:watch:a+x", -EINVAL, "Invalid adjustment"},
        {"set_wprobe:watch:a:x", -EINVAL, "Invalid count"},
    };
    for (const Bad &b : bad) {
        SCOPED_TRACE(b.line);
        TriggerSet t;
        FilterError e;
        EXPECT_EQ(t.write(b.line, fields, host, &e), b.result);
        EXPECT_EQ(e.message, b.message);
        EXPECT_TRUE(t.empty());
    }
    // A second set_wprobe of one watch on one event is -EEXIST, as any trigger twice.
    TriggerSet twice;
    ASSERT_EQ(twice.write("set_wprobe:watch:a", fields, host, &err), 0);
    EXPECT_EQ(twice.write("set_wprobe:watch:a+8", fields, host, &err), -EEXIST);
}

} // namespace ukp::trace
