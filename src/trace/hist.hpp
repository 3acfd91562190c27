// Hist triggers: `hist:keys=...[:values=...][:VAR=EXPR...][:sort=...][:size=N][:pause]
// [:cont][:clear][:nohitcount][:HANDLER.ACTION...] [if FILTER]`, aggregated into a
// table preallocated when the trigger is written, and printed as the kernel's `hist` file.
//
// Variables (histogram.rst): VAR=EXPR keeps, per key, the value of EXPR at the last hit
// (EXPR: field, common_timestamp[.usecs], $VAR of another trigger, a number, joined by +
// and -). A $VAR of another trigger is read at the hit for the same key, once (then it is
// unset); a hit for a key whose referenced variable is unset updates nothing, as the
// kernel's. onmatch(GRP.EVENT).trace(SYNTH,ARGS) (or .SYNTH(ARGS)) fires synthetic event
// SYNTH with ARGS (variables, fields) after such an update.
//
// onmax($VAR) and onchange($VAR) (histogram.rst 2.2.3) track, per key, the largest (the
// last different) value of one of the trigger's own variables; when a hit raises (changes)
// it, .save(FIELD,...) keeps that hit's fields for the key, .snapshot() swaps the trace
// buffer with the snapshot when the value is also the largest (a change) over every key,
// and .trace(SYNTH,ARGS) fires SYNTH. Their per-key words are more of the table's variable
// words, past the trigger's variables: a hit allocates nothing for them.
//
// The table follows the kernel's tracing_map: size (a power of two, 128..131072, default
// 2048) elements and twice as many buckets. A hit hashes its key, claims an empty bucket
// with a compare-and-swap on its hash word, takes the next free element with one atomic
// increment and publishes it; values are summed with atomic adds. No lock, no allocation.
// When every element is taken a new key is counted in Dropped, as the kernel does. A hit
// whose bucket another hit is still filling in waits a little, then passes it over where
// the kernel drops (its inserters are never preempted; threads here are): the reader adds
// up a key made twice (hist_table.hpp).
#pragma once

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "trace/filter.hpp"
#include "trace/record.hpp"

struct pt_regs; // include/ukprobes/kprobes.h

