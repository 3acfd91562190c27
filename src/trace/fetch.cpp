#include "trace/fetch.hpp"
#include "trace/bytes.hpp"

#include <ukprobes/kprobes.h>

#include <cerrno>
#include <cstring>

#include "platform/safe_access.hpp"

namespace ukp::trace {

namespace {

// The kernel's x86-64 register names, in struct pt_regs order.
constexpr const char *kRegNames[] = {"r15", "r14", "r13", "r12", "bp",      "bx", "r11", "r10",   "r9", "r8", "ax",
                                     "cx",  "dx",  "si",  "di",  "orig_ax", "ip", "cs",  "flags", "sp", "ss"};
constexpr int kRegCount = sizeof(kRegNames) / sizeof(kRegNames[0]);
constexpr int kRegSp = 19, kRegAx = 10;
// System V AMD64: di, si, dx, cx, r8, r9.
constexpr int kArgRegs[6] = {14, 13, 12, 11, 9, 8};

inline uint64_t reg_at(const pt_regs *regs, int index) { return reinterpret_cast<const unsigned long *>(regs)[index]; }

inline bool load64(uint64_t addr, uint64_t *out) {
    return ukp_safe_copy(out, reinterpret_cast<const void *>(addr), 8) == 0;
}

inline uint64_t get(const uint8_t *src, uint32_t size) {
    switch (size) {
    case 1:
        return *src;
    case 2: {
        uint16_t x;
        __builtin_memcpy(&x, src, 2);
        return x;
    }
    case 4: {
        uint32_t x;
        __builtin_memcpy(&x, src, 4);
        return x;
    }
    default: {
        uint64_t x;
        __builtin_memcpy(&x, src, 8);
        return x;
    }
    }
}

inline uint64_t bitfield(uint64_t v, const ArgType &t) {
    const unsigned bits = t.size * 8u;
    v <<= 64 - bits; // the container's bits at the top
    v <<= bits - (t.bf_width + t.bf_offset);
    return v >> (64 - t.bf_width);
}

// An event probe's $FIELD from the record it is attached to (Op::kField); false when the
// record does not hold it.
inline bool field_value(const HitContext &ctx, const FetchOp &op, uint64_t *v) {
    const uint32_t size = op.param & 0xff, at = static_cast<uint32_t>(op.imm);
    if (ctx.rec == nullptr || uint64_t(at) + (size == 0 ? 4 : size) > ctx.rec_size) return false;
    if (size == 0) { // __data_loc: length << 16 | offset
        const uint32_t loc = static_cast<uint32_t>(get(ctx.rec + at, 4));
        if ((loc >> 16) == 0 || (loc & 0xffff) + (loc >> 16) > ctx.rec_size) return false;
        *v = reinterpret_cast<uint64_t>(ctx.rec + (loc & 0xffff));
        return true;
    }
    if ((op.param & kFieldAddress) != 0) {
        *v = reinterpret_cast<uint64_t>(ctx.rec + at);
        return true;
    }
    *v = get(ctx.rec + at, size);
    if ((op.param & kFieldSigned) != 0 && size < 8) {
        const unsigned shift = 64 - 8 * size;
        *v = static_cast<uint64_t>(static_cast<int64_t>(*v << shift) >> shift);
    }
    return true;
}

// Runs the operations; false when a memory read faulted.
inline bool run_ops(const FetchProgram &p, const HitContext &ctx, uint64_t *value) {
    uint64_t v = 0;
    for (uint32_t i = 0; i < p.nops; ++i) {
        const FetchOp &op = p.ops[i];
        switch (op.op) {
        case Op::kReg:
            v = reg_at(ctx.regs, op.param);
            break;
        case Op::kStack:
            if (!load64(reg_at(ctx.regs, kRegSp) + 8ull * op.param, &v)) return false;
            break;
        case Op::kStackAddr:
            v = reg_at(ctx.regs, kRegSp);
            break;
        case Op::kRetval:
            v = reg_at(ctx.regs, kRegAx);
            break;
        case Op::kRetAddr:
            v = ctx.ret_addr;
            break;
        case Op::kArg:
            if (op.param < 6) {
                v = reg_at(ctx.regs, kArgRegs[op.param]);
            } else if (!load64(reg_at(ctx.regs, kRegSp) + 8ull * (op.param - 5), &v)) {
                // At entry the return address is at (%sp); the seventh argument above it.
                return false;
            }
            break;
        case Op::kEntryArg:
            v = ctx.entry_args != nullptr ? ctx.entry_args[op.param] : 0;
            break;
        case Op::kImm:
            v = static_cast<uint64_t>(op.imm);
            break;
        case Op::kComm:
            v = reinterpret_cast<uint64_t>(ctx.comm);
            break;
        case Op::kData:
            v = reinterpret_cast<uint64_t>(p.data.c_str());
            break;
        case Op::kDeref:
            if (!load64(v + static_cast<uint64_t>(op.imm), &v)) return false;
            break;
        case Op::kWatchAddr:
            v = ctx.watch_addr;
            break;
        case Op::kField:
            if (!field_value(ctx, op, &v)) return false;
            break;
        }
    }
    *value = v;
    return true;
}

constexpr uint64_t kPage = 4096;

// The bytes a stack field keeps of the addresses at addr: those up to the first zero, and
// that zero while there is room, as the kernel's trace_stack() keeps a synthetic event's
// stack; 0 when they cannot be read.
uint32_t stack_bytes(uint64_t addr) {
    uint32_t n = 0;
    for (uint64_t a = 0; n < kStackWords; ++n)
        if (!load64(addr + 8ull * n, &a))
            return 0;
        else if (a == 0)
            break;
    return 8 * (n < kStackWords ? n + 1 : n);
}

// The length of the string at addr with its NUL, as the kernel's uprobe tracer measures it
// (fetch_store_strlen: strnlen_user up to MAX_STRING_SIZE): 0 when it is unreadable
// before its end or has no NUL in its first kMaxStringLen bytes. Reads at most to the end
// of a page the string reaches, as safe_strncpy does: no fault the string would not raise.
// With a `cut` below kMaxStringLen, a longer string measures `cut` (put_string cuts it).
uint32_t measure_string(uint64_t addr, StringStash *stash, uint32_t cut = kMaxStringLen) {
    constexpr uint64_t kChunk = 256; // stack a hit can spare; the first read is shorter
    if (addr == 0) return 0;
    char buf[kChunk];
    uint32_t done = 0;
    uint64_t want = 64;
    while (done < cut) {
        const uint64_t at = addr + done;
        uint64_t chunk = kPage - (at & (kPage - 1));
        if (chunk > want) chunk = want;
        if (chunk > cut - done) chunk = cut - done;
        if (ukp_safe_copy(buf, reinterpret_cast<const void *>(at), chunk) != 0) return 0;
        const uint64_t nul = platform::find_nul(buf, chunk);
        if (nul < chunk) {
            if (done == 0 && stash != nullptr && stash->count < StringStash::kSlots && chunk <= StringStash::kBytes) {
                const uint32_t i = stash->count++;
                stash->addr[i] = addr;
                stash->len[i] = static_cast<uint32_t>(nul) + 1;
                copy_bytes(stash->bytes[i], buf, stash->len[i]);
            }
            return done + static_cast<uint32_t>(nul) + 1;
        }
        done += static_cast<uint32_t>(chunk);
        want = kChunk;
    }
    return cut < kMaxStringLen ? cut : 0;
}

// Copies a string into the dynamic area and writes its __data_loc word at `loc`: at most
// the cap - dyn bytes left of the record (the kernel's maxlen), cut with a NUL at the end
// as the kernel's fetch_store_string cuts it. Returns the bytes used in the dynamic area;
// a fault, or no room left, stores an empty location (printed (fault)).
inline uint32_t put_string(uint8_t *rec, uint8_t *loc, uint32_t dyn, uint32_t cap, uint64_t addr, bool *fault,
                           const StringStash *stash, uint32_t cut = kMaxStringLen) {
    uint32_t room = cap > dyn ? cap - dyn : 0;
    if (room > cut) room = cut;
    int n = -EFAULT;
    if (room > 0 && addr != 0) {
        for (uint32_t i = 0; stash != nullptr && i < stash->count; ++i) {
            if (stash->addr[i] != addr || stash->len[i] > room) continue;
            copy_bytes(reinterpret_cast<char *>(rec + dyn), stash->bytes[i], stash->len[i]);
            n = static_cast<int>(stash->len[i]);
            break;
        }
        if (n < 0)
            n = platform::safe_strncpy(reinterpret_cast<char *>(rec + dyn), reinterpret_cast<const char *>(addr), room);
    }
    if (n < 0) {
        *fault = true;
        put_value(loc, uint64_t(dyn) & 0xffff, 4); // length 0: the reader prints (fault)
        return 0;
    }
    put_value(loc, (uint64_t(uint32_t(n)) << 16) | dyn, 4);
    return static_cast<uint32_t>(n);
}

} // namespace

int user_stack(const pt_regs &regs, uint64_t *frames, int max) noexcept {
    if (max <= 0) return 0;
    frames[0] = regs.ip;
    int n = 1;
    uint64_t ret = 0;
    // At a function's first instruction the caller's return address is at (%sp). The zero
    // page is no stack: registers that point there (a hit's registers not filled in) are
    // not followed.
    constexpr uint64_t kLowest = 4096;
    if (n < max && regs.sp >= kLowest && load64(regs.sp, &ret)) frames[n++] = ret;
    for (uint64_t fp = regs.bp; n < max && fp >= kLowest;) {
        uint64_t pair[2];
        if (ukp_safe_copy(pair, reinterpret_cast<const void *>(fp), 16) != 0 || pair[1] == 0) break;
        if (pair[1] != frames[n - 1]) frames[n++] = pair[1];
        if (pair[0] <= fp) break;
        fp = pair[0];
    }
    return n;
}

int register_index(const char *name, size_t len) {
    for (int i = 0; i < kRegCount; ++i) {
        if (std::strlen(kRegNames[i]) == len && std::memcmp(kRegNames[i], name, len) == 0) return i;
    }
    return -1;
}

const char *register_name(int index) { return index >= 0 && index < kRegCount ? kRegNames[index] : "?"; }

uint32_t SymbolTable::format(uint64_t addr, char *out, uint32_t room) const noexcept {
    // Binary search for the last entry starting at or below addr.
    size_t lo = 0, hi = entries.size();
    while (lo < hi) {
        const size_t mid = (lo + hi) / 2;
        if (entries[mid].start <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    uint32_t n = 0;
    auto putc = [&](char c) {
        if (n + 1 < room) {
            if (out != nullptr) out[n] = c;
            ++n;
        }
    };
    auto puthex = [&](uint64_t v) {
        putc('0');
        putc('x');
        char buf[16];
        int k = 0;
        do {
            buf[k++] = "0123456789abcdef"[v & 15];
            v >>= 4;
        } while (v != 0);
        while (k > 0) putc(buf[--k]);
    };
    if (lo > 0 && addr - entries[lo - 1].start < (entries[lo - 1].size ? entries[lo - 1].size : 1)) {
        const Entry &e = entries[lo - 1];
        for (const char *s = names.c_str() + e.name_off; *s != '\0'; ++s) putc(*s);
        putc('+');
        puthex(addr - e.start);
        putc('/');
        puthex(e.size);
    } else {
        puthex(addr);
    }
    if (room > 0) {
        if (out != nullptr) out[n] = '\0';
        ++n;
    }
    return n;
}

std::vector<DirectStore> direct_stores(const std::vector<FetchProgram> &progs) {
    std::vector<DirectStore> out;
    for (const FetchProgram &p : progs) {
        if (p.direct_reg < 0 || p.offset > UINT16_MAX) return {};
        out.push_back(
            {static_cast<uint16_t>(p.offset), static_cast<uint8_t>(p.direct_reg), static_cast<uint8_t>(p.type.size)});
    }
    return out;
}

uint32_t layout_fields(std::vector<FetchProgram> &progs, const std::vector<std::string> &names, uint32_t base,
                       std::vector<Field> *fields) {
    uint32_t off = base;
    for (size_t i = 0; i < progs.size(); ++i) {
        FetchProgram &p = progs[i];
        const ArgType &t = p.type;
        p.offset = off;
        // Most arguments are a register stored as it is: run_fetch then skips the operations.
        p.direct_reg = -1;
        if (p.store == Store::kRaw && p.nops == 1 && !t.bitfield && t.array_len == 0) {
            const FetchOp &op = p.ops[0];
            if (op.op == Op::kReg)
                p.direct_reg = static_cast<int8_t>(op.param);
            else if (op.op == Op::kArg && op.param < 6)
                p.direct_reg = static_cast<int8_t>(kArgRegs[op.param]);
            else if (op.op == Op::kRetval)
                p.direct_reg = static_cast<int8_t>(kRegAx);
        }
        Field f;
        f.name = names[i];
        f.offset = off;
        f.size = t.size;
        const bool str = t.kind == Kind::kString || t.kind == Kind::kSymStr;
        const std::string bits = std::to_string(t.size * 8);
        switch (t.kind) {
        case Kind::kUnsigned:
            f.c_type = "u" + bits;
            f.print = Print::kUnsigned;
            break;
        case Kind::kSigned:
            f.c_type = "s" + bits;
            f.is_signed = true;
            f.print = Print::kSigned;
            break;
        case Kind::kHex:
            f.c_type = "u" + bits;
            f.print = Print::kHex;
            break;
        case Kind::kChar:
            f.c_type = "u8";
            f.print = Print::kChar;
            break;
        case Kind::kSymbol:
            f.c_type = "u64";
            f.print = Print::kSymbol;
            break;
        case Kind::kString:
        case Kind::kSymStr:
            f.c_type = "__data_loc char[]";
            f.is_signed = true;
            f.print = Print::kString;
            break;
        case Kind::kStack:
            f.c_type = "__data_loc " + (t.name.empty() ? std::string("unsigned long[]") : t.name);
            f.print = Print::kStack;
            break;
        }
        if (t.array_len > 0) {
            f.array_len = t.array_len;
            if (str) { // piece by piece: GCC 12 warns falsely (-Wrestrict) about `"[" + string` at -O3
                f.c_type += '[';
                f.c_type += std::to_string(t.array_len);
                f.c_type += ']';
            }
        }
        off += t.size * (t.array_len > 0 ? t.array_len : 1);
        if (fields != nullptr) fields->push_back(std::move(f));
    }
    return off;
}

uint32_t measure_fetch(const FetchProgram *progs, uint32_t nprogs, const HitContext &ctx, const SymbolTable *symbols,
                       StringStash *stash) noexcept {
    uint32_t total = 0;
    for (uint32_t a = 0; a < nprogs; ++a) {
        const FetchProgram &p = progs[a];
        if (p.store != Store::kString && p.store != Store::kStringArray && p.store != Store::kSymStr &&
            p.store != Store::kStack)
            continue;
        uint64_t v = 0;
        if (!run_ops(p, ctx, &v)) continue;
        switch (p.store) {
        case Store::kString:
            total += measure_string(p.deref_string ? v + static_cast<uint64_t>(p.mem_offset) : v, stash,
                                    p.max_string != 0 ? p.max_string : kMaxStringLen);
            break;
        case Store::kStringArray:
            for (uint32_t i = 0; i < p.type.array_len; ++i) {
                uint64_t ptr = 0;
                if (load64(v + static_cast<uint64_t>(p.mem_offset) + 8ull * i, &ptr))
                    total += measure_string(ptr, stash);
            }
            break;
        case Store::kSymStr:
            if (symbols != nullptr) total += symbols->format(v, nullptr, kMaxStringLen);
            break;
        case Store::kStack:
            total += stack_bytes(v);
            break;
        default:
            break;
        }
    }
    return total;
}

uint32_t run_fetch(const FetchProgram *progs, uint32_t nprogs, const HitContext &ctx, const SymbolTable *symbols,
                   uint8_t *rec, uint32_t fixed_size, uint32_t cap, uint32_t *faults,
                   const StringStash *stash) noexcept {
    uint32_t dyn = fixed_size;
    uint32_t nfault = 0;
    for (uint32_t a = 0; a < nprogs; ++a) {
        const FetchProgram &p = progs[a];
        const ArgType &t = p.type;
        uint8_t *dst = rec + p.offset;
        if (p.direct_reg >= 0) {
            put_value(dst, reg_at(ctx.regs, p.direct_reg), t.size);
            continue;
        }
        const uint32_t count = t.array_len > 0 ? t.array_len : 1;
        uint64_t v = 0;
        bool fault = !run_ops(p, ctx, &v);
        switch (p.store) {
        case Store::kRaw:
            put_value(dst, fault ? 0 : (t.bitfield ? bitfield(v, t) : v), t.size);
            break;
        case Store::kMem:
            for (uint32_t i = 0; i < count; ++i) {
                uint64_t x = 0;
                if (!fault) {
                    uint8_t buf[8];
                    const uint64_t at = v + static_cast<uint64_t>(p.mem_offset) + uint64_t(i) * t.size;
                    if (ukp_safe_copy(buf, reinterpret_cast<const void *>(at), t.size) == 0)
                        x = get(buf, t.size);
                    else
                        fault = true;
                }
                if (fault) x = 0;
                put_value(dst + i * t.size, t.bitfield ? bitfield(x, t) : x, t.size);
            }
            break;
        case Store::kString: {
            const uint64_t at = p.deref_string ? v + static_cast<uint64_t>(p.mem_offset) : v;
            if (fault)
                put_value(dst, dyn & 0xffff, 4);
            else
                dyn +=
                    put_string(rec, dst, dyn, cap, at, &fault, stash, p.max_string != 0 ? p.max_string : kMaxStringLen);
            break;
        }
        case Store::kStringArray:
            for (uint32_t i = 0; i < count; ++i) {
                uint64_t ptr = 0;
                bool f = fault;
                if (!f && !load64(v + static_cast<uint64_t>(p.mem_offset) + 8ull * i, &ptr)) f = true;
                if (f)
                    put_value(dst + 4 * i, dyn & 0xffff, 4);
                else
                    dyn += put_string(rec, dst + 4 * i, dyn, cap, ptr, &f, stash);
                if (f) fault = true;
            }
            break;
        case Store::kSymStr: {
            if (fault || symbols == nullptr || cap <= dyn) {
                put_value(dst, dyn & 0xffff, 4);
                break;
            }
            uint32_t room = cap - dyn;
            if (room > kMaxStringLen) room = kMaxStringLen;
            const uint32_t n = symbols->format(v, reinterpret_cast<char *>(rec + dyn), room);
            put_value(dst, (uint64_t(n) << 16) | dyn, 4);
            dyn += n;
            break;
        }
        case Store::kStack: { // measured by measure_fetch: the words fit
            const uint32_t n = fault ? 0 : stack_bytes(v);
            if (n == 0 || n > cap - std::min(cap, dyn) ||
                ukp_safe_copy(rec + dyn, reinterpret_cast<const void *>(v), n) != 0) {
                put_value(dst, dyn & 0xffff, 4);
                fault = true;
                break;
            }
            put_value(dst, (uint64_t(n) << 16) | dyn, 4);
            dyn += n;
            break;
        }
        }
        if (fault) ++nfault;
    }
    *faults = nfault;
    return dyn;
}

} // namespace ukp::trace
