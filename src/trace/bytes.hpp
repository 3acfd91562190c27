// memcpy, memcmp, memset and strnlen, written out for the hit path. That path
// calls nothing in the C library: a probe could sit on the function (a probe on memcpy
// would fire inside every hit), and a call through the PLT ends the scan that proves
// the path lean (arch/x86_64/vector_use.hpp), which spares it saving the vector state.
// The loops stay loops: the agent is built with -fno-tree-loop-distribute-patterns,
// which keeps GCC from turning them back into calls.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ukp::trace {

// n bytes from src to dst, a word at a time.
inline void copy_bytes(void *dst, const void *src, size_t n) noexcept {
    auto *d = static_cast<char *>(dst);
    const auto *s = static_cast<const char *>(src);
    if (n >= 8) {
        // Words, the last one overlapping the one before it (a byte at a time, the tail
        // of a 31-byte string cost more than its words).
        for (size_t i = 0; i + 8 < n; i += 8) __builtin_memcpy(d + i, s + i, 8);
        __builtin_memcpy(d + n - 8, s + n - 8, 8);
        return;
    }
    size_t i = 0;
    if (n & 4) {
        __builtin_memcpy(d, s, 4);
        i = 4;
    }
    if (n & 2) {
        __builtin_memcpy(d + i, s + i, 2);
        i += 2;
    }
    if (n & 1) d[i] = s[i];
}

inline bool same_bytes(const void *a, const void *b, size_t n) noexcept {
    const auto *x = static_cast<const char *>(a), *y = static_cast<const char *>(b);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t u, v;
        __builtin_memcpy(&u, x + i, 8);
        __builtin_memcpy(&v, y + i, 8);
        if (u != v) return false;
    }
    for (; i < n; ++i)
        if (x[i] != y[i]) return false;
    return true;
}

inline void zero_bytes(void *dst, size_t n) noexcept {
    auto *d = static_cast<char *>(dst);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) __builtin_memset(d + i, 0, 8);
    for (; i < n; ++i) d[i] = 0;
}

inline size_t bounded_strlen(const char *s, size_t max) noexcept {
    size_t n = 0;
    while (n < max && s[n] != '\0') ++n;
    return n;
}

// A record's integer field of `size` bytes (1, 2, 4 or 8) widened to 64 bits,
// sign-extended when signed, as the kernel's hist_field_s32() and friends.
inline uint64_t load_widened(const uint8_t *p, uint32_t size, bool is_signed) noexcept {
    switch (size) {
    case 1: {
        uint8_t v;
        __builtin_memcpy(&v, p, 1);
        return is_signed ? uint64_t(int64_t(int8_t(v))) : v;
    }
    case 2: {
        uint16_t v;
        __builtin_memcpy(&v, p, 2);
        return is_signed ? uint64_t(int64_t(int16_t(v))) : v;
    }
    case 4: {
        uint32_t v;
        __builtin_memcpy(&v, p, 4);
        return is_signed ? uint64_t(int64_t(int32_t(v))) : v;
    }
    default: {
        uint64_t v;
        __builtin_memcpy(&v, p, 8);
        return v;
    }
    }
}

} // namespace ukp::trace
