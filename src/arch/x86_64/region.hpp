// Where a 5-byte `jmp rel32` may replace code: whole-function analysis (instruction
// boundaries, branch targets, jump tables) and the optprobe safety check of kprobes.rst
// ("How Does Jump Optimization Work?"): the DCR (Detoured Code Region, the whole
// instructions the jump overwrites) must be relocatable, lie within one function, and
// no jump may land in its JTPR (Jump Target Prohibition Region, (addr, addr + DCR)).
//
// Also the C++ exception landing pads of a function (.eh_frame_hdr -> FDE -> LSDA call-site
// table), which are jump targets the code does not show.
//
// Pure analysis of bytes: nothing here patches or reads the process. Memory other than the
// function's own bytes (jump tables in .rodata, unwind tables) is read through a callback.
#pragma once

#include <cstddef>
#include "platform/elf_file.hpp"

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace ukp::arch {

// Reads n bytes at (run-time or file) address addr into out; false if they are not
// readable. Must not throw.
using ReadFn = std::function<bool(uint64_t addr, void *out, size_t n)>;

// An indirect `jmp r/m` found in a function.
struct IndirectJump {
    enum class Kind : uint8_t {
        kUnknown,    // jmp *%reg or jmp *mem that matches no pattern below
        kRipMemory,  // jmp *disp(%rip): a tail call through a GOT entry or function pointer
        kTableRel32, // lea T(%rip),%rX; movslq (%rX,%rI,4),%rY; add %rX,%rY; jmp *%rY
        kTableAbs64, // jmp *T(,%rI,8)
    };
    uint64_t addr = 0; // of the jmp instruction
    Kind kind = Kind::kUnknown;
    uint64_t table = 0;            // kTable*: the table's address
    uint32_t entries = 0;          // kTable*: entry count from the bounds check (cmp $n, idx; ja)
    bool resolved = false;         // kTable*: bound found and every entry read; targets below
    std::vector<uint64_t> targets; // resolved entries (inside the function or not)
    // Not resolved, but every value the target can hold there is a whole code pointer, not
    // computed in this function: loaded from memory other than the stack (GOT entry,
    // vtable, struct field, a table of absolute pointers), a rip-relative lea, or the
    // function's entry value of a register (an argument), maybe through copies, stack
    // spills and glibc's pointer demangling. Such a value was materialized by a relocation
    // or by code, so it goes nowhere ObjectRefs does not list. Valid only if the paths the
    // walk followed are all the paths: nothing outside the function may jump to `walked`.
    bool whole_pointer = false;
    // Instructions whose incoming paths a walk relied on (whole_pointer, or a table whose
    // base register was found on every path: via_paths).
    std::vector<uint64_t> walked;
    // kTableRel32 whose base `lea T(%rip)` lies before the straight line of the pattern:
    // the register (a Zydis id) and the instruction where it must hold T on every path.
    int base_reg = 0;
    uint64_t base_at = 0;
    bool via_paths = false; // resolved that way: valid only if nothing outside joins `walked`
};

// The result of a linear-sweep decode of one function [start, start + size).
struct FunctionMap {
    uint64_t start = 0;
    uint64_t size = 0;
    std::vector<uint8_t> code; // the function's bytes (check_region re-decodes from them)
    // Up to kMaxTail bytes after the function (fewer if unreadable): the padding a region
    // of a function shorter than the jump may run into.
    std::vector<uint8_t> tail;
    std::vector<uint64_t> insns; // instruction addresses, ascending
    // Addresses inside the function that a direct jmp/jcc/loop/jrcxz/call or a resolved
    // jump table entry goes to; sorted, unique.
    std::vector<uint64_t> branch_targets;
    std::vector<IndirectJump> indirect_jumps;
    // Decoding hit bytes that are no valid instruction (decode_fail_addr), or the last
    // instruction runs past start + size: boundaries and targets are not to be trusted.
    bool decode_failed = false;
    bool ran_past_end = false;
    // A direct jmp/jcc or a resolved jump table of the function goes to its first
    // instruction (a loop back to the top, or a tail call of itself): that instruction is
    // not only reached with the caller's stack, the red zone below it dead.
    bool start_jumped = false;
    uint64_t decode_fail_addr = 0;

    bool reliable() const { return !decode_failed && !ran_past_end; }
    // Some indirect jump is not a resolved jump table.
    bool has_unresolved_indirect_jump() const;
    bool is_boundary(uint64_t addr) const;
    // Whether addr lies in [start, start + size).
    bool contains(uint64_t addr) const { return addr >= start && addr - start < size; }
};

inline constexpr size_t kMaxTail = 16;

// Decodes [start, start + size) from `code` (which holds the function's bytes). `read`,
// when given, reads jump tables outside `code` (.rodata) and the tail after the function;
// tables inside `code` are read from it. Never throws (an allocation failure gives
// decode_failed).
FunctionMap analyze_function(uint64_t start, const uint8_t *code, size_t size, const ReadFn &read = {});

enum class Reason : uint8_t {
    kOk,
    kNotInstructionBoundary, // addr is outside the function or not where an instruction starts
    kRegionPastFunctionEnd,  // the whole instructions covering 5 bytes end past the function
    kNotRelocatable,         // an instruction in the DCR cannot run elsewhere (int3, far, ...)
    kJumpIntoRegion,         // a branch, jump table entry or extra entry lands in (addr, addr+DCR)
    kIndirectJump,           // the function has an indirect jump that is no resolved table
    kCallInRegion,           // a call before the last DCR instruction: it returns into the jmp
    kCrossesControlFlowEnd,  // ret/jmp before the last DCR instruction: what follows is unseen
    kDecodeFailed,           // the function does not decode cleanly (data, bad size)
    kTooSmallFunction,       // the function is shorter than the 5-byte jump
    kCount_,
};

const char *reason_name(Reason r);

// What the whole object says about where control can arrive: built once per object from
// its file (build_object_refs), then shared by every check in it.
//
// A jump lands where its target value says. In an object, a code address that a jump can
// use is either a direct branch target, or a value that something materialized: a
// relocation (R_X86_64_RELATIVE/IRELATIVE addends, symbol + addend, the lazy PLT words), a
// symbol, a rip-relative lea anywhere in the code (also `&&label` of computed gotos), an
// absolute immediate or data word in a non-PIC object, DT_INIT/DT_FINI/e_entry, a return
// address (after a call), an exception landing pad (from the LSDA), or a value computed by
// adding an offset to one of these (jump tables, label differences: within one function).
// ObjectRefs collects all but the last three; check_region handles return addresses (no
// call before the last DCR instruction), landing pads (extra_entries) and computed values
// (a function whose indirect jumps are not all whole pointers keeps kIndirectJump).
struct ObjectRefs {
    // Materialized code addresses (values), sorted, unique.
    std::vector<uint64_t> values;
    // Direct jmp/jcc/call/loop branches of all code in the object: (target, source),
    // sorted, unique.
    std::vector<std::pair<uint64_t, uint64_t>> branches;
    // Function starts: symbol values and .eh_frame FDE starts, sorted, unique.
    std::vector<uint64_t> starts;
    // Bytes the linear sweep could not decode in step (they were decoded at every offset).
    uint64_t resynced_bytes = 0;
    // Where the file's NT_GNU_BUILD_ID note (or, without one, its .eh_frame_hdr) lies at
    // run time and its bytes: object_refs() compares them with memory, so that a file
    // replaced on disk since it was loaded gives no references.
    uint64_t identity_addr = 0;
    std::vector<uint8_t> identity;

    // Some value or branch target lies in (lo, hi).
    bool any_in(uint64_t lo, uint64_t hi) const;
    // Some value lies in (lo, hi).
    bool value_in(uint64_t lo, uint64_t hi) const;
    // addr is a value, or a branch target from code outside [fn_lo, fn_hi).
    bool reached_from_outside(uint64_t addr, uint64_t fn_lo, uint64_t fn_hi) const;
    // The first function start above addr (~0 if none).
    uint64_t next_start(uint64_t addr) const;
};

// Builds the references of the ELF file at `path` loaded at `bias` (addresses are
// run-time ones: file vaddrs + bias). Null with *error if the file, its section headers or
// its relocations cannot be read: then no rule that needs them applies. Null too, with
// *error "stopped", when *stop is set while the code is swept (the process exits).
std::shared_ptr<const ObjectRefs> build_object_refs(const std::string &path, uint64_t bias,
                                                    std::string *error = nullptr,
                                                    const std::atomic<bool> *stop = nullptr);
// The same, built once per (path, bias) and kept while the object is loaded; null also
// when `read` (the process's memory) shows other identity bytes than the file's. A build
// that *stop stopped is neither kept nor stored: the next call builds again.
std::shared_ptr<const ObjectRefs> object_refs(const std::string &path, uint64_t bias, const ReadFn &read,
                                              const std::atomic<bool> *stop = nullptr);
// The same without building: from memory or the disk cache, else *known is false (the
// table is still to be built; a build that failed is known, and null).
std::shared_ptr<const ObjectRefs> object_refs_if_known(const std::string &path, uint64_t bias, const ReadFn &read,
                                                       bool *known);
// The disk cache of build_object_refs() (refs_cache.cpp, over platform/disk_cache.hpp),
// used only where a cache directory is set: the table of the file at path, rebased to bias, or null.
std::shared_ptr<const ObjectRefs> load_cached_refs(const std::string &path, uint64_t bias);
void store_cached_refs(const std::string &path, uint64_t bias, const ObjectRefs &refs);
// How many tables this process took from the disk cache.
uint64_t object_refs_loaded_from_disk();
// Drops the kept references of the object that was loaded at bias (it was unloaded).
void forget_object_refs(uint64_t bias);
// How many objects' references are kept.
size_t object_refs_cached();

// The jump-optimization verdict for a probe at addr.
struct OptimizeCheck {
    bool ok = false;
    Reason reason = Reason::kNotInstructionBoundary; // the first failed check, kOk if ok
    uint64_t dcr_len = 0;                            // bytes of whole instructions the jump replaces (0 if unknown)
    std::vector<uint64_t> insns;                     // addresses of the DCR's instructions
    bool into_padding = false;                       // the DCR ends with nops after the function's last ret/jmp
    bool trusted_jumps = false;                      // unresolved indirect jumps accepted as whole pointers
    uint32_t reasons = 0;                            // bit (1 << Reason) for every failed check, for statistics
    // kJumpIntoRegion with refs, when the only ways into (addr, addr + DCR) are direct
    // branches of the object (no materialized value, no extra entry, no jump table
    // entry): those branches, (target, source). Empty otherwise. What an island
    // (island.hpp) needs to know.
    std::vector<std::pair<uint64_t, uint64_t>> entered_by;
};

// The safety check for a jump at addr in the function `f`. `extra_entries` are further
// addresses execution may arrive at (exception landing pads, other symbols' entries).
// Checks, in order of the reported reason: decodability, size, boundary, DCR within the
// function, no ret/jmp and no call before the last DCR instruction, each instruction
// relocatable near (< 2 GiB) and far (> 4 GiB) from addr, no target in (addr, addr + DCR),
// no unresolved indirect jump in the function.
// `jump_len` is the size of the jump that replaces the DCR: 5 (jmp rel32); 2 asks what a
// jmp rel8 to a nearby trampoline would need.
// With `refs` (the function's object), also: no value or branch target anywhere in the
// object lies in (addr, addr + DCR); an unresolved indirect jump is accepted when every
// one in the function is a whole pointer (IndirectJump::whole_pointer) with no path
// joining in, and the function materializes no address inside itself (no `&&label`: its
// jumps could be computed gotos); and a function that ends in ret/jmp before 5 bytes may
// have its DCR run on over nop padding (f.tail) that ends before the next function start.
OptimizeCheck check_region(const FunctionMap &f, uint64_t addr, const std::vector<uint64_t> &extra_entries,
                           size_t jump_len = 5, const ObjectRefs *refs = nullptr);

// ---------------------------------------------------------------------------------------
// Exception landing pads
// ---------------------------------------------------------------------------------------

// Landing pads of the FDEs that cover any of [lo, hi), found through the binary search
// table of the .eh_frame_hdr at `eh_frame_hdr` (PT_GNU_EH_FRAME); appended to *pads
// (absolute addresses; they may lie outside [lo, hi), in a .cold part). Addresses are as
// `read` sees them: run-time ones, or file vaddrs + bias with the pointers in the tables
// pc-relative (as GCC and clang emit them; absolute pointers would need relocations).
// Returns 0 (also when no FDE covers the range: no unwind info, no pads), or
//   -ENOENT   eh_frame_hdr is 0 (the object has no PT_GNU_EH_FRAME)
//   -EFAULT   a read failed (a pointer leads outside the readable image)
//   -EPROTO   a malformed or unsupported table (version, encoding, augmentation, length);
//             *error says which and where.
// The caller treats a function whose pads are unknown as unsafe.
int landing_pads(uint64_t eh_frame_hdr, uint64_t lo, uint64_t hi, const ReadFn &read, std::vector<uint64_t> *pads,
                 std::string *error = nullptr);

// An ELF file's loadable bytes by address (p_vaddr + bias), read through libelf: what a
// file-based analysis (ukp-coverage) reads code, .rodata and unwind tables from.
class ElfImage {
public:
    // Null on failure, with *error saying why.
    static std::unique_ptr<ElfImage> open(const std::string &path, uint64_t bias, std::string *error = nullptr);
    ~ElfImage();
    ElfImage(const ElfImage &) = delete;
    ElfImage &operator=(const ElfImage &) = delete;

    // Bytes of PT_LOAD segments; the part of a segment beyond p_filesz reads as zeros.
    bool read(uint64_t addr, void *out, size_t n) const;
    // A pointer to n file-backed bytes at addr, or null.
    const uint8_t *bytes(uint64_t addr, size_t n) const;
    ReadFn reader() const;
    uint64_t eh_frame_hdr() const { return eh_frame_hdr_; } // 0 if none

private:
    struct Segment {
        uint64_t vaddr, filesz, memsz, offset;
    };
    ElfImage() = default;
    platform::ElfFile elf_;
    const uint8_t *file_ = nullptr;
    size_t file_size_ = 0;
    uint64_t bias_ = 0;
    uint64_t eh_frame_hdr_ = 0;
    std::vector<Segment> segments_;
};

} // namespace ukp::arch
