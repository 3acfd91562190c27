#include "platform/fork_mark.hpp"

#include <pthread.h>
#include <sys/mman.h>

namespace ukp::platform {

// In .bss, page-aligned and a page long: past the file's bytes, so in the anonymous
// private memory the advice applies to.
constinit ForkMark g_fork_mark{};
static_assert(sizeof(ForkMark) == 4096);

namespace {

bool g_wiped = false;

void mark_child() { g_fork_mark.known.store(1, std::memory_order_relaxed); }

// Before the layers' constructors: no probe exists yet.
__attribute__((constructor(101))) void set_fork_mark() {
    g_wiped = madvise(&g_fork_mark, sizeof g_fork_mark, MADV_WIPEONFORK) == 0;
    g_fork_mark.known.store(1, std::memory_order_relaxed);
    pthread_atfork(nullptr, nullptr, mark_child);
}

} // namespace

bool fork_mark_wiped_in_children() { return g_wiped; }

} // namespace ukp::platform
