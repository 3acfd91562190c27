// build_object_refs(), object_refs(): every address of an object's code that something in
// the object names (region.hpp, ObjectRefs explains which and why they are all).
#include "arch/x86_64/insn.hpp"
#include "arch/x86_64/region.hpp"

#include <elf.h>
#include <fcntl.h>
#include <gelf.h>
#include <libelf.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>

namespace ukp::arch {
namespace {

#ifndef SHT_RELR
constexpr uint32_t SHT_RELR = 19;
#endif

struct Range {
    uint64_t lo, hi; // file vaddrs
    const uint8_t *bytes;
};

void sort_unique(std::vector<uint64_t> &v) {
    std::sort(v.begin(), v.end());
    v.erase(std::unique(v.begin(), v.end()), v.end());
}

class Builder {
public:
    Builder(Elf *elf, const uint8_t *file, size_t file_size, uint64_t bias, const std::atomic<bool> *stop)
        : elf_(elf), file_(file), file_size_(file_size), bias_(bias), stop_(stop) {}

    bool run(ObjectRefs *out, std::string *why) {
        GElf_Ehdr eh;
        if (!gelf_getehdr(elf_, &eh)) return fail(why, "no ELF header");
        non_pic_ = eh.e_type == ET_EXEC;
        if (eh.e_entry != 0) values_.push_back(eh.e_entry);
        size_t shnum = 0;
        if (elf_getshdrnum(elf_, &shnum) != 0 || shnum == 0) return fail(why, "no section headers");
        // Executable sections, symbols (function starts and values), data sections.
        for (Elf_Scn *scn = nullptr; (scn = elf_nextscn(elf_, scn)) != nullptr;) {
            GElf_Shdr sh;
            if (!gelf_getshdr(scn, &sh)) return fail(why, "unreadable section header");
            if ((sh.sh_flags & SHF_ALLOC) && sh.sh_type != SHT_NOBITS && sh.sh_addr != 0) {
                if (sh.sh_offset > file_size_ || sh.sh_size > file_size_ - sh.sh_offset) {
                    return fail(why, "section outside the file");
                }
                const Range r{sh.sh_addr, sh.sh_addr + sh.sh_size, file_ + sh.sh_offset};
                ((sh.sh_flags & SHF_EXECINSTR) ? exec_ : data_).push_back(r);
            }
            if (sh.sh_type == SHT_SYMTAB || sh.sh_type == SHT_DYNSYM) symbols(scn, sh);
        }
        std::sort(exec_.begin(), exec_.end(), [](const Range &a, const Range &b) { return a.lo < b.lo; });
        for (Elf_Scn *scn = nullptr; (scn = elf_nextscn(elf_, scn)) != nullptr;) {
            GElf_Shdr sh;
            if (!gelf_getshdr(scn, &sh)) return fail(why, "unreadable section header");
            if (sh.sh_type == SHT_RELA || sh.sh_type == SHT_REL) {
                if (!relocations(scn, sh)) return fail(why, "unreadable relocations");
            } else if (sh.sh_type == SHT_RELR) {
                relr(sh);
            } else if (sh.sh_type == SHT_DYNAMIC) {
                dynamic(scn, sh);
            }
        }
        // Function starts the unwind tables know (local functions of a stripped object).
        if (!fde_starts()) return fail(why, "unreadable .eh_frame_hdr");
        identity(out);
        sort_unique(starts_);
        for (const Range &r : exec_)
            if (!sweep(r)) return fail(why, "stopped");
        // Absolute code addresses in the data of a non-PIC object carry no relocation.
        if (non_pic_) {
            for (const Range &r : data_) scan_words(r);
        }
        auto keep = [&](std::vector<uint64_t> &v) {
            std::erase_if(v, [&](uint64_t a) { return !in_exec(a); });
            sort_unique(v);
            for (uint64_t &a : v) a += bias_;
        };
        keep(values_);
        keep(starts_);
        std::erase_if(branches_, [&](const auto &b) { return !in_exec(b.first); });
        std::sort(branches_.begin(), branches_.end());
        branches_.erase(std::unique(branches_.begin(), branches_.end()), branches_.end());
        for (auto &b : branches_) {
            b.first += bias_;
            b.second += bias_;
        }
        // Kept for the life of the object, and copied at every fork() (the page tables of
        // the heap): no room to spare. libc's branch list had twice its size reserved.
        values_.shrink_to_fit();
        branches_.shrink_to_fit();
        starts_.shrink_to_fit();
        out->values = std::move(values_);
        out->branches = std::move(branches_);
        out->starts = std::move(starts_);
        out->resynced_bytes = resynced_;
        return true;
    }

private:
    static bool fail(std::string *why, const char *what) {
        if (why) *why = what;
        return false;
    }

