// The kprobe_events language: one definition line -> a probe definition with compiled
// fetch programs, or the kernel's error identifier and caret position.
//
//   p[:[GRP/][EVENT]] [MOD:]SYM[+offs]|MEMADDR|PATH:OFFSET [FETCHARGS]
//   r[MAXACTIVE][:[GRP/][EVENT]] [MOD:]SYM[+0]|PATH:OFFSET [FETCHARGS]
//   p[:[GRP/][EVENT]] [MOD:]SYM[+0]%return [FETCHARGS]
//   w:[GRP/][EVENT] [r|w|rw]@<ADDR|[MOD:]SYM[+|-OFFS]>[:LENGTH] [FETCHARGS]
//   t[:[GRP/][EVENT]] [MOD:]PROVIDER:NAME [FETCHARGS]
//   f[:[GRP/][EVENT]] [MOD:]FUNCS [FETCHARGS]
//   f[MAXACTIVE][:[GRP/][EVENT]] [MOD:]FUNCS%return [FETCHARGS]
//   e[:[GRP/][EVENT]] SRCGRP.SRCEVENT [FETCHARGS]
//   -:[GRP/][EVENT]
//
// (w: the watch-probe events of the kernel's wprobetrace.rst, on hardware breakpoints; t:
// fprobetrace.rst's tracepoint probes, on the SDT probes <sys/sdt.h> leaves in objects;
// f: its function events, FUNCS one function or, as ukprobes extends them, globs and
// exclusions "PAT[,PAT|,!PAT...]" over the functions of one object: one event on them all;
// e: eprobetrace.rst's event probes, a second event on another event's records, $FIELD its
// fields.)
// plus kprobetrace.txt's first syntax for arguments (aN, rv, ra, sN, sa).
#pragma once

#include <cerrno>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "symbols/dwarf.hpp"
#include "trace/errors.hpp"
#include "trace/fetch.hpp"

#include <memory>

