// Fetch programs: each argument of a probe definition compiled to a short, bounded list
// of operations (the kernel's struct fetch_insn), and the code a hit runs to fill a
// record from them. The hit side allocates nothing, takes no lock, makes no system call:
// every memory read goes through the fault-safe copy of arch/x86_64/safe_access.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "trace/record.hpp"

struct pt_regs; // include/ukprobes/kprobes.h

namespace ukp::trace {

inline constexpr int kMaxFetchOps = 16;  // the kernel's FETCH_INSN_MAX
inline constexpr int kMaxArgs = 128;     // MAX_TRACE_ARGS
inline constexpr int kMaxArrayLen = 64;  // MAX_ARRAY_LEN
inline constexpr int kMaxEntryArgs = 16; // $argN values a return probe saves at entry
// Bytes a string field keeps, NUL included: the kernel's MAX_STRING_SIZE (PATH_MAX). A
// longer string is measured 0, as the kernel's uprobe tracer measures it (measure_fetch).
inline constexpr uint32_t kMaxStringLen = 4096;

// The value kinds of kprobetrace.rst's types.
enum class Kind : uint8_t {
    kUnsigned, // uN, and bitfields
    kSigned,   // sN
    kHex,      // xN, and the default type
    kChar,     // char
    kString,   // string, ustring (a __data_loc word and the bytes in the dynamic area)
    kSymbol,   // symbol: an address printed sym+off
    kSymStr,   // symstr: the address turned into "sym+off/size" at the hit
    // A synthetic event's `unsigned long[]` (histogram.rst's stack field): the value is the
    // address of kStackWords addresses, zero after the last; a __data_loc array of them.
    kStack,
};

// Addresses a stack field holds at most: the kernel's HIST_STACKTRACE_DEPTH.
inline constexpr uint32_t kStackWords = 16;

// A fetch argument's type.
struct ArgType {
    Kind kind = Kind::kHex;
    uint8_t size = 8;  // bytes of one element in the record (4 for strings)
    bool user = false; // ustring
    bool bitfield = false;
    uint8_t bf_width = 0; // b<width>@<offset>/<container>
    uint8_t bf_offset = 0;
    uint8_t array_len = 0; // [N]; 0: a scalar
    std::string name;      // as written ("x16", "string", "b3@2/32"); "" for the default
};

enum class Op : uint8_t {
    kReg,       // value = the register at `param` (index in struct pt_regs)
    kStack,     // value = the `param`th word of the stack
    kStackAddr, // value = the stack pointer
    kRetval,    // value = the return value register
    kRetAddr,   // value = the return address (return probes; kprobetrace.txt's `ra`)
    kArg,       // value = the `param`th (0-based) System V argument at function entry
    kEntryArg,  // value = the `param`th value saved at entry (return probes)
    kImm,       // value = imm
    kComm,      // value = address of the thread's name
    kData,      // value = address of an immediate string (imm: its index in the program)
    kDeref,     // value = the 8 bytes at value + imm
    kWatchAddr, // value = the address a watch event watches ($addr)
    // value = field of the record an event probe is attached to ($FIELD): at offset imm,
    // param bytes (1, 2, 4, 8; kFieldSigned added for a signed one, sign-extended), or 0 for
    // a __data_loc string: the address of its bytes in the record; with kFieldAddress (an
    // array), the address of the field in the record, as the kernel's get_event_field()
    // gives for a field of another size.
    kField,
};
inline constexpr uint16_t kFieldSigned = 0x100;
inline constexpr uint16_t kFieldAddress = 0x200;

struct FetchOp {
    Op op;
    bool user = false; // +uOFFS(...): a user-space dereference (the same read here)
    uint16_t param = 0;
    int64_t imm = 0;
};

// How the last stage stores the value into the record.
enum class Store : uint8_t {
    kRaw,         // the value itself, cut to the type's size
    kMem,         // read the type's size at value + mem_offset
    kString,      // copy the string at value (+ mem_offset when `deref_string`)
    kStringArray, // array_len pointers at value + mem_offset, each a string
    kSymStr,      // value is an address; stored as "sym+0xoff/0xsize"
    kStack,       // value is the address of a stack's words (Kind::kStack)
};

// One compiled argument.
struct FetchProgram {
    FetchOp ops[kMaxFetchOps];
    uint8_t nops = 0;
    Store store = Store::kRaw;
    bool deref_string = false; // kString: the address is value + mem_offset
    uint16_t max_string = 0;   // kString: longest string kept, its NUL in (a longer one is cut); 0: kMaxStringLen
    int64_t mem_offset = 0;    // offset of the final load (kMem, kString, kStringArray)
    ArgType type;
    uint32_t offset = 0;    // of the field in the record
    int8_t direct_reg = -1; // stored as one register holds it (%di, $arg1, $retval): its index
    std::string data;       // kData: the immediate string
};

// An argument stored as one register holds it (FetchProgram::direct_reg), in the four
// bytes a hit needs of it: an event all of whose arguments are such walks these instead
// of its programs (some 300 bytes each).
struct DirectStore {
    uint16_t offset; // of the field in the record
    uint8_t reg;     // index in struct pt_regs
    uint8_t size;    // bytes stored: 1, 2, 4 or 8
};

// The direct stores of progs (after layout_fields), if every program is one; else none.
std::vector<DirectStore> direct_stores(const std::vector<FetchProgram> &progs);

// Stores the low `size` bytes (1, 2, 4, else 8) of v at dst; constant-size copies, so
// no call to memcpy (a probe may sit on it).
inline void put_value(uint8_t *dst, uint64_t v, uint32_t size) noexcept {
    switch (size) {
    case 1: {
        const auto x = static_cast<uint8_t>(v);
        __builtin_memcpy(dst, &x, 1);
        break;
    }
    case 2: {
        const auto x = static_cast<uint16_t>(v);
        __builtin_memcpy(dst, &x, 2);
        break;
    }
    case 4: {
        const auto x = static_cast<uint32_t>(v);
        __builtin_memcpy(dst, &x, 4);
        break;
    }
    default:
        __builtin_memcpy(dst, &v, 8);
        break;
    }
}

// Stores the registers into rec as run_fetch would; no fault is possible.
inline void run_direct(const DirectStore *stores, uint32_t n, const struct pt_regs *regs, uint8_t *rec) noexcept {
    const auto *r = reinterpret_cast<const unsigned long *>(regs);
    for (uint32_t i = 0; i < n; ++i) put_value(rec + stores[i].offset, r[stores[i].reg], stores[i].size);
}

// What a hit gives the fetch programs.
struct HitContext {
    const struct pt_regs *regs;
    const uint64_t *entry_args = nullptr; // return probes: $argN values saved at entry
    uint64_t ret_addr = 0;                // return probes: where the function returns to
    const char *comm = nullptr;           // the thread's name, NUL-terminated
    uint64_t watch_addr = 0;              // watch events: the address watched
    const uint8_t *rec = nullptr;         // event probes: the record of the event they are on
    uint32_t rec_size = 0;
};

// Symbol lookup for symstr at the hit: an immutable table built when the event is defined.
struct SymbolTable {
    struct Entry {
        uint64_t start, size;
        uint32_t name_off; // into names
    };
    std::vector<Entry> entries; // sorted by start
    std::string names;          // NUL-separated
    // Writes "sym+0xoff/0xsize" (or "0xADDR") into out (room bytes); returns the length
    // written including the NUL. With out null, only that length. No allocation.
    uint32_t format(uint64_t addr, char *out, uint32_t room) const noexcept;
};

// The fields of a probe's arguments, starting at `base` (after __probe_ip or
// __probe_func/__probe_ret_ip), packed, as the record and the format file lay them out.
// Fills each program's offset; returns the size of the fixed part of the record.
uint32_t layout_fields(std::vector<FetchProgram> &progs, const std::vector<std::string> &names, uint32_t base,
                       std::vector<Field> *fields);

// The bytes of string data a hit's record needs, measured before the record is reserved
// as the kernel measures them (__get_data_size): each string with its NUL, 0 for one that
// faults or has no NUL in its first kMaxStringLen bytes. Reads each string once more than
// run_fetch does, fault-safe and bounded, with no allocation.
// Short strings the measuring pass read whole (the first read, at most 64 bytes up to the
// page's end, held the NUL): run_fetch stores them from here rather than reading the
// program's memory a second time.
struct StringStash {
    static constexpr uint32_t kSlots = 4, kBytes = 64;
    uint32_t count = 0;
    uint64_t addr[kSlots];
    uint32_t len[kSlots]; // with the NUL
    char bytes[kSlots][kBytes];
};

uint32_t measure_fetch(const FetchProgram *progs, uint32_t nprogs, const HitContext &ctx, const SymbolTable *symbols,
                       StringStash *stash = nullptr) noexcept;

// Runs the programs and writes the argument fields (and the dynamic string data after
// the fixed part, at `fixed_size`) into rec, which has room for `cap` bytes. The strings
// share what is left after the fixed part in order, each cut to the room left for it, as
// the kernel's store_trace_args shares its measured size (a string measured 0 may so take
// the room of the next ones). Returns the bytes used; *faults counts the arguments whose
// memory could not be read or that got no room (their field gets the kernel's fault
// form: 0 for integers, an empty __data_loc for strings).
uint32_t run_fetch(const FetchProgram *progs, uint32_t nprogs, const HitContext &ctx, const SymbolTable *symbols,
                   uint8_t *rec, uint32_t fixed_size, uint32_t cap, uint32_t *faults,
                   const StringStash *stash = nullptr) noexcept;

// The user stack at a hit, up to `max` addresses: the probed instruction, the return
// address at (%sp) (a function's entry), then the frame-pointer chain, every read
// fault-safe (code without frame pointers ends it early). Returns how many.
int user_stack(const pt_regs &regs, uint64_t *frames, int max) noexcept;

// The index in struct pt_regs of a register named as the kernel's x86-64 regs_query_
// register_offset accepts it ("ax", "r8", "flags", ...), or -1.
int register_index(const char *name, size_t len);
const char *register_name(int index);

} // namespace ukp::trace