namespace ukp::trace {

struct HistTable; // one generation of the table; :clear publishes a fresh one

// The tables of a trigger, or of every trigger that names them (:name=NAME): the current
// one, what hits update, and those :clear retired (a hit may still be inside one).
struct HistTables {
    std::atomic<HistTable *> cur{nullptr};
    std::mutex mu; // clear() and show()
    std::vector<std::unique_ptr<HistTable>> all;
};

// A synthetic event, as a hist trigger's action fires it. The tracer's is the one kind.
struct SynthSink {
    virtual ~SynthSink() = default;
    virtual size_t field_count() const = 0;
    // Whether field i is a string (then an action passes it a string's address).
    virtual bool field_is_string(size_t i) const = 0;
    // Whether field i is a stack (`unsigned long[]`: then an action passes the address of
    // kStackDepth addresses, zero after the last).
    virtual bool field_is_stack(size_t i) const = 0;
    std::atomic<int> users{0}; // installed hist actions that fire it: it cannot be removed
    // From a hit: one record of the event, its fields these values (a number each). Not
    // virtual: the tracer defines it (events.cpp), and a direct call is one the scan that
    // proves the hit's path lean can follow (core's lean.cpp), so that a hit firing a
    // synthetic event need not save the vector state around it.
    void fire(const uint64_t *values, size_t n, const struct pt_regs *regs) noexcept;
};

class HistTrigger;

// What a hist trigger asks of the tracer when it is written.
struct HistHost {
    virtual ~HistHost() = default;
    // The synthetic event NAME (group synthetic), or null.
    virtual SynthSink *synthetic_event(std::string_view name) {
        (void)name;
        return nullptr;
    }
    // Whether event GRP.EVENT exists (onmatch's).
    virtual bool event_exists(std::string_view group, std::string_view event) {
        (void)group, (void)event;
        return false;
    }
    // For an onmatch() parameter that is a field of the matching event GRP.EVENT: the
    // kernel's field variable, a hist trigger `hist:keys=KEYS:synthetic_FIELD=FIELD[ if
    // FILTER]` on that event, with the keys and filter of the first hist trigger there whose
    // keys are like target's (create_field_var_hist()); written there unless it is there
    // already or `find_only`. 0 and its text after "hist:" in *cmd, or -EINVAL and *message.
    virtual int field_var_hist(std::string_view group, std::string_view event, std::string_view field,
                               const HistTrigger &target, bool find_only, std::string *cmd, std::string *message) {
        (void)group, (void)event, (void)field, (void)target, (void)find_only, (void)cmd;
        *message = "Matching event histogram not found";
        return -EINVAL;
    }
    // Takes such a trigger out, unless another trigger reads its variable.
    virtual void drop_field_var_hist(std::string_view group, std::string_view event, const std::string &cmd) {
        (void)group, (void)event, (void)cmd;
    }
};

class HistTrigger {
public:
    // One key or value of the trigger.
    struct Column {
        std::string name; // the event field, "common_pid", or "hitcount"
        // "", "hex", "sym", "sym-offset", "execname", "log2", "buckets", "stacktrace"; values:
        // "percent", "graph"
        std::string modifier;
        enum Mod : uint8_t { kNone, kHex, kSym, kSymOffset, kExecname, kLog2, kBuckets, kPercent, kGraph };
        Mod mod = kNone;      // `modifier` decoded, for the hit path
        uint64_t buckets = 0; // for .buckets=N
        bool is_string = false;
        bool is_signed = false;
        bool timestamp = false; // common_timestamp (size 0 then)
        // A key of kStackDepth addresses: common_stacktrace (size 0), or a stack field of the
        // record (a synthetic event's `unsigned long[]`, size 4: its __data_loc word).
        bool stack = false;
        bool usecs = false;   // .usecs
        bool hits = false;    // a value that counts the hits: hitcount.percent, hitcount.graph
        int32_t var = -1;     // a value that sums variable `var` of the trigger (vals=$VAR)
        int var_pos = -1;     // where vals=$VAR names it, for its error
        uint32_t offset = 0;  // of the field in the record
        uint32_t size = 0;    // bytes of the field (4 for a __data_loc word)
        uint32_t key_off = 0; // keys: offset in the packed key; values: index of the sum
        uint32_t key_len = 0; // keys: bytes in the packed key (8, or kMaxStringKey)
    };
    struct SortKey {
        int column = -1; // -1: hitcount; else index in keys (is_key) or values
        bool is_key = false;
        bool descending = false;
        std::string text; // as the trigger file prints it
    };

    ~HistTrigger();

    // Parses the part after "hist:" (and the filter after " if ", null for none).
    // Returns null and *err on a bad trigger (positions are offsets in `spec`, plus
    // spec_pos, the offset of spec in what the user wrote).
    // `host` resolves synthetic events (none: no action is taken); `event` is the trigger's
    // event, "GRP.EVENT", for onmatch.
    // `removing`: parsed to name an installed trigger ("!hist:..."): nothing is made on
    // other events for it.
    static std::unique_ptr<HistTrigger> parse(std::string_view spec, int spec_pos, std::unique_ptr<Filter> filter,
                                              const std::vector<Field> &fields, FilterError *err,
                                              HistHost *host = nullptr, std::string event = {}, bool removing = false);

    // Hit path (the filter already matched).
    void update(const uint8_t *rec, uint32_t size, const char *comm, const struct pt_regs *regs = nullptr) noexcept;

    // Its variables, findable by other triggers once it is installed; taken back (and its
    // snapshot given up) when it is removed: false (and nothing taken back) while another
    // trigger refers to them.
    void publish_vars();
    bool retract_vars();
    // Whether another installed trigger reads one of its variables.
    bool referenced() const { return users_.load(std::memory_order_relaxed) > 0; }
    // From another trigger's hit: variable `index` for `key`, if set (then unset). No lock.
    // hash: the key's hash_of() in a table of key_bytes; pid_key_off: where the caller's key
    // holds common_pid (the calling thread's id), or -1.
    bool take_var(const uint8_t *key, uint32_t hash, uint32_t key_bytes, uint32_t index, int32_t pid_key_off,
                  uint64_t *value) const noexcept;

