// Generated code made known to debuggers through GDB's JIT interface (the GDB manual,
// "JIT Compilation Interface"): each registered range is described by a small in-memory
// ELF object (section .text at the code's real address, a symbol per piece of code, and
// the code's .eh_frame) on the list of `__jit_debug_descriptor`, and announced by a call
// to `__jit_debug_register_code`, on which a debugger keeps a breakpoint. A debugger that
// attaches later reads the whole list.
//
// Registration happens when code memory is created and removed, never on a probe hit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ukp::core::jit {

struct CodeSymbol {
    uint64_t offset = 0; // from the start of the range
    uint64_t size = 0;
    std::string name;
};

// Registers the handlers that hold the list's mutex across fork() (once). hook_fork()
// calls it before registering the core's, whose lock is taken first.
void hook_fork();

// Describes [code, code + size) to debuggers: its bytes (read from memory now), its
// symbols, and `eh_frame`, a complete .eh_frame section whose FDEs give absolute
// addresses (DW_EH_PE_absptr). Returns false when it could not (no memory); the code
// still works, debuggers just do not know it.
bool register_code(uint64_t code, size_t size, const std::vector<CodeSymbol> &symbols,
                   const std::vector<uint8_t> &eh_frame);

// Withdraws the description of the range that starts at `code`, if there is one.
void unregister_code(uint64_t code);

} // namespace ukp::core::jit
