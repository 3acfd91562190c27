// Fault-safe copies (safe_access.S): every size path reads and writes what it should, and a
// bad source or destination gives -EFAULT through the SIGSEGV handler's fixup table instead
// of a crash.
#include "arch/x86_64/safe_access.hpp"
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
        // Three pages: readable and writable, read-only, no access.
        void *m = mmap(nullptr, 3 * page_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        ASSERT_NE(m, MAP_FAILED);
        base_ = static_cast<unsigned char *>(m);
        for (size_t i = 0; i < 2 * page_; ++i) base_[i] = static_cast<unsigned char>(i * 7 + 1);
        ASSERT_EQ(mprotect(base_ + page_, page_, PROT_READ), 0);
        ASSERT_EQ(mprotect(base_ + 2 * page_, page_, PROT_NONE), 0);
    }
    void TearDown() override { munmap(base_, 3 * page_); }

    unsigned char *readable() const { return base_; }
    unsigned char *read_only() const { return base_ + page_; }
    unsigned char *no_access() const { return base_ + 2 * page_; }

    size_t page_ = 0;
    unsigned char *base_ = nullptr;
};

TEST_P(SafeAccess, CopiesWhatIsThere) {
    const size_t n = GetParam();
    unsigned char dst[64];
    std::memset(dst, 0xee, sizeof dst);
    ASSERT_EQ(ukp_safe_copy(dst, readable() + 3, n), 0);
    EXPECT_EQ(std::memcmp(dst, readable() + 3, n), 0);
    EXPECT_EQ(dst[n], 0xee) << "wrote past n";
}

TEST_P(SafeAccess, AnUnreadableSourceIsEfault) {
    const size_t n = GetParam();
    unsigned char dst[64];
    EXPECT_EQ(ukp_safe_copy(dst, no_access(), n), -EFAULT);
    // Starting in readable memory and running into the unreadable page.
    EXPECT_EQ(ukp_safe_copy(dst, no_access() - 1, n), n > 1 ? -EFAULT : 0);
}

TEST_P(SafeAccess, AnUnwritableDestinationIsEfaultAndUnchanged) {
    const size_t n = GetParam();
    const unsigned char src[64] = {0x5a};
    unsigned char before[64];
    std::memcpy(before, read_only(), n);
    EXPECT_EQ(ukp_safe_copy(read_only(), src, n), -EFAULT);
    EXPECT_EQ(std::memcmp(before, read_only(), n), 0);
}

// 8 is the two-move path; the others go through REP MOVSB.
INSTANTIATE_TEST_SUITE_P(Sizes, SafeAccess, ::testing::Values(size_t{1}, size_t{4}, size_t{8}, size_t{9}, size_t{48}),
                         [](const auto &info) { return "n" + std::to_string(info.param); });

} // namespace
