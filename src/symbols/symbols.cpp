#include "symbols/symbols.hpp"

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

namespace detail {

// One key of the demangled-name index: the hash of a name the symbol answers to.
struct NameKey {
    uint64_t hash = 0;
    uint32_t symbol = 0; // index into Object::symbols
};

struct Tables {
    std::once_flag ends_once;
    // ends[i]: the highest end address among the function symbols in symbols[0..i]
    // (a size-0 function ends one byte after its value); 0 when there is none.
    std::vector<uint64_t> ends;

    std::once_flag names_once;
    // Hashes of every demangled form of every mangled symbol, sorted by (hash, symbol).
    // Hashes rather than strings keep this small for libstdc++; hits are verified.
    std::vector<NameKey> names;
};

LazyTables::LazyTables() : tables_(std::make_unique<Tables>()) {}
LazyTables::~LazyTables() = default;
LazyTables::LazyTables(const LazyTables &) : LazyTables() {}
LazyTables &LazyTables::operator=(const LazyTables &other)
{
    if (this != &other)
        tables_ = std::make_unique<Tables>();
    return *this;
}

} // namespace detail

namespace {

constexpr size_t npos = std::string_view::npos;

std::string file_name(std::string_view path)
{
    size_t slash = path.rfind('/');
    return std::string(slash == npos ? path : path.substr(slash + 1));
}


// ---- Demangled names ------------------------------------------------------------------

// The demangled name without its parameter list, trailing cv/ref qualifiers and (for
// function templates) return type: "void ns::g<int>(int) const" -> "ns::g<int>".
// Empty when `full` does not end in a parameter list.
std::string_view without_params(std::string_view full)
{
    // A clone ("f(int) [clone .cold]") must not answer for the function itself.
    if (full.find(" [clone ") != npos)
        return {};
    std::string_view s = full;
    static constexpr std::string_view kQualifiers[] = {" const", " volatile", " &&", " &",
                                                       " noexcept"};
    for (bool stripped = true; stripped;) {
        stripped = false;
        for (std::string_view q : kQualifiers) {
            if (s.ends_with(q)) {
                s.remove_suffix(q.size());
                stripped = true;
            }
        }
    }
    if (!s.ends_with(')'))
        return {};
    size_t open = npos;
    int depth = 0;
    for (size_t i = s.size(); i-- > 0;) {
        if (s[i] == ')') {
            ++depth;
        } else if (s[i] == '(' && --depth == 0) {
            open = i;
            break;
        }
    }
    if (open == npos || open == 0)
        return {};
    s = s.substr(0, open);

    // A return type ends at the last space outside brackets; spaces inside an operator
    // name ("operator new", "operator unsigned long") are not such ends.
    size_t start = 0;
    depth = 0;
    for (size_t i = 0; i < s.size(); ++i) {
        if (depth == 0 && s.substr(i).starts_with("operator") &&
            (i == 0 || s[i - 1] == ':' || s[i - 1] == ' '))
            break; // '<' and '>' in "operator<<" are no brackets either
        switch (s[i]) {
        case '<': case '(': case '[': case '{': ++depth; break;
        case '>': case ')': case ']': case '}': depth -= depth > 0; break;
        case ' ': if (depth == 0) start = i + 1; break;
        default: break;
        }
    }
    return s.substr(start);
}

// `s` without its ABI tags: "ns::f[abi:cxx11]" -> "ns::f".
std::string without_abi_tags(std::string_view s)
{
    std::string out;
    out.reserve(s.size());
    for (size_t i = 0; i < s.size();) {
        if (s.substr(i).starts_with("[abi:")) {
            size_t close = s.find(']', i);
            if (close != npos) {
                i = close + 1;
                continue;
            }
        }
        out += s[i++];
    }
    return out;
}

// The demangled names a symbol answers to, besides its ELF name (at most 3).
struct DemangledNames {
    std::string full;      // "ns::f[abi:cxx11](int)"; empty when not mangled
    std::string_view base; // "ns::f[abi:cxx11]" (points into full); may be empty
    std::string untagged;  // "ns::f"; empty when base has no ABI tag

    DemangledNames(const DemangledNames &) = delete; // base points into full
    DemangledNames &operator=(const DemangledNames &) = delete;

    explicit DemangledNames(std::string_view elf_name)
    {
        if (!elf_name.starts_with("_Z"))
            return;
        full = demangle(elf_name);
        if (full == elf_name) {
            full.clear();
            return;
        }
        base = without_params(full);
        if (base.find("[abi:") != npos)
            untagged = without_abi_tags(base);
    }

    template <typename F> void for_each(F &&f) const
    {
        if (!full.empty())
            f(std::string_view(full));
        if (!base.empty())
            f(base);
        if (!untagged.empty())
            f(std::string_view(untagged));
    }