    bool in_exec(uint64_t a) const {
        auto it = std::upper_bound(exec_.begin(), exec_.end(), a, [](uint64_t v, const Range &r) { return v < r.lo; });
        return it != exec_.begin() && a < std::prev(it)->hi;
    }

    // File bytes at vaddr a, n of them, or null.
    const uint8_t *at(uint64_t a, size_t n) const {
        for (const std::vector<Range> *rs : {&exec_, &data_}) {
            for (const Range &r : *rs) {
                if (a >= r.lo && a < r.hi && n <= r.hi - a) return r.bytes + (a - r.lo);
            }
        }
        return nullptr;
    }

    bool word(uint64_t a, uint64_t *v) const {
        const uint8_t *p = at(a, 8);
        if (p == nullptr) return false;
        std::memcpy(v, p, 8);
        return true;
    }

    void symbols(Elf_Scn *scn, const GElf_Shdr &sh) {
        Elf_Data *d = elf_getdata(scn, nullptr);
        if (d == nullptr || sh.sh_entsize == 0) return;
        const size_t n = sh.sh_size / sh.sh_entsize;
        for (size_t i = 0; i < n; ++i) {
            GElf_Sym s;
            if (!gelf_getsym(d, static_cast<int>(i), &s)) break;
            if (s.st_shndx == SHN_UNDEF || s.st_value == 0 || GELF_ST_TYPE(s.st_info) == STT_TLS) continue;
            values_.push_back(s.st_value);
            if (GELF_ST_TYPE(s.st_info) == STT_FUNC || GELF_ST_TYPE(s.st_info) == STT_GNU_IFUNC) {
                starts_.push_back(s.st_value);
            }
        }
    }

    // The value a relocation's symbol has in this object, if it defines it.
    bool symbol_value(const GElf_Shdr &rel_sh, size_t sym, uint64_t *v) {
        Elf_Scn *symscn = elf_getscn(elf_, rel_sh.sh_link);
        if (symscn == nullptr) return false;
        Elf_Data *d = elf_getdata(symscn, nullptr);
        GElf_Sym s;
        if (d == nullptr || !gelf_getsym(d, static_cast<int>(sym), &s) || s.st_shndx == SHN_UNDEF ||
            GELF_ST_TYPE(s.st_info) == STT_TLS) {
            return false;
        }
        *v = s.st_value;
        return true;
    }

    // Every address a dynamic relocation may put into memory: the addend (RELATIVE,
    // IRELATIVE), symbol + addend, and the word in place (REL, a lazy PLT's GOT entries).
    bool relocations(Elf_Scn *scn, const GElf_Shdr &sh) {
        Elf_Data *d = elf_getdata(scn, nullptr);
        if (d == nullptr || sh.sh_entsize == 0) return sh.sh_size == 0;
        const size_t n = sh.sh_size / sh.sh_entsize;
        for (size_t i = 0; i < n; ++i) {
            uint64_t offset = 0, info = 0;
            int64_t addend = 0;
            if (sh.sh_type == SHT_RELA) {
                GElf_Rela r;
                if (!gelf_getrela(d, static_cast<int>(i), &r)) return false;
                offset = r.r_offset;
                info = r.r_info;
                addend = r.r_addend;
                values_.push_back(static_cast<uint64_t>(addend));
            } else {
                GElf_Rel r;
                if (!gelf_getrel(d, static_cast<int>(i), &r)) return false;
                offset = r.r_offset;
                info = r.r_info;
            }
            if (uint64_t w; word(offset, &w)) values_.push_back(w);
            const size_t sym = GELF_R_SYM(info);
            if (uint64_t v; sym != 0 && symbol_value(sh, sym, &v)) values_.push_back(v + static_cast<uint64_t>(addend));
        }
        return true;
    }

    // SHT_RELR: packed RELATIVE relocations; the addend is the word in place.
    void relr(const GElf_Shdr &sh) {
        const uint8_t *p =
            sh.sh_offset <= file_size_ && sh.sh_size <= file_size_ - sh.sh_offset ? file_ + sh.sh_offset : nullptr;
        if (p == nullptr) return;
        uint64_t where = 0;
        for (size_t i = 0; i + 8 <= sh.sh_size; i += 8) {
            uint64_t e;
            std::memcpy(&e, p + i, 8);
            if ((e & 1) == 0) {
                where = e;
                if (uint64_t w; word(where, &w)) values_.push_back(w);
                where += 8;
            } else {
                for (uint64_t b = 0; (e >>= 1) != 0; ++b) {
                    if ((e & 1) != 0) {
                        if (uint64_t w; word(where + b * 8, &w)) values_.push_back(w);
                    }
                }
                where += 63 * 8;
            }
        }
    }

