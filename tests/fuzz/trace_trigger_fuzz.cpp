// Event triggers and histograms (src/trace/trigger.hpp): TriggerSet::write() on arbitrary
// lines, fire() on arbitrary records.
//
// Input: trigger lines separated by '\n'; a line starting with '@' is not written but
// fires the triggers on a record made of its bytes (trace_fields.hpp); one starting with
// '>' is written as a truncating write of the trigger file writes it (the hist triggers
// taken out first); one starting with '%' is written to kprobes.other's trigger file.
// Checks: no crash or out-of-bounds access (ASan), only the documented return codes, a
// rejected line leaves the trigger and hist files as they were (the matching event's too:
// onmatch(kprobes.other)'s field variables) and says why.
#include "trace/trigger.hpp"
#include "trace_fields.hpp"

#include <ukprobes/kprobes.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace {

#define CHECK(cond)                                                                                                    \
    do {                                                                                                               \
        if (!(cond)) {                                                                                                 \
            std::fprintf(stderr, "trace_trigger_fuzz: %s:%d: %s\n", __FILE__, __LINE__, #cond);                        \
            std::abort();                                                                                              \
        }                                                                                                              \
    } while (0)

struct Host : ukp::trace::TriggerHost {
    bool on = true;
    int snapshots = 0, stacks = 0;
    std::atomic<bool> other{false};
    void set_tracing_on(bool v) override { on = v; }
    bool tracing_is_on() const override { return on; }
    void take_snapshot() override { ++snapshots; }
    std::atomic<bool> *event_enable_flag(std::string_view system, std::string_view event) override {
        return system == "kprobes" && event == "other" ? &other : nullptr;
    }
    // kprobes/other's triggers, for enable_hist and disable_hist.
    ukp::trace::TriggerSet other_triggers;
    ukp::trace::TriggerSet *event_triggers(std::string_view system, std::string_view event) override {
        return system == "kprobes" && event == "other" ? &other_triggers : nullptr;
    }
    void record_stacktrace(const struct pt_regs &) override { ++stacks; }
    // A w: event named "watch", as a mover that only keeps the address it watches.
    struct Mover : ukp::trace::WatchMover {
        uint64_t at = 0;
        bool set(uint64_t a) noexcept override { return at == 0 ? (at = a, true) : false; }
        bool clear(uint64_t a, bool any) noexcept override {
            return at != 0 && (any || a == at) ? (at = 0, true) : false;
        }
    } mover;
    ukp::trace::WatchMover *watch_mover(std::string_view event, bool, int *err) override {
        if (event == "watch") return &mover;
        *err = -ENOENT;
        return nullptr;
    }
    // A synthetic event "syn" (u64, string, stack) for actions, and kprobes.other, on the
    // probe's fields, as onmatch()'s matching event: its field variables are written there.
    struct Synth : ukp::trace::SynthSink {
        size_t field_count() const override { return 3; }
        bool field_is_string(size_t i) const override { return i == 1; }
        bool field_is_stack(size_t i) const override { return i == 2; }
    } syn;
    ukp::trace::SynthSink *synthetic_event(std::string_view name) override { return name == "syn" ? &syn : nullptr; }
    bool event_exists(std::string_view group, std::string_view event) override {
        return group == "kprobes" && (event == "other" || event == "probe");
    }
    int field_var_hist(std::string_view group, std::string_view event, std::string_view field,
                       const ukp::trace::HistTrigger &target, bool find_only, std::string *cmd,
                       std::string *message) override {
        const ukp::trace::HistTrigger *like =
            group == "kprobes" && event == "other" ? other_triggers.hist_like(target) : nullptr;
        *message = "Matching event histogram not found";
        if (like == nullptr) return -EINVAL;
        *cmd = like->field_var_spec(field);
        if (find_only || ukp::trace::HistTrigger::has_var("kprobes.other", like->field_var_name(field))) return 0;
        ukp::trace::FilterError err;
        *message = "Couldn't create histogram for field";
        return other_triggers.write("hist:" + *cmd, ukp::fuzz::probe_fields(), *this, &err) == 0 ? 0 : -EINVAL;
    }
    void drop_field_var_hist(std::string_view, std::string_view, const std::string &cmd) override {
        ukp::trace::FilterError err;
        other_triggers.write("!hist:" + cmd, ukp::fuzz::probe_fields(), *this, &err);
    }
};

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    using namespace ukp::trace;
    static const std::vector<Field> fields = ukp::fuzz::probe_fields();
    Host host;
    TriggerSet set;
    set.set_owner("kprobes.probe");
    host.other_triggers.set_owner("kprobes.other");
    set.set_symbolizer([](uint64_t addr, bool with_offset) {
        return with_offset ? "sym+0x" + std::to_string(addr & 0xff) : std::string("sym");
    });
    std::string_view in(reinterpret_cast<const char *>(data), size);
    int lines = 0;
    while (!in.empty() && lines++ < 16) {
        const size_t eol = in.find('\n');
        const std::string_view line = in.substr(0, eol);
        in = eol == std::string_view::npos ? std::string_view{} : in.substr(eol + 1);
        if (!line.empty() && line[0] == '@') {
            pt_regs regs{};
            const std::vector<uint8_t> rec =
                ukp::fuzz::make_record(reinterpret_cast<const uint8_t *>(line.data()) + 1, line.size() - 1);
            set.fire(rec.data(), static_cast<uint32_t>(rec.size()), "fuzz", regs);
            continue;
        }
        std::string_view text = line;
        if (!text.empty() && text[0] == '%') { // kprobes.other's trigger file
            FilterError err;
            const int rc = host.other_triggers.write(text.substr(1), fields, host, &err);
            CHECK(rc == 0 || rc == -EINVAL || rc == -ENOENT || rc == -EEXIST || rc == -EDOM || rc == -EBUSY);
            continue;
        }
        const bool truncate = !text.empty() && text[0] == '>';
        if (truncate) {
            text.remove_prefix(1);
            set.remove_hists();
        }
        const std::string before = set.text();
        const std::string hist_before = set.hist_text();
        const std::string other_before = host.other_triggers.text();
        const bool was_empty = set.empty();
        FilterError err;
        const int rc = set.write(text, fields, host, &err);
        CHECK(rc == 0 || rc == -EINVAL || rc == -ENOENT || rc == -EEXIST || rc == -EDOM);
        if (rc != 0) {
            CHECK(set.text() == before);
            CHECK(set.hist_text() == hist_before);
            CHECK(host.other_triggers.text() == other_before); // no field variable left behind
            CHECK(set.empty() == was_empty);
            CHECK(rc != -EINVAL || !err.message.empty());
        }
    }
    pt_regs regs{};
    const std::vector<uint8_t> rec = ukp::fuzz::make_record(data, size);
    set.fire(rec.data(), static_cast<uint32_t>(rec.size()), "fuzz", regs);
    set.text();
    set.hist_text();
    return 0;
}
