// Function types from DWARF through elfutils' libdw. The debug information is where
// Debian puts it (the object's own sections, /usr/lib/debug/.build-id/NN/REST.debug, or
// the .gnu_debuglink name beside the object or under /usr/lib/debug), found here rather
// than by libdwfl, whose files stay mapped in the program. The function's DIE is found by
// address (the CU through .debug_aranges, then the scopes at the entry), not by name:
// glibc's `read` is `__libc_read` in its DWARF.
#include "symbols/dwarf.hpp"

#include <dwarf.h>
#include <elf.h>
#include <elfutils/libdw.h>
#include <fcntl.h>
#include <gelf.h>
#include <libelf.h>
#include <unistd.h>

#include <fmt/core.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>

namespace ukp::sym {
namespace {

// x86-64 System V: integer and pointer parameters take the next of six registers, then
// the stack; $argN reads the Nth of those (the stack ones above the return address).
constexpr int kMaxFloatRegs = 8;

// One object's debug information, read for the process's life (a definition made again
// finds it read).
struct DebugFile {
    Elf *elf = nullptr;
    Dwarf *dwarf = nullptr;
    // Structs by name (typecasts), found or not: each name is looked for once.
    std::map<std::string, std::optional<Dwarf_Die>, std::less<>> structs;
};

// The ELF file at `path`, its section headers and the sections read here (the debug
// information's, the notes, .gnu_debuglink) in memory, its descriptor closed: nothing of
// it stays mapped in the program (its /proc/PID/maps shows the objects it loaded, not the
// agent's reading of them), no descriptor of it stays for the program to close or reuse,
// and the code and data of a program with its own debug information are not read.
Elf *read_elf(const std::string &path) {
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return nullptr;
    Elf *elf = elf_begin(fd, ELF_C_READ, nullptr);
    size_t shstrndx = 0;
    if (elf != nullptr && (elf_kind(elf) != ELF_K_ELF || elf_getshdrstrndx(elf, &shstrndx) != 0)) {
        elf_end(elf);
        elf = nullptr;
    }
    for (Elf_Scn *scn = nullptr; elf != nullptr && (scn = elf_nextscn(elf, scn)) != nullptr;) {
        GElf_Shdr sh;
        const char *n = gelf_getshdr(scn, &sh) != nullptr ? elf_strptr(elf, shstrndx, sh.sh_name) : nullptr;
        if (n == nullptr || sh.sh_type == SHT_NOBITS) continue;
        const std::string_view name(n);
        if (sh.sh_type == SHT_NOTE || name.starts_with(".debug_") || name.starts_with(".zdebug_") ||
            name == ".gnu_debuglink")
            elf_rawdata(scn, nullptr);
    }
    if (elf != nullptr) elf_cntl(elf, ELF_C_FDDONE); // what was not read now never will be
    close(fd);
    return elf;
}

Elf_Scn *section(Elf *elf, const char *name) {
    size_t shstrndx = 0;
    if (elf_getshdrstrndx(elf, &shstrndx) != 0) return nullptr;
    for (Elf_Scn *scn = nullptr; (scn = elf_nextscn(elf, scn)) != nullptr;) {
        GElf_Shdr sh;
        const char *n = gelf_getshdr(scn, &sh) != nullptr ? elf_strptr(elf, shstrndx, sh.sh_name) : nullptr;
        if (n != nullptr && std::strcmp(n, name) == 0) return sh.sh_type == SHT_NOBITS ? nullptr : scn;
    }
    return nullptr;
}

// Where a separate debug file of `elf` (at `path`) may be, as gdb and elfutils look:
// /usr/lib/debug/.build-id/NN/REST.debug by its build-id, then its .gnu_debuglink name
// beside it, in .debug/ beside it, and under /usr/lib/debug/ with its directory.
std::vector<std::string> debug_file_candidates(Elf *elf, const std::string &path) {
    std::vector<std::string> out;
    for (Elf_Scn *scn = nullptr; (scn = elf_nextscn(elf, scn)) != nullptr;) {
        GElf_Shdr sh;
        Elf_Data *data =
            gelf_getshdr(scn, &sh) != nullptr && sh.sh_type == SHT_NOTE ? elf_getdata(scn, nullptr) : nullptr;
        if (data == nullptr) continue;
        GElf_Nhdr nh;
        size_t name_at = 0, desc_at = 0;
        for (size_t off = 0; (off = gelf_getnote(data, off, &nh, &name_at, &desc_at)) > 0;) {
            const auto *bytes = static_cast<const unsigned char *>(data->d_buf);
            if (nh.n_type != NT_GNU_BUILD_ID || nh.n_namesz != 4 || std::memcmp(bytes + name_at, "GNU", 4) != 0 ||
                nh.n_descsz < 2)
                continue;
            std::string hex;
            for (size_t i = 0; i < nh.n_descsz; ++i) hex += fmt::format("{:02x}", bytes[desc_at + i]);
            out.push_back("/usr/lib/debug/.build-id/" + hex.substr(0, 2) + "/" + hex.substr(2) + ".debug");
        }
    }
    if (Elf_Scn *link = section(elf, ".gnu_debuglink")) {
        Elf_Data *data = elf_getdata(link, nullptr);
        const char *name = data != nullptr && data->d_size > 0 ? static_cast<const char *>(data->d_buf) : nullptr;
        if (name != nullptr && memchr(name, '\0', data->d_size) != nullptr && *name != '\0') {
            const std::string dir = path.substr(0, path.rfind('/'));
            for (const std::string &c :
                 {dir + "/" + name, dir + "/.debug/" + name, "/usr/lib/debug" + dir + "/" + name})
                if (c != path) out.push_back(c);
        }
    }
    return out;
}

// The debug information of the object at `path`: its own sections, or a separate file.
// Null when there is none. Failures are kept too: a stripped library is not looked at
// again at every definition.
DebugFile *debug_file(const std::string &path) {
    static std::mutex mu;
    static auto &files = *new std::map<std::string, DebugFile>; // kept for the process's life
    std::lock_guard lock(mu);
    auto [it, fresh] = files.try_emplace(path);
    DebugFile &f = it->second;
    if (!fresh) return f.dwarf != nullptr ? &f : nullptr;
    elf_version(EV_CURRENT);
    Elf *object = read_elf(path);
    if (object == nullptr) return nullptr;
    std::vector<std::string> candidates;
    if (section(object, ".debug_info") != nullptr)
        candidates.push_back(path);
    else
        candidates = debug_file_candidates(object, path);
    elf_end(object);
    for (const std::string &c : candidates) {
        f.elf = read_elf(c);
        if (f.elf == nullptr) continue;
        f.dwarf = dwarf_begin_elf(f.elf, DWARF_C_READ, nullptr);
        if (f.dwarf != nullptr) return &f;
        elf_end(f.elf);
        f.elf = nullptr;
    }
    return nullptr;
}

// The DIE an attribute of `die` refers to (through DW_AT_abstract_origin and
// DW_AT_specification too).
bool ref_attr(Dwarf_Die *die, int name, Dwarf_Die *out) {
    Dwarf_Attribute attr;
    return dwarf_attr_integrate(die, name, &attr) != nullptr && dwarf_formref_die(&attr, out) != nullptr;
}

std::string die_name(Dwarf_Die *die) {
    Dwarf_Attribute attr;
    const char *n = dwarf_attr_integrate(die, DW_AT_name, &attr) != nullptr ? dwarf_formstring(&attr) : nullptr;
    return n != nullptr ? n : "";
}

// A type without its typedefs and qualifiers (const, volatile, restrict, atomic).
bool peeled(Dwarf_Die *type, Dwarf_Die *out) { return dwarf_peel_type(type, out) == 0; }

uint64_t die_size(Dwarf_Die *die) {
    Dwarf_Word size = 0;
    Dwarf_Attribute attr;
    if (dwarf_attr_integrate(die, DW_AT_byte_size, &attr) != nullptr && dwarf_formudata(&attr, &size) == 0) return size;
    return 0;
}

int die_encoding(Dwarf_Die *die) {
    Dwarf_Word enc = 0;
    Dwarf_Attribute attr;
    if (dwarf_attr_integrate(die, DW_AT_encoding, &attr) != nullptr && dwarf_formudata(&attr, &enc) == 0)
        return int(enc);
    return 0;
}

bool is_pointer(int tag) {
    return tag == DW_TAG_pointer_type || tag == DW_TAG_reference_type || tag == DW_TAG_rvalue_reference_type;
}

bool is_aggregate(int tag) {
    return tag == DW_TAG_structure_type || tag == DW_TAG_union_type || tag == DW_TAG_class_type;
}

// Whether a (peeled) type is a character: what char * and char [] point to.
bool is_char(Dwarf_Die *t) {
    const int enc = die_encoding(t);
    return dwarf_tag(t) == DW_TAG_base_type && die_size(t) == 1 &&
           (enc == DW_ATE_signed_char || enc == DW_ATE_unsigned_char || die_name(t) == "char");
}

// The kprobe type a scalar (peeled) type reads as, as the kernel chooses it from BTF:
// integers by size and sign, bool u8, enums by their size, pointers x64. Empty for what
// is no scalar.
std::string scalar_type(Dwarf_Die *t) {
    const int tag = dwarf_tag(t);
    if (is_pointer(tag)) return "x64";
    const uint64_t size = die_size(t);
    if (size != 1 && size != 2 && size != 4 && size != 8) return "";
    if (tag == DW_TAG_enumeration_type) {
        Dwarf_Die under, p;
        const bool sign = ref_attr(t, DW_AT_type, &under) && peeled(&under, &p) &&
                          (die_encoding(&p) == DW_ATE_signed || die_encoding(&p) == DW_ATE_signed_char);
        return fmt::format("{}{}", sign ? 's' : 'u', size * 8);
    }
    if (tag != DW_TAG_base_type) return "";
    switch (die_encoding(t)) {
    case DW_ATE_signed:
    case DW_ATE_signed_char:
        return fmt::format("s{}", size * 8);
    case DW_ATE_unsigned:
    case DW_ATE_unsigned_char:
    case DW_ATE_boolean:
    case DW_ATE_UTF:
        return fmt::format("u{}", size * 8);
    default:
        return ""; // floats
    }
}

// The member `name` of an aggregate (peeled), found through anonymous members as C finds
// it; its offset from the aggregate's start and its DIE.
bool find_member(Dwarf_Die *agg, std::string_view name, uint64_t *offset, Dwarf_Die *member) {
    Dwarf_Die child;
    if (dwarf_child(agg, &child) != 0) return false;
    do {
        if (dwarf_tag(&child) != DW_TAG_member) continue;
        Dwarf_Word at = 0;
        Dwarf_Attribute attr;
        if (dwarf_attr_integrate(&child, DW_AT_data_member_location, &attr) != nullptr)
            dwarf_formudata(&attr, &at); // a union's members have none: 0
        const std::string n = die_name(&child);
        if (n == name) {
            *offset = at;
            *member = child;
            return true;
        }
        Dwarf_Die t, p;
        if (n.empty() && ref_attr(&child, DW_AT_type, &t) && peeled(&t, &p) && is_aggregate(dwarf_tag(&p))) {
            uint64_t inner = 0;
            if (find_member(&p, name, &inner, member)) {
                *offset = at + inner;
                return true;
            }
        }
    } while (dwarf_siblingof(&child, &child) == 0);
    return false;
}

class DwarfFunction final : public FunctionTypes {
public:
    struct Param {
        std::string name;
        Dwarf_Die type{};
        bool has_type = false;
        int slot = -1; // its $argN - 1; -1: not where $argN reads (a float, a struct by value, after one)
        bool by_value_aggregate = false;
        bool unsupported = false; // a float, a 128-bit integer, or a type not known
    };

