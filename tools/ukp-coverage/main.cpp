// ukp-coverage: how many function entries (and instruction boundaries) of ELF files a
// 5-byte jmp could probe, per the jump-optimization safety check (arch/x86_64/region.hpp),
// and why the others cannot; plus estimates of what other patching tactics would reach.
//
//   ukp-coverage [--entries-only] [--list] [--jumps] [--no-object-refs] OBJECT...
//
// Addresses are file vaddrs (bias 0); code, jump tables and unwind tables come from the
// file's PT_LOAD segments.
#include "arch/x86_64/insn.hpp"
#include "arch/x86_64/island.hpp"
#include "arch/x86_64/region.hpp"
#include "symbols/symbols.hpp"

#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

namespace {

using ukp::arch::check_region;
using ukp::arch::FunctionMap;
using ukp::arch::IndirectJump;
using ukp::arch::OptimizeCheck;
using ukp::arch::Reason;
using ukp::arch::reason_name;

constexpr size_t kReasons = static_cast<size_t>(Reason::kCount_);

// Tool-level verdicts beside the Reason enum: the function could not be analyzed at all.
enum Extra { kLandingPadsUnknown, kCodeUnreadable, kExtraCount };
const char *const kExtraNames[] = {"landing-pads-unknown", "code-unreadable"};

bool only(const OptimizeCheck &c, uint32_t mask) { return c.reasons != 0 && (c.reasons & ~mask) == 0; }
uint32_t bit(Reason r) { return 1u << static_cast<unsigned>(r); }

struct Counts {
    uint64_t sites = 0, ok = 0;
    std::array<uint64_t, kReasons> first{}; // by first failed check
    std::array<uint64_t, kReasons> any{};   // by every failed check
    std::array<uint64_t, kReasons> sole{};  // functions failing this check only
    std::array<uint64_t, kExtraCount> extra{};

