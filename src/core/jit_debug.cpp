// GDB's JIT interface (gdb/jit.h, the GDB manual's "JIT Compilation Interface"), with
// one ELF relocatable object per registered range of code. GDB reads such an object
// with its ordinary ELF reader: the address of each allocated section is its sh_addr,
// symbol values are offsets in their section, and the CFI in .eh_frame is used for
// every pc in the range.
#include "core/jit_debug.hpp"

#include <cstring>
#include <elf.h>
#include <mutex>
#include <new>
#include <pthread.h>

extern "C" {

// The names, the layout and version 1 are GDB's contract.
enum JitAction : uint32_t { JIT_NOACTION = 0, JIT_REGISTER_FN = 1, JIT_UNREGISTER_FN = 2 };

struct jit_code_entry {
    jit_code_entry *next_entry;
    jit_code_entry *prev_entry;
    const char *symfile_addr;
    uint64_t symfile_size;
};

struct jit_descriptor {
    uint32_t version;
    uint32_t action_flag; // a JitAction
    jit_code_entry *relevant_entry;
    jit_code_entry *first_entry;
};

// Protected: a debugger finds them by name in the agent's object, and the agent keeps
// using its own even when the program has a JIT with descriptors of the same names (GDB
// reads one descriptor per object file); the program's JIT keeps its list, we keep ours.
__attribute__((visibility("protected"), used))
jit_descriptor __jit_debug_descriptor = {1, JIT_NOACTION, nullptr, nullptr};

// The debugger's breakpoint: it reads the descriptor when this is called. Must stay a
// real call (never inlined, never merged or dropped). clang has no noipa: noinline, and
// the asm's memory clobber, keep the call there.
#ifdef __clang__
__attribute__((visibility("protected"), noinline, used)) void __jit_debug_register_code() {
#else
__attribute__((visibility("protected"), noipa, used)) void __jit_debug_register_code() {
#endif
    asm volatile("" ::: "memory");
}

} // extern "C"

namespace ukp::core::jit {

namespace {

struct Entry {
    jit_code_entry gdb{};
    uint64_t code = 0;
    std::vector<uint8_t> object; // what symfile_addr points at
};

// Serializes changes to the descriptor's list (registration is never on the hit path).
// Held across fork(), so that a child never inherits it locked by a thread it lacks.
std::mutex g_mutex;
std::once_flag g_fork_once;
void lock_for_fork() { g_mutex.lock(); }
void unlock_after_fork() { g_mutex.unlock(); }

// Grows the vector, then copies: GCC 12 at -O3 inlines vector::insert here and warns
// falsely (-Warray-bounds) about the copy into the 64-byte vector build_object starts with.
void put(std::vector<uint8_t> &out, const void *data, size_t n) {
    if (n == 0) return;
    const size_t at = out.size();
    out.resize(at + n);
    std::memcpy(out.data() + at, data, n);
}

void align(std::vector<uint8_t> &out, size_t to) {
    while (out.size() % to != 0) out.push_back(0);
}

std::vector<uint8_t> build_object(uint64_t code, size_t size, const std::vector<CodeSymbol> &symbols,
                                  const std::vector<uint8_t> &eh_frame) {
    enum : uint16_t { kNull, kText, kEhFrame, kSymtab, kStrtab, kShstrtab, kSections };
    std::vector<uint8_t> out(sizeof(Elf64_Ehdr));
    Elf64_Shdr sh[kSections] = {};

    // The code's bytes as they are now: a debugger disassembles the object's copy when
    // it trusts read-only sections, and the process's memory otherwise.
    align(out, 16);
    sh[kText] = {0, SHT_PROGBITS, SHF_ALLOC | SHF_EXECINSTR, code, out.size(), size, 0, 0, 16, 0};
    put(out, reinterpret_cast<const void *>(code), size);

    // Not allocated: its FDEs carry absolute addresses, so where it lies does not matter.
    align(out, 8);
    sh[kEhFrame] = {0, SHT_PROGBITS, 0, 0, out.size(), eh_frame.size(), 0, 0, 8, 0};
    put(out, eh_frame.data(), eh_frame.size());

    std::vector<uint8_t> strtab(1, 0);
    align(out, 8);
    const size_t symtab_at = out.size();
    const Elf64_Sym null_sym{};
    put(out, &null_sym, sizeof null_sym);
    for (const CodeSymbol &s : symbols) {
        Elf64_Sym sym{};
        sym.st_name = static_cast<uint32_t>(strtab.size());
        sym.st_info = ELF64_ST_INFO(STB_GLOBAL, STT_FUNC);
        sym.st_shndx = kText;
        sym.st_value = s.offset; // relative to .text in a relocatable object
        sym.st_size = s.size;
        put(out, &sym, sizeof sym);
        put(strtab, s.name.c_str(), s.name.size() + 1);
    }
    // sh_info: the index of the first global symbol.
    sh[kSymtab] = {0, SHT_SYMTAB, 0, 0, symtab_at, out.size() - symtab_at, kStrtab, 1, 8, sizeof(Elf64_Sym)};

    sh[kStrtab] = {0, SHT_STRTAB, 0, 0, out.size(), strtab.size(), 0, 0, 1, 0};
    put(out, strtab.data(), strtab.size());

    static constexpr char kNames[] = "\0.text\0.eh_frame\0.symtab\0.strtab\0.shstrtab";
    sh[kText].sh_name = 1;
    sh[kEhFrame].sh_name = 7;
    sh[kSymtab].sh_name = 17;
    sh[kStrtab].sh_name = 25;
    sh[kShstrtab] = {33, SHT_STRTAB, 0, 0, out.size(), sizeof kNames, 0, 0, 1, 0};
    put(out, kNames, sizeof kNames);

    align(out, 8);
    const size_t shoff = out.size();
    put(out, sh, sizeof sh);

    Elf64_Ehdr eh{};
    std::memcpy(eh.e_ident, ELFMAG, SELFMAG);
    eh.e_ident[EI_CLASS] = ELFCLASS64;
    eh.e_ident[EI_DATA] = ELFDATA2LSB;
    eh.e_ident[EI_VERSION] = EV_CURRENT;
    eh.e_ident[EI_OSABI] = ELFOSABI_SYSV;
    eh.e_type = ET_REL;
    eh.e_machine = EM_X86_64;
    eh.e_version = EV_CURRENT;
    eh.e_shoff = shoff;
    eh.e_ehsize = sizeof(Elf64_Ehdr);
    eh.e_shentsize = sizeof(Elf64_Shdr);
    eh.e_shnum = kSections;
    eh.e_shstrndx = kShstrtab;
    std::memcpy(out.data(), &eh, sizeof eh);
    return out;
}

// The registered entries, to find one by its code address.
std::vector<Entry *> &entries() {
    static auto *value = new std::vector<Entry *>(); // never destroyed: probes outlive static destructors
    return *value;
}

} // namespace

void hook_fork() {
    std::call_once(g_fork_once, [] { pthread_atfork(lock_for_fork, unlock_after_fork, unlock_after_fork); });
}

bool register_code(uint64_t code, size_t size, const std::vector<CodeSymbol> &symbols,
                   const std::vector<uint8_t> &eh_frame) {
    hook_fork();
    auto *e = new (std::nothrow) Entry;
    if (e == nullptr) return false;
    e->code = code;
    e->object = build_object(code, size, symbols, eh_frame);
    e->gdb.symfile_addr = reinterpret_cast<const char *>(e->object.data());
    e->gdb.symfile_size = e->object.size();
    std::lock_guard lock(g_mutex);
    entries().push_back(e);
    // The entry is complete before it is linked, and linked at the head by one store: a
    // debugger that attaches meanwhile sees the list with or without it, never half of it.
    e->gdb.prev_entry = nullptr;
    e->gdb.next_entry = __jit_debug_descriptor.first_entry;
    if (e->gdb.next_entry != nullptr) e->gdb.next_entry->prev_entry = &e->gdb;
    __jit_debug_descriptor.first_entry = &e->gdb;
    __jit_debug_descriptor.relevant_entry = &e->gdb;
    __jit_debug_descriptor.action_flag = JIT_REGISTER_FN;
    __jit_debug_register_code();
    __jit_debug_descriptor.action_flag = JIT_NOACTION;
    __jit_debug_descriptor.relevant_entry = nullptr;
    return true;
}

void unregister_code(uint64_t code) {
    Entry *e = nullptr;
    {
        std::lock_guard lock(g_mutex);
        auto &all = entries();
        for (auto it = all.begin(); it != all.end(); ++it) {
            if ((*it)->code != code) continue;
            e = *it;
            all.erase(it);
            break;
        }
        if (e == nullptr) return;
        jit_code_entry *g = &e->gdb;
        if (g->prev_entry != nullptr)
            g->prev_entry->next_entry = g->next_entry;
        else
            __jit_debug_descriptor.first_entry = g->next_entry;
        if (g->next_entry != nullptr) g->next_entry->prev_entry = g->prev_entry;
        __jit_debug_descriptor.relevant_entry = g;
        __jit_debug_descriptor.action_flag = JIT_UNREGISTER_FN;
        __jit_debug_register_code();
        __jit_debug_descriptor.action_flag = JIT_NOACTION;
        __jit_debug_descriptor.relevant_entry = nullptr;
    }
    delete e;
}

} // namespace ukp::core::jit
