// glibc's full blocks leave the agent's signals out.
//
// glibc blocks every signal with a raw system call, past the interposed sigprocmask, in a
// few places (arch/x86_64/full_blocks.hpp): around clone in pthread_create (so a new thread
// runs __ctype_init with every signal blocked), from a thread's last steps to its end
// (getpagesize, madvise, the freeing of cached stacks, which calls free), around
// pthread_kill's getpid. An int3 hit there is fatal: the kernel turns a blocked SIGTRAP
// into its default action. With optimization off (or while a definition waits for its
// jmp) a probe on any of those functions killed every program that starts or ends a thread.
//
// So with the first probe in libc or the loader, the agent finds those blocks in the code
// pthread_create and pthread_kill reach (start_thread included) and changes the set each
// one blocks, as the interposed sigprocmask does: everything but SIGTRAP, SIGSEGV, SIGBUS,
// SIGFPE and SIGILL. Each change is safe for a thread running the code meanwhile:
//
// - an immediate (`movabs $0xfffffffeffffffff, %rax` at a thread's exit): only its low two
//   bytes change, and any mix of their old and new values is a set that blocks all but some
//   of the five;
// - a set in memory (`lea SIGALL(%rip), %rsi`; glibc's all-ones constant is merged with
//   other uses of -1, so it cannot be changed in place): a page of the agent's holds the
//   new set 16 MiB (or a multiple) away from the old, and the lea is led there by one byte,
//   the high byte of its disp32.
//
// The spawn child's block (posix_spawn) is changed too, to no effect: that child resets
// every handler to the default, and a blocked or unblocked SIGTRAP ends it alike (the
// spawn path, spawn_gate.cpp, keeps it from every int3). The changes stay for the life of
// the process (detach leaves them, as it leaves the spawn gate): a thread may be between
// the lea and its system call at any time. ukp_verify counts their bytes as the file's.
#include "core/core.hpp"

#include "arch/x86_64/full_blocks.hpp"
#include "text/text.hpp"

#include <atomic>
#include <cstring>
#include <dlfcn.h>
#include <link.h>
#include <mutex>
#include <sys/mman.h>
#include <unistd.h>

