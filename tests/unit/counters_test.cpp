// kprobe_profile's shared counters (src/trace/counters.hpp): where blocks come from, and
// what a reader holding the memfd sees.
#include <gtest/gtest.h>

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>

#include "trace/counters.hpp"

using namespace ukp::trace;

namespace {

struct Mapped {
    const uint8_t *base = nullptr;
    size_t size = 0;
    explicit Mapped(int fd) {
        struct stat st {};
        if (fd < 0 || fstat(fd, &st) != 0) return;
        void *p = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_SHARED, fd, 0);
        close(fd);
        if (p == MAP_FAILED) return;
        base = static_cast<const uint8_t *>(p);
        size = static_cast<size_t>(st.st_size);
    }
    ~Mapped() {
        if (base != nullptr) munmap(const_cast<uint8_t *>(base), size);
    }
    const CountersHeader *hdr() const { return reinterpret_cast<const CountersHeader *>(base); }
    // The address `p` of this process, as the reader's mapping shows it.
    const uint8_t *at(const void *p) const {
        return base + (static_cast<const uint8_t *>(p) - reinterpret_cast<const uint8_t *>(hdr()->base));
    }
};

bool inside(const Mapped &m, const void *p) {
    const auto a = reinterpret_cast<uint64_t>(p);
    return a >= m.hdr()->base + kCountersFirstBlock && a < m.hdr()->base + m.hdr()->size;
}

} // namespace

// Blocks are aligned, zeroed, in the memfd, and seen by a reader that maps it.
TEST(Counters, BlocksAreSharedWithAReader) {
    auto *a = static_cast<uint64_t *>(counters_alloc(24));
    ASSERT_NE(a, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % 64, 0u);
    EXPECT_EQ(a[0] | a[1] | a[2], 0u);
    const Mapped m(counters_memfd_copy());
    ASSERT_NE(m.base, nullptr);
    EXPECT_EQ(m.hdr()->magic, kCountersMagic);
    EXPECT_EQ(m.hdr()->pid, getpid());
    ASSERT_TRUE(inside(m, a));
    a[1] = 0x1234567;
    EXPECT_EQ(*reinterpret_cast<const uint64_t *>(m.at(a + 1)), 0x1234567u);
    counters_free(a, 24);
}

// Freed blocks are used again, merged with their free neighbours, and zeroed.
TEST(Counters, FreedBlocksAreMergedAndReused) {
    void *b[3];
    for (void *&p : b) {
        p = counters_alloc(128);
        memset(p, 0xab, 128);
    }
    ASSERT_EQ(static_cast<uint8_t *>(b[1]), static_cast<uint8_t *>(b[0]) + 128);
    ASSERT_EQ(static_cast<uint8_t *>(b[2]), static_cast<uint8_t *>(b[1]) + 128);
    counters_free(b[0], 128);
    counters_free(b[2], 128);
    counters_free(b[1], 128); // joins both
    // In the space of the three (with any free block just before them: first fit), not
    // past them, where nothing was handed out yet.
    auto *big = static_cast<uint8_t *>(counters_alloc(384));
    EXPECT_LE(big, b[0]);
    EXPECT_LE(big + 384, static_cast<uint8_t *>(b[2]) + 128);
    for (int i = 0; i < 384; ++i) ASSERT_EQ(big[i], 0) << i;
    counters_free(big, 384);
}

// The table published is where the header says, while the one before stays readable.
TEST(Counters, TheHeaderNamesTheTablePublished) {
    const std::vector<uint8_t> one(40, 1), two(72, 2);
    const uint8_t *p1 = counters_publish_table(one);
    const uint8_t *p2 = counters_publish_table(two);
    ASSERT_NE(p1, nullptr);
    ASSERT_NE(p2, nullptr);
    const Mapped m(counters_memfd_copy());
    ASSERT_NE(m.base, nullptr);
    EXPECT_EQ(m.hdr()->table_seq.load() % 2, 0u);
    EXPECT_EQ(m.hdr()->table_size.load(), two.size());
    EXPECT_EQ(m.base + m.hdr()->table_off.load(), m.at(p2));
    EXPECT_EQ(memcmp(m.at(p2), two.data(), two.size()), 0);
    EXPECT_EQ(memcmp(p1, one.data(), one.size()), 0); // not reused yet
}