    // DT_INIT/DT_FINI: called by the dynamic linker, no relocation names them.
    void dynamic(Elf_Scn *scn, const GElf_Shdr &sh) {
        Elf_Data *d = elf_getdata(scn, nullptr);
        if (d == nullptr || sh.sh_entsize == 0) return;
        for (size_t i = 0; i < sh.sh_size / sh.sh_entsize; ++i) {
            GElf_Dyn dyn;
            if (!gelf_getdyn(d, static_cast<int>(i), &dyn)) break;
            if (dyn.d_tag == DT_INIT || dyn.d_tag == DT_FINI) values_.push_back(dyn.d_un.d_ptr);
        }
    }

    // Initial locations of the .eh_frame_hdr search table (pcrel|sdata4 frame pointer,
    // udata4 count, datarel|sdata4 table: what GNU ld, gold and lld write).
    bool fde_starts() {
        size_t phnum = 0;
        if (elf_getphdrnum(elf_, &phnum) != 0) return false;
        for (size_t i = 0; i < phnum; ++i) {
            GElf_Phdr ph;
            if (!gelf_getphdr(elf_, static_cast<int>(i), &ph) || ph.p_type != PT_GNU_EH_FRAME) continue;
            const uint8_t *h = at(ph.p_vaddr, 12);
            if (h == nullptr || h[0] != 1) return false;
            if (h[3] == 0xff) return true; // no search table: no FDE starts to add
            if (h[1] != 0x1b || h[2] != 0x03 || h[3] != 0x3b) return false;
            uint32_t count;
            std::memcpy(&count, h + 8, 4);
            const uint8_t *t = at(ph.p_vaddr + 12, static_cast<size_t>(count) * 8);
            if (t == nullptr) return false;
            for (uint32_t k = 0; k < count; ++k) {
                int32_t loc;
                std::memcpy(&loc, t + k * 8, 4);
                starts_.push_back(ph.p_vaddr + static_cast<uint64_t>(static_cast<int64_t>(loc)));
            }
        }
        return true;
    }

    // The build-id note's bytes, else the first bytes of .eh_frame_hdr (they change with
    // the code's layout), else none.
    void identity(ObjectRefs *out) {
        size_t phnum = 0;
        if (elf_getphdrnum(elf_, &phnum) != 0) return;
        uint64_t hdr = 0;
        for (size_t i = 0; i < phnum; ++i) {
            GElf_Phdr ph;
            if (!gelf_getphdr(elf_, static_cast<int>(i), &ph)) continue;
            if (ph.p_type == PT_GNU_EH_FRAME) hdr = ph.p_vaddr;
            if (ph.p_type != PT_NOTE) continue;
            for (uint64_t at = 0; at + 12 <= ph.p_filesz;) {
                const uint8_t *n = ph.p_offset + at + 12 <= file_size_ ? file_ + ph.p_offset + at : nullptr;
                if (n == nullptr) break;
                uint32_t namesz, descsz, type;
                std::memcpy(&namesz, n, 4);
                std::memcpy(&descsz, n + 4, 4);
                std::memcpy(&type, n + 8, 4);
                const uint64_t desc = at + 12 + ((namesz + 3) & ~3u);
                if (type == NT_GNU_BUILD_ID && namesz == 4 && desc + descsz <= ph.p_filesz &&
                    ph.p_offset + desc + descsz <= file_size_ && std::memcmp(n + 12, "GNU", 4) == 0) {
                    out->identity_addr = ph.p_vaddr + desc + bias_;
                    out->identity.assign(file_ + ph.p_offset + desc, file_ + ph.p_offset + desc + descsz);
                    return;
                }
                at = desc + ((descsz + 3) & ~3u);
            }
        }
        if (const uint8_t *h = hdr != 0 ? at(hdr, 64) : nullptr) {
            out->identity_addr = hdr + bias_;
            out->identity.assign(h, h + 64);
        }
    }