    DwarfFunction(Dwarf_Die fn) : fn_(fn) {
        Dwarf_Die ret, p;
        has_return_ = ref_attr(&fn_, DW_AT_type, &ret);
        if (has_return_) return_type_ = ret;
        // A struct returned in memory takes the first register for its address.
        int slot = has_return_ && peeled(&ret, &p) && is_aggregate(dwarf_tag(&p)) && die_size(&p) > 16 ? 1 : 0;
        int floats = 0;
        bool lost = false; // the registers' order is no longer known (a small struct by value)
        collect(&fn_, &slot, &floats, &lost);
        if (params_.empty()) {
            // An out-of-line copy whose parameters are all in its abstract origin.
            Dwarf_Die origin;
            if (ref_attr(&fn_, DW_AT_abstract_origin, &origin)) collect(&origin, &slot, &floats, &lost);
        }
    }

    std::vector<std::string> parameters() const override {
        std::vector<std::string> names;
        for (const Param &p : params_) names.push_back(p.name);
        return names;
    }

    AccessFail access(std::string_view expr, TypedAccess *out, size_t *pos) const override;

private:
    void collect(Dwarf_Die *fn, int *slot, int *floats, bool *lost) {
        Dwarf_Die child;
        if (dwarf_child(fn, &child) != 0) return;
        do {
            if (dwarf_tag(&child) != DW_TAG_formal_parameter) continue;
            Param p;
            p.name = die_name(&child);
            p.has_type = ref_attr(&child, DW_AT_type, &p.type);
            Dwarf_Die t;
            const bool known = p.has_type && peeled(&p.type, &t);
            const std::string scalar = known ? scalar_type(&t) : "";
            if (known && is_aggregate(dwarf_tag(&t))) {
                p.by_value_aggregate = true;
                if (die_size(&t) <= 16) *lost = true; // in one or two registers, or SSE ones
            } else if (!scalar.empty()) {
                p.slot = *lost ? -1 : (*slot)++;
            } else if (known && dwarf_tag(&t) == DW_TAG_base_type && die_encoding(&t) == DW_ATE_float) {
                p.unsupported = true;
                if (++*floats > kMaxFloatRegs) *lost = true; // the rest go on the stack
            } else {
                p.unsupported = true;
                *lost = true;
            }
            if (p.slot >= 6 && *floats > kMaxFloatRegs) p.slot = -1;
            params_.push_back(std::move(p));
        } while (dwarf_siblingof(&child, &child) == 0);
    }

