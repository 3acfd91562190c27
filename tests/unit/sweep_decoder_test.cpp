// SweepDecoder::quick(), the decoder of the most frequent legacy-map instructions, against
// Zydis (SweepDecoder::by_zydis) at every combination of legacy prefixes, REX, opcode
// (one byte and 0f xx), ModRM and SIB form: wherever quick() takes the bytes, Zydis
// decodes them as well, to the same length, relative target and flow, lea target and jmp;
// cut one byte short, quick() leaves them. The same at every byte of libc's and
// libstdc++'s code. And what share of libc's instructions it takes.
#include "arch/x86_64/insn.hpp"

#include <gtest/gtest.h>

#include "loaded_code.h"
#include "test_hex.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace {

using ukp::arch::SweepDecoder;
using ukp::arch::SweepInsn;

struct Tally {
    size_t taken = 0, compared = 0, failures = 0;
};

// Compares quick() with Zydis on the bytes; a failure is reported once per opcode form.
void compare(const SweepDecoder &zydis, const uint8_t *bytes, size_t n, Tally *t) {
    constexpr uint64_t kAddr = 0x7f0000401000;
    SweepInsn q;
    ++t->compared;
    if (!SweepDecoder::quick(kAddr, bytes, n, &q)) return;
    ++t->taken;
    SweepInsn z;
    const int rc = zydis.by_zydis(kAddr, bytes, n, &z);
    const bool same = rc == 0 && q.len == z.len && q.relative == z.relative && q.jmp == z.jmp && q.target == z.target &&
                      q.lea_target == z.lea_target && (!q.relative || q.flow == z.flow);
    if (!same && ++t->failures <= 20)
        ADD_FAILURE() << hex(bytes, q.len) << ": quick len " << int(q.len) << " target " << std::hex << q.target
                      << " lea " << q.lea_target << " jmp " << q.jmp << " flow " << int(q.flow) << "; zydis rc "
                      << std::dec << rc << " len " << int(z.len) << " target " << std::hex << z.target << " lea "
                      << z.lea_target << " jmp " << z.jmp << " flow " << int(z.flow);
    // One byte short, the instruction is not all there.
    SweepInsn cut;
    if (q.len > 0 && SweepDecoder::quick(kAddr, bytes, q.len - 1u, &cut) && ++t->failures <= 20)
        ADD_FAILURE() << hex(bytes, q.len) << ": taken with " << q.len - 1 << " bytes";
}

TEST(SweepDecoder, QuickAgreesWithZydisOnEveryFormItTakes) {
    const SweepDecoder zydis;
    const std::vector<std::vector<uint8_t>> prefixes = {
        {},           {0x66},       {0xf2},       {0xf3},       {0x2e},       {0x3e},       {0x26},       {0x36},
        {0x64},       {0x65},       {0xf0},       {0x67},       {0x66, 0x66}, {0x66, 0x2e}, {0x2e, 0x66}, {0x64, 0x66},
        {0xf3, 0x66}, {0x66, 0xf3}, {0xf2, 0xf3}, {0x3e, 0x3e}, {0x65, 0x64}, {0xf0, 0x66}, {0x67, 0x66}, {0xf3, 0x64},
    };
    const int rexes[] = {-1, 0x40, 0x41, 0x42, 0x44, 0x48, 0x49, 0x4a, 0x4c, 0x4f};
    // SIB bytes: base 5 (a disp32 with mod 0) or not, index 4 (none) or not.
    const uint8_t sibs[] = {0x00, 0x05, 0x24, 0x25, 0x65, 0xe5, 0x7c, 0xfd};
    // What follows: displacement and immediate bytes, negative and positive.
    const uint8_t tail[] = {0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11, 0x99, 0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0x01};
    Tally t;
    for (const auto &pre : prefixes) {
        for (int rex : rexes) {
            for (int two = 0; two < 2; ++two) {
                for (int op = 0; op < 256; ++op) {
                    for (int modrm = 0; modrm < 256; ++modrm) {
                        const bool sib = (modrm & 7) == 4 && (modrm >> 6) != 3;
                        for (size_t s = 0; s < (sib ? sizeof sibs : 1); ++s) {
                            uint8_t b[32];
                            size_t n = 0;
                            for (uint8_t p : pre) b[n++] = p;
                            if (rex >= 0) b[n++] = static_cast<uint8_t>(rex);
                            if (two != 0) b[n++] = 0x0f;
                            b[n++] = static_cast<uint8_t>(op);
                            b[n++] = static_cast<uint8_t>(modrm);
                            if (sib) b[n++] = sibs[s];
                            std::memcpy(b + n, tail, sizeof tail);
                            compare(zydis, b, n + sizeof tail, &t);
                        }
                    }
                }
            }
        }
    }
    // endbr64, whose ModRM-like third byte is fixed.
    const uint8_t endbr[] = {0xf3, 0x0f, 0x1e, 0xfa, 0x90};
    compare(zydis, endbr, sizeof endbr, &t);
    std::printf("sweep decoder: quick() took %zu of %zu byte sequences, all as Zydis\n", t.taken, t.compared);
    EXPECT_EQ(t.failures, 0u);
    EXPECT_GT(t.taken, 1000000u) << "the forms quick() knows";
}

