// Fault-safe copies (safe_access.S): every size path reads and writes what it should, and a
// bad source or destination gives -EFAULT through the SIGSEGV handler's fixup table instead
// of a crash.
#include "platform/safe_access.hpp"
#include "core/core.hpp"

#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <sys/mman.h>
#include <unistd.h>

namespace {

class SafeAccess : public ::testing::TestWithParam<size_t> {
protected:
    void SetUp() override {
        ASSERT_EQ(ukp::core::install_signal_handlers(), 0);
        page_ = static_cast<size_t>(sysconf(_SC_PAGESIZE));
        // Four pages: no access, readable and writable, read-only, no access.
        void *m = mmap(nullptr, 4 * page_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        ASSERT_NE(m, MAP_FAILED);
        base_ = static_cast<unsigned char *>(m);
        for (size_t i = page_; i < 3 * page_; ++i) base_[i] = static_cast<unsigned char>(i * 7 + 1);
        ASSERT_EQ(mprotect(base_, page_, PROT_NONE), 0);
        ASSERT_EQ(mprotect(base_ + 2 * page_, page_, PROT_READ), 0);
        ASSERT_EQ(mprotect(base_ + 3 * page_, page_, PROT_NONE), 0);
    }
    void TearDown() override { munmap(base_, 4 * page_); }

    unsigned char *readable() const { return base_ + page_; }
    unsigned char *read_only() const { return base_ + 2 * page_; }
    unsigned char *no_access() const { return base_ + 3 * page_; }

    size_t page_ = 0;
    unsigned char *base_ = nullptr;
};

constexpr size_t kMax = 320;

TEST_P(SafeAccess, CopiesWhatIsThere) {
    const size_t n = GetParam();
    unsigned char dst[kMax + 1];
    std::memset(dst, 0xee, sizeof dst);
    ASSERT_EQ(ukp_safe_copy(dst, readable() + 3, n), 0);
    EXPECT_EQ(std::memcmp(dst, readable() + 3, n), 0);
    EXPECT_EQ(dst[n], 0xee) << "wrote past n";
}

// Nothing outside [src, src + n) is read: n bytes that end where the unreadable page
// begins, or start where the one before the buffer ends, copy without a fault.
TEST_P(SafeAccess, ReadsNothingOutsideTheRange) {
    const size_t n = GetParam();
    unsigned char dst[kMax];
    const unsigned char *last = read_only() + page_ - n;
    ASSERT_EQ(ukp_safe_copy(dst, last, n), 0);
    EXPECT_EQ(std::memcmp(dst, last, n), 0);
    ASSERT_EQ(ukp_safe_copy(dst, readable(), n), 0);
    EXPECT_EQ(std::memcmp(dst, readable(), n), 0);
}

TEST_P(SafeAccess, AnUnreadableSourceIsEfault) {
    const size_t n = GetParam();
    unsigned char dst[kMax];
    EXPECT_EQ(ukp_safe_copy(dst, no_access(), n), -EFAULT);
    // Starting in readable memory and running into the unreadable page: at its last
    // byte, and half-way.
    EXPECT_EQ(ukp_safe_copy(dst, no_access() - 1, n), n > 1 ? -EFAULT : 0);
    if (n > 1) {
        EXPECT_EQ(ukp_safe_copy(dst, no_access() - n / 2, n), -EFAULT);
    }
}

TEST_P(SafeAccess, AnUnwritableDestinationIsEfaultAndUnchanged) {
    const size_t n = GetParam();
    const unsigned char src[kMax] = {0x5a};
    unsigned char before[kMax];
    std::memcpy(before, read_only(), n);
    EXPECT_EQ(ukp_safe_copy(read_only(), src, n), -EFAULT);
    EXPECT_EQ(std::memcmp(before, read_only(), n), 0);
}

// 8 is the two-move path; 9 to 256 the word loop with its overlapping last word; the
// others go through REP MOVSB.
INSTANTIATE_TEST_SUITE_P(Sizes, SafeAccess,
                         ::testing::Values(size_t{1}, size_t{4}, size_t{7}, size_t{8}, size_t{9}, size_t{15},
                                           size_t{16}, size_t{17}, size_t{48}, size_t{63}, size_t{64}, size_t{255},
                                           size_t{256}, size_t{257}, size_t{320}),
                         [](const auto &info) {
                             // Not `"n" + string`: GCC 12 warns falsely (-Wrestrict) about it at -O3.
                             std::string name = "n";
                             name += std::to_string(info.param);
                             return name;
                         });

} // namespace
