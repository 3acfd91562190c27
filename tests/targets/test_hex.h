// Hex byte strings for table-driven tests: "48 8b | 05" -> {0x48, 0x8b, 0x05}, and back
// ({0x48, 0x8b, 0x05} -> "48 8b 05") for messages.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

// Spaces and '|' (an instruction boundary, for the reader) only separate; any other
// character, or an odd number of digits in a byte, fails the calling test.
inline std::vector<uint8_t> unhex(const char *s) {
    std::vector<uint8_t> out;
    unsigned byte = 0;
    int digits = 0;
    for (; *s != '\0'; ++s) {
        const char c = *s;
        int v = -1;
        if (c >= '0' && c <= '9') v = c - '0';
        if (c >= 'a' && c <= 'f') v = c - 'a' + 10;
        if (c >= 'A' && c <= 'F') v = c - 'A' + 10;
        if (v < 0) {
            EXPECT_TRUE(c == ' ' || c == '|') << "bad hex character '" << c << "'";
            EXPECT_EQ(digits, 0) << "odd hex digit count";
            continue;
        }
        byte = byte * 16 + static_cast<unsigned>(v);
        if (++digits == 2) {
            out.push_back(static_cast<uint8_t>(byte));
            byte = 0;
            digits = 0;
        }
    }
    EXPECT_EQ(digits, 0) << "odd hex digit count";
    return out;
}

// The n bytes at p as "48 8b 05".
inline std::string hex(const uint8_t *p, size_t n) {
    std::string s;
    char buf[4];
    for (size_t i = 0; i < n; ++i) {
        std::snprintf(buf, sizeof(buf), i ? " %02x" : "%02x", p[i]);
        s += buf;
    }
    return s;
}
inline std::string hex(const std::vector<uint8_t> &v) { return hex(v.data(), v.size()); }
