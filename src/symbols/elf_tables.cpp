// The symbol tables of an ELF object: its own, or its separate debug file's (by build id or
// .gnu_debuglink), read once and on first use (LazySymbols).
#include "symbols/symbols.hpp"
#include "symbols/internal.hpp"

#include "platform/elf_file.hpp"
#include "platform/maps.hpp"

#include <dlfcn.h>
#include <cxxabi.h>
#include <elf.h>
#include <fcntl.h>
#include <gelf.h>
#include <libelf.h>
#include <link.h>
#include <pthread.h>
#include <sys/auxv.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <tuple>

namespace ukp::sym {

namespace {

// A symbol as read, its name still in the ELF file's string table (which outlives it):
// sorting these is cheap, and only the symbols kept get a std::string.
struct RawSymbol {
    std::string_view name;
    uint64_t value = 0;
    uint64_t size = 0;
    uint64_t rank = 0; // alias preference, lower first: see rank_of()
    bool function = false;
    bool ifunc = false;
};

// Preference among symbols at one address, as a number: function, sized, global (then
// weak, local, other), fewer leading underscores, shorter.
uint64_t rank_of(std::string_view name, bool function, uint64_t size, unsigned binding_rank) {
    const size_t underscores = std::min<size_t>(name.find_first_not_of('_'), name.size());
    return uint64_t(!function) << 62 | uint64_t(size == 0) << 61 | uint64_t(binding_rank) << 56 |
           std::min<uint64_t>(underscores, 0xff) << 48 | std::min<uint64_t>(name.size(), 0xffffffffffffull);
}

// Strict order among symbols at one address: the preferred one first.
bool preferred(const RawSymbol &a, const RawSymbol &b) { return a.rank != b.rank ? a.rank < b.rank : a.name < b.name; }

void read_symbol_table(Elf *elf, Elf_Scn *scn, uint64_t bias, std::vector<RawSymbol> &out) {
    GElf_Shdr sh;
    if (!gelf_getshdr(scn, &sh) || sh.sh_entsize == 0) return;
    Elf_Data *data = elf_getdata(scn, nullptr);
    Elf_Scn *strscn = elf_getscn(elf, sh.sh_link);
    Elf_Data *strings = strscn ? elf_getdata(strscn, nullptr) : nullptr;
    if (!data || !strings || !strings->d_buf) return;
    const auto *names = static_cast<const char *>(strings->d_buf);
    const size_t names_size = strings->d_size;
    size_t count = sh.sh_size / sh.sh_entsize;
    if (count > INT_MAX) return;
    out.reserve(out.size() + count);
    for (size_t i = 1; i < count; ++i) {
        GElf_Sym s;
        if (!gelf_getsym(data, static_cast<int>(i), &s)) continue;
        int type = GELF_ST_TYPE(s.st_info);
        bool function = type == STT_FUNC || type == STT_GNU_IFUNC;
        // STT_TLS is skipped with the rest: its value is an offset in the TLS block.
        if (!function && type != STT_OBJECT) continue;
        // An SHN_ABS value is no address in the object, so the bias would not apply.
        if (s.st_shndx == SHN_UNDEF || s.st_shndx == SHN_ABS || s.st_value == 0) continue;
        if (s.st_name == 0 || s.st_name >= names_size) continue;
        const size_t len = strnlen(names + s.st_name, names_size - s.st_name);
        if (len == names_size - s.st_name) continue; // not terminated inside the table
        unsigned binding_rank;
        switch (GELF_ST_BIND(s.st_info)) {
        case STB_GLOBAL:
            binding_rank = 0;
            break;
        case STB_WEAK:
            binding_rank = 1;
            break;
        case STB_LOCAL:
            binding_rank = 2;
            break;
        default:
            binding_rank = 3;
            break;
        }
        RawSymbol r;
        r.name = std::string_view(names + s.st_name, len);
        r.value = s.st_value + bias;
        r.size = s.st_size;
        r.function = function;
        r.ifunc = type == STT_GNU_IFUNC;
        r.rank = rank_of(r.name, function, r.size, binding_rank);
        out.push_back(r);
    }
}

// Sorts by value (preferred alias first) and drops the copies .dynsym adds to .symtab.
std::vector<Symbol> finish_symbols(std::vector<RawSymbol> raw) {
    std::sort(raw.begin(), raw.end(), [](const RawSymbol &a, const RawSymbol &b) {
        if (a.value != b.value) return a.value < b.value;
        if (a.name != b.name) return a.name < b.name;
        return preferred(a, b);
    });
    raw.erase(
        std::unique(raw.begin(), raw.end(),
                    [](const RawSymbol &a, const RawSymbol &b) { return a.value == b.value && a.name == b.name; }),
        raw.end());
    std::sort(raw.begin(), raw.end(), [](const RawSymbol &a, const RawSymbol &b) {
        if (a.value != b.value) return a.value < b.value;
        return preferred(a, b); // a strict total order: the names break ties
    });
    std::vector<Symbol> out;
    out.reserve(raw.size());
    for (const RawSymbol &r : raw) out.push_back(Symbol{std::string(r.name), r.value, r.size, r.function, r.ifunc});
    return out;
}

// The NT_GNU_BUILD_ID of `elf` in lower-case hex, or "".
std::string build_id(Elf *elf) {
    Elf_Scn *scn = nullptr;
    while ((scn = elf_nextscn(elf, scn))) {
        GElf_Shdr sh;
        if (!gelf_getshdr(scn, &sh) || sh.sh_type != SHT_NOTE) continue;
        Elf_Data *data = elf_getdata(scn, nullptr);
        if (!data) continue;
        GElf_Nhdr note;
        size_t offset = 0, name_offset, desc_offset;
        while ((offset = gelf_getnote(data, offset, &note, &name_offset, &desc_offset)) > 0) {
            const auto *bytes = static_cast<const unsigned char *>(data->d_buf);
            if (note.n_type != NT_GNU_BUILD_ID || note.n_namesz != 4 ||
                std::memcmp(bytes + name_offset, "GNU", 4) != 0 || note.n_descsz == 0)
                continue;
            static constexpr char kHex[] = "0123456789abcdef";
            std::string hex;
            for (size_t i = 0; i < note.n_descsz; ++i) {
                hex += kHex[bytes[desc_offset + i] >> 4];
                hex += kHex[bytes[desc_offset + i] & 15];
            }
            return hex;
        }
    }
    return {};
}

// Where the separate debug file of the object with this build id is installed ("" for no
// id).
std::string debug_file_of(const std::string &id) {
    if (id.size() < 3) return {};
    return "/usr/lib/debug/.build-id/" + id.substr(0, 2) + "/" + id.substr(2) + ".debug";
}

// The .symtab of the separate debug file of the object with this build id, if installed,
// opened in `debug` (the names point into it).
void read_debug_symtab(const std::string &id, uint64_t bias, std::vector<RawSymbol> &out, platform::ElfFile &debug) {
    const std::string path = debug_file_of(id);
    if (path.empty() || !debug.open(path)) return;
    Elf_Scn *scn = nullptr;
    while ((scn = elf_nextscn(debug.elf(), scn))) {
        GElf_Shdr sh;
        if (gelf_getshdr(scn, &sh) && sh.sh_type == SHT_SYMTAB) read_symbol_table(debug.elf(), scn, bias, out);
    }
}

// The symbols and PLT ranges of an ELF image.
detail::LazySymbols::Contents read_contents(Elf *elf, uint64_t bias) {
    detail::LazySymbols::Contents out;
    size_t shstrndx = 0;
    bool have_names = elf_getshdrstrndx(elf, &shstrndx) == 0;
    Elf_Scn *symtab = nullptr, *dynsym = nullptr, *scn = nullptr;
    while ((scn = elf_nextscn(elf, scn))) {
        GElf_Shdr sh;
        if (!gelf_getshdr(scn, &sh)) continue;
        if (sh.sh_type == SHT_SYMTAB)
            symtab = scn;
        else if (sh.sh_type == SHT_DYNSYM)
            dynsym = scn;
        const char *name = have_names ? elf_strptr(elf, shstrndx, sh.sh_name) : nullptr;
        if (name && sh.sh_addr != 0 && sh.sh_size != 0 &&
            (!std::strcmp(name, ".plt") || !std::strcmp(name, ".plt.sec") || !std::strcmp(name, ".plt.got")))
            out.plt_ranges.emplace_back(bias + sh.sh_addr, bias + sh.sh_addr + sh.sh_size);
    }

    std::vector<RawSymbol> raw;
    platform::ElfFile debug; // until finish_symbols() has copied the names
    if (symtab)
        read_symbol_table(elf, symtab, bias, raw);
    else
        read_debug_symtab(build_id(elf), bias, raw, debug);
    // .dynsym adds what a .symtab lacks (rare); the copies go in finish_symbols().
    if (dynsym) read_symbol_table(elf, dynsym, bias, raw);
    out.symbols = finish_symbols(std::move(raw));
    return out;
}

// The separate debug file read_contents() takes the .symtab from, or "" when it takes
// none (the file has its own .symtab, or no debug file is installed).
std::string debug_symtab_path(Elf *elf) {
    Elf_Scn *scn = nullptr;
    while ((scn = elf_nextscn(elf, scn))) {
        GElf_Shdr sh;
        if (gelf_getshdr(scn, &sh) && sh.sh_type == SHT_SYMTAB) return {};
    }
    const std::string path = debug_file_of(build_id(elf));
    return !path.empty() && access(path.c_str(), R_OK) == 0 ? path : std::string();
}

// The table store set_table_store() was given, or null.
std::atomic<const TableStore *> g_store{nullptr};

// read_contents() of a file, through the table store when one is set: a table kept for
// the file (and its debug file) is taken instead, and one read is given to the store.
detail::LazySymbols::Contents read_file_contents(Elf *elf, const std::string &path, uint64_t bias) {
    const TableStore *store = g_store.load(std::memory_order_acquire);
    if (store == nullptr) return read_contents(elf, bias);
    const std::string debug = debug_symtab_path(elf);
    detail::LazySymbols::Contents c;
    if (!store->load(path, debug, bias, &c)) {
        c = read_contents(elf, bias);
        store->store(path, debug, bias, c);
    }
    return c;
}

// Everything load_object() promises: exec_ranges from the program headers, and the
// contents, read now.

} // namespace

namespace detail {

void parse_elf(Elf *elf, uint64_t bias, Object &obj) {
    size_t phnum = 0;
    if (elf_getphdrnum(elf, &phnum) == 0) {
        for (size_t i = 0; i < phnum; ++i) {
            GElf_Phdr ph;
            if (gelf_getphdr(elf, static_cast<int>(i), &ph) && ph.p_type == PT_LOAD && (ph.p_flags & PF_X))
                obj.exec_ranges.emplace_back(bias + ph.p_vaddr, bias + ph.p_vaddr + ph.p_memsz);
        }
    }
    detail::LazySymbols::Contents c = read_contents(elf, bias);
    obj.contents.set(std::move(c.symbols), std::move(c.plt_ranges));
}

} // namespace detail

// ---- LazySymbols ----------------------------------------------------------------------

void set_table_store(const TableStore *store) { g_store.store(store, std::memory_order_release); }

namespace detail {

LazySymbols::LazySymbols(const LazySymbols &other) : source_(other.source_) {
    if (other.loaded()) {
        contents_ = other.contents_;
        loaded_.store(true, std::memory_order_release);
    }
}

LazySymbols &LazySymbols::operator=(const LazySymbols &other) {
    if (this != &other) {
        source_ = other.source_;
        const bool loaded = other.loaded();
        contents_ = loaded ? other.contents_ : Contents{};
        loaded_.store(loaded, std::memory_order_release);
    }
    return *this;
}

void LazySymbols::set(std::vector<Symbol> symbols, std::vector<std::pair<uint64_t, uint64_t>> plt_ranges) {
    contents_.symbols = std::move(symbols);
    contents_.plt_ranges = std::move(plt_ranges);
    loaded_.store(true, std::memory_order_release);
}

const LazySymbols::Contents &LazySymbols::load() const {
    if (loaded()) return contents_;
    detail::forget_locks_at_fork();
    std::lock_guard lock(detail::load_mutex());
    if (loaded()) return contents_;
    try {
        platform::ElfFile elf;
        std::vector<char> copy; // libelf reads the vdso from a private copy: the kernel's
                                // pages are never written
        bool open = false;
        if (!source_.open_path.empty()) {
            open = elf.open(source_.open_path);
        } else if (source_.image.second != 0) {
            const auto *image = reinterpret_cast<const char *>(source_.image.first);
            copy.assign(image, image + source_.image.second);
            open = elf.open_memory(copy.data(), copy.size());
        }
        if (open)
            contents_ = source_.open_path.empty() ? read_contents(elf.elf(), source_.bias)
                                                  : read_file_contents(elf.elf(), source_.open_path, source_.bias);
        loaded_.store(true, std::memory_order_release); // unreadable: no symbols, for good
    } catch (...) {
        contents_ = Contents{}; // out of memory: none this time, tried again at the next call
    }
    return contents_;
}

} // namespace detail

} // namespace ukp::sym
