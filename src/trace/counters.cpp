#include "trace/counters.hpp"

#include "platform/raw_syscall.hpp"
#include "platform/held_fd.hpp"
#include "platform/high_fd.hpp"
#include "trace/bytes.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#endif

#include <cerrno>
#include <iterator>
#include <map>
#include <mutex>
#include <new>

namespace ukp::trace {

namespace {

using platform::raw_syscall;

// Address space only: pages are backed as ranges are first written (1 KiB and a line per
// event, a line per probe), and a child of fork() copies what was used.
constexpr uint64_t kArenaSize = 64ull << 20;
constexpr size_t kAlign = 64;

struct Table {
    uint8_t *p = nullptr;
    size_t size = 0;
};

std::mutex g_mu;
uint8_t *g_base = nullptr;                               // the arena; null until first use, or when none could be made
platform::HeldFd g_fd;                                   // its memfd
bool g_tried = false;                                    // under g_mu
uint64_t g_used = kCountersFirstBlock;                   // under g_mu: bytes handed out from the start
std::map<uint64_t, uint64_t> &free_blocks() {            // under g_mu: offset -> bytes, merged
    static auto *m = new std::map<uint64_t, uint64_t>(); // never destroyed: counted hits may outlive statics
    return *m;
}
Table g_table, g_table_before; // under g_mu

CountersHeader *hdr() { return reinterpret_cast<CountersHeader *>(g_base); }

size_t round_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// A memfd sealed at its size: a reader holding it cannot shrink it under the writers,
// whose stores into a page past the end would raise SIGBUS in the traced program.
// Returns the descriptor, or a negative errno.
long make_memfd() {
    const long fd =
        raw_syscall(SYS_memfd_create, reinterpret_cast<long>("ukprobes-counters"), MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) return fd;
    long r = raw_syscall(SYS_ftruncate, fd, static_cast<long>(kArenaSize));
    if (r == 0) r = raw_syscall(SYS_fcntl, fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW);
    if (r != 0) {
        raw_syscall(SYS_close, fd);
        return r;
    }
    return fd;
}

long map_shared(long fd) {
    return raw_syscall(SYS_mmap, 0, static_cast<long>(kArenaSize), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE,
                       fd, 0);
}

bool mapped(long r) { return r >= 0 || r < -4095; } // mmap's address, or -errno

void init_locked() {
    if (g_tried) return;
    g_tried = true;
    const long fd = make_memfd();
    if (fd < 0) return;
    const long p = map_shared(fd);
    if (!mapped(p)) {
        raw_syscall(SYS_close, fd);
        return;
    }
    g_fd.set(platform::move_fd_high(static_cast<int>(fd)));
    g_base = reinterpret_cast<uint8_t *>(p);
    CountersHeader *h = hdr(); // the memfd starts zeroed
    h->magic = kCountersMagic;
    h->version = kCountersVersion;
    h->pid = static_cast<int32_t>(raw_syscall(SYS_getpid));
    h->base = reinterpret_cast<uint64_t>(g_base);
    h->size = kArenaSize;
    pthread_atfork(nullptr, nullptr, counters_after_fork_child);
}

bool in_arena(const void *p) {
    const auto *b = static_cast<const uint8_t *>(p);
    return g_base != nullptr && b >= g_base && b < g_base + kArenaSize;
}

// `size` (rounded) bytes of the arena, zeroed, or null. Under g_mu.
uint8_t *arena_alloc_locked(size_t size) {
    init_locked();
    if (g_base == nullptr) return nullptr;
    auto &blocks = free_blocks();
    for (auto it = blocks.begin(); it != blocks.end(); ++it) {
        if (it->second < size) continue;
        const uint64_t off = it->first, left = it->second - size;
        blocks.erase(it);
        if (left != 0) blocks.emplace(off + size, left);
        zero_bytes(g_base + off, size);
        return g_base + off;
    }
    if (g_used + size > kArenaSize) return nullptr;
    uint8_t *p = g_base + g_used; // never handed out: still zero
    g_used += size;
#if defined(__SANITIZE_ADDRESS__)
    // The hooks kept here point at the heap (a kretprobe's instances): LeakSanitizer
    // scans what is used of the arena as it scans globals, a MiB at a time.
    static uint64_t registered = 0;
    for (constexpr uint64_t kChunk = 1u << 20; registered < g_used; registered += kChunk)
        __lsan_register_root_region(g_base + registered, kChunk);
#endif
    return p;
}

// Under g_mu. Merged with the free ranges on either side.
void arena_free_locked(uint8_t *p, size_t size) {
    auto &blocks = free_blocks();
    uint64_t off = static_cast<uint64_t>(p - g_base), len = size;
    auto next = blocks.lower_bound(off);
    if (next != blocks.end() && off + len == next->first) {
        len += next->second;
        next = blocks.erase(next);
    }
    if (next != blocks.begin()) {
        auto prev = std::prev(next);
        if (prev->first + prev->second == off) {
            off = prev->first;
            len += prev->second;
            blocks.erase(prev);
        }
    }
    blocks.emplace(off, len);
}

// `size` (rounded) bytes, zeroed: the arena's, else the heap's. Under g_mu.
uint8_t *alloc_locked(size_t size) {
    size = round_up(size);
    if (uint8_t *p = arena_alloc_locked(size)) return p;
    auto *p = static_cast<uint8_t *>(::operator new (size, std::align_val_t{kAlign}));
    zero_bytes(p, size);
    return p;
}

// What alloc_locked gave. Under g_mu.
void free_locked(void *p, size_t size) {
    if (p == nullptr) return;
    if (in_arena(p))
        arena_free_locked(static_cast<uint8_t *>(p), round_up(size));
    else
        ::operator delete (p, std::align_val_t{kAlign});
}

} // namespace

void *counters_alloc(size_t size) {
    std::lock_guard lock(g_mu);
    return alloc_locked(size);
}

void counters_free(void *p, size_t size) noexcept {
    std::lock_guard lock(g_mu);
    free_locked(p, size);
}

const uint8_t *counters_publish_table(const std::vector<uint8_t> &table) {
    std::lock_guard lock(g_mu);
    const Table t{alloc_locked(table.size()), table.size()};
    copy_bytes(t.p, table.data(), table.size());
    if (g_base != nullptr) {
        // A table on the heap (no room left) is published as none.
        const bool shared = in_arena(t.p);
        CountersHeader *h = hdr();
        h->table_seq.fetch_add(1, std::memory_order_acq_rel); // odd: changing
        h->table_off.store(shared ? static_cast<uint64_t>(t.p - g_base) : 0, std::memory_order_relaxed);
        h->table_size.store(shared ? t.size : 0, std::memory_order_relaxed);
        h->table_seq.fetch_add(1, std::memory_order_release);
    }
    // A reader (and ring.cpp's g_profile, until it is given this one) may still read the
    // table before: the one before it goes.
    free_locked(g_table_before.p, g_table_before.size);
    g_table_before = g_table;
    g_table = t;
    return t.p;
}

int counters_memfd_copy() {
    std::lock_guard lock(g_mu);
    return g_fd.copy();
}

int counters_adopt(pid_t from) {
    std::lock_guard lock(g_mu);
    return g_fd.in_program_table() ? g_fd.adopt(from) : 0;
}

void counters_close_adopted() {
    std::lock_guard lock(g_mu);
    g_fd.close_program_copy();
}

void counters_release_fd() {
    std::lock_guard lock(g_mu);
    g_fd.release();
}

void counters_after_fork_child() noexcept {
    // The parent's other threads do not exist here: a lock one of them held is free.
    new (&g_mu) std::mutex;
    if (g_base == nullptr) return;
    const auto pid = static_cast<int32_t>(raw_syscall(SYS_getpid));
    CountersHeader *h = hdr();
    if (h->pid == pid) return; // done already (both fork handlers call this)
    // A copy of what is used, mapped over the parent's memfd. Made straight: a probe hit
    // meanwhile counts in the parent's until the mremap.
    const size_t used = static_cast<size_t>(g_used);
    const long fd = make_memfd();
    long tmp = fd >= 0 ? map_shared(fd) : -ENOMEM;
    if (!mapped(tmp)) {
        if (fd >= 0) raw_syscall(SYS_close, fd);
        // No memfd: counted in private memory, as before there were shared counters (the
        // reader then finds none in this process). Never the parent's.
        tmp = raw_syscall(SYS_mmap, 0, static_cast<long>(kArenaSize), PROT_READ | PROT_WRITE,
                          MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (!mapped(tmp)) return; // it then counts in its parent's
    }
    copy_bytes(reinterpret_cast<void *>(tmp), g_base, used);
    raw_syscall(SYS_mremap, tmp, static_cast<long>(kArenaSize), static_cast<long>(kArenaSize),
                MREMAP_MAYMOVE | MREMAP_FIXED, reinterpret_cast<long>(g_base));
    // The child's table has a copy of the parent's memfd if the parent held it in the
    // program's table (at a high number: the child's takes its place), and none if the
    // control thread's table held it (the child's goes high).
    struct stat st {};
    const long inherited = g_fd.in_program_table() ? g_fd.number() : -1;
    const bool ours = inherited >= 0 && raw_syscall(SYS_fstat, inherited, reinterpret_cast<long>(&st)) == 0 &&
                      g_fd.same_file(st.st_dev, st.st_ino);
    g_fd.forget();
    long kept = -1;
    if (fd >= 0 && ours) {
        raw_syscall(SYS_dup3, fd, inherited, O_CLOEXEC);
        raw_syscall(SYS_close, fd);
        kept = inherited;
    } else if (fd >= 0) {
        kept = raw_syscall(SYS_fcntl, fd, F_DUPFD_CLOEXEC, 512);
        if (kept >= 0)
            raw_syscall(SYS_close, fd);
        else
            kept = fd;
    } else if (ours) {
        raw_syscall(SYS_close, inherited);
    }
    if (kept >= 0 && raw_syscall(SYS_fstat, kept, reinterpret_cast<long>(&st)) == 0)
        g_fd.set_in_program_table(static_cast<int>(kept), st.st_dev, st.st_ino);
    h->pid = pid;
}

} // namespace ukp::trace
