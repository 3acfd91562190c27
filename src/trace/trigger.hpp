// Event triggers: the `trigger` file of an event (traceon, traceoff, stacktrace, snapshot,
// enable_event, disable_event, enable_hist, disable_hist, hist, set_wprobe, clear_wprobe),
// and the `hist` file.
//
// Concurrency: writers (write(), off the hit path) serialize on a mutex, build a new
// immutable list of the active triggers and publish it with one atomic store. fire()
// loads the current list and runs it without a lock. Lists and triggers that a writer
// replaces are retired, never freed while the TriggerSet lives, so a reader still inside
// an old list is safe; memory grows only with the number of trigger writes.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "trace/filter.hpp"
#include "trace/hist.hpp"
#include "trace/record.hpp"

struct pt_regs; // include/ukprobes/kprobes.h

namespace ukp::trace {

// A w: event that set_wprobe and clear_wprobe triggers move (wprobetrace.rst): from a hit,
// it starts watching an address a record holds, or stops.
struct WatchMover {
    virtual ~WatchMover() = default;
    // Watches addr, if it watches nothing: true when it does now.
    virtual bool set(uint64_t addr) noexcept = 0;
    // Stops watching, if it watches addr (any address with `any`): true when it stopped.
    virtual bool clear(uint64_t addr, bool any) noexcept = 0;
};

// What triggers act on, implemented by trace-def's events.
struct TriggerHost : HistHost {
    virtual void set_tracing_on(bool on) = 0;
    // The tracing_on state: traceon/traceoff with a count only count hits that change it,
    // as the kernel's do.
    virtual bool tracing_is_on() const = 0;
    virtual void take_snapshot() = 0;
    // For enable_event/disable_event: the target event's enable flag, looked up when the
    // trigger is written (null if there is no such event); flipped on the hit path.
    virtual std::atomic<bool> *event_enable_flag(std::string_view system, std::string_view event) = 0;
    // For enable_hist/disable_hist: the target event's triggers, looked up when the trigger
    // is written (null if there is no such event); its hist triggers paused and continued
    // on the hit path.
    virtual class TriggerSet *event_triggers(std::string_view system, std::string_view event) = 0;
    // stacktrace: records the user stack of the hit.
    virtual void record_stacktrace(const struct pt_regs &regs) = 0;
    // For set_wprobe/clear_wprobe, when the trigger is written: the w: event EVENT of group
    // wprobes, made movable; null with *err (-ENOENT: none; -EINVAL: it has an address of its
    // own; -EBUSY: enabled, for set_wprobe) otherwise.
    virtual WatchMover *watch_mover(std::string_view event, bool for_set, int *err) = 0;
};

struct Trigger;     // one installed trigger, defined in trigger.cpp
struct TriggerList; // an immutable published list, defined in trigger.cpp

// The triggers of one event: what its `trigger` file holds, and its hist tables.
class TriggerSet {
public:
    TriggerSet();
    ~TriggerSet();
    TriggerSet(const TriggerSet &) = delete;
    TriggerSet &operator=(const TriggerSet &) = delete;

    // "traceon[:N] [if FILTER]", "!traceon", "hist:keys=...", ... as the kernel's trigger
    // file takes them; 0, or -EINVAL (-ENOENT, -EEXIST as the kernel) with *err (message
    // and position) on a bad one.
    int write(std::string_view text, const std::vector<Field> &fields, TriggerHost &host, FilterError *err);
    // Takes out every hist, enable_hist and disable_hist trigger (a truncating open of the
    // trigger file), unless another trigger reads a variable of one of them: then none.
    void remove_hists();
    std::string text() const;      // the trigger file's content
    std::string hist_text() const; // the hist file's content (the kernel's format)
    // Hit path, after the record is written: runs every trigger whose filter matches.
    void fire(const uint8_t *rec, uint32_t size, const char *comm, const struct pt_regs &regs) noexcept;
    bool empty() const noexcept { return cur_.load(std::memory_order_acquire) == nullptr; }
    // The first installed hist trigger whose keys are like target's (HistTrigger::keys_like),
    // or null: where an onmatch() parameter's field variable takes its keys and filter.
    const HistTrigger *hist_like(const HistTrigger &target) const;
    // Hit path (enable_hist, disable_hist): pauses or continues every hist trigger it has.
    void pause_hists(bool paused) noexcept;

    // For hist keys with .sym/.sym-offset; set by the owner of the events.
    void set_symbolizer(Symbolizer sym);
    // The event whose triggers these are, "GRP.EVENT": hist variables are known by it.
    void set_owner(std::string event);

private:
    // Registers t, or with `remove` takes out the installed trigger t names, and publishes
    // the new list: 0, or a negative errno with *err (pos: where the command starts).
    int install(std::unique_ptr<Trigger> t, bool remove, int pos, FilterError *err);
    // Makes `items` the list fire() runs (under mu_); the old list is kept.
    void publish(std::vector<Trigger *> items);

    mutable std::mutex mu_;                           // serializes writers and readers of text
    std::atomic<const TriggerList *> cur_{nullptr};   // what fire() runs; null when empty
    std::vector<std::unique_ptr<Trigger>> triggers_;  // installed and retired, never freed early
    std::vector<std::unique_ptr<TriggerList>> lists_; // published and retired lists
    Symbolizer sym_;                                  // for .sym keys; empty prints hex
    std::string owner_;                               // "GRP.EVENT"
};

} // namespace ukp::trace