    // "hist:keys=...:vals=...:sort=...:size=N[ if FILTER] [active]" (no newline).
    std::string spec_text() const;
    // One histogram of the hist file: header comment, entries, Totals.
    std::string show(const Symbolizer &sym) const;

    // Same keys, values, sort and filter: the kernel's notion of "the same" hist trigger.
    bool same_as(const HistTrigger &o) const;
    // Whether its keys are like target's, one for one (size, sign, string or stack), as the
    // kernel's compatible_keys().
    bool keys_like(const HistTrigger &target) const;
    // The field variable of `field` (HistHost::field_var_hist), "synthetic_FIELD", and the
    // trigger that makes it on this trigger's event: `keys=ITS KEYS:synthetic_FIELD=FIELD[
    // if ITS FILTER]`, as the kernel's create_field_var_hist() writes it.
    static std::string field_var_name(std::string_view field);
    std::string field_var_spec(std::string_view field) const;
    // Whether the installed trigger of event ("GRP.EVENT") has variable `name`.
    static bool has_var(std::string_view event, std::string_view name);
    // The triggers written on other events for its onmatch() parameters (field_var_hist),
    // taken out, each unless another trigger reads it: when it is removed, or not installed.
    void drop_field_hists();
    bool pause_flag() const { return want_pause_; }
    bool cont_flag() const { return want_cont_; }
    bool clear_flag() const { return want_clear_; }
    void set_paused(bool p) { paused_.store(p, std::memory_order_release); }
    bool paused() const { return paused_.load(std::memory_order_acquire); }
    // Publishes an empty table; the old one is retired (a hit may still be inside it).
    void clear();
    const Filter *filter() const { return filter_.get(); }
    // The trace's one conditional snapshot, for a .snapshot() action, taken as the trigger
    // is installed (the spare buffer allocated then, not on a hit): 0 (also when it has no
    // such action), -EBUSY when another installed trigger has it, as the kernel's
    // tracing_snapshot_cond_enable(), or the allocation's error. retract_vars() gives it up.
    int claim_snapshot();

    uint64_t hits() const;
    uint64_t drops() const;

    static constexpr uint32_t kMaxStringKey = 256; // the kernel's MAX_FILTER_STR_VAL
    static constexpr uint32_t kStackDepth = 16;    // the kernel's HIST_STACKTRACE_DEPTH