    Dwarf_Die fn_;
    bool has_return_ = false;
    Dwarf_Die return_type_{};
    std::vector<Param> params_;
};

// A name: letters, digits, '_'; its length.
size_t name_length(std::string_view s) {
    size_t n = 0;
    while (n < s.size() && (std::isalnum(static_cast<unsigned char>(s[n])) != 0 || s[n] == '_')) ++n;
    return n;
}

// What EXPR reads from `at` on ("->FIELD", ".FIELD"...): the value so far is what `fetch`
// reads (in_memory false), or lies at `offset` from the address `fetch` reads (in_memory:
// a member reached through "->" and "."), of type `type`; or, with `cast`, a pointer to
// that struct or union whatever its own type (a typecast), which EXPR must follow by "->".
AccessFail walk(std::string fetch, bool in_memory, uint64_t offset, Dwarf_Die type, const Dwarf_Die *cast,
                std::string_view expr, size_t at, TypedAccess *out, size_t *pos) {
    const auto fail = [&](AccessFail f, size_t where) {
        *pos = where;
        return f;
    };
    const auto loaded = [&] { return in_memory ? fmt::format("+{}({})", offset, fetch) : fetch; };
    while (at < expr.size()) {
        Dwarf_Die t;
        if (cast == nullptr && !peeled(&type, &t)) return fail(AccessFail::kUnsupportedType, at);
        const bool arrow = expr.substr(at, 2) == "->";
        if (!arrow && expr[at] == '-') return fail(AccessFail::kBadHyphen, at);
        if (!arrow && expr[at] != '.') return fail(AccessFail::kNoField, at);
        const size_t field_at = at + (arrow ? 2 : 1);
        const size_t n = name_length(expr.substr(field_at));
        const std::string_view field = expr.substr(field_at, n);
        Dwarf_Die agg;
        if (cast != nullptr) {
            if (!arrow) return fail(AccessFail::kNotPointerToStruct, at);
            agg = *cast;
            cast = nullptr;
            fetch = loaded();
            in_memory = true;
            offset = 0;
        } else if (arrow) {
            Dwarf_Die pointee;
            if (!is_pointer(dwarf_tag(&t)) || !ref_attr(&t, DW_AT_type, &pointee) || !peeled(&pointee, &agg) ||
                !is_aggregate(dwarf_tag(&agg)))
                return fail(AccessFail::kNotPointerToStruct, at);
            fetch = loaded(); // the pointer's value, then the member at its offset
            in_memory = true;
            offset = 0;
        } else {
            // "." goes into a struct that lies in memory (a member of one reached by "->").
            if (!in_memory || !is_aggregate(dwarf_tag(&t))) return fail(AccessFail::kNotPointerToStruct, at);
            agg = t;
        }
        uint64_t member_offset = 0;
        Dwarf_Die member;
        if (n == 0 || !find_member(&agg, field, &member_offset, &member) || !ref_attr(&member, DW_AT_type, &type))
            return fail(AccessFail::kNoField, field_at);
        offset += member_offset;
        out->name = std::string(field);
        at = field_at + n;
    }
    if (cast != nullptr) return fail(AccessFail::kNoField, expr.size()); // a typecast reads a member
    Dwarf_Die t;
    if (!peeled(&type, &t)) return fail(AccessFail::kUnsupportedType, 0);
    const int tag = dwarf_tag(&t);
    if (tag == DW_TAG_array_type) {
        // A char array in memory: its characters are where it lies.
        Dwarf_Die elem, e;
        if (!in_memory || !ref_attr(&t, DW_AT_type, &elem) || !peeled(&elem, &e) || !is_char(&e))
            return fail(AccessFail::kUnsupportedType, 0);
        out->fetch = fmt::format("+{}({})", offset, fetch);
        out->type = "x64";
        out->stringable = true;
        out->string_fetch = out->fetch;
        return AccessFail::kNone;
    }
    if (is_aggregate(tag)) return fail(AccessFail::kStructByValue, 0);
    out->type = scalar_type(&t);
    if (out->type.empty()) return fail(AccessFail::kUnsupportedType, 0);
    out->fetch = loaded();
    Dwarf_Die pointee, p;
    if (tag == DW_TAG_pointer_type && ref_attr(&t, DW_AT_type, &pointee) && peeled(&pointee, &p) && is_char(&p)) {
        out->stringable = true;
        out->string_fetch = "+0(" + out->fetch + ")";
    }
    return AccessFail::kNone;
}

AccessFail DwarfFunction::access(std::string_view expr, TypedAccess *out, size_t *pos) const {
    const auto fail = [&](AccessFail f, size_t where) {
        *pos = where;
        return f;
    };
    if (expr.starts_with("$retval")) {
        if (!has_return_) return fail(AccessFail::kVoid, 0);
        out->name = "arg"; // the kernel's default name for $retval: argN (the caller's)
        return walk("$retval", false, 0, return_type_, nullptr, expr, 7, out, pos);
    }
    const size_t n = name_length(expr);
    const std::string_view name = expr.substr(0, n);
    const Param *p = nullptr;
    for (const Param &q : params_)
        if (q.name == name) p = &q;
    if (n == 0 || p == nullptr || !p->has_type) return fail(AccessFail::kNoVariable, 0);
    if (p->by_value_aggregate) return fail(AccessFail::kStructByValue, 0);
    if (p->unsupported) return fail(AccessFail::kUnsupportedType, 0);
    if (p->slot < 0) return fail(AccessFail::kNotInRegister, 0);
    out->name = std::string(name);
    return walk(fmt::format("$arg{}", p->slot + 1), false, 0, p->type, nullptr, expr, n, out, pos);
}

bool is_declaration(Dwarf_Die *die) {
    bool flag = false;
    Dwarf_Attribute attr;
    return dwarf_attr_integrate(die, DW_AT_declaration, &attr) != nullptr && dwarf_formflag(&attr, &flag) == 0 && flag;
}

// The struct, union or class `name` defined (not only declared) at the top of a unit of
// `dwarf`; else a typedef `name` of one (of its definition, found by its own name, where
// the typedef's unit only declares it).
bool find_struct(Dwarf *dwarf, std::string_view name, Dwarf_Die *out) {
    std::optional<Dwarf_Die> by_typedef;
    Dwarf_Off off = 0, next = 0;
    size_t header = 0;
    while (dwarf_nextcu(dwarf, off, &next, &header, nullptr, nullptr, nullptr) == 0) {
        Dwarf_Die cu, child;
        if (dwarf_offdie(dwarf, off + header, &cu) != nullptr && dwarf_child(&cu, &child) == 0) {
            do {
                const int tag = dwarf_tag(&child);
                if ((!is_aggregate(tag) && tag != DW_TAG_typedef) || die_name(&child) != name) continue;
                if (is_aggregate(tag)) {
                    if (is_declaration(&child)) continue;
                    *out = child;
                    return true;
                }
                Dwarf_Die t, agg;
                if (!by_typedef && ref_attr(&child, DW_AT_type, &t) && peeled(&t, &agg) &&
                    is_aggregate(dwarf_tag(&agg)))
                    by_typedef = agg;
            } while (dwarf_siblingof(&child, &child) == 0);
        }
        off = next;
    }
    if (!by_typedef) return false;
    if (!is_declaration(&*by_typedef)) {
        *out = *by_typedef;
        return true;
    }
    const std::string tag_name = die_name(&*by_typedef);
    return !tag_name.empty() && tag_name != name && find_struct(dwarf, tag_name, out);
}

class DwarfStructs final : public StructTypes {
public:
    explicit DwarfStructs(std::vector<DebugFile *> files) : files_(std::move(files)) {}

