#include "text/text.hpp"

#include "platform/held_fd.hpp"
#include "platform/high_fd.hpp"
#include "platform/maps.hpp"
#include "platform/raw_syscall.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <dirent.h>
#include <fcntl.h>
#include <linux/close_range.h>
#include <linux/membarrier.h>
#include <mutex>
#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <vector>

namespace ukp::text {

namespace {

constexpr size_t kChunkSize = 64 * 1024;
constexpr size_t kMaxChunks = 8192; // 512 MiB of slots: 2M probe points
// Keep a margin inside the rel32 reach so any byte of a chunk reaches any byte near `near`.
constexpr uint64_t kReach = (1ull << 31) - (16ull << 20);

struct Chunk {
    uint64_t start;
    uint64_t used; // bytes handed out, from start
};

std::mutex g_mutex;       // guards everything below except the published chunk array
bool g_sync_core = false; // membarrier SYNC_CORE registered for this process
pid_t g_sync_pid = 0;     // the process g_sync_core was decided for

// A thread with a descriptor table of its own (use_own_fd_table()) keeps a /proc/self/mem
// there; the program's threads open one for each write.
thread_local int t_own_mem_fd __attribute__((tls_model("initial-exec"))) = -1;

// A batch of writes on one of the program's threads (begin_write_batch; batch_mem below).
struct BatchMem {
    int depth = 0; // begin_write_batch() scopes open
    int fd = -1;
    dev_t dev = 0;
    ino_t ino = 0;
    bool registered = false; // register_sync_core_locked() asked in this batch
};
thread_local BatchMem t_batch;

// Published chunk starts, read by signal handlers without a lock: entries are written
// before g_chunk_count is raised and never change afterwards.
uint64_t g_chunk_start[kMaxChunks];
std::atomic<size_t> g_chunk_count{0};
std::vector<Chunk> g_chunks; // the same chunks, with their fill level

long membarrier(int cmd) { return syscall(__NR_membarrier, cmd, 0, 0); }

// Once per process (a child of fork() registers again: the registration belongs to the
// address space).
void register_sync_core_locked() {
    if (g_sync_pid == getpid()) return;
    g_sync_core = membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_SYNC_CORE) == 0;
    g_sync_pid = getpid();
}

// Registers membarrier for this process (again in a child of fork()), and says whether
// the caller can write code: a thread with its own table has its own /proc/self/mem,
// one of the program's opens it for each write (open_program_mem).
int open_mem_locked() {
    // Once in a batch: this thread cannot fork while it writes (getpid() at each write).
    if (t_batch.depth == 0 || !t_batch.registered) {
        register_sync_core_locked();
        t_batch.registered = t_batch.depth > 0;
    }
    return platform::has_own_fd_table() && t_own_mem_fd < 0 ? -EBADF : 0;
}

// /proc/self/mem for one write by a thread of the program's table, closed after it: a
// descriptor the agent kept there would be the program's to see, to close or to dup2()
// over (a write through a number the program reused would land in its file), and every
// child of fork() would inherit its parent's memory.
int open_program_mem() {
    const int fd = open("/proc/self/mem", O_RDWR | O_CLOEXEC);
    return fd < 0 ? -errno : fd;
}

// A batch of writes on one of the program's threads (begin_write_batch): one
// /proc/self/mem for all of them instead of one each, moved high (platform/high_fd.hpp)
// where the program does not expect its own numbers, and its identity checked before each
// write, as an opening for one write would be good for only that write: the program may
// have closed the number and opened a file of its own under it meanwhile.
// Straight system calls, here and for the writes: the C library's fstat and pwrite may be
// among the functions the batch arms (an event over all of libc), and each call of theirs
// would be a hit.
bool batch_fd_is_ours() {
    struct stat st {};
    return t_batch.fd >= 0 && platform::raw_syscall(SYS_fstat, t_batch.fd, reinterpret_cast<long>(&st)) == 0 &&
           st.st_dev == t_batch.dev && st.st_ino == t_batch.ino;
}

// The batch's /proc/self/mem, opened at its first write (or again when the number no
// longer names it: not ours to close then). An fd or -errno.
int batch_mem() {
    if (batch_fd_is_ours()) return t_batch.fd;
    t_batch.fd = -1;
    int fd = open_program_mem();
    if (fd < 0) return fd;
    fd = platform::move_fd_high(fd);
    struct stat st {};
    if (fstat(fd, &st) != 0) {
        const int err = -errno;
        close(fd);
        return err;
    }
    t_batch.fd = fd;
    t_batch.dev = st.st_dev;
    t_batch.ino = st.st_ino;
    return fd;
}

// Free gaps of the address space, from /proc/self/maps.
std::vector<std::pair<uint64_t, uint64_t>> address_space_gaps() {
    std::vector<std::pair<uint64_t, uint64_t>> gaps;
    uint64_t prev_end = 0x10000; // stay clear of mmap_min_addr
    if (!platform::for_each_mapping(0, [&](const platform::Mapping &m) {
            if (m.start > prev_end) gaps.emplace_back(prev_end, m.start);
            if (m.end > prev_end) prev_end = m.end;
            return true;
        }))
        return gaps;
    constexpr uint64_t kUserTop = 0x7ffffffff000ull;
    if (prev_end < kUserTop) gaps.emplace_back(prev_end, kUserTop);
    return gaps;
}

uint64_t distance(uint64_t a, uint64_t b) { return a > b ? a - b : b - a; }

bool in_reach(uint64_t chunk, uint64_t near) {
    return distance(chunk, near) < kReach && distance(chunk + kChunkSize, near) < kReach;
}

// Maps a new chunk as close to `near` as a free gap allows; 0 on failure.
uint64_t map_chunk_near(uint64_t near) {
    for (int attempt = 0; attempt < 4; ++attempt) {
        uint64_t best = 0, best_distance = ~0ull;
        for (auto [lo, hi] : address_space_gaps()) {
            // Leave a guard page on each side of the gap.
            const uint64_t first = lo + 0x1000, last = hi - 0x1000;
            if (last < first || last - first < kChunkSize) continue;
            uint64_t candidate = near < first ? first : near - kChunkSize;
            if (candidate + kChunkSize > last) candidate = last - kChunkSize;
            candidate &= ~(kChunkSize - 1);
            if (candidate < first) candidate += kChunkSize;
            if (candidate + kChunkSize > last) continue;
            if (distance(candidate, near) < best_distance) {
                best = candidate;
                best_distance = distance(candidate, near);
            }
        }
        if (best == 0) break;
        void *p = mmap(reinterpret_cast<void *>(best), kChunkSize, PROT_READ | PROT_EXEC,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
        if (p != MAP_FAILED) return reinterpret_cast<uint64_t>(p);
        // Another thread mapped into the gap meanwhile: read the maps again.
    }
    void *p = mmap(nullptr, kChunkSize, PROT_READ | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? 0 : reinterpret_cast<uint64_t>(p);
}

} // namespace

// The mutex is held across fork() so that a child never inherits it locked by a thread
// that does not exist there. Registered before the core's handlers: the prepare
// handlers run in reverse order, so the core's lock is taken first, as in normal code.
void lock_for_fork() { g_mutex.lock(); }
void unlock_after_fork() { g_mutex.unlock(); }
std::once_flag g_fork_once;

void register_membarrier() {
    std::lock_guard lock(g_mutex);
    register_sync_core_locked();
}

int init() {
    std::call_once(g_fork_once, [] { pthread_atfork(lock_for_fork, unlock_after_fork, unlock_after_fork); });
    std::lock_guard lock(g_mutex);
    if (int err = open_mem_locked(); err != 0) return err;
    if (platform::has_own_fd_table()) return 0;
    // A process without /proc/self/mem (no /proc) gets its error now, not at a patch.
    const int fd = open_program_mem();
    if (fd < 0) return fd;
    close(fd);
    return 0;
}

namespace {

// pwrite()s of all n bytes at addr through fd. 0 or -errno.
int write_through(int fd, uint64_t addr, const void *data, size_t n) {
    const char *src = static_cast<const char *>(data);
    while (n > 0) {
        const long w = platform::raw_syscall(SYS_pwrite64, fd, reinterpret_cast<long>(src), static_cast<long>(n),
                                             static_cast<long>(addr));
        if (w == -EINTR) continue;
        if (w < 0) return static_cast<int>(w);
        if (w == 0) return -EIO;
        src += w;
        addr += static_cast<uint64_t>(w);
        n -= static_cast<size_t>(w);
    }
    return 0;
}

} // namespace

int write(uint64_t addr, const void *data, size_t n) {
    const Piece piece{addr, data, n};
    bool ok = false;
    return write_many(&piece, 1, &ok);
}

int write_many(const Piece *pieces, size_t n, bool *ok) {
    std::fill(ok, ok + n, false);
    std::lock_guard lock(g_mutex);
    if (int err = open_mem_locked(); err != 0) return err;
    const bool own = platform::has_own_fd_table(), batch = !own && t_batch.depth > 0;
    int fd = own ? t_own_mem_fd : batch ? -1 : open_program_mem();
    if (fd < 0 && !batch) return fd;
    int first_err = 0;
    for (size_t i = 0; i < n; ++i) {
        // The batch's file checked before each write (batch_mem).
        if (batch && (fd = batch_mem()) < 0) {
            first_err = fd;
            break;
        }
        const int err = write_through(fd, pieces[i].addr, pieces[i].data, pieces[i].n);
        ok[i] = err == 0;
        if (err != 0 && first_err == 0) first_err = err;
    }
    if (!own && !batch) close(fd);
    return first_err;
}

void begin_write_batch() { ++t_batch.depth; }

void end_write_batch() {
    if (--t_batch.depth > 0) return;
    if (batch_fd_is_ours()) close(t_batch.fd);
    t_batch.fd = -1;
    t_batch.registered = false;
}

std::atomic<uint64_t> g_syncs{0};

void sync_cores() {
    g_syncs.fetch_add(1, std::memory_order_relaxed);
    {
        std::lock_guard lock(g_mutex);
        open_mem_locked(); // registers membarrier again in a child of fork()
    }
    // Without SYNC_CORE (kernels before 4.16), the write through /proc/self/mem is still
    // a kernel entry and exit on this core; other cores see the byte change atomically.
    if (g_sync_core) membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE);
}

uint64_t sync_count() { return g_syncs.load(std::memory_order_relaxed); }

int use_own_fd_table() {
    if (int err = platform::enter_own_fd_table(); err != 0) return err;
    if (t_own_mem_fd < 0) t_own_mem_fd = open("/proc/self/mem", O_RDWR | O_CLOEXEC);
    return t_own_mem_fd < 0 ? -errno : 0;
}

int poke_byte(uint64_t addr, uint8_t byte) {
    if (int err = write(addr, &byte, 1); err != 0) return err;
    sync_cores();
    return 0;
}

uint64_t alloc_slot(uint64_t near) {
    std::lock_guard lock(g_mutex);
    for (Chunk &c : g_chunks) {
        if (c.used + kSlotSize <= kChunkSize && in_reach(c.start, near)) {
            const uint64_t slot = c.start + c.used;
            c.used += kSlotSize;
            return slot;
        }
    }
    const size_t n = g_chunk_count.load(std::memory_order_relaxed);
    if (n == kMaxChunks) return 0;
    const uint64_t start = map_chunk_near(near);
    if (start == 0) return 0;
    g_chunks.push_back({start, kSlotSize});
    g_chunk_start[n] = start;
    g_chunk_count.store(n + 1, std::memory_order_release);
    return start;
}

uint64_t alloc_code(size_t size) {
    void *p = mmap(nullptr, size, PROT_READ | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? 0 : reinterpret_cast<uint64_t>(p);
}

void free_code(uint64_t addr, size_t size) { munmap(reinterpret_cast<void *>(addr), size); }

uint64_t slot_containing(uint64_t addr) {
    const size_t n = g_chunk_count.load(std::memory_order_acquire);
    for (size_t i = 0; i < n; ++i) {
        const uint64_t start = g_chunk_start[i];
        if (addr >= start && addr < start + kChunkSize) return addr & ~(kSlotSize - 1);
    }
    return 0;
}

bool is_agent_code(uint64_t addr) { return slot_containing(addr) != 0; }

} // namespace ukp::text
