// An ELF file opened read-only over libelf: the one place that opens one.
#pragma once

#include <gelf.h>
#include <libelf.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace ukp::platform {

class ElfFile {
public:
    ElfFile() = default;
    ElfFile(const ElfFile &) = delete;
    ElfFile &operator=(const ElfFile &) = delete;
    ~ElfFile();

    // Opens `path`, mapped. False, with why (if given), when it cannot be opened or is not
    // an ELF file.
    bool open(const std::string &path, std::string *why = nullptr);
    // An ELF image already in memory (not copied: it must outlive this).
    bool open_memory(char *image, size_t size, std::string *why = nullptr);

    Elf *elf() const { return elf_; }
    int fd() const { return fd_; }
    bool is_64() const { return gelf_getclass(elf_) == ELFCLASS64; }
    // The whole file's bytes; null when libelf cannot give them.
    const uint8_t *bytes(size_t *size) const;

    // Calls f(const GElf_Phdr &) for each program header.
    template <typename F>
    void for_each_segment(F &&f) const {
        size_t n = 0;
        if (elf_getphdrnum(elf_, &n) != 0) return;
        for (size_t i = 0; i < n; ++i) {
            GElf_Phdr ph;
            if (gelf_getphdr(elf_, static_cast<int>(i), &ph) != nullptr) f(ph);
        }
    }
    // Calls f(Elf_Scn *, const GElf_Shdr &) for each section.
    template <typename F>
    void for_each_section(F &&f) const {
        Elf_Scn *scn = nullptr;
        while ((scn = elf_nextscn(elf_, scn)) != nullptr) {
            GElf_Shdr sh;
            if (gelf_getshdr(scn, &sh) != nullptr) f(scn, sh);
        }
    }

    // The lowest address of a PT_LOAD segment, page-aligned down (the address the file's
    // offset 0 is mapped at, less the load bias); UINT64_MAX without one.
    uint64_t first_load_address() const;
    // Whether the file names a program interpreter (PT_INTERP): dynamically linked.
    bool has_interpreter() const;

private:
    bool opened(std::string *why);

    int fd_ = -1;
    Elf *elf_ = nullptr;
};

} // namespace ukp::platform