namespace ukp::trace {

inline constexpr size_t kMaxEventNameLen = 64; // MAX_EVENT_NAME_LEN
inline constexpr size_t kMaxArgNameLen = 32;   // MAX_ARG_NAME_LEN
inline constexpr size_t kMaxArgStrLen = 63;    // MAX_ARGSTR_LEN
inline constexpr int kMaxActive = 4096;        // KRETPROBE_MAXACTIVE_MAX
inline constexpr const char *kDefaultGroup = "kprobes";
// The group of PATH:OFFSET definitions without one, as the kernel's uprobe_events.
inline constexpr const char *kDefaultUprobeGroup = "uprobes";
// The group of w: definitions without one (wprobetrace.rst).
inline constexpr const char *kDefaultWatchGroup = "wprobes";
// The group of t: definitions without one (fprobetrace.rst).
inline constexpr const char *kDefaultTracepointGroup = "tracepoints";
// The group of f: definitions without one (fprobetrace.rst).
inline constexpr const char *kDefaultFunctionGroup = "fprobes";
// The group of e: definitions without one (eprobetrace.rst).
inline constexpr const char *kDefaultEprobeGroup = "eprobes";
// A w: definition's address before a trigger sets one (wprobetrace.rst's dummy -1).
inline constexpr uint64_t kNoWatchAddr = ~uint64_t{0};

// What the parser asks of the process: symbols and mappings.
struct Resolver {
    virtual ~Resolver() = default;
    // "sym" or "MOD:sym" + offset -> address; 0 or -ENOENT (-EINVAL for a bad spec).
    virtual int resolve_code(std::string_view spec, uint64_t offset, uint64_t *addr) = 0;
    // A data symbol "sym" or "MOD:sym" -> its address; 0 or -ENOENT.
    virtual int resolve_data(std::string_view spec, uint64_t *addr) = 0;
    // A file and an offset in it -> the address it is mapped at; 0, -ENOENT (no such
    // file mapped), -ERANGE (the offset is not mapped, or not with `perm`). One file
    // offset may be mapped twice (read-only and read-write pages of a segment
    // boundary): perm 'x' or 'w' picks the executable or writable mapping, 0 any.
    virtual int resolve_file_offset(std::string_view path, uint64_t offset, uint64_t *addr, char perm = 0) = 0;
    // Whether addr is the first instruction of a function.
    virtual bool function_entry(uint64_t addr) = 0;
    // The sites of the SDT probe PROVIDER:NAME in the objects MOD names (every object for
    // ""): address, semaphore, argument specs. 0 or -ENOENT.
    struct SdtSite {
        uint64_t addr = 0, semaphore = 0;
        std::string args; // "8@%rdi -4@-20(%rbp)"
    };
    virtual int resolve_sdt(std::string_view module, std::string_view provider, std::string_view name,
                            std::vector<SdtSite> *sites) {
        (void)module, (void)provider, (void)name, (void)sites;
        return -ENOENT;
    }
    // The functions "[MOD:]PAT[,PAT|,!PAT...]" names: each function symbol of MOD (the main
    // program without one) whose name matches a PAT (fnmatch globs) and no !PAT, once per
    // address. 0 (with none found too), or -ENOENT when MOD is not loaded.
    struct Function {
        uint64_t addr = 0;
        std::string name;
    };
    virtual int resolve_functions(std::string_view spec, std::vector<Function> *out) {
        (void)spec, (void)out;
        return -ENOENT;
    }
    // The fields of event GRP.EVENT (an e: definition's), common ones first. 0 or -ENOENT.
    virtual int event_fields(std::string_view group, std::string_view event, std::vector<Field> *out) {
        (void)group, (void)event, (void)out;
        return -ENOENT;
    }
    // The parameters and types of the function at addr, from its object's debug
    // information; null when there is none (f: arguments by name).
    virtual std::shared_ptr<const sym::FunctionTypes> function_types(uint64_t addr) {
        (void)addr;
        return nullptr;
    }
    // The structs of the objects event GRP.EVENT probes, then of the main program, from
    // their debug information (an e: definition's typecasts); null when none has any.
    virtual std::shared_ptr<const sym::StructTypes> struct_types(std::string_view group, std::string_view event) {
        (void)group, (void)event;
        return nullptr;
    }
    // Whether "MOD:sym" names an object not loaded yet: the probe then waits for it (as
    // the kernel's probes on a module that is not loaded).
    virtual bool module_pending(std::string_view spec) {
        (void)spec;
        return false;
    }
};

// One argument of a definition.
struct ArgDef {
    std::string name; // given with NAME=, else argN (N counted from 1)
    std::string text; // the expression as written, kept for the kprobe_events file
    FetchProgram prog;
};

enum class Where : uint8_t { kSymbol, kAddress, kFile };

// What a w: definition watches (the breakpoint's access type and length are the kernel's
// HW_BREAKPOINT_R/W/RW and 1, 2, 4 or 8).
struct WatchSpec {
    uint32_t type = 3; // HW_BREAKPOINT_RW: the kernel's default
    uint32_t len = 4;
    int64_t offset = 0; // SYM+|-OFFS
};

struct ProbeDef {
    bool remove = false; // "-:[GRP/]EVENT"
    bool is_return = false;
    bool is_watch = false; // w:, with `watch`; `addr` is the watched address
    // t:, on the sites of SDT probe `symbol` ("[MOD:]PROVIDER:NAME"): `addr` and
    // `ref_ctr_addr` are the first site's, `args` its arguments; the other sites' follow.
    bool is_tracepoint = false;
    std::vector<Resolver::SdtSite> sites;
    std::vector<std::vector<ArgDef>> site_args; // sites[1..]'s arguments, in order
    std::vector<std::string> sdt_args;          // while parsing: the site's argument specs
    // f:, on function entries or returns: `symbol` is FUNCS as written (without %return).
    // A single name is a point as p/r's; globs or lists have `functions` (what they matched).
    bool is_function = false;
    std::vector<Resolver::Function> functions;
    // A single function's types (its debug information): arguments by name, $arg*, the
    // type of $retval. Null for a glob, or without debug information.
    std::shared_ptr<const sym::FunctionTypes> types;
    // e:, on the records of the event `symbol` names ("GRP.EVENT"), whose fields these are.
    bool is_eprobe = false;
    std::vector<Field> attach_fields;
    std::shared_ptr<const sym::StructTypes> struct_types; // for (STRUCT)FIELD->MEMBER; null: none
    // A synthetic event (histogram.rst), made by the tracer from a synthetic_events line:
    // its fields are `args`, their values passed by a hist action.
    bool is_synthetic = false;
    int maxactive = 0; // r<N>: 0 for the default
    std::string group = kDefaultGroup;
    std::string event; // generated when not given
    Where where = Where::kSymbol;
    std::string symbol;          // kSymbol: "sym" or "MOD:sym"
    uint64_t offset = 0;         // kSymbol: +offs; kFile: the file offset
    std::string path;            // kFile
    uint64_t ref_ctr_offset = 0; // kFile: PATH:OFFSET(REF), the file offset of an SDT semaphore
    uint64_t ref_ctr_addr = 0;   // its address (0: none)
    uint64_t addr = 0;           // resolved address of the probe point
    WatchSpec watch;
    std::vector<ArgDef> args;
    std::vector<uint16_t> entry_args; // $argN (0-based) a return probe saves at entry
    std::string command;              // the words joined by single spaces, as error_log shows it
    // The location as the kprobe_events file shows it ("do_sys_open", "f+4", "0x...",
    // "/bin/prog:0x0000000000001139").
    std::string location_text() const;
    // The full line as the kprobe_events file shows it.
    std::string show() const;
};

// Parses one line (no newline, comments already removed). `args` splits the words: the
// kprobe_events form uses blanks, the process-start form commas. 0, or -EINVAL with
// *err filled in; -ENOENT for a "-:" of no event is left to the caller (it cannot know).
int parse_definition(std::string_view line, Resolver &resolver, ProbeDef *def, ProbeError *err, char separator = ' ');

// Whether a name follows the C identifier rule (the kernel's is_good_name).
bool is_good_name(std::string_view s);

} // namespace ukp::trace
