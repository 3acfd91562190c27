#include "platform/agent_heap.hpp"

#include <dlfcn.h>
#include <link.h>
#include <sys/mman.h>

#include <atomic>
#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace ukp::platform {
namespace {

// The mapping: a magic word at its start, glibc's chunk header at 48 [prev_size = 48]
// [size | IS_MMAPPED], the caller's bytes at 64 (aligned to a cache line, and a power of
// two, as glibc checks for a mapped chunk's pointer).
constexpr std::uint64_t kMagic = 0x706165682d706b75; // "ukp-heap"
constexpr std::uint64_t kIsMmapped = 0x2;
constexpr std::size_t kChunkOffset = 48;
constexpr std::size_t kHeader = 64;
constexpr std::size_t kPage = 4096;

// Spare mappings. Decoding a library makes and frees blocks of 100 KiB to a few MiB
// again and again (vectors grown by doubling, a large function's instructions): a fresh
// mapping each time, faulted in page by page, made defining an event over all of libc
// 20% slower (and so did keeping them but giving their pages back lazily, MADV_FREE).
// Mappings of a power of two from 128 KiB to 4 MiB are kept, two of each size, at most
// 16 MiB, until the agent's thread that did the work is through (release_spares()). The
// slots are lock-free: a thread may fork or be stopped anywhere in here.
constexpr int kMinSpare = 17;
constexpr int kMaxSpare = 22;
constexpr int kSparesPerSize = 2;
std::atomic<void *> g_spares[kMaxSpare - kMinSpare + 1][kSparesPerSize];

// Whether the process's malloc is glibc's: only then is a mapping laid out as its mapped
// chunk one that free() takes, should libstdc++'s code free a block of the agent's. Under
// another allocator (jemalloc or tcmalloc preloaded, a sanitizer's) every block is
// malloc's: their frees do not move glibc's thresholds anyway. Decided at the first large
// block (the agent's constructors allocate in an order of the linker's); 0 not yet, 1 yes,
// 2 no.
std::atomic<int> g_glibc_malloc{0};

// The object whose definition of `name` the process's calls bind to is libc.so.6 (`libc`,
// its handle). dlsym(RTLD_DEFAULT) answers that, except in a program linked without PIE
// that takes the function's address: there it names the program's own PLT entry (an
// undefined symbol with a value), and the definition is that of the first object after
// the program, in the order of loading, that defines the name (the preloaded ones first).
bool binds_to_libc(const char *name, void *libc) {
    Dl_info at{};
    Dl_info in_libc{};
    void *sym = nullptr;
    void *ours = dlsym(RTLD_DEFAULT, name);
    void *theirs = dlsym(libc, name);
    if (ours == nullptr || theirs == nullptr || dladdr(theirs, &in_libc) == 0 ||
        dladdr1(ours, &at, &sym, RTLD_DL_SYMENT) == 0)
        return false;
    if (at.dli_fbase == in_libc.dli_fbase) return true;
    const auto *entry = static_cast<const ElfW(Sym) *>(sym);
    if (entry == nullptr || entry->st_shndx != SHN_UNDEF) return false; // defined elsewhere
    struct Search {
        const char *name;
        const void *libc_base;
        int verdict; // 0 not found yet, 1 libc's, 2 another object's
    } search{name, in_libc.dli_fbase, 0};
    dl_iterate_phdr(
        [](dl_phdr_info *info, size_t /*size*/, void *data) {
            auto *s = static_cast<Search *>(data);
            if (info->dlpi_name == nullptr || info->dlpi_name[0] == '\0') return 0; // the program
            void *object = dlopen(info->dlpi_name, RTLD_LAZY | RTLD_NOLOAD);
            if (object == nullptr) return 0;
            Dl_info def{};
            void *fn = dlsym(object, s->name);
            link_map *map = nullptr;
            const bool here = fn != nullptr && dladdr(fn, &def) != 0 && dlinfo(object, RTLD_DI_LINKMAP, &map) == 0 &&
                              map != nullptr && def.dli_fname != nullptr &&
                              std::strcmp(def.dli_fname, map->l_name) == 0;
            dlclose(object);
            if (!here) return 0; // found in a dependency: a later object may still come first
            s->verdict = def.dli_fbase == s->libc_base ? 1 : 2;
            return 1;
        },
        &search);
    return search.verdict == 1;
}

bool decide_glibc_malloc() {
    void *libc = dlopen("libc.so.6", RTLD_LAZY | RTLD_NOLOAD);
    bool glibc = libc != nullptr;
    if (libc != nullptr) {
        for (const char *name : {"malloc", "free", "realloc", "calloc", "malloc_usable_size"})
            glibc = glibc && binds_to_libc(name, libc);
        dlclose(libc);
    }
    g_glibc_malloc.store(glibc ? 1 : 2, std::memory_order_relaxed);
    return glibc;
}

// The mapping's words: [0] the magic, [6] prev_size, [7] size.
std::uint64_t *words_of(const void *block) {
    return reinterpret_cast<std::uint64_t *>(const_cast<void *>(block)) - kHeader / 8;
}

void *take_spare(int order) {
    if (order < kMinSpare || order > kMaxSpare) return nullptr;
    for (auto &slot : g_spares[order - kMinSpare])
        if (slot.load(std::memory_order_relaxed) != nullptr)
            if (void *map = slot.exchange(nullptr, std::memory_order_acquire)) return map;
    return nullptr;
}

bool keep_spare(void *map, std::size_t total) {
    if (!std::has_single_bit(total)) return false; // realloc()ed by the C library
    const int order = std::countr_zero(total);
    if (order < kMinSpare || order > kMaxSpare) return false;
    for (auto &slot : g_spares[order - kMinSpare]) {
        void *empty = nullptr;
        if (slot.load(std::memory_order_relaxed) == nullptr &&
            slot.compare_exchange_strong(empty, map, std::memory_order_release))
            return true;
    }
    return false;
}

} // namespace