    bool matches(std::string_view name) const
    {
        bool hit = false;
        for_each([&](std::string_view n) { hit = hit || n == name; });
        return hit;
    }
};

uint64_t name_hash(std::string_view s) { return std::hash<std::string_view>{}(s); }

// ---- ELF parsing ----------------------------------------------------------------------

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
uint64_t rank_of(std::string_view name, bool function, uint64_t size, unsigned binding_rank)
{
    const size_t underscores = std::min<size_t>(name.find_first_not_of('_'), name.size());
    return uint64_t(!function) << 62 | uint64_t(size == 0) << 61 | uint64_t(binding_rank) << 56 |
           std::min<uint64_t>(underscores, 0xff) << 48 | std::min<uint64_t>(name.size(), 0xffffffffffffull);
}

// Strict order among symbols at one address: the preferred one first.
bool preferred(const RawSymbol &a, const RawSymbol &b)
{
    return a.rank != b.rank ? a.rank < b.rank : a.name < b.name;
}

void read_symbol_table(Elf *elf, Elf_Scn *scn, uint64_t bias, std::vector<RawSymbol> &out)
{
    GElf_Shdr sh;
    if (!gelf_getshdr(scn, &sh) || sh.sh_entsize == 0)
        return;
    Elf_Data *data = elf_getdata(scn, nullptr);
    Elf_Scn *strscn = elf_getscn(elf, sh.sh_link);
    Elf_Data *strings = strscn ? elf_getdata(strscn, nullptr) : nullptr;
    if (!data || !strings || !strings->d_buf)
        return;
    const auto *names = static_cast<const char *>(strings->d_buf);
    const size_t names_size = strings->d_size;
    size_t count = sh.sh_size / sh.sh_entsize;
    if (count > INT_MAX)
        return;
    out.reserve(out.size() + count);
    for (size_t i = 1; i < count; ++i) {
        GElf_Sym s;
        if (!gelf_getsym(data, static_cast<int>(i), &s))
            continue;
        int type = GELF_ST_TYPE(s.st_info);
        bool function = type == STT_FUNC || type == STT_GNU_IFUNC;
        // STT_TLS is skipped with the rest: its value is an offset in the TLS block.
        if (!function && type != STT_OBJECT)
            continue;
        // An SHN_ABS value is no address in the object, so the bias would not apply.
        if (s.st_shndx == SHN_UNDEF || s.st_shndx == SHN_ABS || s.st_value == 0)
            continue;
        if (s.st_name == 0 || s.st_name >= names_size)
            continue;
        const size_t len = strnlen(names + s.st_name, names_size - s.st_name);
        if (len == names_size - s.st_name)
            continue; // not terminated inside the table
        unsigned binding_rank;
        switch (GELF_ST_BIND(s.st_info)) {
        case STB_GLOBAL: binding_rank = 0; break;
        case STB_WEAK: binding_rank = 1; break;
        case STB_LOCAL: binding_rank = 2; break;
        default: binding_rank = 3; break;
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
std::vector<Symbol> finish_symbols(std::vector<RawSymbol> raw)
{
    std::sort(raw.begin(), raw.end(), [](const RawSymbol &a, const RawSymbol &b) {
        if (a.value != b.value)
            return a.value < b.value;
        if (a.name != b.name)
            return a.name < b.name;
        return preferred(a, b);
    });
    raw.erase(std::unique(raw.begin(), raw.end(),
                          [](const RawSymbol &a, const RawSymbol &b) {
                              return a.value == b.value && a.name == b.name;
                          }),
              raw.end());
    std::sort(raw.begin(), raw.end(), [](const RawSymbol &a, const RawSymbol &b) {
        if (a.value != b.value)
            return a.value < b.value;
        return preferred(a, b); // a strict total order: the names break ties
    });
    std::vector<Symbol> out;
    out.reserve(raw.size());
    for (const RawSymbol &r : raw)
        out.push_back(Symbol{std::string(r.name), r.value, r.size, r.function, r.ifunc});
    return out;
}

// The NT_GNU_BUILD_ID of `elf` in lower-case hex, or "".
std::string build_id(Elf *elf)
{
    Elf_Scn *scn = nullptr;
    while ((scn = elf_nextscn(elf, scn))) {
        GElf_Shdr sh;
        if (!gelf_getshdr(scn, &sh) || sh.sh_type != SHT_NOTE)
            continue;
        Elf_Data *data = elf_getdata(scn, nullptr);
        if (!data)
            continue;
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
std::string debug_file_of(const std::string &id)
{
    if (id.size() < 3)
        return {};
    return "/usr/lib/debug/.build-id/" + id.substr(0, 2) + "/" + id.substr(2) + ".debug";
}

// The .symtab of the separate debug file of the object with this build id, if installed,
// opened in `debug` (the names point into it).
void read_debug_symtab(const std::string &id, uint64_t bias, std::vector<RawSymbol> &out, platform::ElfFile &debug)
{
    const std::string path = debug_file_of(id);
    if (path.empty() || !debug.open(path))
        return;
    Elf_Scn *scn = nullptr;
    while ((scn = elf_nextscn(debug.elf(), scn))) {
        GElf_Shdr sh;
        if (gelf_getshdr(scn, &sh) && sh.sh_type == SHT_SYMTAB)
            read_symbol_table(debug.elf(), scn, bias, out);
    }
}

// The symbols and PLT ranges of an ELF image.
detail::LazySymbols::Contents read_contents(Elf *elf, uint64_t bias)
{
    detail::LazySymbols::Contents out;
    size_t shstrndx = 0;
    bool have_names = elf_getshdrstrndx(elf, &shstrndx) == 0;
    Elf_Scn *symtab = nullptr, *dynsym = nullptr, *scn = nullptr;
    while ((scn = elf_nextscn(elf, scn))) {
        GElf_Shdr sh;
        if (!gelf_getshdr(scn, &sh))
            continue;
        if (sh.sh_type == SHT_SYMTAB)
            symtab = scn;
        else if (sh.sh_type == SHT_DYNSYM)
            dynsym = scn;
        const char *name = have_names ? elf_strptr(elf, shstrndx, sh.sh_name) : nullptr;
        if (name && sh.sh_addr != 0 && sh.sh_size != 0 &&
            (!std::strcmp(name, ".plt") || !std::strcmp(name, ".plt.sec") ||
             !std::strcmp(name, ".plt.got")))
            out.plt_ranges.emplace_back(bias + sh.sh_addr, bias + sh.sh_addr + sh.sh_size);
    }

    std::vector<RawSymbol> raw;
    platform::ElfFile debug; // until finish_symbols() has copied the names
    if (symtab)
        read_symbol_table(elf, symtab, bias, raw);
    else
        read_debug_symtab(build_id(elf), bias, raw, debug);
    // .dynsym adds what a .symtab lacks (rare); the copies go in finish_symbols().
    if (dynsym)
        read_symbol_table(elf, dynsym, bias, raw);
    out.symbols = finish_symbols(std::move(raw));
    return out;
}

// The separate debug file read_contents() takes the .symtab from, or "" when it takes
// none (the file has its own .symtab, or no debug file is installed).
std::string debug_symtab_path(Elf *elf)
{
    Elf_Scn *scn = nullptr;
    while ((scn = elf_nextscn(elf, scn))) {
        GElf_Shdr sh;
        if (gelf_getshdr(scn, &sh) && sh.sh_type == SHT_SYMTAB)
            return {};
    }
    const std::string path = debug_file_of(build_id(elf));
    return !path.empty() && access(path.c_str(), R_OK) == 0 ? path : std::string();
}

// The table store set_table_store() was given, or null.
std::atomic<const TableStore *> g_store{nullptr};

// read_contents() of a file, through the table store when one is set: a table kept for
// the file (and its debug file) is taken instead, and one read is given to the store.
detail::LazySymbols::Contents read_file_contents(Elf *elf, const std::string &path, uint64_t bias)
{
    const TableStore *store = g_store.load(std::memory_order_acquire);
    if (store == nullptr)
        return read_contents(elf, bias);
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
void parse_elf(Elf *elf, uint64_t bias, Object &obj)
{
    size_t phnum = 0;
    if (elf_getphdrnum(elf, &phnum) == 0) {
        for (size_t i = 0; i < phnum; ++i) {
            GElf_Phdr ph;
            if (gelf_getphdr(elf, static_cast<int>(i), &ph) && ph.p_type == PT_LOAD &&
                (ph.p_flags & PF_X))
                obj.exec_ranges.emplace_back(bias + ph.p_vaddr, bias + ph.p_vaddr + ph.p_memsz);
        }
    }
    detail::LazySymbols::Contents c = read_contents(elf, bias);
    obj.contents.set(std::move(c.symbols), std::move(c.plt_ranges));
}

// Objects a Registry of this process parsed, for the others: the core and the tracer keep
// one each, and the second to refresh takes the first one's objects instead of parsing
// the same files again (libc's table is about a megabyte with its names, and a fork()
// copies the page tables of every one). Weak: an object goes with its last registry.
// Never destroyed: the control thread may symbolize a record while exit() runs the
// static destructors (a trace_pipe read formatted by the agent).
std::mutex g_shared_mu;
std::vector<std::weak_ptr<const Object>> &shared_objects() // under g_shared_mu
{
    static auto *v = new std::vector<std::weak_ptr<const Object>>();
    return *v;
}
// Serializes the lazy reading of symbols (LazySymbols::load), all objects at once.
std::mutex g_load_mu;

void forget_locks_after_fork()
{
    new (&g_shared_mu) std::mutex; // a thread that held them is not in the child
    new (&g_load_mu) std::mutex;
}

void forget_locks_at_fork()
{
    static std::once_flag once;
    std::call_once(once, [] { pthread_atfork(nullptr, nullptr, forget_locks_after_fork); });
}

// A live object another registry made for this link-map entry, or null.
std::shared_ptr<const Object> find_shared(const std::string &path, uint64_t bias, unsigned load_index,
                                          bool main_program,
                                          const std::vector<std::pair<uint64_t, uint64_t>> &exec_ranges)
{
    std::lock_guard lock(g_shared_mu);
    for (const auto &weak : shared_objects()) {
        std::shared_ptr<const Object> o = weak.lock();
        if (o && o->path == path && o->bias == bias && o->load_index == load_index &&
            o->main_program == main_program && o->exec_ranges == exec_ranges)
            return o;
    }
    return nullptr;
}

void publish_shared(const std::shared_ptr<const Object> &obj)
{
    forget_locks_at_fork();
    std::lock_guard lock(g_shared_mu);
    std::erase_if(shared_objects(), [](const auto &weak) { return weak.expired(); });
    shared_objects().push_back(obj);
}

std::shared_ptr<Object> load_file(const std::string &open_path, uint64_t bias)
{
    platform::ElfFile file;
    if (!file.open(open_path))
        return nullptr;
    auto obj = std::make_shared<Object>();
    obj->bias = bias;
    parse_elf(file.elf(), bias, *obj);
    return obj;
}

// The vdso's ELF image, [base, base + size), or {0, 0} when the kernel maps none.
std::pair<uint64_t, uint64_t> vdso_image()
{
    uint64_t base = getauxval(AT_SYSINFO_EHDR);
    if (base == 0)
        return {0, 0};
    const auto *eh = reinterpret_cast<const ElfW(Ehdr) *>(base);
    constexpr unsigned char native_class = __ELF_NATIVE_CLASS == 64 ? ELFCLASS64 : ELFCLASS32;
    if (std::memcmp(eh->e_ident, ELFMAG, SELFMAG) != 0 || eh->e_ident[EI_CLASS] != native_class)
        return {0, 0};
    // The whole file is mapped: its extent is that of the section headers or of the
    // loaded segments, whichever ends last.
    uint64_t size = eh->e_shoff + uint64_t(eh->e_shnum) * eh->e_shentsize;
    size = std::max<uint64_t>(size, eh->e_phoff + uint64_t(eh->e_phnum) * eh->e_phentsize);
    const auto *ph = reinterpret_cast<const ElfW(Phdr) *>(base + eh->e_phoff);
    for (unsigned i = 0; i < eh->e_phnum; ++i)
        size = std::max<uint64_t>(size, ph[i].p_offset + ph[i].p_filesz);
    return {base, size};
}

std::string real_path(const char *path)
{
    if (char *resolved = ::realpath(path, nullptr)) {
        std::string out = resolved;
        std::free(resolved);
        return out;
    }
    // A deleted executable: keep the link's text ("/x/prog (deleted)").
    char buf[4096];
    ssize_t n = readlink(path, buf, sizeof buf);
    return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string(path);
}

// The aliases of an object (Object::aliases) at `path`: for the main program of process
// `pid` (0: this one, whose path it was executed as is known: AT_EXECFN), else a
// library's path with its links resolved. Without duplicates of path and name.
std::vector<std::string> aliases_of(const std::string &path, bool main_program, int pid)
{
    std::vector<std::string> out;
    const auto add = [&](std::string a) {
        if (!a.empty() && a != path && a != file_name(path) && std::find(out.begin(), out.end(), a) == out.end())
            out.push_back(std::move(a));
    };
    if (!main_program) {
        add(real_path(path.c_str()));
        return out;
    }
    constexpr std::string_view kDeleted = " (deleted)";
    if (path.size() > kDeleted.size() && path.compare(path.size() - kDeleted.size(), kDeleted.size(), kDeleted) == 0) {
        const std::string before = path.substr(0, path.size() - kDeleted.size());
        add(before);
        add(file_name(before));
    }
    add("/proc/" + std::to_string(pid != 0 ? pid : getpid()) + "/exe");
    if (pid == 0) {
        add("/proc/self/exe");
        if (const auto *execfn = reinterpret_cast<const char *>(getauxval(AT_EXECFN)); execfn != nullptr) {
            add(execfn);
            add(file_name(execfn));
        }
    }
    return out;
}

// Whether MOD names object o (Registry::resolve); `real` is realpath(MOD) for a MOD
// with a '/' that leads somewhere, else empty.
bool names_object(const Object &o, std::string_view module, const std::string &real)
{
    if (o.name == module || o.path == module || (!real.empty() && o.path == real))
        return true;
    for (const std::string &a : o.aliases)
        if (a == module || (!real.empty() && a == real))
            return true;
    return false;
}

std::string real_module(std::string_view module)
{
    if (module.find('/') == std::string_view::npos)
        return {};
    const std::string text(module);
    char *resolved = ::realpath(text.c_str(), nullptr);
    if (resolved == nullptr)
        return {};
    std::string out = resolved;
    std::free(resolved);
    return out;
}

// What dl_iterate_phdr() reports about one object.
struct LinkEntry {
    std::string name;  // dlpi_name
    uint64_t bias = 0; // dlpi_addr
    bool vdso = false;
    std::vector<std::pair<uint64_t, uint64_t>> exec_ranges;
};

struct IterateContext {
    std::pair<uint64_t, uint64_t> vdso;
    std::vector<LinkEntry> *entries;
};

int collect_entry(struct dl_phdr_info *info, size_t, void *arg) noexcept
{
    auto *ctx = static_cast<IterateContext *>(arg);
    try {
        LinkEntry e;
        e.name = info->dlpi_name ? info->dlpi_name : "";
        e.bias = info->dlpi_addr;
        auto phdrs = reinterpret_cast<uint64_t>(info->dlpi_phdr);
        e.vdso = ctx->vdso.second != 0 && phdrs >= ctx->vdso.first &&
                 phdrs < ctx->vdso.first + ctx->vdso.second;
        for (unsigned i = 0; i < info->dlpi_phnum; ++i) {
            const ElfW(Phdr) &ph = info->dlpi_phdr[i];
            if (ph.p_type == PT_LOAD && (ph.p_flags & PF_X))
                e.exec_ranges.emplace_back(e.bias + ph.p_vaddr,
                                           e.bias + ph.p_vaddr + ph.p_memsz);
        }
        ctx->entries->push_back(std::move(e));
        return 0;
    } catch (...) {
        return 1; // stops the iteration; refresh() keeps its previous snapshot
    }
}

// Position of the ':' ending MOD in "MOD:sym", or npos. "::" belongs to C++ names, and
// colons inside brackets to ABI tags ("f[abi:cxx11](int)").
size_t module_separator(std::string_view spec)
{
    int depth = 0;
    for (size_t i = 0; i < spec.size(); ++i) {
        switch (spec[i]) {
        case '(': case '[': case '<': ++depth; break;
        case ')': case ']': case '>': depth -= depth > 0; break;
        case ':':
            if (depth != 0)
                break;
            if (i + 1 < spec.size() && spec[i + 1] == ':') {
                ++i;
                break;
            }
            return i;
        default: break;
        }
    }
    return npos;
}

} // namespace

// ---- LazySymbols ----------------------------------------------------------------------

void set_table_store(const TableStore *store)
{
    g_store.store(store, std::memory_order_release);
}

namespace detail {

LazySymbols::LazySymbols(const LazySymbols &other) : source_(other.source_)
{
    if (other.loaded()) {
        contents_ = other.contents_;
        loaded_.store(true, std::memory_order_release);
    }
}

LazySymbols &LazySymbols::operator=(const LazySymbols &other)
{
    if (this != &other) {
        source_ = other.source_;
        const bool loaded = other.loaded();
        contents_ = loaded ? other.contents_ : Contents{};
        loaded_.store(loaded, std::memory_order_release);
    }
    return *this;
}

void LazySymbols::set(std::vector<Symbol> symbols, std::vector<std::pair<uint64_t, uint64_t>> plt_ranges)
{
    contents_.symbols = std::move(symbols);
    contents_.plt_ranges = std::move(plt_ranges);
    loaded_.store(true, std::memory_order_release);
}

const LazySymbols::Contents &LazySymbols::load() const
{
    if (loaded())
        return contents_;
    forget_locks_at_fork();
    std::lock_guard lock(g_load_mu);
    if (loaded())
        return contents_;
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

// ---- Object -------------------------------------------------------------------------

bool Object::contains_exec(uint64_t addr) const
{
    for (const auto &[start, end] : exec_ranges) {
        if (addr >= start && addr < end)
            return true;
    }
    return false;
}

const Symbol *Object::function_at(uint64_t addr) const
{
    const std::vector<Symbol> &syms = symbols();
    try {
        detail::Tables &t = tables.get();
        std::call_once(t.ends_once, [&] {
            std::vector<uint64_t> ends(syms.size());
            uint64_t high = 0;
            for (size_t i = 0; i < syms.size(); ++i) {
                const Symbol &s = syms[i];
                if (s.function)
                    high = std::max(high, s.value + std::max<uint64_t>(s.size, 1));
                ends[i] = high;
            }
            t.ends = std::move(ends);
        });
        auto above = std::upper_bound(syms.begin(), syms.end(), addr,
                                      [](uint64_t a, const Symbol &s) { return a < s.value; });
        if (t.ends.size() != syms.size())
            return nullptr; // symbols changed after the first query
        const Symbol *best = nullptr;
        for (size_t i = static_cast<size_t>(above - syms.begin()); i-- > 0;) {
            if (t.ends[i] <= addr)
                break; // no function at or below i reaches addr
            const Symbol &s = syms[i];
            if (best && s.value != best->value)
                break;
            bool contains = s.size == 0 ? addr == s.value : addr - s.value < s.size;
            if (s.function && contains)
                best = &s; // walking down: the first of equal values wins
        }
        return best;
    } catch (...) {
        return nullptr;
    }
}

const Symbol *Object::function_at_or_before(uint64_t addr) const
{
    if (const Symbol *s = function_at(addr))
        return s;
    const std::vector<Symbol> &syms = symbols();
    auto above = std::upper_bound(syms.begin(), syms.end(), addr,
                                  [](uint64_t a, const Symbol &s) { return a < s.value; });
    const Symbol *best = nullptr;
    for (size_t i = static_cast<size_t>(above - syms.begin()); i-- > 0;) {
        const Symbol &s = syms[i];
        if (best && s.value != best->value)
            break;
        if (s.function)
            best = &s;
    }
    return best;
}

const Symbol *Object::find(std::string_view name) const
{
    if (name.empty())
        return nullptr;
    try {
        const std::vector<Symbol> &syms = symbols();
        const Symbol *data = nullptr;
        for (const Symbol &s : syms) {
            if (s.name != name)
                continue;
            if (s.function)
                return &s;
            if (!data)
                data = &s;
        }
        if (data)
            return data;

        detail::Tables &t = tables.get();
        std::call_once(t.names_once, [&] {
            std::vector<detail::NameKey> keys;
            for (size_t i = 0; i < syms.size(); ++i) {
                if (!std::string_view(syms[i].name).starts_with("_Z"))
                    continue;
                DemangledNames(syms[i].name).for_each([&](std::string_view n) {
                    keys.push_back({name_hash(n), static_cast<uint32_t>(i)});
                });
            }
            std::sort(keys.begin(), keys.end(), [](const auto &a, const auto &b) {
                return std::tie(a.hash, a.symbol) < std::tie(b.hash, b.symbol);
            });
            keys.shrink_to_fit();
            t.names = std::move(keys);
        });
        uint64_t h = name_hash(name);
        auto first = std::lower_bound(
            t.names.begin(), t.names.end(), h,
            [](const detail::NameKey &k, uint64_t v) { return k.hash < v; });
        for (auto it = first; it != t.names.end() && it->hash == h; ++it) {
            if (it->symbol >= syms.size())
                break; // symbols changed after the first query
            const Symbol &s = syms[it->symbol];
            if ((s.function || !data) && DemangledNames(s.name).matches(name)) {
                if (s.function)
                    return &s;
                data = &s;
            }
        }
        return data;
    } catch (...) {
        return nullptr;
    }
}

// ---- Registry -------------------------------------------------------------------------

Registry::Registry() = default;
Registry::~Registry() = default;

void Registry::refresh()
{
    try {
        std::vector<LinkEntry> entries;
        IterateContext ctx{vdso_image(), &entries};
        if (dl_iterate_phdr(collect_entry, &ctx) != 0)
            return;

        std::vector<std::shared_ptr<const Object>> fresh;
        fresh.reserve(entries.size());
        for (size_t i = 0; i < entries.size(); ++i) {
            LinkEntry &e = entries[i];
            bool main_program = i == 0;
            std::string path, open_path;
            if (main_program) {
                // Normally "", but names the program when run as "ld.so ./prog".
                path = real_path(e.name.empty() ? "/proc/self/exe" : e.name.c_str());
                open_path = e.name.empty() ? "/proc/self/exe" : e.name; // works if deleted
            } else if (e.vdso) {
                path = e.name.empty() ? "linux-vdso.so.1" : e.name;
            } else if (e.name.empty()) {
                continue; // nothing to read symbols from
            } else {
                path = open_path = e.name;
            }

            auto same = std::find_if(objects_.begin(), objects_.end(), [&](const auto &o) {
                return o->path == path && o->bias == e.bias;
            });
            if (same != objects_.end() && (*same)->load_index == i &&
                (*same)->main_program == main_program) {
                fresh.push_back(*same);
                continue;
            }

            if (auto shared = find_shared(path, e.bias, static_cast<unsigned>(i), main_program, e.exec_ranges)) {
                fresh.push_back(std::move(shared));
                continue;
            }
            std::shared_ptr<Object> obj;
            if (same != objects_.end()) {
                obj = std::make_shared<Object>(**same); // moved in the link map only
            } else {
                // Its symbols are read at the first question; an unreadable file gives
                // none, and the object is still an address range.
                obj = std::make_shared<Object>();
                detail::LazySymbols::Source source;
                if (e.vdso)
                    source.image = ctx.vdso;
                else
                    source.open_path = open_path;
                source.bias = e.bias;
                obj->contents = detail::LazySymbols(std::move(source));
            }
            obj->path = path;
            obj->name = file_name(path);
            obj->aliases = aliases_of(path, main_program, 0);
            obj->bias = e.bias;
            obj->main_program = main_program;
            obj->load_index = static_cast<unsigned>(i);
            obj->exec_ranges = std::move(e.exec_ranges);
            publish_shared(obj);
            fresh.push_back(std::move(obj));
        }
        objects_ = std::move(fresh);
    } catch (...) {
        // Out of memory: the previous snapshot stays.
    }
}

namespace {

// The virtual address of the first executable PT_LOAD of an ELF image, or false.
bool first_exec_vaddr(Elf *elf, uint64_t *vaddr)
{
    size_t n = 0;
    if (elf_getphdrnum(elf, &n) != 0)
        return false;
    for (size_t i = 0; i < n; ++i) {
        GElf_Phdr ph;
        if (gelf_getphdr(elf, static_cast<int>(i), &ph) != nullptr && ph.p_type == PT_LOAD &&
            (ph.p_flags & PF_X)) {
            *vaddr = ph.p_vaddr;
            return true;
        }
    }
    return false;
}

using MappedFile = Registry::ProcessMaps::File;

std::vector<MappedFile> mapped_files(int pid)
{
    std::vector<MappedFile> files;
    platform::for_each_mapping(pid, [&](const platform::Mapping &m) {
        if (!m.executable() || (!m.in_file() && m.path != "[vdso]"))
            return true;
        auto it = std::find_if(files.begin(), files.end(), [&](const MappedFile &f) { return f.path == m.path; });
        if (it == files.end()) {
            files.push_back({std::string(m.path), m.start});
            it = files.end() - 1;
        }
        it->first_exec = std::min<uint64_t>(it->first_exec, m.start);
        return true;
    });
    return files;
}

} // namespace

Registry::ProcessMaps Registry::read_maps(int pid)
{
    ProcessMaps m;
    try {
        m.files = mapped_files(pid);
        if (!m.files.empty())
            m.exe = real_path(("/proc/" + std::to_string(pid) + "/exe").c_str());
    } catch (...) {
        m = ProcessMaps{};
    }
    return m;
}

void Registry::refresh_from_maps(int pid, ProcessMaps *remembered)
{
    try {
        ProcessMaps now = read_maps(pid);
        // The process alive: its maps (and /proc/PID/exe, which opens a program deleted
        // since). Gone: the maps remembered, and the files they name.
        const bool alive = !now.files.empty();
        if (alive && remembered != nullptr)
            *remembered = now;
        const ProcessMaps &use = alive || remembered == nullptr ? now : *remembered;
        if (use.files.empty())
            return; // nothing known: the objects parsed so far stay
        load_maps(use, alive ? pid : 0, pid);
    } catch (...) {
        // Out of memory: the previous snapshot stays.
    }
}

void Registry::load_maps(const ProcessMaps &use)
{
    try {
        if (!use.files.empty())
            load_maps(use, 0, 0);
    } catch (...) {
        // Out of memory: the previous snapshot stays.
    }
}

void Registry::load_maps(const ProcessMaps &use, int alive_pid, int pid)
{
    {
        const std::string proc = "/proc/" + std::to_string(alive_pid);
        const bool alive = alive_pid != 0;
        const std::string &exe = use.exe;
        const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
        std::vector<MappedFile> files = use.files;
        // The main program first, as in the link map.
        std::stable_partition(files.begin(), files.end(), [&](const MappedFile &m) { return m.path == exe; });
        std::vector<std::shared_ptr<const Object>> fresh;
        for (const MappedFile &m : files) {
            const bool main_program = m.path == exe, vdso = m.path == "[vdso]";
            const std::pair<uint64_t, uint64_t> image = vdso ? vdso_image() : std::pair<uint64_t, uint64_t>{};
            std::vector<char> copy;
            platform::ElfFile elf;
            if (vdso) {
                if (image.second == 0)
                    continue;
                copy.assign(reinterpret_cast<const char *>(image.first),
                            reinterpret_cast<const char *>(image.first) + image.second);
                if (!elf.open_memory(copy.data(), copy.size()))
                    continue;
            } else if (!elf.open(main_program && alive ? proc + "/exe" : m.path)) {
                continue; // not ELF, or gone: nothing to name addresses with
            }
            uint64_t vaddr = 0;
            if (!first_exec_vaddr(elf.elf(), &vaddr))
                continue;
            const uint64_t bias = m.first_exec - vaddr / page * page;
            const std::string path = vdso ? "linux-vdso.so.1" : m.path;
            auto same = std::find_if(objects_.begin(), objects_.end(),
                                     [&](const auto &o) { return o->path == path && o->bias == bias; });
            std::shared_ptr<Object> obj;
            if (same != objects_.end() && (*same)->load_index == fresh.size() &&
                (*same)->main_program == main_program) {
                fresh.push_back(*same);
                continue;
            }
            if (same != objects_.end()) {
                obj = std::make_shared<Object>(**same);
            } else {
                obj = std::make_shared<Object>();
                parse_elf(elf.elf(), bias, *obj);
            }
            obj->path = path;
            obj->name = file_name(path);
            if (pid != 0)
                obj->aliases = aliases_of(path, main_program, pid);
            obj->bias = bias;
            obj->main_program = main_program;
            obj->load_index = static_cast<unsigned>(fresh.size());
            fresh.push_back(std::move(obj));
        }
        objects_ = std::move(fresh);
    }
}

const Object *Registry::object_at(uint64_t addr) const
{
    for (const auto &o : objects_) {
        if (o->contains_exec(addr))
            return o.get();
    }
    return nullptr;
}

namespace {

// Calls an ifunc's resolver, as the dynamic linker does on x86-64 (elf_ifunc_invoke:
// no arguments; the resolvers read the CPU features the loader set up). Not dlsym():
// it takes the loader's lock, which the agent's link-map hook runs under.
uint64_t ifunc_implementation(const Symbol &s)
{
    auto resolver = reinterpret_cast<uint64_t (*)()>(s.value);
    return resolver();
}

} // namespace

std::string_view Registry::module_of(std::string_view spec)
{
    const size_t colon = module_separator(spec);
    return colon == npos ? std::string_view() : spec.substr(0, colon);
}

bool Registry::has_module(std::string_view module) const
{
    const std::string real = real_module(module);
    for (const auto &o : objects_)
        if (names_object(*o, module, real))
            return true;
    return false;
}

int Registry::resolve(std::string_view spec, uint64_t offset, uint64_t *addr, SkipFn skip,
                      bool call_resolvers) const
{
    if (!addr)
        return -EINVAL;
    std::string_view module, name = spec;
    size_t colon = module_separator(spec);
    if (colon != npos) {
        module = spec.substr(0, colon);
        name = spec.substr(colon + 1);
        if (module.empty())
            return -EINVAL;
    }
    if (name.empty())
        return -EINVAL;

    int ifunc_error = 0;
    auto try_object = [&](const Object &o) {
        const Symbol *s = o.find(name);
        if (!s)
            return false;
        *addr = s->value + offset;
        // An ifunc's symbol value is its resolver; the code that runs is what the
        // resolver chooses.
        if (s->ifunc) {
            if (!call_resolvers)
                ifunc_error = -EAGAIN;
            else if (uint64_t impl = ifunc_implementation(*s); impl != 0)
                *addr = impl + offset;
        }
        return true;
    };
    if (!module.empty()) {
        const std::string real = real_module(module);
        for (const auto &o : objects_) {
            if (names_object(*o, module, real) && try_object(*o))
                return ifunc_error;
        }
        return -ENOENT;
    }
    auto try_unqualified = [&](const Object &o) {
        if (skip) {
            const Symbol *s = o.find(name);
            if (s && skip(o, *s))
                return false;
        }
        return try_object(o);
    };
    for (const auto &o : objects_) {
        if (o->main_program && try_unqualified(*o))
            return ifunc_error;
    }
    for (const auto &o : objects_) {
        if (!o->main_program && try_unqualified(*o))
            return ifunc_error;
    }
    return -ENOENT;
}

Registry::Location Registry::locate(uint64_t addr) const
{
    Location loc;
    loc.object = object_at(addr);
    if (!loc.object)
        return loc;
    loc.symbol = loc.object->function_at_or_before(addr);
    loc.offset = addr - (loc.symbol ? loc.symbol->value : loc.object->bias);
    return loc;
}

// ---- Free functions -------------------------------------------------------------------

std::shared_ptr<Object> load_object(const std::string &path, uint64_t bias)
{
    try {
        std::shared_ptr<Object> obj = load_file(path, bias);
        if (obj) {
            obj->path = path;
            obj->name = file_name(path);
        }
        return obj;
    } catch (...) {
        return nullptr;
    }
}

std::string demangle(std::string_view name)
{
    try {
        // Only "_Z" names: __cxa_demangle also takes bare type encodings ("i" -> "int").
        if (!name.starts_with("_Z"))
            return std::string(name);
        std::string copy(name);
        int status = 0;
        char *out = abi::__cxa_demangle(copy.c_str(), nullptr, nullptr, &status);
        if (status != 0 || !out) {
            std::free(out);
            return copy;
        }
        std::string result = out;
        std::free(out);
        return result;
    } catch (...) {
        return {};
    }
}

} // namespace ukp::sym
