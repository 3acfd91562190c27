// The agent's operator new and delete (platform/agent_heap.hpp says why): only in
// libukprobes.so, where exports.map keeps them local, so that they serve the agent's own
// code and never the program's. Not in a sanitizer build, whose runtime must see every
// allocation.
#include <new>

#include "platform/agent_heap.hpp"

namespace {

void *allocate(std::size_t size) {
    for (;;) {
        if (void *p = ukp::platform::agent_alloc(size)) return p;
        std::new_handler handler = std::get_new_handler();
        if (handler == nullptr) throw std::bad_alloc();
        handler();
    }
}

} // namespace

void *operator new(std::size_t size) { return allocate(size); }
void *operator new[](std::size_t size) { return allocate(size); }
void *operator new(std::size_t size, const std::nothrow_t & /*tag*/) noexcept {
    return ukp::platform::agent_alloc(size);
}
void *operator new[](std::size_t size, const std::nothrow_t & /*tag*/) noexcept {
    return ukp::platform::agent_alloc(size);
}
void operator delete(void *block) noexcept { ukp::platform::agent_free(block); }
void operator delete[](void *block) noexcept { ukp::platform::agent_free(block); }
void operator delete(void *block, std::size_t /*size*/) noexcept { ukp::platform::agent_free(block); }
void operator delete[](void *block, std::size_t /*size*/) noexcept { ukp::platform::agent_free(block); }
void operator delete(void *block, const std::nothrow_t & /*tag*/) noexcept { ukp::platform::agent_free(block); }
void operator delete[](void *block, const std::nothrow_t & /*tag*/) noexcept { ukp::platform::agent_free(block); }