    void collect(const Insn &in) {
        if (in.target != 0) branches_.emplace_back(in.target, in.addr); // jmp, jcc, call, loop, xbegin
        if (in.zi.mnemonic == ZYDIS_MNEMONIC_LEA && in.rip_relative) values_.push_back(in.rip_target);
        if (!non_pic_) return;
        for (int i = 0; i < in.zi.operand_count_visible; ++i) {
            const ZydisDecodedOperand &op = in.ops[i];
            if (op.type == ZYDIS_OPERAND_TYPE_IMMEDIATE) values_.push_back(op.imm.value.u);
            if (op.type == ZYDIS_OPERAND_TYPE_MEMORY && op.mem.base == ZYDIS_REGISTER_NONE) {
                values_.push_back(static_cast<uint64_t>(op.mem.disp.value));
            }
        }
    }

    // Every instruction that starts at any byte of [lo, hi): a superset of the real ones.
    void superset(const Range &r, uint64_t lo, uint64_t hi) {
        resynced_ += hi - lo;
        for (uint64_t a = lo; a < hi; ++a) {
            uint8_t len = 0;
            decode_collect(r, a, &len);
        }
    }

    // Decodes the instruction at a and collects what it references: the light decode,
    // unless the object is not PIC (its immediates and absolute displacements count too).
    bool decode_collect(const Range &r, uint64_t a, uint8_t *len) {
        if (non_pic_) {
            Insn in;
            if (decode(a, r.bytes + (a - r.lo), r.hi - a, &in) != 0) return false;
            collect(in);
            *len = in.len;
            return true;
        }
        SweepInsn in;
        if (sweep_decoder_.decode(a, r.bytes + (a - r.lo), r.hi - a, &in) != 0) return false;
        if (in.target != 0) branches_.emplace_back(in.target, a);
        if (in.lea_target != 0) values_.push_back(in.lea_target);
        *len = in.len;
        return true;
    }

    // Linear sweep of r, in step again at every function start; bytes that do not decode,
    // or whose decode runs across a function start, are decoded at every offset instead.
    // False if *stop_ was set meanwhile (looked at every 64 KiB or so of code).
    bool sweep(const Range &r) {
        auto next = std::upper_bound(starts_.begin(), starts_.end(), r.lo);
        uint64_t a = r.lo, look_at = a;
        while (a < r.hi) {
            if (a >= look_at) {
                if (stop_ != nullptr && stop_->load(std::memory_order_relaxed)) return false;
                look_at = a + (64u << 10);
            }
            while (next != starts_.end() && *next <= a) ++next;
            const uint64_t limit = next != starts_.end() && *next < r.hi ? *next : r.hi;
            // Collected before the length is known to fit: superset() would collect the
            // same instruction at a again (the lists are made unique afterwards).
            uint8_t len = 0;
            if (!decode_collect(r, a, &len) || a + len > limit) {
                superset(r, a, limit);
                a = limit;
                continue;
            }
            a += len;
        }
        return true;
    }

    void scan_words(const Range &r) {
        for (uint64_t a = r.lo; a + 4 <= r.hi; ++a) {
            uint32_t v4;
            std::memcpy(&v4, r.bytes + (a - r.lo), 4);
            if (in_exec(v4)) values_.push_back(v4);
            if (a + 8 <= r.hi) {
                uint64_t v8;
                std::memcpy(&v8, r.bytes + (a - r.lo), 8);
                if (in_exec(v8)) values_.push_back(v8);
            }
        }
    }