    AccessFail access(std::string_view type_name, std::string_view base, std::string_view expr, TypedAccess *out,
                      size_t *pos) const override {
        Dwarf_Die agg;
        if (!lookup(type_name, &agg)) {
            *pos = 0;
            return AccessFail::kNoType;
        }
        return walk(std::string(base), false, 0, agg, &agg, expr, 0, out, pos);
    }

private:
    bool lookup(std::string_view name, Dwarf_Die *out) const {
        static std::mutex mu; // the files' struct caches
        std::lock_guard lock(mu);
        for (DebugFile *f : files_) {
            auto it = f->structs.find(name);
            if (it == f->structs.end()) {
                Dwarf_Die die;
                std::optional<Dwarf_Die> found;
                if (find_struct(f->dwarf, name, &die)) found = die;
                it = f->structs.emplace(std::string(name), found).first;
            }
            if (it->second) {
                *out = *it->second;
                return true;
            }
        }
        return false;
    }

    std::vector<DebugFile *> files_;
};

} // namespace

std::shared_ptr<const StructTypes> struct_types(const std::vector<std::string> &paths) {
    std::vector<DebugFile *> files;
    for (const std::string &p : paths)
        if (DebugFile *f = debug_file(p); f != nullptr && std::find(files.begin(), files.end(), f) == files.end())
            files.push_back(f);
    if (files.empty()) return nullptr;
    return std::make_shared<DwarfStructs>(std::move(files));
}

std::shared_ptr<const FunctionTypes> function_types(const std::string &path, uint64_t file_addr) {
    DebugFile *f = debug_file(path);
    if (f == nullptr) return nullptr;
    Dwarf_Die cu;
    if (dwarf_addrdie(f->dwarf, file_addr, &cu) == nullptr) return nullptr;
    Dwarf_Die *scopes = nullptr;
    const int n = dwarf_getscopes(&cu, file_addr, &scopes);
    std::shared_ptr<const FunctionTypes> found;
    for (int i = 0; i < n && found == nullptr; ++i) {
        // The innermost subprogram at the address (an inlined call is another tag); one
        // that says where it starts must start there.
        Dwarf_Addr entry = 0;
        if (dwarf_tag(&scopes[i]) == DW_TAG_subprogram &&
            (dwarf_entrypc(&scopes[i], &entry) != 0 || entry == file_addr))
            found = std::make_shared<DwarfFunction>(scopes[i]);
    }
    free(scopes);
    return found;
}

} // namespace ukp::sym
