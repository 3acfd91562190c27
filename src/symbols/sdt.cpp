// SDT probes: the .note.stapsdt notes <sys/sdt.h> leaves in an object (type 3, owner
// "stapsdt"; systemtap's NOTES format): for each site its address, the base the address
// was computed against (.stapsdt.base), its semaphore, and provider, name and arguments as
// strings. Read through libelf's note iterator.
#include "symbols/symbols.hpp"

#include "platform/elf_file.hpp"

#include <cstring>

namespace ukp::sym {
namespace {

constexpr uint32_t kStapsdtType = 3;

// The address of the section `name`, or 0.
uint64_t section_address(const platform::ElfFile &elf, const char *name) {
    size_t shstrndx = 0;
    if (elf_getshdrstrndx(elf.elf(), &shstrndx) != 0) return 0;
    uint64_t addr = 0;
    elf.for_each_section([&](Elf_Scn *, const GElf_Shdr &sh) {
        const char *n = elf_strptr(elf.elf(), shstrndx, sh.sh_name);
        if (n != nullptr && std::strcmp(n, name) == 0) addr = sh.sh_addr;
    });
    return addr;
}

// One note's description: pc, base and semaphore (8 bytes each in a 64-bit object), then
// provider, name and arguments, each NUL-terminated.
bool parse_note(const char *desc, size_t size, uint64_t bias, uint64_t base_section, SdtProbe *out) {
    if (size < 24) return false;
    uint64_t pc = 0, base = 0, sem = 0;
    std::memcpy(&pc, desc, 8);
    std::memcpy(&base, desc + 8, 8);
    std::memcpy(&sem, desc + 16, 8);
    const char *p = desc + 24, *end = desc + size;
    const char *strings[3];
    for (const char *&s : strings) {
        s = p;
        p = static_cast<const char *>(std::memchr(p, '\0', static_cast<size_t>(end - p)));
        if (p == nullptr) return false;
        ++p;
    }
    // A prelinked object moved its sections: the site moved with .stapsdt.base.
    const uint64_t moved = base_section != 0 && base != 0 ? base_section - base : 0;
    out->provider = strings[0];
    out->name = strings[1];
    out->args = strings[2];
    out->pc = pc + moved + bias;
    out->semaphore = sem != 0 ? sem + bias : 0;
    return true;
}

} // namespace

std::vector<SdtProbe> sdt_probes(const Object &obj) {
    std::vector<SdtProbe> out;
    platform::ElfFile elf;
    if (obj.path.empty() || obj.path == "linux-vdso.so.1" || !elf.open(obj.path) || !elf.is_64()) return out;
    const uint64_t base_section = section_address(elf, ".stapsdt.base");
    elf.for_each_section([&](Elf_Scn *scn, const GElf_Shdr &sh) {
        if (sh.sh_type != SHT_NOTE) return;
        Elf_Data *data = elf_getdata(scn, nullptr);
        if (data == nullptr) return;
        GElf_Nhdr nh;
        size_t name_at = 0, desc_at = 0;
        for (size_t off = 0; (off = gelf_getnote(data, off, &nh, &name_at, &desc_at)) > 0;) {
            const char *bytes = static_cast<const char *>(data->d_buf);
            if (nh.n_type != kStapsdtType || nh.n_namesz != 8 || std::memcmp(bytes + name_at, "stapsdt", 8) != 0)
                continue;
            SdtProbe probe;
            if (parse_note(bytes + desc_at, nh.n_descsz, obj.bias, base_section, &probe))
                out.push_back(std::move(probe));
        }
    });
    return out;
}

} // namespace ukp::sym
