// Registry: the objects loaded in a process, from the link map (this process) or
// /proc/PID/maps (another), and the lookups over them.
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

constexpr size_t npos = std::string_view::npos;

std::string file_name(std::string_view path) {
    size_t slash = path.rfind('/');
    return std::string(slash == npos ? path : path.substr(slash + 1));
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

void forget_locks_after_fork() {
    new (&g_shared_mu) std::mutex; // a thread that held them is not in the child
    new (&g_load_mu) std::mutex;
}

// A live object another registry made for this link-map entry, or null.
std::shared_ptr<const Object> find_shared(const std::string &path, uint64_t bias, unsigned load_index,
                                          bool main_program,
                                          const std::vector<std::pair<uint64_t, uint64_t>> &exec_ranges) {
    std::lock_guard lock(g_shared_mu);
    for (const auto &weak : shared_objects()) {
        std::shared_ptr<const Object> o = weak.lock();
        if (o && o->path == path && o->bias == bias && o->load_index == load_index && o->main_program == main_program &&
            o->exec_ranges == exec_ranges)
            return o;
    }
    return nullptr;
}

void publish_shared(const std::shared_ptr<const Object> &obj) {
    detail::forget_locks_at_fork();
    std::lock_guard lock(g_shared_mu);
    std::erase_if(shared_objects(), [](const auto &weak) { return weak.expired(); });
    shared_objects().push_back(obj);
}

std::shared_ptr<Object> load_file(const std::string &open_path, uint64_t bias) {
    platform::ElfFile file;
    if (!file.open(open_path)) return nullptr;
    auto obj = std::make_shared<Object>();
    obj->bias = bias;
    detail::parse_elf(file.elf(), bias, *obj);
    return obj;
}

// The vdso's ELF image, [base, base + size), or {0, 0} when the kernel maps none.
std::pair<uint64_t, uint64_t> vdso_image() {
    uint64_t base = getauxval(AT_SYSINFO_EHDR);
    if (base == 0) return {0, 0};
    const auto *eh = reinterpret_cast<const ElfW(Ehdr) *>(base);
    constexpr unsigned char native_class = __ELF_NATIVE_CLASS == 64 ? ELFCLASS64 : ELFCLASS32;
    if (std::memcmp(eh->e_ident, ELFMAG, SELFMAG) != 0 || eh->e_ident[EI_CLASS] != native_class) return {0, 0};
    // The whole file is mapped: its extent is that of the section headers or of the
    // loaded segments, whichever ends last.
    uint64_t size = eh->e_shoff + uint64_t(eh->e_shnum) * eh->e_shentsize;
    size = std::max<uint64_t>(size, eh->e_phoff + uint64_t(eh->e_phnum) * eh->e_phentsize);
    const auto *ph = reinterpret_cast<const ElfW(Phdr) *>(base + eh->e_phoff);
    for (unsigned i = 0; i < eh->e_phnum; ++i) size = std::max<uint64_t>(size, ph[i].p_offset + ph[i].p_filesz);
    return {base, size};
}

std::string real_path(const char *path) {
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
std::vector<std::string> aliases_of(const std::string &path, bool main_program, int pid) {
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
bool names_object(const Object &o, std::string_view module, const std::string &real) {
    if (o.name == module || o.path == module || (!real.empty() && o.path == real)) return true;
    for (const std::string &a : o.aliases)
        if (a == module || (!real.empty() && a == real)) return true;
    return false;
}

std::string real_module(std::string_view module) {
    if (module.find('/') == std::string_view::npos) return {};
    const std::string text(module);
    char *resolved = ::realpath(text.c_str(), nullptr);
    if (resolved == nullptr) return {};
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

// The link map's counts of objects loaded and unloaded so far (dlpi_adds, dlpi_subs), as
// one object's entry tells them; false when the C library gives none.
bool link_map_counts(const dl_phdr_info *info, size_t size, unsigned long long *adds, unsigned long long *subs) {
    if (size < offsetof(dl_phdr_info, dlpi_subs) + sizeof info->dlpi_subs) return false;
    *adds = info->dlpi_adds;
    *subs = info->dlpi_subs;
    return true;
}

struct IterateContext {
    std::pair<uint64_t, uint64_t> vdso;
    std::vector<LinkEntry> *entries;
    bool counted = false; // the link map's counts are known, as the entries were read
    unsigned long long adds = 0, subs = 0;
};

int collect_entry(struct dl_phdr_info *info, size_t size, void *arg) noexcept {
    auto *ctx = static_cast<IterateContext *>(arg);
    ctx->counted = link_map_counts(info, size, &ctx->adds, &ctx->subs);
    try {
        LinkEntry e;
        e.name = info->dlpi_name ? info->dlpi_name : "";
        e.bias = info->dlpi_addr;
        auto phdrs = reinterpret_cast<uint64_t>(info->dlpi_phdr);
        e.vdso = ctx->vdso.second != 0 && phdrs >= ctx->vdso.first && phdrs < ctx->vdso.first + ctx->vdso.second;
        for (unsigned i = 0; i < info->dlpi_phnum; ++i) {
            const ElfW(Phdr) &ph = info->dlpi_phdr[i];
            if (ph.p_type == PT_LOAD && (ph.p_flags & PF_X))
                e.exec_ranges.emplace_back(e.bias + ph.p_vaddr, e.bias + ph.p_vaddr + ph.p_memsz);
        }
        ctx->entries->push_back(std::move(e));
        return 0;
    } catch (...) {
        return 1; // stops the iteration; refresh() keeps its previous snapshot
    }
}

// Position of the ':' ending MOD in "MOD:sym", or npos. "::" belongs to C++ names, and
// colons inside brackets to ABI tags ("f[abi:cxx11](int)").
size_t module_separator(std::string_view spec) {
    int depth = 0;
    for (size_t i = 0; i < spec.size(); ++i) {
        switch (spec[i]) {
        case '(':
        case '[':
        case '<':
            ++depth;
            break;
        case ')':
        case ']':
        case '>':
            depth -= depth > 0;
            break;
        case ':':
            if (depth != 0) break;
            if (i + 1 < spec.size() && spec[i + 1] == ':') {
                ++i;
                break;
            }
            return i;
        default:
            break;
        }
    }
    return npos;
}

} // namespace

namespace detail {

std::mutex &load_mutex() { return g_load_mu; }

void forget_locks_at_fork() {
    static std::once_flag once;
    std::call_once(once, [] { pthread_atfork(nullptr, nullptr, forget_locks_after_fork); });
}

} // namespace detail

// ---- Registry -------------------------------------------------------------------------

Registry::Registry() = default;
Registry::~Registry() = default;

void Registry::refresh() {
    if (from_link_map_) {
        // Nothing loaded or unloaded since: the same objects. (The registration of a probe
        // on every function of a library refreshes once per function; a whole refresh
        // resolves the main program's path again, a dozen system calls.)
        IterateContext counts{};
        dl_iterate_phdr(
            [](dl_phdr_info *info, size_t size, void *arg) {
                auto *c = static_cast<IterateContext *>(arg);
                c->counted = link_map_counts(info, size, &c->adds, &c->subs);
                return 1; // one entry tells
            },
            &counts);
        if (counts.counted && counts.adds == link_adds_ && counts.subs == link_subs_) return;
    }
    try {
        std::vector<LinkEntry> entries;
        IterateContext ctx{vdso_image(), &entries};
        if (dl_iterate_phdr(collect_entry, &ctx) != 0) return;

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

            auto same = std::find_if(objects_.begin(), objects_.end(),
                                     [&](const auto &o) { return o->path == path && o->bias == e.bias; });
            if (same != objects_.end() && (*same)->load_index == i && (*same)->main_program == main_program) {
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
        from_link_map_ = ctx.counted;
        link_adds_ = ctx.adds;
        link_subs_ = ctx.subs;
    } catch (...) {
        // Out of memory: the previous snapshot stays.
    }
}

namespace {

// The virtual address of the first executable PT_LOAD of an ELF image, or false.
bool first_exec_vaddr(Elf *elf, uint64_t *vaddr) {
    size_t n = 0;
    if (elf_getphdrnum(elf, &n) != 0) return false;
    for (size_t i = 0; i < n; ++i) {
        GElf_Phdr ph;
        if (gelf_getphdr(elf, static_cast<int>(i), &ph) != nullptr && ph.p_type == PT_LOAD && (ph.p_flags & PF_X)) {
            *vaddr = ph.p_vaddr;
            return true;
        }
    }
    return false;
}

using MappedFile = Registry::ProcessMaps::File;

std::vector<MappedFile> mapped_files(int pid) {
    std::vector<MappedFile> files;
    platform::for_each_mapping(pid, [&](const platform::Mapping &m) {
        if (!m.executable() || (!m.in_file() && m.path != "[vdso]")) return true;
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

Registry::ProcessMaps Registry::read_maps(int pid) {
    ProcessMaps m;
    try {
        m.files = mapped_files(pid);
        if (!m.files.empty()) m.exe = real_path(("/proc/" + std::to_string(pid) + "/exe").c_str());
    } catch (...) {
        m = ProcessMaps{};
    }
    return m;
}

void Registry::refresh_from_maps(int pid, ProcessMaps *remembered) {
    try {
        ProcessMaps now = read_maps(pid);
        // The process alive: its maps (and /proc/PID/exe, which opens a program deleted
        // since). Gone: the maps remembered, and the files they name.
        const bool alive = !now.files.empty();
        if (alive && remembered != nullptr) *remembered = now;
        const ProcessMaps &use = alive || remembered == nullptr ? now : *remembered;
        if (use.files.empty()) return; // nothing known: the objects parsed so far stay
        load_maps(use, alive ? pid : 0, pid);
    } catch (...) {
        // Out of memory: the previous snapshot stays.
    }
}

void Registry::load_maps(const ProcessMaps &use) {
    try {
        if (!use.files.empty()) load_maps(use, 0, 0);
    } catch (...) {
        // Out of memory: the previous snapshot stays.
    }
}

void Registry::load_maps(const ProcessMaps &use, int alive_pid, int pid) {
    from_link_map_ = false; // another process's objects, or recorded ones: refresh() reads the link map again
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
                if (image.second == 0) continue;
                copy.assign(reinterpret_cast<const char *>(image.first),
                            reinterpret_cast<const char *>(image.first) + image.second);
                if (!elf.open_memory(copy.data(), copy.size())) continue;
            } else if (!elf.open(main_program && alive ? proc + "/exe" : m.path)) {
                continue; // not ELF, or gone: nothing to name addresses with
            }
            uint64_t vaddr = 0;
            if (!first_exec_vaddr(elf.elf(), &vaddr)) continue;
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
                detail::parse_elf(elf.elf(), bias, *obj);
            }
            obj->path = path;
            obj->name = file_name(path);
            if (pid != 0) obj->aliases = aliases_of(path, main_program, pid);
            obj->bias = bias;
            obj->main_program = main_program;
            obj->load_index = static_cast<unsigned>(fresh.size());
            fresh.push_back(std::move(obj));
        }
        objects_ = std::move(fresh);
    }
}

const Object *Registry::object_at(uint64_t addr) const {
    for (const auto &o : objects_) {
        if (o->contains_exec(addr)) return o.get();
    }
    return nullptr;
}

namespace {

// Calls an ifunc's resolver, as the dynamic linker does on x86-64 (elf_ifunc_invoke:
// no arguments; the resolvers read the CPU features the loader set up). Not dlsym():
// it takes the loader's lock, which the agent's link-map hook runs under.
uint64_t ifunc_implementation(const Symbol &s) {
    auto resolver = reinterpret_cast<uint64_t (*)()>(s.value);
    return resolver();
}

} // namespace

std::string_view Registry::module_of(std::string_view spec) {
    const size_t colon = module_separator(spec);
    return colon == npos ? std::string_view() : spec.substr(0, colon);
}

bool Registry::has_module(std::string_view module) const {
    const std::string real = real_module(module);
    for (const auto &o : objects_)
        if (names_object(*o, module, real)) return true;
    return false;
}

std::vector<const Object *> Registry::objects_named(std::string_view module) const {
    std::vector<const Object *> out;
    const std::string real = module.empty() ? std::string() : real_module(module);
    for (const auto &o : objects_)
        if (module.empty() || names_object(*o, module, real)) out.push_back(o.get());
    return out;
}

int Registry::resolve(std::string_view spec, uint64_t offset, uint64_t *addr, SkipFn skip, bool call_resolvers) const {
    if (!addr) return -EINVAL;
    std::string_view module, name = spec;
    size_t colon = module_separator(spec);
    if (colon != npos) {
        module = spec.substr(0, colon);
        name = spec.substr(colon + 1);
        if (module.empty()) return -EINVAL;
    }
    if (name.empty()) return -EINVAL;

    int ifunc_error = 0;
    auto try_object = [&](const Object &o) {
        const Symbol *s = o.find(name);
        if (!s) return false;
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
            if (names_object(*o, module, real) && try_object(*o)) return ifunc_error;
        }
        return -ENOENT;
    }
    auto try_unqualified = [&](const Object &o) {
        if (skip) {
            const Symbol *s = o.find(name);
            if (s && skip(o, *s)) return false;
        }
        return try_object(o);
    };
    for (const auto &o : objects_) {
        if (o->main_program && try_unqualified(*o)) return ifunc_error;
    }
    for (const auto &o : objects_) {
        if (!o->main_program && try_unqualified(*o)) return ifunc_error;
    }
    return -ENOENT;
}

Registry::Location Registry::locate(uint64_t addr) const {
    Location loc;
    loc.object = object_at(addr);
    if (!loc.object) return loc;
    loc.symbol = loc.object->function_at_or_before(addr);
    loc.offset = addr - (loc.symbol ? loc.symbol->value : loc.object->bias);
    return loc;
}

// ---- Free functions -------------------------------------------------------------------

std::shared_ptr<Object> load_object(const std::string &path, uint64_t bias) {
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

} // namespace ukp::sym
