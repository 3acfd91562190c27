// The platform layer's readers: /proc/PID/maps, ELF files, the threads' /proc files; the
// agent's large blocks.
#include "platform/agent_heap.hpp"
#include "platform/elf_file.hpp"
#include "platform/maps.hpp"
#include "platform/proc_tasks.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstring>
#include <sys/syscall.h>
#include <thread>
#include <vector>
#include <cstdlib>
#include <fstream>
#include <malloc.h>
#include <string>
#include <sys/mman.h>
#include <unistd.h>

namespace {

using ukp::platform::ElfFile;
using ukp::platform::Mapping;

// Whether the page of `p` is mapped (msync fails with ENOMEM on a hole).
bool page_mapped(const void *p) {
    auto *page = reinterpret_cast<void *>(reinterpret_cast<uintptr_t>(p) & ~uintptr_t{4095});
    return msync(page, 4096, MS_ASYNC) == 0;
}

TEST(AgentHeap, SmallBlocksAreMallocsAndLargeOnesMappingsOfTheAgent) {
    if (!ukp::platform::agent_mappings_on()) GTEST_SKIP() << "the process's malloc is not glibc's";
    void *small = ukp::platform::agent_alloc(ukp::platform::kOwnMapFrom - 1);
    ASSERT_NE(small, nullptr);
    EXPECT_FALSE(ukp::platform::is_agent_mapping(small));
    void *aligned = ukp::platform::agent_alloc(100, 64);
    ASSERT_NE(aligned, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(aligned) % 64, 0u);
    EXPECT_FALSE(ukp::platform::is_agent_mapping(aligned));

    const size_t size = 3 * 1024 * 1024 + 5;
    auto *large = static_cast<unsigned char *>(ukp::platform::agent_alloc(size, 64));
    ASSERT_NE(large, nullptr);
    EXPECT_TRUE(ukp::platform::is_agent_mapping(large));
    EXPECT_EQ(reinterpret_cast<uintptr_t>(large) % 64, 0u);
    std::memset(large, 0xa5, size); // every byte is the caller's
    EXPECT_EQ(large[size - 1], 0xa5);
    EXPECT_TRUE(page_mapped(large + size - 1));
    ukp::platform::agent_free(large); // kept for the agent's next large block
    void *reused = ukp::platform::agent_alloc(size - 1000);
    EXPECT_EQ(reused, large);
    ukp::platform::agent_free(reused);
    ukp::platform::release_spares(); // unmapped, never given to the C library
    EXPECT_FALSE(page_mapped(large));
    EXPECT_FALSE(page_mapped(large + size - 1));
    void *huge = ukp::platform::agent_alloc(5 * 1024 * 1024); // too large to keep
    ASSERT_NE(huge, nullptr);
    ukp::platform::agent_free(huge);
    EXPECT_FALSE(page_mapped(huge));

    // A block of malloc's, of any size, goes back to free().
    void *theirs = std::malloc(2 * 1024 * 1024);
    ASSERT_NE(theirs, nullptr);
    EXPECT_FALSE(ukp::platform::is_agent_mapping(theirs));
    ukp::platform::agent_free(theirs);
    ukp::platform::agent_free(small);
    ukp::platform::agent_free(aligned);
    ukp::platform::agent_free(nullptr);
}

// Whatever the process's malloc (glibc's, or a sanitizer's here), a block of any size and
// alignment goes back where it came from, and nothing outside it is read. (Many at once:
// some fall at the offset in their page where the agent's own mappings put theirs.)
TEST(AgentHeap, EveryBlockGoesBackUnderAnyMalloc) {
    for (size_t size : {size_t{1}, size_t{100}, size_t{4000}, ukp::platform::kOwnMapFrom, size_t{3} << 20})
        for (size_t align : {size_t{16}, size_t{64}}) {
            SCOPED_TRACE(testing::Message() << size << " bytes aligned to " << align);
            std::vector<unsigned char *> blocks;
            for (int i = 0; i < (size < 65536 ? 300 : 2); ++i) {
                auto *block = static_cast<unsigned char *>(ukp::platform::agent_alloc(size, align));
                ASSERT_NE(block, nullptr);
                EXPECT_EQ(reinterpret_cast<uintptr_t>(block) % align, 0u);
                std::memset(block, 0x5a, size);
                EXPECT_EQ(ukp::platform::is_agent_mapping(block),
                          ukp::platform::agent_mappings_on() && size >= ukp::platform::kOwnMapFrom);
                blocks.push_back(block);
            }
            for (unsigned char *block : blocks) ukp::platform::agent_free(block);
        }
    ukp::platform::release_spares();
}

#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
// Code of libstdc++ may free what the agent's inline code allocated: the C library takes
// a mapping of the agent's as one of its mapped chunks. (A sanitizer's free() knows only
// its own blocks.)
TEST(AgentHeap, TheCLibraryTakesAMappingOfTheAgentAsOneOfItsOwn) {
    ASSERT_TRUE(ukp::platform::agent_mappings_on()); // glibc's malloc, no sanitizer
    const size_t size = 1024 * 1024;
    auto *large = static_cast<unsigned char *>(ukp::platform::agent_alloc(size));
    ASSERT_NE(large, nullptr);
    EXPECT_GE(malloc_usable_size(large), size);
    EXPECT_LT(malloc_usable_size(large), 2 * size + 4096); // a power of two: agent_heap.cpp
    std::memset(large, 1, size);
    auto *grown = static_cast<unsigned char *>(std::realloc(large, 2 * size));
    ASSERT_NE(grown, nullptr);
    EXPECT_EQ(grown[size - 1], 1);
    EXPECT_GE(malloc_usable_size(grown), 2 * size);
    std::free(grown);
    EXPECT_FALSE(page_mapped(grown));

    ukp::platform::release_spares();
    void *again = ukp::platform::agent_alloc(size);
    ASSERT_NE(again, nullptr);
    std::free(again);
    EXPECT_FALSE(page_mapped(again));
}
#endif

TEST(Maps, ParsesEveryKindOfLine) {
    Mapping m;
    ASSERT_TRUE(ukp::platform::parse_mapping(
        "7f2a1c000000-7f2a1c028000 r-xp 00028000 fd:01 1049123                    /usr/lib/x86_64-linux-gnu/libc.so.6",
        &m));
    EXPECT_EQ(m.start, 0x7f2a1c000000u);
    EXPECT_EQ(m.end, 0x7f2a1c028000u);
    EXPECT_EQ(m.offset, 0x28000u);
    EXPECT_EQ(m.inode, 1049123u);
    EXPECT_TRUE(m.readable() && m.executable() && !m.writable());
    EXPECT_EQ(m.path, "/usr/lib/x86_64-linux-gnu/libc.so.6");
    EXPECT_TRUE(m.in_file());

    ASSERT_TRUE(ukp::platform::parse_mapping("7ffd1000-7ffd3000 rw-p 00000000 00:00 0 ", &m));
    EXPECT_EQ(m.path, "") << "anonymous memory";
    EXPECT_EQ(m.inode, 0u);
    EXPECT_FALSE(m.in_file());

    ASSERT_TRUE(ukp::platform::parse_mapping("7ffd5000-7ffd7000 r-xp 00000000 00:00 0      [vdso]", &m));
    EXPECT_EQ(m.path, "[vdso]");

    ASSERT_TRUE(
        ukp::platform::parse_mapping("1000-2000 rw-s 00000000 00:01 4242   /memfd:ukprobes-trace (deleted)", &m));
    EXPECT_EQ(m.path, "/memfd:ukprobes-trace (deleted)");
    EXPECT_EQ(m.inode, 4242u);

    ASSERT_TRUE(ukp::platform::parse_mapping("1000-2000 r--p 00000000 08:02 7   /tmp/a name with spaces", &m));
    EXPECT_EQ(m.path, "/tmp/a name with spaces");

    EXPECT_FALSE(ukp::platform::parse_mapping("", &m));
    EXPECT_FALSE(ukp::platform::parse_mapping("not a maps line", &m));
    EXPECT_FALSE(ukp::platform::parse_mapping("1000-2000 r-xp", &m)) << "cut short";
    EXPECT_FALSE(ukp::platform::parse_mapping("1000-2000 r-xp 0 08:02", &m)) << "no inode";
}

TEST(Maps, FindsThisFunctionInThisProgram) {
    char exe[PATH_MAX];
    ASSERT_NE(realpath("/proc/self/exe", exe), nullptr);
    const auto here = reinterpret_cast<uint64_t>(&ukp::platform::visit_mappings);
    std::string found;
    bool executable = false;
    uint64_t last_end = 0;
    bool ordered = true;
    ASSERT_TRUE(ukp::platform::for_each_mapping(0, [&](const Mapping &m) {
        ordered = ordered && m.start >= last_end && m.end > m.start;
        last_end = m.end;
        if (here >= m.start && here < m.end) {
            found = std::string(m.path);
            executable = m.executable();
        }
        return true;
    }));
    EXPECT_TRUE(ordered);
    EXPECT_EQ(found, exe);
    EXPECT_TRUE(executable);
}

TEST(Maps, StopsWhenTheVisitorSaysSoAndTellsAMissingProcess) {
    int seen = 0;
    ASSERT_TRUE(ukp::platform::for_each_mapping(getpid(), [&](const Mapping &) { return ++seen < 2; }));
    EXPECT_EQ(seen, 2);
    const auto all = ukp::platform::read_mappings(getpid());
    EXPECT_GT(all.size(), 5u);
    EXPECT_FALSE(ukp::platform::for_each_mapping(INT_MAX, [](const Mapping &) { return true; }));
    EXPECT_TRUE(ukp::platform::read_mappings(INT_MAX).empty());
}

TEST(ElfFile, OpensThisProgramAndSaysWhyOthersFail) {
    ElfFile self;
    std::string why;
    ASSERT_TRUE(self.open("/proc/self/exe", &why)) << why;
    EXPECT_TRUE(self.is_64());
    EXPECT_TRUE(self.has_interpreter()) << "a dynamically linked test program";
    size_t size = 0;
    EXPECT_NE(self.bytes(&size), nullptr);
    EXPECT_GT(size, 4096u);
    EXPECT_NE(self.first_load_address(), UINT64_MAX);
    int sections = 0;
    self.for_each_section([&](Elf_Scn *, const GElf_Shdr &) { ++sections; });
    EXPECT_GT(sections, 10);

    ElfFile missing;
    EXPECT_FALSE(missing.open("/nonexistent/file", &why));
    EXPECT_EQ(why, "No such file or directory");

    const std::string text = testing::TempDir() + "/platform_test_text";
    std::ofstream(text) << "not an ELF file at all\n";
    ElfFile not_elf;
    EXPECT_FALSE(not_elf.open(text, &why));
    EXPECT_EQ(why, "not an ELF file");
    unlink(text.c_str());
}

TEST(ProcTasks, ListsEveryThreadAndStopsWhenAsked) {
    std::atomic<long> other{0};
    std::atomic<bool> done{false};
    std::thread t([&] {
        other = syscall(SYS_gettid);
        while (!done) std::this_thread::yield();
    });
    while (other == 0) std::this_thread::yield();
    std::vector<int> tids;
    ASSERT_TRUE(ukp::platform::for_each_thread([&](int tid) {
        tids.push_back(tid);
        return true;
    }));
    EXPECT_NE(std::find(tids.begin(), tids.end(), static_cast<int>(syscall(SYS_gettid))), tids.end());
    EXPECT_NE(std::find(tids.begin(), tids.end(), static_cast<int>(other)), tids.end());
    int seen = 0;
    ukp::platform::for_each_thread([&](int) { return ++seen < 1; });
    EXPECT_EQ(seen, 1);
    done = true;
    t.join();
}

TEST(ProcTasks, ReadsAThreadsFilesAndParsesThem) {
    char text[4096];
    const int self = static_cast<int>(syscall(SYS_gettid));
    ASSERT_GT(ukp::platform::read_task_file(self, "status", text, sizeof text), 0);
    const char *pid = ukp::platform::find_text(text, "\nPid:\t");
    ASSERT_NE(pid, nullptr);
    pid += 6;
    EXPECT_EQ(ukp::platform::parse_decimal(&pid), self);
    // A short buffer: cut, NUL-terminated.
    char small[8];
    EXPECT_EQ(ukp::platform::read_task_file(self, "status", small, sizeof small), 7);
    EXPECT_EQ(std::strlen(small), 7u);
    EXPECT_LT(ukp::platform::read_task_file(self, "no-such-file", text, sizeof text), 0);
    EXPECT_LT(ukp::platform::read_task_file(999999999, "status", text, sizeof text), 0);
    const char *p = "-42 0x7fFf12 x";
    EXPECT_EQ(ukp::platform::parse_decimal(&p), -42);
    ++p;
    EXPECT_EQ(ukp::platform::parse_hex(&p), 0x7fff12u);
    EXPECT_STREQ(p, " x");
    EXPECT_TRUE(ukp::platform::starts_with("running", "run"));
    EXPECT_FALSE(ukp::platform::starts_with("ru", "run"));
    EXPECT_EQ(ukp::platform::find_text("abc", "d"), nullptr);
}

} // namespace