namespace ukp::core {

namespace {

// pthread_create -> create_thread -> start_thread (a function pointer handed to clone):
// the blocks lie in the functions two calls deep at most. Deeper, the walk would take in
// malloc and much else (120 ms at a first probe instead of a few).
constexpr int kDepth = 2;

std::atomic<bool> g_started{false};
std::mutex g_mutex;
std::vector<std::pair<uint64_t, uint8_t>> g_file_bytes; // what the files have where we wrote
std::vector<arch::FullBlock> g_opened;

uint64_t agent_bits() {
    uint64_t bits = 0;
    for (int sig : {SIGTRAP, SIGSEGV, SIGBUS, SIGFPE, SIGILL}) bits |= 1ull << (sig - 1);
    return bits;
}

bool named(const char *path, const char *prefix) {
    if (path == nullptr) return false;
    const char *base = strrchr(path, '/');
    return strncmp(base != nullptr ? base + 1 : path, prefix, strlen(prefix)) == 0;
}

// The start of libc's first executable segment, 0 if libc is not loaded.
uint64_t libc_code() {
    uint64_t found = 0;
    dl_iterate_phdr(
        [](dl_phdr_info *info, size_t, void *data) {
            if (!named(info->dlpi_name, "libc.so")) return 0;
            for (int i = 0; i < info->dlpi_phnum; ++i) {
                if (info->dlpi_phdr[i].p_type == PT_LOAD && (info->dlpi_phdr[i].p_flags & PF_X)) {
                    *static_cast<uint64_t *>(data) = info->dlpi_addr + info->dlpi_phdr[i].p_vaddr;
                    return 1;
                }
            }
            return 0;
        },
        &found);
    return found;
}

// Writes bytes[0, n) at addr where they differ from the code there, one byte at a time,
// remembering the file's. Under the registry mutex and g_mutex.
bool write_bytes(uint64_t addr, const uint8_t *bytes, size_t n) {
    UKP_ASSERT_REGISTRY_HELD();
    uint8_t now[8];
    if (n > sizeof now || read_original_code(addr, now, n) != 0) return false;
    for (size_t i = 0; i < n; ++i) {
        if (now[i] == bytes[i]) continue;
        if (text::write(addr + i, &bytes[i], 1) != 0) return false;
        g_file_bytes.emplace_back(addr + i, now[i]);
    }
    return true;
}

// A page of ours holding `set` at `at`; false if the address is taken.
bool place_set(uint64_t at, uint64_t set) {
    const long page = sysconf(_SC_PAGESIZE);
    const uint64_t lo = at & ~static_cast<uint64_t>(page - 1);
    const size_t len = ((at + sizeof set - lo) + page - 1) / page * page;
    void *p = mmap(reinterpret_cast<void *>(lo), len, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    if (p == MAP_FAILED) return false;
    if (reinterpret_cast<uint64_t>(p) != lo) { // a kernel older than MAP_FIXED_NOREPLACE
        munmap(p, len);
        return false;
    }
    memcpy(reinterpret_cast<void *>(at), &set, sizeof set);
    mprotect(p, len, PROT_READ);
    return true;
}

// Leads every lea of `blocks` (all naming one set) to a copy without the agent's signals.
void open_set_in_memory(const std::vector<arch::FullBlock> &blocks, uint64_t bits) {
    uint64_t set = 0;
    if (ukp_safe_copy(&set, reinterpret_cast<const void *>(blocks.front().set), sizeof set) != 0) return;
    for (const arch::Retarget &t : arch::one_byte_retargets(blocks.front())) {
        // Every lea of the set must reach the same place by its own high byte.
        std::vector<uint8_t> bytes;
        for (const arch::FullBlock &b : blocks) {
            for (const arch::Retarget &o : arch::one_byte_retargets(b))
                if (o.target == t.target) bytes.push_back(o.high_byte);
        }
        if (bytes.size() != blocks.size() || !place_set(t.target, set & ~bits)) continue;
        for (size_t i = 0; i < blocks.size(); ++i)
            if (write_bytes(blocks[i].patch_at + 3, &bytes[i], 1)) g_opened.push_back(blocks[i]);
        return;
    }
}

} // namespace

void open_full_blocks(uint64_t addr) {
    UKP_ASSERT_REGISTRY_NOT_HELD();
    if (g_started.load(std::memory_order_acquire)) return;
    Dl_info info{};
    if (dladdr(reinterpret_cast<void *>(addr), &info) == 0 ||
        !(named(info.dli_fname, "libc.so") || named(info.dli_fname, "ld-linux")))
        return;
    if (g_started.exchange(true)) return;
    const uint64_t libc = libc_code();
    if (libc == 0) return;
    const uint64_t bits = agent_bits();
    const arch::Reach code = reachable_in(libc, functions_named(libc, {"pthread_create", "pthread_kill"}), kDepth);
    std::lock_guard registry(registry_mutex());
    const std::vector<arch::FullBlock> blocks =
        arch::find_full_blocks(code, bits, original_code_reader(), memory_reader());
    std::lock_guard lock(g_mutex);
    std::vector<arch::FullBlock> in_memory;
    for (const arch::FullBlock &b : blocks) {
        if (b.kind == arch::FullBlock::Kind::kImmediate) {
            const uint64_t open = b.set & ~bits;
            uint8_t bytes[8];
            memcpy(bytes, &open, sizeof bytes);
            if (write_bytes(b.patch_at, bytes, sizeof bytes)) g_opened.push_back(b);
        } else {
            in_memory.push_back(b);
        }
    }
    // One new set per set glibc has (one in 2.36).
    while (!in_memory.empty()) {
        std::vector<arch::FullBlock> same, rest;
        for (const arch::FullBlock &b : in_memory) (b.set == in_memory.front().set ? same : rest).push_back(b);
        open_set_in_memory(same, bits);
        in_memory.swap(rest);
    }
    text::sync_cores();
}

void full_block_bytes(std::vector<std::pair<uint64_t, uint8_t>> *out) {
    UKP_ASSERT_REGISTRY_HELD();
    std::lock_guard lock(g_mutex);
    out->insert(out->end(), g_file_bytes.begin(), g_file_bytes.end());
}

std::vector<arch::FullBlock> opened_full_blocks() {
    std::lock_guard lock(g_mutex);
    return g_opened;
}

} // namespace ukp::core
