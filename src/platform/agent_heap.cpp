#include "platform/agent_heap.hpp"

#include <sys/mman.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>

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

// The mapping's words: [0] the magic, [6] prev_size, [7] size.
std::uint64_t *words_of(const void *block) {
    return reinterpret_cast<std::uint64_t *>(const_cast<void *>(block)) - kHeader / 8;
}

} // namespace

bool is_agent_mapping(const void *block) {
    const auto at = reinterpret_cast<std::uintptr_t>(block);
    if (block == nullptr || at % kPage != kHeader) return false;
    // The words before the caller's bytes are in the same page: readable for any block
    // malloc gave out at that offset too. The magic word is read only for a mapped chunk
    // of glibc's layout, whose mapping starts there.
    const std::uint64_t *w = words_of(block);
    return (w[7] & kIsMmapped) != 0 && w[6] == kChunkOffset && w[0] == kMagic;
}

void *agent_alloc(std::size_t size, std::size_t align) {
    if (size < kOwnMapFrom) {
        if (size == 0) size = 1;
        if (align <= 16) return std::malloc(size);
        return std::aligned_alloc(align, (size + align - 1) / align * align);
    }
    if (size > SIZE_MAX / 2) {
        errno = ENOMEM;
        return nullptr;
    }
    const std::size_t total = (size + kHeader + kPage - 1) / kPage * kPage;
    void *map = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (map == MAP_FAILED) return nullptr;
    auto *w = static_cast<std::uint64_t *>(map);
    w[0] = kMagic;
    w[6] = kChunkOffset;
    w[7] = (total - kChunkOffset) | kIsMmapped;
    return w + kHeader / 8;
}

void agent_free(void *block) {
    if (!is_agent_mapping(block)) {
        std::free(block);
        return;
    }
    std::uint64_t *w = words_of(block);
    munmap(w, (w[7] & ~std::uint64_t{7}) + kChunkOffset);
}

} // namespace ukp::platform