bool is_agent_mapping(const void *block) {
    // Under another malloc the agent makes no mappings, and the bytes before a block of
    // malloc's are not to be read (a sanitizer's redzone).
    if (g_glibc_malloc.load(std::memory_order_relaxed) != 1) return false;
    const auto at = reinterpret_cast<std::uintptr_t>(block);
    if (block == nullptr || at % kPage != kHeader) return false;
    // The words before the caller's bytes are in the same page: under glibc's malloc, the
    // header of any block it gave out at that offset. The magic word is read only for a
    // mapped chunk of glibc's layout, whose mapping starts there.
    const std::uint64_t *w = words_of(block);
    return (w[7] & kIsMmapped) != 0 && w[6] == kChunkOffset && w[0] == kMagic;
}

bool agent_mappings_on() {
    const int known = g_glibc_malloc.load(std::memory_order_relaxed);
    return known != 0 ? known == 1 : decide_glibc_malloc();
}

void *agent_alloc(std::size_t size, std::size_t align) {
    if (size < kOwnMapFrom || !agent_mappings_on()) {
        if (size == 0) size = 1;
        if (align <= 16) return std::malloc(size);
        return std::aligned_alloc(align, (size + align - 1) / align * align);
    }
    if (size > SIZE_MAX / 4) {
        errno = ENOMEM;
        return nullptr;
    }
    std::size_t total = (size + kHeader + kPage - 1) / kPage * kPage;
    const int order = std::bit_width(total - 1);
    if (order <= kMaxSpare) total = std::size_t{1} << order;
    void *map = take_spare(order);
    if (map == nullptr) map = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (map == MAP_FAILED) return nullptr;
    // (A spare's header too: the C library's realloc() may have moved or resized it.)
    auto *w = static_cast<std::uint64_t *>(map);
    w[0] = kMagic;
    w[6] = kChunkOffset;
    w[7] = (total - kChunkOffset) | kIsMmapped;
    return w + kHeader / 8;
}

void release_spares() {
    for (int order = kMinSpare; order <= kMaxSpare; ++order)
        for (auto &slot : g_spares[order - kMinSpare])
            if (slot.load(std::memory_order_relaxed) != nullptr)
                if (void *map = slot.exchange(nullptr, std::memory_order_acquire)) munmap(map, std::size_t{1} << order);
}

void agent_free(void *block) {
    if (!is_agent_mapping(block)) {
        std::free(block);
        return;
    }
    std::uint64_t *w = words_of(block);
    const std::size_t total = (w[7] & ~std::uint64_t{7}) + kChunkOffset;
    if (!keep_spare(w, total)) munmap(w, total);
}

} // namespace ukp::platform
