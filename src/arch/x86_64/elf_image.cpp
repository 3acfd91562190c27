// ElfImage: an ELF file read as its loaded image.
#include "arch/x86_64/region.hpp"

#include <algorithm>
#include <cstring>

namespace ukp::arch {

std::unique_ptr<ElfImage> ElfImage::open(const std::string &path, uint64_t bias, std::string *error) {
    auto fail = [&](const std::string &why) -> std::unique_ptr<ElfImage> {
        if (error != nullptr) *error = path + ": " + why;
        return nullptr;
    };
    try {
        std::unique_ptr<ElfImage> img(new ElfImage());
        img->bias_ = bias;
        std::string why;
        if (!img->elf_.open(path, &why)) return fail(why);
        Elf *elf = img->elf_.elf();
        if (!img->elf_.is_64()) return fail("not a 64-bit ELF file");
        img->file_ = img->elf_.bytes(&img->file_size_);
        if (img->file_ == nullptr) return fail(std::string("cannot map: ") + elf_errmsg(-1));
        size_t phnum = 0;
        if (elf_getphdrnum(elf, &phnum) != 0) return fail("no program headers");
        for (size_t i = 0; i < phnum; ++i) {
            GElf_Phdr ph;
            if (!gelf_getphdr(elf, static_cast<int>(i), &ph)) return fail("unreadable program header");
            if (ph.p_type == PT_LOAD) {
                if (ph.p_offset > img->file_size_ || ph.p_filesz > img->file_size_ - ph.p_offset ||
                    ph.p_filesz > ph.p_memsz) {
                    return fail("PT_LOAD segment outside the file");
                }
                img->segments_.push_back({ph.p_vaddr, ph.p_filesz, ph.p_memsz, ph.p_offset});
            } else if (ph.p_type == PT_GNU_EH_FRAME) {
                img->eh_frame_hdr_ = bias + ph.p_vaddr;
            }
        }
        return img;
    } catch (...) {
        return fail("out of memory");
    }
}

ElfImage::~ElfImage() = default;

bool ElfImage::read(uint64_t addr, void *out, size_t n) const {
    const uint64_t vaddr = addr - bias_;
    for (const Segment &s : segments_) {
        if (vaddr < s.vaddr || vaddr - s.vaddr > s.memsz || n > s.memsz - (vaddr - s.vaddr)) continue;
        const uint64_t at = vaddr - s.vaddr;
        const uint64_t from_file = at >= s.filesz ? 0 : std::min<uint64_t>(n, s.filesz - at);
        if (from_file != 0) std::memcpy(out, file_ + s.offset + at, from_file);
        std::memset(static_cast<uint8_t *>(out) + from_file, 0, n - from_file);
        return true;
    }
    return false;
}

const uint8_t *ElfImage::bytes(uint64_t addr, size_t n) const {
    const uint64_t vaddr = addr - bias_;
    for (const Segment &s : segments_) {
        if (vaddr < s.vaddr || vaddr - s.vaddr > s.filesz || n > s.filesz - (vaddr - s.vaddr)) continue;
        return file_ + s.offset + (vaddr - s.vaddr);
    }
    return nullptr;
}

ReadFn ElfImage::reader() const {
    return [this](uint64_t addr, void *out, size_t n) { return read(addr, out, n); };
}

} // namespace ukp::arch
