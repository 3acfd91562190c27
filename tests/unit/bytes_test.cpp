// The byte helpers written out for the probe-hit path (trace/bytes.hpp, find_nul in
// platform/safe_access.hpp), against the C library's, at every length and offset
// around their word boundaries.
#include "platform/safe_access.hpp"
#include "trace/bytes.hpp"

#include <gtest/gtest.h>

#include <cstring>

namespace {

TEST(Bytes, CopyBytesCopiesExactlyN) {
    unsigned char src[80], dst[80];
    for (size_t i = 0; i < sizeof src; ++i) src[i] = static_cast<unsigned char>(i * 13 + 7);
    for (size_t off = 0; off < 8; ++off) {
        for (size_t n = 0; n <= 64; ++n) {
            std::memset(dst, 0xee, sizeof dst);
            ukp::trace::copy_bytes(dst + off, src + off, n);
            EXPECT_EQ(std::memcmp(dst + off, src + off, n), 0) << "off " << off << " n " << n;
            for (size_t i = 0; i < sizeof dst; ++i) {
                if (i >= off && i < off + n) continue;
                ASSERT_EQ(dst[i], 0xee) << "off " << off << " n " << n << " wrote " << i;
            }
        }
    }
}

TEST(Bytes, FindNulFindsTheFirstZero) {
    // Around the zero, the bytes that fool a word-at-a-time test: 0x01 just above it
    // (the borrow marks it too) and high bytes.
    for (const int above : {0x01, 0x80, 0xff, int{'a'}}) {
        for (size_t len = 0; len < 40; ++len) {
            char buf[48];
            std::memset(buf, 'x', sizeof buf);
            buf[len] = '\0';
            for (size_t i = len + 1; i < sizeof buf; ++i) buf[i] = static_cast<char>(i % 3 == 0 ? 0 : above);
            for (size_t n = 0; n <= sizeof buf; ++n) {
                const uint64_t want = len < n ? len : n;
                ASSERT_EQ(ukp::platform::find_nul(buf, n), want) << "len " << len << " n " << n << " above " << above;
            }
        }
    }
}

} // namespace