    // One term of a variable's expression or an action's parameter.
    struct Operand {
        // kString: a string field of the event, its value the string's address in the record.
        // kStack: the hit's user stack (common_stacktrace), a variable's only operand.
        enum Kind : uint8_t { kField, kTimestamp, kOwnVar, kRef, kConst, kString, kStack } kind = kConst;
        Column field;        // kField, kString
        bool usecs = false;  // kTimestamp
        bool string = false; // kString, or a variable that holds a string (its value the address)
        bool stack = false;  // kStack, or a variable that holds a stack (its value the address)
        uint32_t index = 0;  // kOwnVar: in vars_; kRef: in refs_
        uint64_t value = 0;  // kConst
        char op = '+';       // how it joins the operands before it: + - * / (* and / first)
    };
    struct Var {
        std::string name, text;
        std::vector<Operand> terms;
        // A string variable (NAME=STRING_FIELD) or a stack variable (NAME=common_stacktrace):
        // the string (kStackDepth addresses, zero after the last) is copied into the
        // element's words from str_word on, and the variable's value is their address.
        // NAME=$VAR of such a variable holds that address (its words are VAR's).
        bool is_string = false;
        bool is_stack = false;
        uint32_t str_word = 0;
        bool negate = false; // -(EXPR)
    };
    struct Ref {
        const HistTrigger *owner;
        uint32_t index;
    };
    // One field a save() action keeps: a number (a field, common_timestamp, a variable),
    // a string field, or the hit's comm.
    struct Saved {
        std::string name; // as written, as the hist file prints it
        enum Kind : uint8_t { kNumber, kString, kComm } kind = kNumber;
        Operand value;     // kNumber; kString: value.field is the string's __data_loc
        uint32_t word = 0; // its first word among the action's saved words
        uint32_t words = 1;
    };
    struct Action {
        enum Handler : uint8_t { kOnMatch, kOnMax, kOnChange } handler = kOnMatch;
        std::string match_group, match_event; // onmatch(GRP.EVENT)'s
        enum Kind : uint8_t { kTrace, kSave, kSnapshot } kind = kTrace;
        std::string text; // as written: "onmatch(g.e).trace(s,$a)", "onmax($lat).save(a,b)"
        SynthSink *synth = nullptr;
        std::vector<Operand> args;
        // onmax/onchange: the variable tracked (index in vars_, text "$lat"), and the first of
        // the action's words past the variables in an element: the tracked value, then for
        // save() a sequence word and the saved words.
        uint32_t var = 0;
        std::string var_text;
        uint32_t slot = 0;
        std::vector<Saved> saved;
    };

private:
    struct SnapshotState; // the triggering value and key of the last snapshot() taken
    struct OperandParser;
    HistTrigger() = default;
    uint64_t operand_value(const Operand &o, const uint8_t *rec, uint32_t size, uint64_t ts, const uint64_t *own,
                           const uint64_t *refs) const noexcept;
    // An onmax/onchange action's value v for element el: true when it raised (changed) the
    // element's tracked value, which is v then.
    bool track(const Action &a, HistTable *t, int64_t el, uint64_t v) const noexcept;
    // save(): the hit's fields into el's saved words, unless a later value came first.
    void save(const Action &a, HistTable *t, int64_t el, uint64_t v, const uint8_t *rec, uint32_t size,
              const char *comm, uint64_t ts, const uint64_t *own, const uint64_t *refs) const noexcept;
    // snapshot(): the swap, when v is also the largest (a change) over every key.
    void snapshot(const Action &a, const uint8_t *key, const char *comm, uint64_t v) const noexcept;
    std::unique_ptr<HistTable> new_table() const;
    // What triggers sharing a name must have alike (histogram.rst's "compatible" fields): the
    // keys, values, sort, variables and actions, and where each field is in the record.
    std::string signature() const;
    // Whether variable `index` counts common_timestamp in microseconds (its first operand).
    bool var_in_usecs(uint32_t index) const;
    // Gives up its place among the installed triggers of its name (under vars_mu()).
    void leave_name();
    std::string action_lines(const HistTable &t, const std::vector<uint32_t> &elts) const;
    std::string snapshot_lines(const Symbolizer &sym) const;

    std::vector<Column> keys_;
    std::vector<Column> vals_; // vals_[0] is hitcount
    std::vector<SortKey> sort_;
    uint32_t size_ = 2048;                                             // elements; buckets are twice as many
    uint32_t key_bytes_ = 0;                                           // packed key size
    bool want_pause_ = false, want_cont_ = false, want_clear_ = false; // as written
    bool no_hitcount_ = false;                                         // :nohitcount
    std::atomic<bool> paused_{false};
    std::unique_ptr<Filter> filter_;
    std::vector<Var> vars_;
    std::vector<Ref> refs_; // other triggers' variables it reads, each once
    std::vector<Action> actions_;
    uint32_t action_words_ = 0;           // per element, past the variables' words
    uint32_t string_words_ = 0;           // per element, past those: the string variables' bytes
    std::unique_ptr<SnapshotState> snap_; // with a snapshot() action
    bool needs_ts_ = false;               // something reads common_timestamp
    // Where the key holds common_pid as it is, or -1. A hit's common_pid is its thread's id:
    // such a key's element is only ever written by that thread.
    int32_t pid_key_off_ = -1;
    std::string event_;                 // "GRP.EVENT"
    mutable std::atomic<int> users_{0}; // triggers that read its variables
    bool published_ = false;
    // Its tables, shared by every trigger of its name (:name=NAME).
    std::shared_ptr<HistTables> tables_;
    std::string name_;  // :name=NAME, "" for none
    std::string clock_; // :clock=CLOCK (global unless told)
    // The field variables' triggers it had written on other events (HistHost::field_var_hist).
    struct FieldHist {
        std::string group, event, cmd;
    };
    std::vector<FieldHist> field_hists_;
    HistHost *host_ = nullptr;
};

} // namespace ukp::trace