    Elf *elf_;
    const uint8_t *file_;
    size_t file_size_;
    uint64_t bias_;
    const std::atomic<bool> *stop_;
    bool non_pic_ = false;
    std::vector<Range> exec_, data_;
    std::vector<uint64_t> values_, starts_;
    std::vector<std::pair<uint64_t, uint64_t>> branches_;
    uint64_t resynced_ = 0;
    SweepDecoder sweep_decoder_;
};

bool any_between(const std::vector<uint64_t> &sorted, uint64_t lo, uint64_t hi) {
    auto it = std::upper_bound(sorted.begin(), sorted.end(), lo);
    return it != sorted.end() && *it < hi;
}

} // namespace

bool ObjectRefs::any_in(uint64_t lo, uint64_t hi) const {
    if (any_between(values, lo, hi)) return true;
    auto it = std::upper_bound(branches.begin(), branches.end(), std::pair<uint64_t, uint64_t>{lo, ~uint64_t{0}});
    return it != branches.end() && it->first < hi;
}

bool ObjectRefs::reached_from_outside(uint64_t addr, uint64_t fn_lo, uint64_t fn_hi) const {
    if (std::binary_search(values.begin(), values.end(), addr)) return true;
    for (auto it = std::lower_bound(branches.begin(), branches.end(), std::pair<uint64_t, uint64_t>{addr, 0});
         it != branches.end() && it->first == addr; ++it) {
        if (it->second < fn_lo || it->second >= fn_hi) return true;
    }
    return false;
}

bool ObjectRefs::value_in(uint64_t lo, uint64_t hi) const { return any_between(values, lo, hi); }

uint64_t ObjectRefs::next_start(uint64_t addr) const {
    auto it = std::upper_bound(starts.begin(), starts.end(), addr);
    return it == starts.end() ? ~0ull : *it;
}

std::shared_ptr<const ObjectRefs> build_object_refs(const std::string &path, uint64_t bias, std::string *error,
                                                    const std::atomic<bool> *stop) {
    auto fail = [&](const std::string &why) -> std::shared_ptr<const ObjectRefs> {
        if (error != nullptr) *error = path + ": " + why;
        return nullptr;
    };
    try {
        platform::ElfFile elf;
        std::string why;
        if (!elf.open(path, &why)) return fail(why);
        size_t size = 0;
        const uint8_t *file = elf.bytes(&size);
        if (!elf.is_64() || file == nullptr) return fail("not a readable 64-bit ELF file");
        auto refs = std::make_shared<ObjectRefs>();
        if (!Builder(elf.elf(), file, size, bias, stop).run(refs.get(), &why)) return fail(why);
        return refs;
    } catch (...) {
        return fail("out of memory");
    }
}

namespace {

using RefsCache = std::map<std::pair<std::string, uint64_t>, std::shared_ptr<const ObjectRefs>>;
std::mutex &refs_mutex() {
    static auto *mu = new std::mutex(); // never destroyed: probes outlive static destructors
    return *mu;
}
RefsCache &refs_cache() {
    static auto *cache = new RefsCache();
    return *cache;
}

} // namespace

void forget_object_refs(uint64_t bias) {
    std::lock_guard<std::mutex> lock(refs_mutex());
    std::erase_if(refs_cache(), [bias](const auto &entry) { return entry.first.second == bias; });
}

size_t object_refs_cached() {
    std::lock_guard<std::mutex> lock(refs_mutex());
    return refs_cache().size();
}

namespace {

// object_refs() and object_refs_if_known(): `build` says whether a table found neither in
// memory nor on disk is built.
std::shared_ptr<const ObjectRefs> kept_refs(const std::string &path, uint64_t bias, const ReadFn &read, bool build,
                                            const std::atomic<bool> *stop, bool *known) {
    std::mutex &mu = refs_mutex();
    RefsCache *cache = &refs_cache();
    std::shared_ptr<const ObjectRefs> refs;
    const auto key = std::make_pair(path, bias);
    bool cached = false;
    {
        std::lock_guard<std::mutex> lock(mu);
        if (auto it = cache->find(key); it != cache->end()) {
            refs = it->second;
            cached = true;
        }
    }
    if (!cached) {
        // Built without the lock (a second or so for libc): a fork() meanwhile leaves the
        // child a free lock, and users of other objects do not wait. Two threads may build
        // the same table at once; the first to finish stays.
        refs = load_cached_refs(path, bias);
        if (!refs) {
            if (!build) {
                *known = false;
                return nullptr;
            }
            refs = build_object_refs(path, bias, nullptr, stop);
            if (refs) {
                store_cached_refs(path, bias, *refs);
            } else if (stop != nullptr && stop->load()) {
                *known = false; // stopped, not failed: nothing to remember
                return nullptr;
            }
        }
        std::lock_guard<std::mutex> lock(mu);
        refs = cache->emplace(key, refs).first->second; // a failure is remembered too
    }
    *known = true;
    // The file at path may not be what is loaded at bias (replaced since, or another object
    // loaded there after a dlclose): checked at every use.
    if (refs && !refs->identity.empty()) {
        std::vector<uint8_t> mem(refs->identity.size());
        if (!read || !read(refs->identity_addr, mem.data(), mem.size()) || mem != refs->identity) return nullptr;
    }
    return refs;
}

} // namespace

std::shared_ptr<const ObjectRefs> object_refs(const std::string &path, uint64_t bias, const ReadFn &read,
                                              const std::atomic<bool> *stop) {
    bool known = false;
    return kept_refs(path, bias, read, true, stop, &known);
}

std::shared_ptr<const ObjectRefs> object_refs_if_known(const std::string &path, uint64_t bias, const ReadFn &read,
                                                       bool *known) {
    return kept_refs(path, bias, read, false, nullptr, known);
}

} // namespace ukp::arch