    void add(const OptimizeCheck &c) {
        ++sites;
        if (c.ok) {
            ++ok;
            return;
        }
        ++first[static_cast<size_t>(c.reason)];
        for (size_t r = 0; r < kReasons; ++r) {
            if (c.reasons & (1u << r)) ++any[r];
        }
        if ((c.reasons & (c.reasons - 1)) == 0) ++sole[static_cast<size_t>(c.reason)];
    }
};

// What other tactics would add, over entries that fail the rel32 check.
struct Tactics {
    uint64_t trust_rip_jumps = 0;         // indirect-jump only, all unresolved are jmp *x(%rip)
    uint64_t trust_tail_jumps = 0;        // indirect-jump only, none is an unsized table
    uint64_t into_padding = 0;            // too small / past the end, but padding after it completes 5 bytes
    uint64_t short_jump = 0;              // a jmp rel8 DCR passes and >= 5 padding bytes in reach
    uint64_t first_insn_reloc = 0;        // the first instruction alone relocates (punning base)
    std::array<uint64_t, 16> first_len{}; // length of the first instruction of failing entries
    uint64_t with_pads = 0, pads = 0;     // functions with landing pads (or inner entries), pads
    uint64_t unsized_tables = 0, tables = 0, rip_jumps = 0, unknown_jumps = 0;
    uint64_t whole_pointer_jumps = 0; // unresolved, but a whole pointer (IndirectJump)
    uint64_t by_trusted_jumps = 0;    // passing entries whose indirect jumps were trusted
    uint64_t by_padding = 0;          // passing entries whose DCR runs into padding
    uint64_t by_island = 0;           // passing entries whose region one short branch enters (island.hpp)
};

double pct(uint64_t a, uint64_t b) { return b ? 100.0 * static_cast<double>(a) / static_cast<double>(b) : 0.0; }

// Padding (int3 / nop bytes) around [start, end): bytes of it within jmp rel8 reach of
// `from` (the end of a 2-byte jmp) that form a run of >= 5 bytes.
bool padding_in_reach(const ukp::arch::ElfImage &img, uint64_t from, uint64_t lo, uint64_t hi) {
    // lo/hi: the free gap [lo, hi) between neighbouring functions.
    if (hi <= lo || hi - lo < 5) return false;
    std::vector<uint8_t> gap(hi - lo);
    if (!img.read(lo, gap.data(), gap.size())) return false;
    // A run of 5 filler bytes whose start is within [-128, 127] of `from`.
    size_t run = 0;
    for (size_t i = 0; i < gap.size(); ++i) {
        const uint8_t b = gap[i];
        const bool filler = b == 0xcc || b == 0x90 || b == 0x00;
        run = filler ? run + 1 : 0;
        if (run >= 5) {
            const int64_t d = static_cast<int64_t>(lo + i - 4 - from);
            if (d >= -128 && d <= 127) return true;
        }
    }
    return false;
}

// Bytes of whole nop/int3 instructions from `from` on, before `limit`: alignment padding
// no code reaches, which a jump may overwrite.
uint64_t filler_after(const ukp::arch::ElfImage &img, uint64_t from, uint64_t limit) {
    uint64_t at = from;
    while (at < limit) {
        uint8_t buf[15] = {};
        const size_t n = std::min<uint64_t>(sizeof(buf), limit - at);
        if (!img.read(at, buf, n)) break;
        ukp::arch::Insn in;
        if (ukp::arch::decode(at, buf, n, &in) != 0) break;
        if (in.zi.mnemonic != ZYDIS_MNEMONIC_NOP && in.zi.mnemonic != ZYDIS_MNEMONIC_INT3) break;
        at += in.len;
    }
    return at - from;
}

struct Options {
    bool entries_only = false;
    bool list = false;
    bool list_all = false;
    bool jumps = false;
    bool no_refs = false;
};

// The function symbols of an object.
struct FunctionSymbols {
    std::vector<const ukp::sym::Symbol *> funcs; // one per address (the preferred name comes first at an address)
    std::vector<uint64_t> all_starts;            // any symbol, sorted, unique: entries other code may jump to
    size_t count = 0;                            // function symbols, aliases at one address each counted
};

// The sized function symbols of `obj`, and every symbol's address.
FunctionSymbols function_symbols(const ukp::sym::Object &obj) {
    FunctionSymbols fs;
    for (const ukp::sym::Symbol &s : obj.symbols()) {
        fs.all_starts.push_back(s.value);
        if (!s.function || s.size == 0) continue;
        ++fs.count;
        if (!fs.funcs.empty() && fs.funcs.back()->value == s.value) continue;
        fs.funcs.push_back(&s);
    }
    std::sort(fs.all_starts.begin(), fs.all_starts.end());
    fs.all_starts.erase(std::unique(fs.all_starts.begin(), fs.all_starts.end()), fs.all_starts.end());
    return fs;
}

// The checks of one object: what they read, and what they count.
struct ObjectCheck {
    const ukp::arch::ElfImage &img;
    const ukp::arch::ReadFn read;
    const ukp::arch::ObjectRefs *refs; // the whole object's references; null: the per-function check only
    const Options &opt;
    Counts entries, boundaries; // function entries; every instruction boundary
    Tactics t;
    std::vector<std::string> listing; // --list's lines
    std::vector<std::string> jumps;   // --jumps' lines
};

// The check the agent makes at `a` in `f` (`extra`: its other entries): a region one short
// branch enters passes with an island (*island).
OptimizeCheck check_site(const ObjectCheck &oc, const FunctionMap &f, uint64_t a, const std::vector<uint64_t> &extra,
                         bool *island) {
    OptimizeCheck c = check_region(f, a, extra, 5, oc.refs);
    ukp::arch::Island plan;
    *island = !c.ok && oc.refs != nullptr && ukp::arch::plan_island(c, a, *oc.refs, oc.read, &plan);
    if (*island) {
        c.ok = true;
        c.reason = Reason::kOk;
        c.reasons = 0;
    }
    return c;
}

// The indirect jumps of `f` (the function of `s`), counted by kind and listed (--jumps).
void count_indirect_jumps(ObjectCheck &oc, const FunctionMap &f, const ukp::sym::Symbol &s) {
    Tactics &t = oc.t;
    for (const IndirectJump &ij : f.indirect_jumps) {
        if (oc.opt.jumps) {
            static const char *const kinds[] = {"unknown", "rip-memory", "table-rel32", "table-abs64"};
            oc.jumps.push_back(fmt::format("{:#x} in {}+{:#x}: {} table={:#x} entries={} {}", ij.addr, s.name,
                                           ij.addr - s.value, kinds[static_cast<int>(ij.kind)], ij.table, ij.entries,
                                           ij.resolved ? "resolved"
                                           : ij.whole_pointer
                                               ? fmt::format("whole pointer ({} instructions walked)", ij.walked.size())
                                               : std::string("unresolved")));
        }
        switch (ij.kind) {
        case IndirectJump::Kind::kTableRel32:
        case IndirectJump::Kind::kTableAbs64:
            ++t.tables;
            if (!ij.resolved) ++t.unsized_tables;
            break;
        case IndirectJump::Kind::kRipMemory:
            ++t.rip_jumps;
            break;
        case IndirectJump::Kind::kUnknown:
            ++t.unknown_jumps;
            break;
        }
        t.whole_pointer_jumps += !ij.resolved && ij.whole_pointer;
    }
}

// Every failed check of `c`, by name, separated by commas.
std::string reason_names(const OptimizeCheck &c) {
    std::string reasons;
    for (size_t r = 0; r < kReasons; ++r) {
        if (c.reasons & (1u << r)) {
            reasons += reasons.empty() ? "" : ",";
            reasons += reason_name(static_cast<Reason>(r));
        }
    }
    return reasons;
}

// What other tactics would make of the entry of function `fi` (`f`, its `code`, its other
// entries `extra`), which fails the check `c`: added to oc.t.
void estimate_tactics(ObjectCheck &oc, const FunctionSymbols &fs, size_t fi, const FunctionMap &f, const uint8_t *code,
                      const std::vector<uint64_t> &extra, const OptimizeCheck &c) {
    Tactics &t = oc.t;
    const ukp::sym::Symbol &s = *fs.funcs[fi];
    const uint64_t start = s.value, end = s.value + s.size;
    if (only(c, bit(Reason::kIndirectJump))) {
        bool all_rip = true, no_table = true;
        for (const IndirectJump &ij : f.indirect_jumps) {
            if (ij.resolved) continue;
            all_rip = all_rip && ij.kind == IndirectJump::Kind::kRipMemory;
            no_table =
                no_table && (ij.kind == IndirectJump::Kind::kRipMemory || ij.kind == IndirectJump::Kind::kUnknown);
        }
        t.trust_rip_jumps += all_rip;
        t.trust_tail_jumps += no_table;
    }
    const uint64_t next_start = fi + 1 < fs.funcs.size() ? fs.funcs[fi + 1]->value : end;
    if (only(c, bit(Reason::kTooSmallFunction) | bit(Reason::kRegionPastFunctionEnd)) &&
        check_region(f, start, extra, s.size).ok &&
        filler_after(oc.img, end, std::min(next_start, start + 64)) >= 5 - std::min<uint64_t>(s.size, 5)) {
        ++t.into_padding;
    }
    const OptimizeCheck c2 = check_region(f, start, extra, 2);
    if (c2.ok) {
        // The free gap before this function (after the previous one) and after it.
        const uint64_t prev_end = fi > 0 ? fs.funcs[fi - 1]->value + fs.funcs[fi - 1]->size : start;
        const uint64_t from = start + 2;
        if ((prev_end < start && padding_in_reach(oc.img, from, prev_end, start)) ||
            (next_start > end && padding_in_reach(oc.img, from, end, next_start))) {
            ++t.short_jump;
        }
    }
    if (f.reliable() && !f.insns.empty()) {
        ukp::arch::Insn in;
        if (ukp::arch::decode(start, code, s.size, &in) == 0) {
            ++t.first_len[std::min<size_t>(in.len, 15)];
            uint8_t buf[ukp::arch::kMaxRelocatedSize];
            if (in.flow != ukp::arch::Flow::kUnsupported &&
                ukp::arch::relocate(in, start + (1ull << 40), buf, sizeof(buf), ukp::arch::Exit::kNone) >= 0) {
                ++t.first_insn_reloc;
            }
        }
    }
}

// Checks the entry of function `fi` (and, unless --entries-only, every instruction
// boundary of it), counted in `oc`.
void check_function(ObjectCheck &oc, const FunctionSymbols &fs, size_t fi) {
    const Options &opt = oc.opt;
    const ukp::sym::Symbol &s = *fs.funcs[fi];
    const uint64_t start = s.value, end = s.value + s.size;
    const uint8_t *code = oc.img.bytes(start, s.size);
    if (code == nullptr) {
        ++oc.entries.sites;
        ++oc.entries.extra[kCodeUnreadable];
        if (opt.list) oc.listing.push_back(fmt::format("{:#x} {} {}", start, s.name, kExtraNames[kCodeUnreadable]));
        return;
    }
    const FunctionMap f = ukp::arch::analyze_function(start, code, s.size, oc.read);
    std::vector<uint64_t> extra;
    std::string why;
    const int lp = ukp::arch::landing_pads(oc.img.eh_frame_hdr(), start, end, oc.read, &extra, &why);
    if (lp != 0) {
        ++oc.entries.sites;
        ++oc.entries.extra[kLandingPadsUnknown];
        if (opt.list) {
            oc.listing.push_back(fmt::format("{:#x} {} {} ({})", start, s.name, kExtraNames[kLandingPadsUnknown], why));
        }
        return;
    }
    oc.t.pads += extra.size();
    oc.t.with_pads += !extra.empty();
    // Other symbols inside this one are entries too (asm labels, nested aliases).
    for (auto it = std::upper_bound(fs.all_starts.begin(), fs.all_starts.end(), start);
         it != fs.all_starts.end() && *it < end; ++it) {
        extra.push_back(*it);
    }
    count_indirect_jumps(oc, f, s);

    bool by_island = false;
    const OptimizeCheck c = check_site(oc, f, start, extra, &by_island);
    oc.entries.add(c);
    if (c.ok) {
        oc.t.by_trusted_jumps += c.trusted_jumps;
        oc.t.by_padding += c.into_padding;
        oc.t.by_island += by_island;
    }
    if (c.ok && opt.list_all) oc.listing.push_back(fmt::format("{:#x} {} ok", start, s.name));
    if (!c.ok) {
        if (opt.list) oc.listing.push_back(fmt::format("{:#x} {} {}", start, s.name, reason_names(c)));
        estimate_tactics(oc, fs, fi, f, code, extra, c);
    }
    if (!opt.entries_only && f.reliable()) {
        for (uint64_t a : f.insns) oc.boundaries.add(check_site(oc, f, a, extra, &by_island));
    }
}

// The counts of `oc`, for the object at `path` (`fs`: its function symbols), on stdout.
void print_counts(const std::string &path, const FunctionSymbols &fs, const ObjectCheck &oc) {
    const Options &opt = oc.opt;
    const Counts &entries = oc.entries, &boundaries = oc.boundaries;
    const Tactics &t = oc.t;
    fmt::print("{}: {} function symbols, {} distinct entries\n", path, fs.count, entries.sites);
    fmt::print("  entries optimizable (jmp rel32): {} of {} = {:.1f}%\n", entries.ok, entries.sites,
               pct(entries.ok, entries.sites));
    fmt::print("  not optimizable, by first failed check / by any failed check / as the only one:\n");
    for (size_t r = 1; r < kReasons; ++r) {
        if (entries.any[r] == 0) continue;
        fmt::print("    {:<26} {:>6} {:>5.1f}%   {:>6}   {:>6}\n", reason_name(static_cast<Reason>(r)),
                   entries.first[r], pct(entries.first[r], entries.sites), entries.any[r], entries.sole[r]);
    }
    for (size_t e = 0; e < kExtraCount; ++e) {
        if (entries.extra[e] == 0) continue;
        fmt::print("    {:<26} {:>6} {:>5.1f}%\n", kExtraNames[e], entries.extra[e],
                   pct(entries.extra[e], entries.sites));
    }
    if (oc.refs != nullptr) {
        fmt::print("  of those optimizable: {} with indirect jumps trusted as whole pointers, {} with the DCR "
                   "run into padding, {} with an island for a short branch into the region\n",
                   t.by_trusted_jumps, t.by_padding, t.by_island);
        fmt::print("  object references: {} values, {} branch targets, {} function starts, {} bytes decoded "
                   "at every offset\n",
                   oc.refs->values.size(), oc.refs->branches.size(), oc.refs->starts.size(), oc.refs->resynced_bytes);
    }
    fmt::print("  exception landing pads: {} in {} functions\n", t.pads, t.with_pads);
    fmt::print("  indirect jumps: {} jump tables ({} unsized), {} jmp *x(%rip), {} other; {} unresolved are "
               "whole pointers\n",
               t.tables, t.unsized_tables, t.rip_jumps, t.unknown_jumps, t.whole_pointer_jumps);
    const uint64_t failing = entries.sites - entries.ok;
    fmt::print("  tactics, entries they would add (of {} failing):\n", failing);
    fmt::print("    trust jmp *x(%rip) as tail calls:          +{}\n", t.trust_rip_jumps);
    fmt::print("    trust every non-table indirect jmp:        +{}\n", t.trust_tail_jumps);
    fmt::print("    DCR runs on into the padding after the end: +{}\n", t.into_padding);
    fmt::print("    jmp rel8 to a trampoline in >=5 padding:   +{}\n", t.short_jump);
    fmt::print("    first instruction relocatable (punning):   {}; first-insn length histogram:", t.first_insn_reloc);
    for (size_t l = 1; l < t.first_len.size(); ++l) {
        if (t.first_len[l]) fmt::print(" {}:{}", l, t.first_len[l]);
    }
    fmt::print("\n");
    if (!opt.entries_only) {
        fmt::print("  every instruction boundary: {} of {} = {:.1f}% optimizable\n", boundaries.ok, boundaries.sites,
                   pct(boundaries.ok, boundaries.sites));
        for (size_t r = 1; r < kReasons; ++r) {
            if (boundaries.first[r] == 0) continue;
            fmt::print("    {:<26} {:>8} {:>5.1f}%\n", reason_name(static_cast<Reason>(r)), boundaries.first[r],
                       pct(boundaries.first[r], boundaries.sites));
        }
    }
    if (opt.jumps) {
        fmt::print("  indirect jumps:\n");
        for (const std::string &l : oc.jumps) fmt::print("    {}\n", l);
    }
    if (opt.list) {
        fmt::print("{}", opt.list_all ? "  entries:\n" : "  not optimizable:\n");
        for (const std::string &l : oc.listing) fmt::print("    {}\n", l);
    }
}

int run_object(const std::string &path, const Options &opt) {
    auto obj = ukp::sym::load_object(path, 0);
    if (!obj) {
        fmt::print(stderr, "ukp-coverage: {}: cannot read ELF symbols\n", path);
        return 1;
    }
    std::string err;
    auto img = ukp::arch::ElfImage::open(path, 0, &err);
    if (!img) {
        fmt::print(stderr, "ukp-coverage: {}\n", err);
        return 1;
    }
    // The whole object's references: without them the check is the per-function one only.
    const auto refs = opt.no_refs ? nullptr : ukp::arch::build_object_refs(path, 0, &err);
    if (!refs && !opt.no_refs) fmt::print(stderr, "ukp-coverage: {} (checking without object references)\n", err);

    const FunctionSymbols fs = function_symbols(*obj);
    ObjectCheck oc{*img, img->reader(), refs.get(), opt, {}, {}, {}, {}, {}};
    for (size_t fi = 0; fi < fs.funcs.size(); ++fi) check_function(oc, fs, fi);
    print_counts(path, fs, oc);
    return 0;
}

} // namespace

int main(int argc, char **argv) {
    CLI::App app{"Jump-optimization coverage of function entries in ELF objects"};
    Options opt;
    std::vector<std::string> objects;
    app.add_flag("--entries-only", opt.entries_only, "Check function entries only, not every instruction");
    app.add_flag("--list", opt.list, "List the entries that cannot be optimized, with every reason");
    app.add_flag("--list-all", opt.list_all, "With --list, the optimizable entries too (ADDR NAME ok)");
    app.add_flag("--jumps", opt.jumps, "List every indirect jump: kind, table, entries");
    app.add_flag("--no-object-refs", opt.no_refs,
                 "Per-function check only (no object-wide references: no trusted indirect jumps, no padding)");
    app.add_option("OBJECT", objects, "ELF files (executables, shared libraries)")->required();
    CLI11_PARSE(app, argc, argv);
    int rc = 0;
    for (const std::string &o : objects) rc |= run_object(o, opt);
    return rc;
}
