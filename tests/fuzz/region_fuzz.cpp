// analyze_function() + check_region() on arbitrary bytes (src/arch/x86_64/region.hpp).
//
// Input: 4 option bytes, then the function's code. The bytes after the code (as many as
// option byte 2 says, taken from the end) are "rodata" right behind the function, read
// through the ReadFn, so that jump tables outside the function can resolve.
// Besides "no crash, no read outside the buffer" (ASan), checks what the header promises:
// instructions ascending, contiguous, whole and inside the function; branch targets
// sorted, unique, inside; a region found ok is made of whole decoded instructions that
// no branch or extra entry lands in; with object references (option bit 8), also none of
// those, padding only after a final ret/jmp, and trusted indirect jumps only as whole
// pointers whose walked paths nothing outside joins.
#include "arch/x86_64/insn.hpp"
#include "arch/x86_64/region.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

using namespace ukp::arch;

#define CHECK(cond)                                                                                                    \
    do {                                                                                                               \
        if (!(cond)) {                                                                                                 \
            std::fprintf(stderr, "region_fuzz: %s:%d: %s\n", __FILE__, __LINE__, #cond);                               \
            std::abort();                                                                                              \
        }                                                                                                              \
    } while (0)

constexpr uint64_t kStart = 0x5555'0000'1000;
constexpr size_t kMaxChecks = 96; // check_region calls per input, to keep execs fast

// The length the sweep should find at off: decode with the tail zero-padded, as documented
// for instructions cut by the end. 0 if the bytes do not decode.
size_t decoded_len(const std::vector<uint8_t> &code, size_t off) {
    uint8_t tmp[15] = {};
    const size_t n = std::min(sizeof(tmp), code.size() - off);
    std::memcpy(tmp, code.data() + off, n);
    Insn in;
    if (decode(kStart + off, tmp, sizeof(tmp), &in) != 0) return 0;
    return in.len;
}

void check_map(const FunctionMap &f, const std::vector<uint8_t> &code) {
    CHECK(f.start == kStart && f.size == code.size() && f.code == code);
    CHECK(std::is_sorted(f.insns.begin(), f.insns.end()));
    CHECK(std::adjacent_find(f.insns.begin(), f.insns.end()) == f.insns.end());
    uint64_t expect = kStart;
    for (uint64_t a : f.insns) {
        CHECK(a == expect); // a linear sweep: each instruction starts where the last ended
        const size_t len = decoded_len(code, a - kStart);
        CHECK(len != 0 && a - kStart + len <= code.size());
        expect = a + len;
    }
    if (f.reliable()) {
        CHECK(expect == kStart + code.size());
    } else {
        CHECK(f.decode_fail_addr == expect); // where the sweep stopped
        if (f.ran_past_end) {
            CHECK(expect - kStart + decoded_len(code, expect - kStart) > code.size());
        } else {
            CHECK(decoded_len(code, expect - kStart) == 0);
        }
    }
    CHECK(std::is_sorted(f.branch_targets.begin(), f.branch_targets.end()));
    CHECK(std::adjacent_find(f.branch_targets.begin(), f.branch_targets.end()) == f.branch_targets.end());
    for (uint64_t t : f.branch_targets) CHECK(t >= kStart && t - kStart < code.size());
    bool unresolved = false;
    for (const IndirectJump &ij : f.indirect_jumps) {
        CHECK(f.is_boundary(ij.addr));
        if (ij.resolved) {
            CHECK(ij.kind == IndirectJump::Kind::kTableRel32 || ij.kind == IndirectJump::Kind::kTableAbs64);
            CHECK(ij.entries != 0 && ij.targets.size() == ij.entries);
            for (uint64_t t : ij.targets) {
                if (t >= kStart && t - kStart < code.size()) {
                    CHECK(std::binary_search(f.branch_targets.begin(), f.branch_targets.end(), t));
                }
            }
        } else {
            unresolved = true;
            CHECK(ij.targets.empty()); // targets only come with a resolved table
        }
    }
    CHECK(unresolved == f.has_unresolved_indirect_jump());
}

void check_verdict(const FunctionMap &f, uint64_t addr, const std::vector<uint64_t> &extra, size_t jump_len,
                   const OptimizeCheck &c, const ObjectRefs *refs = nullptr) {
    CHECK(c.reason < Reason::kCount_);
    CHECK(reason_name(c.reason) != nullptr);
    if (!c.ok) {
        CHECK(c.reason != Reason::kOk);
        CHECK(c.reasons == 0 || (c.reasons & (1u << static_cast<unsigned>(c.reason))) != 0);
        if (!f.is_boundary(addr)) CHECK(c.insns.empty() || !f.reliable());
        return;
    }
    CHECK(c.reason == Reason::kOk && c.reasons == 0);
    CHECK(f.reliable() && f.is_boundary(addr));
    CHECK(c.dcr_len >= jump_len);
    CHECK(refs != nullptr || (!c.into_padding && !c.trusted_jumps));
    const uint64_t fn_end = f.start + f.size;
    if (!c.into_padding) CHECK(f.size >= jump_len && addr + c.dcr_len <= fn_end);
    CHECK(!c.insns.empty() && c.insns.front() == addr);
    // Whole instructions of the sweep, back to back, covering exactly dcr_len bytes; past
    // the function only nops, after a final ret/jmp, before the next function start.
    uint64_t at = addr;
    Flow last_in_function = Flow::kSequential;
    for (uint64_t a : c.insns) {
        CHECK(a == at);
        Insn in;
        if (a < fn_end) {
            CHECK(f.is_boundary(a));
            CHECK(decode(a, f.code.data() + (a - f.start), f.size - (a - f.start), &in) == 0);
            last_in_function = in.flow;
        } else {
            CHECK(c.into_padding && a - fn_end < f.tail.size());
            CHECK(decode(a, f.tail.data() + (a - fn_end), f.tail.size() - (a - fn_end), &in) == 0);
            CHECK(in.zi.mnemonic == ZYDIS_MNEMONIC_NOP && a + in.len <= refs->next_start(f.start));
            CHECK(last_in_function == Flow::kRet || last_in_function == Flow::kJump ||
                  last_in_function == Flow::kIndirectJump);
        }
        CHECK(in.flow != Flow::kUnsupported);
        at += in.len;
    }
    CHECK(at == addr + c.dcr_len);
    CHECK(at - c.insns.back() <= 15 && c.insns.back() - addr < jump_len);
    for (uint64_t t : f.branch_targets) CHECK(!(t > addr && t < at));
    for (uint64_t e : extra) CHECK(!(e > addr && e < at));
    if (refs != nullptr) CHECK(!refs->any_in(addr, at));
    if (!c.trusted_jumps) {
        CHECK(!f.has_unresolved_indirect_jump());
    } else {
        CHECK(!refs->value_in(f.start, fn_end));
        for (const IndirectJump &ij : f.indirect_jumps) {
            CHECK(ij.resolved || ij.whole_pointer);
            for (uint64_t w : ij.walked)
                CHECK(w >= f.start && w < fn_end && !refs->reached_from_outside(w, f.start, fn_end));
        }
    }
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 4) return 0;
    const uint8_t opts = data[0];
    const size_t jump_len = (opts & 1) ? 2 : 5;
    const uint64_t extra_off = data[1];
    size_t rodata_len = data[2];
    const uint8_t stride = static_cast<uint8_t>(data[3] | 1);
    data += 4;
    size -= 4;
    rodata_len = std::min(rodata_len, size);
    const std::vector<uint8_t> code(data, data + (size - rodata_len));
    const std::vector<uint8_t> rodata(data + (size - rodata_len), data + size);
    const uint64_t rodata_at = kStart + code.size();

    ReadFn read;
    if (opts & 2) {
        read = [&rodata, rodata_at](uint64_t addr, void *out, size_t n) {
            if (addr < rodata_at || addr - rodata_at > rodata.size() || n > rodata.size() - (addr - rodata_at)) {
                return false;
            }
            std::memcpy(out, rodata.data() + (addr - rodata_at), n);
            return true;
        };
    }
    const FunctionMap f = analyze_function(kStart, code.data(), code.size(), read);
    check_map(f, code);

    const std::vector<uint64_t> extra = {kStart + extra_off};
    size_t checks = 0;
    for (uint64_t a : f.insns) {
        if (checks++ == kMaxChecks) break;
        const OptimizeCheck c = check_region(f, a, (opts & 4) ? extra : std::vector<uint64_t>{}, jump_len);
        check_verdict(f, a, (opts & 4) ? extra : std::vector<uint64_t>{}, jump_len, c);
    }
    // With object references made of the option bytes: a value, a branch from outside,
    // the next function start (option byte 3 bytes past the function's end).
    if (opts & 8) {
        ObjectRefs refs;
        refs.values = {kStart + (extra_off ^ 0x5a)};
        refs.branches = {{kStart + extra_off, kStart - 0x100}};
        refs.starts = {kStart, kStart + code.size() + stride};
        for (uint64_t a : f.insns) {
            if (checks++ == 2 * kMaxChecks) break;
            const OptimizeCheck c = check_region(f, a, {}, jump_len, &refs);
            check_verdict(f, a, {}, jump_len, c, &refs);
        }
    }
    // Addresses that are no boundary: inside instructions, before and past the function.
    for (uint64_t a = kStart - 1; a <= kStart + code.size() + 1 && checks++ < 2 * kMaxChecks; a += stride) {
        const OptimizeCheck c = check_region(f, a, extra, jump_len);
        check_verdict(f, a, extra, jump_len, c);
        if (!f.is_boundary(a)) CHECK(!c.ok);
    }
    return 0;
}
