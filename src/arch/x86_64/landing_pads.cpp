// landing_pads(): where exceptions land in a function, from .eh_frame and the LSDAs.
#include "arch/x86_64/region.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <new>

namespace ukp::arch {

namespace {

// DW_EH_PE_* (LSB "Linux Standard Base Core Specification", .eh_frame pointer encodings).
constexpr uint8_t kPeOmit = 0xff;
constexpr uint8_t kPeAbsptr = 0x00, kPeUleb128 = 0x01, kPeUdata2 = 0x02, kPeUdata4 = 0x03, kPeUdata8 = 0x04,
                  kPeSleb128 = 0x09, kPeSdata2 = 0x0a, kPeSdata4 = 0x0b, kPeSdata8 = 0x0c;
constexpr uint8_t kPePcrel = 0x10, kPeDatarel = 0x30;
constexpr uint8_t kPeIndirect = 0x80;
// Sanity limits: no real table comes near them; a corrupt one stops here.
constexpr uint64_t kMaxFdeCount = 1u << 24;
constexpr uint64_t kMaxCallSiteTable = 1u << 20;
constexpr uint64_t kLsdaWindow = 1u << 24;

// A bounds-checked reader over [pos, end) through a ReadFn; the first failure sticks.
class Cursor {
public:
    Cursor(const ReadFn &read, uint64_t pos, uint64_t end) : read_(read), pos_(pos), end_(end) {}
    uint64_t pos() const { return pos_; }
    int error() const { return error_; }
    const char *what() const { return what_; }
    void fail(int err, const char *what) {
        if (error_ == 0) {
            error_ = err;
            what_ = what;
        }
    }
    bool get(void *out, size_t n) {
        if (error_ != 0) return false;
        if (pos_ > end_ || n > end_ - pos_) {
            fail(-EPROTO, "record runs past its end");
            return false;
        }
        if (!read_(pos_, out, n)) {
            fail(-EFAULT, "unreadable address");
            return false;
        }
        pos_ += n;
        return true;
    }
    template <class T>
    T get() {
        T v{};
        get(&v, sizeof(v));
        return v;
    }
    uint64_t uleb() {
        uint64_t v = 0;
        for (unsigned shift = 0; shift < 64; shift += 7) {
            const uint8_t b = get<uint8_t>();
            if (error_ != 0) return 0;
            v |= static_cast<uint64_t>(b & 0x7f) << shift;
            if (!(b & 0x80)) return v;
        }
        fail(-EPROTO, "LEB128 longer than 64 bits");
        return 0;
    }
    int64_t sleb() {
        int64_t v = 0;
        for (unsigned shift = 0; shift < 64; shift += 7) {
            const uint8_t b = get<uint8_t>();
            if (error_ != 0) return 0;
            v |= static_cast<int64_t>(static_cast<uint64_t>(b & 0x7f) << shift);
            if (!(b & 0x80)) {
                // Sign extension as an unsigned mask: negating 1 << 63 would overflow.
                if (shift + 7 < 64 && (b & 0x40)) v |= static_cast<int64_t>(~uint64_t{0} << (shift + 7));
                return v;
            }
        }
        fail(-EPROTO, "LEB128 longer than 64 bits");
        return 0;
    }
    // A DW_EH_PE-encoded pointer. `datarel` is the DW_EH_PE_datarel base (0: not allowed).
    // A raw 0 stays 0 (a null pointer), as libgcc reads it.
    uint64_t pointer(uint8_t enc, uint64_t datarel = 0) {
        const uint64_t field = pos_;
        uint64_t v = 0;
        switch (enc & 0x0f) {
        case kPeAbsptr:
            v = get<uint64_t>();
            break;
        case kPeUleb128:
            v = uleb();
            break;
        case kPeUdata2:
            v = get<uint16_t>();
            break;
        case kPeUdata4:
            v = get<uint32_t>();
            break;
        case kPeUdata8:
            v = get<uint64_t>();
            break;
        case kPeSleb128:
            v = static_cast<uint64_t>(sleb());
            break;
        case kPeSdata2:
            v = static_cast<uint64_t>(static_cast<int64_t>(get<int16_t>()));
            break;
        case kPeSdata4:
            v = static_cast<uint64_t>(static_cast<int64_t>(get<int32_t>()));
            break;
        case kPeSdata8:
            v = get<uint64_t>();
            break;
        default:
            fail(-EPROTO, "unknown pointer encoding format");
            return 0;
        }
        if (error_ != 0 || v == 0) return v;
        switch (enc & 0x70) {
        case 0:
            break;
        case kPePcrel:
            v += field;
            break;
        case kPeDatarel:
            if (datarel == 0) {
                fail(-EPROTO, "datarel pointer where no data base is defined");
                return 0;
            }
            v += datarel;
            break;
        default:
            fail(-EPROTO, "unsupported pointer encoding base (textrel/funcrel/aligned)");
            return 0;
        }
        if (enc & kPeIndirect) {
            uint64_t p = 0;
            if (!read_(v, &p, sizeof(p))) {
                fail(-EFAULT, "unreadable indirect pointer");
                return 0;
            }
            v = p;
        }
        return v;
    }
    // Only the size of an encoding: for pc_range, which has the FDE encoding's format but
    // no base.
    uint64_t value(uint8_t enc) { return pointer(static_cast<uint8_t>(enc & 0x0f)); }
    void skip(uint64_t n) {
        if (error_ == 0 && (pos_ > end_ || n > end_ - pos_))
            fail(-EPROTO, "record runs past its end");
        else
            pos_ += n;
    }

private:
    const ReadFn &read_;
    uint64_t pos_, end_;
    int error_ = 0;
    const char *what_ = nullptr;
};

// Reads a CIE/FDE length field; sets *body (first byte after it) and *end.
bool record_bounds(Cursor &c, uint64_t *end) {
    uint64_t len = c.get<uint32_t>();
    if (len == 0xffffffffu) len = c.get<uint64_t>();
    if (c.error() != 0) return false;
    if (len == 0) {
        c.fail(-EPROTO, "zero-length record (terminator) where an FDE was expected");
        return false;
    }
    *end = c.pos() + len;
    return true;
}

struct CieInfo {
    uint8_t fde_enc = kPeAbsptr;
    uint8_t lsda_enc = kPeOmit;
    bool has_z = false;
};

int parse_cie(const ReadFn &read, uint64_t cie, CieInfo *out, std::string *why) {
    Cursor c(read, cie, ~0ull);
    uint64_t end = 0;
    if (!record_bounds(c, &end)) {
        if (why) *why = std::string(c.what()) + " in CIE";
        return c.error();
    }
    Cursor b(read, c.pos(), end);
    if (b.get<uint32_t>() != 0 && b.error() == 0) b.fail(-EPROTO, "CIE pointer of an FDE leads to no CIE");
    const uint8_t version = b.get<uint8_t>();
    if (b.error() == 0 && version != 1 && version != 3) b.fail(-EPROTO, "CIE version not 1 or 3");
    char aug[16];
    size_t n = 0;
    while (b.error() == 0) {
        const char ch = static_cast<char>(b.get<uint8_t>());
        if (b.error() != 0 || ch == '\0') break;
        if (n + 1 >= sizeof(aug)) {
            b.fail(-EPROTO, "CIE augmentation string too long");
            break;
        }
        aug[n++] = ch;
    }
    aug[n] = '\0';
    b.uleb(); // code alignment
    b.sleb(); // data alignment
    if (version == 1)
        b.get<uint8_t>();
    else
        b.uleb(); // return address register
    if (b.error() == 0 && n > 0) {
        if (aug[0] != 'z') {
            b.fail(-EPROTO, "CIE augmentation without 'z'");
        } else {
            out->has_z = true;
            b.uleb(); // augmentation data length
            for (size_t i = 1; i < n && b.error() == 0; ++i) {
                switch (aug[i]) {
                case 'P': { // personality routine: skipped
                    const uint8_t enc = b.get<uint8_t>();
                    b.value(enc);
                    break;
                }
                case 'L':
                    out->lsda_enc = b.get<uint8_t>();
                    break;
                case 'R':
                    out->fde_enc = b.get<uint8_t>();
                    break;
                case 'S':
                case 'B':
                case 'G':
                    break; // no data
                default:
                    b.fail(-EPROTO, "unknown CIE augmentation character");
                    break;
                }
            }
        }
    }
    if (b.error() == 0) return 0;
    if (why) *why = std::string(b.what()) + " in CIE";
    return b.error();
}

// Appends the landing pads of the LSDA at `lsda` of a function starting at `region_start`.
int parse_lsda(const ReadFn &read, uint64_t lsda, uint64_t region_start, std::vector<uint64_t> *pads,
               std::string *why) {
    Cursor c(read, lsda, lsda + kLsdaWindow);
    uint64_t lpstart = region_start;
    const uint8_t lpstart_enc = c.get<uint8_t>();
    if (lpstart_enc != kPeOmit) lpstart = c.pointer(lpstart_enc);
    const uint8_t ttype_enc = c.get<uint8_t>();
    if (ttype_enc != kPeOmit) c.uleb(); // offset of the type table: not needed
    const uint8_t cs_enc = c.get<uint8_t>();
    if (c.error() == 0 && (cs_enc & 0x70) != 0) c.fail(-EPROTO, "call-site encoding with a base");
    const uint64_t cs_len = c.uleb();
    if (c.error() == 0 && cs_len > kMaxCallSiteTable) c.fail(-EPROTO, "call-site table too long");
    if (c.error() == 0) {
        const uint64_t cs_end = c.pos() + cs_len;
        Cursor t(read, c.pos(), cs_end);
        while (t.error() == 0 && t.pos() < cs_end) {
            t.value(cs_enc); // call-site start
            t.value(cs_enc); // call-site length
            const uint64_t lp = t.value(cs_enc);
            t.uleb(); // action
            if (t.error() == 0 && lp != 0) pads->push_back(lpstart + lp);
        }
        if (t.error() == 0) return 0;
        if (why) *why = std::string(t.what()) + " in LSDA call-site table";
        return t.error();
    }
    if (why) *why = std::string(c.what()) + " in LSDA header";
    return c.error();
}

} // namespace

int landing_pads(uint64_t eh_frame_hdr, uint64_t lo, uint64_t hi, const ReadFn &read, std::vector<uint64_t> *pads,
                 std::string *error) {
    std::string why;
    auto done = [&](int rc, const std::string &what, uint64_t at) {
        if (rc != 0 && error != nullptr) {
            char buf[32];
            std::snprintf(buf, sizeof(buf), " at 0x%llx", static_cast<unsigned long long>(at));
            *error = what + buf;
        }
        return rc;
    };
    if (eh_frame_hdr == 0) return done(-ENOENT, "no .eh_frame_hdr (PT_GNU_EH_FRAME)", 0);
    if (!read || pads == nullptr) return done(-EINVAL, "no reader or output", 0);
    try {
        Cursor h(read, eh_frame_hdr, ~0ull);
        const uint8_t version = h.get<uint8_t>();
        const uint8_t eh_frame_ptr_enc = h.get<uint8_t>();
        const uint8_t fde_count_enc = h.get<uint8_t>();
        const uint8_t table_enc = h.get<uint8_t>();
        if (h.error() != 0) return done(h.error(), std::string(h.what()) + " in .eh_frame_hdr", h.pos());
        if (version != 1) return done(-EPROTO, ".eh_frame_hdr version not 1", eh_frame_hdr);
        h.pointer(eh_frame_ptr_enc, eh_frame_hdr);
        if (fde_count_enc == kPeOmit || table_enc != (kPeDatarel | kPeSdata4)) {
            return done(-EPROTO, ".eh_frame_hdr without a datarel|sdata4 search table", eh_frame_hdr);
        }
        const uint64_t count = h.pointer(fde_count_enc, eh_frame_hdr);
        if (h.error() != 0) return done(h.error(), std::string(h.what()) + " in .eh_frame_hdr", h.pos());
        if (count > kMaxFdeCount) return done(-EPROTO, ".eh_frame_hdr FDE count implausible", eh_frame_hdr);
        const uint64_t table = h.pos();

        auto entry = [&](uint64_t i, uint64_t *loc, uint64_t *fde) {
            int32_t e[2];
            if (!read(table + i * 8, e, sizeof(e))) return false;
            *loc = eh_frame_hdr + static_cast<uint64_t>(static_cast<int64_t>(e[0]));
            *fde = eh_frame_hdr + static_cast<uint64_t>(static_cast<int64_t>(e[1]));
            return true;
        };
        // The last entry with initial location <= lo: the FDE that may cover lo.
        uint64_t first = 0, l = 0, r = count;
        while (l < r) {
            const uint64_t m = l + (r - l) / 2;
            uint64_t loc, fde;
            if (!entry(m, &loc, &fde)) return done(-EFAULT, "unreadable .eh_frame_hdr table", table + m * 8);
            if (loc <= lo) {
                first = m;
                l = m + 1;
            } else {
                r = m;
            }
        }
        for (uint64_t i = first; i < count; ++i) {
            uint64_t loc, fde;
            if (!entry(i, &loc, &fde)) return done(-EFAULT, "unreadable .eh_frame_hdr table", table + i * 8);
            if (loc >= hi) break;
            // The FDE: length, CIE pointer, pc_begin, pc_range, augmentation data (LSDA).
            Cursor c(read, fde, ~0ull);
            uint64_t end = 0;
            if (!record_bounds(c, &end)) return done(c.error(), std::string(c.what()) + " in FDE", fde);
            Cursor b(read, c.pos(), end);
            const uint64_t cie_field = b.pos();
            const uint32_t cie_off = b.get<uint32_t>();
            if (b.error() == 0 && (cie_off == 0 || cie_off > cie_field)) {
                b.fail(-EPROTO, "FDE with a bad CIE pointer");
            }
            if (b.error() != 0) return done(b.error(), std::string(b.what()) + " in FDE", fde);
            CieInfo cie;
            if (int rc = parse_cie(read, cie_field - cie_off, &cie, &why); rc != 0) {
                return done(rc, why + " (of FDE)", cie_field - cie_off);
            }
            const uint64_t pc_begin = b.pointer(cie.fde_enc);
            const uint64_t pc_range = b.value(cie.fde_enc);
            if (b.error() == 0 && pc_begin != loc) b.fail(-EPROTO, "FDE pc_begin differs from .eh_frame_hdr");
            uint64_t lsda = 0;
            if (cie.has_z) {
                const uint64_t aug_len = b.uleb();
                const uint64_t aug_start = b.pos();
                if (cie.lsda_enc != kPeOmit) lsda = b.pointer(cie.lsda_enc);
                if (b.error() == 0 && b.pos() - aug_start > aug_len) b.fail(-EPROTO, "FDE augmentation overrun");
            }
            if (b.error() != 0) return done(b.error(), std::string(b.what()) + " in FDE", fde);
            if (pc_begin + pc_range <= lo || lsda == 0) continue;
            if (int rc = parse_lsda(read, lsda, pc_begin, pads, &why); rc != 0) return done(rc, why, lsda);
        }
        return 0;
    } catch (...) {
        return done(-ENOMEM, "out of memory", eh_frame_hdr);
    }
}

} // namespace ukp::arch