// At every byte of libc's and libstdc++'s code, not only where an instruction starts (the
// object-wide sweep decodes at every offset where bytes do not decode in step): where
// quick() takes the bytes, Zydis reads them the same.
TEST(SweepDecoder, QuickAgreesWithZydisAtEveryOffsetOfLibcAndLibstdcxx) {
    Tally t;
    const SweepDecoder zydis;
    const char *const objects[] = {"libc.so.6", "libstdc++.so.6", nullptr};
    for_each_loaded_code(objects, [&](const std::string &name, uint64_t bias, uint64_t lo, uint64_t hi) {
        const auto *bytes = reinterpret_cast<const uint8_t *>(lo);
        for (uint64_t a = lo; a < hi; ++a) {
            SweepInsn q, z;
            ++t.compared;
            if (!SweepDecoder::quick(a, bytes + (a - lo), hi - a, &q)) continue;
            ++t.taken;
            const int rc = zydis.by_zydis(a, bytes + (a - lo), hi - a, &z);
            const bool same = rc == 0 && q.len == z.len && q.relative == z.relative && q.jmp == z.jmp &&
                              q.target == z.target && q.lea_target == z.lea_target && (!q.relative || q.flow == z.flow);
            if (!same && ++t.failures <= 20)
                ADD_FAILURE() << name << " +" << std::hex << (a - bias) << ": "
                              << hex(bytes + (a - lo), std::min<uint64_t>(q.len, hi - a));
        }
        return true;
    });
    std::printf("sweep decoder: quick() took %zu of %zu offsets, all as Zydis\n", t.taken, t.compared);
    EXPECT_EQ(t.failures, 0u);
    EXPECT_GT(t.compared, 2000000u) << "bytes of code looked at";
}

// The share of libc's instructions (a linear sweep of its executable segment) that quick()
// takes: what makes the sweeps fast.
TEST(SweepDecoder, QuickTakesMostOfLibc) {
    const SweepDecoder zydis;
    size_t all = 0, quick = 0;
    const char *const objects[] = {"libc.so.6", nullptr};
    for_each_loaded_code(objects, [&](const std::string &, uint64_t, uint64_t lo, uint64_t hi) {
        const auto *bytes = reinterpret_cast<const uint8_t *>(lo);
        for (uint64_t a = lo; a < hi;) {
            SweepInsn in;
            if (zydis.by_zydis(a, bytes + (a - lo), hi - a, &in) != 0) {
                ++a;
                continue;
            }
            ++all;
            SweepInsn q;
            quick += SweepDecoder::quick(a, bytes + (a - lo), hi - a, &q);
            a += in.len;
        }
        return true;
    });
    const double share = all != 0 ? 100.0 * static_cast<double>(quick) / static_cast<double>(all) : 0;
    std::printf("sweep decoder: quick() takes %.1f%% of libc's instructions\n", share);
    EXPECT_GE(share, 85.0);
}

} // namespace
