#include "platform/elf_file.hpp"

#include <cerrno>
#include <algorithm>
#include <cstring>
#include <fcntl.h>
#include <unistd.h>

namespace ukp::platform {
namespace {

bool libelf_ready() {
    static const bool ready = elf_version(EV_CURRENT) != EV_NONE;
    return ready;
}

void say(std::string *why, const char *what) {
    if (why != nullptr) *why = what;
}

} // namespace

ElfFile::~ElfFile() {
    if (elf_ != nullptr) elf_end(elf_);
    if (fd_ >= 0) close(fd_);
}

bool ElfFile::opened(std::string *why) {
    if (elf_ == nullptr || elf_kind(elf_) != ELF_K_ELF) {
        say(why, "not an ELF file");
        return false;
    }
    return true;
}

bool ElfFile::open(const std::string &path, std::string *why) {
    if (!libelf_ready()) {
        say(why, "libelf initialization failed");
        return false;
    }
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) {
        say(why, std::strerror(errno));
        return false;
    }
    elf_ = elf_begin(fd_, ELF_C_READ_MMAP, nullptr);
    return opened(why);
}

bool ElfFile::open_memory(char *image, size_t size, std::string *why) {
    if (!libelf_ready()) {
        say(why, "libelf initialization failed");
        return false;
    }
    elf_ = elf_memory(image, size);
    return opened(why);
}

const uint8_t *ElfFile::bytes(size_t *size) const {
    *size = 0;
    return elf_ == nullptr ? nullptr : reinterpret_cast<const uint8_t *>(elf_rawfile(elf_, size));
}

uint64_t ElfFile::first_load_address() const {
    uint64_t first = UINT64_MAX;
    for_each_segment([&](const GElf_Phdr &ph) {
        if (ph.p_type == PT_LOAD)
            first = std::min<uint64_t>(first, ph.p_vaddr & ~((ph.p_align != 0 ? ph.p_align : 1) - 1));
    });
    return first;
}

bool ElfFile::has_interpreter() const {
    bool interp = false;
    for_each_segment([&](const GElf_Phdr &ph) { interp = interp || ph.p_type == PT_INTERP; });
    return interp;
}

} // namespace ukp::platform
