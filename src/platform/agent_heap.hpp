// The agent's large blocks, kept out of the program's malloc tuning.
//
// glibc serves a request of M_MMAP_THRESHOLD (128 KiB at start) or more with a mapping of
// its own, and when such a block is freed it raises the threshold to the block's size and
// the heap's trim threshold to twice that (mallopt(3), "dynamic mmap threshold"): from then
// on the *program's* blocks up to that size come from the heap, and its heap is no longer
// given back below twice that size. The agent reads symbol tables, decodes whole libraries
// and frees the buffers after: preloaded or attached, it raised python3.11's thresholds to
// 2.4 MiB and 4.9 MiB, and each round of the program's zlib.compress() then ran 14 times
// faster than without the agent (its 256 KiB state no longer given back to the system
// each time) - a program measured under ukprobes is not the program.
//
// So a block of the agent of kOwnMapFrom or more is a mapping of the agent's own, laid out
// as a glibc mmapped chunk (prev_size = the offset of the chunk in the mapping, size with
// IS_MMAPPED): free(), realloc() and malloc_usable_size() of the C library take it as one
// of theirs, should a block of the agent reach them (libstdc++'s out-of-line code frees
// what inline code allocated). Smaller blocks are malloc's: glibc never maps them (a
// program that set a lower threshold with mallopt() has the dynamic threshold off). So
// are all blocks when the process's malloc is another than glibc's.
#pragma once

#include <cstddef>

namespace ukp::platform {

// Requests of this size or more get a mapping of their own.
inline constexpr std::size_t kOwnMapFrom = 64 * 1024;

// Whether large blocks are mappings of the agent's: the process's malloc is glibc's (not
// jemalloc's or tcmalloc's preloaded, not a sanitizer's), decided at the first large block.
bool agent_mappings_on();
// `size` bytes aligned to `align` (a power of two, at most 64), or nullptr (errno set).
void *agent_alloc(std::size_t size, std::size_t align = 16);
// Frees a block of agent_alloc() or of malloc(): a mapping of the agent's is unmapped
// without the C library, anything else goes to free().
void agent_free(void *block);
// Unmaps the mappings agent_free() kept for reuse (agent_heap.cpp): the agent's threads
// call it when they go idle (the control thread back in poll(), the optimizer waiting for
// work, the start after UKP_EVENTS).
void release_spares();
// Whether `block` is one of the agent's own mappings.
bool is_agent_mapping(const void *block);

} // namespace ukp::platform
